"""``ctpipe listen`` and a sender that releases its association (A-RELEASE) before sending the whole series: Orthanc
1.10's DICOM store job, cancelled part-way, releases it as one that finished does. Where the instances say how many
the series has (Images in Acquisition, Number of Series Related Instances) and fewer arrived, the series is held as cut
off (``pacs.release_count_check``), never published short; the rest arriving completes it, published once, whole. A
sender of one instance per association has its series processed once all arrive. Real senders: Orthanc's store job,
dcmtk's ``storescu`` and pynetdicom's C-STORE client."""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests._support.orthanc import HOST, write_phantom_series
from tests.test_pacs_listen_aborted_short import _OPTS, _counted, _note, _until
from tests.test_pacs_listen_receive import AET, _listener, _send

pytestmark = pytest.mark.pacs
pytest_plugins = ["tests._support.orthanc"]

SERIES, ACQUISITION = "NumberOfSeriesRelatedInstances", "ImagesInAcquisition"
#: A series limit no test reaches: a held series stays open.
_HELD = {**_OPTS, "pacs.series_limit_s": 3600.0}


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> tuple[str, list[Path]]:
    return write_phantom_series(tmp_path_factory.mktemp("released") / "case", 47, slices=8)


@pytest.fixture(scope="module")
def counted_files(series, tmp_path_factory) -> list[Path]:
    """The series' 8 files, each saying Images in Acquisition 8, as a sender stores them."""
    _, files = series
    folder = tmp_path_factory.mktemp("counted")
    out = []
    for n, (ds, _) in enumerate(_counted(files, ImagesInAcquisition=len(files))):
        out.append(folder / f"{n:03d}.dcm")
        ds.save_as(out[-1], enforce_file_format=True)
    return out


def _events(caplog, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if getattr(r, "event", None) == event]


def _until_released_short(run: Path, uid: str) -> str:
    """The series' note once the listener has held it after the sender's release (polled)."""
    deadline = time.monotonic() + 60
    while "released its association" not in _note(run, uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _note(run, uid)


def _storescu(port: int, paths: list[Path]) -> None:
    exe = shutil.which("storescu")
    if exe is None:
        pytest.skip("dcmtk's storescu not installed: run `bash scripts/install_pacs_tools.sh`")
    cmd = [exe, "-aet", "MODALITY", "-aec", AET, HOST, str(port), *map(str, paths)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_store_job_cancelled_part_way_is_held_and_published_whole_once_the_rest_arrives(
    orthanc, series, counted_files, tmp_path, caplog
):
    """Orthanc pushes the 8 instances (each saying Images in Acquisition 8) and its job is cancelled after the third:
    Orthanc releases the association. The series is held as cut off (its note names the release, 3 of 8 and
    pacs.release_count_check), not processed once quiet, and warned of; pushed again, the 5 missing arrive and it is
    processed once, a done case of 8 instances (was: processed as a done case from 3 slices)."""
    uid, files = series
    orthanc.upload(counted_files)
    run = tmp_path / "run"
    outcomes: list = []
    third, cancelled = threading.Event(), threading.Event()
    opts = {**_HELD, "pacs.allowed_aets": [orthanc.aet]}
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(run, **opts) as lst:
        orthanc.add_modality("ctpipe-released", AET, lst.port)
        lst.on_series = outcomes.append
        store, stored = lst._store, []

        def held_at_the_third(adm, data, **kw):  # the third instance answered once the job's cancel is asked
            store(adm, data, **kw)
            stored.append(adm.sop_uid)
            if len(stored) == 3:
                third.set()
                assert cancelled.wait(8), "the store job was not cancelled"  # within Orthanc's DicomScuTimeout

        lst._store = held_at_the_third
        job = orthanc.push(uid, "ctpipe-released", asynchronous=True)
        assert third.wait(60), "Orthanc sent fewer than 3 instances"
        orthanc.rest("POST", f"/jobs/{job}/cancel", {})
        cancelled.set()
        held = _until_released_short(run, uid)
        for part in ("sender cut off", "ORTHANC", "released its association", f"3 of {len(files)}", ACQUISITION):
            assert part in held, (part, held)
        assert f"pacs.release_count_check: [{SERIES}]" in held, held
        deadline = time.monotonic() + 30
        while orthanc.get(f"/jobs/{job}").json()["State"] != "Failure" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert orthanc.get(f"/jobs/{job}").json()["State"] == "Failure"  # cancelled, not done
        time.sleep(0.4)  # past the quiet period
        assert lst.step() == [] and not outcomes
        warned = _events(caplog, "listen_cut")
        assert len(warned) == 1 and uid in warned[0] and "pacs.release_count_check" in warned[0], warned
        lst._store = store
        orthanc.push(uid, "ctpipe-released")  # sent again: 3 duplicates, the 5 missing
        _until(lambda: bool(outcomes), lst)
        time.sleep(0.4)
        lst.step()
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", len(files))], [o.line() for o in outcomes]
    assert len(_events(caplog, "listen_cut")) == 1


def test_storescu_sending_part_of_a_counted_series_then_releasing_has_it_held_until_the_rest(
    series, counted_files, tmp_path, caplog
):
    """dcmtk's ``storescu`` (it releases its association) sending 5 of 8 files that each say Images in Acquisition 8:
    held, not processed once quiet; then the other 3 on another association: processed once, whole."""
    uid, files = series
    run = tmp_path / "run"
    outcomes: list = []
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(run, **_HELD) as lst:
        lst.on_series = outcomes.append
        _storescu(lst.port, counted_files[:5])
        held = _until_released_short(run, uid)
        assert f"5 of {len(files)}" in held and "pacs.release_count_check" in held, held
        time.sleep(0.4)  # past the quiet period
        assert lst.step() == [] and not outcomes
        _storescu(lst.port, counted_files[5:])
        _until(lambda: bool(outcomes), lst)
        time.sleep(0.4)
        lst.step()
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", len(files))], [o.line() for o in outcomes]


@pytest.mark.parametrize("count", [ACQUISITION, SERIES])
def test_a_series_released_short_of_its_count_is_quarantined_not_published(series, tmp_path, monkeypatch, count):
    """5 of 8 instances saying 8 (either count), then a release, nothing more: quarantined after pacs.series_limit_s
    (PartialSeriesError) with the release, 5 of 8 and the setting to change (was: a done case of 5 slices)."""
    from tests.test_pacs_listen_receive import _limit_clock

    uid, files = series
    run = tmp_path / "run"
    outcomes: list = []
    clock = _limit_clock(monkeypatch)
    with _listener(run, **_HELD) as lst:
        lst.on_series = outcomes.append
        assert _send(lst.port, _counted(files, **{count: len(files)})[:5]) == [0] * 5
        assert count in _until_released_short(run, uid)
        time.sleep(0.4)  # past the quiet period, before the limit
        assert lst.step() == [] and not outcomes
        clock["ahead"] = 3600.0  # the limit is over
        _until(lambda: bool(outcomes), lst)
    assert [o.status for o in outcomes] == ["quarantined"], [o.line() for o in outcomes]
    said = outcomes[0].line()
    for part in ("PartialSeriesError", "released its association", f"5 of {len(files)}", "pacs.release_count_check"):
        assert part in said, (part, said)


@pytest.mark.parametrize("setting", ["none", [SERIES]])
def test_with_the_count_not_checked_after_a_release_the_series_is_published_as_before(series, tmp_path, caplog, setting):
    """pacs.release_count_check leaving Images in Acquisition out: 5 of 8 saying 8, released, processed as a done
    case of 5 slices, nothing held or warned of."""
    _, files = series
    outcomes: list = []
    opts = {**_HELD, "pacs.release_count_check": setting}
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(tmp_path / "run", **opts) as lst:
        lst.on_series = outcomes.append
        assert _send(lst.port, _counted(files, ImagesInAcquisition=len(files))[:5]) == [0] * 5
        _until(lambda: bool(outcomes), lst)
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", 5)], [o.line() for o in outcomes]
    assert not _events(caplog, "listen_cut") and not _events(caplog, "listen_released_short")


def test_a_series_sent_one_instance_per_association_is_processed_once_all_arrive(series, tmp_path, caplog):
    """Each of the 8 instances (saying Images in Acquisition 8) on an association of its own, each released: every
    association but the last leaves the series short (one INFO line each); the last makes the count and ends the
    hold, and the series is processed once, whole, with no cut-off warning."""
    uid, files = series
    run = tmp_path / "run"
    outcomes: list = []
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(run, **_HELD) as lst:
        lst.on_series = outcomes.append
        for one in _counted(files, ImagesInAcquisition=len(files)):
            assert _send(lst.port, [one]) == [0]
        deadline = time.monotonic() + 60
        while _note(run, uid) and time.monotonic() < deadline:  # the last release's end lifts the hold
            time.sleep(0.05)
        assert not _note(run, uid), _note(run, uid)
        _until(lambda: bool(outcomes), lst)
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", len(files))], [o.line() for o in outcomes]
    assert not _events(caplog, "listen_cut")
    assert len(_events(caplog, "listen_released_short")) == len(files) - 1


def test_a_restart_judges_a_series_held_after_a_release_by_the_release_setting(series, tmp_path, caplog):
    """Held short after a release; restarted with pacs.abort_count_check: none (the release setting unchanged): still
    held; restarted with pacs.release_count_check: none: its hold is lifted and it is processed once quiet, one INFO
    line naming pacs.release_count_check."""
    uid, files = series
    run = tmp_path / "run"
    with _listener(run, **_HELD) as lst:
        assert _send(lst.port, _counted(files, ImagesInAcquisition=len(files))[:5]) == [0] * 5
        _until_released_short(run, uid)
    with _listener(run, **_HELD, **{"pacs.abort_count_check": "none"}) as lst:
        time.sleep(0.4)  # past the quiet period
        assert lst.step() == []
    assert "released its association" in _note(run, uid), _note(run, uid)
    outcomes: list = []
    opts = {**_HELD, "pacs.release_count_check": "none"}
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(run, **opts) as lst:
        lst.on_series = outcomes.append
        _until(lambda: bool(outcomes), lst)
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", 5)], [o.line() for o in outcomes]
    lifted = _events(caplog, "listen_hold_lifted")
    assert len(lifted) == 1 and "pacs.release_count_check: none" in lifted[0], lifted


def _recorded_end(run: Path, uid: str) -> str:
    """The series' recorded end of its last association (the ledger's ``series.aborted``), once there is one
    (polled)."""
    import sqlite3

    deadline = time.monotonic() + 60
    value = ""
    while not value and time.monotonic() < deadline:
        with sqlite3.connect(f"file:{run / 'pacs' / 'ledger.sqlite'}?mode=ro", uri=True) as db:
            row = db.execute("SELECT aborted FROM series WHERE series_uid = ?", (uid,)).fetchone()
        value = str(row[0] or "") if row else ""
        time.sleep(0.05)
    return value


def test_a_series_released_under_no_count_check_is_held_after_a_restart_that_checks_it(series, tmp_path, caplog):
    """5 of 8 saying 8, released to a listener with pacs.release_count_check: none, still open when the listener
    restarts with the default: held as cut off with the note a live hold gives (the release, 5 of 8, the setting),
    warned of once quiet, not processed (was: processed as a done case from 5 slices)."""
    uid, files = series
    run = tmp_path / "run"
    with _listener(run, **_HELD, **{"pacs.release_count_check": "none"}) as lst:
        assert _send(lst.port, _counted(files, ImagesInAcquisition=len(files))[:5]) == [0] * 5
        assert '"release"' in _recorded_end(run, uid)
    assert not _note(run, uid)
    outcomes: list = []
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(run, **_HELD) as lst:
        lst.on_series = outcomes.append
        time.sleep(0.4)  # past the quiet period
        assert lst.step() == [] and not outcomes
    held = _note(run, uid)
    for part in ("sender cut off", "MODALITY", "released its association", f"5 of {len(files)}", "pacs.release_count_check"):
        assert part in held, (part, held)
    warned = _events(caplog, "listen_cut")
    assert len(warned) == 1 and uid in warned[0], warned
    summary = _events(caplog, "listen_recover")
    assert len(summary) == 1 and "1 open series ended by a sender's A-ABORT or release" in summary[0], summary
