"""From one (sub-)series to a validated :class:`~pipeline.volume.CTVolume` in HU.

:func:`plan_volume` checks everything that the headers can tell (consistency,
sort order, spacing, tilt, pixel data present, decoder installed) without
reading pixels; :func:`read_volume` then reads the pixels in parallel and
converts them to HU. Geometry is DICOM patient space (LPS, mm) throughout.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from ..errors import (
    DuplicateSliceError,
    InconsistentSeriesError,
    MissingSliceError,
)
from ..volume import PATIENT_IDENTIFIERS, CTVolume
from .geometry import StackGeometry, stack_geometry
from .header_checks import check_headers
from .headers import SliceHeader
from .lossy import lossy_compression
from .measured import TILT_SHIFTS_KEY, shifts_metadata
from .multiframe import FrameInfo, read_frame_pixels, read_frames
from .padding import PADDING_HU
from .pixels import hu_range, padded_range, read_stored, to_hu
from .sanity import check_hu_range, check_rescale
from .series import SeriesInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VolumePlan:
    """A validated series, ready for its pixels to be read.

    ``headers`` are in output slice order (single-frame series); ``frames`` are
    set instead for enhanced multi-frame objects.
    """

    series: SeriesInfo
    where: str
    stack: StackGeometry
    headers: tuple[SliceHeader, ...]
    frames: tuple[FrameInfo, ...] | None
    slopes: np.ndarray
    intercepts: np.ndarray
    metadata: dict[str, Any]


def describe(series: SeriesInfo) -> str:
    """'series <key> ("description", N files in <folder>)' for messages."""
    folders = {os.path.dirname(str(p)) for p in series.files}
    folder = os.path.commonpath(sorted(folders)) if folders else "?"
    desc = f'"{series.description}", ' if series.description else ""
    return f"series {series.key} ({desc}{len(series.headers)} file(s) in {folder})"


class _ShortNames(Sequence[str]):
    """File paths relative to the series' common folder, computed only when a message needs them."""

    def __init__(self, headers: Sequence[SliceHeader]):
        self._headers = headers
        self._root: str | None = None

    def __len__(self) -> int:
        return len(self._headers)

    @overload
    def __getitem__(self, k: int) -> str: ...

    @overload
    def __getitem__(self, k: slice) -> list[str]: ...

    def __getitem__(self, k: int | slice) -> str | list[str]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if self._root is None:
            self._root = os.path.commonpath([str(h.path.parent) for h in self._headers])
        return os.path.relpath(self._headers[int(k)].path, self._root)


def _metadata(
    series: SeriesInfo, h0: SliceHeader, n_files: int, keep_identifiers: bool, thickness: float | None = None
) -> dict[str, Any]:
    """The volume's metadata; patient identifiers, and the SeriesDescription as it is, only with ``keep_identifiers``
    (see PATIENT_IDENTIFIERS and :attr:`SeriesInfo.description`)."""

    def num(text: str | None) -> float | None:
        try:
            return float(text) if text not in (None, "") else None
        except ValueError:
            return None

    md: dict[str, Any] = {
        "StudyInstanceUID": h0.study_uid,
        "SeriesInstanceUID": series.uid,
        "SeriesKey": series.key,
        "FrameOfReferenceUID": h0.extra_value("FrameOfReferenceUID"),
        "StudyDate": h0.extra_value("StudyDate"),
        "Modality": h0.modality,
        "SeriesDescription": h0.series_description if keep_identifiers else series.description,
        "SeriesNumber": h0.series_number,
        "SliceThickness": thickness if thickness is not None else num(h0.extra_value("SliceThickness")),
        "ConvolutionKernel": h0.extra_value("ConvolutionKernel"),
        "KVP": num(h0.extra_value("KVP")),
        "Manufacturer": h0.extra_value("Manufacturer"),
        "PatientPosition": h0.extra_value("PatientPosition"),
        "TransferSyntaxUID": h0.transfer_syntax,
        "SourceFileCount": n_files,
        "CoordinateSystem": "LPS",
    }
    if series.uid != h0.series_uid:
        md["SeriesInstanceUIDGenerated"] = True
    md.update(lossy_compression(series.headers))  # any file lossy compressed: the series is
    if keep_identifiers:
        md.update({k: v for k, v in h0.extra if k in PATIENT_IDENTIFIERS})
    if series.warnings:
        md["warnings"] = list(series.warnings)
    return md


def plan_volume(
    series: SeriesInfo,
    *,
    spacing_tolerance: float = 0.02,
    allow_gantry_tilt: bool = False,
    check_modality: bool = True,
    keep_identifiers: bool = False,
) -> VolumePlan:
    """Validate ``series`` from its headers and work out its LPS geometry (no pixels read).

    ``keep_identifiers``: copy the patient identifiers the files hold, of those the header scan reads
    (:data:`pipeline.ingest.header_values.METADATA_IDENTIFIERS`), into the metadata; by default they are left out.
    Raises the specific :mod:`pipeline.errors` class for the first problem found.
    """
    where = describe(series)
    headers = series.headers
    check_headers(headers, where, check_modality)
    if any(h.is_enhanced for h in headers):
        return _plan_multiframe(series, where, spacing_tolerance, allow_gantry_tilt, keep_identifiers)
    h0 = headers[0]
    try:
        stack = stack_geometry(
            _ShortNames(headers),
            np.array([h.position for h in headers], dtype=np.float64),
            h0.orientation or (),
            h0.pixel_spacing or (),
            int(h0.rows or 0),
            int(h0.columns or 0),
            where=where,
            spacing_tolerance=spacing_tolerance,
            allow_gantry_tilt=allow_gantry_tilt,
            gantry_tilt_attr=h0.extra_value("GantryDetectorTilt"),
        )
    except DuplicateSliceError as exc:
        raise _duplicates_compared(headers, exc, where) from exc
    ordered = tuple(headers[k] for k in stack.order)
    md = _metadata(series, ordered[0], len(headers), keep_identifiers)
    # per slice k (volume order): the scanner's numbering and the instance, for findings to name the source slice
    md["InstanceNumbers"] = [h.instance_number for h in ordered]
    md["SOPInstanceUIDs"] = [h.sop_instance for h in ordered]
    _note_tilt(md, stack)
    return VolumePlan(
        series, where, stack, ordered, None, np.array([h.slope for h in ordered]), np.array([h.intercept for h in ordered]), md
    )


def _note_tilt(md: dict[str, Any], stack: StackGeometry) -> None:
    """Record a gantry tilt correction in the metadata: the tilt, the columns and rows the grid grew by, a warning."""
    if stack.shifts is None:
        return
    md["GantryTiltCorrectedDeg"] = round(stack.tilt_deg, 4)
    md["GantryTiltGrownColumnsRows"] = list(stack.grown)
    if stack.grown != (0, 0):  # which voxels an image measured (pipeline.ingest.measured)
        md[TILT_SHIFTS_KEY] = shifts_metadata(stack.shifts)
    sx, sy = stack.geometry.spacing[:2]
    drift = stack.shifts - stack.shifts[0]
    shift_mm = float(np.max(np.hypot(drift[:, 0] * sx, drift[:, 1] * sy)))
    shown = f"{shift_mm:.1f}"
    if stack.grown == (0, 0):
        shown = f"{shift_mm:.2f}"
        grid = "the grid keeps the images' size (a shift under a quarter of a pixel)"
    else:
        grid = (
            f"the grid grown by {stack.grown[0]} column(s) and {stack.grown[1]} row(s) to hold every slice whole; "
            f"where a slice does not reach, nothing was measured: the volume holds {PADDING_HU} HU there, which the "
            "organ masks leave out, the field-of-view check counts as the image's edge and the MPRs show as outside "
            "the scan"
        )
    md.setdefault("warnings", []).append(
        f"gantry tilt of {stack.tilt_deg:.2f} deg resampled onto an orthogonal grid: slices shifted in-plane by up "
        f"to {shown} mm, {grid}"
    )


def _duplicates_compared(headers: Sequence[SliceHeader], exc: DuplicateSliceError, where: str) -> DuplicateSliceError:
    """``exc`` told apart by the pixel data of its pairs: copies of one image (remove one of each pair), or different
    images at one position (a misplaced slice, or two stacks under one SeriesInstanceUID: neither file is simply the
    one to delete)."""
    if not exc.pairs:
        return exc
    copies: list[str] = []
    different: list[str] = []
    names = _ShortNames(headers)
    for i, j in exc.pairs[:8]:  # a few pairs tell which it is; comparing them reads two slices each
        a, b = headers[i], headers[j]
        same = (a.slope, a.intercept) == (b.slope, b.intercept) and np.array_equal(read_stored([a]), read_stored([b]))
        (copies if same else different).append(f"{names[i]} and {names[j]}")
    checked = len(copies) + len(different)
    more = f" (the first {checked} of {len(exc.pairs)} pairs compared)" if len(exc.pairs) > checked else ""
    if different:
        return DuplicateSliceError(
            f"{exc.problem}; {', '.join(different)} hold different images{more}, so they are not copies: one of each "
            "pair has a wrong ImagePositionPatient (0020,0032), or belongs to another stack filed under this "
            "SeriesInstanceUID and AcquisitionNumber (e.g. a second reconstruction)",
            where=where,
            fix="do not delete one of each pair at random: compare their InstanceNumber and SliceLocation with their "
            "neighbours' and re-export the misplaced file from the scanner/PACS; if the folder holds two stacks, move "
            "the files of one into another folder and load each folder on its own",
        )
    fix = f"remove one file of each pair (e.g. {', '.join(c.split(' and ')[1] for c in copies[:4])}), then ingest again"
    folders = {frozenset((headers[i].path.parent, headers[j].path.parent)) for i, j in exc.pairs}
    if 2 * len(exc.pairs) == len(headers) and len(folders) == 1 and len(pair := sorted(next(iter(folders)))) == 2:
        # every slice twice, one of each pair in either folder: the series was exported twice
        fix = (
            f"the series is there twice, every slice in {pair[0]} and again in {pair[1]} (a second export with new "
            f"SOPInstanceUIDs): remove one of the two folders (or scan only {pair[0]}), then ingest again"
        )
    return DuplicateSliceError(
        f"{exc.problem}; each pair holds the same image (identical pixel data and rescale){more} under two "
        "SOPInstanceUIDs: copies",
        where=where,
        fix=fix,
    )


def _plan_multiframe(series: SeriesInfo, where: str, tol: float, allow_tilt: bool, keep_identifiers: bool) -> VolumePlan:
    frames: list[FrameInfo] = []
    for h in series.headers:
        frames.extend(read_frames(h.path))
    for f in frames:
        check_rescale(f.slope, f.intercept, where=f"{f.path} (frame {f.frame + 1})")
    h0 = series.headers[0]
    ori = np.array([f.orientation for f in frames])
    if not np.allclose(ori, ori[0], atol=1e-4):
        bad = next(f for f in frames if not np.allclose(f.orientation, ori[0], atol=1e-4))
        raise InconsistentSeriesError(
            f"frames differ in ImageOrientationPatient: {bad.name} has {list(bad.orientation)} "
            f"but frame 1 has {list(frames[0].orientation)}",
            where=where,
            fix="the multi-frame object mixes orientations; load it with a tool that splits stacks",
        )
    ps = np.array([f.pixel_spacing for f in frames])
    if not np.allclose(ps, ps[0], atol=1e-4):
        raise InconsistentSeriesError(
            f"frames differ in PixelSpacing ({sorted({tuple(p) for p in ps.tolist()})})",
            where=where,
            fix="the multi-frame object mixes pixel spacings; re-export it",
        )
    try:
        stack = stack_geometry(
            [f.name for f in frames],
            np.array([f.position for f in frames]),
            frames[0].orientation,
            frames[0].pixel_spacing,
            int(h0.rows or 0),
            int(h0.columns or 0),
            where=where,
            spacing_tolerance=tol,
            allow_gantry_tilt=allow_tilt,
        )
    except (DuplicateSliceError, MissingSliceError) as exc:
        if len(series.headers) > 1:
            raise
        # one file holds every frame: there is no duplicate file to remove nor missing file to copy
        raise type(exc)(
            exc.problem,
            where=where,
            fix=f"re-export {h0.path.name} from the scanner/PACS: its frames' ImagePositionPatient (the plane position "
            "functional group) do not form one evenly spaced stack"
            + (", or, only if the gap is intended, raise the spacing tolerance" if isinstance(exc, MissingSliceError) else ""),
        ) from exc
    ordered = tuple(frames[k] for k in stack.order)
    md = _metadata(series, h0, len(series.headers), keep_identifiers, thickness=ordered[0].slice_thickness)
    md["NumberOfFrames"] = len(frames)
    _note_tilt(md, stack)
    # per slice k (volume order): the frame (1-based) and the multi-frame instance holding it
    uids = {str(h.path): h.sop_instance for h in series.headers}
    md["FrameNumbers"] = [f.frame + 1 for f in ordered]
    md["SOPInstanceUIDs"] = [uids[str(f.path)] for f in ordered]
    return VolumePlan(
        series,
        where,
        stack,
        series.headers,
        ordered,
        np.array([f.slope for f in ordered]),
        np.array([f.intercept for f in ordered]),
        md,
    )


def _read_multiframe(plan: VolumePlan) -> np.ndarray:
    assert plan.frames is not None
    per_file: dict[str, np.ndarray] = {}
    for h in plan.headers:
        per_file[str(h.path)] = read_frame_pixels(
            h.path, h.n_frames, int(h.rows or 0), int(h.columns or 0), h.transfer_syntax, pixel_end=h.pixel_end
        )
    first = next(iter(per_file.values()))
    dtype = np.result_type(*{a.dtype for a in per_file.values()})  # files of either PixelRepresentation: int32
    out = np.empty((len(plan.frames), first.shape[1], first.shape[2]), dtype=dtype)
    for k, f in enumerate(plan.frames):
        out[k] = per_file[str(f.path)][f.frame]
    return out


def _untilt(hu: np.ndarray, shifts: np.ndarray, shape_ji: tuple[int, int]) -> np.ndarray:
    """Each slice ``hu[k]`` (``[j, i]``, HU) shifted in-plane by ``shifts[k]`` (along i, along j; pixels) onto the
    orthogonal grid of ``shape_ji`` rows and columns (linear interpolation). Grid voxels no image covers are
    :data:`~pipeline.ingest.padding.PADDING_HU` (air, as padding pixels are); those half covered at an image's edge
    blend its border pixels with it."""
    from scipy import ndimage  # lazy on purpose: slow to import, needed only for tilted-gantry series

    out = np.empty((hu.shape[0], *shape_ji), dtype=np.float32)
    for k in range(hu.shape[0]):
        di, dj = shifts[k]
        # grid voxel (j, i) samples image point (j - dj, i - di)
        ndimage.affine_transform(
            hu[k].astype(np.float32, copy=False),
            np.ones(2),
            offset=(-float(dj), -float(di)),
            output_shape=shape_ji,
            output=out[k],
            order=1,
            mode="grid-constant",
            cval=float(PADDING_HU),
        )
    return out


def _slice_padding(plan: VolumePlan) -> list[tuple[int, int] | None]:
    """The padding range of stored values of each slice (volume order): its file's, for each frame of a multi-frame file."""
    if plan.frames is None:
        return [h.padding for h in plan.headers]
    by_file = {str(h.path): h.padding for h in plan.headers}
    return [by_file.get(str(f.path)) for f in plan.frames]


def _padding_text(padding: Sequence[tuple[int, int] | None]) -> str:
    """The padding stored values of a series in words, e.g. 'PixelPaddingValue 63536'."""
    ranges = sorted({p for p in padding if p is not None})
    return ", ".join(f"PixelPaddingValue {lo}" if lo == hi else f"PixelPaddingValue..RangeLimit {lo}..{hi}" for lo, hi in ranges)


def read_volume(plan: VolumePlan, *, workers: int | None = None) -> CTVolume:
    """Read the pixels of a validated plan and return the HU volume (LPS geometry).

    Padding pixels (PixelPaddingValue (0028,0120), up to PixelPaddingRangeLimit (0028,0121)) become
    :data:`~pipeline.ingest.padding.PADDING_HU` (-1024 HU); their count is ``metadata["PaddingPixels"]`` when the
    series declares padding.
    """
    stored = _read_multiframe(plan) if plan.frames is not None else read_stored(plan.headers, workers=workers)
    padding = _slice_padding(plan)
    mins, maxs, counts = padded_range(stored, padding, workers=workers)
    ranges = (mins, maxs)
    n_padding: int | None = None
    if any(p is not None for p in padding):
        n_padding = int(counts.sum())
        log.info(
            "%s: %d of %d pixels are padding (%s): set to %d HU (air)",
            plan.where,
            n_padding,
            stored.size,
            _padding_text(padding),
            PADDING_HU,
        )
        padding = [p if c else None for p, c in zip(padding, counts)]  # slices without padding pixels: nothing to set
    slopes, intercepts = np.asarray(plan.slopes, np.float64), np.asarray(plan.intercepts, np.float64)
    names = [f.name for f in plan.frames] if plan.frames is not None else [str(h.path) for h in plan.headers]
    check_hu_range(*hu_range(ranges, slopes, intercepts), names, slopes, intercepts, where=plan.where)
    hu = to_hu(stored, slopes, intercepts, workers=workers, ranges=ranges, padding=padding if n_padding else None)
    if plan.stack.shifts is not None:
        hu = _untilt(hu, plan.stack.shifts, plan.stack.geometry.shape[1:])
    md = dict(plan.metadata)
    if n_padding is not None:
        md["PaddingPixels"] = n_padding
    md["HUDtype"] = str(hu.dtype)
    vol = CTVolume(hu, plan.stack.geometry, metadata=md)
    for w in md.get("warnings", ()):
        log.warning("%s: %s", plan.where, w)
    log.info("%s -> %r", plan.where, vol)
    return vol


def build_volume(
    series: SeriesInfo,
    *,
    spacing_tolerance: float = 0.02,
    allow_gantry_tilt: bool = False,
    check_modality: bool = True,
    keep_identifiers: bool = False,
    workers: int | None = None,
) -> CTVolume:
    """:func:`plan_volume` then :func:`read_volume`."""
    plan = plan_volume(
        series,
        spacing_tolerance=spacing_tolerance,
        allow_gantry_tilt=allow_gantry_tilt,
        check_modality=check_modality,
        keep_identifiers=keep_identifiers,
    )
    return read_volume(plan, workers=workers)
