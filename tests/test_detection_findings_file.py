"""``load_findings``: a findings JSON read back as ``Findings``; any other file refused naming it and what reads it,
rather than a bare JSON, Unicode or file error, or (a JSON of another kind) an empty ``Findings``."""

from __future__ import annotations

import json

import pytest

from pipeline.detection import load_findings
from pipeline.detection.findings import Finding, Findings
from pipeline.errors import CtpipeError

_FINDING = Finding((1.0, 2.0, 3.0), (-2.0, -1.0, 0.0), (4.0, 5.0, 6.0), 6.0, 0.9, (10, 12, 7), 8, "1.2.3.4.5")


def _written(tmp_path) -> Findings:
    found = Findings([_FINDING], case_id="c1", series_uid="1.2.3", model="demo", score_threshold=0.4, threshold_source="model")
    found.write_json(tmp_path / "findings.json")
    found.write_csv(tmp_path / "findings.csv")
    return found


def test_a_findings_json_reads_back_as_written(tmp_path):
    found = _written(tmp_path)
    back = load_findings(tmp_path / "findings.json")
    assert back.findings == found.findings and back.series_uid == "1.2.3" and back.score_threshold == 0.4


@pytest.mark.parametrize(
    ("name", "content", "problem", "fix"),
    [
        ("other.json", json.dumps({"a": 1}), "not a ctpipe findings document (format None)", "pass the findings.json"),
        ("list.json", json.dumps([{"center_lps": [0, 0, 0]}]), "not a ctpipe findings document (a JSON list)", "findings.json"),
        ("findings.csv", None, "not a findings JSON (the file is not JSON)", "the findings.json beside this CSV"),
        ("sr.dcm", b"\0" * 128 + b"DICM" + b"\xc2\x00" * 20, "not a findings JSON (a DICOM file)", "read_sr_findings"),
        ("missing.json", "", "cannot read the findings (No such file or directory)", "pass the findings.json"),
        (
            "cut.json",
            '{"format": "ctpipe-findings/1", "findings": [{"score": 0.5}]}',
            "the findings document is incomplete (KeyError: 'center_lps')",
            "findings.json",
        ),
    ],
)
def test_a_file_that_is_no_findings_json_is_refused_naming_it(tmp_path, name, content, problem, fix):
    _written(tmp_path)
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content:
        path.write_text(content)
    with pytest.raises(CtpipeError) as err:
        load_findings(path)
    assert str(err.value).startswith(f"{path}: {problem}"), str(err.value)
    assert fix in (err.value.fix or "")
