"""A series a PACS is still exporting into the source while the run processes it (``runner.stable_age_s`` left at 0):
files of it that arrive, or change, after discovery found it. Such a case is not published (no findings, no SR) and
not quarantined: it is left for the next run, which takes the whole series; the other cases of the batch are
published as usual. The archive is played by a stage that copies the rest of the series in once the case's last
stage (or, for a rewritten file, ingest) is reached: deterministic, no race with a clock."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from pipeline.config import load_config
from pipeline.errors import SeriesStillWrittenError, SourceMismatchError
from pipeline.ingest import read_headers
from pipeline.runner import run_batch
from pipeline.runner.dicom_stage import DicomStage
from pipeline.runner.stage import CaseContext, Stage
from pipeline.runner.stages import IngestStage, WriteStage, build_stages
from tests._support.runner import PHANTOM, QUICK, db_rows, manifest


def _series(root: Path, seed: int) -> tuple[str, list[Path]]:
    """A phantom chest written to ``root`` (outside the source): its SeriesInstanceUID and files, foot to head."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    ph = generate_phantom(seed, n_nodules=1, **PHANTOM)
    files = write_dicom_series(ph.volume, root, seed=seed)
    headers, _ = read_headers(files, processes=False)
    assert headers[0].position is not None
    return ph.volume.series_uid, [h.path for h in sorted(headers, key=lambda h: h.position[2])]  # type: ignore[index]


def _copy(files: list[Path], folder: Path, *, prefix: str = "") -> None:
    """Copy ``files`` into ``folder``, each name prefixed (phantom series all name their files CT001_00001.dcm, ...)."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy2(f, folder / f"{prefix}{f.name}")


class _ArchiveAtWork(Stage):
    """Mixed into the pipeline's last stage: once that stage is done with the case of series ``uid``, the archive
    copies ``rest`` into ``folder`` (after discovery, before the case is published)."""

    def __init__(self, uid: str, rest: list[Path], folder: Path) -> None:
        self.uid, self.rest, self.folder = uid, rest, folder

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        out = super().process(ctx)  # type: ignore[safe-super]
        if ctx.case.series_uid == self.uid and self.rest:
            _copy(self.rest, self.folder)
            self.rest = []
        return out


class _DicomThenArchive(_ArchiveAtWork, DicomStage):
    name = "dicom"


def test_a_series_whose_rest_arrives_during_the_run_is_left_whole_for_the_next_run(tmp_path):
    src, out = tmp_path / "pacs-export", tmp_path / "runs" / "night"
    whole_uid, whole = _series(tmp_path / "archive" / "a", 11)
    growing_uid, growing = _series(tmp_path / "archive" / "b", 12)
    _copy(whole, src / "a")
    _copy(growing[:12], src / "b")  # the lower half of the chest is there when the run scans the folder
    opts: dict[str, Any] = {**QUICK, "workers": 0, "outputs.dicom": ["sr"], "report.enabled": True}
    stages = build_stages(load_config(environ={}, overrides=opts))
    assert stages[-1].name == "dicom"
    stages[-1] = _DicomThenArchive(growing_uid, growing[12:], src / "b")

    s = run_batch([src], out=out, stages=stages, **opts)

    assert s.exit_code == 0 and s.done == 1 and s.quarantined == [], s.lines()
    ((cid, why),) = s.still_written
    assert f"series {growing_uid} was still being written while the run processed it" in why
    assert f"12 file(s) of it arrived in the source since the run found its 12 file(s) (the first: {src / 'b'}" in why
    assert "the next ctpipe run over the same source takes the whole series" in why and "runner.stable_age_s" in why
    assert any(line.startswith(f"  left for the next run {cid}: ") for line in s.lines()), s.lines()
    assert "1 left for the next run (still being written)" in s.lines()[0]
    published = sorted(p.name for p in (out / "cases").iterdir())
    assert len(published) == 1 and manifest(out / "cases" / published[0])["series_uid"] == whole_uid
    assert (out / "cases" / published[0] / "dicom" / "sr.dcm").is_file()
    assert [p.parent.parent.name for p in out.rglob("sr.dcm")] == published  # no SR of the growing series anywhere
    assert [p.parent.name for p in out.rglob("findings.json")] == published  # nor its findings
    assert not (out / "quarantine").exists() or not list((out / "quarantine").iterdir())
    ((status, error_class, reason, half_key),) = db_rows(
        out, "SELECT status, error_class, reason, case_key FROM cases WHERE case_id=?", (cid,)
    )
    assert (status, error_class) == ("pending", SeriesStillWrittenError.__name__) and reason == why
    kinds = db_rows(out, "SELECT item, kind FROM skipped WHERE what='series'")
    assert (growing_uid, "still_written") in kinds
    assert "still_written" in (out / "report" / "skipped.csv").read_text()

    again = run_batch([src], out=out, **opts)  # the next night: the standard stages over the whole series

    assert again.exit_code == 0 and again.done == 1 and again.skipped == 1 and again.still_written == [], again.lines()
    man = manifest(out / "cases" / cid)
    assert man["series_uid"] == growing_uid and (out / "cases" / cid / "dicom" / "sr.dcm").is_file()
    assert man["case_key"] != half_key  # a new case: the whole series' fingerprint
    ((status,),) = db_rows(out, "SELECT status FROM cases WHERE case_id=?", (cid,))
    assert status == "done"
    assert json.loads((out / "cases" / cid / "volume.json").read_text())["geometry"]["shape"][0] == 24  # the whole chest


def _two_series_run(tmp_path: Path, hook: Stage, *, first: bool = False) -> Any:
    """A cheap run (ingest, write) over two series (seeds 11, 12) in one flat folder, the archive's ``hook`` last
    (``first``: before ingest)."""
    src = tmp_path / "flat"
    for seed in (11, 12):
        _copy(_series(tmp_path / "archive" / str(seed), seed)[1], src, prefix=f"s{seed}_")
    stages = [hook, IngestStage(), WriteStage()] if first else [IngestStage(), hook]
    return run_batch([src], out=tmp_path / "run", stages=stages, workers=0, **{"report.enabled": False})


class _Touch(WriteStage):
    """Once the case of series ``uid`` is written, the archive writes one of its files again: the same bytes, a
    modification time 5 s later."""

    def __init__(self, uid: str) -> None:
        self.uid = uid

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        out = super().process(ctx)
        if ctx.case.series_uid == self.uid:
            st = Path(ctx.case.files[3]).stat()
            os.utime(ctx.case.files[3], ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
        return out


def test_a_file_of_the_series_written_again_leaves_its_case_for_the_next_run(tmp_path):
    from pipeline.phantom import generate_phantom

    uid = generate_phantom(12, n_nodules=1, **PHANTOM).volume.series_uid
    s = _two_series_run(tmp_path, _Touch(uid))
    assert s.exit_code == 0 and s.done == 1 and s.quarantined == [], s.lines()
    ((_, why),) = s.still_written
    assert f"series {uid} was still being written" in why
    assert f"1 of its file(s) changed size or modification time since (the first: {tmp_path / 'flat'}" in why
    assert len(list((tmp_path / "run" / "cases").iterdir())) == 1


class _Neighbours(WriteStage):
    """After the first case is written: a third series, a text file and a temporary (hidden) file land in the same
    flat folder; none of them is part of the two cases' series."""

    def __init__(self, other: list[Path], folder: Path) -> None:
        self.other, self.folder = other, folder

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        out = super().process(ctx)
        if self.other:
            _copy(self.other, self.folder, prefix="s13_")
            (self.folder / "export-log.txt").write_text("export log\n")
            (self.folder / ".s13_partial.dcm.tmp").write_bytes(self.other[0].read_bytes()[:600])
            self.other = []
        return out


def test_files_of_another_series_arriving_beside_a_case_do_not_hold_it_back(tmp_path):
    _, other = _series(tmp_path / "archive" / "other", 13)
    s = _two_series_run(tmp_path, _Neighbours(other, tmp_path / "flat"))
    assert s.exit_code == 0 and s.done == 2 and s.still_written == [], s.lines()


class _Grow(Stage):
    """Before the first case is ingested: the archive writes more of one of its files (its size changes)."""

    name = "fetch"

    def __init__(self) -> None:
        self.done = False

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        if not self.done:
            self.done = True
            victim = Path(ctx.case.files[5])
            victim.write_bytes(victim.read_bytes() + b"\0" * 16)
        return {}


def test_a_file_that_grows_before_ingest_leaves_the_case_for_the_next_run_not_quarantined(tmp_path):
    s = _two_series_run(tmp_path, _Grow(), first=True)
    assert s.exit_code == 0 and s.done == 1 and s.quarantined == [], s.lines()
    ((_, why),) = s.still_written
    assert "changed in the source since the run found it" in why
    assert issubclass(SeriesStillWrittenError, SourceMismatchError)  # ingest's own error, as before


def test_a_new_dicom_file_cut_short_beside_the_series_holds_it_back_and_the_next_scan_sees_it(tmp_path):
    """A file the archive has only begun to write (its header cut short before the series can be read) beside the
    series: the case waits; a new scan lists it (skipped as cut short) and no longer counts it as arriving."""
    from pipeline.runner.discover import discover

    _, files = _series(tmp_path / "archive", 11)
    src = tmp_path / "incoming"
    _copy(files, src)
    cfg = load_config(environ={})
    found = discover([src], cfg)
    (case,) = found.cases
    assert found.snapshot.still_written(case) is None  # untouched
    (src / "CT001_99999.dcm").write_bytes(files[0].read_bytes()[:600])
    err = found.snapshot.still_written(case)
    assert err is not None and isinstance(err, SeriesStillWrittenError)
    assert f"1 new DICOM file(s) beside it are cut short, still being written (the first: {src / 'CT001_99999.dcm'})" in str(err)
    again = discover([src], cfg)
    assert again.snapshot.still_written(again.cases[0]) is None
