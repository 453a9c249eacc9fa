"""The case cache: one ``<case_id>.npy`` HU array plus a ``<case_id>.json`` sidecar per case.

The ``.npy`` holds the HU array ``[k, j, i]`` (C order, int16 or float32); the
sidecar holds its geometry (LPS, mm; see :mod:`pipeline.geometry`), the DICOM
metadata and a content fingerprint. Both files are written to a temporary
name and renamed into place, array first, sidecar last: a case exists only
when its sidecar does, so a crash never leaves a half-written entry.

A process killed while writing leaves its temporary file (``.<name>.<random>.tmp``,
see :mod:`pipeline.atomic`) behind. Writers hold an exclusive ``flock`` on their
temporary file until it is renamed, so the next write to the cache removes every
temporary file that no live process holds and that was last written more than
:data:`STALE_TMP_AGE_S` seconds ago (the age covers the instant between a file's
creation and its lock). Where ``fcntl`` is missing (Windows), the age alone decides,
with :data:`STALE_TMP_AGE_NO_LOCK_S`.

Patient identifiers (:data:`pipeline.volume.PATIENT_IDENTIFIERS`) are left out of
sidecars unless the cache, or the write, is asked to keep them.

The sidecar's ``format`` (:data:`FORMAT`) changes whenever ingest computes other HU values from the same
DICOM files; entries of an earlier format are refused (ingest the case again) rather than served:
``ctpipe-case/1`` arrays kept pixel padding (PixelPaddingValue) as rescaled values (e.g. +62512 HU),
``ctpipe-case/2`` ones have it as -1024 HU (see :mod:`pipeline.ingest.padding`) but read every slice of a series with
the first slice's BitsStored (a 16-bit metal slice among 12-bit ones lost its high bits: 3000 HU became -1096 HU);
``ctpipe-case/3`` arrays read each slice with its own. A ``ctpipe-case/3`` entry of a tilted-gantry series whose
metadata lacks ``GantryTiltGrownColumnsRows`` was corrected onto a grid of the images' size, cutting what the shift
moved past its edge: it is refused too (the other entries of that format stay valid).

A float volume is checked for NaN and infinite voxels once, when it is written (a NIfTI/NRRD input may hold them):
up to :data:`MAX_NONFINITE_FRACTION` of them are set to -1024 HU (air) in the stored array, with a warning naming the
case and the count, and a volume with more is stored as it is (the detector refuses it by name). The sidecar's
``nonfinite`` keeps what was found, ``{"voxels": N, "set_to_air": bool}`` (``voxels`` 0: every voxel is finite), so
that readers trust it instead of scanning the array on every read (:attr:`CacheEntry.nonfinite`); an entry an earlier
version wrote has no such record, and readers check its voxels themselves.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import numpy as np

from .atomic import atomic_open
from .errors import CacheError, described, require_path
from .locks import flock
from .volume import CTVolume, Geometry, require_volume, without_identifiers

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

#: Sidecar format; bumped when ingest's HU values change (an older entry is refused: see the module docstring).
FORMAT = "ctpipe-case/3"
#: Earlier formats, with what their HU arrays lack.
OLD_FORMATS = {
    "ctpipe-case/1": "written by an earlier ctpipe whose HU arrays kept pixel padding (PixelPaddingValue) as image "
    "values, e.g. +62512 HU around the patient, instead of -1024 HU",
    "ctpipe-case/2": "written by an earlier ctpipe that read every slice of a series with the first slice's BitsStored, "
    "so a slice stored with more bits (e.g. 16-bit metal among 12-bit slices) could hold wrong HU values",
}
#: The share of a volume's voxels that may be NaN or infinite and still be set to air: a volume with more is corrupt
#: (the detector refuses it, :func:`pipeline.detection.infer_input.clean_volume`), and is cached as it is.
MAX_NONFINITE_FRACTION = 0.01
#: HU the cache stores in place of a NaN or infinite voxel: air, as the detector sets them.
NONFINITE_HU = -1024.0
#: The metadata key of a volume whose NaN or infinite voxels were set to air before it reached its reader: their count
#: (:meth:`CaseCache.read` sets it from the sidecar's record, the detector when it cleans a volume itself).
NONFINITE_SET_TO_AIR_KEY = "NonfiniteVoxelsSetToAir"
_CASE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_TEMP_NAME = re.compile(r"^\.[A-Za-z0-9][A-Za-z0-9._-]*\.(?:npy|json)\.[^/]+\.tmp$")

#: Seconds since its last write after which an unlocked temporary file counts as left by a dead writer.
STALE_TMP_AGE_S = 2.0
#: The same without file locks (no ``fcntl``): only the age tells, so it is long.
STALE_TMP_AGE_NO_LOCK_S = 3600.0
#: How a cache folder is made, as the errors of a missing or empty one say.
_INGEST = "ctpipe ingest SOURCE --out CACHE, or CaseCache.write(case_id, volume)"
#: What a cache writer's lock is for (named where the cache's file system gives no locks).
_LOCK_PURPOSE = "another process's cache clean-up never removes a file this one is writing"


def is_safe_case_id(case_id: str) -> bool:
    """Whether ``case_id`` can name the files and folders of a case (no path separator, no '..', no suffix of the
    cache's own files)."""
    return bool(_CASE_ID.match(case_id)) and not case_id.endswith((".json", ".npy"))


def is_plain_file_name(name: str) -> bool:
    """Whether ``name`` names a file inside a folder, not a path out of it (no separator, not empty, no leading '.')."""
    return bool(name) and not name.startswith(".") and not any(c in name for c in "/\\\0")


def check_case_id(case_id: str) -> str:
    """Return ``case_id`` if it is a safe file stem, else raise :class:`CacheError`."""
    if not isinstance(case_id, str):
        raise CacheError(
            f"case id must be text, got {described(case_id)}",
            fix="pass the case's id as a string, e.g. its SeriesInstanceUID (CaseCache.case_ids() lists those cached)",
        )
    if not is_safe_case_id(case_id):
        raise CacheError(
            f"case id {case_id!r} is not a safe file name",
            fix="use letters, digits, '.', '_' and '-' only (a SeriesInstanceUID is fine)",
        )
    return case_id


def fingerprint_array(array: np.ndarray) -> str:
    """SHA-256 of the array's dtype, shape and bytes (hex, first 16 bytes)."""
    h = hashlib.sha256()
    h.update(f"{array.dtype.str}{array.shape}".encode())
    h.update(np.ascontiguousarray(array).data)
    return h.hexdigest()[:32]


@contextmanager
def _locked_atomic_open(path: Path) -> Iterator[BinaryIO]:
    """:func:`~pipeline.atomic.atomic_open` whose temporary file stays locked (``flock``) until it is renamed.

    The lock tells :meth:`CaseCache.remove_stale_temp_files` in other processes that the file is
    being written; a duplicate descriptor keeps it held through the rename.
    """
    held: int | None = None
    try:
        with atomic_open(path) as fh:
            if fcntl is not None:
                flock(fh.fileno(), fcntl.LOCK_EX, where=path.parent, error=CacheError, what=_LOCK_PURPOSE)
                held = os.dup(fh.fileno())
            yield fh
    finally:
        if held is not None:
            os.close(held)


def _atomic_save_npy(path: Path, array: np.ndarray) -> None:
    with _locked_atomic_open(path) as fh:
        np.lib.format.write_array(fh, np.ascontiguousarray(array), allow_pickle=False)


def _atomic_save_bytes(path: Path, data: bytes) -> None:
    with _locked_atomic_open(path) as fh:
        fh.write(data)


def _remove_if_unheld(path: str) -> bool:
    """Remove ``path`` unless a live process holds its lock; True when removed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if fcntl is not None:
            try:
                flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, where=Path(path).parent, error=CacheError, what=_LOCK_PURPOSE)
            except BlockingIOError:
                return False  # a live writer holds it
        os.unlink(path)
        return True
    finally:
        os.close(fd)


def _check_tilt_grid(sidecar: Mapping[str, Any], where: Path) -> None:
    """Refuse an entry whose gantry tilt correction kept the images' size (an earlier ctpipe's: see the module
    docstring)."""
    metadata = sidecar.get("metadata")
    if not isinstance(metadata, Mapping):
        return
    tilt = metadata.get("GantryTiltCorrectedDeg")
    if tilt and "GantryTiltGrownColumnsRows" not in metadata:
        raise CacheError(
            f"the case-cache entry holds a gantry tilt correction ({tilt} deg) by an earlier ctpipe that kept the "
            "images' size: what the correction shifted past the field of view's edge was cut and the opposite edge "
            "repeated its border pixels",
            where=where,
            fix="ingest the case again from its DICOM files (ctpipe ingest --allow-gantry-tilt): the grid now grows "
            "to hold every slice whole",
        )


def _set_nonfinite_to_air(arr: np.ndarray, case_id: str) -> tuple[np.ndarray, dict[str, Any]]:
    """``arr`` (HU ``[k, j, i]``) with its NaN or infinite voxels set to :data:`NONFINITE_HU` (a copy; ``arr`` itself
    when it has none, or more than :data:`MAX_NONFINITE_FRACTION` of them), and the sidecar's ``nonfinite`` record."""
    if arr.dtype.kind != "f":
        return arr, {"voxels": 0, "set_to_air": False}
    bad = ~np.isfinite(arr)
    n_bad = int(np.count_nonzero(bad))
    if n_bad == 0:
        return arr, {"voxels": 0, "set_to_air": False}
    if n_bad > MAX_NONFINITE_FRACTION * arr.size:
        log.warning(
            "case %s: %d of %d voxels (%.1f%%) are NaN or infinite; cached as they are (the detector refuses the volume)",
            case_id,
            n_bad,
            arr.size,
            100.0 * n_bad / arr.size,
        )
        return arr, {"voxels": n_bad, "set_to_air": False}
    log.warning("case %s: %d NaN/infinite voxels set to %g HU (air) in the case cache", case_id, n_bad, NONFINITE_HU)
    return np.where(bad, arr.dtype.type(NONFINITE_HU), arr), {"voxels": n_bad, "set_to_air": True}


def nonfinite_set_to_air(metadata: Mapping[str, Any]) -> int:
    """How many NaN or infinite voxels of a volume with ``metadata`` were set to -1024 HU (air) before it reached its
    reader (:data:`NONFINITE_SET_TO_AIR_KEY`: by this cache when it wrote the case, or by the detector's
    :func:`~pipeline.detection.infer_input.clean_volume`); 0 when none were."""
    value = metadata.get(NONFINITE_SET_TO_AIR_KEY)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


@dataclass(frozen=True)
class CacheEntry:
    """Paths and sidecar of one cached case (``repr()`` leaves the sidecar out: it lists every slice's UIDs)."""

    case_id: str
    array_path: Path
    sidecar_path: Path
    sidecar: Mapping[str, Any] = field(repr=False)

    @property
    def geometry(self) -> Geometry:
        return Geometry.from_json(self.sidecar["geometry"])

    @property
    def fingerprint(self) -> str:
        return str(self.sidecar["fingerprint"])

    @property
    def nonfinite(self) -> Mapping[str, Any] | None:
        """What the writer found of NaN or infinite voxels, ``{"voxels": N, "set_to_air": bool}`` (``set_to_air``: the
        stored array holds -1024 HU in their place; ``voxels`` 0: the array is finite); None for an entry an earlier
        version wrote, whose voxels were never checked."""
        record = self.sidecar.get("nonfinite")
        if not isinstance(record, Mapping) or not isinstance(record.get("voxels"), int):
            return None
        return record


class CaseCache:
    """A folder of cached cases. ``CaseCache(path)`` creates nothing until a write, which makes the folder; listing
    the cases of a folder that does not exist (yet), or of a file, is a :class:`CacheError` naming it.

    Each case is ``<case>.npy`` (HU voxels indexed ``[k, j, i]``) and ``<case>.json`` (its geometry in DICOM patient
    coordinates, LPS, mm, and its metadata); :meth:`write` stores a :class:`~pipeline.volume.CTVolume` under a case
    id, :meth:`read` gives it back.

    ``keep_identifiers``: keep patient identifiers (:data:`pipeline.volume.PATIENT_IDENTIFIERS`)
    of the volume metadata in the sidecars; by default they are left out.
    """

    def __init__(self, root: str | os.PathLike[str], *, keep_identifiers: bool = False):
        self.root = require_path(root, where="root", error=CacheError, what="a folder", fix="pass the cache folder")
        self.keep_identifiers = keep_identifiers
        self._swept = False

    def __repr__(self) -> str:
        if not self.root.exists():  # a cache opened to be written: a notebook's cell shows it before the first write
            return f"CaseCache({str(self.root)!r}, no folder yet: the first write makes it)"
        if not self.root.is_dir():
            return f"CaseCache({str(self.root)!r}, a file, not a cache folder)"
        return f"CaseCache({str(self.root)!r}, cases={len(self.case_ids())})"

    def array_path(self, case_id: str) -> Path:
        return self.root / f"{check_case_id(case_id)}.npy"

    def sidecar_path(self, case_id: str) -> Path:
        return self.root / f"{check_case_id(case_id)}.json"

    def case_ids(self) -> list[str]:
        """Ids of complete cases (those with a sidecar), sorted. A :class:`CacheError` when the folder does not exist
        (a mistyped path, or a new cache that no write has made yet) or is a file, rather than no cases."""
        self._require_folder()
        return sorted(p.stem for p in self.root.glob("*.json") if not p.name.startswith("."))

    def __contains__(self, case_id: str) -> bool:
        return self.sidecar_path(case_id).is_file()

    def __iter__(self) -> Iterator[str]:
        return iter(self.case_ids())

    def write(
        self, case_id: str, volume: CTVolume, *, extra: Mapping[str, Any] | None = None, keep_identifiers: bool | None = None
    ) -> CacheEntry:
        """Store ``volume`` under ``case_id`` atomically; returns the entry.

        Patient identifiers in ``volume.metadata`` and ``extra`` are left out unless
        ``keep_identifiers`` (default: the cache's setting). The first write of this
        object first removes the temporary files that killed writers left behind
        (see :meth:`remove_stale_temp_files`).
        """
        if isinstance(case_id, CTVolume) and isinstance(volume, str):
            raise CacheError(
                "the volume was given where the case id goes",
                where="CaseCache.write",
                fix=f"pass the case id first: cache.write({volume!r}, volume)",
            )
        check_case_id(case_id)
        volume = require_volume(volume)
        keep = self.keep_identifiers if keep_identifiers is None else keep_identifiers
        if not self._swept:
            self.remove_stale_temp_files()
            self._swept = True
        arr = np.ascontiguousarray(volume.array)
        if arr.dtype not in (np.int16, np.float32):
            arr = arr.astype(np.float32)
        arr, nonfinite = _set_nonfinite_to_air(arr, case_id)
        metadata, more = dict(volume.metadata), dict(extra or {})
        if not keep:
            metadata, more = without_identifiers(metadata), without_identifiers(more)
        sidecar = {
            "format": FORMAT,
            "case_id": case_id,
            "dtype": arr.dtype.str,
            "geometry": volume.geometry.to_json(),
            "fingerprint": fingerprint_array(arr),
            "nonfinite": nonfinite,
            "metadata": _jsonable(metadata),
            "extra": _jsonable(more),
        }
        apath, spath = self.array_path(case_id), self.sidecar_path(case_id)
        _atomic_save_npy(apath, arr)
        _atomic_save_bytes(spath, json.dumps(sidecar, indent=1).encode())
        log.debug("cached %s (%s, %s)", case_id, arr.shape, arr.dtype)
        return CacheEntry(case_id, apath, spath, sidecar)

    def temp_files(self) -> list[Path]:
        """Temporary files of unfinished writes in the cache folder (live or left by killed writers), sorted."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if _TEMP_NAME.match(p.name))

    def remove_stale_temp_files(self) -> list[Path]:
        """Remove the temporary files of writers that died (kill -9, power loss); returns the paths removed.

        A temporary file (``.<case>.npy.<random>.tmp`` or ``.<case>.json.<random>.tmp``) is
        removed when no live process holds its lock and it was last written more than
        :data:`STALE_TMP_AGE_S` seconds ago. Files being written by live processes are
        left alone. Problems are logged, never raised.
        """
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("cannot list the cache folder %s to remove stale temporary files: %s", self.root, exc)
            return []
        min_age = STALE_TMP_AGE_S if fcntl is not None else STALE_TMP_AGE_NO_LOCK_S
        now = time.time()
        removed: list[Path] = []
        for e in entries:
            if not _TEMP_NAME.match(e.name):
                continue
            try:
                if not e.is_file(follow_symlinks=False) or now - e.stat(follow_symlinks=False).st_mtime < min_age:
                    continue
                if not _remove_if_unheld(e.path):
                    continue
            except FileNotFoundError:
                continue  # its writer renamed or removed it meanwhile
            except OSError as exc:
                log.warning("cannot remove the stale temporary file %s: %s", e.path, exc)
                continue
            removed.append(Path(e.path))
            log.info("removed %s, a temporary file left by an interrupted write", e.path)
        return removed

    def entry(self, case_id: str) -> CacheEntry:
        """Read and check the sidecar and the array header of ``case_id`` (no voxel data)."""
        apath, spath = self.array_path(case_id), self.sidecar_path(case_id)
        if not spath.is_file():
            self._raise_not_cached(case_id, spath)
        try:
            sidecar = json.loads(spath.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CacheError(f"sidecar is not valid JSON ({exc})", where=spath, fix="ingest the case again") from exc
        if sidecar.get("format") in OLD_FORMATS:
            raise CacheError(
                f"the case-cache entry has format {sidecar.get('format')!r} (this ctpipe reads {FORMAT!r}): "
                f"{OLD_FORMATS[sidecar['format']]}",
                where=spath,
                fix="ingest the case again from its DICOM files (ctpipe ingest)",
            )
        if sidecar.get("format") != FORMAT:
            raise CacheError(
                f"not a case-cache sidecar (format {sidecar.get('format')!r}, expected {FORMAT!r})",
                where=spath,
                fix="pass a .json written by ctpipe ingest (or the case's DICOM folder)",
            )
        _check_tilt_grid(sidecar, spath)
        if not apath.is_file():
            raise CacheError("array file is missing", where=apath, fix="ingest the case again (ctpipe ingest)")
        try:
            with open(apath, "rb") as fh:
                major, _minor = np.lib.format.read_magic(fh)
                if major == 1:
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
                else:
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
                data_offset = fh.tell()
        except (OSError, ValueError) as exc:
            raise CacheError(f"array file header is unreadable ({exc})", where=apath, fix="ingest the case again") from exc
        geom = Geometry.from_json(sidecar["geometry"])
        if tuple(shape) != geom.shape or np.dtype(dtype).str != sidecar["dtype"] or fortran:
            raise CacheError(
                f"array is {tuple(shape)} {np.dtype(dtype)} but the sidecar says {geom.shape} {np.dtype(sidecar['dtype'])}",
                where=apath,
                fix="ingest the case again; the two files come from different writes",
            )
        expected = data_offset + int(np.prod(shape)) * np.dtype(dtype).itemsize
        actual = apath.stat().st_size
        if actual < expected:
            raise CacheError(
                f"array file is truncated: {actual} bytes, expected {expected}", where=apath, fix="ingest the case again"
            )
        return CacheEntry(case_id, apath, spath, sidecar)

    def _require_folder(self) -> None:
        """Raise :class:`CacheError` when the cache folder is missing or is a file, naming it and the fix."""
        if not self.root.exists():
            raise CacheError("no such cache folder", where=self.root, fix=f"check the path (a folder written by {_INGEST})")
        if not self.root.is_dir():
            raise CacheError("is a file, not a cache folder", where=self.root, fix=f"pass the folder of the cache ({_INGEST})")

    def _raise_not_cached(self, case_id: str, spath: Path) -> NoReturn:
        """Raise :class:`CacheError` for ``case_id``, which has no sidecar: saying whether the cache folder is
        missing, is a file, holds no cases, or holds others (the first of them named)."""
        ids = self.case_ids()
        if not ids:
            raise CacheError(
                f"no case {case_id!r} (no sidecar): the cache holds no cases",
                where=spath,
                fix=f"write or ingest the case first ({_INGEST})",
            )
        shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        raise CacheError(
            f"no case {case_id!r} in the cache (no sidecar); it holds {len(ids)} case(s): {shown}",
            where=spath,
            fix="pick an id of CaseCache.case_ids(), or ingest the case again (ctpipe ingest)",
        )

    def read(self, case_id: str, *, mmap: bool = False, verify: bool = False) -> CTVolume:
        """Load a cached case as a :class:`CTVolume`.

        ``mmap=True`` maps the array read-only instead of reading it;
        ``verify=True`` also checks the content fingerprint. A case whose NaN or infinite voxels were set to air when
        it was written carries their count in its metadata (:data:`NONFINITE_SET_TO_AIR_KEY`), so that whoever reads
        it (the detector, the reconstruction) can say that its figures come from a volume with those voxels changed.
        """
        entry = self.entry(case_id)
        arr = np.load(entry.array_path, mmap_mode="r" if mmap else None, allow_pickle=False)
        if verify and fingerprint_array(np.asarray(arr)) != entry.fingerprint:
            raise CacheError(
                "array content does not match the sidecar's fingerprint", where=entry.array_path, fix="ingest the case again"
            )
        metadata = dict(entry.sidecar.get("metadata") or {})
        record = entry.nonfinite
        if record is not None and record.get("set_to_air") is True and record["voxels"] > 0:
            metadata[NONFINITE_SET_TO_AIR_KEY] = int(record["voxels"])
        return CTVolume(arr, entry.geometry, metadata=metadata)
