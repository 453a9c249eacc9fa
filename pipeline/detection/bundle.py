"""Load detector models: a MONAI bundle directory, or ctpipe's own model JSON (the demo model).

A bundle is read the way hospitals receive one from MONAI's model zoo::

    BUNDLE/configs/inference.json   network_def, anchor_generator, detector_ops, preprocessing
    BUNDLE/models/model.pt          state dict of the network (or {"model": state_dict})
    BUNDLE/models/model.ts          TorchScript network (used when model.pt is absent)

Everything inference needs — network definition, spacing, intensity window,
sliding-window patch size and overlap, anchors and box-selector parameters — is
read from the bundle's own config with MONAI's :class:`ConfigParser`, so any
compatible bundle runs without code changes.
"""

from __future__ import annotations

import ast
import logging
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import BundleError, ModelError, WeightsMismatchError
from .model_config import DEMO_MODEL_JSON, ModelConfig, load_model_config
from .network import build_network
from .preprocess import Window

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A network in eval mode with its inference settings."""

    config: ModelConfig
    network: torch.nn.Module


def _read_state_dict(path: Path) -> Mapping[str, torch.Tensor]:
    if not path.is_file():
        raise ModelError("weights file does not exist", where=path, fix="reinstall ctpipe or pass a bundle with models/model.pt")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError, TypeError, AttributeError, pickle.UnpicklingError) as exc:  # torch raises several kinds
        raise ModelError(
            f"weights file is not a readable torch state dict ({type(exc).__name__}: {str(exc)[:200]})",
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
        raise BundleError("model config names no weights file", where=path)
    net = build_network(cfg.arch or {})
    load_weights(net, cfg.weights)
    return LoadedModel(cfg, net.eval())


# --- MONAI bundles ------------------------------------------------------------------------
_CALL = re.compile(r"\.(set_box_selector_parameters|set_sliding_window_inferer)\((.*)\)\s*$")


def _call_kwargs(text: str, parser: Any) -> tuple[str, dict[str, Any]] | None:
    """``$@detector.set_xxx(a=1, b=@ref)`` → ("set_xxx", {...}) with @references resolved."""
    m = _CALL.search(text)
    if not m:
        return None
    args = m.group(2)
    refs = {}

    def sub(mo: re.Match) -> str:
        name = f"__ref{len(refs)}"
        refs[name] = parser.get_parsed_content(mo.group(1))
        return name

    args = re.sub(r"@([A-Za-z0-9_#]+)", sub, args)
    call = ast.parse(f"f({args})", mode="eval").body
    out = {}
    for kw in call.keywords:  # type: ignore[attr-defined]
        node = kw.value
        out[kw.arg] = refs[node.id] if isinstance(node, ast.Name) and node.id in refs else ast.literal_eval(node)
    return m.group(1), out


def _find_transform(parser: Any, names: tuple[str, ...]) -> tuple[str, dict[str, Any]] | None:
    for key in ("preprocessing", "test_transforms", "val_transforms", "preprocessing_transforms"):
        if key not in parser.config:
            continue
        transforms = parser.config[key].get("transforms", []) if isinstance(parser.config[key], Mapping) else []
        for n, tr in enumerate(transforms):
            if isinstance(tr, Mapping) and str(tr.get("_target_", "")).split(".")[-1] in names and tr.get("_disabled_") is not True:
                return f"{key}#transforms#{n}", dict(tr)
    return None


def _value(parser: Any, base: str, tr: Mapping[str, Any], key: str, default: Any = None) -> Any:
    if key not in tr:
        return default
    return parser.get_parsed_content(f"{base}#{key}")


def load_bundle(path: str | Path) -> LoadedModel:
    """Load a MONAI detection bundle directory (see the module docstring).

    Raises :class:`BundleError` for a missing/incompatible config and
    :class:`WeightsMismatchError` (listing keys) for weights that do not fit.
    """
    from monai.bundle import ConfigParser

    root = Path(path)
    cfg_path = root / "configs" / "inference.json"
    if not cfg_path.is_file():
        raise BundleError("bundle has no configs/inference.json", where=root, fix="pass the bundle's top folder (the one holding configs/ and models/)")
    parser = ConfigParser()
    try:
        parser.read_config(str(cfg_path))
    except (ValueError, OSError) as exc:
        raise BundleError(f"config is not readable JSON ({exc})", where=cfg_path) from exc
    parser["bundle_root"] = str(root)
    for key in ("network_def", "anchor_generator"):
        if key not in parser.config:
            raise BundleError(f"config has no {key!r}; this is not a RetinaNet detection bundle", where=cfg_path,
                              fix="use a bundle like MONAI's lung_nodule_ct_detection")
    spacing_tr = _find_transform(parser, ("Spacingd", "Spacing"))
    window_tr = _find_transform(parser, ("ScaleIntensityRanged", "ScaleIntensityRange"))
    orient_tr = _find_transform(parser, ("Orientationd", "Orientation"))
    if spacing_tr is None or window_tr is None:
        raise BundleError("preprocessing has no Spacingd and ScaleIntensityRanged transforms", where=cfg_path,
                          fix="ctpipe needs the bundle's spacing and intensity window in its preprocessing")
    try:
        if orient_tr is not None and str(_value(parser, orient_tr[0], orient_tr[1], "axcodes", "RAS")).upper() != "RAS":
            raise BundleError("preprocessing orients to something other than RAS", where=cfg_path)
        pixdim = [float(v) for v in _value(parser, spacing_tr[0], spacing_tr[1], "pixdim")]
        wb, wt = window_tr
        window = Window(
            float(_value(parser, wb, wt, "a_min")), float(_value(parser, wb, wt, "a_max")),
            float(_value(parser, wb, wt, "b_min", 0.0)), float(_value(parser, wb, wt, "b_max", 1.0)),
            bool(_value(parser, wb, wt, "clip", False)),
        )
        anchor_raw = parser.config["anchor_generator"]
        anchors = {
            "feature_map_scales": [int(v) for v in parser.get_parsed_content("anchor_generator#feature_map_scales")],
            "base_anchor_shapes": [[float(x) for x in s] for s in parser.get_parsed_content("anchor_generator#base_anchor_shapes")],
        }
        if "AnchorGeneratorWithAnchorShape" not in str(anchor_raw.get("_target_", "")):
            raise BundleError(f"anchor generator {anchor_raw.get('_target_')!r} is not AnchorGeneratorWithAnchorShape", where=cfg_path)
        selector: dict[str, Any] = {}
        sliding: dict[str, Any] = {}
        for op in parser.config.get("detector_ops", []):
            parsed = _call_kwargs(str(op), parser)
            if parsed and parsed[0] == "set_box_selector_parameters":
                selector.update(parsed[1])
            elif parsed and parsed[0] == "set_sliding_window_inferer":
                sliding.update(parsed[1])
        if "roi_size" not in sliding:
            patch = parser.config.get("infer_patch_size")
            if patch is None:
                raise BundleError("config sets no sliding-window roi_size nor infer_patch_size", where=cfg_path)
            sliding["roi_size"] = parser.get_parsed_content("infer_patch_size")
        sliding = {"roi_size": [int(v) for v in sliding["roi_size"]], "overlap": float(sliding.get("overlap", 0.25)),
                   "mode": str(sliding.get("mode", "constant"))}
        size_div = parser.get_parsed_content("size_divisible") if "size_divisible" in parser.config else [16, 16, 8]
        size_div = [int(v) for v in (size_div if isinstance(size_div, (list, tuple)) else [size_div] * 3)]
    except BundleError:
        raise
    except (KeyError, TypeError, ValueError, SyntaxError, AttributeError, NameError) as exc:
        raise BundleError(f"config value cannot be read ({type(exc).__name__}: {exc})", where=cfg_path,
                          fix="check the bundle's inference.json against MONAI's lung_nodule_ct_detection") from exc
    pt, ts = root / "models" / "model.pt", root / "models" / "model.ts"
    if pt.is_file():
        try:
            network = parser.get_parsed_content("network_def", instantiate=True)
        except Exception as exc:  # noqa: BLE001 - ConfigParser wraps any constructor error in a bare Exception/RuntimeError
            raise BundleError(f"network_def cannot be built ({type(exc).__name__}: {str(exc)[:300]})", where=cfg_path,
                              fix="the bundle needs a MONAI RetinaNet network_def this MONAI version provides") from exc
        if not isinstance(network, torch.nn.Module):
            raise BundleError(f"network_def built a {type(network).__name__}, not a torch module", where=cfg_path)
        load_weights(network, pt)
        weights = pt
    elif ts.is_file():
        try:
            network = torch.jit.load(str(ts), map_location="cpu")
        except (RuntimeError, ValueError, OSError) as exc:
            raise ModelError(f"TorchScript model cannot be loaded ({str(exc)[:200]})", where=ts, fix="copy the bundle again") from exc
        weights = ts
    else:
        raise BundleError("bundle has neither models/model.pt nor models/model.ts", where=root / "models",
                          fix="copy the bundle's models folder too")
    name = root.name
    meta = root / "configs" / "metadata.json"
    if meta.is_file():
        import json

        try:
            name = f"{name} {json.loads(meta.read_text()).get('version', '')}".strip()
        except (OSError, ValueError):
            log.warning("%s: unreadable metadata.json, using the folder name", meta)
    config = ModelConfig(
        name=name,
        spacing=(pixdim[0], pixdim[1], pixdim[2]),
        window=window,
        arch=None,
        anchors=anchors,
        selector=selector,
        sliding_window=sliding,
        size_divisible=(size_div[0], size_div[1], size_div[2]),
        weights=weights,
        source="monai_bundle",
    )
    log.info("loaded bundle %s: spacing %s, window %s, roi %s", root, pixdim, window, sliding["roi_size"])
    return LoadedModel(config, network.eval())
