"""The same case run with another number of threads (another worker count, another machine) gives detector boxes and
scores that differ in their last digits (about 1e-5 mm and 1e-6); its DICOM results must hold the same content, with the
same UIDs, so that an archive keeps one copy. The results state positions to 0.01 mm, lengths to 0.1 mm, volumes to
1 mm³ and scores to 0.001 (LPS mm throughout)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from pipeline.config import load_config
from pipeline.dicom_out import write_dicom_outputs
from pipeline.runner.dicom_stage import _uid_seed
from tests._support.dicom_dates import assert_same_but_dates
from tests.test_dicom_out_sources import phantom_case
from tests.test_dicom_stage_uids import SOURCE

MODEL = dict(model_name="demo_phantom_retinanet", model_version="1", score_threshold=0.5)


def _jittered(finding: Any, mm: float, score: float) -> Any:
    def shift(v: Any) -> tuple[float, float, float]:
        a = np.asarray(v, dtype=float) + mm
        return (float(a[0]), float(a[1]), float(a[2]))

    return replace(
        finding,
        center_lps=shift(finding.center_lps),
        box_min_lps=shift(finding.box_min_lps),
        box_max_lps=shift(finding.box_max_lps),
        score=finding.score + score,
    )


def test_results_of_findings_that_differ_in_their_last_digits_hold_the_same_content(tmp_path: Path) -> None:
    case = phantom_case(tmp_path / "case", n_nodules=1)
    masks = {"lung_left": case.phantom.masks["lung_left"], "lung_right": case.phantom.masks["lung_right"]}
    options = dict(source=case.source, volume=case.volume, nodules=case.nodules, organ_masks=masks, stable_uids=True)
    a = write_dicom_outputs(tmp_path / "a", findings=case.findings, **options, **MODEL)
    other = [_jittered(f, 1.2e-5, -1.3e-6) for f in case.findings]
    b = write_dicom_outputs(tmp_path / "b", findings=other, **options, **MODEL)
    for kind in ("sr", "seg"):
        assert_same_but_dates(a[kind], b[kind])


def _ctx(doc: dict[str, Any]) -> Any:
    return SimpleNamespace(
        config=load_config(environ={}),
        case=SimpleNamespace(case_key="1.2.3:abc", case_id="1.2.3"),
        state={"findings_doc": doc, "quality": {"lung_coverage": "complete", "flags": []}},
    )


def _doc(mm: float, score: float, device: str) -> dict[str, Any]:
    def finding(c: list[float], s: float) -> dict[str, Any]:
        return {
            "center_lps": [v + mm for v in c],
            "box_min_lps": [v - 5.123456 + mm for v in c],
            "box_max_lps": [v + 5.234567 + mm for v in c],
            "diameter_mm": 10.3,
            "score": s + score,
        }

    return {
        "model": "demo",
        "score_threshold": 0.4036,
        "device": device,
        "findings": [finding([-86.4613, 82.3861, -9.0706], 0.99891352)],
        "below_threshold": [finding([20.3914, 5.5527, -192.3251], 0.1145099)],  # in no result
        "n_candidates": 241,
    }


def test_a_run_on_another_machine_gives_the_results_the_same_uids() -> None:
    seed = _uid_seed(_ctx(_doc(0.0, 0.0, "cpu")), SOURCE, {})
    assert _uid_seed(_ctx(_doc(1.1e-5, 9e-7, "cuda:1")), SOURCE, {}) == seed
    other_model = {**_doc(0.0, 0.0, "cpu"), "model": "demo_2"}  # another model's findings: another result
    assert _uid_seed(_ctx(other_model), SOURCE, {})["sr"] != seed["sr"]


def test_box_edges_rounding_the_other_way_leave_the_uids() -> None:
    """Runs with another worker count move a box by some 0.0005 mm: its edge at -91.5848 mm moves to -91.5852 mm (-91.58
    and -91.59 to 0.01 mm); the results name the same finding and keep their UIDs, as they do for a box measured
    0.04 mm wider."""
    seed = _uid_seed(_ctx(_doc(0.0, 0.0, "cpu")), SOURCE, {})
    assert _uid_seed(_ctx(_doc(-0.0004, 0.0, "cpu")), SOURCE, {}) == seed
    wider = _doc(0.0, 0.0, "cpu")
    wider["findings"][0]["box_max_lps"][0] += 0.04
    assert _uid_seed(_ctx(wider), SOURCE, {}) == seed


def test_a_score_just_below_one_is_not_stated_as_certainty(tmp_path: Path) -> None:
    from pipeline.dicom_out import read_sr_findings, write_sr

    case = phantom_case(tmp_path / "case", n_nodules=1)
    sure = [replace(case.findings[0], score=0.99999594)]
    path = write_sr(tmp_path / "sr.dcm", source=case.source, volume=case.volume, findings=sure, nodules=case.nodules, **MODEL)
    assert read_sr_findings(path).score.tolist() == [0.999]


def _on_a_rounding_edge(finding: Any) -> tuple[Any, Any]:
    """The finding with its centre's x on a 0.01 mm rounding edge, and 1e-6 mm beside it: two runs with other worker
    counts whose centres are stated 0.01 mm apart."""
    x = float(np.floor(finding.center_lps[0] * 100) / 100 + 0.005)
    a = replace(finding, center_lps=(x + 1e-6, *finding.center_lps[1:]))
    b = replace(finding, center_lps=(x - 1e-6, *finding.center_lps[1:]))
    assert round(a.center_lps[0], 2) != round(b.center_lps[0], 2)  # they are stated apart
    return a, b


def test_centres_that_round_apart_at_a_hundredth_of_a_millimetre_keep_the_uids(tmp_path: Path) -> None:
    """The SR's and SEG's series and instance UIDs and each nodule's tracking UID name the case and the finding, not
    its measured centre: a centre 1e-6 mm further, stated 0.01 mm apart, leaves them (a rerun with 4 workers instead
    of 1 gives the archive the same series, not a second SR and SEG). Made at the same time: an instance made at
    another time is another instance of the series."""
    import datetime

    import pydicom

    from pipeline.dicom_out import read_sr_findings

    case = phantom_case(tmp_path / "case", n_nodules=1)
    masks = {"lung_left": case.phantom.masks["lung_left"], "lung_right": case.phantom.masks["lung_right"]}
    made = datetime.datetime(2031, 5, 6, 7, 8, 9)
    options = dict(
        source=case.source, volume=case.volume, nodules=case.nodules, organ_masks=masks, stable_uids=True, created=made
    )
    a, b = _on_a_rounding_edge(case.findings[0])
    written = [
        write_dicom_outputs(tmp_path / name, findings=[f, *case.findings[1:]], **options, **MODEL)
        for name, f in (("a", a), ("b", b))
    ]
    for kind in ("sr", "seg"):
        ds = [pydicom.dcmread(w[kind], stop_before_pixels=True) for w in written]
        assert ds[0].SeriesInstanceUID == ds[1].SeriesInstanceUID, kind
        assert ds[0].SOPInstanceUID == ds[1].SOPInstanceUID, kind
    tracking = [read_sr_findings(w["sr"]).tracking_uid.tolist() for w in written]
    assert tracking[0] == tracking[1]
    segs = [pydicom.dcmread(w["seg"], stop_before_pixels=True) for w in written]
    assert [s.TrackingUID for s in segs[0].SegmentSequence if "TrackingUID" in s] == tracking[0]
    assert [s.TrackingUID for s in segs[1].SegmentSequence if "TrackingUID" in s] == tracking[0]


def test_a_run_whose_centres_round_apart_keeps_the_uids() -> None:
    """``ctpipe run``: the same findings with centres 1e-6 mm apart across a 0.01 mm rounding edge give the same
    seeds; another finding reported gives others."""
    on_edge = _doc(0.0, 0.0, "cpu")
    on_edge["findings"][0]["center_lps"][0] = -86.465 + 1e-6
    beside = _doc(0.0, 0.0, "cpu")
    beside["findings"][0]["center_lps"][0] = -86.465 - 1e-6
    assert round(on_edge["findings"][0]["center_lps"][0], 2) != round(beside["findings"][0]["center_lps"][0], 2)
    seed = _uid_seed(_ctx(on_edge), SOURCE, {})
    assert _uid_seed(_ctx(beside), SOURCE, {}) == seed
    more = _doc(0.0, 0.0, "cpu")
    more["findings"].append(more["below_threshold"][0])
    assert _uid_seed(_ctx(more), SOURCE, {})["sr"] != seed["sr"]


def test_the_parts_of_a_split_series_name_their_nodules_apart(tmp_path: Path) -> None:
    """Two parts of one series (one SeriesInstanceUID, other images) each have a first finding: their SRs give the
    two nodules tracking UIDs of their own, while each part written again keeps its own."""
    import copy
    from dataclasses import replace as with_fields

    from pipeline.dicom_out import read_sr_findings, write_sr

    case = phantom_case(tmp_path / "case", n_nodules=1)
    headers = [copy.deepcopy(ds) for ds in case.source.datasets]
    for ds in headers:
        ds.SOPInstanceUID = f"{str(ds.SOPInstanceUID)[:60]}.9"
    other_part = with_fields(
        case.source, datasets=tuple(headers), sop_instance_uids=tuple(str(ds.SOPInstanceUID) for ds in headers)
    )
    options = dict(volume=case.volume, findings=case.findings, nodules=case.nodules, **MODEL)
    uids = {
        name: read_sr_findings(write_sr(tmp_path / f"{name}.dcm", source=source, **options)).tracking_uid.tolist()
        for name, source in (("a", case.source), ("again", case.source), ("other", other_part))
    }
    assert uids["again"] == uids["a"]
    assert not set(uids["other"]) & set(uids["a"])
