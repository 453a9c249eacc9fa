"""The source CT series of a volume as DICOM headers, each volume slice ``k`` matched to its source image.

:func:`read_source_series` reads the headers (``stop_before_pixels=True``) of a series' files and
matches every slice ``k`` of the :class:`~pipeline.volume.CTVolume` to the image (single-frame CT)
or frame (multi-frame Enhanced CT) whose ImagePositionPatient lies at that slice's position (LPS mm).
The results written from a volume reference those images: the SEG frames and the SR's coordinates
land on the slices the viewer shows.

Sources missing attributes that the results must repeat are repaired in the headers kept here
(never on disk; :mod:`.source_headers`), each with a warning: a missing StudyInstanceUID or FrameOfReferenceUID is
generated, missing patient and study attributes of DICOM type 2 are written empty. Patient and study
values the results cannot repeat (a date such as ``1970-01-01``, PatientSex ``U``, a value too long for
its VR) are written empty, or left out where optional, with a warning that names the attribute, never
the value. Without SOPInstanceUID or ImagePositionPatient an image cannot be referenced:
:class:`~pipeline.errors.SourceMismatchError` names the attribute and the file. Images without
SeriesInstanceUID (de-identified archives) belong to a volume that ingest gave a generated series id
(``SeriesInstanceUIDGenerated`` in its metadata): they are picked by the SOP Instance UIDs ingest
recorded per slice (``SOPInstanceUIDs``; else every image without SeriesInstanceUID, matched by
position) and the results name that generated id as the source series, with a warning.

A volume resampled from a tilted-gantry series (``GantryTiltCorrectedDeg`` in its metadata) keeps each source image
in the plane of its slice, shifted in-plane onto a grid grown by ``GantryTiltGrownColumnsRows``: image k is matched to
slice k by its position along the slice normal, its first pixel anywhere on that slice's grown part of the grid.
:func:`frame_positions` gives each slice's own position in its image's plane, which the SEG's frames carry.
"""

from __future__ import annotations

import copy
import datetime
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SourceMismatchError
from ..volume import PATIENT_IDENTIFIERS, CTVolume
from .source_headers import PATIENT_STUDY_KEYWORDS, clear_attributes, repair_headers, uid_text

__all__ = [
    "ENHANCED_CT_STORAGE",
    "INPLANE_TOLERANCE",
    "NORMAL_TOLERANCE",
    "PATIENT_STUDY_KEYWORDS",
    "SourceSeries",
    "check_source",
    "frame_positions",
    "read_source_series",
]

log = logging.getLogger(__name__)

ENHANCED_CT_STORAGE = "1.2.840.10008.5.1.4.1.1.2.1"

#: along the slice normal, a source image matches slice k within this fraction of the slice spacing
NORMAL_TOLERANCE = 0.25
#: in the slice plane, a source image's position matches within this fraction of the pixel spacing
INPLANE_TOLERANCE = 0.25


@dataclass(frozen=True)
class SourceSeries:
    """The source series of a volume, slice by slice (headers only; positions LPS mm).

    datasets: the headers, in slice order ``k`` for a single-frame series, or the one multi-frame dataset.
    sop_class_uids / sop_instance_uids: the image of each slice ``k``.
    frame_numbers: the 1-based frame of each slice ``k`` in a multi-frame source, else None.
    positions: ImagePositionPatient of each slice's image (``(nk, 3)``, LPS mm, as the source states it).
    frame_of_reference_uid, study_instance_uid, series_instance_uid: of the source (possibly generated, see
        ``generated``).
    generated: attributes the source lacked and that were generated or written empty (each logged as a warning).
    """

    datasets: tuple[Any, ...]
    sop_class_uids: tuple[str, ...]
    sop_instance_uids: tuple[str, ...]
    frame_numbers: tuple[int, ...] | None
    positions: np.ndarray
    frame_of_reference_uid: str
    study_instance_uid: str
    series_instance_uid: str
    generated: tuple[str, ...] = ()

    @property
    def multiframe(self) -> bool:
        return self.frame_numbers is not None

    def __len__(self) -> int:
        return len(self.sop_instance_uids)

    def dataset_of(self, k: int) -> Any:
        """The header holding slice ``k``."""
        return self.datasets[0] if self.multiframe else self.datasets[k]

    def frame_of(self, k: int) -> int | None:
        """The 1-based frame number of slice ``k`` in a multi-frame source, else None."""
        return None if self.frame_numbers is None else self.frame_numbers[k]

    def patient_study(self) -> dict[str, Any]:
        """Patient and study attributes of the source (after repair), keyword → value, to copy into results."""
        ds = self.datasets[0]
        return {kw: ds[kw].value for kw in PATIENT_STUDY_KEYWORDS if kw in ds}

    def acquired(self) -> datetime.datetime | None:
        """The source series' date and time (SeriesDate/SeriesTime, else StudyDate/StudyTime; midnight when only the
        date is known), or None when the headers hold no valid date."""
        ds = self.datasets[0]
        for date_kw, time_kw in (("SeriesDate", "SeriesTime"), ("StudyDate", "StudyTime")):
            date = str(ds.get(date_kw) or "").strip()
            if not date:
                continue
            digits = "".join(c for c in str(ds.get(time_kw) or "").split(".")[0] if c.isdigit())[:6]
            try:
                return datetime.datetime.strptime(date + digits.ljust(6, "0"), "%Y%m%d%H%M%S")
            except ValueError:
                continue
        return None

    def without_identifiers(self) -> SourceSeries:
        """A copy whose headers hold no patient identifier (:data:`pipeline.volume.PATIENT_IDENTIFIERS`): those the
        results must carry (type 2: PatientName, PatientID, ...) are empty, the others absent. Study, series and frame
        of reference UIDs are kept, so results written from it still belong to the source's study."""
        datasets = tuple(copy.deepcopy(ds) for ds in self.datasets)
        clear_attributes(datasets, PATIENT_IDENTIFIERS)
        return replace(self, datasets=datasets)


def _list_files(files: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Path]:
    if isinstance(files, (str, os.PathLike)):
        root = Path(files)
        if root.is_dir():
            return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
        return [root]
    return [Path(f) for f in files]


def _read_headers(paths: list[Path]) -> list[tuple[Path, Any]]:
    from pydicom.errors import InvalidDicomError

    from ..ingest._pydicom import read_dataset  # lazy on purpose: pydicom is slow to import
    from ..ingest.image import starts_like_dicom

    out = []
    for path in paths:
        try:
            if not starts_like_dicom(path):
                raise InvalidDicomError("neither a 'DICM' marker nor a data set at its start")
            ds = read_dataset(path, stop_before_pixels=True)  # also a file without file meta information, as ingest
        except InvalidDicomError:
            log.debug("%s: not a DICOM file, skipped", path)
            continue
        except OSError as exc:
            raise SourceMismatchError(f"cannot read the file ({exc})", where=path, fix="check the path and permissions") from exc
        out.append((path, ds))
    return out


def _positions(path: Path, ds: Any) -> tuple[np.ndarray, list[int] | None]:
    """Positions (LPS mm) of the images in one header and, for a multi-frame one, their 0-based frame indices."""
    frames = int(ds.get("NumberOfFrames", 1) or 1)
    if frames > 1 or str(ds.get("SOPClassUID", "")) == ENHANCED_CT_STORAGE:
        from ..ingest.multiframe import read_frames

        info = read_frames(path, ds)
        return np.array([f.position for f in info], dtype=np.float64).reshape(-1, 3), [f.frame for f in info]
    ipp = ds.get("ImagePositionPatient")
    if ipp is None or len(ipp) != 3:
        raise SourceMismatchError(
            f"the image has no valid ImagePositionPatient ({ipp!r})",
            where=path,
            fix="pass the original CT files; without a position the image cannot be referenced",
        )
    return np.array([[float(v) for v in ipp]], dtype=np.float64), None


def _tilt_grown(volume: CTVolume) -> tuple[int, int] | None:
    """The columns and rows a tilt-corrected volume's grid has more than its source images (``(0, 0)`` for a tilt
    corrected without growing it), or None for a volume not corrected for a gantry tilt."""
    md = volume.metadata
    tilt = md.get("GantryTiltCorrectedDeg")
    if not (isinstance(tilt, (int, float)) and tilt):
        return None
    grown = md.get("GantryTiltGrownColumnsRows")
    if isinstance(grown, (list, tuple)) and len(grown) == 2:
        return int(grown[0]), int(grown[1])
    return (0, 0)


def _inplane_ok(volume: CTVolume, ij: np.ndarray) -> np.ndarray:
    """Whether source images whose first pixel lies at grid indices ``ij`` (``(n, 2)``, along i and j) of their slice
    belong to it: at the grid's first voxel (within :data:`INPLANE_TOLERANCE` of a pixel), or, for a tilt-corrected
    volume, anywhere its grid grew by (the slice's in-plane shift)."""
    g = volume.geometry
    grown = _tilt_grown(volume)
    if grown is None:
        return np.hypot(ij[:, 0] * g.spacing[0], ij[:, 1] * g.spacing[1]) <= INPLANE_TOLERANCE * min(g.spacing[:2])
    upper = np.asarray(grown, dtype=np.float64) + INPLANE_TOLERANCE
    return np.all((ij >= -INPLANE_TOLERANCE) & (ij <= upper), axis=1)


def _match(volume: CTVolume, positions: np.ndarray, names: list[str], where: str) -> np.ndarray:
    """For each slice k, the row of ``positions`` lying at that slice (one-to-one), as an index array."""
    g = volume.geometry
    normal = g.direction[:, 2]
    nk = g.shape[0]
    ijk = g.lps_to_index(positions)
    k_float = ijk[:, 2]
    k_near = np.rint(k_float).astype(np.int64)
    ok = (np.abs(k_float - k_near) <= NORMAL_TOLERANCE) & (k_near >= 0) & (k_near < nk)
    ok &= _inplane_ok(volume, ijk[:, :2])
    rows = np.full(nk, -1, dtype=np.int64)
    for row in np.flatnonzero(ok):
        k = int(k_near[row])
        if rows[k] >= 0:
            raise SourceMismatchError(
                f"two source images lie at slice {k} ({g.index_to_lps([0, 0, k]).round(3).tolist()} mm): "
                f"{names[rows[k]]} and {names[row]}",
                where=where,
                fix="remove the duplicate image from the source files (the volume was built from one of them)",
            )
        rows[k] = row
    missing = np.flatnonzero(rows < 0)
    if missing.size:
        k = int(missing[0])
        off = [names[r] for r in np.flatnonzero(~ok)][:3]
        hint = f"; images off the volume's grid: {', '.join(off)}" if off else ""
        raise SourceMismatchError(
            f"{missing.size} of {nk} volume slices have no source image, first slice {k} at "
            f"{g.index_to_lps([0, 0, k]).round(3).tolist()} mm (LPS, normal {normal.round(4).tolist()}){hint}",
            where=where,
            fix="pass the files the volume was loaded from; a volume resampled from a tilted-gantry or irregular "
            "series has no source image per slice",
        )
    unused = int(positions.shape[0] - np.count_nonzero(rows >= 0))
    if unused:
        log.warning("%s: %d source image(s) match no volume slice and are not referenced", where, unused)
    return rows


def _recorded_sop_uids(volume: CTVolume) -> set[str]:
    """The SOP Instance UIDs ingest recorded for the volume's slices (``SOPInstanceUIDs``), or an empty set."""
    values = volume.metadata.get("SOPInstanceUIDs")
    if not isinstance(values, (list, tuple)):
        return set()
    return {uid_text(v) for v in values if isinstance(v, str) and uid_text(v)}


def _of_volume(headers: list[tuple[Path, Any]], volume: CTVolume, where: str) -> tuple[list[tuple[Path, Any]], tuple[str, ...]]:
    """The headers of the volume's series, and ``("SeriesInstanceUID",)`` when the series id is a generated one.

    A volume whose series id ingest generated (the files have no SeriesInstanceUID) takes the images with the SOP
    Instance UIDs it recorded, else every image without SeriesInstanceUID (matched by position later); those headers
    get the generated id as their SeriesInstanceUID (here only, never on disk).
    """
    series_uid = volume.series_uid
    if not series_uid:
        return headers, ()
    of_series = [(p, ds) for p, ds in headers if uid_text(ds.get("SeriesInstanceUID")) == series_uid]
    if of_series:
        return of_series, ()
    found = sorted({uid_text(ds.get("SeriesInstanceUID")) or "none" for _, ds in headers})
    if volume.metadata.get("SeriesInstanceUIDGenerated"):
        recorded = _recorded_sop_uids(volume)
        unnamed = [(p, ds) for p, ds in headers if not uid_text(ds.get("SeriesInstanceUID"))]
        if recorded:
            mine, how = [(p, ds) for p, ds in unnamed if uid_text(ds.get("SOPInstanceUID")) in recorded], "SOP Instance UIDs"
        else:
            mine, how = unnamed, "positions"
        if mine:
            log.warning(
                "%s: the source images have no SeriesInstanceUID; %d image(s) matched to the volume by their %s, "
                "the results name the generated series id %s as their source series",
                where,
                len(mine),
                how,
                series_uid,
            )
            for _, ds in mine:
                ds.SeriesInstanceUID = series_uid
            return mine, ("SeriesInstanceUID",)
        raise SourceMismatchError(
            f"no source image without SeriesInstanceUID matches the volume's generated series "
            f"{series_uid} (by its recorded SOP Instance UIDs); found series {found}",
            where=where,
            fix="pass the files the volume was loaded from",
        )
    raise SourceMismatchError(
        f"no source file belongs to the volume's series {series_uid}; found {found}",
        where=where,
        fix="pass the files of the series the volume was loaded from",
    )


def check_source(source: SourceSeries, volume: CTVolume, *, where: str = "source") -> None:
    """Raise :class:`~pipeline.errors.SourceMismatchError` unless ``source`` was matched to a volume on ``volume``'s grid."""
    g = volume.geometry
    if len(source) != g.shape[0]:
        raise SourceMismatchError(
            f"the source has {len(source)} slices, the volume {g.shape[0]}",
            where=where,
            fix="match the source files to this volume with read_source_series(files, volume)",
        )
    ks = np.arange(g.shape[0], dtype=np.float64)
    ijk = g.lps_to_index(source.positions)
    bad = (np.abs(ijk[:, 2] - ks) > NORMAL_TOLERANCE) | ~_inplane_ok(volume, ijk[:, :2])
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        expected = g.index_to_lps([0.0, 0.0, float(k)])
        raise SourceMismatchError(
            f"slice {k} of the volume lies {float(np.linalg.norm(source.positions[k] - expected)):.3f} mm from its "
            "source image's position",
            where=where,
            fix="match the source files to this volume with read_source_series(files, volume)",
        )


def frame_positions(source: SourceSeries, volume: CTVolume) -> np.ndarray:
    """Each slice's position (``(nk, 3)``, LPS mm): the grid's first voxel of slice k in the plane of its source image.

    That is the source image's own position (ImagePositionPatient) but for a tilt-corrected volume, whose slice k
    starts where the grid does, shifted in-plane from image k (see the module notes).
    """
    g = volume.geometry
    normal = g.direction[:, 2]
    ks = np.arange(g.shape[0], dtype=np.float64)
    starts = g.index_to_lps(np.stack([np.zeros_like(ks), np.zeros_like(ks), ks], axis=1))
    # moved along the normal into the image's plane: the source's spacing may deviate from the grid's (2 %)
    starts -= ((starts - source.positions) @ normal)[:, None] * normal[None, :]
    return starts


def read_source_series(files: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], volume: CTVolume) -> SourceSeries:
    """Read the headers of ``files`` (a folder, searched recursively, or a list of files) and match them to ``volume``.

    Only files of the volume's series (``volume.series_uid``) are used when the volume names one (for a generated
    series id, the images ingest recorded, see the module docstring). Each slice ``k``
    of the volume is matched to the image (or multi-frame frame) whose ImagePositionPatient (LPS mm) lies within
    :data:`NORMAL_TOLERANCE` slice spacings along the slice normal and :data:`INPLANE_TOLERANCE` pixel spacings in
    the slice plane. Raises :class:`~pipeline.errors.SourceMismatchError` naming the slice, file or attribute when
    slices and images do not correspond one-to-one.
    """
    paths = _list_files(files)
    where = str(paths[0].parent if paths else files)
    headers = _read_headers(paths)
    if not headers:
        raise SourceMismatchError(
            "no DICOM files among the source files",
            where=where,
            fix="pass the folder or the files of the CT series the volume was loaded from",
        )
    headers, series_generated = _of_volume(headers, volume, where)
    for path, ds in headers:
        for keyword in ("SOPInstanceUID", "SOPClassUID", "SeriesInstanceUID"):
            if not uid_text(ds.get(keyword)):
                raise SourceMismatchError(
                    f"the image has no {keyword}",
                    where=path,
                    fix="pass the original CT files; an image without it cannot be referenced",
                )
    multi = [
        (p, ds)
        for p, ds in headers
        if int(ds.get("NumberOfFrames", 1) or 1) > 1 or str(ds.get("SOPClassUID", "")) == ENHANCED_CT_STORAGE
    ]
    if multi and len(headers) > 1:
        raise SourceMismatchError(
            f"{len(headers)} files of one series, {len(multi)} of them multi-frame",
            where=where,
            fix="pass the one multi-frame file, or the single-frame files alone",
        )
    names: list[str] = []
    pos_rows: list[np.ndarray] = []
    frames_of_rows: list[int] = []
    for path, ds in headers:
        pos, frames = _positions(path, ds)
        pos_rows.append(pos)
        if frames is None:
            names.append(path.name)
        else:
            names += [f"{path.name} frame {f + 1}" for f in frames]
            frames_of_rows += frames
    positions = np.concatenate(pos_rows, axis=0)
    rows = _match(volume, positions, names, where)
    if multi:
        ds = headers[0][1]
        datasets: list[Any] = [ds]
        frame_numbers: tuple[int, ...] | None = tuple(frames_of_rows[r] + 1 for r in rows)
        sop_classes = (str(ds.SOPClassUID),) * len(rows)
        sop_uids = (str(ds.SOPInstanceUID),) * len(rows)
    else:
        datasets = [headers[r][1] for r in rows]
        frame_numbers = None
        sop_classes = tuple(str(d.SOPClassUID) for d in datasets)
        sop_uids = tuple(str(d.SOPInstanceUID) for d in datasets)
    generated = series_generated + repair_headers(datasets, volume, where)
    first = datasets[0]
    log.debug("%s: %d slices matched to %s", where, len(rows), "frames" if multi else "images")
    return SourceSeries(
        datasets=tuple(datasets),
        sop_class_uids=sop_classes,
        sop_instance_uids=sop_uids,
        frame_numbers=frame_numbers,
        positions=positions[rows],
        frame_of_reference_uid=str(first.FrameOfReferenceUID),
        study_instance_uid=str(first.StudyInstanceUID),
        series_instance_uid=str(first.SeriesInstanceUID),
        generated=generated,
    )
