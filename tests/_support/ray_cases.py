"""The cases and run-store reads shared by the runner's Ray test modules (tests/test_runner_ray*.py)."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests._support.runner import PHANTOM, QUICK, db_rows


def needs_ray() -> None:
    """Skip without Ray (scripts/setup.sh installs it), without importing it here (it reads its settings then)."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed: pip install 'ctpipe[cluster]'")


def shared_cases(tmp_path_factory: Any) -> dict[str, Any]:
    """:func:`make_cases` built once for the whole pytest run (:func:`~tests._support.shared.build_once`), also when
    pytest-xdist spreads the Ray test modules over several workers: read only (runs write to their own folders)."""
    from tests._support.shared import build_once

    def build(root: Path) -> dict[str, Any]:
        made = make_cases(root)
        return {**made, "src": str(made["src"])}

    _, made = build_once(tmp_path_factory, "ray_cases", build)
    return {**made, "src": Path(made["src"])}


def make_cases(root: Path) -> dict[str, Any]:
    """Two tiny phantom cases under ``root``/src and a small detector (random weights): the options of a quick,
    deterministic run (``opts``), the cases' folder (``src``) and their series UIDs (``uids``)."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case
    from tests._support.detection import small_model

    uids = []
    for seed in (11, 12):
        ph = generate_phantom(seed, n_nodules=1, **PHANTOM)
        write_phantom_case(ph, root / "src" / f"case{seed}")
        uids.append(ph.volume.series_uid)
    (root / "model").mkdir()
    small_model(root / "model")
    opts = {
        **QUICK,
        "report.enabled": False,
        "detector.bundle": str(root / "model" / "small.json"),
        "detector.write_png": False,
        "outputs.dicom": [],
        "runner.torch_threads": 1,  # the same arithmetic in every process: findings comparable bit for bit
        "runner.ray_timeout_s": 60.0,
    }
    return {"src": root / "src", "uids": uids, "opts": opts}


def a_case_running(run_dir: Path) -> bool:
    """Whether the run store in ``run_dir`` lists a running case (False while the store is still being created)."""
    try:
        return bool(db_rows(run_dir, "SELECT 1 FROM cases WHERE status='running'"))
    except sqlite3.OperationalError:  # no file yet, or its tables not yet created
        return False


def findings(run_dir: Path) -> dict[str, list]:
    """{series UID: the case's findings (LPS mm, scores), in the store's order}."""
    rows = db_rows(
        run_dir, "SELECT c.series_uid, f.data FROM findings f JOIN cases c USING (case_key) ORDER BY c.series_uid, f.idx"
    )
    out: dict[str, list] = {}
    for uid, data in rows:
        out.setdefault(uid, []).append(json.loads(data))
    return out
