"""A file of a series that lands in the source just after the run decided the series was complete (its check before
publishing, :meth:`SourceSnapshot.still_written`) and before the case is published: the series is checked again once
its folder is in place, so the case is withdrawn and left for the next run, which analyses the whole series; never
published as the whole series. The file lands through a hook on the check itself: deterministic, no sleeps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from pipeline.runner import run_batch
from pipeline.runner.arrivals import SourceSnapshot
from pipeline.runner.stages import IngestStage, WriteStage
from tests._support.runner import PHANTOM, db_rows, manifest


def _series(root: Path, seed: int) -> tuple[str, list[Path]]:
    from pipeline.ingest import read_headers
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    ph = generate_phantom(seed, n_nodules=1, **PHANTOM)
    files = write_dicom_series(ph.volume, root, seed=seed)
    headers, _ = read_headers(files, processes=False)
    return ph.volume.series_uid, [h.path for h in sorted(headers, key=lambda h: h.position[2])]  # type: ignore[index]


def test_a_file_landing_between_the_check_and_publishing_withdraws_the_case_for_the_next_run(tmp_path, monkeypatch):
    src, out = tmp_path / "export", tmp_path / "run"
    uid, files = _series(tmp_path / "archive", 31)
    (src / "s").mkdir(parents=True)
    for f in files[:-1]:
        shutil.copy2(f, src / "s" / f.name)
    check = SourceSnapshot.still_written
    landed: list[Path] = []

    def check_then_land(self: SourceSnapshot, case: Any) -> Any:
        verdict = check(self, case)
        if not landed:  # the archive's last file lands the moment after the run decided
            landed.append(Path(shutil.copy2(files[-1], src / "s" / files[-1].name)))
        return verdict

    monkeypatch.setattr(SourceSnapshot, "still_written", check_then_land)
    opts: dict[str, Any] = {"workers": 0, "report.enabled": False}
    first = run_batch([src], out=out, stages=[IngestStage(), WriteStage()], **opts)
    assert landed and first.exit_code == 0 and first.done == 0, first.lines()
    ((_, why),) = first.still_written
    assert f"series {uid} was still being written while the run processed it" in why
    assert not (out / "cases").exists() or not list((out / "cases").iterdir())  # nothing of it published
    assert [p for p in out.rglob("*") if p.name == "volume.json"] == []
    monkeypatch.setattr(SourceSnapshot, "still_written", check)

    again = run_batch([src], out=out, stages=[IngestStage(), WriteStage()], **opts)  # the next night

    assert again.exit_code == 0, again.lines()
    done = db_rows(out, "SELECT case_id, case_key FROM cases WHERE status='done' AND series_uid=?", (uid,))
    whole = [
        cid
        for cid, _ in done
        if json.loads((out / "cases" / cid / "volume.json").read_text())["geometry"]["shape"][0] == len(files)
    ]
    assert again.done == 1 and len(done) == 1 and whole, f"no published case of series {uid} holds its {len(files)} files: {done}"
    assert manifest(out / "cases" / whole[-1])["series_uid"] == uid
