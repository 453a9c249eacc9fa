"""Which text holds a patient's identifiers, and that text with them replaced: the matching behind the redaction of
patient-named paths in a run (:mod:`pipeline.runner.redact`) and of a series description
(:attr:`pipeline.ingest.series.SeriesInfo.description`).

The identifiers are a series' PatientID, AccessionNumber, each part of its PatientName (``^``, ``_``, space, ``-``,
``,``, ``=`` separated) and its PatientBirthDate (YYYYMMDD), each of at least :data:`MIN_CHARS` characters, matched
case-insensitively: name parts as a whole word of the text, alone or written together (``SMITH^JOHN_1234567``,
``SmithJohn``, ``JOHNSMITH``; ``Lee`` is not looked for inside ``sleep``), the others anywhere in it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

#: The shortest identifier (a name part, a PatientID) looked for: shorter ones ("LI", "1") would match most names.
MIN_CHARS = 3

#: The header attributes whose values are looked for (all among those the header scan reads).
MATCHED = ("PatientID", "PatientName", "PatientBirthDate", "AccessionNumber")

_NAME_PARTS = re.compile(r"[\^_ ,=\-]+")
# the words of a text: its runs of letters (any alphabet), and their parts where a lower-case letter is followed by a
# capital (SmithJohn, MüllerAnna)
_LETTERS = re.compile(r"[^\W\d_]+")
_CAMEL = re.compile(r"(?<=[a-zß-öø-ÿ])(?=[A-ZÀ-ÖØ-Þ])")


def identifiers_of(values: Iterable[tuple[str, str | None]]) -> set[str]:
    """The lower-case strings looked for, from ``(keyword, value)`` pairs of a header: PatientID, PatientName split
    into its parts, PatientBirthDate, AccessionNumber; those shorter than :data:`MIN_CHARS` are left out."""
    found: set[str] = set()
    for key, value in values:
        if not value or key not in MATCHED:
            continue
        parts = _NAME_PARTS.split(value) if key == "PatientName" else [value]
        found.update(p.strip().lower() for p in parts if len(p.strip()) >= MIN_CHARS)
    return found


def _names_pattern(identifiers: set[str]) -> str | None:
    """A regex of the name parts among ``identifiers`` written one after another (``doe``, ``janedoe``), or None."""
    names = sorted((i for i in identifiers if i.isalpha()), key=len, reverse=True)
    return "(?:" + "|".join(re.escape(n) for n in names) + ")+" if names else None


def holds(text: str, identifiers: set[str]) -> bool:
    """Whether ``text`` holds one of ``identifiers`` (lower case): name parts (letters only) as a whole word of it,
    alone or written together (``SMITH^JOHN_12``, ``SmithJohn``, ``JOHNSMITH``, ``smith-j``; not ``sleep`` for
    ``lee``, ``done`` for ``one``), any other (a PatientID, an accession number, a birth date) anywhere in it."""
    low = text.lower()
    if any(i in low for i in identifiers if not i.isalpha()):
        return True
    names = _names_pattern(identifiers)
    if names is None:
        return False
    runs = _LETTERS.findall(text)
    words = {w.lower() for r in runs for w in (r, *_CAMEL.split(r))}
    return any(re.fullmatch(names, w) for w in words)


def scrub(text: str, identifiers: set[str], *, replace: Callable[[str], str]) -> str:
    """``text`` with each of ``identifiers`` in it (as :func:`holds` finds them) replaced by ``replace(found)``
    (``found`` in lower case), its other words kept: ``CHEST DOE JANE 1.25`` -> ``CHEST <r> <r> 1.25``; the whole of
    it ``replace(text)`` where a name part is not a word of its own (``MüllerLee`` for Lee)."""
    if not text or not identifiers or not holds(text, identifiers):
        return text
    names = _names_pattern(identifiers)
    others = sorted((i for i in identifiers if not i.isalpha()), key=len, reverse=True)
    alternatives = [rf"(?<![^\W\d_]){names}(?![^\W\d_])"] if names else []
    alternatives += [re.escape(o) for o in others]
    scrubbed = re.sub("|".join(alternatives), lambda m: replace(m.group(0).lower()), text, flags=re.IGNORECASE)
    return replace(text) if holds(scrubbed, identifiers) else scrubbed


#: What stands for each identifier of the patient in a series description that ctpipe shows or writes outside the
#: DICOM (a volume's metadata, messages, reprs) unless identifiers are kept.
PLACEHOLDER = "<patient>"


def description_without_identifiers(description: str, header: Iterable[tuple[str, str | None]]) -> str:
    """``description`` (a SeriesDescription a technologist may have typed the patient's name into: ``CHEST DOE JANE
    1.25``) with each identifier of ``header``'s ``(keyword, value)`` pairs in it as :data:`PLACEHOLDER`, its other
    words kept (``CHEST <patient> <patient> 1.25``)."""
    return scrub(description, identifiers_of(header), replace=lambda _: PLACEHOLDER)
