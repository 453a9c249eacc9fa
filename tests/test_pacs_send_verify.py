"""Results recorded sent only once the destination holds them (``pacs.verify_sent``).

An archive can answer C-STORE or STOW-RS success and not keep the instance: here a real Orthanc whose Lua
``ReceivedInstanceFilter`` drops structured reports (Orthanc 1.10 answers success for a filtered instance over
both protocols). The sender asks the archive right after each case (C-FIND at IMAGE level or QIDO-RS, one query
per case) and records what it does not hold as a failed attempt naming the instance, the archive and the cause. A
normal Orthanc gets everything recorded sent; a storage SCP that does not answer C-FIND fails with the option that
switches verification off, and with it off the success answer alone counts.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.cli import main
from pipeline.pacs.archive import Archive
from pipeline.pacs.ledger import Ledger
from pipeline.pacs.sender import ResultSender
from pipeline.runner import open_run
from pipeline.runner.store import RunStore
from tests._support.orthanc import OrthancServer
from tests.test_dicom_out_sources import phantom_case
from tests.test_pacs_sender import _cfg, _completed_case, _PickyStore

pytest_plugins = ["tests._support.orthanc"]
pytestmark = pytest.mark.pacs

_DROP_SR = """
function ReceivedInstanceFilter(dicom, origin, info)
  if dicom.Modality == "SR" then
    return false
  end
  return true
end
"""


class _FilteringOrthanc(OrthancServer):
    """An Orthanc whose Lua filter drops every SR it receives (and still answers success)."""

    def config(self) -> dict[str, Any]:
        script = self.root / "drop_sr.lua"
        script.write_text(_DROP_SR)
        return {**super().config(), "LuaScripts": [str(script)]}


@pytest.fixture(scope="module")
def filtering_orthanc(tmp_path_factory):
    srv = _FilteringOrthanc(tmp_path_factory.mktemp("orthanc-filter"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def source_case(tmp_path_factory):
    return phantom_case(tmp_path_factory.mktemp("verify") / "case", n_nodules=1)


def _counting_queries(monkeypatch) -> list[int]:
    """The number of instances asked about by each :meth:`Archive.held` query the sender makes (the real query runs)."""
    from pipeline.pacs import sender as sender_module

    calls: list[int] = []
    real_open = sender_module.open_archive

    def open_counting(*args: Any, **kwargs: Any) -> Archive:
        archive = real_open(*args, **kwargs)
        real_held = getattr(archive, "held", None)
        if real_held is None:  # a client that cannot ask: no query counted
            return archive

        def held(study_uid: str, sop_uids: Any) -> set[str]:
            calls.append(len(sop_uids))
            return real_held(study_uid, sop_uids)

        archive.held = held  # type: ignore[method-assign]
        return archive

    monkeypatch.setattr(sender_module, "open_archive", open_counting)
    return calls


@pytest.mark.parametrize("protocol", ["dicomweb", "dimse"])
def test_a_result_the_archive_answers_success_for_but_drops_is_not_recorded_sent(
    filtering_orthanc, source_case, tmp_path, monkeypatch, protocol
):
    for k, v in filtering_orthanc.env.items():
        monkeypatch.setenv(k, v)
    queries = _counting_queries(monkeypatch)
    run = tmp_path / "run"
    uids = _completed_case(run, "c1", source_case)
    RunStore(run).close()
    dest = filtering_orthanc.dicomweb if protocol == "dicomweb" else filtering_orthanc.dimse
    sender = ResultSender(run, _cfg(**{"pacs.send_retries": 0}), destination=dest)
    sender.scan()
    sender.send_due()
    counts = sender.close()
    assert not filtering_orthanc.holds(uids["sr"]) and filtering_orthanc.holds(uids["seg"])
    assert (counts.sent, counts.pending, counts.failed) == (1, 0, 1)
    assert queries == [2]  # one query for the case, asking about both results
    state = open_run(run).deliveries.set_index("sop_uid")
    assert state.state[uids["seg"]] == "sent" and state.state[uids["sr"]] == "failed"
    error = Ledger(run).one("SELECT error FROM sent WHERE sop_uid = ?", (uids["sr"],))["error"]
    assert uids["sr"] in error and dest in error and "answered success but does not hold it" in error
    assert "filter or routing rule on the archive dropped it" in error and "archive's log" in error
    assert "--retry-failed" in error and "pacs.verify_sent: false" not in error  # it answers IMAGE-level queries


def test_ctpipe_send_names_the_dropped_result_and_retries_it(filtering_orthanc, source_case, tmp_path, monkeypatch, capsys):
    """A dropped result stays pending while retries are left; once they are spent, ``ctpipe send`` names it."""
    for k, v in filtering_orthanc.env.items():
        monkeypatch.setenv(k, v)
    run = tmp_path / "run"
    uids = _completed_case(run, "c1", source_case)
    RunStore(run).close()
    dest = filtering_orthanc.dimse
    opts = ["--set", "pacs.backoff_s=0.05", "--set", "pacs.retries=0", "--timeout", "30"]
    rc = main(["send", str(run), "--to", dest, "--set", "pacs.send_retries=1", *opts])
    captured = capsys.readouterr()
    assert rc == 3 and "1 sent, 0 pending, 1 failed" in captured.out
    assert f"Comprehensive 3D SR {uids['sr']}" in captured.err and "filter or routing rule" in captured.err
    assert Ledger(run).one("SELECT attempts FROM sent WHERE sop_uid = ?", (uids["sr"],))["attempts"] == 2


@pytest.mark.parametrize("protocol", ["dicomweb", "dimse"])
def test_results_a_normal_archive_keeps_are_recorded_sent(orthanc, source_case, tmp_path, monkeypatch, protocol):
    for k, v in orthanc.env.items():
        monkeypatch.setenv(k, v)
    queries = _counting_queries(monkeypatch)
    run = tmp_path / "run"
    uids = _completed_case(run, "c1", source_case)
    _completed_case(run, "c2", source_case)
    sender = ResultSender(run, _cfg(), destination=orthanc.dicomweb if protocol == "dicomweb" else orthanc.dimse)
    sender.scan()
    sender.send_due()
    counts = sender.close()
    assert (counts.sent, counts.pending, counts.failed) == (4, 0, 0)
    assert queries == [2, 2]  # one per case
    assert all(orthanc.holds(u) for u in uids.values())


def test_an_archive_without_c_find_names_the_option_and_sends_with_it_off(source_case, tmp_path, capsys):
    """A storage SCP that takes the results but offers no C-FIND: recorded stored, unconfirmed, with how to switch
    verification off; with ``pacs.verify_sent: false``, a later case's results are recorded sent on its success
    answer, and the unconfirmed ones count as sent, not sent again."""
    run = tmp_path / "run"
    uids = _completed_case(run, "c1", source_case)
    RunStore(run).close()
    scp = _PickyStore(["1.2.840.10008.5.1.4.1.1.88.34", "1.2.840.10008.5.1.4.1.1.66.4"])
    try:
        dest = f"dimse://PICKY@127.0.0.1:{scp.port}"
        rc = main(["send", str(run), "--to", dest, "--set", "pacs.send_retries=0", "--timeout", "20"])
        err = capsys.readouterr().err
        assert rc == 0 and sorted(scp.received) == sorted(uids.values())
        assert "cannot confirm that the results sent were kept" in err and "pacs.verify_sent: false" in err
        later = _completed_case(run, "c2", source_case)
        rc = main(["send", str(run), "--to", dest, "--retry-failed", "--set", "pacs.verify_sent=false", "--timeout", "20"])
    finally:
        scp.close()
    assert rc == 0 and sorted(scp.received) == sorted([*uids.values(), *later.values()])
    state = open_run(run).deliveries.set_index("sop_uid").state
    assert {state[u] for u in [*uids.values(), *later.values()]} == {"sent"}  # the success answer alone counts


def test_verify_sent_is_an_option_on_by_default() -> None:
    from pipeline.config import load_config

    assert load_config(environ={}).pacs.verify_sent is True
    assert load_config(overrides={"pacs.verify_sent": False}, environ={}).pacs.verify_sent is False
