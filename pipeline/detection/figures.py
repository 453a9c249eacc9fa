"""One PNG per finding: the axial slice through its centre and a lung-window MIP slab, box drawn, then
a close-up of the finding in three planes.

The top row shows the axial plane through the finding in the radiological display convention (the patient's
right on the image's left, anterior up), whatever the series' storage order (a NIfTI file written in RAS order
would otherwise show up upside down and mirrored): the series' voxels, transposed and flipped only
(:meth:`pipeline.geometry.Geometry.to_lps_view`), the box the finding's LPS box mapped to them. The close-ups
(:func:`patient_planes`) are resampled around the finding's centre in patient axes, in the same convention, so that
a reader can tell a nodule (round in all three planes) from a vessel (a line in at least one). The title names the
slice as the scanner numbered it (its InstanceNumber, or frame number, when the series metadata lists them; see
:func:`.findings.slice_ref`), the score as the SR states it (three decimals, a score below 1 never as 1) and any
quality flag of the findings (thick slices). Only reported findings get a PNG.
The figures are drawn without pyplot (no display, and the calling application's matplotlib backend left as it is).
"""

from __future__ import annotations

import io
import logging
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..atomic import atomic_write_bytes
from ..dicom_out.model import stated_score
from ..volume import CTVolume
from .findings import Finding, Findings, slice_label
from .model_config import DEMO_MODEL_JSON
from .patches import HU_WINDOW, sample_windowed

log = logging.getLogger(__name__)

LUNG_WINDOW = (-1350.0, 150.0)  # level -600, width 1500 HU
#: How the slice's and the MIP's titles state the window they are drawn in (the close-ups are drawn in it too).
WINDOW_NOTE = f"lung window W{LUNG_WINDOW[1] - LUNG_WINDOW[0]:.0f} L{(LUNG_WINDOW[0] + LUNG_WINDOW[1]) / 2:.0f}"
SLAB_MM = 10.0
CLOSE_UP_MM = 50.0  # field of view of the close-ups
CLOSE_UP_PIXELS = 81  # odd, so that the finding's centre is a pixel's centre
CLOSE_UP_BAND_PX = 6  # close-up pixels of the bands around each close-up that hold its letters, on no anatomy
WARNING_CHARS = 100  # characters per line of the warning under the title: the 810-pixel wide PNG holds them whole
WARNING_COLOUR = "#ffb000"  # the title and warning of a flagged series: amber, legible on the black PNG
FOOTER_COLOUR = "#b0b0b0"  # the model's line at the bottom: quieter than the titles, legible on black
WARNING_LINE_INCHES = 0.25  # the figure grows by this for each line of the warning
_LABEL_BOX = {"facecolor": "black", "alpha": 0.6, "pad": 1.0, "linewidth": 0.0}
#: The bands around the slice and the MIP that hold their letters (the patient's right on the image's left, anterior
#: at the top), on no anatomy: this share of the image's longer side (mm) on every side.
LETTER_BAND = 0.045
#: The close-ups: name, the letters at the image's left, right, top and bottom edges, and what is up.
PLANES = (
    ("axial", "R", "L", "A", "P", "anterior"),
    ("coronal", "R", "L", "S", "I", "superior"),
    ("sagittal", "A", "P", "S", "I", "superior"),
)


def patient_planes(
    volume: CTVolume, center_lps: Sequence[float], *, field_mm: float = CLOSE_UP_MM, pixels: int = CLOSE_UP_PIXELS
) -> dict[str, np.ndarray]:
    """HU images (``pixels`` square, ``field_mm`` across, trilinear, HU clipped to ``HU_WINDOW``) of the axial,
    coronal and sagittal planes through ``center_lps`` (LPS mm), in the radiological display convention: axial
    seen from the feet (patient's right on the image's left, anterior up), coronal from the front (right on the
    left, superior up), sagittal from the patient's left (anterior on the left, superior up). Row 0 is the top.
    Pixels outside the series (a finding near the first or last slice) are NaN, not the edge slice repeated."""
    ax = (np.arange(pixels) - (pixels - 1) / 2.0) * (field_mm / pixels)
    across, down = np.meshgrid(ax, ax)  # column and row offsets (mm), increasing right and down
    zero = np.zeros_like(across)
    offsets = {  # (L, P, S) offsets of each pixel
        "axial": (across, down, zero),
        "coronal": (across, zero, -down),
        "sagittal": (zero, across, -down),
    }
    centre = np.asarray(center_lps, dtype=np.float64)
    out = {}
    for name, (dl, dp, ds) in offsets.items():
        offsets_mm = np.stack([dl.ravel(), dp.ravel(), ds.ravel()], axis=1)
        hu = HU_WINDOW[0] + sample_windowed(volume, centre, offsets_mm) * (HU_WINDOW[1] - HU_WINDOW[0])
        hu = np.where(volume.geometry.contains_lps(centre + offsets_mm), hu, np.nan)
        out[name] = hu.reshape(pixels, pixels)
    return out


def _box_xy(volume: CTVolume, f: Finding) -> tuple[float, float, float, float]:
    """The finding's LPS box as column and row ranges (x0, x1, y0, y1) of the axial view."""
    lo, hi = np.asarray(f.box_min_lps), np.asarray(f.box_max_lps)
    corners = np.array([[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])])
    xyz = volume.geometry.lps_view_index(volume.lps_to_index(corners))
    return float(xyz[:, 0].min()), float(xyz[:, 0].max()), float(xyz[:, 1].min()), float(xyz[:, 1].max())


def axial_view(volume: CTVolume, f: Finding) -> tuple[np.ndarray, np.ndarray, int, tuple[float, float, float, float]]:
    """The axial plane through finding ``f`` (HU) and a ±5 mm MIP slab around it, in the radiological display
    convention (row 0 anterior, column 0 the patient's right; the series' voxels transposed and flipped only), how
    many slices the slab holds, and the finding's box as (x0, x1, y0, y1) column and row ranges of those images.
    The slab holds the planes whose centres lie within 5 mm of the finding's, and is always centred on the
    finding's plane: within 5 mm of the series' first or last slice it is thinner (as many planes on each side as
    the series holds there), never shifted to one side. The planes are the grid's: on an oblique grid (a
    gantry-tilt corrected series) the scanner's tilted image planes (:func:`image_plane_note`).

    Voxels no image measured (the wedge of a tilt-corrected grid, :func:`~pipeline.ingest.measured.measured_mask`)
    are NaN in the plane, and in the MIP where no voxel of the slab was measured."""
    from ..ingest.measured import measured_mask

    geometry = volume.geometry
    view = geometry.to_lps_view(volume.array)  # [z, y, x], LPS ascending
    z = int(geometry.lps_view_index(f.voxel_ijk)[0, 2])
    # the planes whose centres lie within ±5 mm of the finding's: as thick in mm whatever the spacing's rounding
    # (1.93 mm planes of a 15° tilt-corrected 2 mm series: 5 planes, as the untilted scan's, not 7)
    half = max(0, int(np.floor(SLAB_MM / 2 / geometry.spacing_lps()[2] + 1e-6)))
    half = min(half, z, view.shape[0] - 1 - z)  # near the series' ends: thinner, still centred on the finding
    z0, z1 = z - half, z + half + 1
    axial = np.asarray(view[z], dtype=np.float32)
    measured = measured_mask(geometry, volume.metadata)
    if measured is None:
        mip = np.asarray(view[z0:z1], dtype=np.float32).max(axis=0)
        return axial, mip, z1 - z0, _box_xy(volume, f)
    known = geometry.to_lps_view(measured)
    axial = np.where(known[z], axial, np.float32(np.nan))
    slab = np.where(known[z0:z1], np.asarray(view[z0:z1], dtype=np.float32), np.float32(-np.inf)).max(axis=0)
    mip = np.where(np.isfinite(slab), slab, np.float32(np.nan)).astype(np.float32)
    return axial, mip, z1 - z0, _box_xy(volume, f)


def image_plane_note(volume: CTVolume) -> str | None:
    """What the finding PNG's slice and MIP show when they are not axial planes: the scanner's image plane tilted
    off axial by the grid's obliquity (degrees, :func:`~pipeline.reconstruction.render_planes.oblique_deg`) beyond
    :data:`~pipeline.reconstruction.render_planes.OBLIQUE_DEG`, e.g. a gantry-tilt corrected series; None for an
    axial grid (the letters then name the patient's axes exactly)."""
    from ..reconstruction.render_planes import OBLIQUE_DEG, oblique_deg

    angle = oblique_deg(volume.geometry)
    if angle <= OBLIQUE_DEG:
        return None
    return f"image plane tilted {angle:.1f}° from axial"


def finding_png(
    volume: CTVolume,
    f: Finding,
    *,
    rank: int = 1,
    slice_label: str = "slice",
    warning: str | None = None,
    footer: str | None = None,
) -> bytes:
    """PNG bytes: the axial plane through the finding (left, titled ``slice_label`` and the finding's
    ``slice_number``) and a ±5 mm MIP slab (right), each title stating the window (:data:`WINDOW_NOTE`), in patient orientation (:func:`axial_view`; lettered R, L,
    A, P in bands beside the images' edges, :data:`LETTER_BAND`; the titles say when the planes are the scanner's tilted image planes, :func:`image_plane_note`), lung window, box in red; below, the finding's :func:`patient_planes` side by side, a circle a little wider than its diameter around
    its centre, each its own image on a black panel (no close-up's edge smoothed into the next), lettered in the bands
    around it, on none of the images (:data:`CLOSE_UP_BAND_PX`), what lies beyond the
    series' first and last slices drawn as not scanned (:data:`~pipeline.reconstruction.render_planes.OUTSIDE_SCAN_RGB`). ``warning`` (the quality flags' sentences joined by
    "; ", e.g. the thick-slice flag) is written under the title, one flag a line, wrapped at :data:`WARNING_CHARS`
    characters (the figure grows by a line's height for each); ``footer`` (the model) at the bottom."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.patches import Circle, Rectangle

    from ..reconstruction.render_planes import OUTSIDE_SCAN_RGB

    k = f.voxel_ijk[2]
    axial, mip, n_slab, (i0, i1, j0, j1) = axial_view(volume, f)
    sx, sy, _ = volume.geometry.spacing_lps()
    warning_lines = warning_text_lines(warning)
    tilted = image_plane_note(volume)
    extra = len(warning_lines) + (tilted is not None)  # lines above the images: the warning's, the planes' second line
    height = 7.6 + WARNING_LINE_INCHES * extra
    top = 1.0 - (0.5 + WARNING_LINE_INCHES * extra) / height  # the title, warning and image titles above the images
    fig = Figure(figsize=(9, height), dpi=90, facecolor="black")  # as every rendering: no bright frame round the CT
    not_scanned = matplotlib.colormaps["gray"].with_extremes(bad=OUTSIDE_SCAN_RGB)  # NaN: voxels no image measured
    grid = fig.add_gridspec(2, 2, height_ratios=(4.6, 3.0), top=top, bottom=0.02, left=0.02, right=0.98, hspace=0.12)
    slice_title = f"{slice_label} {f.slice_number} (k={k}), {WINDOW_NOTE}"
    mip_title = f"MIP {n_slab} slices ({n_slab * volume.geometry.spacing_lps()[2]:.0f} mm), {WINDOW_NOTE}"
    if tilted is not None:  # lettered as the nearest patient axes, but not an axial plane: the title says so
        slice_title, mip_title = f"{slice_title}\nthe scanner's {tilted}", f"{mip_title}\nslab of the {tilted}"
    for n, (img, title) in enumerate(((axial, slice_title), (mip, mip_title))):
        ax = fig.add_subplot(grid[0, n])
        ax.imshow(
            img,
            cmap=not_scanned,
            vmin=LUNG_WINDOW[0],
            vmax=LUNG_WINDOW[1],
            interpolation="nearest",
            aspect=sy / sx,
        )
        ax.add_patch(Rectangle((i0, j0), i1 - i0, j1 - j0, fill=False, edgecolor="red", linewidth=1.2))  # the box's edges
        # the letters in bands around the image, as wide in mm (so in pixels of the PNG) on every side, on no anatomy
        rows, cols = img.shape
        band_mm = LETTER_BAND * max(cols * sx, rows * sy)
        pad_x, pad_y = band_mm / sx, band_mm / sy  # image pixels
        ax.set_xlim(-0.5 - pad_x, cols - 0.5 + pad_x)
        ax.set_ylim(rows - 0.5 + pad_y, -0.5 - pad_y)
        ax.add_patch(Rectangle((-0.5 - pad_x, -0.5 - pad_y), cols + 2 * pad_x, rows + 2 * pad_y, color="black", zorder=-1))
        fx, fy = pad_x / 2 / (cols + 2 * pad_x), pad_y / 2 / (rows + 2 * pad_y)  # the bands' middles (axes fractions)
        for x, y, letter in ((fx, 0.5, "R"), (1 - fx, 0.5, "L"), (0.5, 1 - fy, "A"), (0.5, fy, "P")):
            ax.text(x, y, letter, transform=ax.transAxes, color="yellow", fontsize=8, ha="center", va="center", bbox=_LABEL_BOX)
        _scale_bar(ax, cols * sx, sx, y=rows - 0.5 + pad_y / 2, x0=-0.5 + 0.03 * cols)
        ax.set_title(title, fontsize=9, color="white")
        ax.set_axis_off()
    # the close-ups side by side in one axes (one axes draws far faster than three), each an image of its own on a
    # dark panel: smoothed apart, no close-up's edge is blended with the gap or its neighbour; the letters in the
    # bands around each image (CLOSE_UP_BAND_PX), on none of them
    planes = patient_planes(volume, f.center_lps)
    n_px, band = CLOSE_UP_PIXELS, CLOSE_UP_BAND_PX
    step = n_px + 2 * band  # from one close-up to the next: the image and its two side bands
    ax = fig.add_subplot(grid[1, :])
    radius = max(f.diameter_mm / 2.0 / (CLOSE_UP_MM / n_px), 2.0) + 2.0
    lo, hi = -0.5 - band / 2, n_px - 0.5 + band / 2  # the bands' middles: before and after an image's pixels
    for n, (name, left, right, upper, lower, up) in enumerate(PLANES):
        x0 = n * step
        ax.imshow(
            planes[name],
            cmap=not_scanned,  # beyond the series' first or last slice: as the slice's unscanned voxels, not white
            vmin=LUNG_WINDOW[0],
            vmax=LUNG_WINDOW[1],
            interpolation="bilinear",
            extent=(x0 - 0.5, x0 + n_px - 0.5, n_px - 0.5, -0.5),
        )
        ax.add_patch(Circle((x0 + n_px // 2, n_px // 2), radius, fill=False, edgecolor="red", linewidth=1.0))
        mid = n_px // 2
        for x, y, letter in ((x0 + lo, mid, left), (x0 + hi, mid, right), (x0 + mid, lo, upper), (x0 + mid, hi, lower)):
            ax.text(x, y, letter, color="yellow", fontsize=8, ha="center", va="center", bbox=_LABEL_BOX)
        ax.text(
            x0 + n_px / 2,
            -0.5 - band - 1,
            f"{name}, {CLOSE_UP_MM:.0f} mm, {up} up",
            fontsize=8,
            ha="center",
            va="bottom",
            color="white",
        )
    x_lo, x_hi, y_lo, y_hi = -0.5 - band, 2 * step + n_px - 0.5 + band, -0.5 - band, n_px - 0.5 + band
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_hi, y_lo)
    ax.set_aspect("equal")
    ax.axis("off")  # the panel under the images, the gaps and the letters' bands:
    ax.add_patch(Rectangle((x_lo, y_lo), x_hi - x_lo, y_hi - y_lo, facecolor="black", edgecolor="none", zorder=-1))
    c = f.center_lps
    score = stated_score(f.score)  # as the SR states it: 0.99996 is 0.999, never 1.000
    title = f"#{rank} score {score:.3f}, box {f.diameter_mm:.1f} mm at LPS ({c[0]:.1f}, {c[1]:.1f}, {c[2]:.1f}) mm"
    fig.suptitle("\n".join([title, *warning_lines]), fontsize=10, color="white" if not warning else WARNING_COLOUR)
    if footer:
        fig.text(0.5, 0.005, footer, ha="center", va="bottom", fontsize=7, color=FOOTER_COLOUR)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _scale_bar(ax, width_mm: float, col_mm: float, *, y: float, x0: float) -> None:
    """A yellow bar from column ``x0`` at row ``y`` (image pixels of ``col_mm`` mm; the band below an image
    ``width_mm`` wide, at its left, clear of the P in its middle), labelled with its length: the longest of
    :func:`~pipeline.reconstruction.render_layout.scale_bar_mm` of the width, as the MPRs'."""
    from ..reconstruction.render_layout import scale_bar_mm, side_labelled_bar

    side_labelled_bar(ax, x0, y, scale_bar_mm(width_mm), col_mm, label_offset_pt=(3.0, 0.0))


def warning_text_lines(warning: str | None) -> list[str]:
    """The lines of the warning written under a finding PNG's title: each flag's sentence (flags are joined by "; ")
    on lines of at most :data:`WARNING_CHARS` characters, so that none runs past the PNG's edges."""
    if not warning:
        return []
    parts = [p.strip() for p in warning.split("; ") if p.strip()]
    return [line for part in parts for line in textwrap.wrap(part, WARNING_CHARS)]


def model_footer(model: str) -> str | None:
    """The footer of a finding's PNG: the model that found it, and for the embedded demo model that it learned from
    synthetic phantoms alone (a reader must not take its findings for a clinical tool's)."""
    if not model:
        return None
    if model == DEMO_MODEL_JSON.stem:
        return f"model {model}: trained on synthetic phantoms only, for demonstration and testing, not for clinical use"
    return f"model {model}"


def write_finding_pngs(volume: CTVolume, findings: Findings, out_dir: str | Path, *, max_findings: int = 20) -> list[Path]:
    """Write ``finding_<rank>.png`` for the top ``max_findings`` reported findings into ``out_dir`` (atomic)."""
    out = Path(out_dir)
    paths = []
    label = slice_label(findings.slice_number_source)
    warning = "; ".join(findings.flags.values()) or None
    footer = model_footer(findings.model)
    for rank, f in enumerate(findings.findings[:max_findings], 1):
        p = out / f"finding_{rank:03d}.png"
        atomic_write_bytes(p, finding_png(volume, f, rank=rank, slice_label=label, warning=warning, footer=footer))
        paths.append(p)
    return paths
