"""Findings as a DataFrame: numbers as numbers, LPS mm columns named as the run's findings table."""

from __future__ import annotations

import matplotlib
import numpy as np
import pandas as pd

import pipeline as ctp
from pipeline.detection.findings import Finding, Findings


def _findings() -> Findings:
    items = [
        Finding((-21.8, -33.2, -226.0), (-27.8, -39.2, -232.0), (-15.8, -27.2, -220.0), 12.0, 0.97, (72, 63, 35), 36, "1.2.3.36"),
        Finding((40.5, 10.25, -200.0), (38.5, 8.25, -202.0), (42.5, 12.25, -198.0), 4.0, 0.61, (5, 6, 7), 8),
    ]
    return Findings(items, case_id="c1", series_uid="1.2.3", score_threshold=0.5, threshold_source="test")


def test_findings_to_dataframe_has_numeric_lps_columns():
    table = _findings().to_dataframe()
    assert list(table["rank"]) == [1, 2] and list(table.case_id) == ["c1", "c1"] and set(table.series_uid) == {"1.2.3"}
    for column in ("score", "center_x", "center_y", "center_z", "diameter_mm", "box_min_x", "box_max_z"):
        assert pd.api.types.is_float_dtype(table[column]), column
    for column in ("voxel_i", "voxel_j", "voxel_k", "slice_number"):
        assert pd.api.types.is_integer_dtype(table[column]), column
    assert table.sort_values("score").score.tolist() == [0.61, 0.97]  # sorted as numbers, not as text
    assert table.loc[1, ["center_x", "center_y", "center_z"]].tolist() == [40.5, 10.25, -200.0]
    assert table.loc[0, "sop_instance_uid"] == "1.2.3.36" and pd.isna(table.loc[1, "sop_instance_uid"])


def test_an_empty_findings_gives_an_empty_table_with_the_columns():
    table = Findings([], series_uid="1.2.3").to_dataframe()
    assert len(table) == 0 and "center_x" in table.columns and "score" in table.columns


def test_show_takes_the_table(tmp_path):
    matplotlib.use("Agg")
    geometry = ctp.Geometry((16, 32, 32), (4.0, 4.0, 4.0), (-64.0, -64.0, -264.0))
    volume = ctp.CTVolume(np.full(geometry.shape, -800, np.int16), geometry, metadata={"SeriesInstanceUID": "1.2.3"})
    ax = ctp.show(volume, findings=_findings().to_dataframe(), k=9)
    assert "of 2 finding(s)" in ax.get_title()
