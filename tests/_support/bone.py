"""Bone segmentation of a synthetic HU array, as the reconstruction runs it, for the bone tests."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.reconstruction import bone as bone_mod
from pipeline.reconstruction.grid import Grid
from pipeline.reconstruction.organs import SegmentParams
from pipeline.volume import CTVolume, Geometry


def segment_bone_of(hu: np.ndarray, body: np.ndarray | None = None, *, spacing: tuple[float, float, float]) -> np.ndarray:
    """The bone mask (bool ``[k, j, i]``) of ``hu`` on a grid of ``spacing`` (i, j, k mm) at the origin, on the CPU at
    full resolution, within ``body`` (bool ``[k, j, i]``; default: everywhere)."""
    geom = Geometry(shape=hu.shape, spacing=spacing, origin=(0.0, 0.0, 0.0))
    grid = Grid(CTVolume(hu, geom), torch.device("cpu"), (1, 1, 1))
    inside = torch.ones(hu.shape, dtype=torch.bool) if body is None else torch.from_numpy(body)
    return bone_mod.segment_bone(grid, inside, grid.hu, SegmentParams())
