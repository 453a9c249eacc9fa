"""The planes the MPRs and MIPs show (:mod:`.render`): a volume in LPS order (``[z, y, x]``, each axis ascending), its
axial, coronal and sagittal planes in display orientation, the window of a close-up, the source slices an axial
plane is, and the resampling of an oblique grid onto patient axes, so that every plane drawn is a true patient plane.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from ..ingest.measured import DISPLAY_RESAMPLED_KEY, measured_mask
from ..intensity import AIR_HU
from ..volume import CTVolume, Geometry

log = logging.getLogger(__name__)


def lps_aligned(array: np.ndarray, geometry: Geometry) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """View of ``array [k, j, i]`` as ``[z, y, x]`` with LPS coordinates ascending along each axis.

    Returns ``(view, spacing_xyz, origin_xyz)`` (mm). Oblique grids use the nearest axis-aligned order
    (display only).
    """
    return geometry.to_lps_view(array), np.asarray(geometry.spacing_lps()), geometry.bounds_lps()[0]


def source_slices(volume: CTVolume, za: int, zb: int) -> str:
    """The source slices of the axial view planes ``za``..``zb`` (indices of :func:`lps_aligned`'s z) as a viewer
    numbers them (``InstanceNumber 78``, ``InstanceNumber 105-109``; see
    :func:`pipeline.detection.findings.slice_ref`), or "" for a series whose slices are not axial or a volume resampled onto patient axes
    (:func:`to_patient_axes`)."""
    from ..detection.findings import slice_label, slice_number_of, slice_number_source

    k_of_z = volume.geometry.view_plane_slices()
    if k_of_z is None or RESAMPLED_FROM_DEG in volume.metadata:  # no axial plane is one source slice
        return ""
    nk = volume.shape[0]
    numbers = sorted({slice_number_of(int(k), volume.metadata, nk) for k in k_of_z[min(za, zb) : max(za, zb) + 1]})
    label = slice_label(slice_number_source(volume.metadata, nk))
    return f"{label} {numbers[0]}" if len(numbers) == 1 else f"{label} {numbers[0]}-{numbers[-1]}"


#: The display planes of :func:`lps_aligned`'s view: the LPS axis each holds fixed, the axes of its image's rows and
#: columns, whether its rows run upwards (superior at the top) and its orientation letters (left, right, top, bottom).
PLANES = {
    # name: (fixed LPS axis, image rows axis, image cols axis, flip rows, letters L, R, T, B)
    "axial": (2, 1, 0, False, ("R", "L", "A", "P")),
    "coronal": (1, 2, 0, True, ("R", "L", "S", "I")),
    "sagittal": (0, 2, 1, True, ("A", "P", "S", "I")),
}


def plane_image(view: np.ndarray, plane: str, index: int) -> np.ndarray:
    """The ``plane`` (a name of :data:`PLANES`) at ``index`` along its fixed axis of :func:`lps_aligned`'s ``view``
    ``[z, y, x]``, in display orientation: rows and columns as :data:`PLANES` gives them, superior at the top."""
    fixed, rows, _cols, flip, _ = PLANES[plane]
    sl: list[slice | int] = [slice(None)] * 3
    sl[2 - fixed] = index
    img = view[tuple(sl)]  # remaining dims in [z, y, x] order minus the fixed one
    if 2 - rows > 2 - _cols:  # rows must come first
        img = img.T
    return img[::-1] if flip else img


def field_window(
    shape: tuple[int, ...], center_idx: np.ndarray, plane: str, spacing: np.ndarray, field_mm: float | None
) -> tuple[slice, slice]:
    """Rows and columns of a :func:`plane_image` image (``shape``) within ``field_mm`` around ``center_idx`` (x, y, z indices
    of :func:`lps_aligned`'s view), kept inside the image; the whole image without ``field_mm``."""
    if field_mm is None:
        return slice(None), slice(None)
    _fixed, rows, cols, flip, _ = PLANES[plane]
    row = shape[0] - 1 - int(center_idx[rows]) if flip else int(center_idx[rows])
    out = []
    for centre, n, axis in ((row, shape[0], rows), (int(center_idx[cols]), shape[1], cols)):
        half = int(np.ceil(field_mm / 2 / spacing[axis]))
        a = int(np.clip(centre - half, 0, max(n - 2 * half - 1, 0)))
        out.append(slice(a, min(n, a + 2 * half + 1)))
    return out[0], out[1]


#: Grids whose axes lean more than this many degrees off the patient's axes (a gantry-tilt corrected series, an
#: oblique acquisition) are resampled onto patient axes before their MPRs and MIPs are drawn (:func:`to_patient_axes`).
OBLIQUE_DEG = 1.0
#: The metadata key of a volume resampled onto patient axes for display: how many degrees its source grid leaned
#: (:func:`~pipeline.ingest.measured.measured_mask` knows such a volume's grid is not its source's).
RESAMPLED_FROM_DEG = DISPLAY_RESAMPLED_KEY


def oblique_deg(geometry: Geometry) -> float:
    """How far (degrees) the grid's axes lean off the patient's axes (LPS): the largest angle between an index axis
    and the LPS axis nearest to it; 0 for an axis-aligned grid, in any storage order."""
    cosines = np.abs(np.asarray(geometry.direction)).max(axis=0)
    return float(np.degrees(np.arccos(np.clip(cosines, -1.0, 1.0))).max())


def patient_axes_grid(geometry: Geometry) -> Geometry:
    """The axis-aligned grid (identity direction: i along L, j along P, k along S) of the box (LPS mm) enclosing every
    voxel centre of ``geometry``, with its spacing along LPS x, y, z (:meth:`~pipeline.geometry.Geometry.spacing_lps`)."""
    lo, hi = geometry.bounds_lps()
    spacing = np.asarray(geometry.spacing_lps())
    size = np.floor((hi - lo) / spacing + 1e-6).astype(int) + 1
    return Geometry(shape=(int(size[2]), int(size[1]), int(size[0])), spacing=tuple(spacing), origin=tuple(lo))


def _resampled(array: np.ndarray, src: Geometry, dst: Geometry, *, linear: bool, outside: float) -> np.ndarray:
    """``array [k, j, i]`` on ``src`` sampled at the voxels of ``dst`` (SimpleITK; trilinear or nearest neighbour),
    ``outside`` where ``dst`` reaches past ``src``."""
    import SimpleITK as sitk

    source = np.asarray(array)
    boolean = source.dtype == np.bool_
    image = sitk.GetImageFromArray(np.ascontiguousarray(source.astype(np.uint8) if boolean else source))
    image.SetSpacing(src.spacing)
    image.SetOrigin(src.origin)
    image.SetDirection(tuple(float(v) for v in np.asarray(src.direction).reshape(-1)))
    f = sitk.ResampleImageFilter()
    f.SetSize([int(n) for n in dst.size_ijk])
    f.SetOutputSpacing(dst.spacing)
    f.SetOutputOrigin(dst.origin)
    f.SetOutputDirection(tuple(float(v) for v in np.asarray(dst.direction).reshape(-1)))
    f.SetInterpolator(sitk.sitkLinear if linear else sitk.sitkNearestNeighbor)
    f.SetDefaultPixelValue(outside)
    out = sitk.GetArrayFromImage(f.Execute(image))
    return out.astype(bool) if boolean else out


#: The key of the mask of voxels outside the scan that :func:`to_patient_axes` adds to the masks of a volume with
#: unmeasured voxels (the wedge of a tilt-corrected grid, :mod:`pipeline.ingest.measured`): the MPRs paint it
#: :data:`OUTSIDE_SCAN_RGB`, not as air. Not an organ: never outlined, never in a SEG.
OUTSIDE_SCAN = "outside_scan"
#: The colour (RGB, 0..1) of the MPRs' voxels outside the scan: a flat blue-grey no window gives CT values.
OUTSIDE_SCAN_RGB = (0.32, 0.36, 0.48)
#: Its legend entry.
OUTSIDE_SCAN_LEGEND = "not scanned (tilt-corrected grid)"


def to_patient_axes(
    volume: CTVolume,
    masks: Mapping[str, np.ndarray],
    nodules: np.ndarray | None,
    *,
    axial_planes: tuple[int, int] | None = None,
) -> tuple[CTVolume, dict[str, np.ndarray], np.ndarray | None]:
    """The volume, its masks and nodule labels (``[k, j, i]`` on its grid) on patient axes, for display: as they are
    when the grid leans at most :data:`OBLIQUE_DEG` off the LPS axes, else resampled onto :func:`patient_axes_grid`
    (HU trilinear, air outside the scan; masks and labels nearest neighbour), the volume's metadata then saying by how
    much its grid leaned (:data:`RESAMPLED_FROM_DEG`), so that each axial, coronal and sagittal plane drawn is a true
    patient plane, where its title and letters say. axial_planes: ``(a, b)``, only the axial planes ``a..b-1`` (z
    indices, inferior to superior) of that grid are resampled (one plane to draw, not the whole volume).

    A volume with voxels no image measured (:func:`~pipeline.ingest.measured.measured_mask`) gets, among the masks,
    :data:`OUTSIDE_SCAN`: those voxels and, once resampled, what lies past its grid."""
    measured = measured_mask(volume.geometry, volume.metadata)
    masks = dict(masks)
    if measured is not None:
        masks[OUTSIDE_SCAN] = ~measured
    angle = oblique_deg(volume.geometry)
    if angle <= OBLIQUE_DEG:
        return volume, masks, nodules
    src, dst = volume.geometry, patient_axes_grid(volume.geometry)
    if axial_planes is not None:
        a, b = axial_planes
        z0 = dst.origin[2] + a * dst.spacing[2]
        dst = dst.with_(shape=(b - a, *dst.shape[1:]), origin=(dst.origin[0], dst.origin[1], z0))
    log.info("the grid leans %.1f deg off the patient's axes: its MPRs and MIPs are resampled onto them", angle)
    hu = _resampled(np.asarray(volume.array, np.float32), src, dst, linear=True, outside=AIR_HU)
    out = CTVolume(hu, dst, metadata={**volume.metadata, RESAMPLED_FROM_DEG: round(angle, 1)})
    on_axes = {organ: _resampled(m, src, dst, linear=False, outside=0) for organ, m in masks.items() if organ != OUTSIDE_SCAN}
    if OUTSIDE_SCAN in masks:  # every display voxel whose trilinear HU takes any share of an unmeasured one
        share = _resampled(masks[OUTSIDE_SCAN].astype(np.float32), src, dst, linear=True, outside=1.0)
        on_axes[OUTSIDE_SCAN] = share > 1e-3
    labels = _resampled(nodules, src, dst, linear=False, outside=0) if nodules is not None else None
    return out, on_axes, labels


def resampled_note(volume: CTVolume) -> str:
    """ ", resampled to patient axes (grid 15.0° oblique)" for a volume :func:`to_patient_axes` resampled (a title's
    note), else ""."""
    angle = volume.metadata.get(RESAMPLED_FROM_DEG)
    return f", resampled to patient axes (grid {angle:.1f}° oblique)" if angle is not None else ""
