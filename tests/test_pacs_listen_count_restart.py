"""``pacs.abort_count_check`` made stricter across a restart of ``ctpipe listen``: a series whose sender ended with an
A-ABORT, accepted under a looser setting and still open when the listener restarts, is judged against the setting now
in force (the ledger records the A-ABORT and the counts its instances gave); a ledger written before it recorded them
is read, its open series judged as if their sender had ended with an A-ABORT. Real sender: pynetdicom's C-STORE
client."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

import pytest

from tests._support.orthanc import write_phantom_series
from tests.test_pacs_listen_aborted_short import _OPTS, _counted, _note, _until
from tests.test_pacs_listen_receive import _listener, _send

pytestmark = pytest.mark.pacs

SERIES, ACQUISITION = "NumberOfSeriesRelatedInstances", "ImagesInAcquisition"
#: The first listener never steps: what it received is still open when the next one starts.
_OPEN = {**_OPTS, "pacs.series_limit_s": 3600.0}


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> tuple[str, list[Path]]:
    return write_phantom_series(tmp_path_factory.mktemp("count_restart") / "case", 15, slices=8)


def _events(caplog, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


def _accepted_open(run: Path, datasets: list, setting: object, caplog) -> None:
    """``datasets`` sent to a listener on ``run`` with ``pacs.abort_count_check = setting``, then the sender's A-ABORT;
    returns once the listener has taken that end (its INFO line), the series still open (the listener never steps)."""
    with (
        caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"),
        _listener(run, **_OPEN, **{"pacs.abort_count_check": setting}) as lst,
    ):
        assert _send(lst.port, datasets, end="abort") == [0] * len(datasets)
        deadline = time.monotonic() + 60
        while not _events(caplog, "listen_aborted") and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(_events(caplog, "listen_aborted")) == 1, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("accepted_with", ["none", [SERIES]])
def test_a_series_accepted_under_a_looser_setting_is_held_after_a_restart_with_a_stricter_one(
    series, tmp_path, caplog, accepted_with
):
    """5 of 8 slices, each saying Images in Acquisition 8, then the sender's A-ABORT, accepted with that count not
    checked; the listener restarted (the series still open) with the default setting: the series is held as cut off,
    with the warning and the note a live hold gives (the sender, the A-ABORT, 5 of 8, the fix), not processed once
    quiet (was: processed as a done case from 5 slices)."""
    uid, files = series
    run = tmp_path / "run"
    _accepted_open(run, _counted(files, ImagesInAcquisition=len(files))[:5], accepted_with, caplog)
    assert not _note(run, uid)
    caplog.clear()
    outcomes: list = []
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(run, **_OPEN) as lst:
        lst.on_series = outcomes.append
        time.sleep(0.4)  # past the quiet period
        assert lst.step() == [] and not outcomes
    held = _note(run, uid)
    for part in ("sender cut off", "MODALITY", "A-ABORT", f"5 of {len(files)}", f"pacs.abort_count_check: [{SERIES}]"):
        assert part in held, (part, held)
    warned = _events(caplog, "listen_cut")
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING, [r.getMessage() for r in warned]
    said = warned[0].getMessage()
    for part in ("MODALITY", "ended by the sender's A-ABORT", f"5 of {len(files)}", "held as cut off", uid, "fix:"):
        assert part in said, (part, said)
    summary = _events(caplog, "listen_recover")
    assert len(summary) == 1 and "1 open series ended by a sender's A-ABORT" in summary[0].getMessage(), summary


def test_a_looser_setting_after_that_releases_it_again(series, tmp_path, caplog):
    """Accepted with no count checked, held after a restart with the default setting, then restarted with no count
    checked again: the hold is lifted and the series processed as a done case once quiet, nothing sent again."""
    uid, files = series
    run = tmp_path / "run"
    _accepted_open(run, _counted(files, ImagesInAcquisition=len(files))[:5], "none", caplog)
    with _listener(run, **_OPEN):
        pass
    assert "A-ABORT" in _note(run, uid), _note(run, uid)
    outcomes: list = []
    with _listener(run, **_OPEN, **{"pacs.abort_count_check": "none"}) as lst:
        lst.on_series = outcomes.append
        _until(lambda: bool(outcomes), lst)
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", 5)], [o.line() for o in outcomes]


def test_a_whole_series_accepted_so_is_not_held_after_the_restart(series, tmp_path, caplog):
    """Every instance, as many as Images in Acquisition says, then the A-ABORT, accepted with no count checked: the
    restart with the default setting finds it whole and processes it once quiet."""
    _, files = series
    run = tmp_path / "run"
    _accepted_open(run, _counted(files, ImagesInAcquisition=len(files)), "none", caplog)
    outcomes: list = []
    with _listener(run, **_OPEN) as lst:
        lst.on_series = outcomes.append
        _until(lambda: bool(outcomes), lst)
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", len(files))], [o.line() for o in outcomes]


def test_a_series_released_by_its_sender_is_not_judged_by_the_abort_setting_after_a_restart(series, tmp_path):
    """5 of 8 slices saying 8, the association released with no count checked after a release
    (pacs.release_count_check: none), the listener restarted before the series was quiet with the default
    pacs.abort_count_check: still processed as a done case, not held as after an A-ABORT."""
    _, files = series
    run = tmp_path / "run"
    unchecked = {**_OPEN, "pacs.release_count_check": "none"}
    with _listener(run, **unchecked) as lst:
        assert _send(lst.port, _counted(files, ImagesInAcquisition=len(files))[:5]) == [0] * 5
    outcomes: list = []
    with _listener(run, **unchecked) as lst:
        lst.on_series = outcomes.append
        _until(lambda: bool(outcomes), lst)
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", 5)], [o.line() for o in outcomes]


def _without_the_record(run: Path, how: str) -> None:
    """The run's ledger without a readable A-ABORT record: ``before`` as ctpipe wrote it before it recorded a sender's
    A-ABORT per series (no ``aborted`` column), ``unreadable`` with a value that cannot be read in it."""
    with sqlite3.connect(run / "pacs" / "ledger.sqlite") as db:
        if how == "before":
            db.execute("ALTER TABLE series DROP COLUMN aborted")
        else:
            db.execute("UPDATE series SET aborted = '{\"sender\": '")


@pytest.mark.parametrize("how", ["before", "unreadable"])
def test_an_open_series_of_a_ledger_without_the_record_is_judged_as_if_its_sender_had_aborted(series, tmp_path, caplog, how):
    """A ledger written before the A-ABORT was recorded per series is read (the column added): its open series short
    of a count checked is held as cut off (how its sender's association ended is unknown: judged as after an A-ABORT,
    never published as whole), its note and warning saying so, with the fix; one whose instances give no count is
    processed once quiet. A record that cannot be read is taken so too."""
    uid, files = series
    short, uncounted = tmp_path / "short", tmp_path / "uncounted"
    _accepted_open(short, _counted(files, ImagesInAcquisition=len(files))[:5], "none", caplog)
    caplog.clear()
    _accepted_open(uncounted, _counted(files)[:5], "none", caplog)
    for run in (short, uncounted):
        _without_the_record(run, how)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(short, **_OPEN) as lst:
        time.sleep(0.4)  # past the quiet period
        assert lst.step() == []
    held = _note(short, uid)
    for part in ("sender cut off", "not recorded", f"5 of {len(files)}", f"pacs.abort_count_check: [{SERIES}]"):
        assert part in held, (part, held)
    warned = _events(caplog, "listen_cut")
    assert len(warned) == 1 and uid in warned[0].getMessage() and "fix:" in warned[0].getMessage(), warned
    assert len(_events(caplog, "listen_abort_record_unread")) == (how == "unreadable"), caplog.records
    outcomes: list = []
    with _listener(uncounted, **_OPEN) as lst:
        lst.on_series = outcomes.append
        _until(lambda: bool(outcomes), lst)
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", 5)], [o.line() for o in outcomes]


def test_a_record_written_before_releases_were_recorded_is_read_as_an_abort(series, tmp_path, caplog):
    """A sender's A-ABORT record as ctpipe wrote it before it recorded releases too (no ``end`` in it): read as an
    A-ABORT's, so the restart with the default setting holds the series short of its count, its note naming the
    A-ABORT and pacs.abort_count_check."""
    uid, files = series
    run = tmp_path / "run"
    _accepted_open(run, _counted(files, ImagesInAcquisition=len(files))[:5], "none", caplog)
    with sqlite3.connect(run / "pacs" / "ledger.sqlite") as db:
        assert db.execute("UPDATE series SET aborted = json_remove(aborted, '$.end')").rowcount == 1
        assert '"end"' not in db.execute("SELECT aborted FROM series").fetchone()[0]
    with _listener(run, **_OPEN) as lst:
        time.sleep(0.4)  # past the quiet period
        assert lst.step() == []
    held = _note(run, uid)
    for part in ("sender cut off", "A-ABORT", f"5 of {len(files)}", f"pacs.abort_count_check: [{SERIES}]"):
        assert part in held, (part, held)
