"""The real stages of ``ctpipe run``: ingest → load → detect → reconstruct → write.

``load`` and ``detect`` (the model worker's stages) live in :mod:`.model_stages`.

Each adapter turns the run's configuration into the stage library's options.
Volumes travel between stages through the run's case cache
(``RUN_DIR/cache/<case_id>.npy`` + sidecar, HU ``[k, j, i]`` with LPS geometry);
stage outputs passed along are small (findings, measurements). Files are
written under the case's staging folder only. Positions are LPS mm.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any

from ..atomic import atomic_write_bytes
from ..cache import CaseCache
from ..config import Config
from ..errors import NoSeriesFoundError
from .model_stages import DetectStage, LoadStage
from .stage import CaseContext, Stage, WorkerInfo

__all__ = ["DetectStage", "IngestStage", "LoadStage", "ReconstructStage", "WriteStage", "build_stages",
           "flatten_measurements"]

log = logging.getLogger(__name__)

_UNITS = (("_ml", "mL"), ("_mm3", "mm3"), ("_mm2", "mm2"), ("_mm", "mm"), ("_pct", "%"), ("_percent", "%"),
          ("_hu", "HU"), ("_fraction", "fraction"), ("_count", "count"))


def _rules(cfg: Config) -> Any:
    from ..ingest import SelectionRules

    return SelectionRules(min_slices=cfg.ingest.min_slices, allow_derived=cfg.ingest.allow_derived)


class IngestStage(Stage):
    """DICOM files of the case's series → validated HU volume in the case cache."""

    name = "ingest"
    group = "cpu"
    preload = ("pipeline.ingest",)

    def setup(self, worker: WorkerInfo) -> None:
        import pipeline.ingest  # noqa: F401 - import once per worker, not per case

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        from ..ingest import read_volume, scan_directory
        from ..ingest.build import build_volume

        cfg = ctx.config.ingest
        case = ctx.case
        scan = scan_directory([*case.files] or case.source, rules=_rules(ctx.config), spacing_tolerance=cfg.spacing_tolerance,
                              allow_gantry_tilt=cfg.allow_gantry_tilt, workers=1)
        key = case.series_uid
        found = [s for s in scan.series if s.key == key]
        if key is None or not found:
            raise NoSeriesFoundError(f"series {key} is no longer among the files discovered for it", where=case.source,
                                     fix="the folder changed during the run; run the same command again")
        rejected = [r for r in scan.rejected if r.series.key == key]
        if rejected:
            raise rejected[0].error
        plan = scan.plans.get(key)
        vol = read_volume(plan, workers=1) if plan is not None else build_volume(
            found[0], spacing_tolerance=cfg.spacing_tolerance, allow_gantry_tilt=cfg.allow_gantry_tilt, workers=1)
        entry = CaseCache(ctx.cache_dir).write(case.case_id, vol, extra={"source": case.source, "series_key": key})
        return {"volume_fingerprint": entry.fingerprint, "shape_kji": list(vol.shape), "spacing_ijk": list(vol.spacing)}


def _read_volume(ctx: CaseContext) -> Any:
    """The case's HU volume from the run's cache (read into memory: stages may hand it to torch)."""
    return CaseCache(ctx.cache_dir).read(ctx.case.case_id)


def flatten_measurements(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float, str]]:
    """Numeric leaves of a nested measurements dict as ``(dotted.name, value, unit)``; units from name suffixes."""
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from flatten_measurements(value, name + ".")
        elif isinstance(value, list) and all(isinstance(v, Mapping) for v in value):
            for n, item in enumerate(value):
                yield from flatten_measurements(item, f"{name}.{n}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
            unit = next((u for suf, u in _UNITS if key.lower().endswith(suf)), "")
            yield name, float(value), unit


class ReconstructStage(Stage):
    """Organ segmentation, meshes, measurements and renderings into ``<case>/recon/``."""

    name = "reconstruct"
    group = "cpu"
    preload = ("pipeline.reconstruction",)

    def __init__(self, *, group: str = "cpu"):
        self.group = group
        self._device = "cpu"

    def setup(self, worker: WorkerInfo) -> None:
        import pipeline.reconstruction  # noqa: F401

        self._device = worker.device if self.group == "model" else "cpu"

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        from ..reconstruction import reconstruct

        cfg = ctx.config.reconstruct
        vol = _read_volume(ctx)
        rec = reconstruct(vol, organs=cfg.organs, findings=ctx.state.get("findings") or None, out_dir=ctx.workdir / "recon",
                          mesh_formats=cfg.mesh_formats, smoothing=cfg.smoothing_iterations,
                          target_triangles=cfg.target_triangles, device=self._device, render=cfg.renderings,
                          stem=ctx.case.case_id)
        meas = {k: v for k, v in rec.measurements.items() if k in ("organs", "lungs", "nodules")}
        return {"measurements": list(flatten_measurements(meas)), "recon_errors": dict(rec.errors),
                "timings": {k: round(v, 6) for k, v in rec.seconds.items()}}


class WriteStage(Stage):
    """Findings JSON + CSV + one PNG per finding, and ``volume.json`` (geometry, DICOM metadata, fingerprint)."""

    name = "write"
    group = "cpu"
    preload = ("pipeline.detection.findings", "pipeline.detection.figures")

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        from ..detection.findings import Findings

        doc = dict(ctx.state.get("findings_doc") or {"findings": []})
        findings = Findings.from_json(doc)
        findings.timings_ms = {}
        findings.write_json(ctx.workdir / "findings.json")
        findings.write_csv(ctx.workdir / "findings.csv")
        # the volume's sidecar: geometry (LPS mm), DICOM metadata and content fingerprint of what was analysed
        sidecar = CaseCache(ctx.cache_dir).sidecar_path(ctx.case.case_id)
        atomic_write_bytes(ctx.workdir / "volume.json", sidecar.read_bytes())
        if ctx.config.detector.write_png and len(findings):
            _write_pngs(ctx, findings)
        return {}


def _write_pngs(ctx: CaseContext, findings: Any) -> None:
    from ..detection.figures import write_finding_pngs

    write_finding_pngs(_read_volume(ctx), findings, ctx.workdir / "findings_png")


def build_stages(cfg: Config) -> list[Stage]:
    """The stages of ``ctpipe run`` for this configuration, in order."""
    stages: list[Stage] = [IngestStage(), LoadStage(), DetectStage()]
    if cfg.reconstruct.enabled:
        stages.append(ReconstructStage(group="model" if cfg.reconstruct.device == "model" else "cpu"))
    stages.append(WriteStage())
    return stages
