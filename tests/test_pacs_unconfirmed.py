"""Results recorded ``unconfirmed`` (a real Orthanc answered the C-STOREs with success and refused ctpipe's confirming
C-FIND) are not left so for good: a later pass whose confirming query is answered confirms them (recorded sent, with
the time, without sending them again), and with ``pacs.verify_sent: false`` they count as sent.

The Orthanc here refuses every C-FIND (its Lua ``IncomingFindRequestFilter`` raises an error: a failure status), as
an archive whose query permissions leave ctpipe out; it is then restarted without the filter, as the archive's
administrator corrects them, keeping what it stored.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import main
from pipeline.pacs.archive import Archive
from pipeline.pacs.ledger import Ledger
from pipeline.runner import open_run
from pipeline.runner.store import RunStore
from tests._support.orthanc import OrthancServer
from tests.test_dicom_out_sources import phantom_case
from tests.test_pacs_sender import _completed_case

pytest_plugins = ["tests._support.orthanc"]
pytestmark = pytest.mark.pacs

_REFUSE_QUERIES = """
function IncomingFindRequestFilter(query, origin)
  error("queries are not allowed to this AE title")
end
"""


_DROP_SR = """
function ReceivedInstanceFilter(dicom, origin, info)
  return dicom.Modality ~= "SR"
end
"""


class _QueriesRefused(OrthancServer):
    """An Orthanc that stores what ctpipe sends and refuses every C-FIND while ``refuse`` is set; with ``drop_sr``,
    it drops every SR it receives (answering success)."""

    refuse = True
    drop_sr = False

    def config(self) -> dict[str, Any]:
        lua = (_REFUSE_QUERIES if self.refuse else "") + (_DROP_SR if self.drop_sr else "")
        if not lua:
            return super().config()
        script = self.root / "filters.lua"
        script.write_text(lua)
        return {**super().config(), "LuaScripts": [str(script)]}


@pytest.fixture(scope="module")
def source_case(tmp_path_factory):
    return phantom_case(tmp_path_factory.mktemp("unconfirmed") / "case", n_nodules=1)


@pytest.fixture
def refusing(tmp_path):
    srv = _QueriesRefused(tmp_path / "orthanc").start()
    try:
        yield srv
    finally:
        srv.discard()


def _counting_stores(monkeypatch) -> list[int]:
    """The number of files in each :meth:`Archive.store` the sender makes (the real C-STORE runs)."""
    from pipeline.pacs import sender as sender_module

    calls: list[int] = []
    real_open = sender_module.open_archive

    def open_counting(*args: Any, **kwargs: Any) -> Archive:
        archive = real_open(*args, **kwargs)
        real_store = archive.store

        def store(paths: Any) -> Any:
            calls.append(len(paths))
            return real_store(paths)

        archive.store = store  # type: ignore[method-assign]
        return archive

    monkeypatch.setattr(sender_module, "open_archive", open_counting)
    return calls


def _states(run) -> dict[str, tuple[str, int, float, str | None]]:
    rows = Ledger(run).rows("SELECT sop_uid, state, attempts, updated_at, error FROM sent")
    return {r["sop_uid"]: (r["state"], int(r["attempts"]), float(r["updated_at"]), r["error"]) for r in rows}


def _send(run, dest: str, *extra: str) -> int:
    return main(["send", str(run), "--to", dest, "--set", "pacs.send_retries=0", "--timeout", "20", *extra])


def _sent_unconfirmed(refusing, source_case, tmp_path, monkeypatch) -> tuple[Path, dict[str, str], list[int], str]:
    """A completed case ``c1`` sent once to the ``refusing`` archive, its results recorded unconfirmed: the run
    folder, the results' instance UIDs, the C-STORE counts so far and the destination."""
    stores = _counting_stores(monkeypatch)
    run = tmp_path / "run"
    uids = _completed_case(run, "c1", source_case)
    RunStore(run).close()
    dest = refusing.dimse
    assert _send(run, dest) == 0
    assert {s[0] for s in _states(run).values()} == {"unconfirmed"}
    return run, uids, stores, dest


def test_unconfirmed_results_are_confirmed_by_a_later_pass_whose_query_is_answered(
    refusing, source_case, tmp_path, monkeypatch, capsys
):
    """Recorded unconfirmed while the archive refused the query; once it answers (its permissions corrected, the
    archive restarted), the next ``ctpipe send`` asks for them, finds them held and records them sent with the time
    of that confirmation, without sending them again (was: unconfirmed for good, whatever the archive said later)."""
    stores = _counting_stores(monkeypatch)
    run = tmp_path / "run"
    uids = _completed_case(run, "c1", source_case)
    RunStore(run).close()
    dest = refusing.dimse
    assert _send(run, dest) == 0
    first = _states(run)
    assert {s[0] for s in first.values()} == {"unconfirmed"}, first
    assert all(refusing.holds(uid) for uid in uids.values()) and stores == [len(uids)]
    capsys.readouterr()

    refusing.stop()
    refusing.refuse = False
    refusing.start()
    time.sleep(0.05)  # a later time than the first record's
    assert _send(run, dest) == 0
    out = capsys.readouterr().out
    assert f"results to {dest}: {len(uids)} sent, 0 pending, 0 failed" in out, out
    assert stores == [len(uids)]  # confirmed, not sent again
    later = _states(run)
    for uid in uids.values():
        state, attempts, updated_at, error = later[uid]
        assert (state, attempts, error) == ("sent", 1, None), later[uid]
        assert updated_at > first[uid][2], (updated_at, first[uid][2])
    deliveries = open_run(run).deliveries.set_index("sop_uid")
    assert set(deliveries.state) == {"sent"} and set(deliveries.attempts) == {1}, deliveries


def test_unconfirmed_results_count_as_sent_when_verify_sent_is_off(refusing, source_case, tmp_path, monkeypatch, capsys):
    """With ``pacs.verify_sent: false`` the archive's success answer alone counts: results recorded unconfirmed
    earlier (the query refused) count as sent, in the ledger, the run store and ``ctpipe send``'s summary, and are not
    sent again (was: still counted '2 stored unconfirmed', unlike the same results sent with the option off)."""
    run, uids, stores, dest = _sent_unconfirmed(refusing, source_case, tmp_path, monkeypatch)
    capsys.readouterr()
    assert _send(run, dest, "--set", "pacs.verify_sent=false") == 0
    out = capsys.readouterr().out
    assert f"results to {dest}: {len(uids)} sent, 0 pending, 0 failed" in out, out
    assert stores == [len(uids)]
    assert {s[:2] for s in _states(run).values()} == {("sent", 1)}
    assert set(open_run(run).deliveries.state) == {"sent"}


def test_unconfirmed_results_the_archive_answers_it_does_not_hold_are_failed_as_dropped(
    refusing, source_case, tmp_path, monkeypatch, capsys
):
    """An archive that dropped the SR (a filter, answering success) while refusing the query: once it answers, the
    SEG it holds is recorded sent and the SR failed as dropped, naming the instance and the cause, so that
    ``--retry-failed`` sends it again; neither is sent again by the confirming pass itself."""
    refusing.stop()
    refusing.drop_sr = True
    refusing.start()
    run, uids, stores, dest = _sent_unconfirmed(refusing, source_case, tmp_path, monkeypatch)
    refusing.stop()
    refusing.refuse = False
    refusing.start()
    capsys.readouterr()
    assert _send(run, dest) == 3
    assert stores == [len(uids)]
    states = _states(run)
    assert states[uids["seg"]][0] == "sent" and states[uids["sr"]][0] == "failed", states
    error = str(states[uids["sr"]][3])
    assert uids["sr"] in error and "answered success but does not hold it" in error and "--retry-failed" in error, error
    assert "asked again after it was stored unconfirmed" in error and "right after the send" not in error, error
    assert f"results to {dest}: 1 sent, 0 pending, 1 failed" in capsys.readouterr().out


class _Clock:
    """Seconds since the epoch, moved on by the test (the ledger's clock, as the sender and its re-checks read it)."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def _clock(monkeypatch) -> _Clock:
    """Give the sender and its re-check schedule a clock the test moves (no sleeps)."""
    import importlib

    clock = _Clock()
    for name in ("pipeline.pacs.sender", "pipeline.pacs.send_ledger", "pipeline.pacs.send_confirm", "pipeline.pacs.recheck"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        monkeypatch.setattr(module, "now", clock)
    return clock


def _counting_queries(monkeypatch) -> list[float]:
    """The (test clock) times at which the sender asks the archive which results it holds (the real queries run)."""
    from pipeline.pacs.confirm import Confirmer

    times: list[float] = []
    real_held = Confirmer.held

    def held(self: Confirmer, *args: Any, **kwargs: Any) -> Any:
        from pipeline.pacs import sender as sender_module

        times.append(sender_module.now())
        return real_held(self, *args, **kwargs)

    monkeypatch.setattr(Confirmer, "held", held)
    return times


@contextmanager
def _records() -> Iterator[list[logging.LogRecord]]:
    """The records ``pipeline.pacs`` logs meanwhile, at INFO and above (the CLI run before keeps them from caplog)."""
    records: list[logging.LogRecord] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger, handler = logging.getLogger("pipeline.pacs"), _Keep(logging.INFO)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _recheck_for(sender, clock: _Clock, start: float, *, hours: int, step_h: float = 1.0) -> None:
    for n in range(int(hours / step_h) + 1):
        clock.t = start + n * step_h * 3600.0
        sender.confirm_unconfirmed()


def test_results_an_archive_lists_nothing_of_are_asked_less_often_then_given_up_after_a_week(
    refusing, source_case, tmp_path, monkeypatch
):
    """An archive that lost what it stored (it lists nothing at any level, as one that stopped answering ctpipe's
    queries): a long-running sender asks for the results it recorded unconfirmed after 15 minutes, then doubling up to
    a day, and 7 days after they were recorded unconfirmed records them failed with the reason and the fix, asking no
    more (was: asked every 15 minutes for ever, unconfirmed for good)."""
    from pipeline.pacs import recheck
    from pipeline.pacs.sender import ResultSender
    from tests.test_pacs_sender import _cfg

    clock = _clock(monkeypatch)
    run = tmp_path / "run"
    uids = _completed_case(run, "c1", source_case)
    RunStore(run).close()
    dest = refusing.dimse
    t0 = clock.t
    assert _send(run, dest) == 0
    assert {s[0] for s in _states(run).values()} == {"unconfirmed"}
    refusing.discard()  # it loses everything it held, and answers queries again
    shutil.rmtree(refusing.root / "storage")
    shutil.rmtree(refusing.root / "index")
    refusing.refuse = False
    refusing.start()
    asked = _counting_queries(monkeypatch)
    sender = ResultSender(run, _cfg(**{"pacs.send_retries": 0}), destination=dest)
    try:
        with _records() as records:
            _recheck_for(sender, clock, t0 + 60.0, hours=8 * 24, step_h=0.25)
    finally:
        sender.close()
    gaps = [b - a for a, b in zip(asked, asked[1:], strict=False)]
    assert 8 <= len(asked) <= 16, [round(g / 3600, 2) for g in gaps]
    assert all(b >= a for a, b in zip(gaps, gaps[1:], strict=False)), gaps  # each wait at least the one before
    assert gaps[0] <= recheck.RECHECK_S + 900 and max(gaps) <= recheck.RECHECK_MAX_S + 900, gaps
    assert asked[-1] < t0 + recheck.GIVE_UP_S  # none after giving up
    states = _states(run)
    for uid in uids.values():
        state, attempts, _, error = states[uid]
        assert state == "failed", states[uid]
        assert "7 days" in str(error) and "no longer asked for" in str(error) and "--retry-failed" in str(error), error
        assert "pacs.verify_sent: false" in str(error), error
    assert set(open_run(run).deliveries.state) == {"failed"}
    given_up = [r for r in records if r.levelno == logging.ERROR and "no longer asked for" in r.getMessage()]
    assert len(given_up) == 1 and dest in given_up[0].getMessage(), [r.getMessage() for r in given_up]


def test_a_recheck_refused_again_is_warned_once_per_archive_and_asked_again_later(refusing, source_case, tmp_path, monkeypatch):
    """An archive that keeps refusing the confirming query: a long-running sender keeps asking (backing off), says
    the first refused re-check in a warning naming the archive and the next ones at INFO (was: the first refusal
    stopped re-checks for good, each at INFO only)."""
    from pipeline.pacs.sender import ResultSender
    from tests.test_pacs_sender import _cfg

    clock = _clock(monkeypatch)
    run = tmp_path / "run"
    _completed_case(run, "c1", source_case)
    RunStore(run).close()
    dest = refusing.dimse
    t0 = clock.t
    assert _send(run, dest) == 0
    asked = _counting_queries(monkeypatch)
    sender = ResultSender(run, _cfg(**{"pacs.send_retries": 0}), destination=dest)
    try:
        with _records() as records:
            _recheck_for(sender, clock, t0 + 60.0, hours=48)
    finally:
        sender.close()
    assert len(asked) >= 4, asked
    said = [r for r in records if "refused the confirming query again" in r.getMessage() or "stay unconfirmed" in r.getMessage()]
    warned = [r for r in said if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and dest in warned[0].getMessage(), [(r.levelname, r.getMessage()) for r in said]
    assert len([r for r in said if r.levelno == logging.INFO]) >= len(asked) - 1, [r.getMessage() for r in said]
    assert {s[0] for s in _states(run).values()} == {"unconfirmed"}


def test_a_result_recorded_unconfirmed_late_in_a_long_run_is_asked_for_on_its_own_schedule(
    refusing, source_case, tmp_path, monkeypatch
):
    """A listener running for days whose waits between re-checks have grown to a day: a case sent then and recorded
    unconfirmed is first asked for 15 minutes after it was recorded, its wait doubling from there, while the earlier
    case keeps its own day-long wait (was: one schedule per process, so the new case waited up to a day for its first
    re-check, and the earlier one was asked with it)."""
    from pipeline.pacs import recheck
    from pipeline.pacs.sender import ResultSender
    from tests.test_pacs_sender import _cfg

    clock = _clock(monkeypatch)
    run = tmp_path / "run"
    _completed_case(run, "c1", source_case)
    RunStore(run).close()
    asked: list[tuple[float, frozenset[str]]] = []
    real_ask = ResultSender.ask_again

    def ask_again(self: ResultSender, rows: list[dict[str, Any]], found: Any) -> None:
        asked.append((clock.t, frozenset(str(r["case_id"]) for r in rows)))
        real_ask(self, rows, found)

    monkeypatch.setattr(ResultSender, "ask_again", ask_again)
    sender = ResultSender(run, _cfg(**{"pacs.send_retries": 0}), destination=refusing.dimse)
    try:
        t0 = clock.t
        sender.scan()
        sender.send_due()
        assert {s[0] for s in _states(run).values()} == {"unconfirmed"}
        _recheck_for(sender, clock, t0 + 60.0, hours=3 * 24, step_h=0.25)
        c1_times = [t for t, cases in asked if "c1" in cases]
        assert len(c1_times) >= 5 and c1_times[-1] - c1_times[-2] >= recheck.RECHECK_MAX_S - 900, c1_times
        asked.clear()
        t1 = c1_times[-1] + 600.0  # just after a re-check: the earlier case's next one is a day away
        clock.t = t1
        _completed_case(run, "c2", source_case)
        sender.scan()
        sender.send_due()
        recorded = {s[0] for s in _states(run).values()}
        assert recorded == {"unconfirmed"}, recorded
        _recheck_for(sender, clock, t1, hours=4, step_h=0.25)
    finally:
        sender.close()
    c2_times = [t for t, cases in asked if "c2" in cases]
    assert c2_times and c2_times[0] - t1 <= recheck.RECHECK_S + 900, [round((t - t1) / 60) for t, _ in asked]
    assert len(c2_times) >= 2 and c2_times[1] - c2_times[0] >= 2 * recheck.RECHECK_S - 900, c2_times
    assert not [t for t, cases in asked if "c1" in cases], [(round((t - t1) / 60), sorted(c)) for t, c in asked]


def test_a_result_due_for_a_recheck_is_asked_when_due_after_a_fresh_refusal(refusing, source_case, tmp_path, monkeypatch):
    """A case recorded unconfirmed is due for its next re-check; a new case whose confirming query the archive
    refused just before (the later cases are then sent without asking for 15 minutes) does not push that re-check
    back: it is asked when due, and the line that says it stays unconfirmed gives the time it is asked next (was:
    asked up to 15 minutes late, the destination-wide pause holding back every re-check)."""
    from pipeline.pacs import recheck
    from pipeline.pacs.sender import ResultSender
    from tests.test_pacs_sender import _cfg

    clock = _clock(monkeypatch)
    run = tmp_path / "run"
    _completed_case(run, "c1", source_case)
    RunStore(run).close()
    asked: list[tuple[float, frozenset[str]]] = []
    real_ask = ResultSender.ask_again

    def ask_again(self: ResultSender, rows: list[dict[str, Any]], found: Any) -> None:
        asked.append((clock.t, frozenset(str(r["case_id"]) for r in rows)))
        real_ask(self, rows, found)

    monkeypatch.setattr(ResultSender, "ask_again", ask_again)
    queries = _counting_queries(monkeypatch)
    sender = ResultSender(run, _cfg(**{"pacs.send_retries": 0}), destination=refusing.dimse)
    try:
        t0 = clock.t
        sender.scan()
        sender.send_due()  # c1 refused: recorded unconfirmed
        _recheck_for(sender, clock, t0 + 60.0, hours=0.7, step_h=1 / 60)  # re-checked (refused) after 15 minutes
        first = [t for t, cases in asked if "c1" in cases]
        due = recheck.next_due(t0, first[-1])
        assert len(first) == 1 and due > clock.t, ([round((t - t0) / 60) for t in first], due - t0)
        asked.clear()
        clock.t = due - 30.0  # c2 completes just before c1's next re-check: its confirming query refused afresh
        _completed_case(run, "c2", source_case)
        n_queries = len(queries)
        sender.scan()
        sender.send_due()
        assert len(queries) > n_queries and {s[0] for s in _states(run).values()} == {"unconfirmed"}
        with _records() as records:
            _recheck_for(sender, clock, due - 30.0, hours=1, step_h=1 / 60)
    finally:
        sender.close()
    c1_times = [t for t, cases in asked if "c1" in cases]
    assert c1_times and c1_times[0] <= due + 60.0, [round((t - due) / 60, 1) for t in c1_times]
    stated = [r.getMessage() for r in records if "stay unconfirmed" in r.getMessage()]
    next_c1 = recheck.next_due(t0, c1_times[0])
    assert any(recheck._utc(next_c1) in m for m in stated), (recheck._utc(next_c1), stated)


def test_retry_unconfirmed_sends_results_recorded_unconfirmed_again(refusing, source_case, tmp_path, monkeypatch, capsys):
    """An archive that answered success, refused the confirming query and then lost what it stored (it lists nothing
    of the results at any level): ``ctpipe send --retry-unconfirmed`` sends the results recorded unconfirmed again and
    records them sent once the archive, now answering queries, holds them; the unconfirmed count on stderr names the
    option (was: no way to send them again before they were given up after 7 days, ``--retry-failed`` skipping
    them)."""
    run, uids, stores, dest = _sent_unconfirmed(refusing, source_case, tmp_path, monkeypatch)
    assert "--retry-unconfirmed" in capsys.readouterr().err
    refusing.discard()  # it loses everything it held, and answers queries again
    shutil.rmtree(refusing.root / "storage")
    shutil.rmtree(refusing.root / "index")
    refusing.refuse = False
    refusing.start()
    assert not any(refusing.holds(uid) for uid in uids.values())
    assert _send(run, dest, "--retry-failed") == 0  # not failed: left as they are
    assert {s[0] for s in _states(run).values()} == {"unconfirmed"} and stores == [len(uids)]
    capsys.readouterr()
    assert _send(run, dest, "--retry-unconfirmed") == 0
    out = capsys.readouterr().out
    assert f"results to {dest}: {len(uids)} sent, 0 pending, 0 failed" in out, out
    assert stores == [len(uids), len(uids)]
    assert all(refusing.holds(uid) for uid in uids.values())
    assert {s[0] for s in _states(run).values()} == {"sent"}
    assert set(open_run(run).deliveries.state) == {"sent"}
