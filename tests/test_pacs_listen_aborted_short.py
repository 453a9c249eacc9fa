"""``ctpipe listen`` and a sender that ends its association with an A-ABORT between two instances before sending the
whole series (its operator stopped it): where the instances say how many the series has (Images in Acquisition, or
Number of Series Related Instances) and fewer arrived, the series is held as cut off and quarantined after
``pacs.series_limit_s`` with the count, never processed as complete; a whole series from such a sender still is.
Real senders: pynetdicom's C-STORE client and dcmtk's ``storescu --abort``."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

import pydicom
import pytest

from tests._support.orthanc import HOST, write_phantom_series
from tests.test_pacs_listen_receive import AET, _limit_clock, _listener, _send, _until_cut

pytestmark = pytest.mark.pacs


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> tuple[str, list[Path]]:
    return write_phantom_series(tmp_path_factory.mktemp("aborted") / "case", 12, slices=8)


_OPTS = {"pacs.quiet_period_s": 0.2, "ingest.min_slices": 3}


def _counted(files: list[Path], **counts: int) -> list[tuple[pydicom.Dataset, str]]:
    """The series' datasets, each carrying ``counts`` (e.g. ImagesInAcquisition=8), in explicit VR little endian."""
    out = []
    for f in files:
        ds = pydicom.dcmread(f)
        for keyword, n in counts.items():
            setattr(ds, keyword, n)
        out.append((ds, "1.2.840.10008.1.2.1"))
    return out


def _note(run: Path, uid: str) -> str:
    with sqlite3.connect(f"file:{run / 'pacs' / 'ledger.sqlite'}?mode=ro", uri=True) as db:
        row = db.execute("SELECT note FROM series WHERE series_uid = ? ORDER BY generation DESC", (uid,)).fetchone()
    return str(row[0] or "") if row else ""


def _until(pred, lst, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred() and time.monotonic() < deadline:
        lst.step()
        time.sleep(0.1)


@pytest.mark.parametrize("count", ["ImagesInAcquisition", "NumberOfSeriesRelatedInstances"])
def test_a_series_short_of_its_count_from_a_sender_that_aborts_between_instances_is_quarantined(
    series, tmp_path, caplog, monkeypatch, count
):
    """5 of a series' 8 instances, each saying the series has 8, then the sender's A-ABORT between two instances: the
    series is not processed once quiet; a warning names the sender and the count; after pacs.series_limit_s it is
    quarantined (PartialSeriesError) with '5 of 8' and the fix (was: processed as a done case from 5 slices)."""
    uid, files = series
    datasets = _counted(files, **{count: len(files)})
    run = tmp_path / "run"
    outcomes: list = []
    clock = _limit_clock(monkeypatch)
    with (
        caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"),
        _listener(run, **_OPTS, **{"pacs.series_limit_s": 3600.0}) as lst,
    ):
        lst.on_series = outcomes.append
        assert _send(lst.port, datasets[:5], end="abort") == [0] * 5
        deadline = time.monotonic() + 60
        while "A-ABORT" not in _note(run, uid) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.4)  # past the quiet period, before the limit
        assert lst.step() == [] and not outcomes
        held = _note(run, uid)
        assert "sender cut off" in held and f"5 of {len(files)}" in held and count in held, held
        clock["ahead"] = 3600.0  # the limit is over
        _until(lambda: bool(outcomes), lst)
    assert [o.status for o in outcomes] == ["quarantined"], [o.line() for o in outcomes]
    line = outcomes[0].line()
    for part in ("PartialSeriesError", f"5 of {len(files)}", "MODALITY", "A-ABORT", "send the series again"):
        assert part in line, (part, line)
    warned = [r for r in caplog.records if getattr(r, "event", None) == "listen_cut" and r.levelno == logging.WARNING]
    assert len(warned) == 1 and f"5 of {len(files)}" in warned[0].getMessage(), [r.getMessage() for r in warned]


def test_the_rest_sent_after_an_abort_short_of_the_count_completes_the_series(series, tmp_path):
    """The operator sends the series again after stopping it (the same sender, ending with an A-ABORT again): with
    every instance now in, as many as the count, the series is processed as a done case."""
    uid, files = series
    datasets = _counted(files, ImagesInAcquisition=len(files))
    run = tmp_path / "run"
    outcomes: list = []
    with _listener(run, **_OPTS, **{"pacs.series_limit_s": 3600.0}) as lst:
        lst.on_series = outcomes.append
        assert _send(lst.port, datasets[:5], end="abort") == [0] * 5
        deadline = time.monotonic() + 60
        while "A-ABORT" not in _note(run, uid) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.4)
        assert lst.step() == []
        assert _send(lst.port, datasets, end="abort") == [0] * len(files)
        _until(lambda: bool(outcomes), lst)
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", len(files))], [o.line() for o in outcomes]


def test_a_whole_series_carrying_its_count_from_a_sender_that_aborts_is_processed(series, tmp_path, caplog):
    """Every instance, as many as Images in Acquisition says, then the sender's A-ABORT: processed as a done case,
    no cut-off warning."""
    _, files = series
    datasets = _counted(files, ImagesInAcquisition=len(files))
    outcomes: list = []
    with (
        caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"),
        _listener(tmp_path / "run", **_OPTS, **{"pacs.series_limit_s": 1.0}) as lst,
    ):
        lst.on_series = outcomes.append
        assert _send(lst.port, datasets, end="abort") == [0] * len(files)
        _until(lambda: bool(outcomes), lst)
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", len(files))], [o.line() for o in outcomes]
    assert not [r for r in caplog.records if getattr(r, "event", None) == "listen_cut"]


def test_dcmtk_storescu_aborting_before_the_end_of_a_counted_series_has_it_quarantined(series, tmp_path):
    """dcmtk's ``storescu --abort`` sending 5 of 8 files that each say ImagesInAcquisition 8 (as a send stopped
    part-way, then ended with an A-ABORT): quarantined with the count, not processed."""
    import shutil
    import subprocess

    exe = shutil.which("storescu")
    if exe is None:
        pytest.skip("dcmtk's storescu not installed: run `bash scripts/install_pacs_tools.sh`")
    uid, files = series
    folder = tmp_path / "sent"
    folder.mkdir()
    paths = []
    for n, (ds, _) in enumerate(_counted(files[:5], ImagesInAcquisition=len(files))):
        path = folder / f"{n:03d}.dcm"
        ds.save_as(path, enforce_file_format=True)
        paths.append(path)
    outcomes: list = []
    with _listener(tmp_path / "run", **_OPTS, **{"pacs.series_limit_s": 2.0}) as lst:
        lst.on_series = outcomes.append
        cmd = [exe, "--abort", "-aet", "MODALITY", "-aec", AET, HOST, str(lst.port), *map(str, paths)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert f"5 of {len(files)}" in _until_cut(tmp_path / "run", uid)  # the A-ABORT seen before the first step
        _until(lambda: bool(outcomes), lst)
    assert [o.status for o in outcomes] == ["quarantined"], [o.line() for o in outcomes]
    assert f"5 of {len(files)}" in outcomes[0].line(), outcomes[0].line()


def test_the_count_is_checked_per_acquisition_once_the_first_count_is_reached(series, tmp_path):
    """A series of two acquisitions of 4 images each (Images in Acquisition 4) of which 7 arrived: 7 is more than 4,
    and the second acquisition is still found short; all 8 are whole; instances with no count say nothing."""
    from pipeline.pacs.expected_count import shortfall

    _, files = series

    def folder(name: str, n: int, **counts: int) -> Path:
        out = tmp_path / name
        out.mkdir()
        for i, (ds, _) in enumerate(_counted(files[:n], **counts)):
            ds.AcquisitionNumber = 1 if i < 4 else 2
            ds.save_as(out / f"{i:03d}.dcm", enforce_file_format=True)
        return out

    short = shortfall(folder("short", 7, ImagesInAcquisition=4))
    assert short is not None and "3 of 4 image(s) of acquisition 2" in short, short
    assert shortfall(folder("whole", 8, ImagesInAcquisition=4)) is None
    assert shortfall(folder("uncounted", 5)) is None


def _abort_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "pipeline.pacs.listener" and "A-ABORT" in r.getMessage()]


def test_the_log_says_one_thing_of_a_series_held_short_after_an_abort(series, tmp_path, caplog):
    """5 of 8 instances, each saying 8, then the sender's A-ABORT: one line, a warning, says the association ended by
    the sender's A-ABORT with 5 of 8 received, held as cut off (was: an INFO line taking it as the end of the sending
    just before the warning that held it)."""
    uid, files = series
    run = tmp_path / "run"
    with (
        caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"),
        _listener(run, **_OPTS, **{"pacs.series_limit_s": 3600.0}) as lst,
    ):
        assert _send(lst.port, _counted(files, ImagesInAcquisition=len(files))[:5], end="abort") == [0] * 5
        deadline = time.monotonic() + 60
        while "A-ABORT" not in _note(run, uid) and time.monotonic() < deadline:
            time.sleep(0.05)
    lines = _abort_lines(caplog)
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING, [(r.levelname, r.getMessage()) for r in lines]
    said = lines[0].getMessage()
    for part in ("MODALITY", "ended by the sender's A-ABORT", f"5 of {len(files)}", "held as cut off", uid, "fix:"):
        assert part in said, (part, said)
    assert not [r for r in caplog.records if "taken as the end of its sending" in r.getMessage()]


def test_the_log_says_one_thing_of_a_whole_counted_series_after_an_abort(series, tmp_path, caplog):
    """Every instance, as many as Images in Acquisition says, then the sender's A-ABORT: one INFO line says the
    association ended by the sender's A-ABORT after all of them, processed; no warning."""
    uid, files = series
    with (
        caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"),
        _listener(tmp_path / "run", **_OPTS) as lst,
    ):
        assert _send(lst.port, _counted(files, ImagesInAcquisition=len(files)), end="abort") == [0] * len(files)
        deadline = time.monotonic() + 60
        while not _abort_lines(caplog) and time.monotonic() < deadline:
            time.sleep(0.05)
    lines = _abort_lines(caplog)
    assert len(lines) == 1 and lines[0].levelno == logging.INFO, [(r.levelname, r.getMessage()) for r in lines]
    said = lines[0].getMessage()
    for part in ("MODALITY", "ended by the sender's A-ABORT after all", f"{len(files)} instance(s)", "ImagesInAcquisition", uid):
        assert part in said, (part, said)
    assert "processed" in said and "held" not in said, said
