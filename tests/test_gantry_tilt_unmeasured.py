"""The wedge of a tilt-corrected grid that no tilted image measured is known as such, never taken for air.

A synthetic tilted series holds a slab of soft tissue (the body) that the field of view cuts at the top and bottom
of every image: along the shear. After the correction each image's edge, and so the body's cut, lies inside the grown
grid, beside the wedge of fill voxels; only the first and last slices reach the grid's own edge.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.cache import CaseCache
from pipeline.ingest import ingest_to_cache, load_series
from pipeline.ingest.measured import TILT_SHIFTS_KEY, measured_mask
from pipeline.ingest.padding import PADDING_HU
from pipeline.reconstruction.quality import assess_quality
from tests._support.dicom import write_series

ROWS, COLS, N, STEP = 32, 28, 16, 2.0
BODY_HU, OUTSIDE_HU = 40.0, -1000.0
BODY_COLS = slice(6, COLS - 6)  # the slab: every row, these columns


def _write(folder: Path, *, tilt_deg: float) -> Path:
    """A head-first series whose column cosine leans towards S by ``tilt_deg`` (the shear lies along the rows, j)."""
    t = np.radians(tilt_deg)
    row, col = np.array([1.0, 0.0, 0.0]), np.array([0.0, np.cos(t), np.sin(t)])
    start = np.array([-14.0, -16.0, -40.0])
    positions = [(start + k * np.array([0.0, 0.0, STEP])).tolist() for k in range(N)]
    hu = np.full((N, ROWS, COLS), OUTSIDE_HU)
    hu[:, :, BODY_COLS] = BODY_HU
    write_series(
        folder,
        n=N,
        rows=ROWS,
        cols=COLS,
        pixel_spacing=(1.0, 1.0),
        orientation=(*row, *col),
        positions=positions,
        hu=hu.astype(np.int16),
        tweak=lambda k, ds: setattr(ds, "GantryDetectorTilt", f"{tilt_deg:g}"),
    )
    return folder


def _body(vol) -> np.ndarray:
    return np.asarray(vol.array) > -500.0


def test_the_unmeasured_wedge_is_known_and_only_it(tmp_path):
    vol = load_series(_write(tmp_path / "tilted", tilt_deg=20.0), allow_gantry_tilt=True)
    measured = measured_mask(vol.geometry, vol.metadata)
    assert measured is not None and measured.shape == vol.shape
    grown_rows = vol.metadata["GantryTiltGrownColumnsRows"][1]
    assert grown_rows >= 5
    # each slice: its image's rows (ROWS, or ROWS - 1 where the shift is fractional: the edge row blends with the
    # fill) are measured, the other rows of the grown grid are not; every column is
    per_slice = measured.any(axis=2).sum(axis=1)
    assert np.all((per_slice >= ROWS - 1) & (per_slice <= ROWS)), per_slice
    assert measured.all(axis=2).sum() == measured.any(axis=2).sum()
    # what an image measured is never the fill value; what is fill value was not measured
    assert not np.any(vol.array[measured] == PADDING_HU)
    assert np.all(~measured[vol.array == PADDING_HU])


def test_untilted_series_have_no_mask_and_unchanged_metadata(tmp_path):
    vol = load_series(_write(tmp_path / "straight", tilt_deg=0.0))
    assert measured_mask(vol.geometry, vol.metadata) is None
    assert TILT_SHIFTS_KEY not in vol.metadata and "GantryTiltCorrectedDeg" not in vol.metadata


def test_a_body_cut_by_the_sheared_field_of_view_is_flagged_as_the_untilted_one(tmp_path):
    """The body meets the image's edge along the shear on every slice: ``fov_cuts_body`` as for the same body
    scanned untilted (about the same area), though the grid's own edge is touched by two slices only."""
    straight = load_series(_write(tmp_path / "straight", tilt_deg=0.0))
    tilted = load_series(_write(tmp_path / "tilted", tilt_deg=20.0), allow_gantry_tilt=True)
    q0 = assess_quality(np.asarray(straight.array), straight.geometry, {"body": _body(straight)}, metadata=straight.metadata)
    q1 = assess_quality(np.asarray(tilted.array), tilted.geometry, {"body": _body(tilted)}, metadata=tilted.metadata)
    assert "fov_cuts_body" in {f.code for f in q0.flags}
    assert "fov_cuts_body" in {f.code for f in q1.flags}, q1.figures
    assert q1.figures["fov_cut_area_cm2"] == pytest.approx(q0.figures["fov_cut_area_cm2"], rel=0.15)


def test_the_cache_keeps_which_voxels_were_measured(tmp_path):
    _write(tmp_path / "src", tilt_deg=20.0)
    vol = load_series(tmp_path / "src", allow_gantry_tilt=True)
    cache = CaseCache(tmp_path / "cache")
    report = ingest_to_cache(tmp_path / "src", cache, allow_gantry_tilt=True)
    (case_id,) = [w.case_id for w in report.written.values()]
    back = cache.read(case_id)
    np.testing.assert_array_equal(measured_mask(back.geometry, back.metadata), measured_mask(vol.geometry, vol.metadata))


def test_the_body_mask_never_claims_an_unmeasured_voxel(tmp_path):
    from pipeline.reconstruction.segment import segment_organs

    vol = load_series(_write(tmp_path / "tilted", tilt_deg=20.0), allow_gantry_tilt=True)
    measured = measured_mask(vol.geometry, vol.metadata)
    body = segment_organs(vol, organs=["body"], device="cpu").masks["body"]
    assert body.any()
    assert not np.any(body & ~measured), int((body & ~measured).sum())


def test_the_mprs_show_the_unmeasured_wedge_as_outside_the_scan(tmp_path):
    import matplotlib.image as mpimg

    from pipeline.reconstruction.render import render_mip, render_mpr
    from pipeline.reconstruction.render_planes import OUTSIDE_SCAN_RGB

    def outside_pixels(vol, out: Path) -> int:
        paths = render_mpr(vol, {"body": _body(vol)}, out, stem="case")
        colour = np.asarray(OUTSIDE_SCAN_RGB, dtype=np.float32)
        return sum(int(np.all(np.abs(mpimg.imread(p)[..., :3] - colour) < 2 / 255, axis=-1).sum()) for p in paths)

    def outside_mip_pixels(vol, out: Path) -> int:
        paths = render_mip(vol, out, stem="case", slab_mm=4.0, n_slabs=1)
        colour = np.asarray(OUTSIDE_SCAN_RGB, dtype=np.float32)
        return sum(int(np.all(np.abs(mpimg.imread(p)[..., :3] - colour) < 2 / 255, axis=-1).sum()) for p in paths)

    tilted = load_series(_write(tmp_path / "tilted", tilt_deg=20.0), allow_gantry_tilt=True)
    straight = load_series(_write(tmp_path / "straight", tilt_deg=0.0))
    assert outside_pixels(tilted, tmp_path / "png_tilted") > 1000
    assert outside_pixels(straight, tmp_path / "png_straight") == 0
    assert outside_mip_pixels(tilted, tmp_path / "mip_tilted") > 1000
    assert outside_mip_pixels(straight, tmp_path / "mip_straight") == 0


def test_an_entry_without_shifts_reads_as_before_with_a_warning_to_ingest_again(tmp_path, caplog):
    """A tilt-corrected volume of a cache entry written before the shifts were recorded: no mask (the wedge stays
    air, as it was), and a warning naming what is lost and the fix; a volume resampled onto another grid: no mask."""
    vol = load_series(_write(tmp_path / "tilted", tilt_deg=20.0), allow_gantry_tilt=True)
    older = {k: v for k, v in vol.metadata.items() if k != TILT_SHIFTS_KEY}
    with caplog.at_level("WARNING", logger="pipeline.ingest.measured"):
        assert measured_mask(vol.geometry, older) is None
    assert "ingest the case again" in caplog.text and "not flagged" in caplog.text, caplog.text
    other = vol.geometry.__class__(shape=(N, 8, 8), spacing=vol.geometry.spacing, origin=vol.geometry.origin)
    assert measured_mask(other, vol.metadata) is None


def test_the_finding_pngs_show_the_unmeasured_wedge_as_outside_the_scan(tmp_path):
    """The finding PNG's plane and MIP slab are the grid's: its wedge is painted as the MPRs paint it, not as air."""
    import io

    import matplotlib.image as mpimg

    from pipeline.detection.figures import axial_view, finding_png
    from pipeline.detection.findings import Finding
    from pipeline.reconstruction.render_planes import OUTSIDE_SCAN_RGB

    def painted(vol) -> tuple[int, int]:
        ijk = (COLS // 2, vol.shape[1] // 2, N // 2)
        c = vol.geometry.index_to_lps(np.array([ijk], dtype=np.float64))[0]
        f = Finding(
            center_lps=tuple(c),
            box_min_lps=tuple(c - 3.0),
            box_max_lps=tuple(c + 3.0),
            diameter_mm=6.0,
            score=0.9,
            voxel_ijk=ijk,
            slice_number=N // 2 + 1,
        )
        axial, mip, _, _ = axial_view(vol, f)
        png = mpimg.imread(io.BytesIO(finding_png(vol, f)), format="png")[..., :3]
        png = png[: int(0.6 * png.shape[0])]  # the plane and the slab, not the close-ups, which reach past a short series
        colour = np.asarray(OUTSIDE_SCAN_RGB, dtype=np.float32)
        return int(np.isnan(axial).sum() + np.isnan(mip).sum()), int(np.all(np.abs(png - colour) < 2 / 255, axis=-1).sum())

    tilted = load_series(_write(tmp_path / "tilted", tilt_deg=20.0), allow_gantry_tilt=True)
    straight = load_series(_write(tmp_path / "straight", tilt_deg=0.0))
    nan_tilted, px_tilted = painted(tilted)
    assert nan_tilted > 0 and px_tilted > 100
    assert painted(straight) == (0, 0)


def test_show_paints_the_unmeasured_wedge_as_the_mprs_do_and_outlines_no_such_organ(tmp_path):
    """show() of a tilt-corrected series draws the true axial plane resampled as the MPRs are: the wedge no image
    measured is painted 'not scanned' in their colour and legend, not outlined as if it were an organ."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.display import show
    from pipeline.reconstruction.render_planes import OUTSIDE_SCAN_LEGEND, OUTSIDE_SCAN_RGB

    def drawn(vol) -> tuple[list[str], int, int]:
        ax = show(vol, recon={"body": _body(vol)})
        legend = ax.get_legend()
        labels = [t.get_text() for t in legend.get_texts()] if legend is not None else []
        colour = np.asarray(OUTSIDE_SCAN_RGB, dtype=np.float32)
        painted = sum(
            int(np.all(np.abs(np.asarray(im.get_array())[..., :3] - colour) < 1e-3, axis=-1).sum()) for im in ax.images[1:]
        )
        contours = len(ax.collections)
        plt.close("all")
        return labels, painted, contours

    tilted = load_series(_write(tmp_path / "tilted", tilt_deg=20.0), allow_gantry_tilt=True)
    straight = load_series(_write(tmp_path / "straight", tilt_deg=0.0))
    labels, painted, contours = drawn(tilted)
    assert labels == [OUTSIDE_SCAN_LEGEND, "body"], labels  # first, as in the MPRs' legends
    assert painted > 20 and contours == 1, (painted, contours)
    assert drawn(straight) == (["body"], 0, 1)
