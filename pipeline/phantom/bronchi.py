"""Segmental and subsegmental bronchi beside the lung arteries: the bronchovascular bundles (LPS mm, HU).

In a real lung every pulmonary artery branch runs beside the bronchus of its segment, of about its calibre
(the bronchoarterial ratio of healthy lungs is about 0.65-1.0), from the hilum out to the subsegmental
level. Within a few centimetres of the mediastinum an axial slice cuts them as clusters of soft-tissue
profiles with air rings beside them: lobar and segmental bronchi with arteries of their calibre, branching.
The lobar bronchi of :func:`.vessels.airway_tubes` stop after three generations and the artery trees of
:func:`.vessels.vessel_trees` run alone, so a phantom without these bundles shows a hilum of bare vessels, and
a classifier trained on such phantoms has never seen the real hilum's pattern as a negative.

:func:`bronchus_tubes` lays one bronchus beside every artery branch of at least :data:`MIN_ARTERY_RADIUS_MM`,
touching it (their walls share the adventitia). The bronchus keeps to one side of its artery, chosen at random
per tree: its axis is offset from the artery's towards a fixed direction made perpendicular to each branch,
and a branch starts where its parent ended, so the bronchial tree is continuous through the bifurcations.
:func:`.tubepaint.paint_tubes` paints their walls (soft tissue) and lumens (air) inside the lung only, leaving
vessels alone.
"""

from __future__ import annotations

import numpy as np

from .tubes import Tubes
from .vessels import _units

#: Artery branches thinner than this (radius, mm) have no visible bronchus beside them.
MIN_ARTERY_RADIUS_MM = 1.0
#: Lumen radius over the artery's radius, drawn per tree (the bronchoarterial ratio of healthy lungs).
LUMEN_RATIO = (0.6, 0.9)
#: Wall thickness over the lumen's radius, and its least value (mm).
WALL_RATIO = 0.45
MIN_WALL_MM = 0.4


def _wall(lumen_radius: float) -> float:
    """Wall thickness (mm) of a bronchus of ``lumen_radius`` mm."""
    return max(MIN_WALL_MM, WALL_RATIO * lumen_radius)


def _side_of(axis: np.ndarray, towards: np.ndarray) -> np.ndarray:
    """``towards`` made perpendicular to ``axis`` (unit; any perpendicular when they are parallel)."""
    v = towards - (towards @ axis) * axis
    if np.linalg.norm(v) < 1e-6:
        v = np.cross(axis, np.array([1.0, 0.0, 0.0]) if abs(axis[0]) < 0.9 else np.array([0.0, 1.0, 0.0]))
    return _units(v)


def bronchus_tubes(arteries: Tubes, tree: list[int], rng: np.random.Generator) -> tuple[Tubes, Tubes]:
    """The bronchi beside ``arteries`` (LPS mm): (outer surfaces, lumens), tube for tube.

    ``tree`` gives each artery branch's tree (any integer label); branches must come after their parents, as
    :func:`.vessels.grow_forest` lists them. Only branches of at least :data:`MIN_ARTERY_RADIUS_MM` get one.
    """
    outer, lumen = Tubes(), Tubes()
    trees = sorted(set(tree))
    towards = {t: _units(rng.normal(size=3)) for t in trees}
    ratio = {t: float(rng.uniform(*LUMEN_RATIO)) for t in trees}
    at_node: dict[tuple[float, ...], tuple[np.ndarray, float]] = {}  # a branch's end: (bronchus axis point, lumen radius)
    for a, b, ra, rb, t in zip(arteries.a, arteries.b, arteries.ra, arteries.rb, tree):
        if ra < MIN_ARTERY_RADIUS_MM:
            continue
        axis = _units(b - a)
        side = _side_of(axis, towards[t])
        r0, r1 = ratio[t] * ra, ratio[t] * rb
        start = at_node.get(tuple(np.round(a, 6)))
        if start is None:
            start = (a + side * (ra + _wall(r0) + r0), r0)
        end = b + side * (rb + _wall(r1) + r1)
        at_node.setdefault(tuple(np.round(b, 6)), (end, r1))
        p0, q0 = start
        outer.add(p0, end, q0 + _wall(q0), r1 + _wall(r1))
        lumen.add(p0, end, q0, r1)
    return outer, lumen
