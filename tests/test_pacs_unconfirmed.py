"""Results recorded ``unconfirmed`` (a real Orthanc answered the C-STOREs with success and refused ctpipe's confirming
C-FIND) are not left so for good: a later pass whose confirming query is answered confirms them (recorded sent, with
the time, without sending them again), and with ``pacs.verify_sent: false`` they count as sent.

The Orthanc here refuses every C-FIND (its Lua ``IncomingFindRequestFilter`` raises an error: a failure status), as
an archive whose query permissions leave ctpipe out; it is then restarted without the filter, as the archive's
administrator corrects them, keeping what it stored.
"""

from __future__ import annotations

import time
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
        srv.stop()


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
    stores = _counting_stores(monkeypatch)
    run = tmp_path / "run"
    uids = _completed_case(run, "c1", source_case)
    RunStore(run).close()
    dest = refusing.dimse
    assert _send(run, dest) == 0
    assert {s[0] for s in _states(run).values()} == {"unconfirmed"}
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
    stores = _counting_stores(monkeypatch)
    run = tmp_path / "run"
    uids = _completed_case(run, "c1", source_case)
    RunStore(run).close()
    dest = refusing.dimse
    assert _send(run, dest) == 0
    assert {s[0] for s in _states(run).values()} == {"unconfirmed"}
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
