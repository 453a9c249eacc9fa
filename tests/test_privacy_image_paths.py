"""What ctpipe writes under --out about an image file (NIfTI/MHA/NRRD) holds nothing of its path unless identifiers
are kept: no header tells whether its name or its folders' are a patient's. The console may show what the user
typed; run.log, the report, the run store and the quarantine records name the file and its folders by tokens."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipeline.cli import main
from tests._support.leaks import file_text

PLANTED = ("doe", "jane", "mrn12345")


def _found(text: str) -> list[str]:
    low = text.lower()
    return [w for w in PLANTED if re.search(rf"(?<![a-z]){w}(?![a-z])", low) or (w[0].isdigit() and w in low)]


def _in_files(out: Path) -> list[str]:
    """The planted words in the names and contents of every file under ``out`` (logs, reports, the run store)."""
    return [
        f"{p.relative_to(out)}: {w}"
        for p in sorted(out.rglob("*"))
        if p.is_file()
        for w in _found(str(p.relative_to(out)) + file_text(p))
    ]


@pytest.fixture(scope="module")
def label_map(tmp_path_factory) -> Path:
    """A small label map (the warning of a segmentation given for a CT) in a folder named after a patient."""
    import numpy as np
    import SimpleITK as sitk

    values = np.zeros((16, 32, 32), np.uint8)
    values[4:12, 8:24, 8:24] = 1
    image = sitk.GetImageFromArray(values)
    image.SetSpacing((2.0, 2.0, 5.0))
    path = tmp_path_factory.mktemp("exports") / "DOE_JANE" / "MRN12345_chest.nii.gz"
    path.parent.mkdir()
    sitk.WriteImage(image, str(path))
    return path


def test_reconstruct_writes_nothing_of_an_image_files_path(label_map, tmp_path, capsys):
    import numpy as np
    import SimpleITK as sitk

    out = tmp_path / "r"
    argv = ["reconstruct", str(label_map), "--out", str(out), "--organs", "lung_left", "--device", "cpu", "-v"]
    assert main([*argv, "--dicom", "none"]) == 1  # a label map is refused: nothing written
    assert "looks like a label map" in capsys.readouterr().err and not out.exists()
    values = np.full((16, 32, 32), -1000, np.int16)
    values[:, 6:26, 6:26] = 40  # soft tissue in air: a CT in HU
    image = sitk.GetImageFromArray(values)
    image.SetSpacing((2.0, 2.0, 5.0))
    ct = tmp_path / "DOE_JANE" / "MRN12345_ct.nii.gz"
    ct.parent.mkdir()
    sitk.WriteImage(image, str(ct))
    argv[1] = str(ct)
    main([*argv, "--dicom", "none"])
    capsys.readouterr()
    assert list(out.iterdir()) and _in_files(out) == []


def test_a_run_writes_nothing_of_an_image_files_path_a_worklist_names(label_map, tmp_path, capsys, own_signals):
    # was: run.log, the report, the run store and quarantine/ held .../DOE_JANE/<file:xxxxxx>.nii.gz
    worklist, run = label_map.parent.parent / "worklist.csv", tmp_path / "run"
    worklist.write_text("path\nDOE_JANE/MRN12345_chest.nii.gz\n")  # as typed: relative to the worklist's folder
    argv = ["run", str(worklist), "--workers", "0", "--no-dicom", "--set", "report.enabled=true"]
    assert main([*argv, "--out", str(run)]) != 0  # quarantined: an image file (a label map), no CT series there
    capsys.readouterr()
    assert (run / "run.log").is_file() and _in_files(run) == []
    assert re.search(
        r"worklist\.csv:2 \(<file:[0-9a-f]{6}>\.nii\.gz\): a NIfTI/MHA/NRRD image, not a DICOM series.*looks like a label map",
        (run / "run.log").read_text(),
    )
    assert main([*argv, "--keep-identifiers", "--out", str(tmp_path / "kept")]) != 0
    assert "DOE_JANE/MRN12345_chest.nii.gz" in (tmp_path / "kept" / "run.log").read_text()


def test_ctpipe_ingest_writes_nothing_of_an_image_files_path_in_its_json_report(label_map, tmp_path, capsys):
    # was: "roots": [".../DOE_JANE/<file:xxxxxx>.nii.gz"], the folders as typed, and the skipped file's path likewise
    out = tmp_path / "i"
    argv = ["ingest", str(label_map), "--out", str(out / "cache"), "--json", str(out / "ingest.json")]
    assert main(argv) == 1  # nothing cached: no DICOM
    capsys.readouterr()
    data = json.loads((out / "ingest.json").read_text())
    assert re.fullmatch(r"<file:[0-9a-f]{6}>\.nii\.gz", data["roots"][0]), data["roots"]
    assert [f["path"] for f in data["skipped_files"]] == data["roots"]
    assert _in_files(out) == []
    assert main([*argv, "--keep-identifiers"]) == 1
    assert json.loads((out / "ingest.json").read_text())["roots"] == [str(label_map)]
