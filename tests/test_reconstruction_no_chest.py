"""Reconstruction of scans without chest anatomy: a head (with and without the neck's air tube), an abdomen
without lungs, a water cylinder (with inserts of other densities), air only and a few slices.

Each gives quality flags (``lungs_absent``, ``airway_not_in_scan``) and no lung outputs (no lung mask,
mesh, file or lung volume as a plain number), never an exception; a batch run does not quarantine them
for the reconstruction. Volumes are built in LPS mm (anterior is -y, the patient's left +x).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import ndimage

from pipeline.phantom import generate_phantom
from pipeline.phantom.confounders import CONFOUNDER_SCENARIOS
from pipeline.reconstruction import reconstruct
from pipeline.reconstruction.segment import segment_organs
from pipeline.volume import CTVolume, Geometry
from tests._support.shapes import lps_grids, synthetic_chest

LUNGS = ("lung_left", "lung_right")
GRID = dict(matrix=128, pixel_spacing=2.0, slice_spacing=4.0)  # a 256 mm field, 4 mm slices


def _geometry(n: int, spacing: float, slices: int, slice_mm: float) -> Geometry:
    """An axial HFS-like grid centred on LPS (0, 0, 0)."""
    sp = np.array([spacing, spacing, slice_mm])
    centre = (np.array([n, n, slices]) - 1) / 2.0
    return Geometry(shape=(slices, n, n), spacing=tuple(sp), origin=tuple(-sp * centre), direction=np.eye(3))


def _ellipsoid(x, y, z, centre, radii):
    return sum(((c - c0) / r) ** 2 for c, c0, r in zip((x, y, z), centre, radii)) <= 1.0


def head_ct(*, neck: bool = False, sinus_hu: float = -1000.0, seed: int = 0) -> CTVolume:
    """A head: scalp, skull (1000 HU), brain (35 HU), ventricles, eyes, maxillary sinuses (mucosa, fluid, air at
    ``sinus_hu``), frontal sinus, nasal cavity, mastoid air cells in bone and ear canals open to the outside air.

    ``neck`` adds the neck below with the cervical spine and two midline air tubes (pharynx, larynx) that a
    trachea search may take for a trachea. Blurred (about 1.5 mm FWHM) plus 8 HU noise.
    """
    slices = 48 if neck else 36
    g = _geometry(128, 1.5, slices, 3.0)
    x, y, z = lps_grids(g)
    zc = 25.0 if neck else 0.0  # the head's centre (mm)
    hu = np.full(g.shape, -1000.0, dtype=np.float32)
    skull = _ellipsoid(x, y, z, (0, 0, zc), (71, 89, 85))
    hu[_ellipsoid(x, y, z, (0, 0, zc), (76, 94, 90))] = 40.0  # scalp
    hu[skull] = 1000.0
    brain = _ellipsoid(x, y, z, (0, 0, zc), (64, 82, 78))
    hu[brain] = 35.0
    hu[brain & _ellipsoid(x, y, z, (0, 5, zc + 10), (14, 30, 12))] = 5.0  # ventricles
    face = _ellipsoid(x, y, z, (0, -55, zc - 50), (60, 38, 45)) & (z < zc - 5)
    hu[face & ~skull] = 40.0
    septa = (np.abs(np.sin(x * 0.9)) < 0.3) | (np.abs(np.sin(y * 0.8)) < 0.3) | (np.abs(np.sin(z * 0.7)) < 0.3)
    for sx in (-1.0, 1.0):
        hu[_ellipsoid(x, y, z, (sx * 32, -78, zc - 25), (13, 13, 12))] = 10.0  # eyes
        hu[_ellipsoid(x, y, z, (sx * 28, -62, zc - 58), (17, 19, 17))] = 700.0  # sinus wall
        hu[_ellipsoid(x, y, z, (sx * 28, -62, zc - 58), (15, 17, 15))] = 30.0  # mucosa and fluid
        hu[_ellipsoid(x, y, z, (sx * 28, -62, zc - 58), (12, 14, 12)) & (y < -52)] = sinus_hu
        mastoid = _ellipsoid(x, y, z, (sx * 52, 18, zc - 28), (12, 18, 16))
        hu[mastoid] = 900.0
        hu[mastoid & ~septa & _ellipsoid(x, y, z, (sx * 52, 18, zc - 28), (10, 16, 14))] = -1000.0  # air cells
        hu[((y + 2) ** 2 + (z - zc + 40) ** 2 <= 16.0) & (np.abs(x) >= 60)] = -1000.0  # ear canal
    hu[_ellipsoid(x, y, z, (0, -80, zc + 20), (22, 7, 12))] = sinus_hu  # frontal sinus
    hu[(np.abs(x) <= 8) & _ellipsoid(x, y, z, (0, -70, zc - 55), (9, 25, 25))] = -1000.0  # nasal cavity
    if neck:
        neck_m = _ellipsoid(x, y, z, (0, 10, 0), (55, 50, 400)) & (z < zc - 40)
        hu[neck_m] = 40.0
        hu[neck_m & (x**2 + (y - 35) ** 2 <= 11.0**2)] = 900.0  # cervical spine
        hu[(x**2 + (y + 10 + 0.3 * (z - zc)) ** 2 <= 8.0**2) & (z < zc - 35)] = -1000.0  # pharynx
        hu[(x**2 + (y + 45) ** 2 <= 6.0**2) & (z >= zc - 70) & (z < zc - 35)] = -1000.0  # larynx
    hu = ndimage.gaussian_filter(hu, sigma=(0.5, 0.6, 0.6))
    hu += np.random.default_rng(seed).normal(0.0, 8.0, hu.shape).astype(np.float32)
    return CTVolume(hu, g, metadata={"SeriesInstanceUID": "1.2.3.head" + (".neck" if neck else "")})


def water_cylinder(*, inserts: bool = False, seed: int = 0) -> CTVolume:
    """A 200 mm water cylinder (0 HU) along z, longer than the scan, in air; ``inserts`` adds 25 mm rods of air,
    lung-equivalent material (-700 HU), fat (-100 HU), acrylic (120 HU) and cortical bone (1000 HU)."""
    g = _geometry(112, 2.0, 30, 3.0)
    x, y, _ = lps_grids(g)
    hu = np.full(g.shape, -1000.0, dtype=np.float32)
    cylinder = x**2 + y**2 <= 100.0**2
    hu[cylinder] = 0.0
    if inserts:
        for angle, value in zip(np.linspace(0, 2 * np.pi, 5, endpoint=False), (-1000.0, -700.0, -100.0, 120.0, 1000.0)):
            hu[cylinder & ((x - 60.0 * np.cos(angle)) ** 2 + (y - 60.0 * np.sin(angle)) ** 2 <= 12.5**2)] = value
    hu += np.random.default_rng(seed).normal(0.0, 10.0, hu.shape).astype(np.float32)
    return CTVolume(hu, g, metadata={"SeriesInstanceUID": "1.2.3.cylinder" + (".inserts" if inserts else "")})


def all_air(*, seed: int = 0) -> CTVolume:
    g = _geometry(48, 4.0, 12, 5.0)
    hu = (-1000.0 + np.random.default_rng(seed).normal(0.0, 10.0, g.shape)).astype(np.float32)
    return CTVolume(hu, g, metadata={"SeriesInstanceUID": "1.2.3.air"})


def middle_slices(volume: CTVolume, slices: int) -> CTVolume:
    """The middle ``slices`` slices of ``volume`` (slices along the array's first axis)."""
    k0 = volume.shape[0] // 2 - slices // 2
    g = volume.geometry
    origin = g.index_to_lps(np.array([0.0, 0.0, float(k0)]))
    geom = Geometry(shape=(slices, *g.shape[1:]), spacing=g.spacing, origin=tuple(origin), direction=g.direction)
    return CTVolume(np.ascontiguousarray(volume.array[k0 : k0 + slices]), geom, metadata=dict(volume.metadata))


def abdomen_only() -> CTVolume:
    s = CONFOUNDER_SCENARIOS["abdomen_only"]
    return generate_phantom(s.seed, confounders=s.confounders, patient_position=s.patient_position, **GRID).volume


CASES = {
    "head": lambda: head_ct(),
    "head_neck": lambda: head_ct(neck=True),
    "head_sinus_900": lambda: head_ct(sinus_hu=-900.0),  # opacified or beam-hardened sinus air reads as parenchyma
    "abdomen_only": abdomen_only,
    "water_cylinder": lambda: water_cylinder(),
    "cylinder_inserts": lambda: water_cylinder(inserts=True),
    "all_air": all_air,
    "head_3_slices": lambda: middle_slices(head_ct(), 3),
}


def _assert_no_lung_outputs(rec, tmp_path, stem):
    assert not set(LUNGS) & set(rec.masks) and not set(LUNGS) & set(rec.meshes)
    why = "no body found" if "body" not in rec.masks else "no lungs found"  # only all air has no body to look in
    for side in LUNGS:
        assert why in rec.errors[side], rec.errors[side]
    lungs = rec.measurements["lungs"]
    assert lungs["lung_left_volume_ml"] is None and lungs["lung_right_volume_ml"] is None
    assert lungs["lungs_total_volume_ml"] is None and lungs["emphysema_index_pct"] is None
    assert not list(tmp_path.glob(f"{stem}_lung_*"))
    labels = np.load(tmp_path / f"{stem}_labels.npz") if (tmp_path / f"{stem}_labels.npz").is_file() else None
    if labels is not None:
        assert not {"lung_left", "lung_right"} & set(json.loads(str(labels["names"])).values())
    meas = json.loads((tmp_path / f"{stem}_measurements.json").read_text())
    assert "lungs_absent" in [f["code"] for f in meas["quality"]["flags"]]


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_chest_gives_flags_and_no_lung_outputs(name, tmp_path):
    vol = CASES[name]()
    rec = reconstruct(vol, device="cpu", out_dir=tmp_path, stem=name, smoothing=0)
    assert rec.quality is not None
    assert rec.quality.lungs_absent and rec.quality.has("lungs_absent")
    assert rec.quality.has("airway_not_in_scan"), rec.quality.codes
    assert "airway" not in rec.masks and "airway" not in rec.meshes
    assert rec.info["lungs"] == "absent" and rec.info["airway"] == "not_in_scan"
    _assert_no_lung_outputs(rec, tmp_path, name)
    if name != "all_air":
        assert "body" in rec.masks and "body" in rec.meshes
    else:
        assert "body" not in rec.masks and "no body found" in rec.errors["body"], rec.errors


def test_head_air_is_neither_lung_nor_airway():
    """The pharynx and larynx of a head-and-neck scan are found as a trachea-like tube: without lungs they are
    not the chest's airway (no "leaked into the lungs" failure), and sinus and mastoid air is no lung."""
    seg = segment_organs(head_ct(neck=True), device="cpu")
    assert seg.info["airway"] == "not_in_scan" and "airway" not in seg.errors
    assert seg.info["lungs"] == "absent" and not set(LUNGS) & set(seg.masks)
    assert {"body", "bone"} <= set(seg.masks)


def test_water_cylinder_has_body_and_no_bone_or_lung():
    seg = segment_organs(water_cylinder(), device="cpu")
    assert set(seg.masks) == {"body"}
    assert "no bone found" in str(seg.errors["bone"]) and "no lungs found" in str(seg.errors["lung_left"])
    inserts = segment_organs(water_cylinder(inserts=True), device="cpu")
    # the lung-equivalent insert (one column through the whole scan, no airway) is not a lung
    assert "through the whole scan" in str(inserts.errors["lung_left"])
    assert not set(LUNGS) & set(inserts.masks)


def test_a_few_slices_of_a_chest_keep_their_lungs_marked_partial():
    """Three slices through the chest: lungs (cut at both ends) are found and their volumes marked, not plain."""
    ph = generate_phantom(3, **GRID)
    vol = middle_slices(ph.volume, 3)
    rec = reconstruct(vol, device="cpu", render=False, smoothing=0)
    assert set(LUNGS) <= set(rec.masks)
    assert rec.quality is not None and rec.quality.has("lungs_apex_cut") and rec.quality.has("lungs_base_cut")
    assert rec.measurements["lungs"]["lung_left_volume_ml"]["reliable"] is False
    k0 = ph.volume.shape[0] // 2 - 1
    truth = ph.masks["lung_left"][k0 : k0 + 3]
    overlap = 2.0 * (truth & rec.mask("lung_left")).sum() / (truth.sum() + rec.mask("lung_left").sum())
    assert overlap > 0.9


LUNG_ML = ("lung_left_volume_ml", "lung_right_volume_ml", "lungs_total_volume_ml")


def test_one_slice_is_not_segmented_and_reports_no_lungs(tmp_path):
    """One slice has no 3-D organs: every organ is an error (not an exception) and the lungs count as absent."""
    vol = middle_slices(generate_phantom(3, **GRID).volume, 1)
    rec = reconstruct(vol, device="cpu", out_dir=tmp_path, stem="thin", smoothing=0)
    assert rec.masks == {} and rec.meshes == {}
    assert {"body", *LUNGS} <= set(rec.errors)
    assert all("too thin for 3-D segmentation" in msg for msg in rec.errors.values()), rec.errors
    assert rec.quality.lung_coverage == "absent" and rec.quality.has("lungs_absent"), rec.quality.codes
    assert set(LUNG_ML) <= set(rec.quality.unreliable)
    meas = json.loads((tmp_path / "thin_measurements.json").read_text())
    assert "lungs_absent" in [f["code"] for f in meas["quality"]["flags"]]
    assert all(meas["lungs"][k] is None for k in LUNG_ML), meas["lungs"]
    assert not list(tmp_path.glob("thin_lung_*"))


def test_two_slices_keep_their_lungs_cut_at_both_ends(tmp_path):
    """Two slices are segmented: the lungs are found, cut at the apex and the base, their volumes marked unreliable."""
    vol = middle_slices(generate_phantom(3, **GRID).volume, 2)
    rec = reconstruct(vol, device="cpu", out_dir=tmp_path, stem="thin", smoothing=0)
    assert set(LUNGS) <= set(rec.masks) and not rec.errors, rec.errors
    assert rec.quality.lung_coverage == "partial"
    assert rec.quality.has("lungs_apex_cut") and rec.quality.has("lungs_base_cut"), rec.quality.codes
    assert not rec.quality.has("lungs_absent")
    assert set(LUNG_ML) <= set(rec.quality.unreliable)
    meas = json.loads((tmp_path / "thin_measurements.json").read_text())
    for k in LUNG_ML:
        assert meas["lungs"][k]["reliable"] is False and meas["lungs"][k]["value"] > 0, (k, meas["lungs"][k])


def test_one_lung_without_airway_is_kept():
    """A single lung (the other one collapsed) with no airway in the scan is still a lung: the rule against
    lung-density columns applies only to one that runs through the whole scan."""
    vol, truth = synthetic_chest(n=80, slices=40, with_airway=False)
    arr = vol.array.copy()
    arr[truth["lung_right"]] = 40.0
    seg = segment_organs(vol.with_array(arr), organs=LUNGS, device="cpu")
    assert seg.info["lungs"] == "one_side" and "lung_left" in seg.masks and "lung_right" not in seg.masks
    d = 2.0 * (truth["lung_left"] & seg.masks["lung_left"]).sum() / (truth["lung_left"].sum() + seg.masks["lung_left"].sum())
    assert d > 0.95


@pytest.mark.slow
def test_batch_run_does_not_quarantine_scans_without_a_chest(tmp_path):
    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.runner import run_batch

    src = tmp_path / "dicom"
    for n, name in enumerate(("head_neck", "cylinder_inserts", "all_air")):
        vol = CASES[name]()
        md = {k: v for k, v in vol.metadata.items() if k != "SeriesInstanceUID"}
        write_dicom_series(CTVolume(vol.array, vol.geometry, metadata=md), src / name, seed=100 + n)
    summary = run_batch([src], out=tmp_path / "run", workers=0, reconstruct={"renderings": False})
    assert summary.total == 3 and summary.done == 3 and not summary.quarantined, summary
    flags = []
    for meas in sorted((tmp_path / "run").glob("cases/*/recon/*_measurements.json")):
        m = json.loads(meas.read_text())
        codes = [f["code"] for f in m["quality"]["flags"]]
        assert "lungs_absent" in codes and "airway_not_in_scan" in codes, codes
        assert not {"lung_left", "lung_right", "airway"} & set(m["organs"])
        flags.append(codes)
    assert len(flags) == 3
