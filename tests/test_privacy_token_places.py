"""A skipped file's or folder's token stands where that file or folder is meant, by the resolved path of the folder
holding it, not wherever a folder of the same name shows the same parent name: ``b/inbox/DOE`` holding a series keeps
its name beside ``a/inbox/DOE`` holding a note only, however a path shows either (absolute, relative to the current
folder, through a symbolic link); a path relative to an unknown folder that may be the skipped one's
(``inbox/DOE/notes.txt``) reads as its token."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pipeline.ingest import scan_directory
from pipeline.runner.redact import PathRedactor
from tests._support.dicom import write_series

FILE = r"<file:[0-9a-f]{6}>"
FOLDER = r"<folder:[0-9a-f]{6}>"


def _record(r: PathRedactor, scan) -> None:
    r.add_scan(scan.series)
    r.add_skipped(((f.path, f.kind) for f in scan.skipped_files), roots=scan.roots)


def _note(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("not DICOM")


def test_a_folder_token_stands_for_its_own_folder_not_another_of_that_name_under_a_parent_of_that_name(tmp_path, monkeypatch):
    # was: b/inbox/<folder:xxxxxx>/ct/... for the series found in b/inbox/DOE: a/inbox/DOE's token stood after any
    # folder named inbox, and stayed there once b/inbox/DOE was released
    src = tmp_path / "src"
    _note(src / "a" / "inbox" / "DOE")
    _note(src / "b" / "inbox" / "DOE")
    (tmp_path / "via_a").symlink_to(src / "a", target_is_directory=True)
    (tmp_path / "via_b").symlink_to(src / "b", target_is_directory=True)
    r = PathRedactor(secret="s")
    _record(r, scan_directory([src], validate=False))  # both held a note only
    files = write_series(src / "b" / "inbox" / "DOE" / "ct", n=3, series_uid="1.2.3.447", names=lambda k: f"chest_{k:04d}.dcm")
    (src / "a" / "inbox" / "DOE" / "chest_0001.dcm").write_bytes(files[1].read_bytes()[:200])  # cut short
    _record(r, scan_directory([src], validate=False))  # a series in b/inbox/DOE since
    worker = PathRedactor.of(r.shared)
    monkeypatch.chdir(tmp_path)

    b_note = r(str(src / "b" / "inbox" / "DOE" / "notes.txt")).rpartition("/")[2]  # its own token, not a's note's
    assert re.fullmatch(rf"{FILE}\.txt", b_note) and b_note not in r(str(src / "a" / "inbox" / "DOE" / "notes.txt"))
    for shown in (str(src / "b"), "src/b", str(tmp_path / "via_b"), "via_b"):  # absolute, relative, through a link
        for text in (f"series {shown}/inbox/DOE/ct/chest_0001.dcm", f"skipped {shown}/inbox/DOE/notes.txt"):
            assert r(text) == text.replace("notes.txt", b_note), (text, r(text))
            assert worker(text) == r(text)
    for shown in (str(src / "a"), "src/a", str(tmp_path / "via_a"), "via_a", ""):  # "": relative to a folder unknown
        for name in ("notes.txt", "chest_0001.dcm"):
            text = f"skipped '{shown}{'/' if shown else ''}inbox/DOE/{name}'"
            shown_redacted = r(text)  # a, below the source and holding no series, is a token too
            assert re.fullmatch(rf"skipped '[^']*{FOLDER}/{FOLDER}/{FILE}\.\w+'", shown_redacted), (text, shown_redacted)
            assert worker(text) == shown_redacted
    html = f"<td>{src}/a/inbox/DOE/notes.txt</td><td>{src}/b/inbox/DOE/ct/chest_0001.dcm</td>"  # paths after a ">"
    shown_html = rf"<td>{re.escape(str(src))}/{FOLDER}/{FOLDER}/{FOLDER}/{FILE}\.txt</td><td>{re.escape(str(src))}/b/inbox/DOE/ct/chest_0001\.dcm</td>"
    assert re.fullmatch(shown_html, r(html)), r(html)
    assert "DOE" not in r("/gone/inbox/DOE/notes.txt") + r("<b>inbox/DOE/notes.txt")  # in doubt: by the parent's name
    ward = tmp_path / "ward" / "inbox" / "DOE"  # an existing folder elsewhere
    ward.mkdir(parents=True)
    assert r(f"{ward}/ct/chest_0001.dcm") == f"{ward}/ct/chest_0001.dcm"


def test_ctpipe_ingest_names_a_series_folder_by_its_name_beside_a_skipped_folder_of_that_name(tmp_path, capsys):
    # was: site2/inbox/<folder:xxxxxx>/ct for the series' folder, named by site1/inbox/0042's token
    from pipeline.cli import main

    def patient(i, ds):
        ds.PatientName, ds.PatientID = "ROE^RICHARD", "MRN99999"

    src, out = tmp_path / "incoming", tmp_path / "out"
    series = src / "site2" / "inbox" / "0042" / "ct"
    files = write_series(series, n=12, series_uid="1.2.3.448", tweak=patient, names=lambda k: f"chest_{k:04d}.dcm")
    skipped = src / "site1" / "inbox" / "0042"
    skipped.mkdir(parents=True)
    (skipped / "DOE_JANE_referral.pdf").write_bytes(b"%PDF-1.4")  # another patient's, none of her images here
    (skipped / "chest_0001.dcm").write_bytes(files[1].read_bytes()[:200])  # cut short
    argv = ["ingest", str(src), "--out", str(out / "cache"), "--json", str(out / "ingest.json"), "-v"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    written = cap.out + cap.err + (out / "ingest.json").read_text()
    assert not re.search(r"doe|jane|roe|richard|99999", written, re.IGNORECASE), written
    assert f"12 file(s) in {series})" in cap.out + cap.err, written
    report = json.loads((out / "ingest.json").read_text())
    paths = [f["path"] for f in report["skipped_files"]]
    assert len(paths) == 2 and all(re.fullmatch(rf"{re.escape(str(src))}(/{FOLDER}){{3}}/{FILE}\.(pdf|dcm)", p) for p in paths)
