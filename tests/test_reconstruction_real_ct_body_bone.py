"""Body and bone on the shared real CT scans (``../shared/real_ct``; skipped when the folder is absent).

* RT-planning chest on a flat couch (no annotations): the couch is located from the image
  itself, as the wide tissue rows below the patient beyond an air gap; the body must hold
  none of it, and all of the patient's tissue.
* TotalSegmentator abdomen (model labels): every labelled organ lies in the body, the air around it does not; bone against
  the spine, sacrum and rib labels (25-50, 92-115) and against all bone labels (adding hips,
  femurs and sternum, 75-78 and 116).
* COPDGene chest (small field of view, lungs near the image edge): the lungs lie in the body, the air around it
  does not.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.reconstruction.segment import segment_organs
from tests._support.real_ct import (
    TS_ALL_BONE,
    TS_BONE_RECALL,
    TS_NOT_BONE,
    TS_SPINAL_CORD,
    TS_SPINE_RIBS,
    copdgene,
    require_real_ct,
    rt_planning_chest,
    totalseg_abdomen,
    totalseg_labels,
)

pytestmark = pytest.mark.slow


def dice(a: np.ndarray, b: np.ndarray) -> float:
    return 2.0 * float((a & b).sum()) / max(1, int(a.sum()) + int(b.sum()))


def couch_rows(hu: np.ndarray, denser_than_air_hu: float = -900.0) -> tuple[int, int]:
    """(last patient row, first couch row) of a supine axial scan whose rows run posteriorly.

    Per image row, the share of (slice, column) pixels denser than air (the couch's carbon-fibre
    plates are only about -800 HU): from the middle row down, the patient's rows, then an air
    gap (share below 1 %), then the couch (share of at least 30 %).
    """
    share = (hu > denser_than_air_hu).mean(axis=(0, 2))
    mid = hu.shape[1] // 2
    gap = mid + int(np.argmax(share[mid:] < 0.01))
    assert share[gap] < 0.01, "no air gap under the patient"
    wide = np.nonzero(share[gap:] >= 0.3)[0]
    assert wide.size, "no couch under the patient"
    return gap - 1, gap + int(wide[0])


def outside_air(hu: np.ndarray) -> np.ndarray:
    """Air around the patient: per slice, the voxels below -900 HU connected to the image's edge."""
    from scipy import ndimage

    air = hu < -900.0
    out = np.zeros_like(air)
    for k, plane in enumerate(air):
        labels, _ = ndimage.label(plane)
        edge = np.unique(np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]]))
        out[k] = np.isin(labels, edge[edge > 0])
    return out


@pytest.fixture(scope="module")
def rt():
    require_real_ct()
    case = rt_planning_chest()
    seg = segment_organs(case.volume, organs=("body", "bone"), device="cpu")
    return case, seg


def test_rt_chest_body_has_no_voxel_on_the_couch(rt):
    case, seg = rt
    hu = np.asarray(case.volume.array)
    assert np.allclose(case.volume.geometry.direction, np.eye(3))  # rows run posteriorly (supine, LPS +y)
    patient_end, couch = couch_rows(hu)
    body = seg.masks["body"]
    assert not body[:, couch:, :].any(), f"{int(body[:, couch:, :].sum())} body voxels at or below the couch (row {couch})"
    assert not body[:, patient_end + 1 :, :].any()


def test_rt_chest_body_covers_the_patient(rt):
    case, seg = rt
    hu = np.asarray(case.volume.array)
    patient_end, _ = couch_rows(hu)
    body = seg.masks["body"]
    tissue = hu > -500.0
    tissue[:, patient_end + 1 :, :] = False
    # the patient's tissue: everything above the gap but the side rails of the immobilisation board
    from scipy import ndimage

    labels, _ = ndimage.label(tissue)
    centre = labels[hu.shape[0] // 2, hu.shape[1] // 2 - 60, hu.shape[2] // 2]
    assert centre > 0
    patient = labels == centre
    assert (body & patient).sum() >= 0.995 * patient.sum()
    # and the air inside it (lungs, airways), slice by slice
    inside = np.stack([ndimage.binary_fill_holes(sl) for sl in patient]) & ~patient
    assert inside.sum() > 2e6 and body[inside].mean() > 0.99


def test_rt_chest_bone_is_not_the_heart(rt):
    """No contrast here, but the heart and great vessels (40 HU) must stay out; ribs and spine in."""
    case, seg = rt
    hu = np.asarray(case.volume.array)
    bone = seg.masks["bone"]
    vml = float(np.prod(case.volume.geometry.spacing)) / 1000.0
    assert 200.0 < bone.sum() * vml < 2500.0
    assert np.median(hu[bone]) > 200.0
    assert (hu[bone] < 0).mean() < 0.02


@pytest.fixture(scope="module")
def ts():
    case = totalseg_abdomen()
    labels = totalseg_labels(case)
    assert labels is not None
    seg = segment_organs(case.volume, organs=("body", "bone"), device="cpu")
    return case, labels, seg


def test_totalseg_abdomen_body_holds_every_labelled_organ(ts):
    case, labels, seg = ts
    organs = labels > 0
    assert seg.masks["body"][organs].mean() >= 0.995
    # and no more: the air around the patient (a tenth of the scan at least) is outside the body
    air = outside_air(np.asarray(case.volume.array))
    assert air.mean() > 0.1 and seg.masks["body"][air].mean() < 0.01


def test_totalseg_abdomen_bone_against_the_model_labels(ts):
    """Dice against the spine, sacrum and ribs, and against all bone labels; recall per label; bone is mostly labelled bone.

    On these 3 mm voxels the cortex fills a third of each pixel it crosses: the vertebral bodies' cancellous
    interior (100-150 HU) is bone only where the partial-volume cortex is taken for cortex and the marrow
    behind its broken ring is filled (spine/sacrum/ribs Dice 0.22 and all bone 0.52 without, 0.41 and 0.76 with);
    where smooth endplates are not taken for blood, levels without cortex are filled and the outer layer is
    kept where it is half on bone, 0.48 and 0.85 (vertebrae recall 0.67 -> 0.87, ribs 0.35 -> 0.55, sacrum
    0.23 -> 0.41: its alae hold fatty marrow, near 0 HU, behind a dorsal cortex these voxels do not show).
    Lower ribs' shafts beyond the reach of growth from their seeded cortex, below the lungs, are bone too
    where their voxels are at least half on them, in the body wall (ribs 0.55 -> 0.65, all bone 0.852 ->
    0.855), and stones
    in the left kidney, a calcified plaque and a dense speck in the small bowel no longer are (precision,
    the share of the bone on bone labels, 0.952 -> 0.953; none of it on the kidneys or the bowel away from
    bone labels). The 7th ribs below the lungs' domes, apart from the rest of their ribs and with the liver,
    not a lung, inside them, are rib pieces in the body wall (ribs 0.655 -> 0.718, precision 0.9567 -> 0.9564).
    The sacrum's fatty interior (0-70 HU), leaking out through its cortex's gaps and its foramina, is bone where
    it is textured, enclosed by bone and off the spinal canal (sacrum 0.458 -> 0.569, vertebrae 0.877 -> 0.903,
    hips 0.874 -> 0.890, all bone 0.875 -> 0.896, precision 0.9564 -> 0.9514); none of it on the spinal cord.
    A lower rib's tip turning down the body wall, shorter than 15 mm, continues its rib (ribs 0.734 -> 0.743).
    The canal kept out is found where the arch or the sacrum encloses it, not assumed on the body's mid-line: marrow
    on the mid-line beside it is filled (all bone 0.896, precision 0.9514 -> 0.9515, vertebrae 0.903 -> 0.904,
    sacrum 0.569 -> 0.573, hips 0.890 -> 0.889); still none of the cord.
    The canal is followed through the slices: at the first sacral level, where the arch is open behind, a fatty
    cavity of the right hip bone 52 mm beside the mid-line is no longer taken for it, and the canal there with its
    rim stays out (sacrum 0.573 -> 0.570, vertebrae 0.904 -> 0.903, hips 0.889 -> 0.890); still none of the cord.
    The spine Dice counts the hips and femurs as false positives: a perfect bone mask would score about 0.57."""
    _, labels, seg = ts
    bone = seg.masks["bone"]
    spine_ribs = np.isin(labels, TS_SPINE_RIBS)
    all_bone = np.isin(labels, TS_ALL_BONE)
    d_spine, d_all = dice(spine_ribs, bone), dice(all_bone, bone)
    recall = {name: float(bone[np.isin(labels, ids)].mean()) for name, ids in TS_BONE_RECALL.items()}
    print(f"totalseg_abdomen bone Dice: spine/sacrum/ribs {d_spine:.3f}, all bone labels {d_all:.3f}; recall", recall)
    from scipy import ndimage

    near_bone = ndimage.binary_dilation(all_bone)
    assert bone[near_bone].sum() >= 0.95 * bone.sum()  # no soft tissue or bowel taken for bone
    precision = float(bone[all_bone].sum()) / float(bone.sum())
    assert precision >= 0.95, f"only {precision:.3f} of the bone lies on bone labels"
    for organ, ids in TS_NOT_BONE.items():  # stones, plaque, contrast: apart from bone, in the organ
        stray = int((bone & np.isin(labels, ids) & ~near_bone).sum())
        assert stray == 0, f"{stray} voxels of the {organ} away from bone are bone"
    assert d_spine >= 0.46, f"spine/sacrum/ribs Dice {d_spine:.3f}"
    assert d_all >= 0.88, f"all bone labels Dice {d_all:.3f}"
    canal = int((bone & np.isin(labels, TS_SPINAL_CORD)).sum())
    assert canal == 0, f"{canal} voxels of the spinal canal's cord are bone"
    for name, floor in (("vertebrae", 0.88), ("ribs", 0.73), ("sacrum", 0.52), ("hips", 0.85)):
        assert recall[name] >= floor, f"{name} recall {recall[name]:.3f}"


def test_copdgene_lungs_lie_in_the_body():
    case = copdgene()
    seg = segment_organs(case.volume, organs=("body",), device="cpu")
    lungs = case.reference["lung_left"] | case.reference["lung_right"]
    assert seg.masks["body"][lungs].mean() >= 0.99
    # and no more: the air around the patient (a tenth of the scan at least) is outside the body
    air = outside_air(np.asarray(case.volume.array))
    assert air.mean() > 0.1 and seg.masks["body"][air].mean() < 0.01


def test_copdgene_without_contrast_is_not_called_enhanced():
    """COPDGene's inspiratory chests are scanned without IV contrast. On its 4 mm slices the bone mask misses parts
    of vertebral bodies and ribs, whose 150-600 HU pieces (21 mL in all) once made it "arterial"."""
    from pipeline.reconstruction.quality import assess_quality

    case = copdgene()
    seg = segment_organs(case.volume, organs=("lung_left", "lung_right", "body", "bone"), device="cpu")
    q = assess_quality(case.volume.array, case.volume.geometry, seg.masks)
    assert q.contrast_phase == "non_contrast", q.flags
    assert not any(f.code.startswith("contrast_") for f in q.flags)
