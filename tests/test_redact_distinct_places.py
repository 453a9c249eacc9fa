"""Two skipped files or folders of the same name in different places read as two tokens: a token stands for one
folder or file (by its resolved path), the same wherever that one appears in a run (run.log, the run store, the
report, a worker process's records), never for another of the same name (``in/a/PATIENT_X/`` and
``in/b/PATIENT_X/``, each holding skipped files only, are two folders)."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.cli import main
from pipeline.ingest import scan_directory
from pipeline.runner.redact import PathRedactor

TOKEN = r"<(?:folder|file):[0-9a-f]{6}>"


def _two_patient_folders(src: Path) -> None:
    """``a/PATIENT_X`` with two notes, ``b/PATIENT_X`` with one of the same name: skipped files only."""
    for where, names in (("a", ("notes.txt", "letter.pdf")), ("b", ("notes.txt",))):
        (src / where / "PATIENT_X").mkdir(parents=True)
        for name in names:
            (src / where / "PATIENT_X" / name).write_text("not DICOM")


def _tokens(path_text: str) -> list[str]:
    """The tokens of a redacted path below the source: one per folder, then the file's."""
    return re.findall(TOKEN, path_text)


def test_a_run_names_two_skipped_only_folders_of_one_name_by_two_tokens(tmp_path, capsys, own_signals, monkeypatch):
    # was: in/<folder:80d6c9>/<folder:73242a>/... and in/<folder:b72418>/<folder:73242a>/...: one token for two folders
    from pipeline.runner.results import open_run

    src, run = tmp_path / "in", tmp_path / "run"
    _two_patient_folders(src)
    monkeypatch.chdir(tmp_path)
    argv = ["run", "in", "--out", str(run), "--workers", "0", "-v", "--set", "report.enabled=true"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    console, log = cap.out + cap.err, (run / "run.log").read_text()
    stored = sorted(open_run(run).skipped.item)
    csv = (run / "report" / "skipped.csv").read_text()
    assert len(stored) == 3 and all(item in csv and item in log for item in stored), (stored, csv, log)
    assert not [t for t in ("PATIENT_X", "notes", "letter") if t in log + csv + console], log + csv + console

    parts = [_tokens(item) for item in stored]
    assert all(len(p) == 3 for p in parts), stored
    by_parent: dict[str, set[str]] = {}
    for parent, folder, _ in parts:
        by_parent.setdefault(parent, set()).add(folder)
    assert len(by_parent) == 2 and all(len(f) == 1 for f in by_parent.values()), stored  # one folder, one token
    (a_folder,), (b_folder,) = by_parent.values()
    assert a_folder != b_folder, stored
    notes = {p[2] for p, item in zip(parts, stored) if item.endswith(".txt")}
    assert len(notes) == 2, stored  # the two notes.txt are two files


def _record(r: PathRedactor, scan) -> None:
    r.add_scan(scan.series)
    r.add_skipped(((f.path, f.kind) for f in scan.skipped_files), roots=scan.roots)


def test_one_folder_reads_as_one_token_however_a_path_shows_it_and_in_a_worker(tmp_path, monkeypatch):
    src = tmp_path / "in"
    _two_patient_folders(src)
    r = PathRedactor()
    _record(r, scan_directory([src], validate=False))
    worker = PathRedactor.of(r.shared)
    monkeypatch.chdir(tmp_path)
    a_note, b_note = src / "a" / "PATIENT_X" / "notes.txt", src / "b" / "PATIENT_X" / "notes.txt"
    a_shown = r(str(a_note))
    # absolute, relative to the current folder, relative to the source: the same tokens
    assert _tokens(r("in/a/PATIENT_X/notes.txt")) == _tokens(a_shown) == _tokens(r("a/PATIENT_X/notes.txt")), a_shown
    assert _tokens(r(str(src / "a" / "PATIENT_X" / "letter.pdf")))[:-1] == _tokens(a_shown)[:-1]
    b_shown = r(str(b_note))
    assert _tokens(a_shown)[1] != _tokens(b_shown)[1] and _tokens(a_shown)[2] != _tokens(b_shown)[2], (a_shown, b_shown)
    assert worker(f"{a_note} {b_note}") == f"{a_shown} {b_shown}"
    # a text whose parent folder is a token already (a worker's record written again): the token of the folder in it
    a_token = _tokens(a_shown)[0]
    assert _tokens(r(f"{src}/{a_token}/PATIENT_X/notes.txt")) == _tokens(a_shown)


def test_two_links_not_followed_to_folders_of_one_name_read_as_two_tokens(tmp_path):
    src = tmp_path / "in"
    for where in ("a", "b"):
        (tmp_path / where / "DOE_JANE").mkdir(parents=True)
        (src / f"link_{where}").parent.mkdir(parents=True, exist_ok=True)
        (src / f"link_{where}").symlink_to(tmp_path / where / "DOE_JANE", target_is_directory=True)
    r = PathRedactor()
    _record(r, scan_directory([src], validate=False))
    a, b = r(str(tmp_path / "a" / "DOE_JANE")), r(str(tmp_path / "b" / "DOE_JANE"))
    assert "DOE_JANE" not in a + b and a != b, (a, b)
    assert PathRedactor.of(r.shared)(f"{a} {b}") == f"{a} {b}"


def test_two_files_given_alone_of_one_name_read_as_two_tokens(tmp_path):
    # a worklist's rows naming image files: each written as its own token, folders included
    files = [tmp_path / where / "DOE_JANE.nii.gz" for where in ("a", "b")]
    for f in files:
        f.parent.mkdir()
        f.write_bytes(b"not an image")
    r = PathRedactor()
    r.add_skipped(((f, "not_dicom") for f in files), roots=files, given_alone=True)
    a, b = r(str(files[0])), r(str(files[1]))
    assert re.fullmatch(r"<file:[0-9a-f]{6}>\.nii\.gz", a) and re.fullmatch(r"<file:[0-9a-f]{6}>\.nii\.gz", b), (a, b)
    assert a != b
    assert r(f"x {tmp_path.name}/a/DOE_JANE.nii.gz") == f"x {tmp_path.name}/a/{a}"  # its name after its folder


def test_two_broken_links_targets_of_one_name_read_as_two_tokens(tmp_path):
    # a broken link's skip reason names its target: /archive/a/DOE_JANE.dcm and /archive/b/DOE_JANE.dcm are two files
    src = tmp_path / "in"
    src.mkdir()
    targets = [tmp_path / "archive" / where / "DOE_JANE.dcm" for where in ("a", "b")]
    for n, target in enumerate(targets):
        (src / f"scan{n}.dcm").symlink_to(target)
    scan = scan_directory([src], validate=False)
    assert len(scan.skipped_files) == 2
    r = PathRedactor()
    _record(r, scan)
    a, b = r(str(targets[0])), r(str(targets[1]))
    assert "DOE_JANE" not in a + b and a != b, (a, b)
