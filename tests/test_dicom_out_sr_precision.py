"""read_sr_findings gives the SR's single-precision (FL) coordinates at the precision the SR holds: the findings'
own centres and box bounds (LPS mm), not float32 noise such as -21.809999 for -21.81. The SR states measurements at
the precision a reader uses: volumes in mL to 0.1, the emphysema index to 0.1 %, nodule diameters and long axes to
0.1 mm, nodule volumes to 1 mm³; positions (LPS mm) to 0.01 mm."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom

from pipeline.dicom_out import read_sr_findings, write_dicom_outputs, write_sr
from pipeline.dicom_out.sr_read import COORDINATE_DECIMALS
from tests.test_dicom_out_sources import phantom_case

MODEL = dict(model_name="demo_phantom_retinanet", model_version="1", score_threshold=0.5)


def test_coordinates_read_back_as_the_findings_values(tmp_path):
    case = phantom_case(tmp_path / "case", n_nodules=2)
    findings = []
    for f, frac, half in zip(
        case.findings, ((0.81, -0.29, 0.47), (-0.13, 0.71, -0.33)), ((5.13, 4.07, 3.33), (2.71, 6.29, 4.41))
    ):
        # centres and box bounds with two decimals, as the findings table prints them; none is exact in float32
        center = np.round(np.asarray(f.center_lps), 0) + np.asarray(frac)
        findings.append(
            dataclasses.replace(
                f,
                center_lps=tuple(float(v) for v in center),
                box_min_lps=tuple(float(v) for v in center - half),
                box_max_lps=tuple(float(v) for v in center + half),
            )
        )
    assert all(float(np.float32(v)) != v for f in findings for v in f.center_lps)
    paths = write_dicom_outputs(
        tmp_path / "out", source=case.source, volume=case.volume, findings=findings, outputs=["sr"], **MODEL
    )
    table = read_sr_findings(paths["sr"])
    assert COORDINATE_DECIMALS == 3
    assert len(table) == 2
    for row in table.itertuples():
        f = findings[row.rank - 1]
        for axis, name in enumerate("xyz"):
            assert getattr(row, f"center_{name}") == round(f.center_lps[axis], 3), (row.rank, name)
            assert getattr(row, f"box_min_{name}") == round(f.box_min_lps[axis], 3), (row.rank, name)
            assert getattr(row, f"box_max_{name}") == round(f.box_max_lps[axis], 3), (row.rank, name)
        assert f"{row.center_x:.2f}" == f"{f.center_lps[0]:.2f}" and repr(row.center_x) == repr(round(f.center_lps[0], 2))


LUNGS = {
    "lung_left_volume_ml": 1234.5678,
    "lung_right_volume_ml": 1188.7778,
    "lungs_total_volume_ml": 2423.3456,
    "emphysema_index_pct": 0.84567,
}


def _stated(path: Path) -> dict[str, list[str]]:
    """concept meaning → the numbers the SR states for it, as written (NumericValue)."""
    out: dict[str, list[str]] = {}
    ds = pydicom.dcmread(path)

    def walk(seq: object) -> None:
        for item in seq:  # type: ignore[attr-defined]
            if item.get("ValueType") == "NUM" and "MeasuredValueSequence" in item:
                name = item.ConceptNameCodeSequence[0].CodeMeaning
                out.setdefault(name, []).append(str(item.MeasuredValueSequence[0]["NumericValue"].value))
            if "ContentSequence" in item:
                walk(item.ContentSequence)

    walk(ds.ContentSequence)
    return out


def _decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def test_measurements_are_stated_at_the_precision_a_reader_uses(tmp_path: Path) -> None:
    case = phantom_case(tmp_path / "case", n_nodules=1)
    path = write_sr(
        tmp_path / "sr.dcm",
        source=case.source,
        volume=case.volume,
        findings=case.findings,
        model_name="demo",
        model_version="1",
        score_threshold=0.5,
        nodules=case.nodules,
        organ_masks=case.organ_masks,
        measurements={"lungs": LUNGS},
    )
    stated = _stated(path)
    volumes = stated["Volume"]
    assert "2423.3" in volumes and "1234.6" in volumes and "1188.8" in volumes, volumes
    assert all(_decimals(v) <= 1 for v in volumes), volumes  # mL to 0.1, nodule mm³ to 1
    assert stated["Emphysema index (LAA-950)"] == ["0.8"]
    lengths = [v for name, values in stated.items() if name not in ("Volume", "Certainty of Finding") for v in values]
    lengths = [v for v in lengths if v not in stated.get("Emphysema index (LAA-950)", [])]
    assert lengths and all(_decimals(v) <= 1 for v in lengths), stated  # diameters and long axes to 0.1 mm
    nodule_volumes = [v for v in volumes if v not in ("2423.3", "1234.6", "1188.8")]
    assert nodule_volumes and all(float(v) == round(float(v)) for v in nodule_volumes), volumes  # whole mm³


def test_the_equivalent_sphere_diameter_is_named_as_such_not_as_a_diameter(tmp_path: Path) -> None:
    """A reader takes "Diameter" for a measured long or short axis (Fleischner, Lung-RADS); the SR names the diameter of
    the sphere of the nodule's volume for what it is, beside the nodule's long axis (SCT 103339001)."""
    case = phantom_case(tmp_path / "case", n_nodules=1)
    path = write_sr(
        tmp_path / "sr.dcm",
        source=case.source,
        volume=case.volume,
        findings=case.findings,
        model_name="demo",
        model_version="1",
        score_threshold=0.5,
        nodules=case.nodules,
        organ_masks=case.organ_masks,
    )
    names = set()
    for item in pydicom.dcmread(path).iterall():
        if getattr(item, "keyword", "") == "ConceptNameCodeSequence":
            code = item.value[0]
            names.add((code.CodingSchemeDesignator, code.CodeValue, code.CodeMeaning))
    # "Diameter" names only the mean of the measured axes, with its derivation Mean (the guidelines' mean diameter)
    for group in hd.sr.srread(path).content.get_volumetric_roi_measurement_groups():
        for m in group.get_measurements():
            if (m.name.scheme_designator, m.name.value) == ("SCT", "81827009"):
                assert m.derivation is not None and (m.derivation.scheme_designator, m.derivation.value) == (
                    "SCT",
                    "373098007",
                )
    assert ("99CTPIPE", "equiv_diameter", "Volume-equivalent sphere diameter") in names
    assert ("SCT", "103339001", "Long axis") in names
    table = read_sr_findings(path)
    assert table.diameter_mm.notna().all() and (table.diameter_mm <= table.max_extent_mm).all()
