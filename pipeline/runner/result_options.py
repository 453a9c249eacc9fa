"""Options that shape a case's results, and the check that a resumed run folder keeps them.

A run folder is one set of results: a rerun skips the cases it analysed before. Were a rerun to change an option
those results depend on (the detector's model or score threshold, the organs, the DICOM results, ...), the folder
would hold cases analysed two ways while its ``config.yaml`` names only the latest: a nightly job would publish
findings at a threshold nobody chose for them. :func:`check_result_options` refuses such a rerun before it is
recorded, naming each option, the value the earlier results were made with and the value asked for now.
Options of how the run goes (workers, device, metrics, report, PACS) may change freely between runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import ConfigError
from .store import RunStore

log = logging.getLogger(__name__)

# "section.key" of each option a completed case's files, findings and measurements depend on. Left out: how the
# work is done (runner.*, loader.backend, detector.amp, reconstruct.device: the same results, another route).
RESULT_OPTIONS = (
    "ingest.min_slices",
    "ingest.allow_derived",
    "ingest.spacing_tolerance",
    "ingest.allow_gantry_tilt",
    "loader.roi",
    "loader.roi_margin_mm",
    "detector.bundle",
    "detector.score_threshold",
    "detector.all_candidates",
    "detector.lung_restriction",
    "detector.postprocess",
    "detector.write_png",
    "reconstruct.enabled",
    "reconstruct.organs",
    "reconstruct.mesh_formats",
    "reconstruct.smoothing_iterations",
    "reconstruct.target_triangles",
    "reconstruct.renderings",
    "outputs.dicom",
    "outputs.seg_omit_empty_frames",
    "privacy.keep_identifiers",
)

_MISSING = object()


def _value(config: Mapping[str, Any], path: str) -> Any:
    section, key = path.split(".", 1)
    sec = config.get(section)
    return sec.get(key, _MISSING) if isinstance(sec, Mapping) else _MISSING


def _same(earlier: Any, now: Any) -> bool:
    if isinstance(earlier, (list, tuple)) and isinstance(now, (list, tuple)):
        return sorted(map(str, earlier)) == sorted(map(str, now))  # organ and format lists: their order does not matter
    if isinstance(earlier, (int, float)) and isinstance(now, (int, float)) and not isinstance(earlier, bool):
        return float(earlier) == float(now)
    return bool(earlier == now)


def _shown(value: Any) -> str:
    """``value`` as ``--set`` reads it back (YAML): null, true/false, numbers, text as it is, lists as JSON."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return json.dumps(list(value), separators=(",", ":"))
    return str(value)


def changed_result_options(earlier: Mapping[str, Any], now: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{"section.key": (earlier value, value now)}`` for each of :data:`RESULT_OPTIONS` that differs between the
    two configurations (``Config.to_dict()`` form). An option absent from ``earlier`` (recorded by a ctpipe that did
    not have it) is not counted as changed, nor ``loader.roi_margin_mm`` when neither crops to the lungs
    (``loader.roi``): a folder made when it defaulted to 10 mm resumes under its null default."""
    out: dict[str, tuple[Any, Any]] = {}
    # the crop's margin shapes nothing unless one of the two crops the model input to the lungs
    cropped = "lungs" in (_value(earlier, "loader.roi"), _value(now, "loader.roi"))
    for path in RESULT_OPTIONS:
        old, new = _value(earlier, path), _value(now, path)
        if old is _MISSING or new is _MISSING or _same(old, new) or (path == "loader.roi_margin_mm" and not cropped):
            continue
        out[path] = (old, new)
    return out


#: The run record's ``versions`` key of :func:`weights_digest`.
WEIGHTS_KEY = "detector_weights_sha256"
_DEMO_WEIGHTS = Path(__file__).resolve().parents[1] / "detection" / "weights"


def weights_digest(bundle: str | None) -> str | None:
    """SHA-256 (hex) of the detector's model files: the bundle's ``models/model.pt`` (or ``model.ts``) and
    ``configs/inference.json`` (``bundle``: its folder or that JSON file), else ctpipe's demo weights. A bundle replaced
    in place (new weights under the same path) gets another digest. None when the files are not found (the model
    stage says what is missing)."""
    if bundle:
        given = Path(bundle)
        root = given if given.is_dir() else given.parent.parent
        files = [root / "models" / "model.pt", root / "models" / "model.ts", root / "configs" / "inference.json"]
    else:
        files = sorted(_DEMO_WEIGHTS.glob("demo_phantom_*"))
    files = [f for f in files if f.is_file()]
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def check_result_options(store: RunStore, cfg: Config, run_dir: Path, *, weights: str | None = None) -> None:
    """Raise :class:`ConfigError` when cases completed in ``run_dir`` were analysed with result-shaping options
    (:data:`RESULT_OPTIONS`) other than ``cfg``'s. The message names the run folder, the number of such cases, the
    run(s) that made them and, for each option, the value they were made with and the value asked for now; the fix is
    a new ``--out`` folder for the new options, or the earlier values (as ``--set`` flags) to resume this folder.
    ``weights``: this run's :func:`weights_digest`; other model files than the earlier runs' (recorded under
    :data:`WEIGHTS_KEY` in their ``versions``) are refused as well."""
    now = cfg.to_dict()
    changed: dict[str, tuple[Any, Any]] = {}
    runs: list[str] = []
    n_cases = 0
    for run_id, config_text, versions_text, n in store.configs_of_done_cases():
        try:
            earlier, versions = json.loads(config_text or "{}"), json.loads(versions_text or "{}")
        except json.JSONDecodeError:
            continue  # a run record without a readable configuration: nothing to compare with
        diff = changed_result_options(earlier if isinstance(earlier, Mapping) else {}, now)
        made_with = versions.get(WEIGHTS_KEY) if isinstance(versions, Mapping) else None
        if weights and made_with and made_with != weights:  # new weights in place of the old, same path
            diff["detector weights"] = (f"sha256 {made_with[:12]}", f"sha256 {weights[:12]}")
        if diff:
            runs.append(run_id)
            n_cases += n
            for path, pair in diff.items():
                changed.setdefault(path, pair)
    if not changed:
        return
    what = "; ".join(f"{path} was {_shown(old)}, is {_shown(new)} now" for path, (old, new) in changed.items())
    back = " ".join(f"--set {shlex.quote(f'{path}={_shown(old)}')}" for path, (old, _) in changed.items() if "." in path)
    if "detector weights" in changed:
        back += (" and " if back else "") + "the detector's earlier model files"
    err = ConfigError(
        f"{n_cases} completed case(s) in this run folder were analysed with other options (run(s) "
        f"{', '.join(runs[:3])}{' ...' if len(runs) > 3 else ''}): {what}; resuming would mix results made two ways in "
        "one folder",
        where=run_dir,
        fix=f"give the new options a new --out folder, or resume this one with the options its results were made with ({back})",
    )
    # for run.log (info: the command line prints the error itself, once)
    log.info("run refused: %s", err, extra={"event": "result_options_changed", "changed": sorted(changed)})
    raise err


def check_run_folder(run_dir: Path, cfg: Config) -> None:
    """:func:`check_result_options` for a service about to feed ``run_dir`` (``ctpipe listen``): refused at its start,
    not at each batch. Nothing to check in a folder without a run store."""
    from .store_db import db_path

    if not db_path(run_dir).is_file():
        return
    store = RunStore(run_dir)
    try:
        check_result_options(store, cfg, run_dir, weights=weights_digest(cfg.detector.bundle))
    finally:
        store.close()
