"""A file of a series that lands in the source in the last moment before the run store commits its case: after the
case was read, checked and its folder put in place, while the case's results are being committed. The series is
checked once more inside the store's transaction, before it commits: the case is withdrawn and left for the next
run (with its reason), which analyses the whole series; it is never published, nor recorded done, without that file.
The file lands through a hook on the commit itself, the runner's own code path around it: deterministic, no sleeps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from pipeline.runner import run_batch
from pipeline.runner.stages import IngestStage, WriteStage
from pipeline.runner.store import RunStore
from tests._support.runner import PHANTOM, db_rows


def _series(root: Path, seed: int) -> tuple[str, list[Path]]:
    """A phantom chest written to ``root`` (outside the source): its SeriesInstanceUID and files, foot to head."""
    from pipeline.ingest import read_headers
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    ph = generate_phantom(seed, n_nodules=1, **PHANTOM)
    files = write_dicom_series(ph.volume, root, seed=seed)
    headers, _ = read_headers(files, processes=False)
    return ph.volume.series_uid, [h.path for h in sorted(headers, key=lambda h: h.position[2])]  # type: ignore[index]


def _slices(case_dir: Path) -> int:
    return int(json.loads((case_dir / "volume.json").read_text())["geometry"]["shape"][0])


def test_a_file_landing_while_the_case_is_committed_leaves_it_for_the_next_run_whole(tmp_path, monkeypatch):
    src, out = tmp_path / "export", tmp_path / "run"
    uid, files = _series(tmp_path / "archive", 37)
    (src / "s").mkdir(parents=True)
    for f in files[:-1]:
        shutil.copy2(f, src / "s" / f.name)
    commit = RunStore.complete_case
    landed: list[Path] = []

    def land_then_commit(self: RunStore, case_key: str, **kw: Any) -> None:
        if not landed:  # the archive's last file lands as the run commits the case
            landed.append(Path(shutil.copy2(files[-1], src / "s" / files[-1].name)))
        commit(self, case_key, **kw)

    monkeypatch.setattr(RunStore, "complete_case", land_then_commit)
    opts: dict[str, Any] = {"workers": 0, "report.enabled": False}
    first = run_batch([src], out=out, stages=[IngestStage(), WriteStage()], **opts)

    assert landed, "the run never committed the case"
    published = [d for d in (out / "cases").iterdir()] if (out / "cases").is_dir() else []
    assert [(d.name, _slices(d)) for d in published] == [], f"published without the file that landed: {first.lines()}"
    assert db_rows(out, "SELECT case_id FROM cases WHERE status='done'") == []
    assert first.exit_code == 0 and first.done == 0, first.lines()
    ((_, why),) = first.still_written
    assert f"series {uid} was still being written while the run processed it" in why
    ((status, error_class, reason),) = db_rows(out, "SELECT status, error_class, reason FROM cases WHERE series_uid=?", (uid,))
    assert (status, error_class) == ("pending", "SeriesStillWrittenError") and reason == why
    monkeypatch.setattr(RunStore, "complete_case", commit)

    again = run_batch([src], out=out, stages=[IngestStage(), WriteStage()], **opts)  # the next batch of the watch

    assert again.exit_code == 0 and again.done == 1, again.lines()
    ((cid,),) = db_rows(out, "SELECT case_id FROM cases WHERE status='done' AND series_uid=?", (uid,))
    assert _slices(out / "cases" / cid) == len(files)  # the whole series, the late file included: nothing lost


def test_a_file_landing_after_the_last_check_before_the_commit_takes_the_case_back(tmp_path, monkeypatch):
    """The file lands after the series' check inside the store's transaction returned, while that transaction commits:
    the series is checked again once the commit is made, and the completion is undone: no case recorded done, nor a
    folder in cases/, without the file; the case waits, pending with its reason, for the next run, which takes it
    whole. Its first completion is still to come: the next run's is a new case, not one done again."""
    from pipeline.runner.arrivals import SourceSnapshot

    src, out = tmp_path / "export", tmp_path / "run"
    uid, files = _series(tmp_path / "archive", 38)
    (src / "s").mkdir(parents=True)
    for f in files[:-1]:
        shutil.copy2(f, src / "s" / f.name)
    commit, check = RunStore.complete_case, SourceSnapshot.still_written
    committing: list[bool] = []
    landed: list[Path] = []

    def committed(self: RunStore, case_key: str, **kw: Any) -> None:
        committing.append(True)
        try:
            commit(self, case_key, **kw)
        finally:
            committing.clear()

    def check_then_land(self: SourceSnapshot, case: Any) -> Any:
        verdict = check(self, case)
        if committing and not landed:  # the check inside the commit said unchanged; the file lands just after it
            landed.append(Path(shutil.copy2(files[-1], src / "s" / files[-1].name)))
        return verdict

    monkeypatch.setattr(RunStore, "complete_case", committed)
    monkeypatch.setattr(SourceSnapshot, "still_written", check_then_land)
    opts: dict[str, Any] = {"workers": 0, "report.enabled": False}
    first = run_batch([src], out=out, stages=[IngestStage(), WriteStage()], **opts)

    assert landed, "the series was never checked inside the commit"
    published = [d for d in (out / "cases").iterdir()] if (out / "cases").is_dir() else []
    assert [(d.name, _slices(d)) for d in published] == [], f"published without the file that landed: {first.lines()}"
    assert db_rows(out, "SELECT case_id FROM cases WHERE status='done'") == []
    assert first.exit_code == 0 and first.done == 0 and first.redone == 0, first.lines()
    ((_, why),) = first.still_written
    assert f"series {uid} was still being written while the run processed it" in why
    rows = db_rows(out, "SELECT status, error_class, first_done_at, output_dir FROM cases WHERE series_uid=?", (uid,))
    assert rows == [("pending", "SeriesStillWrittenError", None, None)]
    assert db_rows(out, "SELECT COUNT(*) FROM findings") == [(0,)]
    monkeypatch.setattr(RunStore, "complete_case", commit)
    monkeypatch.setattr(SourceSnapshot, "still_written", check)

    again = run_batch([src], out=out, stages=[IngestStage(), WriteStage()], **opts)

    assert again.exit_code == 0 and (again.done, again.redone) == (1, 0), again.lines()
    ((cid,),) = db_rows(out, "SELECT case_id FROM cases WHERE status='done' AND series_uid=?", (uid,))
    assert _slices(out / "cases" / cid) == len(files)
