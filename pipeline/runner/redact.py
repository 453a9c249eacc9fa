"""Patient identifiers in file and folder names, kept out of what a run writes outside ``dicom/``.

Archive exports and PACS spools often name a folder or file after the patient or the visit (``SMITH^JOHN_1234567/``,
``1234567/CT/``, ``A20240117-0042/`` by accession number, ``Doe_Jane_19600101.dcm``). Unless ``privacy.keep_identifiers``, every path
component that holds an identifier of a series found under it is replaced, in run.log, the console, the run store
(and so the report, its CSV files and skipped.csv), quarantine files and metrics, by a token ``<patient:xxxxxx>``:
the first 6 hex digits of a SHA-256 over a secret drawn per run (per session of batches: a listener's) and the component, so the same folder reads as the
same token throughout a run and cannot be looked up across runs. The identifiers are those discovery read from the
series' headers: PatientID, AccessionNumber, each part of PatientName (``^``, ``_``, space, ``-``, ``,``, ``=``
separated) and PatientBirthDate (YYYYMMDD), each of at least :data:`pipeline.identifiers.MIN_CHARS` characters, matched
case-insensitively: name parts as a whole word of the component, alone or written together
(``SMITH^JOHN_1234567``, ``SmithJohn``, ``JOHNSMITH``; ``Lee`` is not looked for inside ``sleep``), the others
anywhere in it (and, as :mod:`pipeline.identifiers` says, a whole name with a short part; a common word only beside another
identifier). Files under a redacted folder that are not DICOM (no
identifiers of their own) are redacted through that folder; the name of such a file, wherever it lies in the
sources, is redacted where it holds an identifier of any series the run found. Any other skipped file whose name no
header of its own was checked against (:data:`TOKENED_KINDS`: ``DOE_JANE_report.pdf`` of a patient none of whose images
are among the sources, a cut-short or unreadable file, a DICOMDIR) is named by a token ``<file:xxxxxx>`` followed by
its extension when that is a common one (:data:`KEPT_EXTENSIONS`; ``<file:xxxxxx>.pdf``) where that file is meant (after
a path showing its folder, or alone in a text; another folder's file of that name keeps its name), but for a name a
scanner gives any file (``IM0001.dcm``, ``1.dcm``, a UID: :func:`pipeline.identifiers.generic_file_name`), which names
nobody; and each folder of its path below the source that holds no file of a series found by a token
``<folder:xxxxxx>``, replaced in paths only (``inbox/DOE_JANE/notes.txt``) where that folder is meant (after a path
showing its parent, by that parent's resolved path as far as the path shown allows:
:func:`.redact_places.stands_for`; another folder of that name elsewhere, ``b/inbox/DOE_JANE`` beside
``a/inbox/DOE_JANE``, keeps its name), until a series is found in it (or, for a link to a folder, through it), by
:meth:`PathRedactor.add_skipped`. A skipped file's or folder's token is a hash of its place (the resolved path of
the folder holding it, with its name: :func:`.redact_places.location`), not of its name alone: two folders of one
name holding skipped files only (``in/a/PATIENT_X``, ``in/b/PATIENT_X``) read as two tokens, each the same however a
path shows it; a name that no path places (alone in a text) reads as the token of its first place recorded. (A
series description never holds one: :attr:`pipeline.ingest.series.SeriesInfo.description` shows each as
``<patient>``.)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
from collections.abc import Iterable
from pathlib import Path, PurePath
from typing import Any

from ..identifiers import MATCHED, generic_file_name, holds, identifiers_of
from .redact_archives import archive_identifiers
from .redact_places import PlaceIndex, location, parent_forms, stands_for

log = logging.getLogger(__name__)

# the keys of the run's secret and of where its file and folder tokens stand in PathRedactor.shared: no path
# component holds a NUL
_SECRET, _WHERE = "\0secret", "\0where"
# a component as it appears in text: not inside a longer name or number (a UID holding a patient id's digits)
_BEFORE, _AFTER = r"(?<![\w.^\-])", r"(?![\w^\-])"
# after a name recorded with its folder (/report): not a folder of that name (/report/x) nor another file (/report.pdf)
_NOT_FOLDER = r"(?![/\\]|\.\w)"
# a folder recorded by its name alone (/inbox/DOE_JANE/notes.txt): between two separators of a path only
_SEP_BEFORE, _SEP_AFTER = r"(?<=[/\\])", r"(?=[/\\])"
# a skipped file's name where it stands alone: not inside a longer name, not after a folder
_NO_FOLDER = r"(?<![\w.^\-/\\])"
# a recorded folder's or file's name after a separator or where a path begins (not inside a longer name nor after a
# token): where it stands is decided by the path before it (:func:`.redact_places.stands_for`)
_PLACED_BEFORE = r"(?:(?<=[/\\])|(?<![\w.^\-/\\]))"


#: The file name endings (lower case) kept after a skipped file's token (``<file:xxxxxx>.pdf``): those of common
#: documents, images, archives and volumes, none of them a name; any other ending is part of the name the token hides.
KEPT_EXTENSIONS = frozenset(
    """7z bin bmp bz2 cfg csv dat db dcm doc docx eml gif gz hdr htm html img ini jpeg jpg json log md mha mhd msg
    nii nrrd odt pdf png ppt pptx rar raw rtf sqlite tar tgz tif tiff txt url xls xlsx xml xz yaml yml zip""".split()
)

#: The kinds of skipped file (:class:`pipeline.ingest.discover.SkippedFile`) named by a token of their own
#: (:meth:`PathRedactor.add_skipped`): those whose names no header of theirs was checked against (not DICOM, a DICOMDIR,
#: cut short, unreadable, not a regular file, a link to a folder). A copy of an instance of a series found
#: (``duplicate_copy``, ``conflicting_copy``) is checked against that series' identifiers as its files are.
TOKENED_KINDS = frozenset({"not_dicom", "dicomdir", "truncated", "unreadable", "not_regular", "not_followed"})

#: File names that name nobody, kept after a skipped file's folder: the name PS3.10 gives every DICOMDIR.
KEPT_NAMES = frozenset({"DICOMDIR"})


def _kept_extension(name: str) -> str:
    """The ending of ``name`` kept after its token: its last one or two endings while they are in
    :data:`KEPT_EXTENSIONS` (``.pdf``, ``.nii.gz``), never the whole name (``.pdf`` alone keeps nothing)."""
    stem, kept = name, ""
    for _ in range(2):
        head, dot, ext = stem.rpartition(".")
        if not dot or not head or ext.lower() not in KEPT_EXTENSIONS:
            break
        stem, kept = head, f".{ext}{kept}"
    return kept


class PathRedactor:
    """Which path components name a patient, and the text with them replaced by their tokens (see the module)."""

    def __init__(self, *, secret: str | None = None) -> None:
        self._secret = secret or secrets.token_hex(16)
        self._tokens: dict[str, str] = {}
        self._pattern: re.Pattern[str] | None = None
        self._identifiers: set[str] = set()  # of every series recorded, for the files that are not DICOM
        self._told = False  # whether the log said once that skipped files are named by tokens
        self._roots: set[PurePath] = set()  # the sources given: the folders below them are the ones tokened
        self._series_folders: set[PurePath] = set()  # the folders holding a file of a series found (and their parents)
        self._series_places: set[str] = set()  # those folders' real paths and places (.redact_places.location)
        # where the tokens of skipped files' names and folders stand: for each key (a file name's, a folder's), the
        # places it stands for (.redact_places.location: a folder's real path joined with the name) while none of them
        # holds a file of a series, each with the forms a path shows of the folder holding it
        # (.redact_places.parent_forms); a linked folder's whole path has no forms: it stands wherever a text holds it
        self._places: dict[str, dict[str, set[str]]] = {}
        self._fallback: re.Pattern[str] | None = None  # the components that stand anywhere, for a name not placed
        self._forms: dict[str, set[str]] = {}  # each place's forms of a key, with the pattern
        self._indexes: dict[str, PlaceIndex] = {}  # of the keys standing for several places, with the pattern
        self._folder_at: dict[str, str] | None = None  # each placed folder token's place, with the pattern

    @classmethod
    def of(cls, components: dict[str, str]) -> PathRedactor:
        """A redactor of the ``components`` (component: token) another process found (:attr:`components`); given
        :attr:`shared`, one that also gives the series it records the tokens that process would."""
        tokens = dict(components)
        r = cls(secret=tokens.pop(_SECRET, None))
        where = json.loads(tokens.pop(_WHERE, "{}"))
        r._tokens = tokens
        r._places = {k: {loc: set(forms) for loc, forms in v.items()} for k, v in where.get("places", {}).items()}
        return r

    @property
    def shared(self) -> dict[str, str]:
        """What a worker process or Ray actor is given (:meth:`of`): the components, the run's secret and where the
        tokens of skipped files and their folders stand, so that the series it scans again itself (those of a later
        batch of a listener's workers) read as they do here."""
        where = {"places": {k: {loc: sorted(forms) for loc, forms in v.items()} for k, v in self._places.items()}}
        return {**self._tokens, _SECRET: self._secret, _WHERE: json.dumps(where)}

    def _digest(self, component: str) -> str:
        return hashlib.sha256(f"{self._secret}\0{component}".encode()).hexdigest()[:6]

    def _place_token(self, key: str, place: str) -> str:
        """The token of the skipped folder or file of ``key`` at ``place`` (:func:`.redact_places.location`): a hash
        of that place, not of the name, so that another folder or file of the same name reads as another token."""
        if len(key) > 2 and key.startswith(os.sep) and key.endswith(os.sep):
            return f"<folder:{self._digest(place)}>"
        name = key[1:] if key.startswith(os.sep) else key
        return key[: -len(name)] + self._file_token(place, name)

    def _first_place(self, key: str) -> None:
        """Make the token of ``key`` where no path tells its place (a name alone) that of its first place left."""
        if where := self._places.get(key):
            self._tokens[key] = self._place_token(key, next(iter(where)))

    def token(self, component: str) -> str:
        return f"<patient:{self._digest(component)}>"

    def add_series(self, files: Iterable[str | os.PathLike[str]], identifiers: set[str]) -> None:
        """Record the components of ``files``' paths (folders and file names) that hold one of ``identifiers``."""
        if not identifiers:
            return
        self._identifiers |= identifiers
        seen: set[str] = set()
        for f in files:
            for part in PurePath(f).parts:
                if part in seen or part in self._tokens or part == os.sep:
                    continue
                seen.add(part)
                if holds(part, identifiers):
                    self._tokens[part] = self.token(part)
                    self._pattern = None

    def add_scan(self, series: Iterable[Any]) -> None:
        """Record the identifiers of each scanned series (:class:`pipeline.ingest.series.SeriesInfo`) in its paths,
        and, for a series found through a symbolic link to a folder (``inbox/ct`` -> ``/archive/DOE_JANE/ct``), in
        the real paths of its folders too: a skip reason or another source names that folder by its real path."""
        for s in series:
            ids: set[str] = set()
            for h in s.headers:
                ids |= identifiers_of((k, h.extra_value(k)) for k in MATCHED)
            shown = {PurePath(h.path).parent for h in s.headers}
            linked = {PurePath(os.path.realpath(f)) for f in shown} - {PurePath(os.path.abspath(f)) for f in shown}
            self.add_series([h.path for h in s.headers] + [str(f) for f in linked], ids)
            folders = {f for d in shown | linked for f in (d, *d.parents)} - self._series_folders
            self._series_folders |= folders
            self._release(folders)

    def _release(self, folders: set[PurePath]) -> None:
        """Drop the token of each folder among ``folders`` (new folders of a series) that was recorded by
        :meth:`add_skipped` while it held no series, and of each link to a folder skipped there that a series was
        found through since: its name is decided by the headers of its series now, as when that series is found
        first. A token stays while another place of that name holds skipped files and no series."""
        places = {p for f in folders for p in (os.path.realpath(f), location(f))} - self._series_places
        self._series_places |= places
        for key, where in list(self._places.items()):
            if not places & where.keys():
                continue
            for place in places & where.keys():
                del where[place]
            self._pattern = None  # the token goes, or stands in fewer places
            if not where:
                del self._places[key]
                self._tokens.pop(key, None)
            else:
                self._first_place(key)

    def add_files(self, files: Iterable[str | os.PathLike[str]]) -> None:
        """Record the components of ``files``' paths that hold an identifier of any series recorded so far: files
        that are not DICOM (a folder scan's skips), which hold no identifiers of their own (``MRN12345_report.pdf``
        beside the images or in another folder of the source). A ZIP or tar archive among them is recorded by the
        identifiers of the DICOM files it holds (:func:`.redact_archives.archive_identifiers`), also when no series of
        its patient is among the sources (``DOE_JANE_MRN12345.zip``, an export not unpacked)."""
        files = list(files)
        for f in files:
            if ids := archive_identifiers(f):
                self.add_series([f], ids)
        self.add_series(files, set(self._identifiers))

    def add_skipped(
        self,
        files: Iterable[tuple[str | os.PathLike[str], str]],
        *,
        roots: Iterable[str | os.PathLike[str]] = (),
        given_alone: bool = False,
    ) -> None:
        """Record the skipped ``files`` (``(path, kind)``, :class:`pipeline.ingest.discover.SkippedFile`'s) found under
        ``roots`` (the folders and files a scan was given; those of earlier calls count too): their components as
        :meth:`add_files` does; the name of each of :data:`TOKENED_KINDS` not recorded so, as :meth:`add_file_name`
        does (``<file:xxxxxx>.pdf``), but :data:`KEPT_NAMES`; and each folder of its path below its root that holds no
        file of a series recorded (:meth:`add_scan`), as :meth:`add_folder_name` does (``inbox/DOE_JANE/notes.txt``
        reads ``inbox/<folder:xxxxxx>/<file:xxxxxx>.txt``): without a header of their own, such names cannot be told
        from other file names. ``given_alone`` (a run's worklist row naming an image file, or another file that is not
        DICOM): such a file that is a root itself is recorded by its whole path too, which reads as its name's token
        (``exports/DOE_JANE/chest.nii.gz`` reads ``<file:xxxxxx>.nii.gz``), as what the run writes must not hold the
        path typed and no header was checked against its folders. The first time one is recorded, the log says how
        to see the names. A broken symbolic link's target (its skip reason names it) reads as its name's token too, the folder a link
        not followed points to as a folder's token."""
        given = [PurePath(r) for r in roots]
        self._roots.update(given)
        paths = [(Path(p), kind) for p, kind in files]
        self.add_files(p for p, _ in paths)
        added = False
        for path, kind in paths:
            if kind not in TOKENED_KINDS:
                continue
            if kind == "not_followed" and location(path) in self._series_places:
                continue  # a link a series was found through: its name is checked against that series' headers
            if path.name not in KEPT_NAMES:
                added = self.add_file_name(path) or added
            for folder in self._folders_below_root(path):
                added = self._add_folder(folder) or added
            if given_alone and path in given and len(path.parts) > 1:
                added = self._add_whole_path(str(path)) or added
            if (target := _broken_link_target(path)) is not None:
                added = self._add_whole_path(target, place=location(path.parent / target)) or added
            if kind == "not_followed":
                added = self._add_linked_folder(path) or added
        if added and not self._told:
            self._told = True
            log.info(
                "skipped files are named <file:xxxxxx> (with their ending) in what ctpipe writes, and the folders "
                "holding them that hold no series <folder:xxxxxx>: no header tells whether such a name is a patient's; "
                "run again with --keep-identifiers (privacy.keep_identifiers) to have their names written"
            )

    def _add_whole_path(self, path: str, *, place: str | None = None) -> bool:
        """Record ``path`` in whole (a file's whose folders no header was checked against) as the token of that file
        (at ``place``, by default where ``path`` leads from the current folder), the token its name reads as after
        its folder."""
        if not path or path in self._tokens:
            return False
        self._tokens[path] = self._file_token(place or location(path), PurePath(path).name)
        self._pattern = None
        return True

    def _add_linked_folder(self, link: Path) -> bool:
        """Record the folder the symbolic ``link`` points to (its skip reason names it: ``/archive/DOE_JANE``) in
        whole as a token ``<folder:xxxxxx>``, unless it holds a file of a series recorded (its name checked then)."""
        real = os.path.realpath(link)
        if real in self._tokens or real in self._series_places:
            return False
        self._tokens[real] = f"<folder:{self._digest(location(real))}>"
        self._places[real] = {real: set()}
        self._pattern = None
        return True

    def _add_folder(self, folder: PurePath) -> bool:
        """Record ``folder`` (a folder of a skipped file, holding no series) by its name, as :meth:`add_folder_name`
        does, and where it lies: its token stands where a path shows that folder (:func:`.redact_places.stands_for`:
        by its parent's resolved path, as far as the path shown allows), not in another folder of that name
        (``ward/DOE`` or ``b/inbox/DOE`` holding a series, named by its headers), and goes once a series is found in
        it (:meth:`_release`). Whether it was recorded now (its name, or its place)."""
        added = self.add_folder_name(folder.name)
        key = f"{os.sep}{folder.name}{os.sep}"
        if key not in self._tokens or not (added or key in self._places):
            return added
        return self._add_place(key, folder) or added

    def _add_place(self, key: str, path: PurePath) -> bool:
        """Record that the token of ``key`` stands for ``path`` (where a path shows the folder holding it). Whether
        that place or a form of it is new."""
        forms = parent_forms(path)
        first = not self._places.get(key)
        where = self._places.setdefault(key, {}).setdefault(location(path), set())
        new = not forms <= where
        where |= forms
        if first:
            self._first_place(key)
        if new:
            self._pattern = None
        return new

    def _folders_below_root(self, path: PurePath) -> list[PurePath]:
        """The folders of ``path`` below the longest root recorded that holds it (none when no root holds it) that
        hold no file of a series recorded."""
        roots = [r for r in self._roots if r in path.parents]
        if not roots:
            return []
        root = max(roots, key=lambda r: len(r.parts))
        below = [f for f in path.parents if root in f.parents]
        return [f for f in below if f not in self._series_folders and location(f) not in self._series_places]

    def add_folder_name(self, name: str) -> bool:
        """Record the folder ``name`` as a token ``<folder:xxxxxx>``, replaced where it stands between two separators
        of a path (``/in/DOE_JANE/x``), never as a word of a message, unless it is recorded already as a patient's.
        Whether it was recorded now."""
        key = f"{os.sep}{name}{os.sep}"
        if not name or name in self._tokens or key in self._tokens:
            return False
        self._tokens[key] = f"<folder:{self._digest(name)}>"
        self._pattern = None
        return True

    def add_file_name(self, path: str | os.PathLike[str]) -> bool:
        """Record the name of the file at ``path`` (not its folders) as a token ``<file:xxxxxx>`` followed by its
        common ending (:data:`KEPT_EXTENSIONS`): a file whose name nothing can be told patient-named by (a skipped
        file that is not DICOM), unless the name is one a scanner gives any file (:func:`generic_file_name`:
        ``IM0001.dcm``, ``1.dcm``, a UID), which names nobody, or it is recorded already as a patient's. The token
        stands where that file is meant: the name after the folder it lies in (``ct/notes.txt``, whatever comes
        before: an absolute path, one relative to another folder), after a folder written as a token, and, for a name
        with a kept ending, where it stands alone in a text (``the report names DOE_JANE_report.pdf``); not after
        another folder (``ct2/IM0001.dcm``, another series' file), and a name without a kept ending (``report``) not
        as a word of a message. Whether it was recorded now (a name or a folder it lies in)."""
        path = PurePath(path)
        name = path.name
        if not name or generic_file_name(name) or (name in self._tokens and name not in self._places):
            return False
        key = name if _kept_extension(name) else os.sep + name
        if key in self._tokens and key not in self._places:
            return False
        added = key not in self._tokens
        self._pattern = None
        return self._add_place(key, path) or added

    def _file_token(self, place: str, name: str) -> str:
        """The token of the file ``name`` at ``place`` (its :func:`.redact_places.location`): ``<file:xxxxxx>``, a
        hash of the place, and its kept ending (:data:`KEPT_EXTENSIONS`)."""
        return f"<file:{self._digest(place)}>{_kept_extension(name)}"

    @property
    def components(self) -> dict[str, str]:
        """The components replaced, each with its token."""
        return dict(self._tokens)

    def __call__(self, text: str) -> str:
        """``text`` with each recorded component replaced by its token."""
        if not self._tokens or not text:
            return text
        if self._pattern is None:
            names = sorted(self._tokens, key=lambda n: len(n.strip(os.sep)), reverse=True)
            self._pattern = re.compile("(?:" + "|".join(_alternative(n, self._placed(n)) for n in names) + ")" + _AFTER)
            anywhere = [_alternative(n, False) for n in names if not self._placed(n)]
            self._fallback = re.compile("(?:" + "|".join(anywhere) + ")" + _AFTER) if anywhere else None
            self._forms = {k: set().union(*where.values()) for k, where in self._places.items()}
            self._indexes, self._folder_at = {}, None
        return self._pattern.sub(self._token_of, text)

    def _token_after(self, key: str, head: str) -> str:
        """The token of the place of ``key`` that the text before it (``head``) shows, of those it stands for
        (:class:`.redact_places.PlaceIndex`): one folder or file, one token, however a path shows it."""
        where = self._places[key]
        if len(where) == 1:
            return self._place_token(key, next(iter(where)))
        index = self._indexes.get(key)
        if index is None:
            if self._folder_at is None:
                self._folder_at = {
                    self._place_token(k, loc): loc
                    for k, places in self._places.items()
                    if len(k) > 2 and k.startswith(os.sep) and k.endswith(os.sep)
                    for loc in places
                }
            index = self._indexes[key] = PlaceIndex(where, self._folder_at)
        return self._place_token(key, index.place_of(head))

    def _placed(self, key: str) -> bool:
        """Whether the token of ``key`` stands only where a path shows one of its places (:meth:`_add_place`)."""
        return any(self._places.get(key, {}).values())

    def _token_of(self, match: re.Match[str]) -> str:
        """The token of a matched component: a folder's (:meth:`add_folder_name`) is recorded between separators, and
        a patient-named component recorded later under the same name wins. A skipped file's or folder's name after a
        path that shows another folder (:func:`.redact_places.stands_for`) stays, but for the components in it that
        stand anywhere."""
        found = match.group(0)
        key = found if found in self._tokens else f"{os.sep}{found}{os.sep}"
        token = self._tokens[key]
        if not self._placed(key):  # a patient-named component, a whole path, or a name recorded alone
            return token
        head = match.string[: match.start() + (1 if found[:1] in "/\\" else 0)]
        if not head.endswith(("/", "\\")):  # where a path begins, or a name with a kept ending alone in a text
            return self._token_after(key, head)
        forms = self._forms.get(key) or set().union(*self._places[key].values())  # recorded since the pattern
        if stands_for(head, forms):
            return self._token_after(key, head)
        return self._fallback.sub(self._token_of, found) if self._fallback is not None else found


def _alternative(key: str, placed: bool) -> str:
    """The regex of a recorded component ``key`` in a text. ``placed`` (a skipped file's name or a folder's, recorded
    with where it lies, see :meth:`PathRedactor._add_place`): its name after a separator or where a path begins (a
    folder's before a separator, a file's name without a kept ending, ``/name``, not before one), where the path
    before it decides (:meth:`PathRedactor._token_of`), and, with a kept ending, where it stands alone. Otherwise a
    folder's name (``/name/``, recorded alone) between separators; a file name without a kept ending (``/name``, a
    component another process found) after any folder; any other where it stands alone (see the module)."""
    folder = len(key) > 2 and key.startswith(os.sep) and key.endswith(os.sep)
    if folder and placed:
        name = re.escape(key[1:-1])  # looked for first: most places in a text fail there, before the lookbehinds
        return rf"(?={name}[/\\]){_PLACED_BEFORE}{name}"
    if folder:
        return _SEP_BEFORE + re.escape(key[1:-1]) + _SEP_AFTER
    if key.startswith(os.sep):
        return re.escape(key) + _NOT_FOLDER
    if placed:
        return rf"(?:(?<=[/\\])|{_NO_FOLDER})" + re.escape(key)
    return _BEFORE + re.escape(key)


def _broken_link_target(path: Path) -> str | None:
    """What the broken symbolic link ``path`` points to, as its skip reason names it (``/archive/DOE_JANE/x.dcm``,
    outside the sources), or None when ``path`` is no such link."""
    try:
        return None if not path.is_symlink() or path.exists() else os.readlink(path)
    except OSError:
        return None
