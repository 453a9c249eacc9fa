"""The segmentation stages of ``ctpipe run``: ``lungs``, ``reconstruct`` and ``nodules`` (see :mod:`.stages`).

One lung mask per case: when both lungs are reconstructed, ``reconstruct`` runs
before detection, keeps the union of its lung masks in the case cache
(``RUN_DIR/cache/<case_id>.lungs.npy``, bits packed, on the volume's ``[k, j, i]``
grid) and hands its quality report to the later stages; ``nodules`` then segments
the findings inside that mask. Without reconstruction, ``lungs`` segments the
lungs alone for the quality report that decides whether to search. When the
DICOM SEG is among ``outputs.dicom``, ``reconstruct`` also keeps every organ mask
in the cache (``RUN_DIR/cache/<case_id>.organs.npz``, bits packed) for the
``dicom`` stage (:mod:`.dicom_stage`); with the SR alone, the lung masks (each
finding's side in the report). With renderings on, ``reconstruct`` also keeps what
the renderings that show nodules are drawn from (every organ mask and the 3-D
preview's organ views, ``<case_id>.render.npz``): ``nodules`` draws the nodules it
segments into the overview MPRs, the MIP slabs and the preview, and an MPR set
through each, as ``ctpipe reconstruct --findings`` does, without reconstructing again. When the reconstruction leaves out a lung (or is
off), ``lungs`` keeps its two lungs apart (``<case_id>.sides.npz``): they give
the SR's sides, and are never segments of the SEG.

A file that cannot be written fails the stage (an environmental error such as a
full disk stops the run; see :mod:`.faults`); an organ that cannot be segmented
is a property of the case, recorded in its measurements JSON (``errors``).
Positions are LPS mm.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_open, atomic_write_bytes
from ..cache import CaseCache
from ..config import Config
from ..devicetime import DeviceTimer
from ..errors import IncompleteOutputError
from .faults import errno_in_text, is_environmental_errno
from .measurements import flatten_measurements
from .stage import CaseContext, Stage, WorkerInfo

log = logging.getLogger(__name__)

LUNGS = ("lung_left", "lung_right")
#: Measurement groups of the reconstruction kept in the run store (``quality`` has its own table).
MEASURED = ("organs", "lungs", "nodules")


def lungs_first(cfg: Config) -> bool:
    """Whether ``reconstruct`` runs before detection (it segments both lungs), else the ``lungs`` stage does."""
    return bool(cfg.reconstruct.enabled) and set(LUNGS) <= set(cfg.reconstruct.organs)


def read_case_volume(ctx: CaseContext) -> Any:
    """The case's HU volume from the run's cache (read into memory: stages may hand it to torch)."""
    return CaseCache(ctx.cache_dir).read(ctx.case.case_id)


def lung_mask_path(cache_dir: Path, case_id: str) -> Path:
    return cache_dir / f"{case_id}.lungs.npy"


def save_lung_mask(cache_dir: Path, case_id: str, mask: np.ndarray) -> Path:
    """Keep a case's lung mask (bool ``[k, j, i]``) in the cache, bits packed, atomically."""
    path = lung_mask_path(cache_dir, case_id)
    with atomic_open(path) as fh:
        np.lib.format.write_array(fh, np.packbits(np.ascontiguousarray(mask, dtype=bool), axis=None), allow_pickle=False)
    return path


def load_lung_mask(cache_dir: Path, case_id: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """The lung mask kept by :func:`save_lung_mask` (None when the case has none: no lung was segmented)."""
    path = lung_mask_path(cache_dir, case_id)
    if not path.is_file():
        return None
    packed = np.load(path, allow_pickle=False)
    return np.unpackbits(packed, count=int(np.prod(shape))).astype(bool).reshape(shape)


def organ_masks_path(cache_dir: Path, case_id: str, *, sides: bool = False) -> Path:
    """The reconstruction's organ masks (``<case_id>.organs.npz``), or with ``sides`` the lungs segmented for each
    finding's side in the SR alone (``<case_id>.sides.npz``)."""
    return cache_dir / f"{case_id}.{'sides' if sides else 'organs'}.npz"


def save_organ_masks(cache_dir: Path, case_id: str, masks: Mapping[str, np.ndarray], *, sides: bool = False) -> Path:
    """Keep a case's organ masks (organ → bool ``[k, j, i]``) in the cache, bits packed, atomically; ``sides``: the
    lungs that give the SR's sides, kept apart from the organs of the SEG (:func:`organ_masks_path`)."""
    path = organ_masks_path(cache_dir, case_id, sides=sides)
    names = list(masks)
    packed = [np.packbits(np.ascontiguousarray(masks[o], dtype=bool), axis=None) for o in names]
    with atomic_open(path) as fh:
        np.savez(fh, names=np.array(names, dtype=str), masks=np.stack(packed) if packed else np.zeros((0, 0), np.uint8))
    return path


def load_organ_masks(cache_dir: Path, case_id: str, shape: tuple[int, ...], *, sides: bool = False) -> dict[str, np.ndarray]:
    """The organ masks (or with ``sides`` the side lungs) kept by :func:`save_organ_masks` (empty when the case has
    none)."""
    path = organ_masks_path(cache_dir, case_id, sides=sides)
    if not path.is_file():
        return {}
    n = int(np.prod(shape))
    with np.load(path, allow_pickle=False) as data:
        names, packed = [str(x) for x in data["names"]], data["masks"]
    return {organ: np.unpackbits(packed[i], count=n).astype(bool).reshape(shape) for i, organ in enumerate(names)}


def render_inputs_path(cache_dir: Path, case_id: str) -> Path:
    return cache_dir / f"{case_id}.render.npz"


def save_render_inputs(cache_dir: Path, case_id: str, masks: Mapping[str, np.ndarray], preview: Any) -> Path:
    """Keep what the renderings that show nodules are drawn from: the organ masks (organ → bool ``[k, j, i]``, bits
    packed) and the preview's organ views (:class:`~pipeline.reconstruction.preview.PreviewViews`, or None)."""
    path = render_inputs_path(cache_dir, case_id)
    names = list(masks)
    packed = [np.packbits(np.ascontiguousarray(masks[o], dtype=bool), axis=None) for o in names]
    arrays = {
        "names": np.array(names, dtype=str),
        "masks": np.stack(packed) if packed else np.zeros((0, 0), np.uint8),
        **(preview.to_arrays() if preview is not None else {}),
    }
    with atomic_open(path) as fh:
        np.savez(fh, **arrays)
    return path


def load_render_inputs(
    cache_dir: Path, case_id: str, shape: tuple[int, ...], *, geometry: Any = None, smoothing_iterations: int = 20
) -> tuple[dict[str, np.ndarray], Any] | None:
    """The organ masks and preview views kept by :func:`save_render_inputs`; None when the case has none (renderings
    off, or drawn already). Views drawn by another renderer or palette (an earlier version's, in a cache kept across
    an upgrade: :meth:`~pipeline.reconstruction.preview.PreviewViews.current`) are never reused: they are made again
    from the masks on ``geometry`` (the volume's :class:`~pipeline.volume.Geometry`) with the run's mesh
    ``smoothing_iterations`` (``reconstruct.smoothing_iterations``), else left out (None)."""
    from ..reconstruction.preview import PreviewViews, preview_from_masks

    path = render_inputs_path(cache_dir, case_id)
    if not path.is_file():
        return None
    n = int(np.prod(shape))
    with np.load(path, allow_pickle=False) as data:
        names, packed = [str(x) for x in data["names"]], data["masks"]
        masks = {organ: np.unpackbits(packed[i], count=n).astype(bool).reshape(shape) for i, organ in enumerate(names)}
        kept = "preview_images" in data.files
        current = kept and PreviewViews.current(data)
        size = int(data["preview_images"].shape[1]) if kept else 0
        preview = PreviewViews.from_arrays(data) if current else None
    if kept and not current:
        log.info("case %s: the 3-D preview's views in %s were drawn by an earlier version; drawn again", case_id, path)
        preview = (
            preview_from_masks(masks, geometry, size=size, smoothing_iterations=smoothing_iterations)
            if geometry is not None
            else None
        )
    return masks, preview


def _lungs_absent(quality: Mapping[str, Any] | None) -> str | None:
    """Why there is nothing to search (the ``lungs_absent`` flag's message), or None."""
    if not quality or quality.get("lung_coverage") != "absent":
        return None
    flag = next((f for f in quality.get("flags", ()) if f.get("code") == "lungs_absent"), None)
    return str(flag["message"]) if flag else "no lungs in the scan"


def detect_skip_reason(state: Mapping[str, Any]) -> str | None:
    """Why detection must not run on this case (its lungs are absent), from the earlier stages' quality report."""
    return _lungs_absent(state.get("quality"))


def _write_failures(rec: Any, formats: list[str]) -> dict[str, str]:
    """The entries of ``rec.errors`` that are files not written (mesh writes, OS errors), not case properties."""
    out = {}
    for key, msg in rec.errors.items():
        organ, dot, fmt = key.rpartition(".")
        if (dot and fmt in formats and organ in rec.meshes) or errno_in_text(msg) is not None:
            out[key] = msg
    return out


def _raise_write_failures(failures: Mapping[str, str], where: Path) -> None:
    if not failures:
        return
    text = "; ".join(f"{k}: {v}" for k, v in failures.items())
    for msg in failures.values():
        number = errno_in_text(msg)
        if number is not None and is_environmental_errno(number):
            raise OSError(number, f"could not write the reconstruction's files ({text})", str(where))
    raise IncompleteOutputError(
        f"could not write the reconstruction's files ({text})", where=where, fix="see the error; the case was not published"
    )


class ReconstructStage(Stage):
    """Organ segmentation, meshes, measurements, quality flags and renderings into ``<case>/recon/``.

    ``before_detect``: run before detection (no findings yet): keep the lung mask in the cache for
    ``nodules`` and hand the quality report to ``load``/``detect``.
    """

    name = "reconstruct"
    group = "cpu"
    preload = ("pipeline.reconstruction",)

    def __init__(self, *, group: str = "cpu", before_detect: bool = False):
        self.group = group
        self.before_detect = before_detect
        self._device = "cpu"

    def setup(self, worker: WorkerInfo) -> None:
        import pipeline.reconstruction  # noqa: F401

        self._device = worker.device if self.group == "model" else "cpu"

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        from ..reconstruction import reconstruct

        cfg = ctx.config.reconstruct
        vol = read_case_volume(ctx)
        out_dir = ctx.workdir / "recon"
        findings = None if self.before_detect else (ctx.state.get("findings") or None)
        rec = reconstruct(
            vol,
            organs=cfg.organs,
            findings=findings,
            out_dir=out_dir,
            mesh_formats=cfg.mesh_formats,
            smoothing=cfg.smoothing_iterations,
            target_triangles=cfg.target_triangles,
            device=self._device,
            render=cfg.renderings,
            stem=ctx.case.case_id,
        )
        failures = _write_failures(rec, list(cfg.mesh_formats))
        _raise_write_failures(failures, out_dir)
        for key, msg in rec.errors.items():  # properties of the case (an organ not found): recorded, not a failure
            log.warning("case %s: %s: %s", ctx.case.case_id, key, msg, extra={"case_id": ctx.case.case_id, "stage": self.name})
        if self.before_detect:
            parts = [rec.mask(o) for o in LUNGS if o in rec.masks]
            if parts:
                save_lung_mask(ctx.cache_dir, ctx.case.case_id, np.logical_or.reduce(parts))
            if cfg.renderings and "render" not in rec.errors:  # for the nodules, drawn once they are found
                save_render_inputs(ctx.cache_dir, ctx.case.case_id, {o: rec.mask(o) for o in rec.masks}, rec.preview)
        dicom = ctx.config.outputs.dicom
        kept = [o for o in rec.masks if "seg" in dicom or ("sr" in dicom and o in LUNGS)]
        if kept:  # for the dicom stage: the SEG's segments; the lungs give each finding's side in the SR
            save_organ_masks(ctx.cache_dir, ctx.case.case_id, {o: rec.mask(o) for o in kept})
        meas = {k: v for k, v in rec.measurements.items() if k in MEASURED}
        declared = [p.relative_to(ctx.workdir).as_posix() for paths in rec.files.values() for p in paths]
        out: dict[str, Any] = {
            "measurements": list(flatten_measurements(meas)),
            "recon_errors": dict(rec.errors),
            "declared": declared,
            "timings": {k: round(v, 6) for k, v in rec.seconds.items()},
        }
        if rec.quality is not None and (self.before_detect or "quality" not in ctx.state):
            out["quality"] = rec.quality.to_json()
        return out


class LungsStage(Stage):
    """Both lungs segmented, and the quality report they give (lung coverage, slice thickness, contrast; with the body
    and bone it reads, segmented for it alone), before detection: for runs that do not reconstruct both lungs. With the SR among ``outputs.dicom``, the two lung
    masks are kept in the cache (``<case_id>.sides.npz``, apart from the reconstruction's organs, which are the
    SEG's): they give each finding's side in the report."""

    name = "lungs"
    group = "cpu"
    preload = ("pipeline.reconstruction",)

    def __init__(self, *, group: str = "cpu"):
        self.group = group
        self._device = "cpu"

    def setup(self, worker: WorkerInfo) -> None:
        import pipeline.reconstruction  # noqa: F401

        self._device = worker.device if self.group == "model" else "cpu"

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        from ..reconstruction.quality import assess_quality
        from ..reconstruction.segment import segment_organs
        from ..reconstruction.stage import QUALITY_ORGANS

        vol = read_case_volume(ctx)
        with DeviceTimer(self._device) as clock:  # the segmentation may run queued on a GPU
            # the body and bone for the quality report alone: without the bone, the contrast estimate takes it for
            # blood (a non-contrast chest read as arterial), as reconstruct() gives it them
            seg = segment_organs(vol, organs=[*LUNGS, *QUALITY_ORGANS], device=self._device)
        t1 = time.perf_counter()
        quality = assess_quality(np.asarray(vol.array), vol.geometry, seg.masks, metadata=vol.metadata)
        t2 = time.perf_counter()
        lungs = {o: seg.masks[o] for o in LUNGS if o in seg.masks}
        if lungs and "sr" in ctx.config.outputs.dicom:  # each finding's side in the SR; never a SEG segment
            save_organ_masks(ctx.cache_dir, ctx.case.case_id, lungs, sides=True)
        timings = {"segment": round(clock.seconds, 6), "quality": round(t2 - t1, 6)}
        return {"quality": quality.to_json(), "timings": timings}


def _with_nodules(doc: Mapping[str, Any], nodules: list[dict[str, Any]], errors: Mapping[str, str]) -> dict[str, Any]:
    """The measurements JSON with ``nodules`` where :func:`~pipeline.reconstruction.reconstruct` puts them (after
    ``lungs``) and their errors added to ``errors``."""
    out: dict[str, Any] = {}
    anchor = "lungs" if "lungs" in doc else "quality"
    for key, value in doc.items():
        if key == "nodules":
            continue
        out[key] = value
        if key == anchor:
            out["nodules"] = nodules
    if "nodules" not in out:
        out["nodules"] = nodules
    out["errors"] = {**dict(doc.get("errors") or {}), **errors}
    return out


class NodulesStage(Stage):
    """Each reported finding segmented and measured inside the case's lung mask; added to the measurements JSON. With
    renderings on, the segmented nodules are drawn into the reconstruction's renderings (outlined or marked in the
    overview MPRs, outlined in the MIP slabs, an MPR set through each, over the organs in the 3-D preview), as
    ``ctpipe reconstruct --findings`` draws them."""

    name = "nodules"
    group = "cpu"
    preload = ("pipeline.reconstruction.nodules",)

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        findings = list(ctx.state.get("findings") or [])
        if not findings:
            render_inputs_path(ctx.cache_dir, ctx.case.case_id).unlink(missing_ok=True)  # nothing to draw
            return {}
        from ..reconstruction.nodules import segment_findings

        vol = read_case_volume(ctx)
        lungs = load_lung_mask(ctx.cache_dir, ctx.case.case_id, vol.shape)
        t0 = time.perf_counter()
        results = segment_findings(vol, findings, lung_mask=lungs, case_id=ctx.case.case_id)
        seconds = time.perf_counter() - t0
        nodules = [r.to_json() for r in results]
        errors = {f"nodule:{r.index}": r.error for r in results if r.error}
        path = ctx.workdir / "recon" / f"{ctx.case.case_id}_measurements.json"
        doc = _with_nodules(json.loads(path.read_text()), nodules, errors)
        timings = {"nodules": round(seconds, 6)}
        declared: list[str] = []
        if any(r.error is None and r.mask is not None and r.mask.any() for r in results):
            t1 = time.perf_counter()
            drawn = self._draw(ctx, vol, results, doc)
            declared = [p.relative_to(ctx.workdir).as_posix() for p in drawn]
            timings["render"] = round(time.perf_counter() - t1, 6)
        atomic_write_bytes(path, json.dumps(doc, indent=1, default=float).encode())
        render_inputs_path(ctx.cache_dir, ctx.case.case_id).unlink(missing_ok=True)
        measurements = [*ctx.state.get("measurements", []), *flatten_measurements({"nodules": nodules})]
        out: dict[str, Any] = {"measurements": measurements, "timings": timings}
        if declared:
            out["declared"] = declared
        return out

    def _draw(self, ctx: CaseContext, vol: Any, results: list[Any], doc: dict[str, Any]) -> list[Path]:
        """The renderings drawn again with the nodules, from what the reconstruction kept (none when it kept nothing:
        renderings off); ``doc``'s files list them in the order ``ctpipe reconstruct`` does."""
        from ..errors import CtpipeError
        from ..reconstruction.render import render_nodule_views

        smoothing = ctx.config.reconstruct.smoothing_iterations  # views made again: as the run meshes its organs
        kept = load_render_inputs(
            ctx.cache_dir, ctx.case.case_id, vol.shape, geometry=vol.geometry, smoothing_iterations=smoothing
        )
        if kept is None or not ctx.config.reconstruct.renderings:
            return []
        masks, preview = kept
        try:
            paths = render_nodule_views(
                vol, masks, ctx.workdir / "recon", stem=ctx.case.case_id, nodules=results, preview=preview
            )
        except (CtpipeError, ValueError) as exc:  # a property of the case: recorded, as the reconstruction does
            doc["errors"]["render"] = str(exc)
            log.warning("case %s: the nodules were not drawn: %s", ctx.case.case_id, exc)
            return []
        files = doc.setdefault("files", {})
        names = [p.name for p in paths]  # every rendering, in the order ctpipe reconstruct lists them
        files["render"] = [*names, *(n for n in files.get("render", []) if n not in names)]
        return paths
