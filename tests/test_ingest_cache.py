"""ingest_to_cache, the `ctpipe ingest` command, enhanced multi-frame CT and atomic cache writes."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pipeline.cache import CaseCache
from pipeline.cli import main
from pipeline.errors import TruncatedFileError
from pipeline.ingest import ingest_to_cache, load_series, safe_case_id, scan_directory
from pipeline.phantom import generate_phantom
from pipeline.phantom.dicom_writer import write_dicom_series
from tests._support.dicom import hu_pattern, write_enhanced, write_series


def test_enhanced_multiframe(tmp_path):
    path, hu = write_enhanced(tmp_path / "mf" / "IMG0001", n=12, shuffle=True)
    vol = load_series(path)
    assert np.array_equal(vol.array, hu)
    assert vol.array.dtype == np.int16
    np.testing.assert_allclose(vol.origin, (-10.0, -20.0, 30.0))
    np.testing.assert_allclose(vol.spacing, (0.8, 0.7, 1.25))
    np.testing.assert_allclose(vol.direction, np.eye(3))
    assert vol.metadata["NumberOfFrames"] == 12 and vol.metadata["SliceThickness"] == 1.25
    # the same file found by a folder scan
    scan = scan_directory(tmp_path / "mf")
    assert len(scan.selected) == 1 and scan.selected[0].n_slices == 12
    assert np.array_equal(load_series(tmp_path / "mf").array, hu)


def test_enhanced_from_phantom_writer(tmp_path):
    ph = generate_phantom(5, matrix=64, slices=12, n_nodules=0)
    write_dicom_series(ph.volume, tmp_path / "e", enhanced=True, seed=1)
    write_dicom_series(ph.volume, tmp_path / "s", seed=1)
    mf = load_series(tmp_path / "e")
    single = load_series(tmp_path / "s")
    assert np.array_equal(mf.array, single.array)
    assert mf.geometry.same_grid(single.geometry, atol=1e-4)


def test_ingest_to_cache_writes_selected_series(tmp_path):
    write_series(tmp_path / "in" / "a", n=12, series_uid="1.2.3.100")
    write_series(tmp_path / "in" / "b", n=11, series_uid="1.2.3.101", hu=hu_pattern(11, 16, 20, seed=4))
    bad = write_series(tmp_path / "in" / "c", n=12, series_uid="1.2.3.102")
    bad[2].write_bytes(bad[2].read_bytes()[:-50])  # truncated pixel data
    cache = CaseCache(tmp_path / "cache")
    report = ingest_to_cache(tmp_path / "in", cache)
    assert sorted(report.written) == ["1.2.3.100", "1.2.3.101"]
    assert cache.case_ids() == ["1.2.3.100", "1.2.3.101"]
    assert [r.series.key for r in report.scan.rejected] == ["1.2.3.102"] and not report.ok
    assert isinstance(report.scan.rejected[0].error, TruncatedFileError)
    vol = cache.read("1.2.3.101", verify=True)
    direct = load_series(tmp_path / "in" / "b")
    assert np.array_equal(vol.array, direct.array) and vol.geometry.same_grid(direct.geometry)
    assert vol.metadata["SeriesInstanceUID"] == "1.2.3.101" and vol.metadata["CoordinateSystem"] == "LPS"
    assert cache.entry("1.2.3.100").sidecar["extra"]["series_key"] == "1.2.3.100"


def test_failure_leaves_no_partial_files(tmp_path, monkeypatch):
    """A series whose pixels fail mid-read, and a write that fails mid-array, leave the cache folder empty."""
    paths = write_series(tmp_path / "in", n=12, series_uid="4.4")
    cache = CaseCache(tmp_path / "cache")
    scan = scan_directory(tmp_path / "in")
    assert scan.selected  # valid by its headers ...
    paths[9].write_bytes(paths[9].read_bytes()[:-40])  # ... but a file is cut after the scan
    from pipeline.ingest import read_volume

    with pytest.raises(TruncatedFileError, match=paths[9].name):
        read_volume(scan.plans["4.4"])
    paths = write_series(tmp_path / "in", n=12, series_uid="4.4")  # repaired

    import pipeline.cache as cache_mod

    real = cache_mod.np.lib.format.write_array

    def dying_write(fh, array, **kw):
        fh.write(b"\x93NUMPY partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_mod.np.lib.format, "write_array", dying_write)
    report = ingest_to_cache(tmp_path / "in", cache)
    monkeypatch.setattr(cache_mod.np.lib.format, "write_array", real)
    assert report.written == {}
    (rej,) = report.scan.rejected
    assert "No space left on device" in str(rej.error) and "free disk space" in str(rej.error)
    assert not list((tmp_path / "cache").iterdir())  # no .npy, no .json, no temporary file
    # a later run writes the case
    assert list(ingest_to_cache(tmp_path / "in", cache).written) == ["4.4"]


def test_safe_case_id():
    assert safe_case_id("1.2.840.113619.2.55.3") == "1.2.840.113619.2.55.3"
    assert safe_case_id("1.2.3#2") == "1.2.3_p2"
    assert safe_case_id("../../etc/passwd") == "etc_passwd"


def test_cli_ingest(tmp_path, capsys):
    write_series(tmp_path / "in" / "a", n=12, series_uid="1.2.3.200", description="good one")
    write_series(tmp_path / "in" / "b", n=1, series_uid="1.2.3.201", description="key image")
    gap = write_series(tmp_path / "in" / "c", n=12, series_uid="1.2.3.202", description="gappy")
    gap[5].unlink()
    (tmp_path / "in" / "DICOMDIR").write_bytes(b"not really")
    report = tmp_path / "report.json"
    rc = main(["ingest", str(tmp_path / "in"), "--out", str(tmp_path / "cache"), "--json", str(report)])
    out = capsys.readouterr().out
    assert rc == 1  # a series was rejected
    assert "cached    1.2.3.200" in out
    assert "REJECTED  1.2.3.202" in out and "MissingSliceError" in out
    assert "skipped   1.2.3.201" in out and "min_slices=10" in out
    data = json.loads(report.read_text())
    assert data["cached"] == {"1.2.3.200": "1.2.3.200"}
    assert data["rejected"][0]["key"] == "1.2.3.202"
    assert CaseCache(tmp_path / "cache").case_ids() == ["1.2.3.200"]
    rc = main(["ingest", str(tmp_path / "in" / "b"), "--out", str(tmp_path / "cache2"), "--min-slices", "2"])
    out = capsys.readouterr().out
    assert rc == 1 and "only 1 slice(s), fewer than min_slices=2" in out and "no series was cached" in out
    rc = main(["ingest", str(tmp_path / "in" / "a"), "--out", str(tmp_path / "cache3"), "--series-uid", "1.2.3.200"])
    assert rc == 0 and CaseCache(tmp_path / "cache3").case_ids() == ["1.2.3.200"]


def test_cli_ingest_times_the_whole_ingest_not_only_the_scan(tmp_path, capsys, monkeypatch):
    """The ingest's seconds (the JSON report's ``seconds``, the printed line) cover reading and caching the series,
    not just the header scan; the scan's own time is ``scan_seconds``."""
    import time

    write_series(tmp_path / "in" / "a", n=12, series_uid="1.2.3.300", description="good one")
    real_write = CaseCache.write

    def slow_write(self, *args, **kwargs):  # a cache on a slow disk: 0.3 s per case
        time.sleep(0.3)
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(CaseCache, "write", slow_write)
    report = tmp_path / "report.json"
    rc = main(["ingest", str(tmp_path / "in"), "--out", str(tmp_path / "cache"), "--json", str(report)])
    out = capsys.readouterr().out
    assert rc == 0
    data = json.loads(report.read_text())
    assert data["seconds"] >= data["scan_seconds"] + 0.3
    printed = re.search(r"\((\d+\.\d\d) s scan, (\d+\.\d\d) s in all\)", out)
    assert printed is not None, out
    assert float(printed[2]) == pytest.approx(data["seconds"], abs=0.01) and float(printed[2]) >= float(printed[1]) + 0.29
