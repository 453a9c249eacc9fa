"""Load detector models: a MONAI bundle directory, or ctpipe's own model JSON (the demo model).

A bundle is read the way hospitals receive one from MONAI's model zoo::

    BUNDLE/configs/inference.json   network_def, anchor_generator, detector_ops, preprocessing
    BUNDLE/models/model.pt          state dict of the network (or {"model": state_dict})
    BUNDLE/models/model.ts          TorchScript network (used when model.pt is absent)

Everything inference needs — network definition, spacing, intensity window,
sliding-window patch size and overlap, anchors and box-selector parameters — is
read from the bundle's own config by :class:`pipeline.bundle.BundleConfig` with
MONAI's ``ConfigParser``, so any compatible bundle runs without code changes.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from ..bundle import METADATA_JSON, BundleConfig, model_file, read_metadata
from ..errors import BundleError, ModelError, WeightsMismatchError
from .model_config import DEMO_MODEL_JSON, ModelConfig, load_model_config
from .network import build_network

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A network in eval mode with its inference settings."""

    config: ModelConfig
    network: torch.nn.Module


def _load_reason(exc: BaseException) -> str:
    """Why ``torch.load`` failed, in a few words: its own text advises ``weights_only=False`` (unsafe on a file of
    unknown origin) for a file that is not a checkpoint at all, and runs on over many lines for a truncated one."""
    if isinstance(exc, pickle.UnpicklingError):
        return "UnpicklingError: not a torch checkpoint, or one holding more than tensors"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if "central directory" in text or isinstance(exc, EOFError):
        return f"{type(exc).__name__}: the file ends early (truncated)"
    first = text.split(". ")[0].rstrip(".")
    return f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__


def _read_state_dict(path: Path) -> Mapping[str, torch.Tensor]:
    if not path.is_file():
        raise ModelError("weights file does not exist", where=path, fix="reinstall ctpipe or pass a bundle with models/model.pt")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (
        RuntimeError,
        EOFError,
        OSError,
        ValueError,
        TypeError,
        AttributeError,
        pickle.UnpicklingError,
    ) as exc:  # torch raises several kinds
        raise ModelError(
            f"weights file is not a readable torch state dict ({_load_reason(exc)})",
            where=path,
            fix="the file is corrupt or truncated; download or copy it again",
        ) from exc
    if isinstance(state, Mapping) and "model" in state and isinstance(state["model"], Mapping):
        state = state["model"]
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelError("weights file does not hold a state dict of tensors", where=path)
    return state


def load_weights(network: torch.nn.Module, path: Path) -> None:
    """Load a state dict into ``network``; :class:`WeightsMismatchError` lists every key that does not fit."""
    state = _read_state_dict(path)
    own = network.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(
        f"{k}: file {tuple(state[k].shape)} vs network {tuple(own[k].shape)}"
        for k in set(own) & set(state)
        if tuple(state[k].shape) != tuple(own[k].shape)
    )
    if missing or unexpected or shapes:

        def show(items: list[str]) -> str:
            return ", ".join(items[:12]) + (f" ... (+{len(items) - 12} more)" if len(items) > 12 else "")

        parts = []
        if missing:
            parts.append(f"{len(missing)} missing key(s): {show(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s): {show(unexpected)}")
        if shapes:
            parts.append(f"{len(shapes)} mis-shaped key(s): {show(shapes)}")
        raise WeightsMismatchError(
            "weights do not fit the network: " + "; ".join(parts),
            where=path,
            fix="use the weights that belong to this network definition (same bundle / model JSON)",
        )
    network.load_state_dict(state, strict=True)


def load_model(bundle: str | Path | None = None) -> LoadedModel:
    """The demo model (``bundle=None``), a MONAI bundle directory, or a ctpipe model JSON file."""
    if bundle is None:
        return load_ctpipe_model(DEMO_MODEL_JSON)
    path = Path(bundle)
    if path.is_file() and path.suffix == ".json":
        return load_ctpipe_model(path)
    return load_bundle(path)


def load_ctpipe_model(path: str | Path) -> LoadedModel:
    """Load a ctpipe model JSON and the weights named in it."""
    cfg = load_model_config(path)
    if cfg.weights is None:
        raise BundleError(
            "model config names no weights file",
            where=path,
            fix='add a "weights" entry naming the state dict (.pt) beside the JSON, or regenerate it with '
            "scripts/train_detector.py",
        )
    net = build_network(cfg.arch or {}, where=path)
    load_weights(net, cfg.weights)
    return LoadedModel(cfg, net.eval())


# --- MONAI bundles ------------------------------------------------------------------------
_NETWORK_FIX = "the bundle needs a MONAI RetinaNet network_def this MONAI version provides"


def load_bundle(path: str | Path) -> LoadedModel:
    """Load a MONAI detection bundle directory (see the module docstring).

    Raises :class:`BundleError` for a missing/incompatible config and
    :class:`WeightsMismatchError` (listing keys) for weights that do not fit.
    """
    root = Path(path)
    bundle = BundleConfig.read(root, evaluate=True)
    for key in ("network_def", "anchor_generator"):
        if key not in bundle:
            raise BundleError(
                f"config has no {key!r}; this is not a RetinaNet detection bundle",
                where=bundle.where,
                fix="use a bundle like MONAI's lung_nodule_ct_detection",
            )
    spacing, window = bundle.spacing(), bundle.hu_window()
    if spacing is None or window is None:
        raise BundleError(
            "preprocessing has no Spacingd and ScaleIntensityRanged transforms",
            where=bundle.where,
            fix="ctpipe needs the bundle's spacing and intensity window in its preprocessing",
        )
    bundle.require_ras()
    anchors = bundle.anchors()
    selector = bundle.box_selector()
    sw = bundle.detector_sliding_window()
    sliding = {"roi_size": list(sw.roi_size), "overlap": sw.overlap, "mode": sw.mode}
    size_div = bundle.size_divisible() or (16, 16, 8)
    weights = model_file(root, "model.pt", "model.ts")
    network: torch.nn.Module
    if weights.suffix == ".pt":
        built = bundle.instantiate("network_def", fix=_NETWORK_FIX)
        if not isinstance(built, torch.nn.Module):
            raise BundleError(
                f"network_def built a {type(built).__name__}, not a torch module", where=bundle.where, fix=_NETWORK_FIX
            )
        load_weights(built, weights)
        network = built
    else:
        try:
            network = torch.jit.load(str(weights), map_location="cpu")
        except (RuntimeError, ValueError, OSError) as exc:
            raise ModelError(
                f"TorchScript model cannot be loaded ({str(exc)[:200]})", where=weights, fix="copy the bundle again"
            ) from exc
    name = root.name
    if (root / METADATA_JSON).is_file():
        try:
            name = f"{name} {read_metadata(root).get('version', '')}".strip()
        except BundleError as exc:
            log.warning("%s; using the folder name", exc)
    config = ModelConfig(
        name=name,
        spacing=spacing,
        window=window,
        arch=None,
        anchors=anchors,
        selector=selector,
        sliding_window=sliding,
        size_divisible=size_div,
        weights=weights,
        source="monai_bundle",
    )
    log.info("loaded bundle %s: spacing %s, window %s, roi %s", root, spacing, window, sliding["roi_size"])
    return LoadedModel(config, network.eval())
