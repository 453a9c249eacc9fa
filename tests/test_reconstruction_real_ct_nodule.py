"""The planning chest's right-upper-lobe mass (../shared/real_ct, skipped without it): its segmented outline covers the
lesion as the scan shows it, and stops there (not along its vessels), whatever the size of the detector's box.

The visible extent is measured here on the scan itself, independently of the segmentation: along the x, y and z axes
through the mask's centroid, where the HU profile falls below half-way between the lesion and the lung around it.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from pipeline.reconstruction.nodule_geometry import nodule_mask
from pipeline.reconstruction.nodules import segment_nodule
from pipeline.volume import CTVolume
from tests._support.real_ct import rt_planning_chest

# finding #1 of `ctpipe detect` on the planning chest: its box (LPS mm), 33.6 x 30.1 x 27.7 mm
MASS_CENTRE = (-86.46, 82.39, -9.07)
MASS_BOX = ((-103.26, 67.36, -22.93), (-69.66, 97.42, 4.79))
EDGE_TOLERANCE_MM = 1.5  # about one 0.98 mm pixel and the 2 mm slices' half

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chest() -> CTVolume:
    return rt_planning_chest().volume  # skips with a reason when ../shared/real_ct is absent


def _visible_extent(hu: np.ndarray, vol: CTVolume, centre: np.ndarray, axis: int, half_way: float) -> tuple[float, float]:
    """(low, high) LPS coordinate (mm) along ``axis`` where the profile through ``centre`` falls below ``half_way``."""
    step = np.zeros(3)
    step[axis] = 1.0
    t = np.arange(0.0, 25.0, 0.1)
    ends = []
    for sign in (-1.0, 1.0):
        pts = centre[None, :] + sign * t[:, None] * step[None, :]
        prof = ndimage.map_coordinates(hu, vol.geometry.lps_to_index(pts)[:, ::-1].T, order=1)
        ends.append(centre[axis] + sign * t[int(np.argmax(prof < half_way))])
    return ends[0], ends[1]


@pytest.mark.parametrize("box_share", [1.0, 0.5], ids=["detector-box", "half-box"])
def test_the_planning_chests_mass_is_segmented_to_its_visible_edge(chest, box_share):
    """A 25 x 25 x 22 mm mass: with the detector's box, and with a box half that size (which got no outline at all)."""
    centre = np.asarray(MASS_CENTRE)
    lo, hi = (np.asarray(p) for p in MASS_BOX)
    finding = {
        "center_lps": MASS_CENTRE,
        "box_min_lps": centre - box_share * (centre - lo),
        "box_max_lps": centre + box_share * (hi - centre),
    }
    res = segment_nodule(chest, finding)
    assert res.error is None and res.mask is not None and res.geometry is not None
    nm = nodule_mask(res, chest.geometry)
    assert nm is not None
    full = np.zeros(chest.array.shape, dtype=bool)
    k0, j0, i0 = nm.offset_kji
    full[k0 : k0 + nm.mask.shape[0], j0 : j0 + nm.mask.shape[1], i0 : i0 + nm.mask.shape[2]] = nm.mask
    hu = np.asarray(chest.array, dtype=np.float32)
    # lesion and lung levels from the scan: the mask's eroded core, and the lung voxels in a shell around it
    core = ndimage.binary_erosion(full, iterations=3)
    shell = ndimage.binary_dilation(full, iterations=8) & ~ndimage.binary_dilation(full, iterations=3) & (hu < -600)
    half_way = 0.5 * (float(np.median(hu[core])) + float(np.median(hu[shell])))
    c = np.asarray(res.centroid_lps)
    mask_f = full.astype(np.float32)
    for axis, name in enumerate("xyz"):
        low, high = _visible_extent(hu, chest, c, axis, half_way)
        m_low, m_high = _visible_extent(mask_f, chest, c, axis, 0.5)
        assert m_low <= low + EDGE_TOLERANCE_MM and m_high >= high - EDGE_TOLERANCE_MM, (
            f"{name}: segmented {m_low:.1f}..{m_high:.1f} mm does not cover the visible {low:.1f}..{high:.1f} mm"
        )
        assert m_low >= low - EDGE_TOLERANCE_MM and m_high <= high + EDGE_TOLERANCE_MM, (
            f"{name}: segmented {m_low:.1f}..{m_high:.1f} mm runs past the visible {low:.1f}..{high:.1f} mm"
        )
    assert 23.0 <= res.diameter_mm <= 26.0


def test_the_planning_chests_mass_has_its_axes_on_the_slice_where_it_is_largest(chest):
    """Long and short axis of the 25 mm mass as a reader measures them, each as long as the scan shows the mass
    along that line (where the HU falls below half-way between lesion and lung), on the slice through its middle,
    in the right lung (LPS: x < 0)."""
    from pipeline.reconstruction.nodule_geometry import axes_json

    res = segment_nodule(chest, {"center_lps": MASS_CENTRE, "box_min_lps": MASS_BOX[0], "box_max_lps": MASS_BOX[1]})
    out = axes_json(res, chest.geometry, chest.metadata)
    assert 23.0 <= out["short_axis_mm"] <= out["long_axis_mm"] <= 28.0
    assert out["mean_diameter_mm"] == pytest.approx((out["long_axis_mm"] + out["short_axis_mm"]) / 2, abs=1e-3)
    k = out["axes_slice_k"]
    assert abs(chest.geometry.index_to_lps([0, 0, k])[2] - res.centroid_lps[2]) <= 2.0  # 2 mm slices
    assert out["axes_instance_number"] == chest.metadata["InstanceNumbers"][k]
    nm = nodule_mask(res, chest.geometry)
    assert nm is not None
    full = np.zeros(chest.array.shape, dtype=bool)
    k0, j0, i0 = nm.offset_kji
    full[k0 : k0 + nm.mask.shape[0], j0 : j0 + nm.mask.shape[1], i0 : i0 + nm.mask.shape[2]] = nm.mask
    hu = np.asarray(chest.array, dtype=np.float32)
    core = ndimage.binary_erosion(full, iterations=3)
    shell = ndimage.binary_dilation(full, iterations=8) & ~ndimage.binary_dilation(full, iterations=3) & (hu < -600)
    half_way = 0.5 * (float(np.median(hu[core])) + float(np.median(hu[shell])))
    for name in ("long_axis", "short_axis"):
        p, q = (np.asarray(e) for e in out[f"{name}_lps_mm"])
        assert np.all(np.array([p[0], q[0]]) < 0)  # the patient's right
        mid, u = (p + q) / 2, (q - p) / np.linalg.norm(q - p)
        t = np.arange(0.0, 25.0, 0.05)
        seen = 0.0
        for sign in (-1.0, 1.0):
            prof = ndimage.map_coordinates(hu, chest.geometry.lps_to_index(mid + sign * t[:, None] * u)[:, ::-1].T, order=1)
            seen += float(t[int(np.argmax(prof < half_way))])
        assert abs(out[f"{name}_mm"] - seen) <= 2 * EDGE_TOLERANCE_MM, (name, out[f"{name}_mm"], seen)
