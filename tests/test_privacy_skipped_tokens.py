"""Where the tokens of skipped files and their folders stand. A cut-short or stray file's name is a token where that
file is meant, not wherever another file of the same name is written (another series' ``IM0001.dcm``), and a name a
scanner gives any file (``IM0001.dcm``, ``1.dcm``, a UID) is no token at all: it names nobody. A folder named by a
token while it held skipped files only is named by the headers of its series once a series is found in it, as when
that series is found first; until then its token stands where that folder is meant (after its parent as a path shows
it), not in another folder of that name."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.ingest import scan_directory
from pipeline.runner.redact import PathRedactor
from tests._support.dicom import write_series

FILE = r"<file:[0-9a-f]{6}>"
FOLDER = r"<folder:[0-9a-f]{6}>"


def _cut_short(path: Path, like: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(like.read_bytes()[:200])
    return path


def test_a_cut_short_files_token_hides_no_other_series_file_of_that_name(tmp_path):
    # was: series a's IM0001.dcm and series c's chest_0001.dcm read as the cut-short files' tokens
    src = tmp_path / "src"
    a = write_series(src / "a", n=3, series_uid="1.2.3.440", names=lambda k: f"IM{k + 1:04d}.dcm")
    c = write_series(src / "c", n=3, series_uid="1.2.3.441", names=lambda k: f"chest_{k + 1:04d}.dcm")
    b = write_series(src / "b", n=3, series_uid="1.2.3.442", names=lambda k: f"x{k:04d}.dcm")
    cut = [_cut_short(src / "b" / "IM0001.dcm", a[0]), _cut_short(src / "b" / "chest_0001.dcm", c[0])]
    uid = _cut_short(src / "b" / "1.2.840.113619.2.55.3.604688.dcm", b[0])
    scan = scan_directory([src], validate=False)
    assert {(f.path, f.kind) for f in scan.skipped_files} == {(p, "truncated") for p in [*cut, uid]}
    r = PathRedactor()
    r.add_scan(scan.series)
    r.add_skipped(((f.path, f.kind) for f in scan.skipped_files), roots=scan.roots)

    assert r(f"series 1.2.3.440: {a[0]}; series 1.2.3.441: {c[0]}") == f"series 1.2.3.440: {a[0]}; series 1.2.3.441: {c[0]}"
    assert r(f"skipped {cut[0]}, {uid}") == f"skipped {cut[0]}, {uid}"  # scanners' names: no token
    shown = r(f"skipped {cut[1]}: cut short; chest_0001.dcm ends early")
    assert re.fullmatch(rf"skipped {re.escape(str(src))}/b/{FILE}\.dcm: cut short; {FILE}\.dcm ends early", shown), shown
    worker = PathRedactor.of(r.shared)  # a worker process's redactor: the same
    assert worker(f"{c[0]} {cut[1]}") == r(f"{c[0]} {cut[1]}")


def _scans(src: Path) -> tuple:
    """A scan of ``src`` while its folder ``inbox/DOE`` held a note only, then of a series found there later."""
    (src / "inbox" / "DOE").mkdir(parents=True)
    (src / "inbox" / "DOE" / "notes.txt").write_text("not DICOM")
    first = scan_directory([src], validate=False)
    write_series(src / "inbox" / "DOE" / "ct", n=3, series_uid="1.2.3.443")
    return first, scan_directory([src / "inbox" / "DOE" / "ct"], validate=False)


def _record(r: PathRedactor, scan) -> None:
    r.add_scan(scan.series)
    r.add_skipped(((f.path, f.kind) for f in scan.skipped_files), roots=scan.roots)


def test_a_folder_that_held_skipped_files_only_loses_its_token_once_a_series_is_found_there(tmp_path):
    # was: src/inbox/<folder:xxxxxx>/ct/... after the series came; src/inbox/DOE/ct/... had it been found first
    src = tmp_path / "src"
    first, later = _scans(src)
    slice_path = later.series[0].files[0]
    text = f"series {slice_path}; skipped {src}/inbox/DOE/notes.txt"

    r = PathRedactor(secret="s")
    _record(r, first)
    assert "/inbox/" not in r(text) and "/DOE/" not in r(text), r(text)  # no series there yet
    worker = PathRedactor.of(r.shared)  # a worker process given the run's tokens before the series came
    _record(r, later)
    worker.add_scan(later.series)
    shown = r(text)
    assert re.fullmatch(rf"series {re.escape(str(slice_path))}; skipped {re.escape(str(src))}/inbox/DOE/{FILE}\.txt", shown)
    assert worker(text) == shown

    series_first = PathRedactor(secret="s")
    for scan in (later, first):
        _record(series_first, scan)
    assert series_first(text) == shown


def test_a_folder_token_stays_while_another_folder_of_that_name_holds_skipped_files_only(tmp_path):
    src = tmp_path / "src"
    (src / "other" / "DOE").mkdir(parents=True)
    (src / "other" / "DOE" / "report.txt").write_text("not DICOM")
    first, later = _scans(src)
    r = PathRedactor()
    _record(r, first)
    _record(r, later)  # a series in inbox/DOE: other/DOE still holds skipped files only
    shown = r(f"{src}/other/DOE/report.txt")
    assert re.fullmatch(rf"{re.escape(str(src))}/{FOLDER}/{FOLDER}/{FILE}\.txt", shown), shown


def test_a_folder_token_hides_no_other_folder_of_that_name_holding_a_series(tmp_path):
    # was: src/ward/<folder:xxxxxx>/ct/... for a series of SMITH^JOHN filed under a folder DOE, because src/inbox/DOE
    # held a note only
    src = tmp_path / "src"
    (src / "inbox" / "DOE").mkdir(parents=True)
    (src / "inbox" / "DOE" / "notes.txt").write_text("not DICOM")
    (slice_path, *_) = write_series(src / "ward" / "DOE" / "ct", n=3, series_uid="1.2.3.444")
    r = PathRedactor()
    _record(r, scan_directory([src], validate=False))

    text = f"series {slice_path}; skipped {src}/inbox/DOE/notes.txt"
    shown = r(text)
    assert re.fullmatch(
        rf"series {re.escape(str(slice_path))}; skipped {re.escape(str(src))}/{FOLDER}/{FOLDER}/{FILE}\.txt",
        shown,
    ), shown
    assert r("ward/DOE/ct/IM0001.dcm, inbox/DOE/notes.txt") == f"ward/DOE/ct/IM0001.dcm, {r('inbox/DOE/notes.txt')}"
    assert "/DOE/" not in r("inbox/DOE/notes.txt")  # a path relative to the source: after its parent as it is written
    worker = PathRedactor.of(r.shared)
    assert worker(text) == shown


def test_a_folder_token_stands_after_its_parents_token(tmp_path):
    # a text already redacted once (a worker's message the main process writes) shows the parent as its token
    src = tmp_path / "src"
    (src / "inbox" / "DOE").mkdir(parents=True)
    (src / "inbox" / "DOE" / "notes.txt").write_text("not DICOM")
    r = PathRedactor()
    _record(r, scan_directory([src], validate=False))
    once = r(f"{src}/inbox/DOE/notes.txt")
    assert r(once) == once and "/DOE/" not in once, once
    other = PathRedactor()  # another parent's token: not this folder's
    (src / "misc" / "DOE").mkdir(parents=True)
    (src / "misc" / "DOE" / "x.txt").write_text("not DICOM")
    _record(other, scan_directory([src / "misc"], validate=False))
    assert other(f"{src}/ward/DOE/ct") == f"{src}/ward/DOE/ct"


def test_a_folder_below_a_relative_source_is_named_by_its_token_where_the_path_begins(tmp_path, monkeypatch):
    # was: DOE/<file:xxxxxx>.txt for ctpipe ingest . run in the folder holding DOE/notes.txt
    (tmp_path / "DOE").mkdir()
    (tmp_path / "DOE" / "notes.txt").write_text("not DICOM")
    monkeypatch.chdir(tmp_path)
    scan = scan_directory(["."], validate=False)
    (skipped,) = scan.skipped_files
    r = PathRedactor()
    _record(r, scan)
    shown = r(f"skipped {skipped.path}: not DICOM; {tmp_path}/DOE/notes.txt")
    assert re.fullmatch(rf"skipped {FOLDER}/{FILE}\.txt: not DICOM; {re.escape(str(tmp_path))}/{FOLDER}/{FILE}\.txt", shown), (
        shown
    )


def test_a_runs_log_names_a_folder_a_later_worklist_row_finds_a_series_in_by_its_name_throughout(
    tmp_path, capsys, own_signals, monkeypatch
):
    # was: the first row's lines (inbox/DOE/notes.txt and the link inbox/DOE/ct skipped) kept inbox/<folder:xxxxxx>/
    # in run.log and on the console, written before the second row found the series the link leads to in that folder
    import pipeline.runner.batch as batch
    from pipeline.cli import main

    real = batch.build_stages
    monkeypatch.setattr(batch, "build_stages", lambda cfg: [s for s in real(cfg) if s.name == "ingest"])
    src, run = tmp_path / "src", tmp_path / "run"
    write_series(src / "inbox" / "ward" / "ct", n=12, series_uid="1.2.3.445")
    (src / "inbox" / "DOE").mkdir()
    (src / "inbox" / "DOE" / "notes.txt").write_text("not DICOM")
    write_series(tmp_path / "elsewhere" / "ct", n=12, series_uid="1.2.3.446")
    (src / "inbox" / "DOE" / "ct").symlink_to(tmp_path / "elsewhere" / "ct", target_is_directory=True)
    worklist = tmp_path / "worklist.csv"  # the link's folder named as its skip reason says: scan that folder directly
    worklist.write_text(f"path\n{src / 'inbox'}\n{src / 'inbox' / 'DOE' / 'ct'}\n")
    argv = ["run", str(worklist), "--out", str(run), "--workers", "0", "-v", "--no-dicom", "--set", "report.enabled=false"]
    assert main(argv) == 0
    cap = capsys.readouterr()

    log = (run / "run.log").read_text()
    lines = [ln for ln in log.splitlines() if f"{src}/inbox/" in ln]
    assert any('"case_id": "1.2.3.446"' in ln and f"{src}/inbox/DOE/" in ln for ln in lines), log  # the second row's
    assert len([ln for ln in lines if "skipped file" in ln and f"{src}/inbox/DOE/" in ln]) == 2, log  # the first row's
    assert [ln for ln in lines if f"{src}/inbox/<folder:" in ln] == [], log
    assert f"{src}/inbox/<folder:" not in cap.out + cap.err and f"{src}/inbox/DOE/" in cap.out + cap.err
