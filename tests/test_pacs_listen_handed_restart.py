"""A series ``ctpipe listen`` handed to the runner under a looser ``pacs.abort_count_check`` (or
``pacs.release_count_check``), whose listener died before the runner finished it, is judged at the restart by the
setting then in force, as a series still open is: held short of its count, it waits for the rest or is quarantined,
never published short, and is processed once. One the runner had finished before the listener died is left as it is:
recorded, not run again. The listener that dies is a real one in a child process, killed (SIGKILL) by its own code
path while the runner works on the case or just after the runner finished it; the sender is pynetdicom's C-STORE
client."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipeline.pacs.handover import one_generation_each
from pipeline.runner.resume import read_manifest
from tests._support.orthanc import write_phantom_series
from tests._support.runner import db_rows
from tests.test_pacs_listen_aborted_short import _OPTS, _counted, _note, _until
from tests.test_pacs_listen_receive import _limit_clock, _listener, _send

pytestmark = pytest.mark.pacs

REPO = Path(__file__).resolve().parent.parent
#: A series limit no test reaches unless it moves the limit's clock: a held series stays open.
_HELD = {**_OPTS, "pacs.series_limit_s": 3600.0}
#: The setting that left the count out, by how the sender ended its association.
_SETTING = {"abort": "pacs.abort_count_check", "release": "pacs.release_count_check"}

#: The listener that dies: on RUN with SETTING none, it prints its port and steps only once told to (a line on its
#: input), so that the sender's end is taken before the series is handed over; then its process is killed at AT:
#: ``running`` as the runner starts the case (``grown``: once told to, a second line, the rest of the series received
#: meanwhile), ``finished`` once the runner has finished it, before the listener records it, ``published`` once the
#: runner has put the case's folder in place, before it records the case done.
CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from pipeline.pacs.journal import ReceiveJournal
    from pipeline.runner.store import RunStore
    from tests.test_pacs_listen_receive import _listener

    run, at, setting = sys.argv[1:4]

    def killed(*args, **kwargs):
        if at == "grown":
            sys.stdin.readline()
        os.kill(os.getpid(), signal.SIGKILL)

    if at in ("running", "grown"):
        RunStore.begin_case = killed
    elif at == "published":
        RunStore.complete_case = killed
    else:
        ReceiveJournal.processed = killed
    opts = {"pacs.quiet_period_s": 0.2, "ingest.min_slices": 3, "pacs.series_limit_s": 3600.0, setting: "none"}
    lst = _listener(Path(run), **opts).start()
    print(lst.port, flush=True)
    sys.stdin.readline()
    lst.serve_forever()
    """
)


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> tuple[str, list[Path]]:
    return write_phantom_series(tmp_path_factory.mktemp("handed_restart") / "case", 48, slices=8)


def _events(caplog, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


def _ledger(run: Path, sql: str) -> list[tuple]:
    ledger = run / "pacs" / "ledger.sqlite"
    if not ledger.is_file():
        return []
    with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as db:
        return db.execute(sql).fetchall()


def _recorded_end(run: Path, generation: int = 1) -> dict | None:
    """The sender's end the listener recorded for the series' ``generation`` (``series.aborted``), or None."""
    rows = _ledger(run, f"SELECT aborted FROM series WHERE generation = {generation}")
    return json.loads(rows[0][0]) if rows and rows[0][0] else None


def _polled(pred) -> None:
    deadline = time.monotonic() + 60
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.05)


def _died_handed(run: Path, datasets: list, *, end: str, at: str, rest: list | None = None) -> None:
    """``datasets`` sent to a listener on ``run`` whose setting leaves the counts out after ``end``; the listener hands
    the series over and its process is killed at ``at`` (see :data:`CHILD`): the series stays handed in its ledger.
    ``rest``: sent (and released) once the series is handed over, before the kill (at ``grown``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [sys.executable, "-c", CHILD, str(run), at, _SETTING[end]]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=REPO)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port = int(proc.stdout.readline())
        assert _send(port, datasets, end=end) == [0] * len(datasets)
        _polled(lambda: (_recorded_end(run) or {}).get("end") == end)
        assert (_recorded_end(run) or {}).get("n") == len(datasets), _recorded_end(run)
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        if rest is not None:
            _polled(lambda: _ledger(run, "SELECT state FROM series") == [("handed",)])
            assert _send(port, rest) == [0] * len(rest)
            _polled(lambda: (_recorded_end(run, 2) or {}).get("n") == len(rest))
            assert (_recorded_end(run, 2) or {}).get("end") == "release", _recorded_end(run, 2)
            proc.stdin.write(b"die\n")
            proc.stdin.flush()
        assert proc.wait(timeout=120) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    states = _ledger(run, "SELECT state FROM series ORDER BY generation")
    assert states == [("handed",)] + ([("open",)] if rest is not None else []), states


@pytest.mark.slow  # a listener killed in a child process, then restarted
@pytest.mark.parametrize(("end", "then"), [("abort", "rest"), ("release", "limit")])
def test_a_series_handed_under_a_looser_setting_and_not_finished_is_held_after_a_restart_with_a_stricter_one(
    series, tmp_path, caplog, monkeypatch, end, then
):
    """5 of 8 slices, each saying Images in Acquisition 8, then the sender's A-ABORT (or release), accepted with no
    count checked and handed over; the listener killed as the runner starts the case. Restarted with the default
    setting, the series is held as cut off with the note and warning of a live hold, not handed over again (was:
    processed as a done case from 5 slices); the rest arriving completes it, processed once whole, or, never sent,
    it is quarantined after pacs.series_limit_s with the count."""
    uid, files = series
    datasets = _counted(files, ImagesInAcquisition=len(files))
    run = tmp_path / "run"
    _died_handed(run, datasets[:5], end=end, at="running")
    assert db_rows(run, "SELECT status FROM cases") == [("pending",)]  # registered, not started
    clock = _limit_clock(monkeypatch)
    caplog.clear()
    outcomes: list = []
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(run, **_HELD) as lst:
        lst.on_series = outcomes.append
        time.sleep(0.4)  # past the quiet period
        assert lst.step() == [] and not outcomes
        held = _note(run, uid)
        how = "A-ABORT" if end == "abort" else "released its association"
        for part in ("sender cut off", "MODALITY", how, f"5 of {len(files)}", _SETTING[end]):
            assert part in held, (part, held)
        warned = [r for r in _events(caplog, "listen_cut") if r.levelno == logging.WARNING]
        assert len(warned) == 1 and uid in warned[0].getMessage(), [r.getMessage() for r in warned]
        (summary,) = _events(caplog, "listen_recover")
        assert "1 series handed to the runner and not finished by it held" in summary.getMessage(), summary.getMessage()
        if then == "rest":
            assert _send(lst.port, datasets[5:]) == [0] * (len(files) - 5)
        else:
            clock["ahead"] = 3600.0  # the limit is over
        _until(lambda: bool(outcomes), lst)
        time.sleep(0.4)
        assert lst.step() == []  # nothing handed over again
    if then == "rest":
        assert [(o.status, o.n_instances) for o in outcomes] == [("done", len(files))], [o.line() for o in outcomes]
    else:
        assert [o.status for o in outcomes] == ["quarantined"], [o.line() for o in outcomes]
        for part in ("PartialSeriesError", f"5 of {len(files)}", "MODALITY", "send the series again"):
            assert part in outcomes[0].line(), (part, outcomes[0].line())
    assert [s for (s,) in db_rows(run, "SELECT status FROM cases")] == ["done" if then == "rest" else "failed"]


@pytest.mark.slow  # a listener killed in a child process, then restarted
@pytest.mark.parametrize("at", ["finished", "published"])
def test_a_series_the_runner_finished_before_the_listener_died_is_left_as_it_is(series, tmp_path, caplog, at):
    """The same 5 of 8 slices accepted with no count checked, handed over and processed by the runner, the listener
    killed before it recorded that (or the runner killed once the case's folder was in place, before it recorded the
    case done): the restart with the default setting does not hold it; it is recorded done from the run store (the
    folder adopted), its case not run again."""
    uid, files = series
    run = tmp_path / "run"
    _died_handed(run, _counted(files, ImagesInAcquisition=len(files))[:5], end="release", at=at)
    assert db_rows(run, "SELECT status FROM cases") == [("done" if at == "finished" else "running",)]
    attempts = db_rows(run, "SELECT COUNT(*) FROM stage_attempts")
    caplog.clear()
    outcomes: list = []
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(run, **_HELD) as lst:
        lst.on_series = outcomes.append
        _until(lambda: bool(outcomes), lst)
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", 5)], [o.line() for o in outcomes]
    assert "sender cut off" not in _note(run, uid)
    assert not _events(caplog, "listen_cut"), [r.getMessage() for r in _events(caplog, "listen_cut")]
    assert db_rows(run, "SELECT COUNT(*) FROM stage_attempts") == attempts


def test_two_generations_of_a_series_go_to_the_runner_in_batches_of_their_own_the_older_first():
    """Handed generations as a round takes them (a crash's handed ones first, by their last instance): each runner
    batch holds one generation of a series at most, older ones in earlier batches, the others in the round's order."""
    rows = [{"series_uid": s, "generation": g} for s, g in [("A", 2), ("B", 1), ("A", 1), ("C", 3), ("A", 3)]]
    parts = [[(r["series_uid"], r["generation"]) for r in part] for part in one_generation_each(rows)]
    assert parts == [[("B", 1), ("A", 1), ("C", 3)], [("A", 2)], [("A", 3)]]
    assert one_generation_each([]) == []


@pytest.mark.slow  # a listener killed in a child process, then restarted
@pytest.mark.parametrize("batch", ["as_quiet", "together"])
def test_a_series_handed_short_and_grown_since_is_quarantined_and_its_newer_generation_processed(series, tmp_path, caplog, batch):
    """5 of 8 slices (each saying 8) and the sender's A-ABORT, accepted with no count checked and handed over; the other
    3 arrive (generation 2, with the first 5) as the runner starts generation 1, and the listener is killed. Restarted
    with the default setting: generation 1 cannot wait for the rest, which generation 2 holds; it is quarantined with
    the count (was: published as a done case from 5 slices), and generation 2 is processed once, whole, in the same
    case. ``as_quiet``: the restarted listener's rounds take each generation as it is quiet, in one round or two;
    ``together``: generation 2 is quiet before the restarted listener's first round, which takes both generations
    at once (was: the runner took their instances as one case, generation 2's, and generation 1's line said it done)."""
    uid, files = series
    datasets = _counted(files, ImagesInAcquisition=len(files))
    run = tmp_path / "run"
    _died_handed(run, datasets[:5], end="abort", at="grown", rest=datasets[5:])
    caplog.clear()
    outcomes: list = []
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(run, **_HELD) as lst:
        lst.on_series = outcomes.append
        if batch == "together":
            assert lst.journal is not None
            _polled(lambda: [r["generation"] for r in lst.journal.quiet(_HELD["pacs.quiet_period_s"])] == [2])
            assert [r["generation"] for r in lst.step()] == [1, 2]
            assert len(outcomes) == 2, [o.line() for o in outcomes]
        _until(lambda: len(outcomes) >= 2, lst)
        assert lst.step() == []  # nothing handed over again
    said = [(o.generation, o.status, o.n_instances) for o in outcomes]
    assert said == [(1, "quarantined", 5), (2, "done", len(files))], [o.line() for o in outcomes]
    for part in ("PartialSeriesError", f"5 of {len(files)}", "A-ABORT", "generation 2"):
        assert part in outcomes[0].line(), (part, outcomes[0].line())
    warned = [r.getMessage() for r in _events(caplog, "listen_cut") if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "generation 2" in warned[0] and uid in warned[0], warned
    (summary,) = _events(caplog, "listen_recover")
    assert "1 such series handed over incomplete" in summary.getMessage(), summary.getMessage()
    assert db_rows(run, "SELECT status FROM cases") == [("done",)]
    # one case published, from generation 2's 8 instances; nothing of generation 1's 5
    ((key, case_id),) = db_rows(run, "SELECT case_key, case_id FROM cases WHERE status = 'done'")
    assert outcomes[1].case_id == case_id
    assert db_rows(run, f"SELECT n_instances FROM origins WHERE case_key = '{key}'") == [(len(files),)]
    assert [p.name for p in (run / "cases").iterdir()] == [case_id]
    assert read_manifest(run / "cases" / case_id)["case_key"] == key
    volume = json.loads((run / "cases" / case_id / "volume.json").read_text())
    assert volume["geometry"]["shape"][0] == volume["metadata"]["SourceFileCount"] == len(files), volume
    generations = _ledger(run, "SELECT generation, state, outcome, case_id FROM series ORDER BY generation")
    assert generations == [(1, "processed", "failed", case_id), (2, "processed", "done", case_id)], generations
