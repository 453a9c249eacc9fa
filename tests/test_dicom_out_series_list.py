"""What a PACS viewer's series list shows of ctpipe's DICOM results: the SR and the SEG alike carry a series date and
time (those of their content), the manufacturer, model name and software version, a description and a number."""

from __future__ import annotations

import datetime
from pathlib import Path

import pydicom
import pytest

from pipeline import __version__
from pipeline.dicom_out import write_dicom_outputs
from tests.test_dicom_out_sources import phantom_case


@pytest.mark.parametrize("stable", [True, False], ids=["stable-uids", "new-uids"])
def test_sr_and_seg_show_their_date_and_maker_in_the_series_list(tmp_path: Path, stable: bool) -> None:
    case = phantom_case(tmp_path / "case", n_nodules=1)
    before = datetime.datetime.now().replace(microsecond=0)
    paths = write_dicom_outputs(
        tmp_path / "out",
        source=case.source,
        volume=case.volume,
        findings=case.findings,
        nodules=case.nodules,
        organ_masks={"lung_left": case.phantom.masks["lung_left"]},
        model_name="demo",
        model_version="1",
        score_threshold=0.5,
        stable_uids=stable,
    )
    for kind, path in paths.items():
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        assert (ds.get("SeriesDate"), ds.get("SeriesTime")) == (ds.ContentDate, ds.ContentTime), kind
        written = datetime.datetime.strptime(f"{ds.SeriesDate}{str(ds.SeriesTime).split('.')[0]}", "%Y%m%d%H%M%S")
        assert written >= before, kind  # when it was made, stable UIDs or not (never the scan's date)
        assert ds.Manufacturer == "ctpipe" and ds.get("ManufacturerModelName") == "ctpipe", kind
        assert ds.SoftwareVersions == __version__, kind
        assert ds.SeriesDescription.startswith("ctpipe ") and int(ds.SeriesNumber) > 0, kind
