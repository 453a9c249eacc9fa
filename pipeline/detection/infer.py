"""The nodule :class:`Detector`: model loaded once, then one call per case.

Per case: input checks and optional lung restriction (crop to the lungs' box + margin; :mod:`.infer_input`), the
loader's MONAI-equivalent preprocessing (:mod:`pipeline.load`: slab-wise straight
from the possibly memory-mapped source array; :meth:`Detector.detect` calls
:func:`pipeline.load.preprocess_volume`, the batch runner feeds the loader's
output to :meth:`Detector.detect_loaded`), the RetinaNet on the whole input when it fits
the model's patch size, MONAI's sliding-window inferer (the model's overlap)
otherwise, box selection (MONAI's ``RetinaNetDetector``), clipping to the image,
conversion to LPS exactly as ``AffineBoxToWorldCoordinate`` does, and the
lung filter (:mod:`.postprocess`). Then, unless switched off: centres refined on the HU volume and, for models
with a false-positive reduction stage (the demo model), candidates re-scored by its
classifier together with small-blob candidates (:mod:`.fp_reduction`); other models get
compact-blob rescoring (:mod:`.refine`). Last, the findings scoring at or above the score
threshold are reported, the other candidates kept beside them (:meth:`Detector.apply_operating_point`;
threshold from :func:`.operating_point.resolve_threshold`: the model's operating point unless
configured). Each finding names the nearest source slice by InstanceNumber and SOP Instance UID
when the series metadata lists them (:func:`.findings.slice_ref`). Mixed precision (see
:mod:`.precision`); model time measured with CUDA events on a GPU.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..devicetime import DeviceTimer
from ..errors import BundleError, ConfigError, described, require_bool, require_path, require_text
from ..ingest.image import label_map_note
from ..intensity import not_hu_hint
from ..load import InputGeometry, LoadedCase, PreprocessSpec, Roi, preprocess_volume
from ..load.base import resolve_device
from ..volume import (
    COARSE_PIXEL_NOTE,
    LOSSY_NOTE,
    THICK_SLICE_NOTE,
    CTVolume,
    coarse_pixel_detail,
    lossy_detail,
    require_volume,
    slice_thickness_mm,
    thick_slice_detail,
)
from .bundle import LoadedModel, load_model
from .findings import Findings, slice_number_source
from .fp_reduction import FPReducer, FPReductionConfig, reduce_false_positives
from .infer_input import (
    MAX_BAD_VOXEL_FRACTION,
    MIN_INPUT_MM,
    LungMask,
    check_volume_extent,
    clean_volume,
    lung_box,
    lung_region,
    nonfinite_set_to_air,
    refuse_small,
)
from .lungs import LungRegion, quick_lung_mask, region_from_mask
from .network import box_iou_float32, build_detector, run_detector
from .operating_point import check_score_threshold, resolve_threshold
from .postprocess import boxes_to_findings, calibrate_scores, limit_to_lungs
from .precision import autocast_dtype, conv_layout, precision_name
from .refine import refine_findings
from .score_calibration import ScoreCalibration, model_score_calibration

log = logging.getLogger(__name__)

__all__ = ["MAX_BAD_VOXEL_FRACTION", "MIN_INPUT_MM", "Detector", "LungMask", "detect"]


def run_device(device: str | int | torch.device | None) -> torch.device:
    """The torch device a :class:`Detector` given ``device`` runs on: that one, else CUDA when present, else the CPU.

    A name is checked as a run's ``device`` setting is (:func:`~pipeline.load.base.resolve_device`: ``cpu``,
    ``cuda``, ``cuda:N``, ``gpu``, ``auto``); :class:`~pipeline.errors.LoaderError` for an unknown one or a GPU that
    torch does not see."""
    if isinstance(device, torch.device):
        return device
    if device in (None, ""):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(resolve_device(device, where="device"))


class Detector:
    """A loaded nodule detector. Build once per device; call :meth:`detect` per case.

    Parameters (keyword-only)
    -------------------------
    bundle: ``None`` for the embedded demo model, a MONAI bundle directory, or a ctpipe model JSON.
    model: an already loaded :class:`LoadedModel` (overrides ``bundle``).
    device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``... or a GPU number (1 is ``"cuda:1"``); default CUDA when available.
    amp: mixed precision where the hardware runs it natively (float16 on CUDA, bfloat16 on CPUs with
        AVX512-BF16/AMX, see :mod:`.precision`); scores then differ from float32 by about 0.005
        (at most a few hundredths), centres by about 0.2 mm (at most about one model voxel).
        ``False``: float32 throughout, as MONAI's bundle pipeline runs on a CPU.
    restrict_to_lungs: default for :meth:`detect`.
    postprocess: refine centres on the HU volume and re-score (:meth:`postprocess`); ``False`` gives the
        network's boxes exactly as MONAI's pipeline returns them.
    score_threshold: report findings scoring at or above this (0..1); ``None`` (default): the model's operating
        point (:mod:`.operating_point`; for ``postprocess=False`` the one for the network's own scores).
    all_candidates: report every candidate, whatever its score (overrides ``score_threshold``).
    Candidates below the threshold are kept in :attr:`Findings.below_threshold` (and the findings JSON).
    """

    def __init__(
        self,
        *,
        bundle: str | Path | None = None,
        model: LoadedModel | None = None,
        device: str | int | torch.device | None = None,
        amp: bool = True,
        restrict_to_lungs: bool = True,
        postprocess: bool = True,
        score_threshold: float | None = None,
        all_candidates: bool = False,
    ) -> None:
        self.model = model or load_model(bundle)
        #: post-process on the full-resolution HU volume (:meth:`postprocess`): refine each finding's centre, then
        #: re-score with the model's false-positive reduction stage if it has one (:mod:`pipeline.detection.fp_reduction`),
        #: else raise the scores of compact blobs (:mod:`pipeline.detection.refine`); off gives the network's raw boxes
        self.postprocessing = bool(postprocess)
        self.config = self.model.config
        #: the score threshold findings are reported at (``None``: every candidate) and where it came from
        self.score_threshold, self.threshold_source = resolve_threshold(
            self.config, score_threshold=score_threshold, all_candidates=all_candidates, postprocess=self.postprocessing
        )
        #: the map of thick-slice series' final scores onto the thin-slice scale (:mod:`.score_calibration`), applied
        #: by :meth:`postprocess`; ``None`` for the network's own scores and for models that record none
        self.score_calibration: ScoreCalibration | None = model_score_calibration(self.config) if self.postprocessing else None
        self.device = run_device(device)
        self._autocast = autocast_dtype(self.device, bool(amp))
        self._fpr: FPReducer | None = None
        fpr_entry = self.config.extra.get("fp_reduction")
        if self.postprocessing and fpr_entry and self.config.weights is not None:
            fpr_cfg = FPReductionConfig.from_json(fpr_entry, weights_dir=self.config.weights.parent)
            self._fpr = FPReducer(fpr_cfg, device=self.device, autocast=self._autocast)
        #: the network's number format: "float32", "float16" or "bfloat16"
        self.precision = precision_name(self._autocast)
        self.restrict_to_lungs = restrict_to_lungs
        #: The loader settings this model needs (MONAI's RetinaNetDetector pads to the network's divisibility itself).
        self.spec: PreprocessSpec = self.config.preprocess_spec(size_divisible=(1, 1, 1))
        net = self.model.network
        layout = conv_layout(self.device)
        if layout == torch.channels_last_3d and isinstance(net, torch.nn.Module) and not isinstance(net, torch.jit.ScriptModule):
            # a copy leaves the caller's network as it is
            net = copy.deepcopy(net).to(memory_format=layout)
            self._channels_last = True
        else:
            self._channels_last = False
        net = net.to(self.device).eval()
        self._detector = build_detector(
            net, self.config.anchors, self.config.selector, sliding_window=self.config.sliding_window, device=self.device
        )
        self._detector.eval()
        # MONAI's IoU without its per-call checks: the same values, so the same boxes kept (MONAI's peer keeps its own)
        self._detector.box_selector.box_overlap_metric = box_iou_float32
        log.info(
            "detector %s on %s (%s); findings reported at score >= %s (%s)",
            self.config.name,
            self.device,
            self.precision,
            "any" if self.score_threshold is None else f"{self.score_threshold:.4g}",
            self.threshold_source,
        )

    @property
    def amp(self) -> bool:
        """Whether the network runs in mixed precision (see :attr:`precision`)."""
        return self._autocast is not None

    def __repr__(self) -> str:
        return f"Detector(model={self.config.name!r}, device={self.device}, spacing={self.config.spacing})"

    # -- helpers -----------------------------------------------------------------------
    def lung_roi(
        self, volume: CTVolume, *, lung_mask: LungMask | None = None, margin_mm: float | None = None
    ) -> tuple[LungRegion, Roi | None]:
        """The lungs of ``volume`` and the box to crop the network input to (source indices, around the lungs,
        grown by ``margin_mm``; ``None`` when no lung voxel is found).

        Candidates are searched in the threshold mask of the air-filled lungs (:func:`quick_lung_mask`, the search
        the operating point was calibrated with), and the input cropped to its box, whether or not ``lung_mask`` is
        given; a given mask (e.g. a reconstruction's segmented lungs) is the region's ``limit``: findings outside it
        are dropped at the end (:meth:`postprocess`). So the network sees the same input and the false-positive
        reduction the same candidates either way: its scores depend on where the input starts (by up to 0.25 on a
        real chest for a crop 3 voxels narrower), and the small-blob candidates are the strongest in the region
        searched. Without ``lung_mask``, the limit is the lungs :func:`segmented_lung_region` finds: the threshold mask
        holds bowel and stomach gas as well, and a scan of the abdomen with the lung bases at its top would otherwise
        report the colon's contents. A :class:`LungRegion` is taken as it is (no limit unless it has one); the given
        mask alone is searched when it does not overlap the threshold mask. ``margin_mm`` defaults to the model's crop
        margin.
        """
        check_volume_extent(volume, f"series {volume.series_uid}")
        region = lung_region(volume, lung_mask, device=str(self.device))
        if region.empty:
            return region, None
        margin = self.config.lung_crop_margin_mm if margin_mm is None else float(margin_mm)
        return region, lung_box(region, volume, margin)

    # -- main entry --------------------------------------------------------------------
    def detect(
        self,
        volume: CTVolume,
        *,
        lung_mask: LungMask | None = None,
        restrict_to_lungs: bool | None = None,
        case_id: str | None = None,
    ) -> Findings:
        """Findings for one CT volume (HU, LPS geometry); positions in LPS mm.

        Restricting to the lungs searches the threshold mask of the air-filled lungs (:func:`quick_lung_mask`, the
        region the operating point was calibrated with); a ``lung_mask`` (bool ``[k, j, i]`` on the volume grid, a
        :class:`LabelMap` or a dict of masks, e.g. a reconstruction's segmented lungs) drops the findings outside
        those lungs; without one, those outside the lungs :func:`segmented_lung_region` finds (:meth:`lung_roi`).
        An empty lung mask gives no findings with a logged reason. The result reports the findings at
        or above the score threshold (:meth:`apply_operating_point`), all candidates kept.
        """
        volume = require_volume(volume)
        restrict = self.restrict_to_lungs if restrict_to_lungs is None else bool(restrict_to_lungs)
        where = f"case {case_id or volume.series_uid or '?'}"
        timings: dict[str, float] = {}
        t_all = time.perf_counter()
        result = Findings(
            [],
            case_id=case_id,
            series_uid=volume.series_uid,
            model=self.config.name,
            restricted_to_lungs=restrict,
            device=str(self.device),
            precision=self.precision,
        )
        if note := label_map_note(volume.metadata):  # load_series warned once; the findings are of label values
            log.warning("%s: its values are taken as HU, but it was loaded from a label map: %s", where, note)
        volume = clean_volume(volume, where)
        result.nonfinite_voxels_set_to_air = nonfinite_set_to_air(volume.metadata)
        check_volume_extent(volume, where)
        region = roi = None
        if restrict:
            with DeviceTimer(self.device) as clock:  # the lung segmentation runs on the detector's device
                region, roi = self.lung_roi(volume, lung_mask=lung_mask)
            timings["lung_mask"] = clock.ms
            if roi is None:
                result.reason = (
                    "no lungs found in the series (the lung segmentation found no lung parenchyma: the air in the body, "
                    "if any, is bowel or stomach gas); nothing to search"
                    if lung_mask is None
                    else "no lung voxels in the given lung mask; nothing to search"
                ) + not_hu_hint(volume.array)
                log.warning("%s: %s", where, result.reason)
                timings["total"] = (time.perf_counter() - t_all) * 1000.0  # the lung search was the case's work
                result.timings_ms = timings
                return self.apply_operating_point(result)
        with DeviceTimer(self.device) as clock:  # the last steps run queued on a GPU
            case = preprocess_volume(volume, self.spec, device=str(self.device), roi=roi, case_id=case_id or "volume")
        timings["preprocess"] = clock.ms
        tensor = case.unwrap()  # raises the case's error, so a geometry is there from here on
        assert case.geometry is not None
        result = self._finish(result, tensor, case.geometry, region, volume.metadata, timings, t_all, where)
        return self.apply_operating_point(self.postprocess(volume, result, region=region))

    def apply_operating_point(self, findings: Findings) -> Findings:
        """``findings`` reporting the candidates scoring at or above :attr:`score_threshold` (every one when it is
        ``None``), the others kept in ``below_threshold``; the threshold and its source are recorded. One log line
        names the top findings' slices (InstanceNumber where the series lists them)."""
        out = findings.select(self.score_threshold, self.threshold_source)
        if not out.reason:
            top = ", ".join(f"{f.score:.2f} at {out.slice_number_source} {f.slice_number}" for f in out.findings[:3])
            log.info(
                "case %s: %d of %d candidates reported (score >= %s, %s)%s",
                out.case_id or out.series_uid or "?",
                len(out),
                len(out.candidates),
                "any" if self.score_threshold is None else f"{self.score_threshold:.4g}",
                self.threshold_source,
                f"; top: {top}" if top else "",
            )
        return out

    @property
    def fp_reduction(self) -> bool:
        """Whether :meth:`postprocess` re-scores candidates with a false-positive reduction classifier."""
        return self._fpr is not None

    @property
    def fp_reducer(self) -> FPReducer | None:
        """The false-positive reduction classifier :meth:`postprocess` re-scores candidates with (``None``: none)."""
        return self._fpr

    def postprocess(self, volume: CTVolume, findings: Findings, *, region: LungRegion | None = None) -> Findings:
        """Post-processing on ``volume`` (HU, LPS) when :attr:`postprocessing`: centre refinement, then
        false-positive reduction (models that have it; small-blob candidates searched in ``region``, the lungs,
        computed when not given) or compact-blob rescoring, on every candidate of ``findings``; then, for a series
        with thick slices, the model's score calibration (:attr:`score_calibration`).

        :meth:`detect` applies it; callers of :meth:`detect_loaded` apply it with the case's HU volume, then
        :meth:`apply_operating_point`. The result has no threshold applied (every candidate reported).
        """
        findings = findings.with_candidates(findings.candidates)
        if not self.postprocessing or (not len(findings) and self._fpr is None) or findings.reason:
            return limit_to_lungs(volume, findings, region, margin_mm=self.config.lung_filter_margin_mm)
        t0 = time.perf_counter()
        with DeviceTimer(self.device) as clock:  # the blob search and the classifier run on the device
            if self._fpr is not None:
                out = reduce_false_positives(
                    volume, findings, self._fpr, region if region is not None else quick_lung_mask(volume)
                )
            else:
                out = refine_findings(volume, findings, rescore=True)
        out.timings_ms["fp_reduction" if self._fpr is not None else "refine"] = clock.ms
        out = calibrate_scores(volume, out, self.score_calibration)
        out = limit_to_lungs(volume, out, region, margin_mm=self.config.lung_filter_margin_mm)
        # "total" is the whole detection: the search's total (from _finish) and this post-processing
        out.timings_ms["total"] = findings.timings_ms.get("total", 0.0) + (time.perf_counter() - t0) * 1000.0
        return out

    def detect_loaded(
        self,
        case: LoadedCase,
        *,
        lung_mask: LungMask | None = None,
        series_uid: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        timings_ms: Mapping[str, float] | None = None,
    ) -> Findings:
        """Findings (LPS mm) for a model input made by the loader (:class:`pipeline.load.LoadedCase`).

        The loader must have been built with :attr:`spec` (possibly with a crop, e.g. from
        :meth:`lung_roi`). ``lung_mask`` (on the case's source grid) enables the lung filter;
        ``metadata`` (the series' DICOM metadata) maps slices to InstanceNumbers and SOP Instance UIDs;
        ``timings_ms`` (e.g. the lung-mask time) are reported with the model's. No score threshold is applied:
        follow with :meth:`postprocess` and :meth:`apply_operating_point`.
        """
        t_all = time.perf_counter()
        tensor = case.unwrap()
        geom = case.geometry
        assert geom is not None  # a loaded case always has one
        region = None
        if lung_mask is not None:
            shell = CTVolume(np.broadcast_to(np.int8(0), geom.source.shape), geom.source)  # grid only, no voxel data
            region = lung_mask if isinstance(lung_mask, LungRegion) else region_from_mask(lung_mask, shell)
        result = Findings(
            [],
            case_id=case.case_id,
            series_uid=series_uid,
            model=self.config.name,
            restricted_to_lungs=region is not None,
            device=str(self.device),
            precision=self.precision,
            nonfinite_voxels_set_to_air=nonfinite_set_to_air(metadata or {}),
        )
        return self._finish(result, tensor, geom, region, metadata or {}, dict(timings_ms or {}), t_all, f"case {case.case_id}")

    def _finish(
        self,
        result: Findings,
        tensor: torch.Tensor,
        grid: InputGeometry,
        region: LungRegion | None,
        metadata: Mapping[str, Any],
        timings: dict[str, float],
        t_all: float,
        where: str,
    ) -> Findings:
        lo, hi = grid.valid_box
        refuse_small((np.asarray(hi) - np.asarray(lo)) * np.asarray(grid.spacing), where, "input", "x, y, z")
        result.input_shape_xyz = grid.shape
        result.slice_number_source = slice_number_source(metadata, int(grid.source.size_ijk[2]))
        thick = thick_slice_detail(slice_thickness_mm(grid.source, metadata))
        if thick is not None:  # the reconstruction's thick_slices flag, on the findings themselves
            result.flags = {**result.flags, "thick_slices": f"{THICK_SLICE_NOTE} ({thick})"}
            log.warning("%s: %s", where, result.flags["thick_slices"], extra={"quality_flag": "thick_slices"})
        coarse = coarse_pixel_detail(grid.source)
        if coarse is not None:  # the reconstruction's coarse_pixels flag, on the findings themselves
            result.flags = {**result.flags, "coarse_pixels": f"{COARSE_PIXEL_NOTE} ({coarse})"}
            log.warning("%s: %s", where, result.flags["coarse_pixels"], extra={"quality_flag": "coarse_pixels"})
        lossy = lossy_detail(metadata)
        if lossy is not None:  # the reconstruction's lossy_compressed flag, on the findings themselves
            result.flags = {**result.flags, "lossy_compressed": f"{LOSSY_NOTE} ({lossy})"}
            log.warning("%s: %s", where, result.flags["lossy_compressed"], extra={"quality_flag": "lossy_compressed"})
        out, model_ms, use_sw = run_detector(
            self._detector,
            tensor,
            roi_size=self.config.roi_size,
            device=self.device,
            autocast=self._autocast,
            channels_last=self._channels_last,
        )
        timings["model"] = model_ms
        result.sliding_window = use_sw
        t0 = time.perf_counter()
        det = out[0]
        boxes = det["boxes"].float().cpu().numpy().reshape(-1, 6)
        scores = det[self._detector.pred_score_key].float().cpu().numpy().reshape(-1)
        result.findings = boxes_to_findings(
            boxes, scores, grid, metadata, region, lung_filter_margin_mm=self.config.lung_filter_margin_mm
        )
        timings["postprocess"] = (time.perf_counter() - t0) * 1000.0
        timings["total"] = (time.perf_counter() - t_all) * 1000.0
        result.timings_ms = timings
        log.info(
            "%s: %d findings (input %s, %s, model %.0f ms)",
            where,
            len(result),
            grid.shape,
            "sliding window" if use_sw else "whole volume",
            model_ms,
        )
        return result


_DETECTORS: dict[tuple[str | None, str], Detector] = {}


def detect(
    volume: CTVolume,
    *,
    bundle: str | Path | None = None,
    device: str | int | None = None,
    lung_mask: LungMask | None = None,
    restrict_to_lungs: bool = True,
    case_id: str | None = None,
    detector: Detector | None = None,
    score_threshold: float | None = None,
    all_candidates: bool = False,
) -> Findings:
    """Lung-nodule findings for ``volume`` (positions in LPS mm).

    The model is loaded once per (bundle, device) and kept for later calls; pass ``detector``
    to use one you built yourself. Findings scoring at or above the model's operating point are
    reported (``score_threshold``: another threshold, 0..1; ``all_candidates``: every candidate);
    the other candidates are kept in ``below_threshold``. ``lung_mask`` (on ``volume``'s grid: a bool
    array ``[k, j, i]`` (an integer or 0/1 float array: its non-zero voxels; fractional values, a probability map, are
    refused with a :class:`~pipeline.errors.GeometryError`), a :class:`LabelMap`, a dict of lung masks such as
    ``reconstruct(volume).masks``, or the reconstruction itself)
    restricts the findings as the batch runner does with the case's segmented lungs; without it, the lungs
    :func:`~pipeline.detection.lungs.segmented_lung_region` finds. The search itself is always the detector's coarse
    threshold mask (the region its operating point was calibrated on). ``restrict_to_lungs=False`` searches and
    reports over the whole volume instead (no lung mask at all). ``bundle``: ``None`` for the embedded demo model, a
    MONAI bundle folder or a ctpipe model JSON. ``device``: a device name of :mod:`pipeline.devices` (``"auto"``, ``"cpu"``, ``"gpu"``
    or ``"cuda"``, ``"cuda:N"``) or N (GPU N) (default CUDA when present, else the CPU). ``case_id``: the case's name in the findings (``Findings.case_id``) and in logged
    warnings and errors (default none: they name the series UID).

    Raises :class:`~pipeline.errors.NotAVolumeError` for a ``volume`` that is not a :class:`CTVolume`,
    :class:`~pipeline.errors.LoaderError` for an unknown ``device`` or a GPU that torch does not see,
    :class:`~pipeline.errors.BundleError` for a ``score_threshold`` that is not a probability or a ``bundle``
    that is not a path,
    :class:`~pipeline.errors.ConfigError` for a ``case_id`` that is not text, a ``detector`` that is none, a ``restrict_to_lungs`` or
    ``all_candidates`` that is not True or False
    (``"no"`` is refused, not taken as true), all before the model is loaded. A volume ``load_series`` loaded from a
    label map (its warning in ``metadata["warnings"]``) is searched as given, with that warning logged again.
    """
    volume = require_volume(volume)
    require_text(case_id, name="case_id", error=ConfigError)
    require_bool(restrict_to_lungs, name="restrict_to_lungs", error=ConfigError)
    require_bool(all_candidates, name="all_candidates", error=ConfigError)
    if bundle is not None:
        require_path(
            bundle,
            where="bundle",
            error=BundleError,
            what="a MONAI bundle folder",
            fix="pass the bundle folder (or a ctpipe model JSON), or leave bundle out for the embedded demo model",
        )
    if score_threshold is not None and not all_candidates:
        check_score_threshold(score_threshold, where="score_threshold", none="None")
    if detector is not None and not callable(getattr(detector, "detect", None)):  # a bundle's path, say
        raise ConfigError(
            f"must be a Detector, got {described(detector)}",
            where="detector",
            fix="pass a Detector(bundle=..., device=...) you built, a bundle as bundle=..., or leave detector out",
        )
    det = detector
    if det is None:
        # keyed by the device the detector runs on: device=None and the device it resolves to share one model
        key = (str(Path(bundle).resolve()) if bundle is not None else None, str(run_device(device)))
        det = _DETECTORS.get(key)
        if det is None:
            det = _DETECTORS[key] = Detector(bundle=bundle, device=device)
    found = det.detect(volume, lung_mask=lung_mask, restrict_to_lungs=restrict_to_lungs, case_id=case_id)
    if score_threshold is not None or all_candidates:
        found = found.select(
            *resolve_threshold(
                det.config, score_threshold=score_threshold, all_candidates=all_candidates, postprocess=det.postprocessing
            )
        )
    return found
