"""Synthetic nodules pasted into the false-positive classifier's negative patches (``scripts/train_fp_reducer.py``
``--pasted-nodules``).

A pasted positive is a negative patch (a vessel, a bifurcation, the pleura, a sub-voxel vessel by the chest wall) with
a nodule drawn into it, so that the same surroundings are seen with and without a nodule in one batch. The nodules
are drawn as the phantoms draw theirs (:func:`pipeline.phantom.nodules.random_nodule_spec`,
:func:`pipeline.phantom.nodules.nodule_signed_distance`: gently lobulated, solid, part-solid or ground glass), with
the phantoms' slice profile and in-plane blur, on each channel's grid (cubes along L, P, S, stored ``[S, P, L]``,
centred on the candidate; offsets in mm). The drawing replaces the smooth part of the tissue under the nodule and keeps
the patch's own noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

from pipeline.detection.patches import HU_WINDOW
from pipeline.phantom.nodules import KIND_P, NoduleSpec, nodule_signed_distance, random_nodule_spec

FINE_MM = 0.4  # grid on which each nodule is drawn before it is blurred and sampled onto the channels' grids
KIND_CODE = {"solid": 0, "part_solid": 1, "ground_glass": 2}


class NoduleBank:
    """``size`` nodules drawn once onto the channels' grids (``patch`` voxels of ``spacings_mm``): per nodule and
    channel the blurred share of the nodule (``alpha``) and of its solid core (``core``), uint8 0..255, with its kind,
    HU and diameter (mm). Diameters are log-uniform in ``diameters_mm``; centres lie within ``offset`` radii of the
    patch centre, as a candidate that hits a nodule does."""

    def __init__(
        self,
        *,
        size: int,
        patch: int,
        spacings_mm: Sequence[float],
        seed: int,
        diameters_mm: tuple[float, float] = (3.0, 10.0),
        offset: float = 0.5,
    ) -> None:
        rng = np.random.default_rng(seed)
        shape = (size, len(spacings_mm), patch, patch, patch)
        self.alpha = np.zeros(shape, np.uint8)
        self.core = np.zeros(shape, np.uint8)
        self.kind = np.zeros(size, np.int8)
        self.value = np.zeros(size, np.float32)
        self.core_value = np.zeros(size, np.float32)
        self.diameter = np.zeros(size, np.float32)
        kinds = list(KIND_P)
        lo, hi = math.log(diameters_mm[0]), math.log(diameters_mm[1])
        for n in range(size):
            radius = math.exp(rng.uniform(lo, hi)) / 2.0
            v = rng.normal(size=3)
            centre = v / np.linalg.norm(v) * rng.uniform(0.0, offset * radius)
            kind = kinds[int(rng.choice(len(kinds), p=list(KIND_P.values())))]
            spec = random_nodule_spec(rng, centre, radius, kind, None)
            thickness = rng.uniform(1.0, 2.5)
            sigma = (math.sqrt(thickness**2 / 12.0 + 0.09), *(2 * [rng.uniform(0.45, 0.75)]))  # mm along S, P, L
            for c, spacing in enumerate(spacings_mm):
                self.alpha[n, c] = _drawn(spec, 1.0, sigma, patch, spacing)
                if kind == "part_solid":
                    self.core[n, c] = _drawn(spec, spec.core_frac, sigma, patch, spacing)
            self.kind[n] = KIND_CODE[kind]
            self.value[n] = spec.value
            self.core_value[n] = spec.core_value
            self.diameter[n] = 2.0 * radius

    def __len__(self) -> int:
        return len(self.kind)


def _drawn(spec: NoduleSpec, scale: float, sigma_mm: tuple[float, float, float], patch: int, spacing: float) -> np.ndarray:
    """The nodule's (or its core's, ``scale`` < 1) share of each voxel of a ``patch``-cube of ``spacing`` mm centred
    on 0, blurred by ``sigma_mm`` (S, P, L), uint8 0..255."""
    half = spec.radius * scale * 1.3 + 3.0 * max(sigma_mm) + FINE_MM
    ax = np.arange(-half, half + FINE_MM / 2, FINE_MM)
    # box centred on the nodule (LPS offsets from the patch centre)
    xs, ys, zs = (spec.center[a] + ax for a in range(3))
    sd = nodule_signed_distance(xs, ys, zs, spec, scale=scale)  # [S, P, L]
    share = np.clip(0.5 - sd / FINE_MM, 0.0, 1.0)
    share = ndimage.gaussian_filter(share, [s / FINE_MM for s in sigma_mm], mode="constant", truncate=3.0)
    grid = (np.arange(patch) - (patch - 1) / 2.0) * spacing
    # fine-grid index of each channel voxel, per axis (S, P, L)
    idx = [(grid - (spec.center[a] - half)) / FINE_MM for a in (2, 1, 0)]
    kk, jj, ii = np.meshgrid(*idx, indexing="ij")
    out = ndimage.map_coordinates(share, [kk.ravel(), jj.ravel(), ii.ravel()], order=1, mode="constant", cval=0.0)
    return np.round(np.clip(out, 0.0, 1.0) * 255).reshape(patch, patch, patch).astype(np.uint8)


def paste(
    x: torch.Tensor, bank: NoduleBank, picks: np.ndarray, gen: torch.Generator, *, max_vessel_share: float = 0.5
) -> tuple[torch.Tensor, torch.Tensor]:
    """Patches ``x`` (N, C, S, P, L; 0..1, the windowed HU) with nodule ``picks[n]`` of ``bank`` drawn into each.

    Solid nodules and the cores of part-solid ones replace the smooth part of the tissue with their HU; ground glass
    raises it to at least its own (vessels stay visible through it). A nodule whose body (the 1 mm channel, share
    over one half) lies for more than ``max_vessel_share`` in tissue brighter than -300 HU would not be seen (inside a
    vessel or the chest wall): the second tensor is False for those, True for the rest."""
    lo, hi = HU_WINDOW
    hu = x * (hi - lo) + lo
    smooth = F.avg_pool3d(hu, 3, stride=1, padding=1, count_include_pad=False)
    a = torch.from_numpy(bank.alpha[picks].astype(np.float32) / 255.0)
    core = torch.from_numpy(bank.core[picks].astype(np.float32) / 255.0)
    kind = torch.from_numpy(bank.kind[picks]).view(-1, 1, 1, 1, 1)
    value = torch.from_numpy(bank.value[picks]).view(-1, 1, 1, 1, 1)
    core_value = torch.from_numpy(bank.core_value[picks]).view(-1, 1, 1, 1, 1)
    texture = F.avg_pool3d(torch.randn(x.shape, generator=gen), 3, stride=1, padding=1) * 60.0
    solid = hu + a * (value - smooth)
    glass = hu + a * torch.relu(value + texture - smooth)
    out = torch.where(kind == 0, solid, glass)
    out = out + core * (core_value - torch.maximum(smooth, value))
    body = a[:, 0] > 0.5
    dense = (smooth[:, 0] > -300.0) & body
    share = dense.flatten(1).sum(1) / body.flatten(1).sum(1).clamp(min=1)
    visible = (share <= max_vessel_share) & body.flatten(1).any(1)
    return ((out.clamp(lo, hi) - lo) / (hi - lo)), visible
