"""MONAI's own bundle-style detection pipeline, the reference ctpipe is checked and timed against.

It follows the ``lung_nodule_ct_detection`` bundle step for step, with MONAI's
transforms and the model's parameters: ``LoadImage(ITKReader, affine_lps_to_ras=True)``
(or a MetaTensor from :meth:`CTVolume.to_monai`) → ``EnsureChannelFirst`` →
``Orientation(RAS)`` → ``Spacing(pixdim, bilinear, border)`` →
``ScaleIntensityRange`` → ``RetinaNetDetector`` (whole image, or the sliding-window
inferer when the image exceeds the patch size, as the bundle's inferer does) →
``ClipBoxToImage`` → ``AffineBoxToWorldCoordinate(affine_lps_to_ras=True)`` (LPS out).

The ``RetinaNetDetector`` is built by :func:`monai_detector`; build it once and pass it to every
:func:`monai_detect` call (as a bundle's inference script does), so that a timed call covers only the
per-case work.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..volume import CTVolume
from .bundle import LoadedModel
from .model_config import ModelConfig
from .network import build_detector

if TYPE_CHECKING:
    from monai.apps.detection.networks.retinanet_detector import RetinaNetDetector

log = logging.getLogger(__name__)


def monai_preprocess(
    config: ModelConfig, *, volume: CTVolume | None = None, image_path: str | Path | None = None
) -> torch.Tensor:
    """The bundle's preprocessing; returns the MetaTensor ``(1, X, Y, Z)`` with its RAS affine."""
    from monai.data import MetaTensor
    from monai.transforms import Compose, EnsureChannelFirst, LoadImage, Orientation, ScaleIntensityRange, Spacing

    w = config.window
    tail = [
        Orientation(axcodes="RAS", labels=(("L", "R"), ("P", "A"), ("I", "S"))),
        Spacing(pixdim=config.spacing, mode="bilinear", padding_mode="border"),
        ScaleIntensityRange(a_min=w.a_min, a_max=w.a_max, b_min=w.b_min, b_max=w.b_max, clip=w.clip),
    ]
    if image_path is not None:
        chain = Compose([LoadImage(reader="ITKReader", affine_lps_to_ras=True, image_only=True), EnsureChannelFirst(), *tail])
        return chain(str(image_path))
    if volume is None:
        raise ValueError("give volume or image_path")
    arr, affine = volume.to_monai()
    img = MetaTensor(torch.from_numpy(arr.astype(np.float32)), affine=torch.from_numpy(affine))
    return Compose(tail)(img)


def monai_detector(model: LoadedModel, *, device: str | torch.device = "cpu") -> RetinaNetDetector:
    """MONAI's ``RetinaNetDetector`` around ``model``'s network (moved to ``device``) with its box-selector and
    sliding-window settings, in eval mode: the model loaded once, for any number of :func:`monai_detect` calls."""
    cfg = model.config
    dev = torch.device(device)
    det = build_detector(model.network.to(dev), cfg.anchors, cfg.selector, sliding_window=cfg.sliding_window, device=dev)
    det.eval()
    return det


def monai_detect(
    model: LoadedModel,
    *,
    volume: CTVolume | None = None,
    image_path: str | Path | None = None,
    device: str | torch.device = "cpu",
    amp: bool = False,
    detector: RetinaNetDetector | None = None,
) -> dict[str, np.ndarray]:
    """Run the bundle-style pipeline; returns ``{"center_lps", "box_min_lps", "box_max_lps", "score"}`` arrays.

    ``detector``: the one :func:`monai_detector` built for ``model`` on ``device``; ``None`` builds it for this call.
    """
    from monai.apps.detection.transforms.dictionary import AffineBoxToWorldCoordinated, ClipBoxToImaged

    cfg = model.config
    dev = torch.device(device)
    image = monai_preprocess(cfg, volume=volume, image_path=image_path)
    det = detector if detector is not None else monai_detector(model, device=dev)
    use_sw = any(int(s) > int(r) for s, r in zip(image.shape[1:], cfg.roi_size))
    with torch.no_grad(), torch.autocast(dev.type, enabled=amp and dev.type == "cuda"):
        out = det([image.to(dev)], use_inferer=use_sw)[0]
    data: dict[Hashable, Any] = {
        "image": image,
        "box": out["boxes"].float().cpu(),
        "label": out["labels"].cpu(),
        "score": out["labels_scores"].float().cpu(),
    }
    clipped = ClipBoxToImaged(box_keys="box", label_keys=["label", "score"], box_ref_image_keys="image", remove_empty=True)(data)
    data = AffineBoxToWorldCoordinated(box_keys="box", box_ref_image_keys="image", affine_lps_to_ras=True)(clipped)
    boxes = np.asarray(data["box"], dtype=np.float64).reshape(-1, 6)
    return {
        "center_lps": (boxes[:, :3] + boxes[:, 3:]) / 2.0,
        "box_min_lps": boxes[:, :3],
        "box_max_lps": boxes[:, 3:],
        "score": np.asarray(data["score"], dtype=np.float64).reshape(-1),
    }
