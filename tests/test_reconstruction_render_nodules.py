"""The renderings show the segmented nodules: outlined where the overview MPRs cross them, in MPRs of their own through
each, and over the organs in the 3-D preview (the lungs' opaque surfaces would hide them)."""

from __future__ import annotations

import itertools

import matplotlib.image as mpimg
import numpy as np
import pytest

from pipeline.reconstruction.mesh import mesh_from_mask
from pipeline.reconstruction.nodules import segment_findings
from pipeline.reconstruction.render import render_all
from pipeline.volume import CTVolume, Geometry
from tests._support.shapes import lps_grids

CENTRE = np.array([-20.0, 5.0, 10.0])  # LPS mm, in the right lung (x < 0)


def _lung_with_a_nodule(tilt_deg: float = 0.0) -> tuple[CTVolume, np.ndarray]:
    """Soft tissue (40 HU) holding a right lung (-850 HU) with a 10 mm solid nodule (40 HU) at ``CENTRE``; images
    tilted ``tilt_deg`` from axial (columns from P towards S) as an oblique acquisition's."""
    n, sp = 64, 1.0
    a = np.radians(tilt_deg)
    direction = np.array([[1.0, 0.0, 0.0], [0.0, np.cos(a), -np.sin(a)], [0.0, np.sin(a), np.cos(a)]])
    origin = -direction @ np.array([32.0, 32.0, 26.0])  # (-32, -32, -26) mm for axial images
    geom = Geometry(shape=(48, n, n), spacing=(sp, sp, 1.5), origin=tuple(origin), direction=direction)
    x, y, z = lps_grids(geom)
    lung = ((x + 16.0) / 14.0) ** 2 + (y / 22.0) ** 2 + (z / 30.0) ** 2 <= 1.0
    arr = np.full(geom.shape, 40.0, np.float32)
    arr[lung] = -850.0
    arr[(x - CENTRE[0]) ** 2 + (y - CENTRE[1]) ** 2 + (z - CENTRE[2]) ** 2 <= 5.0**2] = 40.0
    return CTVolume(arr, geom, metadata={"SeriesInstanceUID": "1.2.3.nod"}), lung


def _magenta(path) -> np.ndarray:
    """Pixels (row, col) in the ``nodules`` colour (#ff3df5)."""
    img = mpimg.imread(path)[..., :3]
    return np.argwhere((img[..., 0] > 0.9) & (img[..., 1] < 0.45) & (img[..., 2] > 0.85))


def test_the_nodules_are_outlined_in_their_own_mprs_and_drawn_in_the_preview(tmp_path):
    vol, lung = _lung_with_a_nodule()
    findings = [{"center_lps": CENTRE.tolist(), "diameter_mm": 12.0}, {"center_lps": [500.0, 0.0, 0.0], "diameter_mm": 5}]
    nodules = segment_findings(vol, findings, lung_mask=lung)
    assert nodules[0].error is None and nodules[1].error is not None
    meshes = {"lung_right": mesh_from_mask(lung, vol.geometry, name="lung_right")}
    paths = render_all(vol, {"lung_right": lung}, meshes, tmp_path, stem="c", nodules=nodules)
    names = {p.name: p for p in paths}
    own = [f"c_nodule_01_mpr_{plane}.png" for plane in ("axial", "coronal", "sagittal")]
    assert all(name in names for name in own), sorted(names)
    assert not any("nodule_02" in name for name in names)  # the finding that was not segmented has none
    for name in own:
        assert len(_magenta(names[name])) > 20, name  # the nodule's outline (and its #1) in each plane through it
    assert len(_magenta(names["c_preview3d.png"])) > 50  # over the lung's surface, not hidden inside it
    # the overview MPRs go through the lungs' centre, here below the nodule: it is marked there, not outlined
    assert len(_magenta(names["c_mpr_axial.png"])) > 20


def test_an_overview_mpr_through_a_nodule_outlines_it(tmp_path):
    from pipeline.reconstruction.render import nodule_labels, render_mpr

    vol, lung = _lung_with_a_nodule()
    nodules = segment_findings(vol, [{"center_lps": CENTRE.tolist(), "diameter_mm": 12.0}], lung_mask=lung)
    labels = nodule_labels(nodules, vol.geometry)
    assert labels is not None and set(np.unique(labels)) == {0, 1}
    assert labels.sum() == nodules[0].mask.sum()  # the crop pasted back where it was cut from
    through = render_mpr(vol, {"lung_right": lung}, tmp_path, stem="a", center_lps=CENTRE, nodules=labels)
    plain = render_mpr(vol, {"lung_right": lung}, tmp_path, stem="b", center_lps=CENTRE)
    for with_nodule, without in zip(through, plain):
        assert len(_magenta(with_nodule)) > 20 and len(_magenta(without)) == 0, with_nodule.name


def test_an_overview_mpr_marks_the_nodules_it_does_not_cut_with_their_distance(tmp_path, monkeypatch):
    """A nodule away from the overview MPRs' planes was invisible on them: the reader of the overview could not tell
    there was one. Each nodule a plane does not cut is now marked beside the image at its height (on the side nearer
    it), lettered ``#N`` as the outlines and the nodule lines are, with the distance from the plane to its centre and
    the side (S/I, A/P, R/L) it lies on; the legend says what the mark is."""
    from pipeline.reconstruction import render
    from pipeline.reconstruction.render import nodule_labels, render_mpr

    figures: list = []
    save = render.save_png
    monkeypatch.setattr(render, "save_png", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    vol, lung = _lung_with_a_nodule()
    nodules = segment_findings(vol, [{"center_lps": CENTRE.tolist(), "diameter_mm": 12.0}], lung_mask=lung)
    labels = nodule_labels(nodules, vol.geometry)
    below = CENTRE - np.array([0.0, 0.0, 18.0])  # the axial plane 18 mm below the nodule; the others through it
    paths = render_mpr(vol, {"lung_right": lung}, tmp_path, stem="o", center_lps=below, nodules=labels)
    axial = figures[0]
    z = float(axial.axes[0].get_title().split("z=")[1].split(" mm")[0])
    distance = nodules[0].centroid_lps[2] - z
    assert distance > 12.0  # the plane does not cut it
    texts = [t.get_text() for t in axial.axes[0].texts]
    assert f"#1 ({distance:.0f} mm S)" in texts, texts
    legend = [t.get_text() for t in axial.axes[0].get_legend().get_texts()]
    assert any("off the plane" in t and "beside the image" in t for t in legend), legend
    marked = _magenta(paths[0])
    assert len(marked) > 10
    # beside the side of the image the nodule lies on: the left (patient's right, x < 0)
    img_w = mpimg.imread(paths[0]).shape[1]
    assert marked[:, 1].mean() < img_w / 2
    for fig in figures[1:]:  # the coronal and sagittal planes cut it: outlined, no distance
        texts = [t.get_text() for t in fig.axes[0].texts]
        assert "#1" in texts and not any(t.startswith("#1 (") for t in texts), texts


def test_the_letters_of_nodules_side_by_side_do_not_cover_each_other(tmp_path, monkeypatch):
    """Two nodules beside each other off a plane: the second's "#2 (14 mm A)" covered the first's "#1" on the real
    overview. Each nodule's letters now take a spot no other letters take."""
    from pipeline.reconstruction import render
    from pipeline.reconstruction.render import nodule_labels, render_mpr

    figures: list = []
    save = render.save_png
    monkeypatch.setattr(render, "save_png", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    vol, lung = _lung_with_a_nodule()
    twin = CENTRE + np.array([0.0, 0.0, -14.0])  # straight below the first: both project onto the same spot
    arr = np.asarray(vol.array).copy()
    from tests._support.shapes import lps_grids

    x, y, z = lps_grids(vol.geometry)
    arr[(x - twin[0]) ** 2 + (y - twin[1]) ** 2 + (z - twin[2]) ** 2 <= 4.0**2] = 40.0
    vol = CTVolume(arr, vol.geometry, metadata=vol.metadata)
    found = [{"center_lps": c.tolist(), "diameter_mm": 10.0} for c in (CENTRE, twin)]
    nodules = segment_findings(vol, found, lung_mask=lung)
    assert all(r.error is None for r in nodules)
    labels = nodule_labels(nodules, vol.geometry)
    render_mpr(vol, {"lung_right": lung}, tmp_path, stem="t", center_lps=CENTRE + [0.0, 0.0, 25.0], nodules=labels)
    axial = figures[0]
    renderer = axial.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in axial.axes[0].texts if t.get_text().startswith("#")]
    assert len(boxes) == 2
    assert not boxes[0].overlaps(boxes[1]), boxes


def test_the_preview_letters_each_nodule_with_its_findings_number(tmp_path, monkeypatch):
    """The 3-D preview drew six magenta nodules on the planning chest and named none: a reader could not match a ball
    to finding #3 of the SR or the MPRs. Each is now lettered #N beside its surface in both views."""
    from pipeline.reconstruction import preview
    from pipeline.reconstruction.preview import image_position

    figures: list = []
    save = preview.save_png
    monkeypatch.setattr(preview, "save_png", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    vol, lung = _lung_with_a_nodule()
    nodules = segment_findings(vol, [{"center_lps": CENTRE.tolist(), "diameter_mm": 12.0}], lung_mask=lung)
    meshes = {"lung_right": mesh_from_mask(lung, vol.geometry, name="lung_right")}
    render_all(vol, {"lung_right": lung}, meshes, tmp_path, stem="p", nodules=nodules)
    (fig,) = figures
    lung_v = meshes["lung_right"].vertices
    frame = (lung_v.min(axis=0), lung_v.max(axis=0))
    for ax, view in zip(fig.axes[:2], ("anterior", "left")):
        (label,) = [t for t in ax.texts if t.get_text().startswith("#")]
        assert label.get_text() == "#1"
        (u, v), top = image_position(np.array([CENTRE, CENTRE + [0.0, 0.0, 6.0]]), view=view, size=512, frame=frame)
        r = v - top[1]  # pixels: 6 mm, about the nodule's radius
        x, y = label.get_position()
        assert 0.5 * r < x - u < r + 15 and -r - 5 < y - v < 5, (view, (x, y), (u, v), r)  # right beside the nodule


def test_a_nodules_letters_go_left_of_it_before_they_leave_its_row():
    """On the planning chest's sagittal overview the letters of #5 were pushed four lines down, away from its outline,
    by its neighbours' letters on its right: they now take the left side of the nodule first, on its own row, and
    never run past the image's edge."""
    from pipeline.reconstruction.letter_spots import free_spot

    placed: list = []
    first = free_spot(20.0, 10.0, 50.0, "#1 (18 mm S)", 0.14, placed, limit=100.0)
    assert first == (20.0, 50.0)  # right of the nodule, at its top
    second = free_spot(22.0, 12.0, 50.0, "#2 (9 mm I)", 0.14, placed, limit=100.0)
    assert second[1] == 50.0 and placed[1][2] <= 12.0  # left of the second nodule, on its row
    edge = free_spot(95.0, 60.0, 80.0, "#3 (2 mm S)", 0.14, placed, limit=100.0)
    assert placed[2][2] <= 60.0 and edge[1] == 80.0  # no room right of it: left


def test_a_nodules_letters_cover_no_other_nodule(tmp_path, monkeypatch):
    """On the planning chest's axial overview the letters "#1 (29 mm S)" lay over the dashed outline of #6 beside it:
    the letters now keep off every nodule's outline."""
    from matplotlib.transforms import Bbox

    from pipeline.reconstruction import render
    from pipeline.reconstruction.render import nodule_labels, render_mpr
    from tests._support.shapes import lps_grids

    figures: list = []
    save = render.save_png
    monkeypatch.setattr(render, "save_png", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    vol, lung = _lung_with_a_nodule()
    first, second = np.array([-24.0, 5.0, 10.0]), np.array([-13.0, 5.0, 10.0])  # side by side, 3 mm apart
    arr = np.full(vol.shape, 40.0, np.float32)
    arr[lung] = -850.0
    x, y, z = lps_grids(vol.geometry)
    for c in (first, second):
        arr[(x - c[0]) ** 2 + (y - c[1]) ** 2 + (z - c[2]) ** 2 <= 4.0**2] = 40.0
    vol = CTVolume(arr, vol.geometry, metadata=vol.metadata)
    nodules = segment_findings(vol, [{"center_lps": c.tolist(), "diameter_mm": 8.0} for c in (first, second)], lung_mask=lung)
    assert all(r.error is None for r in nodules)
    render_mpr(
        vol,
        {"lung_right": lung},
        tmp_path,
        stem="k",
        center_lps=first + [0.0, 0.0, 25.0],
        nodules=nodule_labels(nodules, vol.geometry),
    )
    axial = figures[0]
    ax = axial.axes[0]
    renderer = axial.canvas.get_renderer()
    lo = vol.geometry.bounds_lps()[0]
    letters = {t.get_text()[:2]: t.get_window_extent(renderer) for t in ax.texts if t.get_text().startswith("#")}
    for number, c in ((1, first), (2, second)):  # each nodule's projected box, in image mm (x from the right, y from A)
        corners = np.array([[c[0] - 4.0 - lo[0], c[1] - 4.0 - lo[1]], [c[0] + 4.0 - lo[0], c[1] + 4.0 - lo[1]]])
        pixels = ax.transData.transform(corners)
        box = Bbox([pixels.min(axis=0), pixels.max(axis=0)])
        for other, letter in letters.items():
            if other != f"#{number}":
                assert not letter.overlaps(box), (other, f"covers nodule #{number}", letter, box, letters)


def test_the_mip_slab_holding_a_nodule_outlines_and_letters_it(tmp_path, monkeypatch):
    """The lung-window MIP slabs, where a reader looks for nodules among the vessels, showed the segmented nodules
    unmarked: nothing told a reported nodule from one the detector missed. A nodule a slab holds is now outlined there
    (its shadow across the slab) and lettered #N; the slabs that do not hold it stay unmarked. ``ctpipe run`` draws them
    with the other renderings that show nodules."""
    from pipeline.reconstruction import render

    figures: list = []
    save = render.save_png
    monkeypatch.setattr(render, "save_png", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    vol, lung = _lung_with_a_nodule()
    nodules = segment_findings(vol, [{"center_lps": CENTRE.tolist(), "diameter_mm": 12.0}], lung_mask=lung)
    labels = render.nodule_labels(nodules, vol.geometry)
    paths = render.render_mip(vol, tmp_path, stem="m", lung_mask=lung, slab_mm=6.0, nodules=labels)
    zs = [tuple(float(v) for v in fig.axes[0].get_title().split("MIP ")[1].split(" mm")[0].split("..")) for fig in figures]
    holding = [lo - 5.0 <= CENTRE[2] <= hi + 5.0 for lo, hi in zs]  # the nodule's 5 mm radius reaches into the slab
    assert any(holding) and not all(holding), zs
    for path, fig, holds in zip(paths, figures, holding):
        texts = [t.get_text() for t in fig.axes[0].texts]
        assert ("#1" in texts) == holds and (len(_magenta(path)) > 20) == holds, (fig.axes[0].get_title(), texts)
    views = render.render_nodule_views(vol, {"lung_right": lung}, tmp_path, stem="v", nodules=nodules)
    assert [p.name for p in views if "_mip_" in p.name] == [f"v_mip_axial_{n + 1}.png" for n in range(3)]


def test_letters_of_nodules_off_the_plane_lie_in_free_space_not_on_the_lungs(tmp_path, monkeypatch):
    """On the planning chest's axial overview, '#6 (42 mm I)' of a nodule below the plane sat on the right lung and
    the airway's outline beside the nodule's dashed shadow. The letters of a nodule the plane does not cut now lie
    off the body, on no organ, joined by a thin line to the mark at its height beside the image; a nodule the plane
    cuts keeps its letters beside it."""
    from matplotlib.transforms import Bbox

    from pipeline.reconstruction import render

    figures: list = []
    save = render.save_png
    monkeypatch.setattr(render, "save_png", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    geom = Geometry(shape=(40, 100, 100), spacing=(2.0, 2.0, 2.5), origin=(-100.0, -100.0, -50.0))
    x, y, z = lps_grids(geom)
    body = (x / 80.0) ** 2 + (y / 60.0) ** 2 <= 1.0
    right = body & (((x + 40.0) / 30.0) ** 2 + (y / 40.0) ** 2 + (z / 40.0) ** 2 <= 1.0)
    left = body & (((x - 40.0) / 30.0) ** 2 + (y / 40.0) ** 2 + (z / 40.0) ** 2 <= 1.0)
    arr = np.where(body, 40.0, -1000.0).astype(np.float32)
    arr[right | left] = -850.0
    labels = np.zeros(geom.shape, np.uint16)
    labels[(x + 40.0) ** 2 + y**2 + (z + 20.0) ** 2 <= 5.0**2] = 1  # 20 mm below the axial plane (z=0)
    masks = {"body": body, "lung_left": left, "lung_right": right}
    render.render_mpr(CTVolume(arr, geom), masks, tmp_path, stem="o", nodules=labels, center_lps=np.zeros(3))
    ax = figures[0].axes[0]
    assert ax.get_title().startswith("axial")
    renderer = figures[0].canvas.get_renderer()
    (letters,) = [t for t in ax.texts if t.get_text().startswith("#1 (")]
    box = letters.get_bbox_patch().get_window_extent(renderer)  # the dark box behind the letters
    # the body on the PNG: each image pixel of the plane (y anterior at the top, x right on the left) as display pixels
    rows, cols = np.nonzero(body[20])
    centres = np.column_stack(((cols + 0.5) * 2.0, (rows + 0.5) * 2.0))
    on_body = [Bbox.from_bounds(*xy, 1, 1) for xy in ax.transData.transform(centres)]
    assert not any(box.overlaps(b) for b in on_body), (letters.get_text(), box)
    assert any(line.get_linestyle() == ":" for line in ax.lines)  # the line from the letters to the shadow


@pytest.mark.parametrize("tilt_deg", [0.0, 20.0])
def test_a_nodules_close_ups_state_its_long_and_short_axis(tmp_path, monkeypatch, tilt_deg):
    """Each close-up MPR of a nodule names its long and short axis (mm), their mean and the slice they are measured
    on, as the nodule lines and the SR state them; of an oblique acquisition, whose close-ups show true axial,
    coronal and sagittal planes, that the axes lie in that slice's plane and how far it leans off axial."""
    from pipeline.reconstruction import render
    from pipeline.reconstruction.nodule_geometry import axes_json

    figures: list = []
    save = render.save_png
    monkeypatch.setattr(render, "save_png", lambda fig, path: (figures.append((path.name, fig)), save(fig, path))[1])
    vol, lung = _lung_with_a_nodule(tilt_deg)
    nodules = segment_findings(vol, [{"center_lps": CENTRE.tolist(), "diameter_mm": 12.0}], lung_mask=lung)
    render.render_nodule_views(vol, {"lung_right": lung}, tmp_path, stem="c", nodules=nodules)
    axes = axes_json(nodules[0], vol.geometry, vol.metadata)
    said = (
        f"long axis {axes['long_axis_mm']:.1f} mm, short axis {axes['short_axis_mm']:.1f} mm "
        f"(mean {axes['mean_diameter_mm']:.1f} mm) on slice {axes['axes_instance_number']}"
        + ("" if tilt_deg == 0.0 else " (in its image plane, 20.0° from axial)")
    )
    close_ups = [fig for name, fig in figures if name.startswith("c_nodule_01_mpr_")]
    assert len(close_ups) == 3
    for fig in close_ups:
        titles = [ax.get_title().replace("\n", " ") for ax in fig.axes]  # as read, whatever its lines
        assert any(said in t for t in titles), titles


def _crowded_coronal() -> tuple[CTVolume, dict[str, np.ndarray], np.ndarray]:
    """A chest whose body fills the whole coronal plane (no air around it, as on a planning CT's coronal), two lungs,
    and five nodules off the coronal plane y=0 close together in the right lung."""
    geom = Geometry(shape=(40, 100, 100), spacing=(2.0, 2.0, 2.5), origin=(-100.0, -100.0, -50.0))
    x, y, z = lps_grids(geom)
    body = np.ones(geom.shape, bool)
    right = ((x + 45.0) / 35.0) ** 2 + (y / 50.0) ** 2 + (z / 42.0) ** 2 <= 1.0
    left = ((x - 45.0) / 35.0) ** 2 + (y / 50.0) ** 2 + (z / 42.0) ** 2 <= 1.0
    arr = np.full(geom.shape, 40.0, np.float32)
    arr[right | left] = -850.0
    labels = np.zeros(geom.shape, np.uint16)
    for n, (cx, cy, cz) in enumerate([(-50, 20, 10), (-40, -25, 14), (-55, 30, 0), (-35, 35, -8), (-48, -30, 22)], 1):
        labels[(x - cx) ** 2 + (y - cy) ** 2 + (z - cz) ** 2 <= 4.0**2] = n
    return CTVolume(arr, geom), {"body": body, "lung_left": left, "lung_right": right}, labels


def test_off_plane_letters_of_a_crowded_coronal_lie_off_the_lungs_and_apart(tmp_path, monkeypatch):
    """On the planning chest's coronal overview the body fills the plane: with no air around it, the letters of the
    nodules off the plane ('#1 (18 mm P)', '#6 (9 mm P)') lay on the right lung beside their shadows. They now lie in
    a margin added beside the image, joined by dotted lines to the marks at the nodules' heights, on no lung and none
    over another."""
    from matplotlib.transforms import Bbox

    from pipeline.reconstruction import render
    from pipeline.reconstruction.render_planes import lps_aligned, plane_image

    figures: list = []
    save = render.save_png
    monkeypatch.setattr(render, "save_png", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    vol, masks, labels = _crowded_coronal()
    render.render_mpr(vol, masks, tmp_path, stem="c", nodules=labels, center_lps=np.zeros(3), planes=("coronal",))
    (fig,) = figures
    ax = fig.axes[0]
    assert ax.get_title().startswith("coronal")
    renderer = fig.canvas.get_renderer()
    letters = [t for t in ax.texts if t.get_text().startswith("#")]
    assert len(letters) == 5, [t.get_text() for t in letters]
    boxes = [t.get_bbox_patch().get_window_extent(renderer) for t in letters]
    view, spacing, lo = lps_aligned(np.logical_or(masks["lung_left"], masks["lung_right"]), vol.geometry)
    index = int(round((0.0 - lo[1]) / spacing[1]))
    rows, cols = np.nonzero(plane_image(view, "coronal", index))
    centres = np.column_stack(((cols + 0.5) * spacing[0], (rows + 0.5) * spacing[2]))
    on_lung = [Bbox.from_bounds(*xy, 1, 1) for xy in ax.transData.transform(centres)]
    for text, box in zip(letters, boxes):
        assert not any(box.overlaps(b) for b in on_lung), (text.get_text(), "on a lung", box)
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1, (text.get_text(), "cut at the PNG's edge", box)
    for i, j in itertools.combinations(range(len(boxes)), 2):
        assert not boxes[i].overlaps(boxes[j]), (letters[i].get_text(), letters[j].get_text())
    assert sum(line.get_linestyle() == ":" for line in ax.lines) == 5  # a line from each letters to its mark


def test_the_letter_layout_puts_crowded_off_plane_letters_in_margins_apart():
    """The layout alone, on a plane the body fills (no free space on it) with forty nodules off the plane crowded in
    one lung: every nodule's letters lie in a margin beside the image, beyond the side letters' band and off their row,
    none over another's or a nodule; a full margin spills over to the other side; the margins hold them all."""
    from pipeline.reconstruction.render_nodules import layout_letters, letter_margins

    shape, col_mm, row_mm, band_mm, mm_per_pt = (100, 150), 2.0, 2.0, 8.0, 0.5  # a 300 x 200 mm image
    anatomy = np.ones(shape, bool)
    marks = []
    for n in range(40):
        sl = np.zeros(shape, bool)
        r, c = 5 + 2 * n, 30 + (n % 3) * 4
        sl[r : r + 3, c : c + 3] = True
        marks.append((n + 1, sl, "dashed", f"#{n + 1} ({10 + n} mm P)"))
    spots = layout_letters(marks, col_mm, row_mm, mm_per_pt=mm_per_pt, anatomy=anatomy, band_mm=band_mm)
    w_mm, h_mm = shape[1] * col_mm, shape[0] * row_mm
    assert len(spots) == 40 and all(s.leader for s in spots)
    for s in spots:
        assert s.box[2] <= -band_mm or s.box[0] >= w_mm + band_mm, s  # in a margin, not on the image or the band
        assert 0.0 <= s.box[1] and s.box[3] <= h_mm, s
        assert not (s.box[1] < h_mm / 2 + 0.8 * 11 * mm_per_pt and h_mm / 2 - 0.8 * 11 * mm_per_pt < s.box[3]), s
    boxes = [s.box for s in spots] + [s.mark for s in spots]
    for a, b in itertools.combinations(boxes, 2):
        assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]), (a, b)
    on_left = [s.box[2] <= -band_mm for s in spots]
    assert all(on_left[:20]) and not all(on_left)  # the nodules lie in the image's left part: the left margin first
    left, right = letter_margins(spots, w_mm, band_mm=band_mm)
    assert left >= max(-s.box[0] for s in spots) - band_mm and right >= max(s.box[2] for s in spots) - w_mm - band_mm


def test_the_letter_layout_keeps_letters_in_free_space_and_beside_cut_nodules():
    """With air beside the body the off-plane letters stay on the image, in the air (no margin); a nodule the plane
    cuts keeps its letters beside it, without a line."""
    from pipeline.reconstruction.render_nodules import layout_letters, letter_margins

    shape = (100, 150)
    anatomy = np.zeros(shape, bool)
    anatomy[20:80, 30:120] = True  # the body, air all around it
    cut, off = np.zeros(shape, bool), np.zeros(shape, bool)
    cut[40:44, 50:54] = True
    off[60:64, 90:94] = True
    marks = [(1, cut, "solid", "#1"), (2, off, "dashed", "#2 (20 mm A)")]
    solid, dashed = layout_letters(marks, 2.0, 2.0, mm_per_pt=0.5, anatomy=anatomy, band_mm=8.0)
    assert not solid.leader and solid.box[0] >= 54 * 2.0  # right beside the nodule
    assert dashed.leader and 0.0 <= dashed.box[0] and dashed.box[2] <= 300.0
    rows = slice(int(dashed.box[1] // 2), int(np.ceil(dashed.box[3] / 2)))
    assert not anatomy[rows, int(dashed.box[0] // 2) : int(np.ceil(dashed.box[2] / 2))].any()
    assert letter_margins([solid, dashed], 300.0, band_mm=8.0) == (0.0, 0.0)


def test_the_letter_layout_never_overprints_the_letters_of_a_crowd_of_cut_nodules():
    """The letters of nodules a plane or a MIP slab cuts went, where no free place lay beside a nodule, to the default
    spot anyway: over other letters and past the image's edge. With no room beside a nodule they now go to the nearest
    free place on the image (a MIP, no margin) or to a margin beside it (an MPR), joined to it by a dotted line."""
    from pipeline.reconstruction.render_nodules import layout_letters

    shape, mm = (24, 48), 1.0  # a 48 x 24 mm image: a crowd of ten nodules in a column
    marks = []
    for n in range(10):
        sl = np.zeros(shape, bool)
        r, c = 1 + 21 * n // 10, 10 + (n % 2) * 3
        sl[r : r + 2, c : c + 2] = True
        marks.append((n + 1, sl, "solid", f"#{n + 1}"))
    for anatomy in (None, np.ones(shape, bool)):
        spots = layout_letters(marks, mm, mm, mm_per_pt=0.35, anatomy=anatomy, band_mm=8.0)
        for s in spots:
            assert 0.0 <= s.box[1] and s.box[3] <= 24.0, s
            if anatomy is None:  # a MIP has no margin: on the image
                assert 0.0 <= s.box[0] and s.box[2] <= 48.0, s
            else:  # on the image or in a margin beyond the side letters' band
                assert 0.0 <= s.box[0] and s.box[2] <= 48.0 or s.box[2] <= -8.0 or s.box[0] >= 56.0, s
        boxes = [s.box for s in spots] + [s.mark for s in spots]
        for a, b in itertools.combinations(boxes, 2):
            assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]), (anatomy is None, a, b)
