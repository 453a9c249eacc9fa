"""The 3-D preview's organ views kept in a run's cache (``<case_id>.render.npz``) are drawn only by the renderer and
palette that made them: a run cache kept across an upgrade showed white bone while the legend said yellow."""

from __future__ import annotations

import numpy as np

from pipeline.reconstruction.mesh import mesh_from_mask
from pipeline.reconstruction.organs import ORGAN_COLORS
from pipeline.reconstruction.preview import preview_views
from pipeline.runner.recon_stages import load_render_inputs, render_inputs_path, save_render_inputs
from pipeline.volume import Geometry
from tests._support.shapes import sphere_mask

SHAPE = (30, 30, 40)
GEOM = Geometry(shape=SHAPE, spacing=(1.0, 1.0, 1.0), origin=(-20.0, -15.0, -15.0))


def _masks() -> dict[str, np.ndarray]:
    return {"lung_right": sphere_mask(SHAPE, (15, 15, 10), 7), "bone": sphere_mask(SHAPE, (15, 15, 30), 7)}


def _views(masks: dict[str, np.ndarray]):
    return preview_views({k: mesh_from_mask(m, GEOM, name=k) for k, m in masks.items()}, size=64)


def _has(img: np.ndarray, colour: str) -> bool:
    """Whether the shaded view shows a surface of ``colour``'s hue (its channels in the same ratios)."""
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)], dtype=float)
    lit = img.astype(float)
    scale = lit.max(axis=-1, keepdims=True) / rgb.max()
    return bool((np.abs(lit - rgb * scale).max(axis=-1)[lit.max(axis=-1) > 60] < 6).any())


def test_views_kept_with_another_palette_are_drawn_again_not_reused(tmp_path, monkeypatch):
    masks = _masks()
    with monkeypatch.context() as m:  # an earlier version: bone drawn white
        m.setitem(ORGAN_COLORS, "bone", "#ffffff")
        old = _views(masks)
        save_render_inputs(tmp_path, "c1", masks, old)
    assert _has(old.images[0], "#ffffff")
    kept = load_render_inputs(tmp_path, "c1", SHAPE, geometry=GEOM)
    assert kept is not None
    got_masks, preview = kept
    assert set(got_masks) == set(masks)
    assert preview is not None, "the stale views are made again from the kept masks"
    assert _has(preview.images[0], ORGAN_COLORS["bone"]) and not _has(preview.images[0], "#ffffff")
    assert preview.drawn == old.drawn


def test_views_kept_without_a_digest_are_not_reused(tmp_path):
    """A file of a version that kept no digest (every file before this one) is stale."""
    masks = _masks()
    save_render_inputs(tmp_path, "c1", masks, _views(masks))
    path = render_inputs_path(tmp_path, "c1")
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if k != "preview_digest"}
        arrays["preview_images"] = np.zeros_like(arrays["preview_images"])  # what must not be drawn again
    np.savez(path, **arrays)
    kept = load_render_inputs(tmp_path, "c1", SHAPE, geometry=GEOM)
    assert kept is not None and kept[1] is not None
    assert kept[1].images[0].any()


def test_views_kept_by_this_version_are_reused(tmp_path):
    masks = _masks()
    views = _views(masks)
    save_render_inputs(tmp_path, "c1", masks, views)
    kept = load_render_inputs(tmp_path, "c1", SHAPE, geometry=GEOM)
    assert kept is not None and kept[1] is not None
    assert all(np.array_equal(a, b) for a, b in zip(kept[1].images, views.images))


def test_views_drawn_again_use_the_runs_configured_smoothing(tmp_path):
    """Stale views are made again with the mesh smoothing the run is configured with, not the default (20)."""
    from pipeline.reconstruction.preview import PREVIEW_TRIANGLES

    masks = _masks()
    save_render_inputs(tmp_path, "c1", masks, _views(masks))
    path = render_inputs_path(tmp_path, "c1")
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if k != "preview_digest"}  # an earlier version's: drawn again
    np.savez(path, **arrays)
    kept = load_render_inputs(tmp_path, "c1", SHAPE, geometry=GEOM, smoothing_iterations=0)
    assert kept is not None and kept[1] is not None

    def views(smoothing: int):
        meshes = {
            k: mesh_from_mask(m, GEOM, name=k, target_triangles=PREVIEW_TRIANGLES, smoothing_iterations=smoothing)
            for k, m in masks.items()
        }
        return preview_views(meshes, size=64)

    raw, smoothed = views(0), views(20)
    assert not np.array_equal(raw.images[0], smoothed.images[0]), "the smoothing shows in the views"
    assert all(np.array_equal(a, b) for a, b in zip(kept[1].images, raw.images))
