"""Per-case quality flags on phantoms whose truth is known: coverage, contrast, thickness, FOV, metal."""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy import ndimage

from pipeline.phantom import generate_phantom
from pipeline.reconstruction.quality import (
    EMPHYSEMA_FIGURES,
    FLAGS,
    FOV_CUT_AREA_CM2,
    LUNG_CUT_AREA_MM2,
    QualityReport,
    assess_quality,
    fov_cut_area_cm2,
    mark_unreliable,
)


@pytest.fixture(scope="module")
def phantom():
    return generate_phantom(5, matrix=160, pixel_spacing=2.0, slice_spacing=2.5, n_nodules=0)


def _assess(phantom, *, hu=None, masks=None, **kw):
    return assess_quality(phantom.volume.array if hu is None else hu, phantom.volume.geometry, masks or phantom.masks, **kw)


def test_complete_chest_has_no_warning(phantom):
    q = _assess(phantom, metadata=dict(phantom.volume.metadata))
    assert q.lung_coverage == "complete"
    assert q.contrast_phase == "non_contrast"
    assert q.warnings == ()
    # its 2.5 mm slices are beyond the lung-density protocols' 1.5 mm: only the emphysema index is marked, by an info
    assert q.codes == ("emphysema_slices",) and set(q.unreliable) == set(EMPHYSEMA_FIGURES)
    assert _assess(phantom, metadata={**phantom.volume.metadata, "SliceThickness": 1.0}).unreliable == ()
    assert 1500 < q.figures["lungs_total_volume_ml"] < 9000


def _keep_slices(phantom, lo_frac: float, hi_frac: float):
    """The phantom restricted to a z range given as fractions (0 = most inferior, 1 = most superior)."""
    g = phantom.volume.geometry
    z = np.broadcast_to(g.lps_coordinate(2), g.shape)
    zmin, zmax = z.min(), z.max()
    keep = (z >= zmin + lo_frac * (zmax - zmin)) & (z <= zmin + hi_frac * (zmax - zmin))
    k = np.nonzero(keep.any(axis=(1, 2)))[0]
    sub = phantom.volume.crop((0, 0, k[0]), (g.shape[2], g.shape[1], k[-1] + 1))
    masks = {name: m[k[0] : k[-1] + 1] for name, m in phantom.masks.items()}
    return sub, masks


@pytest.mark.parametrize(
    ("lo", "hi", "codes", "coverage"),
    [
        (0.0, 0.55, {"lungs_apex_cut"}, "partial"),
        (0.45, 1.0, {"lungs_base_cut"}, "partial"),
        (0.35, 0.65, {"lungs_apex_cut", "lungs_base_cut"}, "partial"),
    ],
)
def test_partial_coverage_is_flagged_and_lung_figures_marked(phantom, lo, hi, codes, coverage):
    assert phantom.volume.geometry.array_axis(2) == 0
    sub, masks = _keep_slices(phantom, lo, hi)
    q = assess_quality(sub.array, sub.geometry, masks)
    assert q.lung_coverage == coverage
    assert codes <= set(q.codes)
    assert {"lungs_apex_cut", "lungs_base_cut"} - codes & set(q.codes) == set()
    assert "emphysema_index_pct" in q.unreliable and "lungs_total_volume_ml" in q.unreliable
    assert "lung_volume_out_of_range" not in q.codes  # meaningless for partial lungs
    # the message names the end by anatomy (a scanner's first slice may be either end) and the lung area there
    messages = {f.code: f.message for f in q.flags}
    ends = {"lungs_apex_cut": "on the most superior slice", "lungs_base_cut": "on the most inferior slice"}
    for code in codes:
        assert re.search(r"\(\d+\.\d cm² of lung " + ends[code] + r"\)$", messages[code]), messages[code]


def test_a_scan_ending_a_few_cm2_into_the_lung_bases_keeps_its_lung_figures(phantom):
    """Flagged, as the lungs reach the last slice; but a few cm² there leave at most a few mL beyond the scan, far
    under 2 % of the lungs: the volumes and the emphysema index stay reported."""
    g = phantom.volume.geometry
    assert g.array_axis(2) == 0 and g.direction[2][2] > 0  # k = 0 is the most inferior slice
    lungs = phantom.masks["lung_left"] | phantom.masks["lung_right"]
    first = int(np.argmax(lungs.any(axis=(1, 2))))  # the lowest slice with lung
    masks = {name: m[first:].copy() for name, m in phantom.masks.items()}
    # the phantom's lung bases are flat: leave a posterior recess of 60 pixels (2.4 cm²) on the scan's last slice
    for name in ("lung_left", "lung_right"):
        pixels = np.argwhere(masks[name][0])
        masks[name][0] = False
        if name == "lung_right":
            keep = pixels[np.argsort(-pixels[:, 0])[:60]]  # the most posterior rows
            masks[name][0][tuple(keep.T)] = True
    area_mm2 = float((masks["lung_left"][0] | masks["lung_right"][0]).sum()) * g.spacing[0] * g.spacing[1]
    assert LUNG_CUT_AREA_MM2 <= area_mm2 <= 300.0
    sub = phantom.volume.crop((0, 0, first), (g.shape[2], g.shape[1], g.shape[0]))
    q = assess_quality(sub.array, sub.geometry, masks, metadata={"SliceThickness": 1.0})  # thin: only the cut counts
    assert q.has("lungs_base_cut") and q.lung_coverage == "partial"
    assert q.unreliable == ()
    assert 0 < q.figures["lungs_missing_ml_bound"] < 0.02 * q.figures["lungs_total_volume_ml"]


def test_no_lungs_is_absent(phantom):
    empty = np.zeros(phantom.volume.shape, dtype=bool)
    q = _assess(phantom, masks={**phantom.masks, "lung_left": empty, "lung_right": empty})
    assert q.lungs_absent and q.has("lungs_absent")


def test_imbalance_and_volume_range(phantom):
    left = phantom.masks["lung_left"].copy()
    left[: left.shape[0] * 2 // 3] = False
    q = _assess(phantom, masks={**phantom.masks, "lung_left": left})
    assert q.has("lung_imbalance")
    small = phantom.masks["lung_right"].copy()
    small[::2] = False
    small[:, ::2] = False
    q = _assess(phantom, masks={**phantom.masks, "lung_left": small, "lung_right": small})
    assert q.has("lung_volume_out_of_range") and not q.has("lung_imbalance")


def test_thick_slices_from_metadata_or_spacing(phantom):
    assert _assess(phantom, metadata={"SliceThickness": "5.0"}).has("thick_slices")
    assert not _assess(phantom, metadata={"SliceThickness": 1.0}).has("thick_slices")
    assert _assess(phantom, metadata={}).figures["slice_thickness_mm"] == pytest.approx(2.5)


def test_emphysema_index_on_thick_slices_is_marked_unreliable_and_lung_volumes_are_not(phantom):
    thick = _assess(phantom, metadata={"SliceThickness": "4.0"})
    assert set(EMPHYSEMA_FIGURES) <= set(thick.unreliable)
    assert "lungs_total_volume_ml" not in thick.unreliable
    marked = mark_unreliable({"emphysema_index_pct": 19.6, "lungs_total_volume_ml": 5200.0}, thick)
    assert marked["emphysema_index_pct"] == {"value": 19.6, "reliable": False, "reason": "thick_slices"}
    assert marked["lungs_total_volume_ml"] == 5200.0
    assert not set(EMPHYSEMA_FIGURES) & set(_assess(phantom, metadata={"SliceThickness": "1.0"}).unreliable)


def test_lossy_compression_from_metadata_flags_the_case_and_its_emphysema_index(phantom):
    md = {"LossyImageCompression": "01", "LossyImageCompressionRatio": [12.0], "LossyImageCompressionMethod": ["ISO_15444_1"]}
    md["SliceThickness"] = 1.0  # thin: the compression alone marks the index
    q = _assess(phantom, metadata={**phantom.volume.metadata, **md})
    (flag,) = [f for f in q.flags if f.code == "lossy_compressed"]
    assert flag.severity == "warning"
    assert flag.message == "lossy compressed: HU values and small nodules unreliable (ratio 12:1 by ISO_15444_1)"
    assert set(EMPHYSEMA_FIGURES) <= set(q.unreliable) and "lungs_total_volume_ml" not in q.unreliable
    marked = mark_unreliable({"emphysema_index_pct": 3.1}, q)
    assert marked["emphysema_index_pct"] == {"value": 3.1, "reliable": False, "reason": "lossy_compressed"}
    plain = _assess(phantom, metadata={**phantom.volume.metadata, "LossyImageCompression": "00", "SliceThickness": 1.0})
    assert not plain.has("lossy_compressed") and not plain.unreliable


def test_scattered_bright_pieces_are_not_a_blood_pool(phantom):
    """Pieces of 150-600 HU tissue of a few mL each (bone the bone mask missed, calcifications), 30 mL in all: no
    contrast; one pool of the same volume is."""
    hu = phantom.volume.array.astype(np.float32)
    g = phantom.volume.geometry
    soft = phantom.masks["body"] & ~phantom.masks["bone"] & ~(phantom.masks["lung_left"] | phantom.masks["lung_right"])
    soft = ndimage.binary_erosion(soft, iterations=4)
    side = max(3, int(round(np.cbrt(5000.0 / np.prod(g.spacing)))))  # cubes of about 5 mL
    pieces = np.zeros_like(soft)
    placed = 0
    for k, j, i in np.argwhere(soft)[:: max(1, int(soft.sum()) // 4000)]:
        cube = (slice(k, k + side), slice(j, j + side), slice(i, i + side))
        grown = (slice(max(0, k - 3), k + side + 3), slice(max(0, j - 3), j + side + 3), slice(max(0, i - 3), i + side + 3))
        if soft[cube].all() and not pieces[grown].any():
            pieces[cube] = True
            placed += 1
        if placed == 6:
            break
    assert placed == 6, "the phantom has no room for six separate pieces"
    spotted = hu.copy()
    spotted[pieces] = 300.0
    q = _assess(phantom, hu=spotted)
    assert q.contrast_phase == "non_contrast", q.flags
    assert q.figures["enhanced_blood_ml"] == 0.0


@pytest.mark.parametrize(("blood_hu", "phase"), [(330.0, "arterial"), (180.0, "venous"), (40.0, "non_contrast")])
def test_contrast_phase(phantom, blood_hu, phase):
    hu = phantom.volume.array.astype(np.float32)
    # a 30 mm "aorta" in the mediastinum, just anterior to the spine
    g = phantom.volume.geometry
    x, y = np.broadcast_to(g.lps_coordinate(0), g.shape), np.broadcast_to(g.lps_coordinate(1), g.shape)
    body = phantom.masks["body"]
    cy = float(np.broadcast_to(g.lps_coordinate(1), g.shape)[body].mean())
    aorta = ((x - 0.0) ** 2 + (y - cy) ** 2 < 15.0**2) & body & ~phantom.masks["bone"]
    aorta &= ~(phantom.masks["lung_left"] | phantom.masks["lung_right"])
    hu[aorta] = blood_hu
    q = _assess(phantom, hu=hu)
    assert q.contrast_phase == phase
    assert q.has(f"contrast_{phase}") == (phase != "non_contrast")
    assert all(f.severity == "info" for f in q.flags if f.code.startswith("contrast_"))


def test_fov_cut_and_metal(phantom):
    g = phantom.volume.geometry
    n = g.shape[2]
    crop = phantom.volume.crop((n // 5, n // 5, 0), (n - n // 5, n - n // 5, g.shape[0]))
    body = phantom.masks["body"][:, n // 5 : n - n // 5, n // 5 : n - n // 5]
    assert assess_quality(crop.array, crop.geometry, {"body": body}).has("fov_cuts_body")
    hu = phantom.volume.array.astype(np.float32)
    k, j, i = np.argwhere(phantom.masks["body"])[len(np.argwhere(phantom.masks["body"])) // 2]
    hu[k - 1 : k + 2, j - 2 : j + 3, i - 2 : i + 3] = 3000.0
    q = _assess(phantom, hu=hu)
    assert q.has("metal_streaks") and not _assess(phantom).has("metal_streaks")


@pytest.mark.parametrize(("slices", "pixels", "flagged"), [(3, 5, False), (1, 20, False), (12, 10, True), (3, 40, True)])
def test_fov_cut_is_the_area_of_skin_on_the_image_edge(phantom, slices, pixels, flagged):
    """An arm grazing the edge (3 slices × 10 mm × 2.5 mm = 0.75 cm²) is no cut; 6 cm² or 3 cm² is, whatever the
    number of slices (1.5 cm²: the gap between grazes and cuts on the phantoms)."""
    g = phantom.volume.geometry
    body = phantom.masks["body"].copy()
    assert not (body[:, :, 0].any() or body[:, :, -1].any() or body[:, 0, :].any() or body[:, -1, :].any())
    k0, j0 = g.shape[0] // 2, g.shape[1] // 2
    body[k0 : k0 + slices, j0 : j0 + pixels, :1] = True  # skin on the edge: pixels × 2 mm long, in `slices` slices
    area = fov_cut_area_cm2(body, g)
    assert area == pytest.approx(slices * pixels * 2.0 * 2.5 / 100.0)
    q = _assess(phantom, masks={**phantom.masks, "body": body})
    assert q.has("fov_cuts_body") == flagged == (area >= FOV_CUT_AREA_CM2)
    assert q.figures["fov_cut_area_cm2"] == pytest.approx(area)


def test_vocabulary_and_json_round_trip(phantom):
    q = _assess(phantom, metadata={"SliceThickness": 5}, airway_in_scan=False)
    assert set(q.codes) <= set(FLAGS)
    assert q.has("airway_not_in_scan")
    again = QualityReport.from_json(q.to_json())
    assert again.codes == q.codes and again.lung_coverage == q.lung_coverage


@pytest.mark.parametrize(("pixel_mm", "flagged"), [(2.0, False), (2.5, False), (3.0, True)])
def test_coarse_pixels_flag_the_case_and_its_emphysema_index(phantom, pixel_mm, flagged):
    """Pixels over 2.5 mm (a downsampled or thumbnail series): small nodules and the emphysema index unreliable."""
    from pipeline.geometry import Geometry

    g = phantom.volume.geometry
    coarse = Geometry(shape=g.shape, spacing=(pixel_mm, pixel_mm, g.spacing[2]), origin=g.origin, direction=g.direction)
    q = assess_quality(phantom.volume.array, coarse, phantom.masks, metadata={"SliceThickness": "1.0"})
    assert q.has("coarse_pixels") is flagged
    assert bool(set(EMPHYSEMA_FIGURES) & set(q.unreliable)) is flagged
    if flagged:
        (flag,) = [f for f in q.flags if f.code == "coarse_pixels"]
        assert flag.severity == "warning"
        assert flag.message == "coarse pixels: small nodules unreliable (3.00 x 3.00 mm pixels > 2.5 mm)"
        marked = mark_unreliable({"emphysema_index_pct": 3.1}, q)
        assert marked["emphysema_index_pct"] == {"value": 3.1, "reliable": False, "reason": "coarse_pixels"}
