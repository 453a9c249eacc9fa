"""RetinaNet builders (MONAI ``monai.apps.detection``) for the nodule detector, and one timed run of the detector
on a model input (:func:`run_detector`).

Two families, both described by a plain JSON-able dict (see :mod:`.model_config`):

* ``"kind": "monai_resnet_fpn"`` — exactly the network of MONAI's
  ``lung_nodule_ct_detection`` bundle (ResNet-50 3-D backbone, FPN with 256
  channels via :func:`resnet_fpn_feature_extractor`), so the bundle's
  ``models/model.pt`` state dict loads key for key;
* ``"kind": "small_resnet_fpn"`` — the same structure with basic blocks, fewer
  layers and a narrow FPN (``fpn_channels``), for the CPU-trainable demo model.

Network inputs are ``(B, 1, X, Y, Z)`` tensors in RAS orientation (MONAI's convention).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from monai.apps.detection.networks.retinanet_detector import RetinaNetDetector
from monai.apps.detection.networks.retinanet_network import RetinaNet, resnet_fpn_feature_extractor
from monai.apps.detection.utils.anchor_utils import AnchorGeneratorWithAnchorShape
from monai.networks.blocks.backbone_fpn_utils import BackboneWithFPN
from monai.networks.blocks.feature_pyramid_network import LastLevelMaxPool
from monai.networks.nets import resnet

from ..devicetime import DeviceTimer
from ..errors import BundleError

log = logging.getLogger(__name__)

# The architecture of MONAI's lung_nodule_ct_detection bundle (model zoo 0.6.x).
BUNDLE_ARCHITECTURE: dict[str, Any] = {
    "kind": "monai_resnet_fpn",
    "depth": 50,
    "conv1_t_stride": [2, 2, 1],
    "conv1_t_size": [7, 7, 7],
    "returned_layers": [1, 2],
    "num_classes": 1,
    "num_anchors": 3,
    "size_divisible": [16, 16, 8],
}

_RESNETS = {10: resnet.resnet10, 18: resnet.resnet18, 34: resnet.resnet34, 50: resnet.resnet50, 101: resnet.resnet101}


#: what to do about invalid network options of a model JSON (its "network" entry)
_OPTIONS_FIX = "correct the model JSON's 'network' entry, or regenerate the model with scripts/train_detector.py"


def _int3(value: Any, name: str, where: str) -> list[int]:
    if isinstance(value, (int, float)):
        value = [value] * 3
    vals = [int(v) for v in value]
    if len(vals) != 3:
        raise BundleError(
            f"network option {name} must have 3 values (x, y, z), got {value!r}",
            where=where,
            fix=f"give {name} one number or three; {_OPTIONS_FIX}",
        )
    return vals


def build_network(arch: Mapping[str, Any], *, where: str | Path = "build_network(arch=...)") -> RetinaNet:
    """Build the RetinaNet network (untrained) described by ``arch``.

    ``where``: what ``arch`` came from (a model JSON's path), named in errors.
    Raises :class:`BundleError` for an unknown kind or invalid options.
    """
    where = str(where)
    kind = arch.get("kind")
    try:
        stride = _int3(arch.get("conv1_t_stride", [2, 2, 1]), "conv1_t_stride", where)
        size = _int3(arch.get("conv1_t_size", [7, 7, 7]), "conv1_t_size", where)
        returned = [int(v) for v in arch.get("returned_layers", [1, 2])]
        num_classes = int(arch.get("num_classes", 1))
        num_anchors = int(arch.get("num_anchors", 3))
        size_div = _int3(arch.get("size_divisible", [16, 16, 8]), "size_divisible", where)
        if kind == "monai_resnet_fpn":
            depth = int(arch.get("depth", 50))
            if depth not in _RESNETS:
                raise BundleError(
                    f"ResNet depth {depth} is not one of {sorted(_RESNETS)}",
                    where=where,
                    fix=f"set depth to one of {sorted(_RESNETS)} (MONAI's bundle uses 50)",
                )
            backbone = _RESNETS[depth](spatial_dims=3, n_input_channels=1, conv1_t_stride=stride, conv1_t_size=size)
            extractor = resnet_fpn_feature_extractor(backbone, 3, False, returned, None)
        elif kind == "small_resnet_fpn":
            inplanes = [int(v) for v in arch["block_inplanes"]]
            # one kernel size / stride per axis (MONAI annotates these two as ``tuple[int] | int``)
            per_axis: dict[str, Any] = {"conv1_t_size": size, "conv1_t_stride": stride}
            backbone = resnet.ResNet(
                block=str(arch.get("block", "basic")),
                layers=[int(v) for v in arch["layers"]],
                block_inplanes=inplanes,
                spatial_dims=3,
                n_input_channels=1,
                no_max_pool=bool(arch.get("no_max_pool", False)),
                **per_axis,
            )
            if bool(arch.get("no_max_pool", False)):
                # BackboneWithFPN walks the backbone's children, so the flag alone would not skip the pool
                backbone.add_module("maxpool", torch.nn.Identity())
            expansion = 4 if arch.get("block", "basic") == "bottleneck" else 1
            in_list = [inplanes[i - 1] * expansion for i in returned]
            extractor = BackboneWithFPN(
                backbone,
                {f"layer{k}": str(v) for v, k in enumerate(returned)},
                in_list,
                int(arch.get("fpn_channels", 32)),
                extra_blocks=LastLevelMaxPool(3),
                spatial_dims=3,
            )
        else:
            raise BundleError(
                f"network kind {kind!r} is not supported",
                where=where,
                fix="use 'monai_resnet_fpn' (MONAI bundle architecture) or 'small_resnet_fpn'",
            )
    except (KeyError, TypeError, ValueError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise BundleError(f"invalid network options {dict(arch)!r} ({what})", where=where, fix=_OPTIONS_FIX) from exc
    return RetinaNet(
        spatial_dims=3,
        num_classes=num_classes,
        num_anchors=num_anchors,
        feature_extractor=extractor,
        size_divisible=size_div,
        use_list_output=False,
    )


def build_anchor_generator(anchors: Mapping[str, Any]) -> AnchorGeneratorWithAnchorShape:
    """Anchors from ``{"feature_map_scales": [...], "base_anchor_shapes": [[x, y, z], ...]}`` (voxels)."""
    return AnchorGeneratorWithAnchorShape(
        feature_map_scales=[int(v) for v in anchors["feature_map_scales"]],
        base_anchor_shapes=[[float(x) for x in shape] for shape in anchors["base_anchor_shapes"]],
    )


def build_detector(
    network: torch.nn.Module,
    anchors: Mapping[str, Any],
    selector: Mapping[str, Any],
    *,
    sliding_window: Mapping[str, Any] | None = None,
    device: torch.device | str | None = None,
) -> RetinaNetDetector:
    """A MONAI :class:`RetinaNetDetector` around ``network`` with box-selector and sliding-window settings."""
    det = RetinaNetDetector(network=network, anchor_generator=build_anchor_generator(anchors), debug=False)
    det.set_box_selector_parameters(
        score_thresh=float(selector.get("score_thresh", 0.02)),
        topk_candidates_per_level=int(selector.get("topk_candidates_per_level", 1000)),
        nms_thresh=float(selector.get("nms_thresh", 0.22)),
        detections_per_img=int(selector.get("detections_per_img", 300)),
    )
    if sliding_window:
        det.set_sliding_window_inferer(
            roi_size=[int(v) for v in sliding_window["roi_size"]],
            overlap=float(sliding_window.get("overlap", 0.25)),
            sw_batch_size=int(sliding_window.get("sw_batch_size", 1)),
            mode=str(sliding_window.get("mode", "constant")),
            device=device,
        )
    return det


def box_iou_float32(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """Intersection over union ``(N, M)`` of corner boxes ``(N, 2D)`` and ``(M, 2D)`` (MONAI's StandardMode: the
    D lower corners, then the D upper ones; any one unit), computed in float32 and returned in ``boxes1``'s floating
    dtype (float32 otherwise).

    The arithmetic of ``monai.data.box_utils.box_iou``, operation for operation, so that the detector's
    non-maximum suppression keeps the same boxes; without its checks of every call (box validity, NaN or infinite
    areas), which cost more than the IoU itself when the suppression asks once per kept box."""
    a, b = boxes1.to(torch.float32), boxes2.to(torch.float32)
    dims = a.shape[1] // 2

    def area(box: torch.Tensor) -> torch.Tensor:
        out = box[:, dims] - box[:, 0] + 0.0
        for axis in range(1, dims):
            out = out * (box[:, axis + dims] - box[:, axis] + 0.0)
        return out

    lower = torch.max(a[:, None, :dims], b[:, :dims])
    upper = torch.min(a[:, None, dims:], b[:, dims:])
    inter = torch.prod((upper - lower + 0.0).clamp(min=0), dim=-1)
    union = area(a)[:, None] + area(b) - inter
    iou = inter / (union + torch.finfo(torch.float32).eps)
    return iou.to(boxes1.dtype if boxes1.dtype.is_floating_point else torch.float32)


def count_parameters(network: torch.nn.Module) -> int:
    """Number of trainable + frozen parameters."""
    return sum(p.numel() for p in network.parameters())


def min_input_size(size_divisible: Sequence[int]) -> list[int]:
    """The smallest (x, y, z) input in voxels the network accepts (one step of ``size_divisible``)."""
    return [int(v) for v in size_divisible]


def run_detector(
    detector: RetinaNetDetector,
    tensor: torch.Tensor,
    *,
    roi_size: Sequence[int],
    device: torch.device,
    autocast: torch.dtype | None,
    channels_last: bool,
) -> tuple[list[dict[str, torch.Tensor]], float, bool]:
    """``detector``'s output for the model input ``tensor`` (C, X, Y, Z) on ``device``, the model time (ms) and
    whether it ran window by window: the whole input when it fits ``roi_size`` (the patch size), MONAI's sliding-window
    inferer otherwise or when the whole input runs out of GPU memory. Mixed precision with ``autocast`` when set."""
    use_sw = any(int(s) > int(r) for s, r in zip(tensor.shape[1:], roi_size))
    x = tensor[None].to(device, non_blocking=True)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    with DeviceTimer(device) as clock:
        try:
            with torch.inference_mode(), torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
                out = detector(x, use_inferer=use_sw)
        except torch.cuda.OutOfMemoryError:
            if use_sw:
                raise
            # as the bundle's inferer does: a volume too big for the GPU at once goes window by window
            log.warning(
                "whole-volume inference ran out of GPU memory for input %s; retrying with a sliding window",
                tuple(tensor.shape[1:]),
            )
            torch.cuda.empty_cache()
            use_sw = True
            with torch.inference_mode(), torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
                out = detector(x, use_inferer=True)
    return out, clock.ms, use_sw
