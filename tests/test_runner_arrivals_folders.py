"""A series still being exported into the source (``runner.stable_age_s`` left at 0) whose new files land where
the run did not look before: a folder that held none of its files when the run found it (a new batch subfolder, a
sibling folder), or a file the exporter has created and not written yet (0 bytes). Such a case is not published and
is left for the next run; what was already there when the run found the series (an empty junk file) never holds it
back. The archive is played by a stage that adds files once the case is written: deterministic, no race with a
clock."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import load_config
from pipeline.runner import run_batch
from pipeline.runner.discover import discover
from pipeline.runner.stage import CaseContext
from pipeline.runner.stages import IngestStage, WriteStage
from tests._support.runner import PHANTOM
from tests.test_runner_series_growing import _copy, _series


class _Arrive(WriteStage):
    """Once the case of series ``uid`` is written (after discovery, before it is published), the archive copies
    ``rest`` into ``folder`` (when given) and creates each of the ``empty`` files (0 bytes)."""

    def __init__(self, uid: str, rest: list[Path], folder: Path | None, empty: tuple[Path, ...] = ()) -> None:
        self.uid, self.rest, self.folder, self.empty = uid, rest, folder, empty

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        out = super().process(ctx)
        if ctx.case.series_uid == self.uid:
            if self.folder is not None:
                _copy(self.rest, self.folder)
            for p in self.empty:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.touch()
            self.rest, self.folder, self.empty = [], None, ()
        return out


def _run(src: Path, out: Path, hook: WriteStage | None = None) -> Any:
    """A cheap run (ingest, write) over ``src``; ``hook`` in place of the write stage."""
    return run_batch([src], out=out, stages=[IngestStage(), hook or WriteStage()], workers=0, **{"report.enabled": False})


def _uid(seed: int) -> str:
    from pipeline.phantom import generate_phantom

    return generate_phantom(seed, n_nodules=1, **PHANTOM).volume.series_uid


@pytest.mark.parametrize(
    "new_folder",
    [
        "p1/st1/ser/batch-0002",  # the exporter makes a folder per batch of instances
        "p1/st1/ser-more",  # a sibling of the series' folder
        "p1/st1/ser/batch-0001/late",  # a subfolder of the series' folder
        "elsewhere/under/the/source",  # anywhere under the source, far from it
    ],
)
def test_files_of_the_series_in_a_folder_the_run_did_not_list_leave_its_case_for_the_next_run(tmp_path, new_folder):
    src, out = tmp_path / "pacs-export", tmp_path / "run"
    growing_uid, growing = _series(tmp_path / "archive" / "g", 12)
    _, whole = _series(tmp_path / "archive" / "w", 11)
    _copy(whole, src / "p2" / "st9" / "ser")
    _copy(growing[:12], src / "p1" / "st1" / "ser" / "batch-0001")

    s = _run(src, out, _Arrive(growing_uid, growing[12:], src / new_folder))

    assert s.exit_code == 0 and s.done == 1 and s.quarantined == [], s.lines()
    ((cid, why),) = s.still_written
    assert f"series {growing_uid} was still being written while the run processed it" in why
    assert f"12 file(s) of it arrived in the source since the run found its 12 file(s) (the first: {src / new_folder}" in why
    again = _run(src, out)  # the next night: the whole series, a new case
    assert again.exit_code == 0 and again.done == 1 and again.still_written == [], again.lines()


def test_another_series_and_an_empty_file_in_a_new_folder_far_from_the_case_do_not_hold_it_back(tmp_path):
    """The other patient's new study folder: a whole series of another patient and an empty file the exporter just
    made there (not beside the case: it cannot be of its series' files-in-progress)."""
    src = tmp_path / "pacs-export"
    uid, files = _series(tmp_path / "archive" / "a", 11)
    _, other = _series(tmp_path / "archive" / "b", 13)
    _copy(files, src / "p1" / "st1" / "ser")
    far = src / "p2" / "st7" / "ser"
    s = _run(src, tmp_path / "run", _Arrive(uid, other, far, empty=(far / "CT999.dcm",)))
    assert s.exit_code == 0 and s.done == 1 and s.still_written == [], s.lines()


@pytest.mark.parametrize("where", ["beside", "new_batch_folder", "batch_folder_made_before"])
def test_a_new_empty_file_beside_the_series_leaves_it_for_one_run_only(tmp_path, where):
    """The exporter created a file beside the series and has not written it yet: the case waits. The next run finds
    the file still empty (junk, there since before it began): the case is published, not left again."""
    src, out = tmp_path / "incoming", tmp_path / "run"
    uid, files = _series(tmp_path / "archive", 11)
    _copy(files, src / "ser")
    empty = src / "ser" / "CT001_00099.dcm" if where == "beside" else src / "ser-batch2" / "IMG0001"
    if where == "batch_folder_made_before":  # the exporter made the next batch's folder, and its first file, early
        (src / "ser-batch2").mkdir()
        (src / "ser-batch2" / "IMG0000").touch()

    s = _run(src, out, _Arrive(uid, [], None, empty=(empty,)))

    assert s.exit_code == 0 and s.done == 0 and s.quarantined == [], s.lines()
    ((_, why),) = s.still_written
    assert (
        f"1 new file(s) beside it hold no DICOM header yet (0 bytes, or zeros where it begins), possibly files of it being written (the first: {empty})"
        in why
    )
    assert empty.stat().st_size == 0
    os.utime(empty)  # touched again, still empty: a lock or marker file, not a slice being written
    again = _run(src, out)
    assert again.exit_code == 0 and again.done == 1 and again.still_written == [], again.lines()


def test_an_empty_file_there_at_discovery_holds_the_series_back_only_once_it_is_written(tmp_path):
    """An empty file beside the series when the run finds it is skipped by discovery, so it never holds the case
    back while it stays empty (touched or not); once the exporter writes a slice of the series into it, it does."""
    _, files = _series(tmp_path / "archive", 11)
    src = tmp_path / "incoming"
    _copy(files[:12], src)
    slot = src / "CT001_00013.dcm"
    slot.touch()
    cfg = load_config(environ={})
    found = discover([src], cfg)
    (case,) = found.cases
    assert any(f["path"] == str(slot) for f in found.skipped_files)
    os.utime(slot, ns=(0, slot.stat().st_mtime_ns + 5_000_000_000))
    assert found.snapshot.still_written(case) is None
    slot.write_bytes(files[12].read_bytes())
    err = found.snapshot.still_written(case)
    assert (
        err is not None
        and f"1 file(s) of it arrived in the source since the run found its 12 file(s) (the first: {slot})" in str(err)
    )


def test_a_file_preallocated_with_zeros_beside_the_series_counts_as_being_written_a_text_file_does_not(tmp_path):
    """A copy that sets the file's size first and fills it afterwards shows zeros where the DICOM marker goes; a
    short text file (an export log) beside the series cannot be the start of a DICOM file."""
    _, files = _series(tmp_path / "archive", 11)
    src = tmp_path / "incoming"
    _copy(files, src)
    found = discover([src], load_config(environ={}))
    (case,) = found.cases
    (src / "export.log").write_text("export log\n")
    (src / "notes.txt").write_bytes(b"\0" * 10 + b"not DICOM" + b"\0" * 200)
    assert found.snapshot.still_written(case) is None
    (src / "CT001_00099.dcm").write_bytes(b"\0" * files[0].stat().st_size)
    err = found.snapshot.still_written(case)
    assert err is not None and f"possibly files of it being written (the first: {src / 'CT001_00099.dcm'})" in str(err)


def test_a_dicom_file_given_by_itself_is_the_whole_input_files_beside_it_are_not_looked_for(tmp_path):
    """A single (multi-frame) DICOM file named as the source is the whole series the user asked for: slices that
    land beside it are not part of the request, so they do not hold its case back (its own changes still do)."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    ph = generate_phantom(11, n_nodules=1, **PHANTOM)
    (one,) = write_dicom_series(ph.volume, tmp_path / "in", seed=11, enhanced=True)
    found = discover([one], load_config(environ={}))
    (case,) = found.cases
    _copy(_series(tmp_path / "archive", 11)[1], tmp_path / "in", prefix="x")
    (tmp_path / "in" / "empty.dcm").touch()
    assert found.snapshot.still_written(case) is None
    os.utime(one, ns=(0, one.stat().st_mtime_ns + 5_000_000_000))
    assert found.snapshot.still_written(case) is not None


def test_in_a_large_source_the_folders_next_to_the_case_are_listed_again_for_each_case(tmp_path, monkeypatch):
    """Where listing the whole source takes long (here: any listing, and reused without end), the listing is reused
    for the next cases, but the folders next to each case's own are listed again: a new batch folder of its series is
    seen at once; a file of it far away (another patient's folder) waits for the next full listing."""
    from pipeline.runner import arrivals

    monkeypatch.setattr(arrivals, "FRESH_S", 0.0)
    monkeypatch.setattr(arrivals, "REUSE_MAX_S", 1e9)
    monkeypatch.setattr(arrivals, "REUSE", 1e9)
    _, files = _series(tmp_path / "archive", 11)
    src = tmp_path / "pacs-export"
    _copy(files[:12], src / "p1" / "st1" / "ser" / "batch-0001")
    found = discover([src], load_config(environ={}))
    (case,) = found.cases
    assert found.snapshot.still_written(case) is None  # the whole source listed, kept for the next cases
    _copy(files[12:18], src / "p2" / "st1" / "ser")
    assert found.snapshot.still_written(case) is None  # far away: not listed again yet
    _copy(files[18:], src / "p1" / "st1" / "ser" / "batch-0002")
    err = found.snapshot.still_written(case)
    assert (
        err is not None
        and f"6 file(s) of it arrived in the source since the run found its 12 file(s) (the first: {src / 'p1'}" in str(err)
    )
    monkeypatch.setattr(arrivals, "REUSE", 0.0)  # the listing is out of date: the whole source is listed again
    err = found.snapshot.still_written(case)
    assert err is not None and "12 file(s) of it arrived" in str(err)
