"""The false-positive reduction classifier: its networks, its settings and how it turns patches into logits.

:class:`PatchClassifier` is a small 3-D CNN scoring candidate patches (``(N, C, P, P, P)``, one channel per grid
spacing) as nodule or not; :class:`PatchEnsemble` averages the logits of several trained apart. The model JSON's
``fp_reduction`` entry (:class:`FPReductionConfig`) describes the network (:func:`build_classifier`) and how
candidates are scored with it; :func:`patch_logits` averages a patch's logits over mirrored views
(:data:`FLIP_VIEWS`); :func:`fold_batch_norm` gives the loaded network's scoring copy, each batch normalisation folded
into the convolution before it. :mod:`.fp_reduction` cuts the patches and scores the candidates.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from ..errors import BundleError
from ..volume import int3
from .model_values import FORMS, of_form, value_error

#: Flipped copies averaged for ``flip_views`` views, as dims of an (N, C, S, P, L) tensor: the patch itself, then
#: each axis (S, P, L) mirrored, then (8 views) every other combination.
FLIP_VIEWS: dict[int, tuple[tuple[int, ...], ...]] = {
    1: ((),),
    4: ((), (2,), (3,), (4,)),
    8: ((), (2,), (3,), (4,), (2, 3), (2, 4), (3, 4), (2, 3, 4)),
}


class PatchClassifier(nn.Module):
    """Input (N, in_channels, P, P, P) patches in 0..1 (P divisible by 8); output (N,) logits."""

    def __init__(
        self, patch: int = 24, channels: tuple[int, int, int] = (8, 16, 32), hidden: int = 64, in_channels: int = 1
    ) -> None:
        super().__init__()
        c1, c2, c3 = channels

        def block(cin: int, cout: int, n: int) -> list[nn.Module]:
            layers: list[nn.Module] = []
            for m in range(n):
                layers += [
                    nn.Conv3d(cin if m == 0 else cout, cout, 3, padding=1, bias=False),
                    nn.BatchNorm3d(cout),
                    nn.ReLU(inplace=True),
                ]
            return [*layers, nn.MaxPool3d(2)]

        self.features = nn.Sequential(*block(in_channels, c1, 1), *block(c1, c2, 2), *block(c2, c3, 2))
        side = patch // 8
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(c3 * side**3, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x)).squeeze(1)


class PatchEnsemble(nn.Module):
    """Several :class:`PatchClassifier` of one architecture, trained apart (other random seeds); output the mean of
    their (N,) logits. Classifiers trained on phantoms alone disagree on anatomy unlike the phantoms' (one calls a
    real vessel crossing a nodule, another does not); the mean asks them to agree."""

    def __init__(self, members: list[PatchClassifier]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one classifier")
        self.members = nn.ModuleList(members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x) for m in self.members]).mean(dim=0)


@dataclass(frozen=True)
class FPReductionConfig:
    """The ``fp_reduction`` entry of a model JSON (sizes in mm, patch in voxels)."""

    weights: Path
    patch: int = 24
    spacing_mm: float = 1.0
    channels: tuple[int, int, int] = (8, 16, 32)
    hidden: int = 64
    blob_candidates: int = 200
    detector_weight: float = 0.5
    duplicate_radius_factor: float = 1.0
    context_spacing_mm: float | None = None
    flip_views: int = 1
    flip_min_probability: float = 0.02
    box_merge: bool = False
    blob_support: bool = False
    members: int = 1

    @property
    def spacings_mm(self) -> tuple[float, ...]:
        """Grid spacing (mm) of each input channel: the patch, then the wider context cube if any."""
        return (self.spacing_mm,) if self.context_spacing_mm is None else (self.spacing_mm, self.context_spacing_mm)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, weights_dir: Path, source: str | Path | None = None) -> FPReductionConfig:
        """Validate the entry; ``weights`` is a file name in ``weights_dir`` (the model JSON's folder). A value not of
        its key's form (:data:`~pipeline.detection.model_values.FORMS`, as the model JSON's loading checks it) is a
        :class:`~pipeline.errors.BundleError` naming the model JSON ``source`` (default: the one in ``weights_dir``),
        the key path (``fp_reduction.patch``), the value, the form with an example, and where to get a good entry."""
        where = str(source) if source is not None else f"the model JSON in {weights_dir}"
        file = Path(source).name if source is not None else "the model JSON"

        def fix(what: str) -> str:
            return f"mend {what}, or write the entry again with scripts/train_fp_reducer.py"

        if not isinstance(data, Mapping):
            raise value_error("fp_reduction", data, "a JSON object", '{"weights": "fpr.pt"}', where=where, file=file, fix=fix)
        if "weights" not in data:
            raise BundleError(
                "the entry names no weights file (the classifier's state dict)",
                where=f"{where}: fp_reduction.weights",
                fix=fix(f'fp_reduction.weights in {file}: a file name, e.g. "fpr.pt"'),
            )
        for key in (k for k in FORMS if k.startswith("fp_reduction.")):  # as the model JSON's loading checks them
            name = key.partition(".")[2]
            if name in data and not of_form(key, data[name])[0]:
                raise value_error(key, data[name], *FORMS[key][1:], where=where, file=file, fix=fix)
        return cls(
            weights=weights_dir / str(data["weights"]),
            patch=int(data.get("patch", 24)),
            spacing_mm=float(data.get("spacing_mm", 1.0)),
            channels=int3(data.get("channels", (8, 16, 32))),
            hidden=int(data.get("hidden", 64)),
            blob_candidates=int(data.get("blob_candidates", 200)),
            detector_weight=float(data.get("detector_weight", 0.5)),
            duplicate_radius_factor=float(data.get("duplicate_radius_factor", 1.0)),
            context_spacing_mm=None if data.get("context_spacing_mm") is None else float(data["context_spacing_mm"]),
            flip_views=int(data.get("flip_views", 1)),
            flip_min_probability=float(data.get("flip_min_probability", 0.02)),
            box_merge=bool(data.get("box_merge", False)),
            blob_support=bool(data.get("blob_support", False)),
            members=int(data.get("members", 1)),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "weights": self.weights.name,
            "patch": self.patch,
            "spacing_mm": self.spacing_mm,
            "channels": list(self.channels),
            "hidden": self.hidden,
            "blob_candidates": self.blob_candidates,
            "detector_weight": self.detector_weight,
            "duplicate_radius_factor": self.duplicate_radius_factor,
            "context_spacing_mm": self.context_spacing_mm,
            "flip_views": self.flip_views,
            "flip_min_probability": self.flip_min_probability,
            "box_merge": self.box_merge,
            "blob_support": self.blob_support,
            "members": self.members,
        }


def build_classifier(config: FPReductionConfig) -> nn.Module:
    """The untrained network ``config`` describes: one :class:`PatchClassifier`, or a :class:`PatchEnsemble` of
    ``config.members`` of them (the weights file holds the ensemble's state dict)."""

    def one() -> PatchClassifier:
        return PatchClassifier(config.patch, config.channels, config.hidden, in_channels=len(config.spacings_mm))

    return one() if config.members == 1 else PatchEnsemble([one() for _ in range(config.members)])


def fold_batch_norm(network: nn.Module) -> nn.Module:
    """An evaluation copy of ``network`` (a :class:`PatchClassifier` or :class:`PatchEnsemble`, in eval mode) with
    each ``BatchNorm3d`` that follows a ``Conv3d`` folded into that convolution's weights and bias (the running
    statistics' scale and shift applied to them once) and replaced by an identity: the same logits up to float32
    rounding (about 1e-5), about a sixth less time on a CPU. Each ``ReLU`` right before a ``MaxPool3d`` is moved
    after it (the maximum of rectified values is the rectified maximum: exactly the same values, on an eighth of
    the voxels). ``network`` itself is left as it is (its state dict still loads and saves the trained layers)."""
    if network.training:
        raise ValueError(
            "fold_batch_norm needs a network in eval mode (call .eval() first): training-mode batch norm uses the batch's statistics"
        )
    folded = copy.deepcopy(network)
    for seq in folded.modules():
        if isinstance(seq, nn.Sequential):
            for n in range(len(seq) - 1):
                conv, norm = seq[n], seq[n + 1]
                if isinstance(conv, nn.Conv3d) and isinstance(norm, nn.BatchNorm3d):
                    seq[n] = fuse_conv_bn_eval(conv, norm)
                    seq[n + 1] = nn.Identity()
            for n in range(len(seq) - 1):
                relu, pool = seq[n], seq[n + 1]
                if isinstance(relu, nn.ReLU) and isinstance(pool, nn.MaxPool3d):
                    seq[n], seq[n + 1] = pool, relu
    return folded.eval()


def patch_logits(
    network: nn.Module, x: torch.Tensor, *, views: int = 1, min_probability: float = 0.02, batch: int | None = None
) -> torch.Tensor:
    """Float32 logits (N,) of ``network`` for patches ``x`` (N, C, S, P, L). With ``views`` > 1 (a key of
    :data:`FLIP_VIEWS`), patches whose unflipped probability is at least ``min_probability`` get the mean logit
    of their ``views`` flipped copies; the rest, clear negatives, keep the unflipped logit.

    ``batch``: the network sees at most this many patches at a time, the flipped copies of several patches together
    (``None``: all of ``x`` at once, each flip apart). The same logits up to float32 rounding; on a CPU, batches of
    a few dozen patches keep a layer's activations in the processor's caches and run faster than hundreds at once."""
    if batch is not None and batch < 1:
        raise ValueError(f"patch_logits: batch {batch} must be at least 1 patch (or None: all at once)")
    logits = _in_batches(network, x, batch)
    if views == 1:
        return logits
    again = torch.sigmoid(logits) >= min_probability
    if not bool(again.any()):
        return logits
    xs = x[again]
    flips = FLIP_VIEWS[views][1:]
    if batch is None:
        mirrored = torch.stack([network(torch.flip(xs, dims)).float() for dims in flips])
    else:  # the flipped copies of ``per`` patches fill one batch
        per = max(1, batch // len(flips))
        mirrored = torch.cat(
            [
                network(torch.cat([torch.flip(xs[a : a + per], dims) for dims in flips])).float().view(len(flips), -1)
                for a in range(0, len(xs), per)
            ],
            dim=1,
        )
    total = logits[again]
    for view in mirrored:  # (views - 1, n): added view by view, in the order of FLIP_VIEWS
        total = total + view
    out = logits.clone()
    out[again] = total / views
    return out


def _in_batches(network: nn.Module, x: torch.Tensor, batch: int | None) -> torch.Tensor:
    """Float32 ``network(x)`` (N,), ``batch`` patches at a time (``None``: all at once)."""
    if batch is None or len(x) <= batch:
        return network(x).float()
    return torch.cat([network(x[a : a + batch]).float() for a in range(0, len(x), batch)])
