"""False-positive reduction: a small 3-D CNN that scores candidate positions as nodule or not.

Second stage of the demo pipeline (LUNA16's "false positive reduction" track): each
candidate (the RetinaNet's findings and the small-blob candidates of :mod:`.candidates`)
is cut out of the HU volume as a cube of ``patch`` voxels of ``spacing_mm`` mm centred on
it, axes along the patient's L, P and S directions whatever the series' orientation
(patch array ``[S, P, L]``); with ``context_spacing_mm`` set, a second cube of the same number of
voxels on a coarser grid, centred on the same point, shows the surroundings (does a bright
spot continue as a vessel, does it sit on the chest wall) as a second channel. The
:class:`~.fp_classifier.PatchClassifier` scores the result (or, with ``members`` above 1, a
:class:`~.fp_classifier.PatchEnsemble` of several trained apart, their logits averaged; :mod:`.fp_classifier`); with
``flip_views`` above 1, candidates it does not clearly reject are scored again on mirrored copies of their patches
and the logits averaged (:func:`~.fp_classifier.patch_logits`: the network is not exactly mirror-invariant, and the
mean ranks candidates more reliably). Scores of candidates the network also proposed may be combined with its score
(:func:`combine_scores`, weight chosen on validation phantoms); with ``blob_support``, a small-blob candidate's too,
with the network's support for it (:func:`network_support`: the best network box holding it, else the lowest score
the network reported), so that a finding needs both stages to agree; duplicates of one nodule are merged
(:func:`suppress_duplicates`; with ``box_merge``, also candidates whose centres share one candidate's box, such
as several candidates on the rim of one large nodule).

The classifier's weights are trained by ``scripts/train_fp_reducer.py`` on synthetic
phantoms (for demonstration and testing only, not for clinical use); a model JSON names
them in its ``fp_reduction`` entry. Positions are DICOM patient coordinates (LPS, mm).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np
import torch
from scipy import sparse

from ..devicetime import DeviceTimer
from ..errors import BundleError
from ..volume import CTVolume, float3
from .candidates import blob_candidates
from .findings import Finding, Findings, box_extents, slice_fields
from .fp_classifier import (
    FLIP_VIEWS,
    FPReductionConfig,
    PatchClassifier,
    PatchEnsemble,
    build_classifier,
    fold_batch_norm,
    patch_logits,
)
from .lungs import LungRegion
from .patches import DevicePatches, extract_patches
from .precision import conv_layout
from .refine import refine_findings

__all__ = [
    "BOX_TRUST",
    "FLIP_VIEWS",
    "NETWORK_BATCH_CPU",
    "PATCH_BATCH",
    "FPReducer",
    "FPReductionConfig",
    "PatchClassifier",
    "PatchEnsemble",
    "build_classifier",
    "candidate_findings",
    "classifier_input",
    "combine_scores",
    "final_scores",
    "fold_batch_norm",
    "network_support",
    "patch_logits",
    "reduce_false_positives",
    "suppress_duplicates",
]

log = logging.getLogger(__name__)

#: Candidates whose cubes are cut at once: a scan's 300 to 550 in one to three batches (256 two-channel patches of
#: 24^3 are 28 MB as float32).
PATCH_BATCH = 256
#: Patches the classifier's network sees at once on a CPU (:func:`~.fp_classifier.patch_logits`): a batch's
#: activations then stay in the processor's caches (on 2 otherwise idle CPU cores the network takes about a fifth
#: less time than with 256 at a time; the same probabilities to float32 rounding). On cores shared with other busy
#: processes the gain can turn into a loss: more, smaller batches wait more often on a thread that is not running.
#: Other devices take a whole :data:`PATCH_BATCH`.
NETWORK_BATCH_CPU = 64
BOX_TRUST = 0.5  # a merged network box stands for the blob inside it when it scores at least this share of the blob's score


def classifier_input(volume: CTVolume, centers_lps: np.ndarray, config: FPReductionConfig) -> np.ndarray:
    """The classifier's input for positions ``centers_lps`` (N, 3; LPS mm): float32 ``(N, C, P, P, P)``, one
    channel per grid of ``config.spacings_mm`` (:func:`extract_patches`; the same centre, ``P = config.patch``)."""
    return np.stack([extract_patches(volume, centers_lps, patch=config.patch, spacing_mm=s) for s in config.spacings_mm], axis=1)


def network_support(centers_lps: np.ndarray, detector_score: np.ndarray, extents_mm: np.ndarray) -> np.ndarray:
    """``detector_score`` with each small-blob candidate's entry (``< 0``) replaced by the network's support for it:
    the highest score of the network's candidates (``>= 0``) whose box (``extents_mm`` along L, P, S, centred on the
    candidate's centre; LPS mm) holds the blob's centre, else the lowest score the network reported anywhere (its
    belief there is at most that: it reports every box down to it). Unchanged when the network reported nothing."""
    s = np.asarray(detector_score, dtype=np.float64).copy()
    centers = np.asarray(centers_lps, dtype=np.float64).reshape(-1, 3)
    net, blobs = np.flatnonzero(s >= 0), np.flatnonzero(s < 0)
    if len(net) == 0 or len(blobs) == 0:
        return s
    half = np.asarray(extents_mm, dtype=np.float64).reshape(-1, 3)[net] / 2.0
    inside = np.all(np.abs(centers[blobs][:, None, :] - centers[net][None, :, :]) <= half[None], axis=2)  # [blob, box]
    held = np.where(inside, s[net][None, :], -np.inf).max(axis=1)
    s[blobs] = np.where(np.isfinite(held), held, s[net].min())
    return s


def final_scores(
    config: FPReductionConfig,
    classifier_prob: np.ndarray,
    detector_score: np.ndarray,
    centers_lps: np.ndarray,
    extents_mm: np.ndarray,
) -> np.ndarray:
    """The candidates' final scores under ``config``: :func:`combine_scores` with its ``detector_weight``, small-blob
    candidates given the network's support first when ``blob_support`` is on (:func:`network_support`; LPS mm)."""
    support = network_support(centers_lps, detector_score, extents_mm) if config.blob_support else detector_score
    return combine_scores(classifier_prob, support, config.detector_weight)


def combine_scores(classifier_prob: np.ndarray, detector_score: np.ndarray, detector_weight: float) -> np.ndarray:
    """Final scores (0..1): ``p^(1-w) * s^w`` (``w = detector_weight``) where the detector proposed the
    candidate (its score ``s >= 0``), the classifier's probability ``p`` alone where it did not (``s < 0``)."""
    p = np.clip(np.asarray(classifier_prob, dtype=np.float64), 1e-6, 1.0)
    s = np.asarray(detector_score, dtype=np.float64)
    both = np.exp((1.0 - detector_weight) * np.log(p) + detector_weight * np.log(np.clip(s, 1e-6, 1.0)))
    return np.where(s >= 0, both, p)


class FPReducer:
    """A loaded classifier (:func:`build_classifier`) with its settings; :meth:`probabilities` scores positions
    (LPS mm)."""

    def __init__(
        self, config: FPReductionConfig, *, device: str | torch.device = "cpu", autocast: torch.dtype | None = None
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self._autocast = autocast
        net = build_classifier(config)
        if not config.weights.is_file():
            raise BundleError(
                "false-positive reduction weights are missing",
                where=config.weights,
                fix="reinstall ctpipe or retrain them with scripts/train_fp_reducer.py",
            )
        try:
            state = torch.load(config.weights, map_location="cpu", weights_only=True)
            net.load_state_dict(state)
        except (RuntimeError, OSError, ValueError, KeyError) as exc:
            raise BundleError(
                f"false-positive reduction weights do not load: {exc}",
                where=config.weights,
                fix="retrain them with scripts/train_fp_reducer.py",
            ) from exc
        self._layout = conv_layout(self.device)
        #: the trained network as loaded (its state dict is the weights file's)
        self.network = net.to(self.device).to(memory_format=self._layout).eval()
        # what :meth:`probabilities` runs: the same network with its batch norms folded into the convolutions
        self._scoring = fold_batch_norm(self.network).to(memory_format=self._layout)

    @torch.inference_mode()
    def probabilities(
        self, volume: CTVolume, centers_lps: np.ndarray, *, batch: int = PATCH_BATCH, cut_on_device: bool | None = None
    ) -> np.ndarray:
        """Nodule probability (0..1) of each position (N, 3; LPS mm) in ``volume`` (HU), ``batch`` patches at a
        time. The patches are cut on the classifier's device (:class:`.patches.DevicePatches`) where that is not
        the CPU (on the CPU after all, with a warning, where the device runs out of memory for the voxels), on the
        CPU (:func:`.patches.extract_patches`) otherwise; ``cut_on_device`` overrides that choice (the same values
        either way, up to float32 rounding). The network runs with its batch norms folded into its convolutions
        (:func:`.fp_classifier.fold_batch_norm`: the same logits up to float32 rounding), on a CPU
        :data:`NETWORK_BATCH_CPU` patches at a time."""
        cfg = self.config
        centers = np.asarray(centers_lps, dtype=np.float64).reshape(-1, 3)
        probs = np.zeros(len(centers))
        net_batch = NETWORK_BATCH_CPU if self.device.type == "cpu" else None
        # off the CPU the cubes are cut where the network runs (DevicePatches), from one copy of the voxels
        on_device = None
        if (self.device.type != "cpu" if cut_on_device is None else cut_on_device) and len(centers):
            try:
                on_device = DevicePatches(volume, centers, patch=cfg.patch, spacings_mm=cfg.spacings_mm, device=self.device)
            except torch.OutOfMemoryError:
                log.warning(
                    "false-positive reduction: %s ran out of memory for the voxels around %d candidates; their cubes "
                    "are cut on the CPU instead (the same values)",
                    self.device,
                    len(centers),
                )
                torch.cuda.empty_cache()
        for a in range(0, len(centers), batch):
            if on_device is not None:
                x = on_device.cubes(a, a + batch).contiguous(memory_format=self._layout)
            else:
                x = torch.from_numpy(classifier_input(volume, centers[a : a + batch], cfg)).to(
                    self.device, memory_format=self._layout
                )
            with torch.autocast(self.device.type, dtype=self._autocast, enabled=self._autocast is not None):
                logits = patch_logits(
                    self._scoring, x, views=cfg.flip_views, min_probability=cfg.flip_min_probability, batch=net_batch
                )
            probs[a : a + batch] = torch.sigmoid(logits).cpu().numpy()
        return probs


def candidate_findings(
    volume: CTVolume,
    findings: Findings,
    region: LungRegion | None,
    *,
    blobs: int = 200,
    timings_ms: dict[str, float] | None = None,
    device: str | torch.device | None = None,
) -> tuple[list[Finding], np.ndarray]:
    """The candidates the classifier scores, with the detector's score of each (-1 for blobs):
    every candidate of ``findings`` (reported or not) and up to ``blobs`` small-blob candidates
    (:func:`.candidates.blob_candidates`, boxes of the blob's scale), all with centres refined on
    ``volume`` (:func:`.refine.refine_findings`). The blob search's filters run on ``device`` when it is not the
    CPU (a GPU: :mod:`.candidates_device`). ``timings_ms``, when given, receives the time of the blob
    search (``fpr_blobs``, timed on ``device``: :class:`~pipeline.devicetime.DeviceTimer`) and of the refinement
    (``fpr_refine``, on the host), in ms."""
    items = findings.candidates
    det = [f.score for f in items]
    with DeviceTimer(device) as blob_clock:  # the blob search's filters run on the device
        found = blob_candidates(volume, region, max_candidates=blobs, device=device) if blobs > 0 else None
    t1 = time.perf_counter()
    if found is not None and len(found):
        size_ijk = np.asarray(volume.geometry.size_ijk)
        vox = np.clip(np.round(volume.lps_to_index(found.centers_lps)).astype(int), 0, size_ijk - 1).reshape(-1, 3)
        for n in range(len(found)):
            c, r = found.centers_lps[n], found.diameters_mm[n] / 2.0
            items.append(
                Finding(
                    center_lps=float3(c),
                    box_min_lps=float3(c - r),
                    box_max_lps=float3(c + r),
                    diameter_mm=float(2.0 * r),
                    score=0.0,
                    voxel_ijk=(int(vox[n, 0]), int(vox[n, 1]), int(vox[n, 2])),
                    **slice_fields(int(vox[n, 2]), volume.metadata, int(size_ijk[2])),
                )
            )
            det.append(-1.0)
    refined = refine_findings(volume, findings.with_candidates(items), sort=False)
    if timings_ms is not None:
        timings_ms["fpr_blobs"] = blob_clock.ms
        timings_ms["fpr_refine"] = (time.perf_counter() - t1) * 1000.0
    return list(refined), np.asarray(det, dtype=np.float64)


def suppress_duplicates(
    centers_lps: np.ndarray,
    diameters_mm: np.ndarray,
    scores: np.ndarray,
    *,
    min_distance_mm: float = 3.0,
    radius_factor: float = 1.0,
    extents_mm: np.ndarray | None = None,
) -> np.ndarray:
    """Indices kept, highest score first: a candidate is dropped when its centre lies within
    ``max(min_distance_mm, radius_factor * radius)`` of a higher-scoring kept one (the same nodule seen twice).

    With ``extents_mm`` (N, 3: each candidate's box size along L, P, S, mm; the box centred on its centre, LPS), a
    candidate is also dropped when one box holds both its centre and a higher-scoring kept one's: its own box (a
    wider box around a nodule already kept), or any candidate's (several small candidates on the rim of one large
    nodule, which the wide box covers whole, are one finding, not several)."""
    centers = np.asarray(centers_lps, dtype=np.float64).reshape(-1, 3)
    order = np.argsort(-np.asarray(scores), kind="stable")
    shared: np.ndarray | None = None
    if extents_mm is not None and len(centers):
        half = np.asarray(extents_mm, dtype=np.float64).reshape(-1, 3) / 2.0
        if half.shape != centers.shape:
            raise ValueError(f"extents_mm has shape {half.shape}, the centres {centers.shape}: give one box size per centre")
        inside = np.ones((len(centers), len(centers)), dtype=bool)  # [box, centre]
        for a in range(3):  # axis by axis: far faster than on (N, N, 3) arrays
            inside &= np.abs(centers[None, :, a] - centers[:, None, a]) <= half[:, None, a]
        held = sparse.csr_matrix(inside, dtype=np.int32)  # a box holds a few centres: sparse counts are exact, and fast
        shared = (held.T @ held).toarray() > 0  # centres sharing a box
    # drops[m, n]: candidate n is a duplicate of m, should m be kept (its radius, or a box holding both centres)
    radius = np.maximum(min_distance_mm, radius_factor * np.asarray(diameters_mm, dtype=np.float64).reshape(-1) / 2.0)
    sq = [np.square(centers[:, None, a] - centers[None, :, a]) for a in range(3)]  # [m, n] along L, P and S
    drops = np.sqrt(sq[0] + sq[1] + sq[2]) < radius[:, None]  # the Euclidean distance (mm) summed in that order
    if shared is not None:
        drops |= shared
    dropped = np.zeros(len(centers), dtype=bool)
    kept: list[int] = []
    for n in order:
        if not dropped[n]:
            kept.append(int(n))
            dropped |= drops[n]
    return np.asarray(kept, dtype=int)


def reduce_false_positives(volume: CTVolume, findings: Findings, reducer: FPReducer, region: LungRegion | None) -> Findings:
    """Every candidate of ``findings`` re-scored by ``reducer`` together with small-blob candidates (LPS mm; see
    the module docstring); duplicates of one nodule are merged; highest score first, every candidate reported
    (no threshold applied). The result's ``timings_ms`` gains the wall time (ms) of the blob search, the centre
    refinement and the classifier (cutting the cubes and scoring them): ``fpr_blobs``, ``fpr_refine``,
    ``fpr_classifier`` (the first two also when there is no candidate at all, and so no classifier time)."""
    timings: dict[str, float] = {}
    items, det = candidate_findings(
        volume, findings, region, blobs=reducer.config.blob_candidates, timings_ms=timings, device=reducer.device
    )
    if not items:  # nothing to score: the blob search and the refinement still ran, and took their time
        empty = findings.with_candidates([])
        empty.timings_ms.update(timings)
        return empty
    centers = np.array([f.center_lps for f in items])
    with DeviceTimer(reducer.device) as clock:
        probs = reducer.probabilities(volume, centers)
    timings["fpr_classifier"] = clock.ms
    extents = box_extents(items)
    scores = final_scores(reducer.config, probs, det, centers, extents)
    keep = suppress_duplicates(
        centers,
        np.array([f.diameter_mm for f in items]),
        scores,
        radius_factor=reducer.config.duplicate_radius_factor,
        extents_mm=extents if reducer.config.box_merge else None,
    )
    log.debug("false-positive reduction: %d candidates (%d blobs), %d kept", len(items), int((det < 0).sum()), len(keep))
    out = findings.with_candidates(_sized(items, det, scores, keep))
    out.timings_ms.update(timings)
    return out


def _sized(items: list[Finding], det: np.ndarray, scores: np.ndarray, keep: np.ndarray) -> list[Finding]:
    """The kept candidates with their combined scores. A kept blob whose centre lies inside a larger network box
    that was merged into it, scoring at least :data:`BOX_TRUST` times the blob's score, is reported as that box
    (its centre, extents, diameter and slice; LPS mm) with the blob's score: the blob measures only part of the
    nodule (the solid core of a part-solid nodule, a spot on the rim of a large one), the network's box the whole
    nodule. A box scoring less is the network's poor guess beside a nodule the blob found; the blob stands."""
    merged = np.setdiff1d(np.flatnonzero(det >= 0), keep)  # network boxes dropped as duplicates
    lo = np.array([items[m].box_min_lps for m in merged]).reshape(-1, 3)
    hi = np.array([items[m].box_max_lps for m in merged]).reshape(-1, 3)
    size = np.array([items[m].diameter_mm for m in merged])
    out = []
    for n in keep:
        f = items[n]
        c = np.asarray(f.center_lps)
        covers = np.all(lo <= c, axis=1) & np.all(c <= hi, axis=1) & (size > f.diameter_mm)
        covers &= scores[merged] >= BOX_TRUST * scores[n]  # a box the network hardly believes is not the nodule
        inside = np.flatnonzero(covers) if det[n] < 0 else np.zeros(0, dtype=int)
        if len(inside):
            f = items[merged[inside[int(np.argmax(scores[merged[inside]]))]]]
        out.append(replace(f, score=float(scores[n])))
    return out
