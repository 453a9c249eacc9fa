"""Quality flags in every output: run store, notebook API, report (per-case table, headline); unreliable lung
figures kept and marked; the cases/day projection says what it rests on; no lungs, no search."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import unquote

import pandas as pd
import pytest

from pipeline.runner import build_report, open_run, run_batch
from pipeline.runner.report import MIN_CASES_TO_PROJECT, MIN_MINUTES_TO_PROJECT
from pipeline.runner.stages import flatten_measurements
from pipeline.runner.store import RunStore
from tests._support.runner import QUICK, write_no_lungs

pytest_plugins = ["tests._support.runner"]

PARTIAL = {
    "lung_coverage": "partial",
    "contrast_phase": "venous",
    "flags": [
        {"code": "lungs_apex_cut", "severity": "warning", "message": "the lung apices are cut by the scan range"},
        {"code": "contrast_venous", "severity": "info", "message": "IV contrast, venous phase (estimate)"},
    ],
    "unreliable": ["lungs_total_volume_ml"],
    "figures": {},
}
COMPLETE = {"lung_coverage": "complete", "contrast_phase": "non_contrast", "flags": [], "unreliable": [], "figures": {}}
CONTRAST = {
    "lung_coverage": "complete",
    "contrast_phase": "arterial",
    "flags": [{"code": "contrast_arterial", "severity": "info", "message": "IV contrast, arterial phase"}],
    "unreliable": [],
    "figures": {},
}


def test_unreliable_lung_figures_keep_their_name_and_value_and_are_marked():
    tree = {
        "lungs": {
            "lung_left_volume_ml": {"value": 1200.5, "reliable": False, "reason": "lungs_apex_cut"},
            "lungs_total_volume_ml": 2500.0,
            "emphysema_index_pct": None,
        },
        "organs": {"body": {"volume_ml": 30000.0, "surface_mm2": float("nan")}},
        "nodules": [{"volume_mm3": 33.5, "error": None}],
    }
    rows = list(flatten_measurements(tree))
    assert rows == [
        ("lungs.lung_left_volume_ml", 1200.5, "mL", False, "lungs_apex_cut"),
        ("lungs.lungs_total_volume_ml", 2500.0, "mL", True, None),
        ("organs.body.volume_ml", 30000.0, "mL", True, None),
        ("nodules.0.volume_mm3", 33.5, "mm3", True, None),
    ]
    assert rows[0].reliable is False and rows[0].name == "lungs.lung_left_volume_ml"


def _case(
    store: RunStore,
    run_dir: Path,
    cid: str,
    quality: dict | None,
    *,
    status: str = "done",
    pngs: tuple[str, ...] = (),
    findings: int = 0,
) -> None:
    key = f"{cid}:fp"
    store.upsert_discovered(case_key=key, case_id=cid, series_uid=cid, fingerprint="f" * 24, source=f"/src/{cid}")
    store.begin_case(key, "r1")
    if status == "failed":
        store.fail_case(key, reason="slice 12 is missing", error_class="MissingSliceError", stage="discover")
        return
    folder = run_dir / "cases" / cid
    for name in pngs:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"\x89PNG\r\n\x1a\n")
    meas = [
        ("lungs.lung_left_volume_ml", 1200.0, "mL"),
        ("lungs.lung_right_volume_ml", 1300.0, "mL"),
        (
            "lungs.lungs_total_volume_ml",
            2500.0,
            "mL",
            quality is not PARTIAL,
            None if quality is not PARTIAL else "lungs_apex_cut",
        ),
    ]
    found = [{"center_lps": [1.0, 2.0, 3.0], "diameter_mm": 6.0, "score": 0.9}] * findings
    skipped = "no lungs in the scan (2 mL of lung)" if quality and quality["lung_coverage"] == "absent" else None
    store.complete_case(
        key, output_dir=f"cases/{cid}", findings=found, measurements=meas, quality=quality, detect_skipped=skipped
    )


@pytest.fixture
def flagged_run(tmp_path):
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    store.start_run("r1", command="t", sources=[], config={}, versions={}, device="cpu", host="h", pid=1)
    _case(store, run_dir, "cut", PARTIAL, pngs=("recon/cut_mpr_axial.png", "findings_png/finding_001.png"), findings=1)
    _case(store, run_dir, "clean", COMPLETE, pngs=("recon/clean_mip.png",))
    _case(store, run_dir, "dye", CONTRAST)
    _case(store, run_dir, "bad", None, status="failed")
    store.add_skipped(
        "r1",
        [
            {"what": "file", "item": "/src/junk/notes.txt", "kind": "not_dicom", "reason": "not a DICOM file"},
            {"what": "series", "item": "1.2.3#2", "kind": "not_selected", "reason": "localizer/scout", "source": "/src/x"},
        ],
    )
    store.end_run("r1", status="completed", n_cases=4, n_done=3, n_failed=1, n_skipped=0)
    store.close()
    return run_dir


def test_flags_in_the_store_and_the_notebook_api(flagged_run):
    run = open_run(flagged_run)
    cases = run.cases.set_index("case_id")
    assert cases.loc["cut", "flags"] == "lungs_apex_cut,contrast_venous"
    assert (cases.loc["cut", "lung_coverage"], cases.loc["cut", "contrast_phase"]) == ("partial", "venous")
    assert cases.loc["clean", "flags"] == "" and cases.loc["dye", "flags"] == "contrast_arterial"
    assert pd.isna(cases.loc["bad", "flags"])  # not completed: no quality known
    q = run.quality
    assert list(q.columns[:5]) == ["run_dir", "case_id", "code", "severity", "message"]
    assert sorted(zip(q.case_id, q.code, q.severity)) == [
        ("cut", "contrast_venous", "info"),
        ("cut", "lungs_apex_cut", "warning"),
        ("dye", "contrast_arterial", "info"),
    ]
    total = run.measurements[run.measurements.name == "lungs.lungs_total_volume_ml"].set_index("case_id")
    assert not total.loc["cut", "reliable"] and total.loc["cut", "reason"] == "lungs_apex_cut"
    assert total.loc["cut", "value"] == 2500.0  # kept, marked
    assert total.loc["clean", "reliable"] and pd.isna(total.loc["clean", "reason"])
    assert set(run.skipped.what) == {"file", "series"} and "notes.txt" in run.skipped.item.iloc[0]


def test_report_per_case_table_flags_headline_and_png_links(flagged_run, tmp_path):
    rep = build_report([flagged_run], flagged_run / "report")
    html = rep.html.read_text()
    q = rep.summary["quality"]
    assert q == {
        "done": 3,
        "flagged": 1,
        "by_flag": {"contrast_arterial": 1, "contrast_venous": 1, "lungs_apex_cut": 1},
        "detect_skipped": 0,
    }
    assert "1 of 3 completed case(s) flagged (warnings)" in html
    table = html.split('<table class="cases">', 1)[1].split("</table>", 1)[0]
    rows = {re.search(r"<td>([^<]*)</td>", r).group(1): r for r in table.split("<tr>")[2:]}
    assert set(rows) == {"cut", "clean", "dye", "bad"}
    assert "lungs_apex_cut" in rows["cut"] and 'class="warning"' in rows["cut"] and 'class="info"' in rows["cut"]
    assert "2500*" in rows["cut"] and "2500*" not in rows["clean"] and ">1200<" in rows["clean"]
    assert "slice 12 is missing" in rows["bad"] and ">failed<" in rows["bad"]
    # every case links its PNGs, relative to the report, and the links resolve
    links = re.findall(r'href="([^"]+)"', rows["cut"])
    assert len(links) == 2 and all((rep.out_dir / unquote(h)).resolve().is_file() for h in links)
    # the link text leaves out the case id the row starts with: recon/mpr_axial.png, not recon/cut_mpr_axial.png
    assert re.findall(r">([^<]+)</a>", rows["cut"]) == ["findings_png/finding_001.png", "recon/mpr_axial.png"]
    assert re.findall(r'href="([^"]+)"', rows["clean"]) and not re.findall(r'href="([^"]+)"', rows["dye"])
    # the same from a report written elsewhere
    other = build_report([flagged_run], tmp_path / "elsewhere")
    other_rows = other.html.read_text().split('<table class="cases">', 1)[1]
    assert all((other.out_dir / unquote(h)).resolve().is_file() for h in re.findall(r'href="([^"]+)"', other_rows))
    # CSV tables
    flags = pd.read_csv(rep.out_dir / "quality_flags.csv")
    assert len(flags) == 3 and set(flags.columns) >= {"case_id", "code", "severity", "message"}
    cases = pd.read_csv(rep.out_dir / "cases.csv")
    assert {"flags", "lung_coverage", "contrast_phase", "detect_skipped"} <= set(cases.columns)
    assert len(pd.read_csv(rep.out_dir / "skipped.csv")) == 2
    assert "Skipped by discovery" in html and "notes.txt" in html and "localizer/scout" in html


def test_projection_says_what_it_rests_on_and_when_that_is_too_few(flagged_run, tmp_path):
    few = build_report([flagged_run], tmp_path / "few").summary
    tp = few["throughput"]
    assert tp["cases_done"] == 3 and not tp["enough_to_project"]
    assert "from 3 completed case(s) over" in few["projection"] and "active minutes" in few["projection"]
    assert "too few to project from" in few["projection"]
    assert f"fewer than {MIN_CASES_TO_PROJECT} completed cases or {MIN_MINUTES_TO_PROJECT:g} active minutes" in few["projection"]

    run_dir = tmp_path / "many"
    store = RunStore(run_dir)
    store.start_run("r1", command="t", sources=[], config={}, versions={}, device="cpu", host="h", pid=1)
    for n in range(MIN_CASES_TO_PROJECT + 2):
        _case(store, run_dir, f"c{n:02d}", COMPLETE)
    store.end_run("r1", status="completed", n_cases=12, n_done=12, n_failed=0, n_skipped=0)
    store.db.execute("UPDATE runs SET started_at = ended_at - 600")  # ten active minutes
    store.close()
    many = build_report([run_dir], tmp_path / "many_report").summary
    assert many["throughput"]["enough_to_project"] and many["throughput"]["active_minutes"] == pytest.approx(10, abs=0.1)
    tp = many["throughput"]
    assert tp["cases_per_day_projected"] == pytest.approx(tp["cases_per_hour"] * tp["hours_per_day"])
    assert "too few" not in many["projection"] and "from 12 completed case(s) over 10.0 active minutes" in many["projection"]
    assert many["throughput"]["cases_per_hour"] == pytest.approx(72.0, rel=0.02)


# -- no lungs, no search (real stages) ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("reconstruct", [True, False])
def test_a_scan_without_lungs_is_never_searched(tmp_path, dicom_data, reconstruct):
    import shutil

    src = tmp_path / "src"
    write_no_lungs(src / "abdomen")
    shutil.copytree(dicom_data["good"] / "case11", src / "chest")
    out = tmp_path / "run"
    s = run_batch([src], out=out, workers=0, **{**QUICK, "reconstruct.enabled": reconstruct})
    assert s.exit_code == 0 and s.done == 2, s.lines()
    run = open_run(out)
    cases = run.cases.set_index(run.cases.source.map(lambda p: Path(p).relative_to(src).parts[0]))
    assert "lungs_absent" in cases.loc["abdomen", "flags"].split(",")
    assert cases.loc["abdomen", "lung_coverage"] == "absent"
    assert cases.loc["abdomen", "detect_skipped"].startswith("no lungs in the scan")
    assert pd.isna(cases.loc["chest", "detect_skipped"]) and "lungs_absent" not in cases.loc["chest", "flags"]
    folder = out / cases.loc["abdomen", "output_dir"]
    doc = json.loads((folder / "findings.json").read_text())
    assert doc["findings"] == [] and doc["reason"].startswith("no lungs in the scan") and doc["n_candidates"] == 0
    # the model never saw it: nothing loaded, no model time
    st = run.stages[run.stages.case_id == cases.loc["abdomen", "case_id"]].set_index("stage")
    detail = {k: {} if pd.isna(v) else json.loads(v) for k, v in st.detail.items()}
    assert "load" not in detail["load"] and "model" not in detail["detect"]
    chest = run.stages[run.stages.case_id == cases.loc["chest", "case_id"]].set_index("stage")
    assert json.loads(chest.loc["detect", "detail"])["model"] > 0
    assert ("lungs" in set(run.stages.stage)) is (not reconstruct)
    html = (out / "report" / "report.html").read_text()
    assert "detection skipped: no lungs in the scan" in html and "detection skipped in 1" in html
