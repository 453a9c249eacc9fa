"""``ctpipe detect`` on the real RT-planning chest re-stored as a feet-first supine (FFS) acquisition finds its four
lesions where they are in the patient, in the lung each lies in, on the slice that holds them.

The variant is what a scanner writes for the same patient lying feet first: the image columns run towards the
patient's right (ImageOrientationPatient ``-1,0,0, 0,1,0``, each slice's pixels mirrored left-right and
ImagePositionPatient at the new first voxel), InstanceNumber 1 at the feet (slices stored bottom up), file names in
neither slice nor instance order, and the table at another position (every LPS coordinate moved by :data:`TABLE_MM`).
The patient's anatomy keeps its place in the patient's own axes (LPS: +x the patient's left, +y posterior, +z head),
so each lesion's expected centre is its HFS centre plus :data:`TABLE_MM`, its side unchanged. The series is cut to
the 43 slices around three of the lesions (the 26 mm one in the right lung, the 8 mm and 6 mm ones in the left; the
carina) to keep the test short.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pydicom
import pytest

from pipeline.dicom_out import read_sr_findings
from tests._support.dicom import write_series
from tests._support.real_ct import require_real_ct
from tests.test_detect_sr_sides import PLANNING_CHEST_LESIONS, _detect

#: where the FFS table puts the patient relative to the HFS scan (LPS mm): a translation, not a voxel multiple
TABLE_MM = np.array([12.5, -7.25, 430.0])
#: the HFS slices kept (LPS z, mm): three lesions (z -20.6 .. 32.3) with margin
Z_RANGE_MM = (-36.0, 50.0)
#: the lesions the kept slices hold, and their lungs: both sides
LESIONS = {what: lesion for what, lesion in PLANNING_CHEST_LESIONS.items() if -30.0 < lesion[0][2] < 40.0}
#: how far (mm, LPS) a lesion's reported centre may lie from its known one: under one 2 mm slice and about 1.5 pixels
#: (0.98 mm): cutting the series to fewer slices moves the 6 mm lesion's centre by about one pixel, while a mirrored
#: or misplaced axis moves a centre by tens of millimetres
TOLERANCE_MM = 1.5


def _read_hfs(folder: Path) -> tuple[np.ndarray, np.ndarray, tuple[float, float], float]:
    """The HFS series' HU ``[k, j, i]`` (k head to feet), each slice's ImagePositionPatient (LPS mm, ``(nk, 3)``),
    the PixelSpacing (row, column spacing, mm) and the slice step (mm), straight from the files with pydicom."""
    slices = []
    for path in sorted(folder.glob("*.dcm")):
        ds = pydicom.dcmread(path)
        assert [float(v) for v in ds.ImageOrientationPatient] == [1, 0, 0, 0, 1, 0] and ds.PatientPosition == "HFS"
        hu = ds.pixel_array * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
        slices.append((np.asarray(ds.ImagePositionPatient, float), hu.astype(np.int16)))
    slices.sort(key=lambda s: -s[0][2])
    ipp = np.array([s[0] for s in slices])
    keep = (ipp[:, 2] >= Z_RANGE_MM[0]) & (ipp[:, 2] <= Z_RANGE_MM[1])
    spacing = tuple(float(v) for v in ds.PixelSpacing)
    return np.stack([s[1] for s, k in zip(slices, keep) if k]), ipp[keep], (spacing[0], spacing[1]), abs(ipp[1, 2] - ipp[0, 2])


def write_feet_first(folder: Path, out: Path) -> dict[str, tuple[int, np.ndarray]]:
    """The HFS planning chest in ``folder`` re-stored FFS into ``out`` (see the module docstring); each file's
    SOPInstanceUID → (its InstanceNumber, its ImagePositionPatient in LPS mm)."""
    hu, ipp, (row_mm, col_mm), step = _read_hfs(folder)
    n, rows, cols = hu.shape
    order = np.arange(n)[::-1]  # stored feet first: the first image is the most inferior
    positions = ipp[order] + np.array([(cols - 1) * col_mm, 0.0, 0.0]) + TABLE_MM  # the mirrored row's first voxel
    rng = np.random.default_rng(7)
    names = [f"IM{v:06d}.dcm" for v in rng.permutation(10**6)[:n]]  # directory order is neither slice nor instance order

    def feet_first(k: int, ds: pydicom.Dataset) -> None:
        ds.PatientPosition = "FFS"

    paths = write_series(
        out,
        n=n,
        rows=rows,
        cols=cols,
        pixel_spacing=(row_mm, col_mm),
        step=step,
        orientation=(-1, 0, 0, 0, 1, 0),
        positions=positions.tolist(),
        hu=np.ascontiguousarray(hu[order][:, :, ::-1]),
        description="CHEST FFS",
        names=lambda k: names[k],
        tweak=feet_first,
    )
    written = {}
    for path in paths:
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        written[str(ds.SOPInstanceUID)] = (int(ds.InstanceNumber), np.asarray(ds.ImagePositionPatient, float))
    return written


@pytest.mark.slow
def test_feet_first_bottom_up_chest_reports_each_lesion_where_it_lies(tmp_path):
    folder = require_real_ct() / "chest_ct_rt_planning_dicom"  # skips with a reason when ../shared/real_ct is absent
    written = write_feet_first(folder, tmp_path / "ffs")
    sr = read_sr_findings(_detect(tmp_path / "ffs", tmp_path / "out", "--score-threshold", "0.5"))
    found = json.loads((tmp_path / "out" / "c.findings.json").read_text())["findings"]
    centres = sr[["center_x", "center_y", "center_z"]].to_numpy(float)
    assert {side for _, side in LESIONS.values()} == {"left", "right"} and len(LESIONS) == 3
    for what, (hfs_centre, side) in LESIONS.items():
        expected = np.asarray(hfs_centre) + TABLE_MM
        near = np.flatnonzero(np.linalg.norm(centres - expected, axis=1) <= TOLERANCE_MM)
        assert len(near) == 1, (what, expected, sr[["center_x", "center_y", "center_z", "score"]])
        row = sr.iloc[near[0]]
        assert row.side == side, (what, row.side)
        # the image the SR and findings name is the stored slice nearest the lesion's centre along the patient's axis
        nearest = min(written, key=lambda uid: abs(written[uid][1][2] - expected[2]))
        assert row.sop_instance_uid == nearest, (what, written.get(row.sop_instance_uid), written[nearest])
        finding = min(found, key=lambda f: float(np.linalg.norm(np.asarray(f["center_lps"]) - expected)))
        named = (finding["slice_number"], finding["sop_instance_uid"])
        assert named == (written[nearest][0], nearest), (what, named, written[nearest][0], nearest)
