"""Finding close-ups are in patient orientation (radiological convention) whatever the series' storage order."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.detection.figures import CLOSE_UP_BAND_PX, CLOSE_UP_MM, CLOSE_UP_PIXELS, axial_view, finding_png, patient_planes
from pipeline.detection.findings import Finding
from pipeline.volume import CTVolume, Geometry

CENTRE = np.array([10.0, -20.0, 30.0])  # LPS mm
OFFSET_MM = 12.0
#: Storage orders: plain (i along L, j along P, k along S); rows and columns flipped (i along R, j along A, as
#: a feet-first prone series may be stored); and k running from head to feet with i and j swapped.
DIRECTIONS = {
    "LPS": np.eye(3),
    "RAS rows and columns": np.diag([-1.0, -1.0, 1.0]),
    "swapped, feet last": np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]]),
}


def _volume_with_markers(direction: np.ndarray) -> CTVolume:
    """Lung (-850 HU) with a 4 mm ball at ``CENTRE`` and one marker ball each 12 mm towards the patient's left (+L),
    back (+P) and head (+S), of 100, 200 and 300 HU."""
    spacing = (0.8, 0.8, 1.0)
    shape = (64, 80, 80)  # k, j, i
    geom = Geometry(shape=shape, spacing=spacing, origin=(0.0, 0.0, 0.0), direction=direction)
    half = (np.array(shape[::-1]) - 1) / 2.0 * np.array(spacing)  # i, j, k extents / 2 (mm)
    geom = geom.with_(origin=tuple(CENTRE - direction @ half))
    kk, jj, ii = np.indices(shape)
    lps = geom.index_to_lps(np.stack([ii.ravel(), jj.ravel(), kk.ravel()], axis=1)).reshape(*shape, 3)
    arr = np.full(shape, -850.0, np.float32)
    for offset, hu in ((np.zeros(3), 50.0), (np.array([OFFSET_MM, 0, 0]), 100.0), (np.array([0, OFFSET_MM, 0]), 200.0)):
        arr[np.linalg.norm(lps - (CENTRE + offset), axis=-1) <= 2.5] = hu
    arr[np.linalg.norm(lps - (CENTRE + np.array([0, 0, OFFSET_MM])), axis=-1) <= 2.5] = 300.0
    return CTVolume(arr, geom)


def _finding_at_centre(vol: CTVolume, size_mm: float) -> Finding:
    """A finding at ``CENTRE`` with a cube box ``size_mm`` across (LPS mm)."""
    ijk = np.rint(vol.lps_to_index(CENTRE)).astype(int)
    return Finding(
        center_lps=tuple(CENTRE),
        box_min_lps=tuple(CENTRE - size_mm / 2),
        box_max_lps=tuple(CENTRE + size_mm / 2),
        diameter_mm=size_mm,
        score=0.9,
        voxel_ijk=(int(ijk[0]), int(ijk[1]), int(ijk[2])),
        slice_number=int(ijk[2]) + 1,
    )


def _at(img: np.ndarray, row: float, col: float) -> float:
    return float(img[int(round(row)), int(round(col))])


@pytest.mark.parametrize("name", sorted(DIRECTIONS))
def test_close_ups_are_in_patient_orientation(name):
    vol = _volume_with_markers(DIRECTIONS[name])
    planes = patient_planes(vol, CENTRE)
    mid = CLOSE_UP_PIXELS // 2
    shift = OFFSET_MM / (CLOSE_UP_MM / CLOSE_UP_PIXELS)  # pixels
    for img in planes.values():
        assert img.shape == (CLOSE_UP_PIXELS, CLOSE_UP_PIXELS)
        assert img[mid, mid] == pytest.approx(50.0, abs=5.0)  # the finding's centre is the image's centre
    cases = (  # image, marker HU, its (row, column) offset from the centre in pixels
        ("axial", 100.0, (0, shift)),  # from the feet: the patient's left on the image's right
        ("axial", 200.0, (shift, 0)),  # posterior down
        ("coronal", 100.0, (0, shift)),  # from the front: left on the right
        ("coronal", 300.0, (-shift, 0)),  # head up
        ("sagittal", 200.0, (0, shift)),  # from the left: posterior on the right
        ("sagittal", 300.0, (-shift, 0)),  # head up
    )
    for plane, hu, (dr, dc) in cases:
        img = planes[plane]
        assert _at(img, mid + dr, mid + dc) == pytest.approx(hu, abs=5.0), f"{plane}: {hu} HU marker not where expected"
        assert _at(img, mid - dr, mid - dc) == pytest.approx(-850.0, abs=5.0), f"{plane}: mirrored"


@pytest.mark.parametrize("name", sorted(DIRECTIONS))
def test_the_axial_slice_is_in_patient_orientation_whatever_the_storage_order(name):
    vol = _volume_with_markers(DIRECTIONS[name])
    f = _finding_at_centre(vol, 4.0)
    axial, mip, n_slab, (x0, x1, y0, y1) = axial_view(vol, f)
    assert axial.shape == (80, 80) and n_slab == 11  # 10 mm of 1 mm slices around the finding's
    row, col = (y0 + y1) / 2.0, (x0 + x1) / 2.0
    assert x1 - x0 == pytest.approx(4.0 / 0.8, abs=0.01) and axial[int(round(row)), int(round(col))] == 50.0
    shift = OFFSET_MM / 0.8  # pixels
    assert _at(axial, row, col + shift) == 100.0  # the patient's left on the image's right
    assert _at(axial, row + shift, col) == 200.0  # posterior down
    assert _at(mip, row, col) == 50.0 and 300.0 not in mip  # the head marker lies 12 mm up, outside the slab


def test_finding_png_renders_the_close_ups():
    vol = _volume_with_markers(DIRECTIONS["RAS rows and columns"])
    png = finding_png(vol, _finding_at_centre(vol, 5.0))
    assert png.startswith(b"\x89PNG")


def test_the_demo_models_findings_say_on_their_pngs_that_it_learned_from_phantoms_alone():
    from pipeline.detection.figures import model_footer
    from pipeline.detection.model_config import load_model_config

    demo = load_model_config().name
    assert "not for clinical use" in (model_footer(demo) or "") and "synthetic phantoms" in (model_footer(demo) or "")
    assert model_footer("lung_nodule_ct_detection") == "model lung_nodule_ct_detection" and model_footer("") is None
    vol = _volume_with_markers(DIRECTIONS["RAS rows and columns"])
    f = _finding_at_centre(vol, 5.0)
    plain, footed = finding_png(vol, f), finding_png(vol, f, footer=model_footer(demo))
    assert footed != plain and footed.startswith(b"\x89PNG")


@pytest.mark.parametrize("name", sorted(DIRECTIONS))
def test_close_ups_leave_blank_what_lies_beyond_the_series(name):
    """A finding 5 mm below the series' most superior slice: the coronal and sagittal close-ups show the slices there
    are and nothing above them (NaN, drawn blank), never the top slice repeated up to the image's edge."""
    vol = _volume_with_markers(DIRECTIONS[name])
    z = vol.geometry.lps_coordinate(2).reshape(-1)  # z (mm) of each slice k
    k0, k1 = (int(k) for k in np.nonzero(z <= CENTRE[2] + 5.0)[0][[0, -1]])
    ni, nj, _ = vol.geometry.size_ijk
    cut = CTVolume(vol.array[k0 : k1 + 1], vol.geometry.cropped((0, 0, k0), (ni, nj, k1 + 1)))
    top_mm = float(cut.geometry.bounds_lps()[1][2]) + 0.5 - CENTRE[2]  # the series' upper edge above the centre
    assert top_mm == pytest.approx(5.0)
    planes = patient_planes(cut, CENTRE)
    up_mm = ((CLOSE_UP_PIXELS - 1) / 2.0 - np.arange(CLOSE_UP_PIXELS)) * (CLOSE_UP_MM / CLOSE_UP_PIXELS)  # per row
    assert np.isfinite(planes["axial"]).all()
    for plane in ("coronal", "sagittal"):
        img = planes[plane]
        assert np.isnan(img[up_mm > top_mm + 0.3]).all(), f"{plane}: anatomy drawn above the series"
        assert np.isfinite(img[up_mm < top_mm - 0.3]).all(), f"{plane}: the scanned slices left blank"
    f = _finding_at_centre(cut, 4.0)
    assert finding_png(cut, f).startswith(b"\x89PNG")


def test_the_box_drawn_is_the_findings_box(monkeypatch):
    """The red box on the axial slice and the MIP spans the finding's box, 4 mm = 5 pixels of 0.8 mm, centred on it:
    not a pixel wider (on a 4 mm grid a 6.5 mm box was drawn 10.7 mm wide)."""
    import matplotlib.patches

    drawn: list = []

    class Recorded(matplotlib.patches.Rectangle):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            drawn.append(self)

    monkeypatch.setattr(matplotlib.patches, "Rectangle", Recorded)
    vol = _volume_with_markers(DIRECTIONS["RAS rows and columns"])
    f = _finding_at_centre(vol, 4.0)
    finding_png(vol, f)
    _, _, _, (x0, x1, y0, y1) = axial_view(vol, f)
    boxes = [r for r in drawn if r.get_edgecolor()[:3] == (1.0, 0.0, 0.0)]
    assert len(boxes) == 2  # the slice and the MIP
    for r in boxes:
        assert (r.get_width(), r.get_height()) == (pytest.approx(4.0 / 0.8), pytest.approx(4.0 / 0.8))
        assert r.get_x() + r.get_width() / 2 == pytest.approx((x0 + x1) / 2)
        assert r.get_y() + r.get_height() / 2 == pytest.approx((y0 + y1) / 2)


def test_the_title_gives_the_score_as_the_findings_table_does(monkeypatch):
    # was: "#1 score 1.00" on the PNG of a finding that ctpipe detect, the CSV and the README give as 0.999
    from dataclasses import replace

    import matplotlib.figure

    titles: list[str] = []
    real = matplotlib.figure.Figure.suptitle
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", lambda fig, t, **kw: titles.append(t) or real(fig, t, **kw))
    vol = _volume_with_markers(DIRECTIONS["LPS"])
    finding_png(vol, replace(_finding_at_centre(vol, 5.0), score=0.99891), rank=1)
    assert titles and titles[0].startswith("#1 score 0.999, box 5.0 mm at LPS (10.0, -20.0, 30.0) mm"), titles
    finding_png(vol, replace(_finding_at_centre(vol, 5.0), score=0.99996), rank=1)  # the SR states 0.999, never 1
    assert titles[-1].startswith("#1 score 0.999,"), titles[-1]


def _texts_outside_the_figure(monkeypatch, draw) -> list[str]:
    """The texts of the figures ``draw()`` saves that reach beyond the figure's edges (cut off in the PNG), and the
    titles of images that reach into the figure's title."""
    import matplotlib.figure

    outside: list[str] = []
    real = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        real(fig, *args, **kwargs)
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)
        width, height = fig.bbox.width, fig.bbox.height
        texts = [*fig.texts, *([fig._suptitle] if fig._suptitle else [])]
        texts += [t for ax in fig.axes for t in (*ax.texts, ax.title)]
        for t in texts:
            if not t.get_visible() or not t.get_text():
                continue
            box = t.get_window_extent(renderer)
            if box.x0 < -0.5 or box.x1 > width + 0.5 or box.y0 < -0.5 or box.y1 > height + 0.5:
                outside.append(t.get_text())
        if fig._suptitle:  # the title and warning lie above the images' titles, not on them
            top = fig._suptitle.get_window_extent(renderer)
            outside.extend(ax.get_title() for ax in fig.axes if ax.title.get_window_extent(renderer).y1 > top.y0 + 0.5)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    draw()
    return outside


def test_a_long_quality_warning_is_wrapped_not_cut_off(monkeypatch):
    # was: on the COPDGene chest (4 mm slices of 4.17 mm pixels) the two flags' sentences ran past both edges of the
    # PNG: "t slices: small nodules unreliable (3.99 mm > 2.5 mm); coarse pixels: ... pixels > 2.5"
    warning = (
        "thick slices: small nodules unreliable (3.99 mm > 2.5 mm); "
        "coarse pixels: small nodules unreliable (4.17 x 4.17 mm pixels > 2.5 mm)"
    )
    vol = _volume_with_markers(DIRECTIONS["LPS"])
    f = _finding_at_centre(vol, 5.0)
    outside = _texts_outside_the_figure(monkeypatch, lambda: finding_png(vol, f, warning=warning, footer="model m"))
    assert outside == [], f"cut off at the PNG's edges: {outside}"


def test_the_slice_and_mip_are_lettered_on_all_four_edges(monkeypatch):
    # was: R and L only; anterior and posterior unnamed on the two large images (the close-ups said "anterior up")
    import matplotlib.figure

    letters: list[dict[str, tuple[float, float]]] = []
    real = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        for ax in fig.axes[:2]:  # the slice and the MIP
            letters.append({t.get_text(): t.get_position() for t in ax.texts if t.get_transform() == ax.transAxes})
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    vol = _volume_with_markers(DIRECTIONS["LPS"])
    finding_png(vol, _finding_at_centre(vol, 5.0))
    assert len(letters) == 2
    for where in letters:
        assert set(where) == {"R", "L", "A", "P"}, where
        assert where["R"][0] < 0.5 < where["L"][0] and where["A"][1] > 0.5 > where["P"][1]  # axes fraction: y up


def test_the_close_ups_are_lettered_on_all_four_edges(monkeypatch):
    # was: only their left and right edges were lettered; what is up was said in the titles alone
    import matplotlib.figure

    found: list[list[tuple[str, float, float]]] = []
    real = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        strip = fig.axes[2]  # the three close-ups side by side, in data coordinates (pixels)
        found.append([(t.get_text(), *t.get_position()) for t in strip.texts if len(t.get_text()) == 1])
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    vol = _volume_with_markers(DIRECTIONS["LPS"])
    finding_png(vol, _finding_at_centre(vol, 5.0))
    (letters,) = found
    n_px, band = CLOSE_UP_PIXELS, CLOSE_UP_BAND_PX
    for plane, expected in enumerate((("R", "L", "A", "P"), ("R", "L", "S", "I"), ("A", "P", "S", "I"))):
        x0, x1 = plane * (n_px + 2 * band) - band, plane * (n_px + 2 * band) + n_px + band  # with its letters' bands
        mine = {text: (x, y) for text, x, y in letters if x0 <= x < x1}
        assert set(mine) == set(expected), (plane, mine)
        left, right, top, bottom = (mine[k] for k in expected)
        assert left[0] < right[0] and top[1] < bottom[1]  # image rows run downwards


@pytest.mark.parametrize("where", ["first", "last"])
def test_the_mip_slab_stays_centred_on_a_finding_at_the_series_end(where):
    """The slab of a finding on the first or last slice holds as many planes on either side of it: a slab cut short on
    one side only would show what lies 5 mm to one side as if it were around the finding."""
    vol = _volume_with_markers(np.eye(3))  # 1 mm slices: a ±5 mm slab is 11 planes
    nz = vol.shape[0]
    for k in (0, 1, 2) if where == "first" else (nz - 1, nz - 2, nz - 3):
        f = Finding(
            center_lps=tuple(vol.index_to_lps(np.array([40.0, 40.0, k]))),
            box_min_lps=(0.0, 0.0, 0.0),
            box_max_lps=(1.0, 1.0, 1.0),
            diameter_mm=1.0,
            score=0.9,
            voxel_ijk=(40, 40, k),
            slice_number=k + 1,
        )
        marked = vol.array.copy()
        marked[:, 40, 40] = np.arange(nz)  # each plane's own number at the finding's pixel: the MIP shows the top one
        _, mip, n_slab, _ = axial_view(CTVolume(marked, vol.geometry), f)
        top = int(mip[40, 40])
        lowest = top - n_slab + 1
        assert n_slab % 2 == 1 and (lowest + top) / 2 == k, (k, lowest, top)  # the finding's plane is the slab's middle


def test_the_slice_and_mip_have_a_scale_bar_below_the_image(monkeypatch):
    # was: no scale on the two large images: a nodule or the box could not be sized by eye against the anatomy
    import matplotlib.figure

    bars: list = []
    real = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        renderer = FigureCanvasAgg(fig).get_renderer()
        for ax in fig.axes[:2]:  # the slice and the MIP
            image = ax.images[0].get_window_extent(renderer)
            lines = [line for line in ax.lines if line.get_color() == "yellow"]
            labels = [t for t in ax.texts if t.get_text().endswith(" mm")]
            bars.append((image, lines, labels, renderer, ax))
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    vol = _volume_with_markers(DIRECTIONS["LPS"])
    finding_png(vol, _finding_at_centre(vol, 5.0))
    assert len(bars) == 2
    col_mm = vol.geometry.spacing_lps()[0]
    for image, lines, labels, renderer, ax in bars:
        assert len(lines) == 1 and len(labels) == 1, ([t.get_text() for t in ax.texts], lines)
        xs = lines[0].get_xdata()
        assert abs((xs[1] - xs[0]) * col_mm - float(labels[0].get_text().split()[0])) < 1e-9  # as long as it says
        for box in (lines[0].get_window_extent(renderer), labels[0].get_window_extent(renderer)):
            assert box.y1 <= image.y0, (box, image)  # in the band below the image, on none of it
        p_letter = next(t for t in ax.texts if t.get_text() == "P").get_window_extent(renderer)
        assert not labels[0].get_window_extent(renderer).overlaps(p_letter)
