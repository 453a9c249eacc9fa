"""Optional organ segmentation with a user-supplied MONAI segmentation bundle (no downloads).

Bundle layout (as users download it): ``configs/metadata.json`` (its
``network_data_format.outputs.pred.channel_def`` names the output channels),
``configs/inference.json`` (pre-processing and inferer settings are read from
it by :class:`pipeline.bundle.BundleConfig`: ``Spacing(d).pixdim``,
``ScaleIntensityRange(d)``, ``SlidingWindowInferer``)
and ``models/model.ts`` (TorchScript). The volume is put in RAS orientation (as
MONAI's ``Orientation(axcodes="RAS")`` does), resampled, scaled, run with
sliding-window inference (Gaussian-blended tiles, as MONAI's ``SlidingWindowInferer(mode="gaussian")``), and the arg-max labels are mapped back to the input
grid (LPS geometry unchanged) and to organ names.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..bundle import INFERENCE_JSON, METADATA_JSON, BundleConfig, SlidingWindow, model_file, read_metadata
from ..errors import BundleError, ReconstructionError
from ..intensity import HUWindow
from ..volume import CTVolume

log = logging.getLogger(__name__)

# organ names ctpipe knows, with the spellings bundles use for them
SYNONYMS = {
    "lung_left": ("lung_left", "left_lung", "lung_l", "left_lungs"),
    "lung_right": ("lung_right", "right_lung", "lung_r"),
    "airway": ("airway", "airways", "trachea", "trachea_and_bronchi", "bronchi"),
    "bone": ("bone", "bones", "skeleton"),
    "body": ("body", "body_outline", "skin"),
}
OTHER_ORGANS = (
    "heart",
    "aorta",
    "esophagus",
    "liver",
    "spleen",
    "stomach",
    "pancreas",
    "kidney_left",
    "kidney_right",
    "gallbladder",
    "vertebrae",
    "ribs",
    "sternum",
    "pulmonary_artery",
    "vessels",
    "lungs",
    "lung",
)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_")


def organ_name(label: str) -> str | None:
    """ctpipe's organ name for a bundle label, or None when the label is unknown."""
    n = _norm(label)
    for organ, names in SYNONYMS.items():
        if n in names:
            return organ
    return n if n in OTHER_ORGANS else None


@dataclass(frozen=True)
class SegBundle:
    """What ctpipe runs of a segmentation bundle.

    root: the bundle folder; model: its TorchScript ``models/model.ts``; labels: output
    channel → label name (``channel_def``); spacing: ``Spacingd.pixdim`` in mm along RAS
    x, y, z (None: the volume's own spacing); window: ``ScaleIntensityRanged`` (None: HU as
    they are); sliding: the ``SlidingWindowInferer`` settings.
    """

    root: Path
    model: Path
    labels: dict[int, str]
    spacing: tuple[float, float, float] | None
    window: HUWindow | None
    sliding: SlidingWindow


def read_bundle(path: str | Path) -> SegBundle:
    """Check a bundle folder and read its label names, pre-processing and inferer settings.

    ``configs/inference.json`` is read with MONAI's ``ConfigParser`` (:class:`pipeline.bundle.BundleConfig`);
    without one the volume is used at its own spacing and in HU, with 96³ patches. Raises :class:`BundleError`
    for a path that does not exist, is not a folder, or is a folder without the bundle's files.
    """
    root = Path(path)
    if not root.exists():
        raise BundleError(
            "no such segmentation bundle folder",
            where=root,
            fix="check the path; a bundle is the folder holding configs/metadata.json and models/model.ts",
        )
    if not root.is_dir():
        raise BundleError(
            "is a file, not a segmentation bundle folder",
            where=root,
            fix="pass the bundle's root folder (the one holding configs/ and models/)",
        )
    meta = read_metadata(root)
    meta_path = root / METADATA_JSON
    try:
        channel_def = meta["network_data_format"]["outputs"]["pred"]["channel_def"]
        labels = {int(k): str(v) for k, v in channel_def.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BundleError(
            "metadata.json has no network_data_format.outputs.pred.channel_def (label names)",
            where=meta_path,
            fix='add channel_def, e.g. {"0": "background", "1": "lung_left"}',
        ) from exc
    model = model_file(root, "model.ts", fix="export the network with `python -m monai.bundle ckpt_export` to models/model.ts")
    spacing, window, sliding = None, None, None
    if (root / INFERENCE_JSON).is_file():
        config = BundleConfig.read(root, evaluate=True)
        spacing, window, sliding = config.spacing(), config.hu_window(), config.sliding_window_inferer()
    return SegBundle(
        root=root,
        model=model,
        labels=labels,
        spacing=spacing,
        window=window,
        sliding=sliding or SlidingWindow(roi_size=(96, 96, 96), overlap=0.25, sw_batch_size=1),
    )


def _to_ras(array: np.ndarray, volume: CTVolume) -> tuple[np.ndarray, np.ndarray]:
    """Array ``[R, A, S]`` (ascending R, A, S) and spacing (mm) for the volume's voxels."""
    g = volume.geometry
    view = g.to_lps_view(array)  # [z, y, x] ascending LPS
    ras = np.flip(view.transpose(2, 1, 0), axis=(0, 1))  # x→R (flip), y→A (flip), z→S
    return np.ascontiguousarray(ras), np.asarray(g.spacing_lps())


def _from_ras(ras: np.ndarray, volume: CTVolume) -> np.ndarray:
    """Inverse of :func:`_to_ras`: back to the volume's own ``[k, j, i]`` order."""
    view = np.flip(ras, axis=(0, 1)).transpose(2, 1, 0)  # [z, y, x] ascending LPS
    return np.ascontiguousarray(volume.geometry.from_lps_view(view))


def _starts(n: int, roi: int, step: int) -> list[int]:
    if n <= roi:
        return [0]
    out = list(range(0, n - roi, step)) + [n - roi]
    return sorted(set(out))


def sliding_window(x: torch.Tensor, roi: list[int], predictor: Any, *, overlap: float = 0.25, batch: int = 1) -> torch.Tensor:
    """Tile ``x`` (1, C, X, Y, Z) into ``roi`` windows overlapping by ``overlap``, run ``predictor`` on batches
    of windows and blend the outputs with Gaussian weights (σ = roi / 8). Inputs smaller than the roi are
    zero-padded. Returns (1, K, X, Y, Z)."""
    size = list(x.shape[2:])
    pad = [max(0, r - n) for r, n in zip(roi, size)]
    if any(pad):
        x = F.pad(x, (0, pad[2], 0, pad[1], 0, pad[0]))
    full = list(x.shape[2:])
    steps = [max(1, int(r * (1 - overlap))) for r in roi]
    grids = [_starts(n, r, st) for n, r, st in zip(full, roi, steps)]
    axes = [torch.exp(-0.5 * ((torch.arange(r, device=x.device) - (r - 1) / 2) / (r / 8.0)) ** 2) for r in roi]
    weight = (axes[0][:, None, None] * axes[1][None, :, None] * axes[2][None, None, :]).clamp_min(1e-3)
    corners = [(a, b, c) for a in grids[0] for b in grids[1] for c in grids[2]]
    out: torch.Tensor | None = None
    norm = torch.zeros(full, device=x.device)
    for n0 in range(0, len(corners), batch):
        chunk = corners[n0 : n0 + batch]
        tiles = torch.cat([x[:, :, a : a + roi[0], b : b + roi[1], c : c + roi[2]] for a, b, c in chunk])
        pred = predictor(tiles)
        if out is None:
            out = torch.zeros([1, pred.shape[1]] + full, device=x.device)
        for t, (a, b, c) in enumerate(chunk):
            out[0, :, a : a + roi[0], b : b + roi[1], c : c + roi[2]] += pred[t] * weight
            norm[a : a + roi[0], b : b + roi[1], c : c + roi[2]] += weight
    assert out is not None
    out = out / norm
    return out[:, :, : size[0], : size[1], : size[2]]


def run_seg_bundle(
    volume: CTVolume, bundle: str | Path | SegBundle, *, device: torch.device | str = "cpu"
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Organ masks (bool ``[k, j, i]`` on the volume grid) from a bundle (its folder, or what :func:`read_bundle`
    read of it), and per-label error messages.

    Raises :class:`BundleError` when the bundle cannot be used at all (not a bundle, its network fails to load or
    to run on the volume).
    """
    b = bundle if isinstance(bundle, SegBundle) else read_bundle(bundle)
    dev = torch.device(device)
    try:
        net = torch.jit.load(str(b.model), map_location=dev).eval()
    except (RuntimeError, ValueError) as exc:
        raise BundleError(f"cannot load models/model.ts ({exc})", where=b.model) from exc
    ras, spacing = _to_ras(np.asarray(volume.array, dtype=np.float32), volume)
    x = torch.from_numpy(ras)[None, None].to(dev)
    native = tuple(ras.shape)
    if b.spacing:
        size = [max(1, int(round(n * s / p))) for n, s, p in zip(native, spacing, b.spacing)]
        x = F.interpolate(x, size=size, mode="trilinear", align_corners=False)
    if b.window:
        a0, a_range, b0, b_range = b.window.scale_params()
        x = (x - a0) / a_range * b_range + b0
        if b.window.clip:
            x = x.clamp(min(b.window.output_range), max(b.window.output_range))
    try:
        with torch.no_grad():
            logits = sliding_window(x, list(b.sliding.roi_size), net, overlap=b.sliding.overlap, batch=b.sliding.sw_batch_size)
    except (RuntimeError, torch.jit.Error) as exc:  # an error raised in TorchScript, a shape it refuses, out of memory
        last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]  # TorchScript puts its traceback first
        raise BundleError(
            f"the network of models/model.ts failed on the volume ({last[:300]})",
            where=b.model,
            fix="check that the bundle is a segmentation bundle for CT volumes (its roi_size and channels)",
        ) from exc
    pred = torch.argmax(logits, dim=1, keepdim=True).to(torch.float32)
    if tuple(pred.shape[2:]) != native:
        pred = F.interpolate(pred, size=native, mode="nearest")
    label_ras = pred[0, 0].to(torch.int64).cpu().numpy()
    labels = _from_ras(label_ras, volume)
    masks: dict[str, np.ndarray] = {}
    errors: dict[str, str] = {}
    where = str(b.root / METADATA_JSON)
    for value in np.unique(labels):
        value = int(value)
        if value == 0:
            continue
        name = b.labels.get(value)
        if name is None:
            errors[f"seg_bundle:label_{value}"] = str(
                ReconstructionError(
                    f"the network outputs label {value}, which channel_def does not name",
                    where=where,
                    fix="add the label's name to network_data_format.outputs.pred.channel_def",
                )
            )
            continue
        organ = organ_name(name)
        if organ is None:
            errors[f"seg_bundle:label_{value}"] = str(
                ReconstructionError(
                    f"label {value} {name!r} is not an organ name ctpipe knows",
                    where=where,
                    fix=f"rename it in channel_def to one of {sorted(SYNONYMS) + sorted(OTHER_ORGANS)}",
                )
            )
            continue
        masks[organ] = masks.get(organ, np.zeros(labels.shape, dtype=bool)) | (labels == value)
    log.info("bundle %s: organs %s, %d label errors", b.root, sorted(masks), len(errors))
    return masks, errors
