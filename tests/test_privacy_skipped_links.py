"""A symbolic link to a folder is skipped by a folder scan (and named by a token: no header was checked against its
name, nor against the folder it points to); once a series is found through it (a later worklist row, or a source
naming the link, as its skip reason advises), the link is that series' folder: it reads as that series' headers name
it, in every line and row, whichever came first, and the folder it points to, named in its skip reason, is checked
against those headers too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.ingest import scan_directory
from pipeline.runner.redact import PathRedactor
from tests._support.dicom import write_series

PLANTED = re.compile(r"(?<![a-z])(doe|jane)(?![a-z])|12345", re.IGNORECASE)


def _patient(i, ds):
    ds.PatientName, ds.PatientID = "DOE^JANE", "MRN12345"


def _linked(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """``src/inbox/<name>``: a link to the folder ``archive/Jane Doe`` holding a series of DOE^JANE."""
    src = tmp_path / "src"
    (src / "inbox").mkdir(parents=True)
    write_series(tmp_path / "archive" / "Jane Doe", n=3, series_uid="1.2.3.449", tweak=_patient)
    link = src / "inbox" / name
    link.symlink_to(tmp_path / "archive" / "Jane Doe", target_is_directory=True)
    return src, link


def _record(r: PathRedactor, scan) -> None:
    r.add_scan(scan.series)
    r.add_skipped(((f.path, f.kind) for f in scan.skipped_files), roots=scan.roots)


@pytest.mark.parametrize("name", ["DOE_JANE", "ct"])
def test_a_skipped_link_reads_as_its_series_names_it_once_a_series_is_found_through_it(tmp_path, name):
    # was: the link src/inbox/<file:xxxxxx> in its skip line and as the case's source, src/inbox/<patient:xxxxxx> (or
    # src/inbox/ct) in its files' paths; and the folder it points to, archive/Jane Doe, named in the skip line once
    # its series was found
    src, link = _linked(tmp_path, name)
    folder_scan, link_scan = scan_directory([src], validate=False), scan_directory([link], validate=False)
    (skipped,) = folder_scan.skipped_files
    assert skipped.kind == "not_followed"
    texts = [f"skipped file {link}: {skipped.reason}", f"case source {link}", f"file {link_scan.series[0].files[0]}"]

    shown = {}
    for order in ("link first", "series first"):
        r = PathRedactor(secret="s")
        for scan in (folder_scan, link_scan) if order == "link first" else (link_scan, folder_scan):
            _record(r, scan)
        shown[order] = [r(t) for t in texts]
        assert PathRedactor.of(r.shared)(texts[0]) == shown[order][0]
    assert shown["link first"] == shown["series first"], shown
    lines = shown["link first"]
    assert not any(PLANTED.search(t) for t in lines), lines
    as_headers_name_it = "<patient:" if name == "DOE_JANE" else name  # the series' token, or its name as it is
    (inbox,) = {
        re.search(rf"{re.escape(str(src))}/inbox/(<\w+:[0-9a-f]{{6}}>|[^/:\s<]+)", t).group(1) for t in lines
    }  # the same in all
    assert inbox.startswith(as_headers_name_it) and "<file:" not in " ".join(lines), lines
    assert re.search(r"to the folder \S+/archive/<patient:[0-9a-f]{6}> ", lines[0]), lines[0]


def test_a_run_names_a_link_a_later_worklist_row_finds_a_series_through_by_the_series_token(
    tmp_path, capsys, own_signals, monkeypatch
):
    # was: run.log and the report's skipped.csv named the link src/inbox/<file:xxxxxx> and the folder it points to
    # by its name (archive/Jane Doe), the case lines src/inbox/<patient:xxxxxx>
    import pipeline.runner.batch as batch
    from pipeline.cli import main
    from tests._support.leaks import file_text

    real = batch.build_stages
    monkeypatch.setattr(batch, "build_stages", lambda cfg: [s for s in real(cfg) if s.name in ("ingest", "write")])
    src, link = _linked(tmp_path, "DOE_JANE")
    write_series(src / "inbox" / "ward", n=12, series_uid="1.2.3.450")
    write_series(tmp_path / "archive" / "Jane Doe", n=12, series_uid="1.2.3.449", tweak=_patient)
    run, worklist = tmp_path / "run", tmp_path / "worklist.csv"
    worklist.write_text(f"path\n{src / 'inbox'}\n{link}\n")  # the link's folder scanned directly, as its reason says
    argv = ["run", str(worklist), "--out", str(run), "--workers", "0", "-v", "--no-dicom", "--set", "report.enabled=true"]
    assert main(argv) == 0
    cap = capsys.readouterr()

    written = {"console": cap.out + cap.err}
    written |= {str(p.relative_to(run)): file_text(p) for p in run.rglob("*") if p.is_file() and p.parts[-2] != "dicom"}
    assert [(where, m.group(0)) for where, t in written.items() for m in PLANTED.finditer(t + where)] == []
    lines = written["console"] + written["run.log"] + written["report/skipped.csv"]
    links = set(re.findall(rf"{re.escape(str(src))}/inbox/(<\w+:[0-9a-f]{{6}}>)", lines))  # the link, as each line shows it
    assert len(links) == 1 and next(iter(links)).startswith("<patient:"), links
    skipped = (run / "report" / "skipped.csv").read_text()
    assert re.search(r"inbox/<patient:[0-9a-f]{6}>,not_followed,.*to the folder \S+/archive/<patient:", skipped), skipped
