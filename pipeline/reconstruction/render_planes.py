"""The planes the MPRs and MIPs show (:mod:`.render`): a volume in LPS order (``[z, y, x]``, each axis ascending), its
axial, coronal and sagittal planes in display orientation, the window of a close-up, and the source slices an axial
plane is.
"""

from __future__ import annotations

import numpy as np

from ..volume import CTVolume, Geometry


def lps_aligned(array: np.ndarray, geometry: Geometry) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """View of ``array [k, j, i]`` as ``[z, y, x]`` with LPS coordinates ascending along each axis.

    Returns ``(view, spacing_xyz, origin_xyz)`` (mm). Oblique grids use the nearest axis-aligned order
    (display only).
    """
    return geometry.to_lps_view(array), np.asarray(geometry.spacing_lps()), geometry.bounds_lps()[0]


def source_slices(volume: CTVolume, za: int, zb: int) -> str:
    """The source slices of the axial view planes ``za``..``zb`` (indices of :func:`lps_aligned`'s z) as a viewer
    numbers them (``InstanceNumber 78``, ``InstanceNumber 105-109``; see
    :func:`pipeline.detection.findings.slice_ref`), or "" for a series whose slices are not axial."""
    from ..detection.findings import slice_label, slice_number_of, slice_number_source

    k_of_z = volume.geometry.view_plane_slices()
    if k_of_z is None:
        return ""
    nk = volume.shape[0]
    numbers = sorted({slice_number_of(int(k), volume.metadata, nk) for k in k_of_z[min(za, zb) : max(za, zb) + 1]})
    label = slice_label(slice_number_source(volume.metadata, nk))
    return f"{label} {numbers[0]}" if len(numbers) == 1 else f"{label} {numbers[0]}-{numbers[-1]}"


_PLANES = {
    # name: (fixed LPS axis, image rows axis, image cols axis, flip rows, letters L, R, T, B)
    "axial": (2, 1, 0, False, ("R", "L", "A", "P")),
    "coronal": (1, 2, 0, True, ("R", "L", "S", "I")),
    "sagittal": (0, 2, 1, True, ("A", "P", "S", "I")),
}


def _plane(view: np.ndarray, plane: str, index: int) -> np.ndarray:
    fixed, rows, _cols, flip, _ = _PLANES[plane]
    sl: list[slice | int] = [slice(None)] * 3
    sl[2 - fixed] = index
    img = view[tuple(sl)]  # remaining dims in [z, y, x] order minus the fixed one
    if 2 - rows > 2 - _cols:  # rows must come first
        img = img.T
    return img[::-1] if flip else img


def _field_window(
    shape: tuple[int, ...], center_idx: np.ndarray, plane: str, spacing: np.ndarray, field_mm: float | None
) -> tuple[slice, slice]:
    """Rows and columns of a :func:`_plane` image (``shape``) within ``field_mm`` around ``center_idx`` (x, y, z indices
    of :func:`lps_aligned`'s view), kept inside the image; the whole image without ``field_mm``."""
    if field_mm is None:
        return slice(None), slice(None)
    _fixed, rows, cols, flip, _ = _PLANES[plane]
    row = shape[0] - 1 - int(center_idx[rows]) if flip else int(center_idx[rows])
    out = []
    for centre, n, axis in ((row, shape[0], rows), (int(center_idx[cols]), shape[1], cols)):
        half = int(np.ceil(field_mm / 2 / spacing[axis]))
        a = int(np.clip(centre - half, 0, max(n - 2 * half - 1, 0)))
        out.append(slice(a, min(n, a + 2 * half + 1)))
    return out[0], out[1]
