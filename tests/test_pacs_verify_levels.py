"""Confirming results sent to an archive that answers no IMAGE-level query, told apart from a real drop.

Many PACS do not support IMAGE-level C-FIND, or restrict it: they answer "no matches". Here a real Orthanc whose Lua
``IncomingFindRequestFilter`` turns every IMAGE-level query into one that matches nothing (SERIES level still
answers), some of them also dropping results on arrival (``ReceivedInstanceFilter``, answering success). What the
archive holds is recorded sent, confirmed by series, said once with the fix; what it dropped is failed as dropped.
Results stored at an archive that refuses the confirming query are recorded stored, unconfirmed, said once.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import pytest

from pipeline.cli import main
from pipeline.pacs.ledger import Ledger
from pipeline.pacs.sender import ResultSender
from pipeline.runner import open_run
from pipeline.runner.store import RunStore
from tests._support.orthanc import OrthancServer
from tests.test_dicom_out_sources import phantom_case
from tests.test_pacs_send_verify import _counting_queries
from tests.test_pacs_sender import _cfg, _completed_case, _PickyStore

pytest_plugins = ["tests._support.orthanc"]
pytestmark = pytest.mark.pacs

_NO_IMAGE_LEVEL = """
function IncomingFindRequestFilter(query, origin)
  if query["0008,0052"] == "IMAGE" then
    query["0008,0018"] = "1.2.3.4.5.6.7.8.9.0"
  end
  return query
end
"""

_REFUSE_IMAGE_LEVEL = """
function IncomingFindRequestFilter(query, origin)
  if query["0008,0052"] == "IMAGE" then
    error("IMAGE-level queries are not allowed here")
  end
  return query
end
"""


def _dropping(*modalities: str) -> str:
    cond = " or ".join(f'dicom.Modality == "{m}"' for m in modalities) or "false"
    return f"""
function ReceivedInstanceFilter(dicom, origin, info)
  if {cond} then
    return false
  end
  return true
end
"""


class _ImageLevelOff(OrthancServer):
    """An Orthanc that answers no IMAGE-level C-FIND with a match, and drops results of the modalities given."""

    drops: tuple[str, ...] = ()

    def config(self) -> dict[str, Any]:
        script = self.root / "restrict.lua"
        script.write_text(_NO_IMAGE_LEVEL + _dropping(*self.drops))
        return {**super().config(), "LuaScripts": [str(script)]}


class _ImageLevelRefused(OrthancServer):
    """An Orthanc that refuses every IMAGE-level C-FIND (its Lua filter raises an error: a failure status)."""

    def config(self) -> dict[str, Any]:
        script = self.root / "refuse.lua"
        script.write_text(_REFUSE_IMAGE_LEVEL)
        return {**super().config(), "LuaScripts": [str(script)]}


class _ImageLevelOffDropsAll(_ImageLevelOff):
    drops = ("SR", "SEG")


class _ImageLevelOffDropsSr(_ImageLevelOff):
    drops = ("SR",)


def _server(cls: type[OrthancServer], tmp_path_factory: Any, name: str, source_case: Any) -> Any:
    srv = cls(tmp_path_factory.mktemp(name))
    srv.start()
    srv.upload(sorted(p for p in source_case.dicom.rglob("*.dcm")))  # the source CT: the results go back beside it
    return srv


@pytest.fixture(scope="module")
def source_case(tmp_path_factory):
    return phantom_case(tmp_path_factory.mktemp("levels") / "case", n_nodules=1)


@pytest.fixture(scope="module")
def drops_sr(tmp_path_factory, source_case):
    srv = _server(_ImageLevelOffDropsSr, tmp_path_factory, "orthanc-no-image-sr", source_case)
    try:
        yield srv
    finally:
        srv.discard()


@pytest.fixture(scope="module")
def drops_all(tmp_path_factory, source_case):
    srv = _server(_ImageLevelOffDropsAll, tmp_path_factory, "orthanc-no-image-all", source_case)
    try:
        yield srv
    finally:
        srv.discard()


def _send(run, destination: str, caplog=None):
    """Send the run's results once (no retries) to ``destination``, warnings captured in ``caplog``; the counts."""
    sender = ResultSender(run, _cfg(**{"pacs.send_retries": 0}), destination=destination)
    with caplog.at_level(logging.WARNING) if caplog is not None else contextlib.nullcontext():
        sender.scan()
        sender.send_due()
    return sender.close()


def _said_by_series(caplog) -> list[str]:
    """What the sender said, once, about confirming results by series."""
    return [r.getMessage() for r in caplog.records if getattr(r, "event", "") == "verify_by_series"]


def test_an_archive_without_image_level_queries_confirms_by_series_said_once(
    drops_sr, source_case, tmp_path, monkeypatch, caplog
):
    """Two cases: each SEG (kept) is recorded sent, each SR (dropped) failed as dropped; the archive's missing
    IMAGE-level answers are said once, and the second case is asked by series only."""
    queries = _counting_queries(monkeypatch)
    run = tmp_path / "run"
    c1 = _completed_case(run, "c1", source_case)
    c2 = _completed_case(run, "c2", source_case)
    RunStore(run).close()
    counts = _send(run, drops_sr.dimse, caplog)
    assert drops_sr.holds(c1["seg"]) and drops_sr.holds(c2["seg"]) and not drops_sr.holds(c1["sr"])
    assert (counts.sent, counts.pending, counts.failed) == (2, 0, 2)
    state = open_run(run).deliveries.set_index("sop_uid").state
    assert state[c1["seg"]] == state[c2["seg"]] == "sent" and state[c1["sr"]] == state[c2["sr"]] == "failed"
    said = _said_by_series(caplog)
    assert len(said) == 1 and drops_sr.dimse in said[0] and "C-FIND at IMAGE level" in said[0]
    assert "pacs.verify_sent: false" in said[0]
    assert queries == [2]  # IMAGE level asked once (case c1); c2 by series only
    error = Ledger(run).one("SELECT error FROM sent WHERE sop_uid = ?", (c2["sr"],))["error"]
    assert c2["sr"] in error and "answered success but does not hold it" in error
    assert "does not list the result's series" in error


def test_a_drop_of_every_result_is_told_apart_from_an_archive_that_cannot_say(drops_all, source_case, tmp_path):
    run = tmp_path / "run"
    c1 = _completed_case(run, "c1", source_case)
    RunStore(run).close()
    counts = _send(run, drops_all.dimse)
    assert (counts.sent, counts.failed) == (0, 2)
    error = Ledger(run).one("SELECT error FROM sent WHERE sop_uid = ?", (c1["seg"],))["error"]
    assert "list the source series but not the result's: it answers these queries" in error
    assert "filter or routing rule" in error and "pacs.verify_sent: false" not in error


def test_results_stored_where_the_query_is_refused_are_recorded_stored_unconfirmed_not_failed(source_case, tmp_path, capsys):
    """An archive that answers the C-STOREs with success but refuses ctpipe's confirming C-FIND (here one that offers
    no Query/Retrieve service): the results are recorded "unconfirmed" (stored, the archive's success answer, not
    confirmed), with the refusal and the fix, in the ledger, the run store and ``ctpipe send``'s summary; not failed
    (was: every result recorded failed, and the later cases failed without being sent), and a later ``ctpipe send``,
    with --retry-failed too, does not send them again. The refusal is said once."""
    run = tmp_path / "run"
    c1 = _completed_case(run, "c1", source_case)
    c2 = _completed_case(run, "c2", source_case)
    RunStore(run).close()
    scp = _PickyStore(["1.2.840.10008.5.1.4.1.1.88.34", "1.2.840.10008.5.1.4.1.1.66.4"])
    try:
        dest = f"dimse://PICKY@127.0.0.1:{scp.port}"
        rc = main(["send", str(run), "--to", dest, "--set", "pacs.send_retries=2", "--timeout", "20"])
        out, err = capsys.readouterr()
        assert sorted(scp.received) == sorted([*c1.values(), *c2.values()])  # each case stored once
        again = main(["send", str(run), "--to", dest, "--retry-failed", "--timeout", "20"])
        assert sorted(scp.received) == sorted([*c1.values(), *c2.values()])  # not sent again
        out_again = capsys.readouterr().out
    finally:
        scp.close()
    assert rc == 0 and again == 0, err
    assert f"results to {dest}: 0 sent, 4 stored unconfirmed, 0 pending, 0 failed" in out, out
    assert "4 stored unconfirmed" in out_again
    assert "4 result file(s) stored at" in err and "not confirmed" in err and "pacs.verify_sent: false" in err, err
    said = [line for line in err.splitlines() if "WARNING pipeline.pacs.sender" in line or "ERROR pipeline.pacs.sender" in line]
    assert len(said) == 1 and "refused" in said[0] and "stored" in said[0], said
    rows = Ledger(run).rows("SELECT sop_uid, state, attempts, error FROM sent ORDER BY case_id")
    assert {r["state"] for r in rows} == {"unconfirmed"} and all(r["attempts"] == 1 for r in rows), rows
    assert all("stored" in r["error"] and "refused" in r["error"] and "pacs.verify_sent: false" in r["error"] for r in rows)
    deliveries = open_run(run).deliveries
    assert set(deliveries.state) == {"unconfirmed"} and len(deliveries) == 4


@pytest.mark.parametrize("protocol", ["dicomweb", "dimse"])
def test_held_series_lists_the_series_sent_with_their_instances(orthanc, source_case, tmp_path, monkeypatch, protocol):
    """The SERIES-level query both clients ask an archive that answers no IMAGE-level query (here a normal Orthanc)."""
    from pipeline.pacs.address import parse_destination
    from pipeline.pacs.confirm import read_sent
    from pipeline.pacs.connect import open_archive
    from pipeline.pacs.sender import result_files

    for k, v in orthanc.env.items():
        monkeypatch.setenv(k, v)
    run = tmp_path / "run"
    _completed_case(run, "c1", source_case)
    paths = [p for p, _, _ in result_files(run / "cases" / "c1")]
    orthanc.upload(paths)
    sent = [read_sent(p) for p in paths]
    archive = open_archive(parse_destination(orthanc.dicomweb if protocol == "dicomweb" else orthanc.dimse), _cfg())
    try:
        listed = archive.held_series(sent[0].study_uid, [s.series_uid for s in sent] + ["1.2.3.4.5.6.7.8.9.1"])
    finally:
        archive.close()
    assert listed == {s.series_uid: 1 for s in sent}
    assert all(s.source_series == (str(source_case.volume.series_uid),) for s in sent)


def test_an_archive_refusing_image_level_queries_confirms_by_series(source_case, tmp_path_factory, tmp_path, caplog):
    srv = _server(_ImageLevelRefused, tmp_path_factory, "orthanc-refuses-image", source_case)
    try:
        run = tmp_path / "run"
        c1 = _completed_case(run, "c1", source_case)
        RunStore(run).close()
        counts = _send(run, srv.dimse, caplog)
        assert all(srv.holds(u) for u in c1.values())
    finally:
        srv.discard()
    assert (counts.sent, counts.pending, counts.failed) == (2, 0, 0)
    said = _said_by_series(caplog)
    assert len(said) == 1 and "refuses C-FIND at IMAGE level" in said[0] and "pacs.verify_sent: false" in said[0]


_REFUSE_QIDO_INSTANCES = """
function IncomingHttpRequestFilter(method, uri, ip, username, httpHeaders)
  if method == "GET" and string.find(uri, "/dicom%-web/") and string.find(uri, "/instances") then
    return false
  end
  return true
end
"""


class _QidoInstancesRefused(OrthancServer):
    """An Orthanc whose HTTP filter refuses every DICOMweb instance search (HTTP 403); series searches answer."""

    def config(self) -> dict[str, Any]:
        script = self.root / "refuse_qido.lua"
        script.write_text(_REFUSE_QIDO_INSTANCES)
        return {**super().config(), "LuaScripts": [str(script)]}


def test_a_dicomweb_archive_refusing_instance_searches_confirms_by_series(
    source_case, tmp_path_factory, tmp_path, monkeypatch, caplog
):
    srv = _server(_QidoInstancesRefused, tmp_path_factory, "orthanc-refuses-qido", source_case)
    for k, v in srv.env.items():
        monkeypatch.setenv(k, v)
    try:
        run = tmp_path / "run"
        c1 = _completed_case(run, "c1", source_case)
        RunStore(run).close()
        counts = _send(run, srv.dicomweb, caplog)
        assert all(srv.holds(u) for u in c1.values())
    finally:
        srv.discard()
    assert (counts.sent, counts.pending, counts.failed) == (2, 0, 0)
    said = _said_by_series(caplog)
    assert len(said) == 1 and "refuses QIDO-RS instance searches" in said[0] and srv.dicomweb in said[0]


class _NoMatchesStore:
    """A storage SCP on 127.0.0.1 that keeps what it is sent and answers every C-FIND, at any level, with no match."""

    def __init__(self) -> None:
        from pynetdicom import AE, evt

        from tests._support.orthanc import free_port

        self.ae = AE(ae_title="BLIND")
        for cls in ("1.2.840.10008.5.1.4.1.1.88.34", "1.2.840.10008.5.1.4.1.1.66.4"):
            self.ae.add_supported_context(cls, ["1.2.840.10008.1.2.1", "1.2.840.10008.1.2"])
        self.ae.add_supported_context("1.2.840.10008.5.1.4.1.2.2.1", ["1.2.840.10008.1.2.1", "1.2.840.10008.1.2"])
        self.received: list[str] = []
        self.finds = 0
        self.port = free_port()
        handlers = [(evt.EVT_C_STORE, self._store), (evt.EVT_C_FIND, self._find)]
        self.server = self.ae.start_server(("127.0.0.1", self.port), block=False, evt_handlers=handlers)

    def _store(self, event: Any) -> int:
        self.received.append(str(event.request.AffectedSOPInstanceUID))
        return 0x0000

    def _find(self, event: Any) -> Any:
        self.finds += 1
        yield from ()

    def close(self) -> None:
        self.server.shutdown()
        self.ae.shutdown()


def test_an_archive_answering_no_match_at_every_level_is_said_once_not_retried(source_case, tmp_path, caplog):
    """Nothing listed, neither the results nor their series nor the source series: a drop of everything cannot be told
    from an archive that answers no query; both are said, with the fixes, once, and sending again (the retries) is not
    what mends either."""
    run = tmp_path / "run"
    c1 = _completed_case(run, "c1", source_case)
    c2 = _completed_case(run, "c2", source_case)
    RunStore(run).close()
    scp = _NoMatchesStore()
    try:
        sender = ResultSender(
            run, _cfg(**{"pacs.send_retries": 2, "pacs.backoff_s": 0.01}), destination=f"dimse://BLIND@127.0.0.1:{scp.port}"
        )
        with caplog.at_level(logging.WARNING):
            sender.drain(30)
        counts = sender.close()
    finally:
        scp.close()
    assert (counts.sent, counts.pending, counts.failed) == (0, 0, 4)
    assert sorted(scp.received) == sorted([*c1.values(), *c2.values()])  # each sent once
    rows = Ledger(run).rows("SELECT attempts, error FROM sent")
    assert all(r["attempts"] == 1 for r in rows)
    assert all("answers neither query" in r["error"] and "pacs.verify_sent: false" in r["error"] for r in rows)
    logged = [r for r in caplog.records if r.name == "pipeline.pacs.sender" and r.levelno >= logging.ERROR]
    assert len(logged) == 2 and all("c1" in r.getMessage() for r in logged)  # c2's are not said again


def test_a_refusal_of_the_query_is_asked_again_once_recheck_time_has_passed(source_case, tmp_path, monkeypatch):
    """A long-running sender (``ctpipe listen``) does not take a refusal for ever: once ``recheck.RECHECK_S`` has passed (here
    at once) the next case is sent and the archive asked again."""
    from pipeline.pacs import recheck as recheck_module

    monkeypatch.setattr(recheck_module, "RECHECK_S", 0.0)
    run = tmp_path / "run"
    c1 = _completed_case(run, "c1", source_case)
    c2 = _completed_case(run, "c2", source_case)
    scp = _PickyStore(["1.2.840.10008.5.1.4.1.1.88.34", "1.2.840.10008.5.1.4.1.1.66.4"])
    try:
        sender = ResultSender(run, _cfg(**{"pacs.send_retries": 0}), destination=f"dimse://PICKY@127.0.0.1:{scp.port}")
        sender.scan()
        sender.send_due()
        sender.close()
    finally:
        scp.close()
    assert sorted(scp.received) == sorted([*c1.values(), *c2.values()])


class _ListingStore:
    """A storage SCP on 127.0.0.1 that answers C-FIND at IMAGE and SERIES level from what it keeps: it keeps the
    first ``keep`` instances it is sent (answering success for the later ones too: a drop), and answers the first
    ``answer`` C-FIND requests (then no match: an archive that stopped answering ctpipe's queries)."""

    def __init__(self, *, keep: int = 1_000, answer: int = 1_000) -> None:
        from pynetdicom import AE, evt

        from tests._support.orthanc import free_port

        self.ae = AE(ae_title="LISTING")
        for cls in ("1.2.840.10008.5.1.4.1.1.88.34", "1.2.840.10008.5.1.4.1.1.66.4"):
            self.ae.add_supported_context(cls, ["1.2.840.10008.1.2.1", "1.2.840.10008.1.2"])
        self.ae.add_supported_context("1.2.840.10008.5.1.4.1.2.2.1", ["1.2.840.10008.1.2.1", "1.2.840.10008.1.2"])
        self.keep, self.answer = keep, answer
        self.kept: dict[str, tuple[str, str]] = {}  # SOPInstanceUID -> (study, series)
        self.received = 0
        self.finds = 0
        self.port = free_port()
        handlers = [(evt.EVT_C_STORE, self._store), (evt.EVT_C_FIND, self._find)]
        self.server = self.ae.start_server(("127.0.0.1", self.port), block=False, evt_handlers=handlers)

    def _store(self, event: Any) -> int:
        self.received += 1
        if self.received <= self.keep:
            ds = event.dataset
            self.kept[str(ds.SOPInstanceUID)] = (str(ds.StudyInstanceUID), str(ds.SeriesInstanceUID))
        return 0x0000

    def _find(self, event: Any) -> Any:
        from pydicom.dataset import Dataset

        self.finds += 1
        if self.finds > self.answer:
            return
        q = event.identifier

        def wanted(value: Any) -> set[str]:  # list of UID matching: a multi-valued UID, or one UID
            return {str(value)} if isinstance(value, str) else {str(v) for v in value}

        study = str(q.StudyInstanceUID)
        if q.QueryRetrieveLevel == "IMAGE":
            for sop in wanted(q.SOPInstanceUID) & set(self.kept):
                if self.kept[sop][0] == study:
                    rsp = Dataset()
                    rsp.QueryRetrieveLevel, rsp.StudyInstanceUID, rsp.SOPInstanceUID = "IMAGE", study, sop
                    rsp.SeriesInstanceUID = self.kept[sop][1]
                    yield 0xFF00, rsp
        elif q.QueryRetrieveLevel == "SERIES":
            for series in wanted(q.SeriesInstanceUID):
                n = sum(1 for st, se in self.kept.values() if (st, se) == (study, series))
                if n:
                    rsp = Dataset()
                    rsp.QueryRetrieveLevel, rsp.StudyInstanceUID, rsp.SeriesInstanceUID = "SERIES", study, series
                    rsp.NumberOfSeriesRelatedInstances = n
                    yield 0xFF00, rsp

    def close(self) -> None:
        self.server.shutdown()
        self.ae.shutdown()


def _send_to(run, scp: _ListingStore) -> None:
    sender = ResultSender(run, _cfg(**{"pacs.send_retries": 0}), destination=f"dimse://LISTING@127.0.0.1:{scp.port}")
    sender.scan()
    sender.send_due()
    sender.close()


def test_an_archive_listing_nothing_of_a_case_but_an_earlier_result_dropped_every_result(source_case, tmp_path):
    """Nothing of the second case listed at any level, while the same SERIES-level query lists the first case's result
    it kept: it answers these queries, so it dropped the second case's results (not an archive that cannot say)."""
    run = tmp_path / "run"
    c1 = _completed_case(run, "c1", source_case)
    c2 = _completed_case(run, "c2", source_case)
    RunStore(run).close()
    scp = _ListingStore(keep=2)  # keeps c1's SR and SEG, drops c2's
    try:
        _send_to(run, scp)
    finally:
        scp.close()
    state = open_run(run).deliveries.set_index("sop_uid").state
    assert state[c1["sr"]] == state[c1["seg"]] == "sent" and state[c2["sr"]] == state[c2["seg"]] == "failed"
    error = Ledger(run).one("SELECT error FROM sent WHERE sop_uid = ?", (c2["seg"],))["error"]
    assert "dropped every result of this case" in error and "a result confirmed there earlier" in error
    assert "answers neither query" not in error and "pacs.verify_sent: false" not in error
    assert next(iter(scp.kept.values()))[1] in error  # the earlier result's series, asked for again


def test_an_archive_that_stops_answering_is_told_from_a_drop_by_an_earlier_result_also_in_a_later_run(source_case, tmp_path):
    """The archive keeps everything but answers no query after the first case's: asked for a result it listed before
    (also one a previous run confirmed, from the ledger), it lists nothing either, so it is said to have stopped
    answering ctpipe's queries (or lost what it held), with what to check, not a drop."""
    run = tmp_path / "run"
    c1 = _completed_case(run, "c1", source_case)
    RunStore(run).close()
    scp = _ListingStore(answer=1)  # answers c1's IMAGE-level query, nothing after
    try:
        _send_to(run, scp)  # one run: c1 confirmed
        c2 = _completed_case(run, "c2", source_case)
        _send_to(run, scp)  # the next run: a new sender, nothing listed for c2, nor c1's series now
    finally:
        scp.close()
    state = open_run(run).deliveries.set_index("sop_uid").state
    assert state[c1["sr"]] == "sent" and state[c2["sr"]] == state[c2["seg"]] == "failed"
    error = Ledger(run).one("SELECT error FROM sent WHERE sop_uid = ?", (c2["seg"],))["error"]
    assert "stopped answering" in error and "lost what it held" in error and "pacs.verify_sent: false" in error
    assert "dropped every result of this case" not in error
    assert len(scp.kept) == 4  # it did keep them
