"""The error listing a folder's series (several qualify, or the one asked for is not there) shows each series'
description as the header holds it when identifiers are kept (``--keep-identifiers`` of ``ctpipe detect`` and
``ctpipe reconstruct``, ``keep_identifiers=True`` of ``load_series``), and each identifier in it as ``<patient>``
otherwise."""

from __future__ import annotations

import json

import pytest

from pipeline.cli import main
from pipeline.errors import AmbiguousSeriesError, NoSeriesFoundError


def _described(i, ds) -> None:
    ds.PatientName, ds.PatientID = "DOE^JANE", "MRN12345"
    ds.SeriesDescription = "Chest DOE JANE"


@pytest.fixture
def two_series(tmp_path):
    from tests._support.dicom import write_series

    src = tmp_path / "study"
    write_series(src / "a", n=12, series_uid="1.2.3.410", tweak=_described)
    write_series(src / "b", n=12, series_uid="1.2.3.411", tweak=_described, series_number=3)
    return src


@pytest.mark.parametrize("command", ["detect", "reconstruct"])
def test_the_qualifying_series_are_listed_with_their_descriptions_as_kept(tmp_path, two_series, capsys, command):
    argv = [command, str(two_series), "--out", str(tmp_path / command), "--device", "cpu"]
    assert main([*argv, "--keep-identifiers"]) == 1
    err = capsys.readouterr().err
    assert "2 CT series qualify" in err and err.count("(Chest DOE JANE, 12 slices)") == 2, err
    assert "<patient>" not in err
    assert main(argv) == 1  # without the option: redacted
    err = capsys.readouterr().err
    assert "2 CT series qualify" in err and err.count("(Chest <patient> <patient>, 12 slices)") == 2, err
    assert "DOE" not in err and "JANE" not in err


def test_load_series_lists_the_series_as_kept(two_series):
    from pipeline.ingest import load_series

    with pytest.raises(AmbiguousSeriesError) as kept:
        load_series(two_series, keep_identifiers=True)
    assert str(kept.value).count("(Chest DOE JANE, 12 slices)") == 2
    with pytest.raises(AmbiguousSeriesError) as redacted:
        load_series(two_series)
    assert str(redacted.value).count("(Chest <patient> <patient>, 12 slices)") == 2
    with pytest.raises(NoSeriesFoundError) as missing:  # the series found, when the one asked for is not among them
        load_series(two_series, series_uid="9.9.9", keep_identifiers=True)
    assert str(missing.value).count("(Chest DOE JANE, 12 slices)") == 2
    with pytest.raises(NoSeriesFoundError) as missing:
        load_series(two_series, series_uid="9.9.9")
    assert "JANE" not in str(missing.value) and "<patient>" in str(missing.value)


def test_ctpipe_ingest_lists_the_series_found_as_kept_when_the_one_asked_for_is_not_there(tmp_path, two_series, capsys):
    argv = ["ingest", str(two_series), "--out", str(tmp_path / "cache"), "--series-uid", "9.9.9"]
    assert main([*argv, "--keep-identifiers"]) == 1
    err = capsys.readouterr().err
    assert "no series with SeriesInstanceUID '9.9.9'" in err and err.count("(Chest DOE JANE, 12 slices)") == 2, err
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("(Chest <patient> <patient>, 12 slices)") == 2 and "JANE" not in err, err


def test_ctpipe_ingest_shows_the_descriptions_as_kept_in_its_table_and_json(tmp_path, two_series, capsys):
    # was: the table and the JSON report read "Chest <patient> <patient>" with --keep-identifiers too
    report = tmp_path / "ingest.json"
    argv = ["ingest", str(two_series), "--out", str(tmp_path / "cache"), "--json", str(report)]
    assert main([*argv, "--keep-identifiers"]) == 0
    out = capsys.readouterr().out
    assert out.count("Chest DOE JANE") == 2 and "<patient>" not in out, out
    assert [s["description"] for s in json.loads(report.read_text())["series"]] == ["Chest DOE JANE"] * 2
    assert main(argv) == 0  # without the option: redacted
    out = capsys.readouterr().out
    assert out.count("Chest <patient> <patient>") == 2 and "JANE" not in out, out
    assert [s["description"] for s in json.loads(report.read_text())["series"]] == ["Chest <patient> <patient>"] * 2
