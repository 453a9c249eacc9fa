"""What the confounder painters share: a case's layout, grid, options, gravity and random streams.

All positions are patient coordinates (LPS, mm) on the canonical grid
(arrays ``[z, y, x]`` along +S, +P, +L). Gravity ("down", towards the floor
and the table) is a unit vector in the axial plane that follows the patient
position: +P supine, -P prone, -L decubitus right, +L decubitus left.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .confounders import Confounders
from .layout import Layout
from .scanner import CanonicalGrid


@dataclass
class Scene:
    """One confounded case: ``masks`` (canonical bool arrays) and ``truth`` (JSON-able) are filled by the painters."""

    layout: Layout
    grid: CanonicalGrid
    conf: Confounders
    down: np.ndarray  # (x, y) LPS unit vector towards the floor
    rngs: dict[str, np.random.Generator]
    masks: dict[str, np.ndarray] = field(default_factory=dict)
    truth: dict[str, Any] = field(default_factory=dict)
    blood: dict[str, float] = field(default_factory=dict)  # HU of blood pools by name (contrast phase)
    spinal_canal: np.ndarray | None = None  # 2-D (y, x) map of the spinal canal (painted CSF, never bone)

    @property
    def x(self) -> np.ndarray:
        """Voxel x (mm), shape (1, nx)."""
        return self.grid.xs[None, :]

    @property
    def y(self) -> np.ndarray:
        """Voxel y (mm), shape (ny, 1)."""
        return self.grid.ys[:, None]

    def height(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Position along gravity (mm): larger is lower, nearer the table."""
        return np.asarray(x) * self.down[0] + np.asarray(y) * self.down[1]

    def across(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Position across gravity in the axial plane (mm)."""
        return -np.asarray(x) * self.down[1] + np.asarray(y) * self.down[0]

    def add_mask(self, name: str, mask: np.ndarray) -> None:
        """OR ``mask`` into the canonical mask ``name`` (created empty on first use)."""
        if name not in self.masks:
            self.masks[name] = np.zeros(self.grid.shape, dtype=bool)
        self.masks[name] |= mask


def body_outline(layout: Layout, n: int = 720) -> np.ndarray:
    """Points (n, 2) of the trunk's outline (LPS x, y mm): the super-ellipse of :mod:`anatomy`."""
    t = np.linspace(0.0, 2.0 * np.pi, n, endpoint=False)
    p = 2.2
    c, s = np.cos(t), np.sin(t)
    x = layout.body_a * np.sign(c) * np.abs(c) ** (2.0 / p)
    b = np.where(s < 0, layout.body_b_ant, layout.body_b_post)
    y = b * np.sign(s) * np.abs(s) ** (2.0 / p)
    return np.stack([x, y], axis=1)


def trunk_half_width(layout: Layout, y: float) -> float:
    """Half width (mm) of the trunk outline at height ``y`` (LPS mm)."""
    b = layout.body_b_ant if y < 0 else layout.body_b_post
    v = 1.0 - min(abs(y) / b, 1.0) ** 2.2
    return float(layout.body_a * v ** (1.0 / 2.2))
