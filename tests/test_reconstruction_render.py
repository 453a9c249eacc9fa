"""Renderings: radiological display orientation from LPS geometry (any storage order), MIP slabs, 3-D preview."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np
import pytest

from pipeline.reconstruction.mesh import mesh_from_mask
from pipeline.reconstruction.preview_raster import rasterise
from pipeline.reconstruction.render import lps_aligned, render_mip, render_mpr
from pipeline.volume import CTVolume, Geometry
from tests._support.shapes import lps_grids, sphere_mask

DIRECTIONS = {
    "HFS": np.eye(3),
    "FFS": np.diag([-1.0, 1.0, -1.0]),
    "HFDR": np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]),
}


def _marked_volume(direction: np.ndarray) -> tuple[CTVolume, np.ndarray]:
    """Soft tissue with a bright cube at the patient's right, anterior, superior (x<0, y<0, z>0)."""
    n = 40
    sp = np.array([1.0, 1.0, 1.0])
    origin = -(direction * sp[None, :]) @ np.full(3, (n - 1) / 2)
    geom = Geometry(shape=(n, n, n), spacing=tuple(sp), origin=tuple(origin), direction=direction)
    x, y, z = lps_grids(geom)
    cube = (x < -8) & (x > -16) & (y < -8) & (y > -16) & (z > 8) & (z < 16)
    arr = np.full(geom.shape, 40.0, np.float32)
    arr[cube] = 1500.0
    return CTVolume(arr, geom, metadata={"SeriesInstanceUID": "1.2.3.mark"}), cube


@pytest.mark.parametrize("pos", sorted(DIRECTIONS))
def test_lps_aligned_view_puts_the_patient_in_display_order(pos):
    vol, cube = _marked_volume(DIRECTIONS[pos])
    view, spacing, lo = lps_aligned(vol.array, vol.geometry)
    zyx = np.argwhere(view > 1000).mean(axis=0)
    n = view.shape[0]
    assert zyx[2] < n / 2  # x ascending: patient's right (x < 0) at low columns = image left
    assert zyx[1] < n / 2  # y ascending: anterior (y < 0) at low rows = image top (axial)
    assert zyx[0] > n / 2  # z ascending: superior at high index (flipped to the top for coronal/sagittal)
    assert np.allclose(lo, vol.geometry.bounds_lps()[0])


@pytest.mark.parametrize("pos", sorted(DIRECTIONS))
def test_mpr_pngs_show_right_on_image_left_and_superior_on_top(tmp_path, pos):
    vol, cube = _marked_volume(DIRECTIONS[pos])
    centre = vol.geometry.index_to_lps(np.argwhere(cube)[:, ::-1].mean(axis=0))
    paths = render_mpr(vol, {"body": np.ones(vol.shape, bool) & (vol.array > 0)}, tmp_path, stem="m", center_lps=centre)
    assert [p.name for p in paths] == ["m_mpr_axial.png", "m_mpr_coronal.png", "m_mpr_sagittal.png"]
    for p in paths:
        img = mpimg.imread(p)[..., :3]
        h, w, _ = img.shape
        body = img[int(0.08 * h) :]  # below the title
        white = np.argwhere((body > 0.95).all(axis=-1))
        assert white.size, p.name
        row, col = white.mean(axis=0)
        # axial: right (R) on the left, anterior on top; coronal: right on the left, superior on top;
        # sagittal: anterior on the left, superior on top
        assert col < w / 2, p.name
        assert row < body.shape[0] / 2, p.name


@pytest.mark.parametrize("pos", sorted(DIRECTIONS))
def test_mip_slab_pngs_show_right_on_image_left_and_anterior_on_top(tmp_path, pos):
    vol, cube = _marked_volume(DIRECTIONS[pos])
    paths = render_mip(vol, tmp_path, stem="m", lung_mask=cube, n_slabs=2, slab_mm=2.0)
    assert len(paths) == 2 and all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
    for p in paths:  # each slab crosses the cube (right, anterior): axial, so right on the left, anterior on top
        img = mpimg.imread(p)[..., :3]
        h, w, _ = img.shape
        body = img[int(0.08 * h) :]  # below the title
        white = np.argwhere((body > 0.95).all(axis=-1))
        assert white.size, p.name
        row, col = white.mean(axis=0)
        assert col < w / 2 and row < body.shape[0] / 2, (p.name, row, col)


def test_preview_shows_the_left_lung_on_the_image_right():
    geom = Geometry(shape=(40, 40, 60), spacing=(1.0, 1.0, 1.0), origin=(-30.0, -20.0, -20.0))
    left = sphere_mask((40, 40, 60), (20, 20, 45), 9)  # i = 45 → x = +15 mm, the patient's left
    right = sphere_mask((40, 40, 60), (20, 20, 15), 9)
    meshes = {
        "lung_left": mesh_from_mask(left, geom, name="lung_left"),
        "lung_right": mesh_from_mask(right, geom, name="lung_right"),
    }
    img = rasterise(meshes, view="anterior", size=128)
    blue = np.argwhere(img[..., 2] > img[..., 1] + 0.05)  # lung_left is drawn blue, lung_right green
    green = np.argwhere(img[..., 1] > img[..., 2] + 0.05)
    assert blue[:, 1].mean() > 64 > green[:, 1].mean()  # radiological: patient's left on the image right
    covered = (img.sum(axis=-1) > 0).mean()
    assert 0.1 < covered < 0.6  # two closed discs, no holes to the background inside them


def _saved_figures(monkeypatch) -> list:
    """The figures the renderings save from now on, in order (filled as they are saved)."""
    from pipeline.reconstruction import preview, render

    figures: list = []
    save = render.save_png

    def keep(fig, path):
        figures.append(fig)
        return save(fig, path)

    monkeypatch.setattr(render, "save_png", keep)
    monkeypatch.setattr(preview, "save_png", keep)
    return figures


def test_mip_slabs_never_overlap_on_short_lungs(tmp_path, monkeypatch):
    import re

    vol, cube = _marked_volume(np.eye(3))
    lungs = np.zeros(vol.shape, bool)
    lungs[10:20, 10:30, 10:30] = True  # 10 slices of 1 mm: slices 11-20 (k + 1)
    figures = _saved_figures(monkeypatch)
    paths = render_mip(vol, tmp_path, stem="m", lung_mask=lungs, n_slabs=3, slab_mm=4.0)  # slabs of 5 slices: 2 fit
    assert len(paths) == 2
    titles = [f.axes[0].get_title() for f in figures]
    slabs = [tuple(int(n) for n in re.search(r"slice (\d+)-(\d+)", t).groups()) for t in titles]  # type: ignore[union-attr]
    assert slabs == [(11, 15), (16, 20)], f"the slabs {slabs} share slices or leave the lungs"
    one = render_mip(vol, tmp_path / "one", stem="m", lung_mask=cube, n_slabs=3, slab_mm=40.0)
    assert len(one) == 1


def test_mip_slabs_show_lung_not_the_thin_rim_above_the_diaphragm(tmp_path, monkeypatch):
    """On the TotalSegmentator abdomen, whose top holds only the lung bases (12 slices of 3 mm, the lungs' cross-section
    growing from a rim around the diaphragm's dome), the first lung-window MIP slab lay across the rim and showed the
    liver's dome, no lung. The slabs now lie across the planes holding at least a fifth of the lungs' largest
    cross-section: each shows lung."""
    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(32, 80, 80), spacing=(2.0, 2.0, 3.0), origin=(-80.0, -80.0, 300.0))
    k, j, i = np.ogrid[:32, :80, :80]
    radius = np.where(k >= 20, 3 * (k - 19), 0)  # voxels: 3 at k 20 to 36 at k 31, the scan's top
    lungs = (j - 40) ** 2 + (i - 40) ** 2 < radius**2
    vol = CTVolume(np.where(lungs, -850.0, 40.0).astype(np.float32), geom)
    render_mip(vol, tmp_path, stem="b", lung_mask=lungs)
    largest = lungs.sum(axis=(1, 2)).max()
    for fig in figures:
        shown = int((np.asarray(fig.axes[0].images[0].get_array()) < -500).sum())
        assert shown >= 0.2 * largest, (fig.axes[0].get_title(), shown, largest)


def test_bone_outline_stands_out_on_white_bone_and_show_uses_the_same_colours(tmp_path):
    import matplotlib.image as mpimg

    from pipeline.display import organ_colours as shown
    from pipeline.reconstruction.organs import ORGAN_COLORS, OUTLINE_COLORS, organ_colours

    vol, cube = _marked_volume(np.eye(3))  # the bright cube (1500 HU): white in the soft-tissue window
    centre = vol.geometry.index_to_lps(np.argwhere(cube)[:, ::-1].mean(axis=0))
    paths = render_mpr(vol, {"bone": cube}, tmp_path, stem="m", center_lps=centre)
    rgb = mpimg.imread(paths[0])[..., :3]
    yellow = (rgb[..., 0] > 0.9) & (rgb[..., 1] > 0.75) & (rgb[..., 2] < 0.2)
    assert yellow.sum() > 20  # the outline (and the legend's line), not white on white
    assert shown is organ_colours  # show() outlines as the MPRs do, and the preview draws the surfaces alike
    assert organ_colours(["bone"], outline=True) == {"bone": OUTLINE_COLORS["bone"]} == {"bone": ORGAN_COLORS["bone"]}


@pytest.mark.parametrize("pos", ["HFS", "FFS"])
def test_axial_overviews_name_the_source_slices_as_a_viewer_numbers_them(pos):
    """The scanner's InstanceNumbers (here counting down from 500 along k) name the axial planes: the top plane of
    the LPS view (superior) is the slice whose z is highest, whichever way the series runs."""
    from pipeline.reconstruction.render import source_slices

    vol, _ = _marked_volume(DIRECTIONS[pos])
    n = vol.shape[0]
    vol = CTVolume(vol.array, vol.geometry, metadata={**vol.metadata, "InstanceNumbers": [500 - k for k in range(n)]})
    z_of_k = [float(vol.geometry.index_to_lps(np.array([0.0, 0.0, k]))[2]) for k in range(n)]
    top_k = int(np.argmax(z_of_k))
    assert source_slices(vol, n - 1, n - 1) == f"InstanceNumber {500 - top_k}"
    assert source_slices(vol, 0, 4) == (
        "InstanceNumber 496-500" if pos == "HFS" else f"InstanceNumber {500 - (n - 1)}-{500 - (n - 5)}"
    )
    plain = CTVolume(vol.array, vol.geometry, metadata={})
    assert source_slices(plain, 3, 3) == f"slice {int(np.argsort(z_of_k)[3]) + 1}"
    sideways = CTVolume(
        vol.array,
        Geometry(shape=vol.shape, spacing=(1.0, 1.0, 1.0), origin=(0.0, 0.0, 0.0), direction=DIRECTIONS["HFDR"][:, [2, 0, 1]]),
    )
    assert source_slices(sideways, 0, 0) == ""  # slices not along the patient's long axis: no slice to name


def test_titles_letters_and_legends_fit_the_png_whatever_the_image_shape(tmp_path, monkeypatch):
    """A full 500 mm field with InstanceNumbers (the MIP titles ran past both edges of the PNG), a long narrow scan (a
    coronal plane 100 mm wide and 1000 mm high: its title was cut and its legend hid the I) and a short wide one: every
    title, letter and legend lies inside the PNG, the title above the image, the legend clear of the letters."""
    figures = _saved_figures(monkeypatch)
    wide = Geometry(shape=(141, 64, 64), spacing=(7.8, 7.8, 2.0), origin=(-250.0, -164.0, -164.5))
    lungs = np.zeros(wide.shape, bool)
    lungs[20:120, 10:50, 10:50] = True
    numbered = CTVolume(np.full(wide.shape, -800.0, np.float32), wide, metadata={"InstanceNumbers": list(range(141, 0, -1))})
    render_mip(numbered, tmp_path, stem="wide", lung_mask=lungs)
    for shape, spacing in (((400, 20, 20), (5.0, 5.0, 2.5)), ((20, 100, 100), (5.0, 5.0, 2.5))):
        geom = Geometry(shape=shape, spacing=spacing, origin=(0.0, 0.0, 0.0))
        body = np.zeros(shape, bool)
        body[:, 5:-5, 5:-5] = True
        render_mpr(CTVolume(np.where(body, 40.0, -800.0).astype(np.float32), geom), {"body": body}, tmp_path, stem="s")
    assert len(figures) == 3 + 6
    for fig in figures:
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        title = ax.title.get_window_extent(renderer)
        letters = [t.get_window_extent(renderer) for t in ax.texts]
        legend = ax.get_legend()
        boxes = [title, *letters] + ([legend.get_window_extent(renderer)] if legend else [])
        for box in boxes:
            assert fig.bbox.x0 - 0.5 <= box.x0 and box.x1 <= fig.bbox.x1 + 0.5, (ax.get_title(), box)
            assert fig.bbox.y0 - 0.5 <= box.y0 and box.y1 <= fig.bbox.y1 + 0.5, (ax.get_title(), box)
        assert title.y0 >= ax.get_window_extent(renderer).y1 - 0.5, ax.get_title()  # above the image
        if legend:
            assert not any(legend.get_window_extent(renderer).overlaps(b) for b in letters), ax.get_title()


def test_the_legend_hides_no_anatomy(tmp_path, monkeypatch):
    """A chest's coronal plane 500 mm wide and 282 mm high fills the PNG's width: the legend was drawn over the image's
    lower right corner (on the real planning chest, over the left lung's base and costophrenic angle). It lies beside
    the image now, never over it, in all three planes."""
    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(141, 128, 128), spacing=(3.9, 3.9, 2.0), origin=(-250.0, -250.0, -164.5))
    body = np.zeros(geom.shape, bool)
    body[:, 10:-10, 5:-5] = True
    lungs = np.zeros(geom.shape, bool)
    lungs[20:130, 30:90, 20:108] = True
    vol = CTVolume(np.where(body, 40.0, -1000.0).astype(np.float32), geom)
    render_mpr(vol, {"body": body, "lung_left": lungs & (lps_grids(geom)[0] > 0), "lung_right": lungs}, tmp_path, stem="c")
    assert len(figures) == 4  # axial, coronal, a sagittal through each lung
    for fig in figures:
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        legend, image = ax.get_legend(), ax.images[0].get_window_extent(renderer)
        assert legend is not None, ax.get_title()
        box = legend.get_window_extent(renderer)
        assert fig.bbox.x0 - 0.5 <= box.x0 and box.x1 <= fig.bbox.x1 + 0.5 and box.y0 >= fig.bbox.y0 - 0.5, ax.get_title()
        assert not box.overlaps(image), f"{ax.get_title()}: the legend {box} lies over the image {image}"


def test_the_3d_preview_says_which_colour_is_which_organ(tmp_path, monkeypatch):
    """The preview's titles listed the organs (``lung_left, lung_right, airway, bone``) without their colours: a
    reader could not tell the right lung's green from the left lung's blue. A legend under the views names each
    organ shown in its colour, as the MPRs' legends do."""
    from matplotlib.colors import to_hex

    from pipeline.reconstruction.organs import ORGAN_COLORS
    from pipeline.reconstruction.preview import render_preview

    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(40, 40, 60), spacing=(1.0, 1.0, 1.0), origin=(-30.0, -20.0, -20.0))
    meshes = {
        name: mesh_from_mask(sphere_mask((40, 40, 60), (20, 20, i), 9), geom, name=name)
        for name, i in (("lung_left", 45), ("lung_right", 15), ("body", 30))
    }
    render_preview(meshes, tmp_path, stem="p", size=128)
    (fig,) = figures
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    assert len(legends) == 1, "one legend of the organs' colours"
    entries = {t.get_text(): to_hex(h.get_facecolor()) for t, h in zip(legends[0].get_texts(), legends[0].legend_handles)}
    assert entries == {"left lung": ORGAN_COLORS["lung_left"], "right lung": ORGAN_COLORS["lung_right"]}  # no body


def test_a_legend_of_many_organs_wraps_onto_rows_inside_the_png(tmp_path, monkeypatch):
    """A segmentation bundle's dozen organs: their legend is laid out on as many rows as it needs, every entry inside
    the PNG and none over the image, in the MPRs and the 3-D preview."""
    from pipeline.reconstruction.preview import render_preview

    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(60, 64, 64), spacing=(4.0, 4.0, 4.0), origin=(-128.0, -128.0, -120.0))
    names = [f"organ_with_a_long_name_{n}" for n in range(12)]
    masks = {}
    for n, name in enumerate(names):
        m = np.zeros(geom.shape, bool)
        m[10:50, 5 + 4 * n : 8 + 4 * n, 20:44] = True  # crosses the sagittal plane x = 0
        m[10:50, 20:44, 5 + 4 * n : 8 + 4 * n] = True  # and the coronal plane y = 0
        masks[name] = m
    vol = CTVolume(np.full(geom.shape, 40.0, np.float32), geom)
    render_mpr(vol, masks, tmp_path, stem="many", center_lps=np.array([0.0, 0.0, 0.0]))
    meshes = {name: mesh_from_mask(m, geom, name=name) for name, m in list(masks.items())[:8]}
    render_preview(meshes, tmp_path, stem="many", size=256)
    assert len(figures) == 4
    for fig in figures:
        renderer = fig.canvas.get_renderer()
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
        assert len(legends) == 1
        box = legends[0].get_window_extent(renderer)
        assert fig.bbox.x0 - 0.5 <= box.x0 and box.x1 <= fig.bbox.x1 + 0.5, box
        assert fig.bbox.y0 - 0.5 <= box.y0, box
        for ax in fig.axes:
            assert not box.overlaps(ax.images[0].get_window_extent(renderer)), box


def test_organs_without_a_colour_of_their_own_get_distinct_colours(tmp_path, monkeypatch):
    """A segmentation bundle's liver, spleen and kidney were all outlined white, their legend three white lines, and all
    drawn the same grey in the 3-D preview: each organ now has a colour of its own, the same in the MPRs, the preview's
    surfaces and both legends; the lungs keep theirs."""
    from matplotlib.colors import to_hex

    from pipeline.reconstruction.organs import ORGAN_COLORS, OUTLINE_COLORS
    from pipeline.reconstruction.preview import render_preview

    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(40, 40, 60), spacing=(1.0, 1.0, 1.0), origin=(-30.0, -20.0, -20.0))
    names = ["liver", "spleen", "kidney", "lung_left"]
    masks = {name: sphere_mask((40, 40, 60), (20, 20, 8 + 14 * n), 6) for n, name in enumerate(names)}
    vol = CTVolume(np.full(geom.shape, 40.0, np.float32), geom)
    render_mpr(vol, masks, tmp_path, stem="b", center_lps=geom.index_to_lps([[30.0, 20.0, 20.0]])[0])
    render_preview({n: mesh_from_mask(m, geom, name=n) for n, m in masks.items()}, tmp_path, stem="b", size=128)
    axial, preview = figures[0], figures[-1]
    outline = {
        t.get_text(): to_hex(h.get_color())
        for t, h in zip(axial.axes[0].get_legend().get_texts(), axial.axes[0].get_legend().legend_handles)
    }
    surface = {
        t.get_text(): to_hex(h.get_facecolor()) for t, h in zip(preview.legends[0].get_texts(), preview.legends[0].legend_handles)
    }
    assert set(outline) == set(surface) == {"liver", "spleen", "kidney", "left lung"}
    assert len(set(outline.values())) == 4 and len(set(surface.values())) == 4, (outline, surface)
    assert outline["left lung"] == OUTLINE_COLORS["lung_left"] and surface["left lung"] == ORGAN_COLORS["lung_left"]
    assert all(outline[n] == surface[n] for n in ("liver", "spleen", "kidney"))
    img = rasterise({n: mesh_from_mask(m, geom, name=n) for n, m in masks.items()}, view="anterior", size=128)
    drawn = img.reshape(-1, 3)[img.reshape(-1, 3).max(axis=1) > 0.1]
    hues = drawn / drawn.max(axis=1, keepdims=True)  # shading scales a surface's colour, not its hue
    for name, colour in surface.items():
        rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)]) / 255.0
        assert (np.abs(hues - rgb / rgb.max()).max(axis=1) < 0.02).sum() > 20, f"{name} not drawn in {colour}"


def test_mpr_and_mip_pngs_carry_a_scale_bar_of_the_length_they_state(tmp_path, monkeypatch):
    """Nothing on the MPR and MIP PNGs gave their scale: each now has a bar in its lower left corner, labelled with its
    length in mm, that is that long in the image's own millimetres."""
    import re

    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(141, 128, 128), spacing=(3.9, 3.9, 2.0), origin=(-250.0, -250.0, -164.5))
    lungs = np.zeros(geom.shape, bool)
    lungs[20:130, 30:90, 20:108] = True
    vol = CTVolume(np.where(lungs, -850.0, 40.0).astype(np.float32), geom)
    render_mpr(vol, {"lung_left": lungs}, tmp_path, stem="s")
    render_mip(vol, tmp_path, stem="s", lung_mask=lungs)
    assert len(figures) == 6
    for fig in figures:
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.texts if re.fullmatch(r"\d+ mm", t.get_text())]
        assert len(labels) == 1, (ax.get_title(), [t.get_text() for t in ax.texts])
        length = float(labels[0].split()[0])
        bars = [line for line in ax.lines if len(line.get_xdata()) == 2 and line.get_ydata()[0] == line.get_ydata()[1]]
        assert len(bars) == 1, ax.get_title()
        x = bars[0].get_xdata()
        assert abs(x[1] - x[0]) == pytest.approx(length), ax.get_title()  # the image's extent is in mm
        width = ax.get_xlim()[1] - ax.get_xlim()[0]
        assert 0.05 * width <= length <= 0.125 * width, (length, width)  # a corner's worth


def test_the_preview_views_letters_stay_apart(tmp_path, monkeypatch):
    """The anterior view's L and the lateral view's A sat side by side in the middle of the preview, read as one
    label "L A": the two views are now apart, their letters at least a letter's width from each other."""
    from pipeline.reconstruction.preview import render_preview

    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(40, 40, 60), spacing=(1.0, 1.0, 1.0), origin=(-30.0, -20.0, -20.0))
    render_preview(
        {"lung_left": mesh_from_mask(sphere_mask((40, 40, 60), (20, 20, 30), 9), geom, name="lung_left")}, tmp_path, stem="p"
    )
    (fig,) = figures
    renderer = fig.canvas.get_renderer()
    anterior, lateral = fig.axes[0], fig.axes[1]
    left_letter = next(t for t in anterior.texts if t.get_text() == "L").get_window_extent(renderer)
    right_letter = next(t for t in lateral.texts if t.get_text() == "A").get_window_extent(renderer)
    assert right_letter.x0 - left_letter.x1 >= left_letter.width * 2, (left_letter, right_letter)


def test_the_preview_letters_lie_around_the_views_not_on_organs(tmp_path, monkeypatch):
    """On the COPDGene chest's preview the S lay over the trachea, on the TotalSegmentator abdomen's over the top
    vertebra: the surfaces fill each view to its upper and lower edges. Each view's letters now lie in bands around
    it, on no organ."""
    from pipeline.reconstruction.preview import render_preview

    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(60, 60, 60), spacing=(1.0, 1.0, 1.0), origin=(-30.0, -30.0, -30.0))
    cube = np.zeros(geom.shape, bool)
    cube[2:-2, 2:-2, 2:-2] = True  # fills both views edge to edge
    render_preview({"bone": mesh_from_mask(cube, geom, name="bone")}, tmp_path, stem="p")
    (fig,) = figures
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        image = ax.images[0].get_window_extent(renderer)
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            assert not box.overlaps(image), (ax.get_title(), text.get_text(), box, image)
            assert fig.bbox.x0 - 0.5 <= box.x0 and box.x1 <= fig.bbox.x1 + 0.5, (ax.get_title(), text.get_text())


def test_the_preview_and_mpr_texts_name_the_organs_as_the_seg_does(tmp_path, monkeypatch):
    """The preview's titles listed ``lung_left, lung_right, small_bowel`` (the program's names, underscores and all),
    its legend and the MPRs' ``lung left``: every title and legend now says "left lung", "right lung", as the SEG's
    segment labels (Left lung, Right lung) do, and other organs without underscores."""
    from pipeline.reconstruction.preview import render_preview

    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(40, 40, 60), spacing=(1.0, 1.0, 1.0), origin=(-30.0, -20.0, -20.0))
    names = ["lung_left", "lung_right", "small_bowel"]
    masks = {name: sphere_mask((40, 40, 60), (20, 20, 10 + 20 * n), 7) for n, name in enumerate(names)}
    vol = CTVolume(np.full(geom.shape, 40.0, np.float32), geom)
    render_mpr(vol, masks, tmp_path, stem="n", center_lps=geom.index_to_lps([[30.0, 20.0, 20.0]])[0])
    render_preview({n: mesh_from_mask(m, geom, name=n) for n, m in masks.items()}, tmp_path, stem="n", size=128)
    axial, preview = figures[0], figures[-1]
    titles = [" ".join(ax.get_title().split()) for ax in preview.axes]  # as read, wrapped to its view or not
    assert all(t.endswith(": left lung, right lung, small bowel") for t in titles), titles
    legends = [*axial.axes[0].get_legend().get_texts(), *preview.legends[0].get_texts()]
    assert {t.get_text() for t in legends} == {"left lung", "right lung", "small bowel"}


def test_the_scale_bar_and_the_lower_letter_lie_below_the_image_not_on_anatomy(tmp_path, monkeypatch):
    """On the real planning chest's coronal and sagittal overviews the body fills the image to its lower edge: the
    scale bar and its "50 mm" lay over the right flank, the I over the liver. Both now lie in a band below the image."""
    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(141, 128, 128), spacing=(3.9, 3.9, 2.0), origin=(-250.0, -250.0, -164.5))
    vol = CTVolume(np.full(geom.shape, 40.0, np.float32), geom)  # tissue everywhere: any overlay lies on it
    render_mpr(vol, {}, tmp_path, stem="b")
    render_mip(vol, tmp_path, stem="b")
    assert len(figures) == 6
    for fig in figures:
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        image = ax.images[0].get_window_extent(renderer)
        bar = next(line for line in ax.lines if len(line.get_xdata()) == 2).get_window_extent(renderer)
        scale = next(t for t in ax.texts if t.get_text().endswith(" mm")).get_window_extent(renderer)
        lower = next(t for t in ax.texts if tuple(t.get_position()) == (0.5, 0.01)).get_window_extent(renderer)  # I, P
        for what, box in (("bar", bar), ("its length", scale), ("the lower letter", lower)):
            assert box.y1 <= image.y0 + 0.5, (ax.get_title(), what, box, image)
            assert fig.bbox.y0 - 0.5 <= box.y0, (ax.get_title(), what)


def test_show_names_the_organs_as_the_renderings_do():
    """``show()``'s legend said "lung left", where the PNGs and the SEG say "left lung": it now names each organ as the
    renderings do (:func:`~pipeline.reconstruction.organs.organ_label`)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from pipeline.display import show

    geom = Geometry(shape=(20, 40, 60), spacing=(1.0, 1.0, 1.0), origin=(-30.0, -20.0, -10.0))
    names = ["lung_left", "lung_right", "small_bowel"]
    masks = {name: sphere_mask(geom.shape, (10, 20, 10 + 20 * n), 6) for n, name in enumerate(names)}
    vol = CTVolume(np.full(geom.shape, 40.0, np.float32), geom)
    ax = show(vol, recon=masks, k=10, ax=Figure().add_subplot())
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["left lung", "right lung", "small bowel"]


def test_the_upper_letter_lies_in_a_band_above_the_image_not_on_anatomy(tmp_path, monkeypatch):
    """On the real planning chest's coronal and sagittal overviews the S lay over the neck, as the I had lain over the
    liver: the upper orientation letter now lies in a band above the image, below the title, as the lower one lies
    in the band below it."""
    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(141, 128, 128), spacing=(3.9, 3.9, 2.0), origin=(-250.0, -250.0, -164.5))
    vol = CTVolume(np.full(geom.shape, 40.0, np.float32), geom)  # tissue everywhere: any overlay lies on it
    render_mpr(vol, {}, tmp_path, stem="u")
    render_mip(vol, tmp_path, stem="u")
    assert len(figures) == 6
    for fig in figures:
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        image = ax.images[0].get_window_extent(renderer)
        title = ax.title.get_window_extent(renderer)
        letters = [t for t in ax.texts if t.get_text() in ("S", "A")]
        upper = max(letters, key=lambda t: t.get_window_extent(renderer).y1).get_window_extent(renderer)
        assert upper.y0 >= image.y1 - 0.5, (ax.get_title(), upper, image)
        assert upper.y1 <= title.y0 + 0.5, (ax.get_title(), upper, title)


def test_the_side_letters_lie_in_bands_beside_the_image_not_on_anatomy(tmp_path, monkeypatch):
    """On the COPDGene chest's coronal overview the R lay over the right chest wall, and on the TotalSegmentator
    abdomen's the R and the L over both flanks: where the body reaches the image's sides, the side letters covered it.
    They now lie in bands left and right of the image, as the upper and lower letters lie above and below it."""
    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(141, 128, 128), spacing=(3.9, 3.9, 2.0), origin=(-250.0, -250.0, -164.5))
    vol = CTVolume(np.full(geom.shape, 40.0, np.float32), geom)  # tissue everywhere: any overlay lies on it
    render_mpr(vol, {}, tmp_path, stem="s")
    render_mip(vol, tmp_path, stem="s")
    assert len(figures) == 6
    for fig in figures:
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        image = ax.images[0].get_window_extent(renderer)
        letters = [t.get_window_extent(renderer) for t in ax.texts if t.get_text() in ("R", "L", "A", "P")]
        left, right = min(letters, key=lambda b: b.x0), max(letters, key=lambda b: b.x1)
        assert fig.bbox.x0 - 0.5 <= left.x0 and left.x1 <= image.x0 + 0.5, (ax.get_title(), left, image)
        assert image.x1 - 0.5 <= right.x0 and right.x1 <= fig.bbox.x1 + 0.5, (ax.get_title(), right, image)


def test_the_overview_has_one_sagittal_through_each_lung_named_by_side_and_x(tmp_path, monkeypatch):
    """The overview's sagittal went through the plane holding the most lung: one lung shown (the right, the larger),
    the other nowhere on a sagittal. There is now one through the middle of each lung, the right lung's in
    ``<stem>_mpr_sagittal.png``, the left's in ``<stem>_mpr_sagittal_left.png``, each titled with its side and x."""
    import re

    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(60, 80, 120), spacing=(2.0, 2.0, 2.5), origin=(-120.0, -80.0, -75.0))
    right = np.zeros(geom.shape, bool)
    right[10:50, 15:65, 12:52] = True  # x -96..-18 mm: the right lung, larger
    left = np.zeros(geom.shape, bool)
    left[10:50, 15:65, 70:104] = True  # x 20..86 mm
    vol = CTVolume(np.where(right | left, -850.0, 40.0).astype(np.float32), geom)
    paths = render_mpr(vol, {"lung_left": left, "lung_right": right}, tmp_path, stem="s")
    assert [p.name for p in paths] == ["s_mpr_axial.png", "s_mpr_coronal.png", "s_mpr_sagittal.png", "s_mpr_sagittal_left.png"]
    for fig, side, (lo, hi) in ((figures[2], "right", (-62.0, -52.0)), (figures[3], "left", (48.0, 58.0))):
        ax = fig.axes[0]
        found = re.search(r"sagittal through the (\w+) lung at x=(-?[\d.]+) mm \(LPS\)", ax.get_title())
        assert found and found.group(1) == side, ax.get_title()
        assert lo <= float(found.group(2)) <= hi, ax.get_title()  # the lung's middle, not its rim
        assert {t.get_text() for t in ax.get_legend().get_texts()} == {f"{side} lung"}


def test_each_lungs_sagittal_marks_only_that_lungs_nodules(tmp_path, monkeypatch):
    """On the planning chest's sagittal through the right lung, the left lung's nodules #3, #4 and #5 were drawn
    dashed inside the right lung ('#3 (176 mm L)'), as if the right lung held them. With a sagittal through each lung,
    each sagittal marks the nodules off its plane on its own side only: every nodule is still on one of them."""
    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(60, 80, 120), spacing=(2.0, 2.0, 2.5), origin=(-120.0, -80.0, -75.0))
    right = np.zeros(geom.shape, bool)
    right[10:50, 15:65, 12:52] = True  # x -96..-18 mm, its sagittal near x -57
    left = np.zeros(geom.shape, bool)
    left[10:50, 15:65, 70:104] = True  # x 20..86 mm, its sagittal near x 53
    labels = np.zeros(geom.shape, np.uint16)
    labels[28:32, 38:42, 14:18] = 1  # in the right lung, x -92..-86: off its sagittal
    labels[28:32, 38:42, 97:101] = 2  # in the left lung, x 74..80: off its sagittal
    vol = CTVolume(np.where(right | left, -850.0, 40.0).astype(np.float32), geom)
    render_mpr(vol, {"lung_left": left, "lung_right": right}, tmp_path, stem="s", nodules=labels)
    (axial, coronal, on_right, on_left) = (fig.axes[0] for fig in figures)
    marked = {
        ax: {t.get_text().split()[0] for t in ax.texts if t.get_text().startswith("#")}
        for ax in (axial, coronal, on_right, on_left)
    }
    assert marked[on_right] == {"#1"}, on_right.get_title()
    assert marked[on_left] == {"#2"}, on_left.get_title()
    assert marked[axial] == marked[coronal] == {"#1", "#2"}


def test_the_overview_has_lung_window_mprs_beside_the_soft_tissue_ones(tmp_path, monkeypatch):
    """The overview MPRs were in the soft-tissue window only: aerated lung (-850 HU) and a vessel or nodule in it
    (-500 HU here, a ground-glass nodule) were the same black, the lungs' detail lost. ``<stem>_mpr_axial_lung.png``
    and ``<stem>_mpr_coronal_lung.png`` now show the same planes in the lung window; the soft-tissue PNGs stay."""
    from pipeline.reconstruction.render import render_nodule_views

    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(30, 40, 60), spacing=(2.0, 2.0, 2.5), origin=(-60.0, -40.0, -37.5))
    right = np.zeros(geom.shape, bool)
    right[5:25, 8:32, 6:26] = True
    left = np.zeros(geom.shape, bool)
    left[5:25, 8:32, 35:55] = True
    arr = np.where(right | left, -850.0, 40.0).astype(np.float32)
    arr[:, 18:22, 14:18] = -500.0  # a vessel along z in the right lung: cut by the axial and the coronal planes
    vol = CTVolume(arr, geom)
    paths = render_nodule_views(vol, {"lung_left": left, "lung_right": right}, tmp_path, stem="s")
    names = [p.name for p in paths]
    assert names[:4] == ["s_mpr_axial.png", "s_mpr_coronal.png", "s_mpr_sagittal.png", "s_mpr_sagittal_left.png"]
    assert names[4:6] == ["s_mpr_axial_lung.png", "s_mpr_coronal_lung.png"]
    for fig, plane in zip(figures[4:6], ("axial", "coronal")):
        ax = fig.axes[0]
        assert ax.get_title().startswith(plane) and "lung window" in ax.get_title(), ax.get_title()
        image = ax.images[0]
        lung, vessel = image.norm(np.array([-850.0, -500.0]))
        assert 0.0 < lung < vessel < 1.0  # both shown, told apart: neither clipped to black
    for fig in figures[:4]:
        assert "soft-tissue window" in fig.axes[0].get_title()


def test_each_organ_has_one_colour_in_the_mprs_the_preview_and_the_glb(tmp_path, monkeypatch):
    """The 3-D preview drew the bone white while the MPRs outlined it yellow and the skin white: a reader matching the
    preview to the MPRs took the white for the body. Every rendering now takes an organ's colour from one palette:
    the MPRs' outline, the preview's surface and legend, and the GLB's material are the same colour for each organ."""
    from matplotlib.colors import to_hex

    from pipeline.reconstruction.export import organ_rgb
    from pipeline.reconstruction.organs import ORGAN_COLORS
    from pipeline.reconstruction.preview import render_preview

    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(40, 40, 80), spacing=(1.0, 1.0, 1.0), origin=(-40.0, -20.0, -20.0))
    names = ["lung_left", "lung_right", "airway", "bone"]
    masks = {name: sphere_mask((40, 40, 80), (20, 20, 10 + 20 * n), 7) for n, name in enumerate(names)}
    body = np.zeros(geom.shape, bool)
    body[2:38, 2:38, 2:78] = True
    vol = CTVolume(np.full(geom.shape, 40.0, np.float32), geom)
    render_mpr(vol, {"body": body, **masks}, tmp_path, stem="c", center_lps=geom.index_to_lps([[40.0, 20.0, 20.0]])[0])
    render_preview({n: mesh_from_mask(m, geom, name=n) for n, m in masks.items()}, tmp_path, stem="c", size=128)
    axial, preview = figures[0], figures[-1]
    legend = axial.axes[0].get_legend()
    outline = {t.get_text(): to_hex(h.get_color()) for t, h in zip(legend.get_texts(), legend.legend_handles)}
    surface = {
        t.get_text(): to_hex(h.get_facecolor()) for t, h in zip(preview.legends[0].get_texts(), preview.legends[0].legend_handles)
    }
    for name in ("left lung", "right lung", "airway", "bone"):
        assert outline[name] == surface[name], (name, outline[name], surface[name])
    glb = {organ: to_hex(organ_rgb(organ)) for organ in names}
    assert glb == {organ: ORGAN_COLORS[organ] for organ in names}
    assert outline["bone"] != outline["body"] and "#ffffff" not in {surface["bone"], outline["bone"]}  # white: the skin


def test_a_nodules_close_up_titles_fit_the_png(tmp_path, monkeypatch):
    """The close-ups' titles name the nodule's axes ('axial at z=-9.0 mm (LPS), InstanceNumber 63, through nodule #1 ·
    long axis 26.2 mm, short axis 24.5 mm (mean 25.4 mm) on InstanceNumber 63'): on the planning chest the line ran
    past both edges of the PNG, its start and its end cut. A title wider than the PNG now wraps onto more lines, the
    PNG taller by them, every line inside it and above the image."""
    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(60, 128, 128), spacing=(0.977, 0.977, 2.0), origin=(-62.5, -62.5, -60.0))
    vol = CTVolume(np.full(geom.shape, -800.0, np.float32), geom, metadata={"InstanceNumbers": list(range(60, 0, -1))})
    note = ", through nodule #1 · long axis 26.2 mm, short axis 24.5 mm (mean 25.4 mm) on InstanceNumber 63"
    render_mpr(vol, {}, tmp_path, stem="n", center_lps=np.zeros(3), field_mm=100.0, note=note, window="lung")
    assert len(figures) == 3
    for fig in figures:
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        title = ax.title.get_window_extent(renderer)
        assert fig.bbox.x0 - 0.5 <= title.x0 and title.x1 <= fig.bbox.x1 + 0.5, (ax.get_title(), title)
        assert title.y1 <= fig.bbox.y1 + 0.5, (ax.get_title(), title)
        assert title.y0 >= ax.get_window_extent(renderer).y1 - 0.5, ax.get_title()  # above the image and its band
        assert "long axis 26.2 mm" in ax.get_title().replace("\n", " ") and "lung window" in ax.get_title()


def test_each_lungs_sagittal_is_also_drawn_in_the_lung_window(tmp_path, monkeypatch):
    """The sagittals through each lung were drawn in the soft-tissue window only: the lung they are through was all
    black, its vessels and a ground-glass nodule lost, while the axial and coronal overviews had lung-window twins.
    Each lung's sagittal now has one too (``<stem>_mpr_sagittal_lung.png``, ``<stem>_mpr_sagittal_left_lung.png``)."""
    from pipeline.reconstruction.render import render_nodule_views

    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(30, 40, 60), spacing=(2.0, 2.0, 2.5), origin=(-60.0, -40.0, -37.5))
    right = np.zeros(geom.shape, bool)
    right[5:25, 8:32, 6:26] = True
    left = np.zeros(geom.shape, bool)
    left[5:25, 8:32, 35:55] = True
    arr = np.where(right | left, -850.0, 40.0).astype(np.float32)
    vol = CTVolume(arr, geom)
    paths = render_nodule_views(vol, {"lung_left": left, "lung_right": right}, tmp_path, stem="s")
    names = [p.name for p in paths]
    lung = {"s_mpr_sagittal_lung.png": "right", "s_mpr_sagittal_left_lung.png": "left"}
    assert set(lung) <= set(names), names
    for name, side in lung.items():
        ax = figures[names.index(name)].axes[0]
        assert ax.get_title().startswith(f"sagittal through the {side} lung") and "lung window" in ax.get_title()
        assert ax.images[0].norm(-850.0) > 0.0  # the lung shown, not clipped to black


def test_every_mpr_and_mip_title_states_its_window_width_and_level(tmp_path, monkeypatch):
    """The MPR and MIP titles named their window ("lung window") without its width and level: a reader could not
    tell which grey an HU value is drawn in, nor match a PNG to a viewer's preset. Each title now states the width
    and level (HU) of the grey scale its image is drawn in, as the findings' PNGs do (``lung window W1500 L-600``)."""
    from pipeline.reconstruction.render import render_nodule_views

    figures = _saved_figures(monkeypatch)
    geom = Geometry(shape=(30, 40, 60), spacing=(2.0, 2.0, 2.5), origin=(-60.0, -40.0, -37.5))
    right = np.zeros(geom.shape, bool)
    right[5:25, 8:32, 6:26] = True
    left = np.zeros(geom.shape, bool)
    left[5:25, 8:32, 35:55] = True
    vol = CTVolume(np.where(right | left, -850.0, 40.0).astype(np.float32), geom)
    paths = render_nodule_views(vol, {"lung_left": left, "lung_right": right}, tmp_path, stem="s")
    assert any("_mip_" in p.name for p in paths) and any("_mpr_" in p.name for p in paths)
    for path, fig in zip(paths, figures):
        ax = fig.axes[0]
        low, high = ax.images[0].get_clim()
        stated = f"window W{high - low:.0f} L{(low + high) / 2:.0f}"
        assert stated in ax.get_title().replace("\n", " "), (path.name, ax.get_title())
