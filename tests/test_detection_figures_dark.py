"""The finding PNG was the one rendering on white: its CT images sat in a bright frame (glare in a dark reading room,
and white read as bone beside the lung window's greys) while the MPRs, MIPs and the 3-D preview are on black. It is
now on black like them, its titles, warning and footer in colours that read on it."""

from __future__ import annotations

import io

import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.text import Text

from pipeline.detection.figures import finding_png
from pipeline.detection.findings import Finding
from pipeline.volume import CTVolume, Geometry


def _luminance(colour) -> float:
    rgb = np.array(to_rgb(colour))
    lin = np.where(rgb <= 0.03928, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    return float(lin @ [0.2126, 0.7152, 0.0722])


def _contrast(a, b) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _finding_figure(monkeypatch):
    import matplotlib.figure

    found = []
    real = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        found.append(fig)
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    shape = (40, 60, 60)
    vol = CTVolume(np.full(shape, -800.0, np.float32), Geometry(shape=shape, spacing=(0.8, 0.8, 1.0), origin=(0.0, 0.0, 0.0)))
    c = vol.geometry.index_to_lps(np.array([[30.0, 30.0, 20.0]]))[0]
    f = Finding(
        center_lps=tuple(c),
        box_min_lps=tuple(c - 2),
        box_max_lps=tuple(c + 2),
        diameter_mm=4.0,
        score=0.9,
        voxel_ijk=(30, 30, 20),
        slice_number=21,
    )
    png = finding_png(vol, f, warning="thick slices: small nodules unreliable (3.99 mm > 2.5 mm)", footer="model m")
    return found[0], png


def test_the_finding_png_is_on_black_as_the_other_renderings(monkeypatch):
    import matplotlib.image

    fig, png = _finding_figure(monkeypatch)
    pixels = matplotlib.image.imread(io.BytesIO(png))[:, :, :3]
    corners = [pixels[2, 2], pixels[2, -3], pixels[-3, 2], pixels[-3, -3]]
    assert all(np.all(p < 0.1) for p in corners), f"the PNG's corners are {[p.round(2).tolist() for p in corners]}"
    assert np.mean(np.all(pixels > 0.95, axis=-1)) < 0.01, "white areas in the finding PNG"


def test_every_text_reads_on_the_background(monkeypatch):
    fig, _png = _finding_figure(monkeypatch)
    background = fig.get_facecolor()
    ticks = {id(t) for ax in fig.axes for t in (*ax.get_xticklabels(), *ax.get_yticklabels())}  # hidden axes: undrawn
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text() and id(t) not in ticks]
    assert any("thick slices" in t.get_text() for t in texts) and any(t.get_text() == "model m" for t in texts)
    for t in texts:
        if t.get_bbox_patch() is not None:  # the letters, on their own dark boxes
            continue
        ratio = _contrast(t.get_color(), background)
        assert ratio >= 4.5, f"{t.get_text()!r} in {t.get_color()} on {background}: contrast {ratio:.1f} < 4.5"
