"""Results go to the PACS only once their case is committed: a ``ctpipe run`` with ``pacs.send_to`` sends the SR and
SEG of a case the run store records done (and whose last check after that commit has passed), never those of a
case folder that is in place but not yet committed, nor of one withdrawn at its commit because a file of its series
landed then. The run is the real runner; the PACS a real Orthanc on 127.0.0.1; the sender scans and sends at the
very moments that matter (hooks on the run store's commit and the check after it): deterministic, no sleeps."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import load_config
from pipeline.pacs.send_ledger import committed_cases
from pipeline.pacs.sender import ResultSender, result_files
from pipeline.runner import run_batch
from pipeline.runner.arrivals import SourceSnapshot
from pipeline.runner.store import RunStore
from tests._support.runner import PHANTOM, QUICK, db_rows

pytest_plugins = ["tests._support.orthanc"]
pytestmark = pytest.mark.pacs

OPTS: dict[str, Any] = {**QUICK, "workers": 0, "outputs.dicom": ["sr"], "report.enabled": False}


def _series(root: Path, seed: int) -> tuple[str, list[Path]]:
    """A phantom chest written to ``root`` (outside the source): its SeriesInstanceUID and files, foot to head."""
    from pipeline.ingest import read_headers
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    ph = generate_phantom(seed, n_nodules=1, **PHANTOM)
    files = write_dicom_series(ph.volume, root, seed=seed)
    headers, _ = read_headers(files, processes=False)
    return ph.volume.series_uid, [h.path for h in sorted(headers, key=lambda h: h.position[2])]  # type: ignore[index]


def _sender(out: Path, orthanc: Any, monkeypatch: pytest.MonkeyPatch) -> ResultSender:
    for k, v in orthanc.env.items():
        monkeypatch.setenv(k, v)
    cfg = load_config(
        overrides={"pacs.timeout_s": 10.0, "pacs.retries": 0, "pacs.backoff_s": 0.05, "pacs.send_retries": 0},
        environ={},
    )
    return ResultSender(out, cfg, destination=orthanc.dimse)


def _results_in(out: Path) -> list[str]:
    """SOPInstanceUIDs of the result files in every case folder in place now."""
    cases = out / "cases"
    return [uid for d in sorted(cases.iterdir()) for _, uid, _ in result_files(d)] if cases.is_dir() else []


def _export(tmp_path: Path, seed: int) -> tuple[Path, Path, str, list[Path]]:
    src, out = tmp_path / "export", tmp_path / "run"
    uid, files = _series(tmp_path / "archive", seed)
    (src / "s").mkdir(parents=True)
    for f in files[:-1]:  # the archive's last file is still to come
        shutil.copy2(f, src / "s" / f.name)
    return src, out, uid, files


@pytest.mark.slow
def test_a_case_folder_in_place_before_its_commit_is_not_sent_nor_after_it_is_withdrawn(orthanc, tmp_path, monkeypatch):
    """The sender scans while the case's folder is in place and its completion not yet committed; then a file of the
    series lands and the commit withdraws the case. Nothing of it reaches the PACS; the next run's whole case does."""
    src, out, uid, files = _export(tmp_path, 41)
    sender = _sender(out, orthanc, monkeypatch)
    commit = RunStore.complete_case
    seen: list[str] = []

    def send_land_then_commit(self: RunStore, case_key: str, **kw: Any) -> None:
        if not seen:  # the folder is in place, the store not committed: a background sender's pass now
            seen.extend(_results_in(out))
            sender.scan()
            sender.send_due()
            shutil.copy2(files[-1], src / "s" / files[-1].name)  # then the archive's last file lands
        commit(self, case_key, **kw)

    monkeypatch.setattr(RunStore, "complete_case", send_land_then_commit)
    try:
        first = run_batch([src], out=out, **OPTS)
        assert seen, "no result file was in place before the commit"
        assert first.done == 0 and len(first.still_written) == 1, first.lines()
        sender.scan()
        sender.send_due()
        held = [u for u in seen if orthanc.holds(u)]
        assert held == [], f"results of a case never committed reached the PACS: {held}"
        assert sender.counts().sent == 0
        monkeypatch.setattr(RunStore, "complete_case", commit)

        again = run_batch([src], out=out, **OPTS)

        assert again.done == 1, again.lines()
        sender.scan()
        assert sender.send_due() == 1
    finally:
        sender.close()
    ((cid,),) = db_rows(out, "SELECT case_id FROM cases WHERE status='done' AND series_uid=?", (uid,))
    whole = [u for _, u, _ in result_files(out / "cases" / cid)]
    assert len(whole) == 1 and orthanc.holds(whole[0]) and whole[0] not in seen


@pytest.mark.slow
def test_a_case_taken_back_by_the_check_after_its_commit_is_not_sent(orthanc, tmp_path, monkeypatch):
    """The file lands as the completion commits: the case is recorded done for the moment until the check made once
    the commit is made takes it back. A sender's pass in that moment sends nothing of it."""
    src, out, uid, files = _export(tmp_path, 42)
    sender = _sender(out, orthanc, monkeypatch)
    commit, check = RunStore.complete_case, SourceSnapshot.still_written
    state: dict[str, Any] = {"committing": False, "committed": False, "seen": []}

    def committed(self: RunStore, case_key: str, **kw: Any) -> None:
        state["committing"] = True
        try:
            commit(self, case_key, **kw)
        finally:
            state["committing"] = False
        state["committed"] = True

    def check_land_send(self: SourceSnapshot, case: Any) -> Any:
        if state["committed"] and not state["seen"]:  # done in the store, the check after the commit to come
            state["seen"] = _results_in(out)
            sender.scan()
            sender.send_due()
        verdict = check(self, case)
        if state["committing"]:  # the check inside the commit said unchanged; the file lands just after it
            shutil.copy2(files[-1], src / "s" / files[-1].name)
        return verdict

    monkeypatch.setattr(RunStore, "complete_case", committed)
    monkeypatch.setattr(SourceSnapshot, "still_written", check_land_send)
    try:
        first = run_batch([src], out=out, **OPTS)
        assert state["seen"], "no result file was in place after the commit"
        assert first.done == 0 and len(first.still_written) == 1, first.lines()
        sender.scan()
        sender.send_due()
        held = [u for u in state["seen"] if orthanc.holds(u)]
        assert held == [], f"results of a case taken back at its commit reached the PACS: {held}"
        assert sender.counts().sent == 0
    finally:
        sender.close()
    assert db_rows(out, "SELECT status FROM cases WHERE series_uid=?", (uid,)) == [("pending",)]


def test_committed_cases_are_those_done_and_confirmed_in_their_own_folder(tmp_path):
    """Done and confirmed: committed; done unconfirmed, pending, or done with another folder: not; a store written
    before cases were confirmed (no table ``unconfirmed``): its done cases; no run store: none."""
    run = tmp_path / "run"
    assert committed_cases(run) == set()
    store = RunStore(run)
    for cid in ("a", "b", "c", "d"):
        store.upsert_discovered(case_key=f"{cid}:k", case_id=cid, series_uid=cid, fingerprint="f" * 24, source="src")
    store.complete_case("a:k", output_dir="cases/a", findings=[], measurements=[])
    store.complete_case("b:k", output_dir="cases/b", findings=[], measurements=[], unconfirmed=True)
    store.complete_case("d:k", output_dir="cases/elsewhere", findings=[], measurements=[])
    assert committed_cases(run) == {"a"}
    store.confirm_case("b:k")
    assert committed_cases(run) == {"a", "b"}
    store.db.execute("DROP TABLE unconfirmed")
    store.close()
    assert committed_cases(run) == {"a", "b"}
