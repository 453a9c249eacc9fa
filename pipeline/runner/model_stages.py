"""The model worker's stages of ``ctpipe run``: load (case cache → model input) and detect.

``load`` runs the case through the loader of :mod:`pipeline.load` (``make_loader``
with ``loader.backend``: DALI when installed, torch otherwise; one log line says
which), cropped to the lungs when ``loader.roi: lungs`` or
``detector.lung_restriction`` asks for it, grown by the model's crop margin as ``ctpipe detect`` grows it (or by
``loader.roi_margin_mm`` when set). The case cache sets a volume's few NaN or infinite voxels (a NIfTI/NRRD input) to
air when it writes it and keeps the count (:attr:`~pipeline.cache.CacheEntry.nonfinite`): the stage trusts that
record, warns with the count, and never reads the volume for it. An entry without the record (an older version wrote
it), or with too many bad voxels to have been cleaned, is checked here: its NaN or infinite voxels are set to air with
a warning, or it is refused when they are many, as ``ctpipe detect`` does
(:func:`~pipeline.detection.infer_input.clean_volume`; the record's ``finite_check`` step times that pass); the
configured loader then prepares that volume's voxels in place of the cached file's (``load_one(..., array=...)``:
DALI, where configured, as for any other case, and the case's record names it), and the volume is held for
``detect``'s post-processing. ``detect`` runs the RetinaNet on that
model input (:meth:`Detector.detect_loaded`). Both run in the model worker of a
device, so the model input (possibly on the GPU) is handed from one to the other
inside that process, never pickled; only small facts travel in the case's state.
When ``detect`` runs in a worker that does not hold the input (another device, a
restarted worker), it loads the case again.

Both skip a case whose lungs are absent (the ``lungs_absent`` quality flag of an
earlier stage): nothing is loaded, and its findings JSON says why no search ran
(``reason``). Findings are reported at the model's operating point, or at
``detector.score_threshold`` (every candidate with ``detector.all_candidates``);
the other candidates stay in the findings JSON. Positions are LPS mm.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any

from ..cache import NONFINITE_HU, CaseCache
from ..devicetime import DeviceTimer
from ..volume import CTVolume
from .recon_stages import detect_skip_reason
from .stage import CaseContext, Stage, WorkerInfo

log = logging.getLogger(__name__)

#: Model inputs held between ``load`` and ``detect`` in one worker (bounds memory if a case never reaches detect).
MAX_HELD = 16

# per worker process: the detector (shared by both stages) and the inputs loaded but not yet detected
_DETECTORS: dict[tuple[Any, ...], Any] = {}
_HELD: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()


def shared_detector(worker: WorkerInfo) -> Any:
    """This worker's :class:`~pipeline.detection.Detector` (built once per process and device)."""
    cfg = worker.config.detector
    key = (
        str(cfg.bundle),
        worker.device,
        bool(cfg.amp),
        bool(cfg.lung_restriction),
        bool(cfg.postprocess),
        cfg.score_threshold,
        bool(cfg.all_candidates),
    )
    det = _DETECTORS.get(key)
    if det is None:
        from ..detection import Detector

        det = _DETECTORS[key] = Detector(
            bundle=cfg.bundle,
            device=worker.device,
            amp=cfg.amp,
            restrict_to_lungs=cfg.lung_restriction,
            postprocess=cfg.postprocess,
            score_threshold=cfg.score_threshold,
            all_candidates=cfg.all_candidates,
        )
    return det


class _Loading:
    """Loads one case's model input: lung box (when asked), then the loader. One per worker process."""

    def __init__(self, worker: WorkerInfo):
        from ..load import make_loader

        self.worker = worker
        self.det = shared_detector(worker)
        cfg = worker.config
        self.crop = cfg.loader.roi == "lungs" or cfg.detector.lung_restriction
        # None: the model's crop margin, the crop `ctpipe detect` makes; loader.roi_margin_mm when the user sets it
        self.margin_mm = cfg.loader.roi_margin_mm if cfg.loader.roi == "lungs" else None
        self.loader = make_loader(CaseCache(worker.cache_dir), self.det.spec, loader=cfg.loader.backend, device=worker.device)

    def __call__(self, ctx: CaseContext) -> dict[str, Any]:
        """``{"case": LoadedCase | None, "region": LungRegion | None, "lungs": LungRegion | None, "reason": str | None,
        "volume": CTVolume | None, "timings": {s}}``: ``volume`` is the case's HU volume (LPS) with its NaN or infinite
        voxels set to air, when it had any (None: the cached volume is clean, read again where needed); ``region`` restricts findings (``detector.lung_restriction``), ``lungs`` is the region the
        crop and the small-blob search used (the detector's quick mask), limited when findings are restricted to the
        lungs the detector segments itself (:func:`~pipeline.detection.lungs.segmented_lung_region`), whether or not
        the reconstruction kept a lung mask: the candidates of ``ctpipe detect`` on the same series, whatever the
        organs reconstructed."""
        case_id = ctx.case.case_id
        timings: dict[str, float] = {}
        region = roi = None
        t0 = time.perf_counter()
        cleaned, scanned = _cleaned_volume(CaseCache(ctx.cache_dir), case_id)
        if scanned:  # an entry without the writer's record: its voxels read once for NaN or infinite ones
            timings["finite_check"] = time.perf_counter() - t0
        if self.crop:
            with DeviceTimer(self.det.device) as clock:  # the lung segmentation runs on the detector's device
                # the mask reads a coarse subsample only of a (clean) memory-mapped volume
                volume = cleaned if cleaned is not None else CaseCache(ctx.cache_dir).read(case_id, mmap=True)
                # the detector's quick mask, limited to the lungs the detector segments itself, as `ctpipe detect` and
                # detect(vol) limit it: never the reconstruction's full-resolution lungs, which keep other candidates
                lung_mask: Any = None
                if not ctx.config.detector.lung_restriction:
                    from ..detection.lungs import quick_lung_mask

                    lung_mask = quick_lung_mask(volume)  # nothing is dropped: the crop alone, no lung segmentation
                region, roi = self.det.lung_roi(volume, lung_mask=lung_mask, margin_mm=self.margin_mm)
            timings["lung_mask"] = clock.seconds
            if roi is None:
                reason = "no lung voxels found in the series (empty lung mask); nothing to search"
                if ctx.config.detector.lung_restriction:
                    log.warning("case %s: %s", case_id, reason)
                    out = {"case": None, "region": region, "lungs": region, "reason": reason, "volume": cleaned}
                    return {**out, "timings": timings}
                log.warning("case %s: %s; loading the whole volume", case_id, reason)
                region = None
        with DeviceTimer(self.worker.device) as clock:  # on a GPU, the loader's last steps run queued
            # the cached file holds the bad voxels: the configured loader prepares the cleaned voxels in its place
            loaded = self.loader.load_one(case_id, roi=roi, array=None if cleaned is None else cleaned.array)
            loaded.unwrap()  # a case the loader refused raises its CacheError/LoaderError (naming the case) here
        timings["load"] = clock.seconds
        restrict = ctx.config.detector.lung_restriction
        keep_region = region if restrict else None
        lungs = region if restrict or region is None else region.unlimited()  # no restriction: nothing dropped
        out = {"case": loaded, "region": keep_region, "lungs": lungs, "reason": None, "volume": cleaned}
        return {**out, "timings": timings}


def _cleaned_volume(cache: CaseCache, case_id: str) -> tuple[CTVolume | None, bool]:
    """The cached HU volume of ``case_id`` with its NaN or infinite voxels set to air, with the warning ``ctpipe
    detect`` logs (:func:`~pipeline.detection.infer_input.clean_volume`: it names the case and the count, and refuses
    a volume with too many), or None when the cached array has none; and whether the array was read for this.

    Nothing is read for an int16 entry, nor for one whose writer recorded its check (:attr:`CacheEntry.nonfinite`):
    finite, or its bad voxels already set to air in the file (the count is logged as ``ctpipe detect`` logs it)."""
    entry = cache.entry(case_id)
    if not str(entry.sidecar.get("dtype", "")).lstrip("<>=|").startswith("f"):
        return None, False
    record = entry.nonfinite
    if record is not None and (record["voxels"] == 0 or record.get("set_to_air") is True):
        if record["voxels"]:
            log.warning(
                "case %s: %d NaN/infinite voxels set to %g HU (air) when the case was cached",
                case_id,
                record["voxels"],
                NONFINITE_HU,
            )
        return None, False
    from ..detection.infer_input import clean_volume

    volume = cache.read(case_id, mmap=True)
    cleaned = clean_volume(volume, f"case {case_id}")
    return (None if cleaned is volume else cleaned), True


class LoadStage(Stage):
    """Cached HU volume → model input (resampled, windowed, RAS; cropped to the lungs when configured)."""

    name = "load"
    group = "model"
    preload = ("pipeline.load",)

    def __init__(self) -> None:
        self._loading: _Loading | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_loading": None}

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        if detect_skip_reason(ctx.state):  # no lungs: nothing to search, nothing to load
            return {"model_input": None}
        # built on first use: the detect stage's setup (same worker) has loaded the model whose spec this needs
        if self._loading is None:
            self._loading = _Loading(ctx.worker)
        item = self._loading(ctx)
        key = (ctx.case.case_key, ctx.attempt)
        _HELD[key] = item
        while len(_HELD) > MAX_HELD:
            old, _ = _HELD.popitem(last=False)
            log.warning("dropped the held model input of %s (attempt %d): more than %d waiting", old[0], old[1], MAX_HELD)
        case = item["case"]
        info: dict[str, Any] = {
            "loader": case.loader if case is not None else None,
            "shape_xyz": list(case.unwrap().shape[1:]) if case is not None else None,
            "spacing_mm": list(case.geometry.spacing) if case is not None else None,
        }
        return {"model_input": info, "timings": {k: round(v, 6) for k, v in item["timings"].items()}}


class DetectStage(Stage):
    """The loaded model input → lung-nodule findings (LPS mm). The model is loaded once per worker.

    Its timings (s) are the detector's steps; when the worker does not hold the case's model input (the load
    stage ran elsewhere, or held inputs were dropped) and loads it again, also that load's ``lung_mask`` and
    ``load``, so that the breakdown accounts for the stage's wall time in either case."""

    name = "detect"
    group = "model"
    preload = ("pipeline.detection.infer",)

    def __init__(self) -> None:
        self._det: Any = None
        self._loading: _Loading | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_det": None, "_loading": None}

    def setup(self, worker: WorkerInfo) -> None:
        self._det = shared_detector(worker)

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        case_id = ctx.case.case_id
        skip = detect_skip_reason(ctx.state)
        if skip is not None:  # never a search on gas: an empty result that says why
            log.warning("case %s: detection skipped: %s", case_id, skip, extra={"case_id": case_id, "stage": self.name})
            res = self._empty(ctx, skip)
            data = res.to_json()
            data.pop("timings_ms", None)
            return {"findings": [], "findings_doc": data, "detect_skipped": skip, "skipped": skip}
        item = _HELD.pop((ctx.case.case_key, ctx.attempt), None)
        # the steps of loading the input again (lung mask, load; s), which the stage's wall time counts too
        reload: dict[str, float] = {}
        if item is None:
            log.info("case %s: model input not held by worker %s; loading it again", ctx.case.case_id, ctx.worker.name)
            if self._loading is None:
                self._loading = _Loading(ctx.worker)
            item = self._loading(ctx)
            reload = dict(item["timings"])
        skipped = None
        if item["case"] is None:  # no lungs to search in the input loaded again: no search, no latency sample
            res = self._empty(ctx, item["reason"])
            skipped = item["reason"]
        else:
            cache = CaseCache(ctx.cache_dir)
            volume = item.get("volume")  # the volume with its bad voxels set to air, when it had any
            volume = cache.read(case_id, mmap=True) if volume is None else volume
            # its metadata: the series' and the count of voxels set to air, by the cache or the load stage
            res = self._det.detect_loaded(
                item["case"], lung_mask=item["region"], series_uid=ctx.case.series_uid, metadata=volume.metadata
            )
            # small-blob candidates are searched in the lungs the crop used; findings outside the detector's lungs dropped
            res = self._det.postprocess(volume, res, region=item.get("lungs"))
            res = self._det.apply_operating_point(res)
        data = res.to_json()
        timings = data.pop("timings_ms", {})
        steps = {**reload, **{k: v / 1000.0 for k, v in timings.items()}}
        out = {"findings": data["findings"], "findings_doc": data, "timings": {k: round(v, 6) for k, v in steps.items()}}
        # no lungs found when the input was loaded again: no search ran, as on the path above, so the case's results
        # (its SR) make no statement on nodules rather than report none
        return {**out, "skipped": skipped, "detect_skipped": skipped} if skipped else out

    def _empty(self, ctx: CaseContext, reason: str | None) -> Any:
        """No findings, with the reason no search ran, the model and the threshold it would have reported at."""
        from ..detection.findings import Findings

        res = Findings(
            [],
            case_id=ctx.case.case_id,
            series_uid=ctx.case.series_uid,
            model=self._det.config.name,
            restricted_to_lungs=bool(ctx.config.detector.lung_restriction),
            device=str(self._det.device),
            precision=self._det.precision,
            reason=reason,
        )
        return res.select(self._det.score_threshold, self._det.threshold_source)
