"""Which text holds a patient's identifiers, and that text with them replaced: the matching behind the redaction of
patient-named paths in a run (:mod:`pipeline.runner.redact`) and of a series description
(:attr:`pipeline.ingest.series.SeriesInfo.description`).

The identifiers are a series' PatientID, AccessionNumber, each part of its PatientName (``^``, ``_``, space, ``-``,
``,``, ``=`` separated) and its PatientBirthDate (YYYYMMDD), each of at least :data:`MIN_CHARS` characters, matched
case-insensitively: name parts as a whole word of the text, alone or written together (``SMITH^JOHN_1234567``,
``SmithJohn``, ``JOHNSMITH``; ``Lee`` is not looked for inside ``sleep``), the others anywhere in it. A name with
a part shorter than that (``DOE^J``) is also looked for whole. A name part that is a word of CT descriptions
(:data:`COMMON_WORDS`: a patient named CHEST^A) counts only beside another identifier of the patient.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

#: The shortest identifier (a name part, a PatientID) looked for: shorter ones ("LI", "1") would match most names.
MIN_CHARS = 3

#: The header attributes whose values are looked for (all among those the header scan reads).
MATCHED = ("PatientID", "PatientName", "PatientBirthDate", "AccessionNumber")

#: Words of CT series descriptions and folder names (lower case). A patient's name part that is one of them (a
#: patient named CHEST^A, BONE^ANN) is an identifier of a text only where the text also holds another identifier of
#: the patient (another name part, the whole name, the PatientID, ...): alone it names nobody, and ``CHEST 1.25``
#: keeps its word where reading ``<patient> 1.25`` would puzzle every reader.
COMMON_WORDS = frozenset(
    """abdomen angio arterial axial body bone brain breath chest contrast coronal delayed detail dose exp expiration
    head helical high hold insp inspiration kernel lung lungs low mediastinum mip mpr neck pelvis phantom portal post
    pre recon routine scout series sharp slice slices smooth soft spiral standard thick thin thorax tissue topogram
    venous volume with without""".split()
)

_NAME_PARTS = re.compile(r"[\^_ ,=\-]+")
# the words of a text: its runs of letters (any alphabet), and their parts where a lower-case letter is followed by a
# capital (SmithJohn, MüllerAnna)
_LETTERS = re.compile(r"[^\W\d_]+")
_CAMEL = re.compile(r"(?<=[a-zß-öø-ÿ])(?=[A-ZÀ-ÖØ-Þ])")
# joins the parts of a whole name in the identifiers (no header value holds it)
_WHOLE = "\x1f"
_NOT_LETTER_BEFORE, _NOT_LETTER_AFTER = r"(?<![^\W\d_])", r"(?![^\W\d_])"


def identifiers_of(values: Iterable[tuple[str, str | None]]) -> set[str]:
    """The lower-case strings looked for, from ``(keyword, value)`` pairs of a header: PatientID, PatientName split
    into its parts, PatientBirthDate, AccessionNumber; those shorter than :data:`MIN_CHARS` are left out. A name
    with a part shorter than that (``DOE^J``, ``LI^WEI``) is also looked for whole (its parts in either order, any
    separators: ``DOE J``, ``Wei, Li``)."""
    found: set[str] = set()
    for key, value in values:
        if not value or key not in MATCHED:
            continue
        parts = [p.strip().lower() for p in _NAME_PARTS.split(value)] if key == "PatientName" else [value.strip().lower()]
        parts = [p for p in parts if p]
        found.update(p for p in parts if len(p) >= MIN_CHARS)
        if key == "PatientName" and len(parts) > 1 and min(map(len, parts)) < MIN_CHARS and len("".join(parts)) >= MIN_CHARS:
            found.add(_WHOLE.join(parts))
    return found


def _names_pattern(identifiers: set[str]) -> str | None:
    """A regex of the name parts among ``identifiers`` written one after another (``doe``, ``janedoe``), or None."""
    names = sorted((i for i in identifiers if i.isalpha()), key=len, reverse=True)
    return "(?:" + "|".join(re.escape(n) for n in names) + ")+" if names else None


def _whole_pattern(whole: str) -> str:
    """A regex of a whole name (:data:`_WHOLE`-joined parts): the parts in the header's order or the reverse, with any
    separators between them, not inside a longer word."""
    parts = [re.escape(p) for p in whole.split(_WHOLE)]
    sep = r"[\^_ ,=.\-]*"
    orders = sep.join(parts) + "|" + sep.join(reversed(parts))
    return f"{_NOT_LETTER_BEFORE}(?:{orders}){_NOT_LETTER_AFTER}"


def _found(text: str, identifiers: set[str]) -> set[str]:
    """Which of ``identifiers`` (lower case) ``text`` holds, as :func:`holds` looks for them."""
    low = text.lower()
    found = {i for i in identifiers if _WHOLE in i and re.search(_whole_pattern(i), low)}
    found |= {i for i in identifiers if not i.isalpha() and _WHOLE not in i and i in low}
    names = _names_pattern(identifiers)
    if names is not None:
        one = "|".join(re.escape(n) for n in sorted((i for i in identifiers if i.isalpha()), key=len, reverse=True))
        runs = _LETTERS.findall(text)
        for word in {w.lower() for r in runs for w in (r, *_CAMEL.split(r))}:
            if re.fullmatch(names, word):
                found.update(re.findall(one, word))
    return found


def holds(text: str, identifiers: set[str]) -> bool:
    """Whether ``text`` holds one of ``identifiers`` (lower case): name parts (letters only) as a whole word of it,
    alone or written together (``SMITH^JOHN_12``, ``SmithJohn``, ``JOHNSMITH``, ``smith-j``; not ``sleep`` for
    ``lee``, ``done`` for ``one``), a whole name with a short part as a run of words (``DOE J``; not ``DOE JOHN``),
    any other (a PatientID, an accession number, a birth date) anywhere in it. A name part that is one of
    :data:`COMMON_WORDS` counts only beside another identifier of the patient in ``text``."""
    found = _found(text, identifiers)
    return bool(found) and not (len(found) == 1 and found <= COMMON_WORDS)


def scrub(text: str, identifiers: set[str], *, replace: Callable[[str], str]) -> str:
    """``text`` with each of ``identifiers`` in it (as :func:`holds` finds them) replaced by ``replace(found)``
    (``found`` in lower case), its other words kept: ``CHEST DOE JANE 1.25`` -> ``CHEST <r> <r> 1.25``, ``CHEST DOE
    J`` -> ``CHEST <r>`` for DOE^J; the whole of it ``replace(text)`` where a name part is not a word of its own
    (``MüllerLee`` for Lee)."""
    if not text or not identifiers or not holds(text, identifiers):
        return text
    names = _names_pattern(identifiers)
    wholes = sorted((i for i in identifiers if _WHOLE in i), key=len, reverse=True)
    others = sorted((i for i in identifiers if not i.isalpha() and _WHOLE not in i), key=len, reverse=True)
    alternatives = [_whole_pattern(w) for w in wholes]
    alternatives += [f"{_NOT_LETTER_BEFORE}{names}{_NOT_LETTER_AFTER}"] if names else []
    alternatives += [re.escape(o) for o in others]
    scrubbed = re.sub("|".join(alternatives), lambda m: replace(m.group(0).lower()), text, flags=re.IGNORECASE)
    return replace(text) if _found(scrubbed, identifiers) else scrubbed


#: The endings of the files scanners and DICOM exports write: a generic file name (:func:`generic_file_name`) has
#: one of them or none.
_DICOM_ENDINGS = (".dcm", ".dicom", ".ima")
_GENERIC_STEM = re.compile(
    r"(?:(?:ct|mr|pt|nm|sr|seg|ot)\.)?[012](?:\.(?:0|[1-9]\d*)){2,}"  # a UID (1.2.840.113619.2.55...), CT.<UID>
    r"|(?:(?:i|im|img|image|slice)[_\-.]?)?0*\d{1,5}"  # an instance number: 1, 00000001, IM0001, IMG_0001, I.001
    r"|im[_\-]?0*\d{1,5}(?:[_\-]0*\d{1,5}){1,2}",  # series and instance numbers: IM-0001-0001
    re.IGNORECASE,
)


def generic_file_name(name: str) -> bool:
    """Whether the file name ``name`` is one a scanner or a DICOM export gives any file, which carries no identifier:
    a UID (``1.2.840.113619.2.55.3.1.dcm``, ``CT.1.3.12.2.1107.5``), an instance number with at most 5 digits besides
    its leading zeros (``1.dcm``, ``00000001``, ``IM0001.dcm``, ``IMG_0001.dcm``, ``I.001``, ``IM-0001-0001.dcm``),
    with a DICOM ending (``.dcm``, ``.dicom``, ``.ima``) or none. Any other name may carry one: letters other than
    these prefixes, a number of 6 digits or more (a PatientID: ``1234567.dcm``, an accession number), any other ending
    (``12345.pdf``: a report may be named by its accession number)."""
    low = name.lower()
    stem = next((low[: -len(e)] for e in _DICOM_ENDINGS if low.endswith(e)), low)
    return bool(stem) and _GENERIC_STEM.fullmatch(stem) is not None


#: What stands for each identifier of the patient in a series description that ctpipe shows or writes outside the
#: DICOM (a volume's metadata, messages, reprs) unless identifiers are kept.
PLACEHOLDER = "<patient>"


def description_without_identifiers(description: str, header: Iterable[tuple[str, str | None]]) -> str:
    """``description`` (a SeriesDescription a technologist may have typed the patient's name into: ``CHEST DOE JANE
    1.25``) with each identifier of ``header``'s ``(keyword, value)`` pairs in it as :data:`PLACEHOLDER`, its other
    words kept (``CHEST <patient> <patient> 1.25``)."""
    return scrub(description, identifiers_of(header), replace=lambda _: PLACEHOLDER)
