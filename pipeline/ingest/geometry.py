"""Slice-stack geometry: sort by position along the slice normal and validate.

All positions are DICOM patient coordinates (LPS, mm). The slice normal is
``cross(row cosine, column cosine)``; slices are sorted by their position
along it (never by InstanceNumber or file name), so the third direction
column is that normal and the origin is the position of the first sorted
slice, exactly as SimpleITK's ``ImageSeriesReader`` does after GDCM's sort.
A tilted-gantry series accepted with ``allow_gantry_tilt`` gets an orthogonal grid
grown to hold every slice's pixels; its origin moves back along the row or column
cosine by the rows or columns added before the first slice's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import (
    DuplicateSliceError,
    GantryTiltError,
    InconsistentSeriesError,
    MissingSliceError,
    NonUniformSpacingError,
    SeriesGeometryError,
    SingleSliceError,
)
from ..volume import Geometry

log = logging.getLogger(__name__)

#: Largest gantry tilt (degrees) treated as no tilt: about 0.07 mm drift over 400 mm.
TILT_TOLERANCE_DEG = 0.01
#: Largest extent (mm) a CT series may cover in-plane (a scanner's bore is at most about 90 cm, its extended field of
#: view about 80 cm) and along the slices (a whole-body scan of a tall patient is about 2 m). Beyond them PixelSpacing
#: or ImagePositionPatient is wrong, and a volume resampled to 1 mm voxels would need tens of gigabytes.
MAX_IN_PLANE_MM = 1000.0
MAX_LENGTH_MM = 2500.0


def check_extent(extent_mm: Sequence[float] | np.ndarray, *, where: str, how: str) -> None:
    """Raise :class:`SeriesGeometryError` when ``extent_mm`` (mm along the columns, rows and slices) exceeds
    :data:`MAX_IN_PLANE_MM` in-plane or :data:`MAX_LENGTH_MM` along the slices; ``how`` says where the figures come
    from (e.g. the matrix and PixelSpacing)."""
    e = [float(v) for v in extent_mm]
    if max(e[0], e[1]) <= MAX_IN_PLANE_MM and e[2] <= MAX_LENGTH_MM:
        return
    raise SeriesGeometryError(
        f"the series covers {e[0]:.0f} × {e[1]:.0f} mm in-plane and {e[2]:.0f} mm along the slices ({how}): more "
        f"than any CT scanner's field of view ({MAX_IN_PLANE_MM:.0f} mm in-plane, {MAX_LENGTH_MM:.0f} mm along the "
        "table), so its PixelSpacing (0028,0030) or ImagePositionPatient (0020,0032) values are wrong",
        where=where,
        fix="re-export the series from the scanner/PACS (the header was damaged or edited wrongly)",
    )


@dataclass(frozen=True)
class StackGeometry:
    """Result of :func:`stack_geometry`.

    ``order[k]`` is the input index of output slice k; ``geometry`` is the LPS grid;
    ``shifts`` (None unless a gantry tilt was accepted) holds, per output slice, the
    in-plane shift (along i, along j; pixels, >= 0 but for a sub-pixel drift, see :data:`SUBPIXEL_DRIFT`) that
    puts its image on the orthogonal grid:
    image pixel ``(i, j)`` of slice k is grid voxel ``(i + shifts[k, 0], j + shifts[k, 1], k)``;
    ``grown`` is how many columns and rows (along i, along j) the grid has more than the images,
    so that it covers every pixel of every image; ``tilt_deg`` is the measured tilt.
    """

    order: np.ndarray
    geometry: Geometry
    shifts: np.ndarray | None
    tilt_deg: float
    grown: tuple[int, int] = (0, 0)


def _list(items: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def stack_geometry(
    names: Sequence[str],
    positions: np.ndarray,
    orientation: Sequence[float],
    pixel_spacing: Sequence[float],
    rows: int,
    columns: int,
    *,
    where: str,
    spacing_tolerance: float = 0.02,
    allow_gantry_tilt: bool = False,
    gantry_tilt_attr: str | None = None,
) -> StackGeometry:
    """Sort slices along the normal and check they form a regular volume.

    Parameters
    ----------
    names: one label per slice (file name, or file and frame) used in messages.
    positions: ``(n, 3)`` ImagePositionPatient of each slice (LPS, mm).
    orientation: ImageOrientationPatient (row cosine, column cosine; LPS).
    pixel_spacing: DICOM PixelSpacing ``(row spacing, column spacing)`` in mm.
    spacing_tolerance: allowed deviation of each slice step from the median
        step, as a fraction of it (0.02 = 2 %).
    allow_gantry_tilt: accept positions that drift in-plane (tilted gantry) and
        return per-slice shifts that resample the stack onto an orthogonal grid, grown
        along the drift so that it holds every pixel of every image (LPS positions kept).

    Raises SingleSliceError, InconsistentSeriesError, DuplicateSliceError,
    GantryTiltError, MissingSliceError, NonUniformSpacingError, or SeriesGeometryError for a series larger than
    any scanner's field of view (:func:`check_extent`).
    """
    n = len(names)
    if n < 2:
        raise SingleSliceError(
            f"the series has {n} image(s); a volume needs at least 2 slices",
            where=where,
            fix="pick a multi-slice series (this is likely a scout or key image); see `ctpipe ingest` for the series list",
        )
    row = np.asarray(orientation[:3], dtype=np.float64)
    col = np.asarray(orientation[3:], dtype=np.float64)
    if np.linalg.norm(row) < 1e-6 or np.linalg.norm(col) < 1e-6:
        raise InconsistentSeriesError(
            f"ImageOrientationPatient {list(orientation)} has a zero vector",
            where=where,
            fix="the files' orientation tag is corrupt; re-export the series from the scanner/PACS",
        )
    row /= np.linalg.norm(row)
    col /= np.linalg.norm(col)
    if abs(float(row @ col)) > 1e-4:
        raise InconsistentSeriesError(
            f"ImageOrientationPatient row and column cosines are not perpendicular (dot product {float(row @ col):.4f})",
            where=where,
            fix="the orientation tag is corrupt; re-export the series from the scanner/PACS",
        )
    normal = np.cross(row, col)
    pos = np.asarray(positions, dtype=np.float64).reshape(n, 3)
    dist = pos @ normal
    order = np.argsort(dist, kind="stable")
    d = dist[order]
    steps = np.diff(d)
    nonzero = steps[steps > 1e-3]
    median = float(np.median(nonzero)) if nonzero.size else 0.0
    dup_tol = max(1e-3, spacing_tolerance * median)
    dups = np.nonzero(steps <= dup_tol)[0]
    if dups.size:
        pairs = [f"{names[order[k]]} and {names[order[k + 1]]} at {d[k]:.3f} mm" for k in dups]
        err = DuplicateSliceError(
            f"{dups.size} pair(s) of slices share one position along the slice normal: {_list(pairs)}",
            where=where,
            fix="remove the duplicate files (keep one per position), or, if the series holds repeated acquisitions, "
            "load each acquisition separately",
        )
        err.pairs = tuple((int(order[k]), int(order[k + 1])) for k in dups)
        raise err
    # in-plane drift of the positions: a tilted gantry (or a corrupt series)
    rel = pos[order] - pos[order[0]]
    a = rel @ row
    b = rel @ col
    extent = float(d[-1] - d[0])
    ta, tb = float(a[-1]) / extent, float(b[-1]) / extent
    tilt_deg = math.degrees(math.atan(math.hypot(ta, tb)))
    fit_err = np.hypot(a - ta * (d - d[0]), b - tb * (d - d[0]))
    worst = int(np.argmax(fit_err))
    if fit_err[worst] > max(0.05, 0.1 * min(pixel_spacing)):
        raise InconsistentSeriesError(
            f"slice positions do not lie on a line: {names[order[worst]]} is {fit_err[worst]:.2f} mm off it in-plane",
            where=where,
            fix="the series mixes stacks or has corrupt ImagePositionPatient values; split or re-export it",
        )
    shifts = None
    first = pos[order[0]]
    grown = (0, 0)
    if tilt_deg > TILT_TOLERANCE_DEG:
        drift = math.hypot(float(a[-1]), float(b[-1]))
        if not allow_gantry_tilt:
            attr = f" (GantryDetectorTilt={gantry_tilt_attr})" if gantry_tilt_attr else ""
            raise GantryTiltError(
                f"slice positions drift {drift:.2f} mm in-plane over {extent:.1f} mm along the normal: "
                f"gantry tilt of {tilt_deg:.2f} deg{attr}",
                where=where,
                fix="resample it onto an orthogonal grid: ctpipe ingest --allow-gantry-tilt, ctpipe detect "
                "--allow-gantry-tilt or ctpipe reconstruct --allow-gantry-tilt, ctpipe run --set ingest.allow_gantry_tilt=true, or allow_gantry_tilt=True in Python",
            )
        shifts, before, grown = _tilt_shifts(d - d[0], ta, tb, pixel_spacing)
        # the grid starts `before` pixels (<= 0) along the row and column cosines from the first slice's position
        first = first + before[0] * float(pixel_spacing[1]) * row + before[1] * float(pixel_spacing[0]) * col
        log.info(
            "%s: gantry tilt %.2f deg, resampling onto an orthogonal grid %d column(s) and %d row(s) larger",
            where,
            tilt_deg,
            *grown,
        )
    _check_spacing(names, order, d, steps, median, spacing_tolerance, where)
    check_extent(
        (columns * float(pixel_spacing[1]), rows * float(pixel_spacing[0]), extent),
        where=where,
        how=f"{columns} columns × {float(pixel_spacing[1]):g} mm, {rows} rows × {float(pixel_spacing[0]):g} mm, "
        f"{n} slices over {extent:.1f} mm",
    )
    if shifts is not None:
        check_extent(
            ((int(columns) + grown[0]) * float(pixel_spacing[1]), (int(rows) + grown[1]) * float(pixel_spacing[0]), extent),
            where=where,
            how=f"the orthogonal grid of the gantry tilt of {tilt_deg:.2f} deg: {columns} columns and {rows} rows "
            f"grown by {grown[0]} and {grown[1]} to hold the images shifted in-plane over {extent:.1f} mm",
        )
    geom = Geometry(
        shape=(n, int(rows) + grown[1], int(columns) + grown[0]),
        spacing=(float(pixel_spacing[1]), float(pixel_spacing[0]), median),
        origin=tuple(first),
        direction=np.column_stack([row, col, normal]),
    )
    return StackGeometry(order=order, geometry=geom, shifts=shifts, tilt_deg=tilt_deg, grown=grown)


#: Pixels by which a tilted slice may pass the grid's edge without a column or row more (rounding of positions).
SHIFT_TOLERANCE_PX = 1e-3
#: A tilt whose every slice drifts in-plane by at most this fraction of the smaller pixel spacing (a few hundredths of
#: a degree over a scan) keeps the images' grid: no column or row of air is added for it, and each image lies within
#: this fraction of a pixel of its grid slice, as the DICOM results' source matching accepts for an untilted series.
SUBPIXEL_DRIFT = 0.25


def _tilt_shifts(
    along: np.ndarray, ta: float, tb: float, pixel_spacing: Sequence[float]
) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
    """Per slice, the in-plane shift (along i, along j; pixels) of its image on an orthogonal grid that holds every
    image whole; the grid's first column and row (pixels from the first image's, <= 0); how many columns and rows
    the grid has more than the images.

    ``along``: each slice's distance (mm) along the normal from the first; ``ta``, ``tb``: the in-plane drift of the
    slice positions along the row and column cosines per mm along the normal. Image pixel ``(i, j)`` of slice k lies
    at ``(i + ta*z/sx, j + tb*z/sy)`` in the pixels of the first image's plane (z its distance along the normal).
    The grid grows on the side the images drift to, as dcm2niix's ``_Tilt`` image does; where it grows before the
    first column or row (a negative drift) the grid's origin moves back with it, so LPS positions are kept. A drift
    within :data:`SUBPIXEL_DRIFT` of a pixel keeps the images' grid (shifts then may be slightly negative).
    """
    raw = np.stack([ta * along / float(pixel_spacing[1]), tb * along / float(pixel_spacing[0])], axis=1)
    drift_mm = np.hypot(raw[:, 0] * float(pixel_spacing[1]), raw[:, 1] * float(pixel_spacing[0]))
    if float(drift_mm.max()) <= SUBPIXEL_DRIFT * min(float(v) for v in pixel_spacing):
        return raw, (0, 0), (0, 0)
    lo = np.floor(np.minimum(raw.min(axis=0), 0.0) + SHIFT_TOLERANCE_PX).astype(int)
    hi = np.ceil(np.maximum(raw.max(axis=0), 0.0) - SHIFT_TOLERANCE_PX).astype(int)
    lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
    grown = hi - lo
    return raw - lo, (int(lo[0]), int(lo[1])), (int(grown[0]), int(grown[1]))


def _check_spacing(names, order, d, steps, median, tol, where) -> None:
    bad = np.nonzero(np.abs(steps - median) > tol * median)[0]
    if not bad.size:
        return
    gaps, odd = [], []
    for k in bad:
        q = steps[k] / median
        r = round(q)
        entry = f"{steps[k]:.3f} mm between {names[order[k]]} ({d[k]:.3f} mm) and {names[order[k + 1]]} ({d[k + 1]:.3f} mm)"
        if r >= 2 and abs(q - r) <= tol * r:
            gaps.append((r - 1, entry))
        else:
            odd.append(entry)
    if gaps:
        missing = sum(g for g, _ in gaps)
        raise MissingSliceError(
            f"{missing} slice(s) missing: the slice step is {median:.3f} mm but there are gaps of {_list([e for _, e in gaps])}",
            where=where,
            fix="copy the missing files from the archive/PACS (the transfer was incomplete), "
            "or, only if the gap is intended, raise the spacing tolerance (ctpipe ingest --spacing-tolerance, "
            "ctpipe run --set ingest.spacing_tolerance=..., spacing_tolerance= in Python)",
        )
    raise NonUniformSpacingError(
        f"slice steps differ from the median step {median:.3f} mm by more than {tol:.1%}: {_list(odd)}",
        where=where,
        fix=f"raise spacing_tolerance (now {tol:g}: ctpipe ingest --spacing-tolerance, ctpipe run --set "
        "ingest.spacing_tolerance=..., spacing_tolerance= in Python) if the variation is acceptable, or resample the "
        "series with a tool that handles variable spacing",
    )
