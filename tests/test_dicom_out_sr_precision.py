"""read_sr_findings gives the SR's single-precision (FL) coordinates at the precision the SR holds: the findings'
own centres and box bounds (LPS mm), not float32 noise such as -21.809999 for -21.81."""

from __future__ import annotations

import dataclasses

import numpy as np

from pipeline.dicom_out import read_sr_findings, write_dicom_outputs
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
