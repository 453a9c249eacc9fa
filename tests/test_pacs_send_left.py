"""Results a run killed at its commit left in place, uncommitted, are never left unsent without a word: ``ctpipe send``
names each such case with the command that checks and adopts it (a run over its source) and exits 3, and a PACS
source run again hands the series of a case recorded done but unconfirmed to the runner (retrieved again, or its
spool folder kept for it) instead of skipping it as processed. The killed run is the real runner, killed by SIGKILL
in a child process (tests/test_runner_killed_at_commit.py); nothing is sent, so no PACS is needed."""

from __future__ import annotations

import os
import socket

import pytest

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.pacs.archive import RemoteSeries
from pipeline.pacs.fetch import FetchResult, _processed_before, release_spool
from pipeline.pacs.ledger import Ledger
from pipeline.runner import run_batch
from pipeline.runner.left_unsent import left_cases
from pipeline.runner.stages import IngestStage, WriteStage
from pipeline.runner.store import RunStore, remote_series
from tests._support.runner import db_rows
from tests.test_runner_killed_at_commit import OPTS, _killed_run

DEST = "dimse://ARCHIVE@127.0.0.1:9"  # never connected to: there is nothing committed to send


@pytest.mark.slow  # a run killed in a child process, then two runs
def test_ctpipe_send_names_results_a_killed_run_left_uncommitted_with_the_command_that_sends_them(tmp_path, capsys):
    """A run killed before its commit left a case folder in place; the next run, with pacs.send_to, was over another
    folder, so the case stays unadopted: that run's console says so, and so does ``ctpipe send``, naming the case and
    the run over its source, with exit status 3 (was: '0 sent, 0 pending, 0 failed', exit 0: results silently never
    sent). Once that run has adopted the folder, nothing is left to say."""
    src, out, uid, _ = _killed_run(tmp_path, 46, "complete_case", land=False)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("no DICOM here")
    capsys.readouterr()
    assert main(["run", str(other), "--out", str(out), "--set", f"pacs.send_to={DEST}", "--set", "report.enabled=false"]) == 0
    (case_id,) = [p.name for p in (out / "cases").iterdir()]
    said_by_run = capsys.readouterr().err
    assert f"hold results not sent to {DEST}" in said_by_run and case_id in said_by_run, said_by_run

    rc = main(["send", str(out), "--to", DEST, "--timeout", "5"])

    err = capsys.readouterr().err
    assert rc == 3, err
    assert f"1 case folder(s) in {out}/cases hold results not sent to {DEST}" in err, err
    said = [line for line in err.splitlines() if case_id in line]
    assert len(said) == 1 and "ctpipe run " in said[0] and f"--out {out}" in said[0] and str(src) in said[0], err

    run_batch([src], out=out, stages=[IngestStage(), WriteStage()], **OPTS)  # the run the line asks for
    assert left_cases(out) == []
    assert main(["send", str(out), "--to", DEST, "--timeout", "5"]) == 0
    assert "hold results not sent" not in capsys.readouterr().err


@pytest.mark.slow  # a run killed in a child process
def test_a_pacs_series_whose_case_is_done_unconfirmed_is_handed_to_the_run_again_and_its_spool_kept(tmp_path):
    """A retrieved series whose case a killed run recorded done but never confirmed: a rerun of its PACS source does
    not skip it as processed (was: skipped for ever, its results never sent), the spool folder it came from is not
    released, and ``ctpipe send``'s line gives its PACS address with ``?series=UID`` (not while the run that recorded
    it is under way: that run records it in a moment)."""
    _, out, uid, _ = _killed_run(tmp_path, 47, "confirm_case", land=False)
    (case_key,) = db_rows(out, "SELECT case_key FROM cases WHERE series_uid=?", (uid,))[0]
    store = RunStore(out)
    try:
        origin = {"remote": "dimse://ARCHIVE@pacs:104", "via": "c-move", "study_uid": "1.2.3", "series_uid": uid}
        store.record_origins("r0", [(case_key, {**origin, "n_instances": 7})])
    finally:
        store.close()
    case = remote_series(out, [uid])[uid]
    assert case["status"] == "done" and case["unconfirmed"] is True, case
    cfg = load_config(environ={})
    fetched = FetchResult()
    assert not _processed_before(RemoteSeries("1.2.3", uid, "CT", 7), case, cfg, fetched)
    assert fetched.done_before == 0

    spool = out / "pacs" / "spool" / uid
    spool.mkdir(parents=True)
    (spool / "x.dcm").write_bytes(b"\0" * 132)
    ledger = Ledger(out)
    try:
        with ledger.tx() as db:
            db.execute(
                "INSERT INTO fetched (series_uid, state, folder, updated_at) VALUES (?, 'fetched', ?, 0)",
                (uid, str(spool.relative_to(out))),
            )
    finally:
        ledger.close()
    assert release_spool(out, cfg) == 0 and spool.is_dir()

    (left,) = left_cases(out)
    assert left.fix(str(out)) == f'ctpipe run "dimse://ARCHIVE@pacs:104?series={uid}" --out {out}'

    # while the run that recorded it is under way (its process alive, no end recorded), the case is its to finish
    store = RunStore(out)
    try:
        with store.tx():
            store.db.execute("UPDATE runs SET pid = ?, host = ?, ended_at = NULL", (os.getpid(), socket.gethostname()))
    finally:
        store.close()
    assert left_cases(out) == []
