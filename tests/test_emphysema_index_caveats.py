"""The emphysema index (LAA-950) is marked unreliable, with the cause, where the series lies outside the lung-density
protocols: interpolated by ingest (gantry tilt correction), slices thicker than 1.5 mm, a sharp kernel. Its value is
never changed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.ingest import load_series
from pipeline.phantom import generate_phantom
from pipeline.reconstruction.lung_density import EMPHYSEMA_SLICE_MM
from pipeline.reconstruction.measure import lung_measurements
from pipeline.reconstruction.quality import EMPHYSEMA_FIGURES, QualityReport, assess_quality, mark_unreliable

CAVEATS = ("interpolated", "emphysema_slices", "sharp_kernel")


@pytest.fixture(scope="module")
def phantom():
    """A 1.25 mm, STANDARD kernel chest: within the protocols."""
    return generate_phantom(5, matrix=96, pixel_spacing=2.0, slice_spacing=1.25, n_nodules=0)


def _assess(phantom, **metadata) -> QualityReport:
    md = {**phantom.volume.metadata, **metadata}
    return assess_quality(phantom.volume.array, phantom.volume.geometry, phantom.masks, metadata=md)


def test_a_thin_soft_kernel_series_keeps_a_plain_emphysema_index(phantom):
    q = _assess(phantom)
    assert not set(CAVEATS) & set(q.codes)
    assert not set(EMPHYSEMA_FIGURES) & set(q.unreliable)


def test_a_tilt_corrected_volume_marks_its_emphysema_index_as_interpolated(tmp_path: Path):
    """The metadata ingest writes for a tilted series (written to DICOM with a 15 deg tilt and corrected) flags the
    interpolation; the same series untilted does not."""
    from pipeline.phantom.dicom_writer import write_dicom_series

    ph = generate_phantom(3, matrix=64, n_nodules=0, pixel_spacing=2.0, slice_spacing=3.0, slices=24)
    write_dicom_series(ph.volume, tmp_path / "tilted", quirks=["gantry_tilt"])
    write_dicom_series(ph.volume, tmp_path / "straight")
    for name, expected in (("tilted", True), ("straight", False)):
        vol = load_series(tmp_path / name, allow_gantry_tilt=True)
        lungs = np.zeros(vol.shape, dtype=bool)
        q = assess_quality(vol.array, vol.geometry, {"lung_left": lungs, "lung_right": lungs}, metadata=vol.metadata)
        assert q.has("interpolated") is expected, (name, q.codes)
    tilted = load_series(tmp_path / "tilted", allow_gantry_tilt=True)
    empty = np.zeros(tilted.shape, dtype=bool)
    q = assess_quality(tilted.array, tilted.geometry, {"lung_left": empty}, metadata=tilted.metadata)
    (flag,) = [f for f in q.flags if f.code == "interpolated"]
    assert flag.severity == "warning"
    assert "emphysema index" in flag.message and "interpolation" in flag.message
    assert "gantry tilt of" in flag.message and "deg" in flag.message


def test_interpolation_marks_only_the_emphysema_figures_and_keeps_their_values(phantom):
    q = _assess(phantom, GantryTiltCorrectedDeg=15.0)
    assert q.has("interpolated")
    assert set(EMPHYSEMA_FIGURES) <= set(q.unreliable)
    assert "lungs_total_volume_ml" not in q.unreliable
    figures = lung_measurements(phantom.volume.array, phantom.masks, phantom.volume.geometry)
    marked = mark_unreliable(figures, q)
    assert marked["emphysema_index_pct"] == {
        "value": figures["emphysema_index_pct"],
        "reliable": False,
        "reason": "interpolated",
    }
    assert marked["lungs_total_volume_ml"] == figures["lungs_total_volume_ml"]
    assert QualityReport.from_json(q.to_json()).unreliable == q.unreliable


@pytest.mark.parametrize(("thickness", "codes"), [(1.0, ()), (1.5, ()), (2.0, ("emphysema_slices",)), (3.0, ("thick_slices",))])
def test_slices_thicker_than_the_lung_density_protocols_mark_the_emphysema_index(phantom, thickness, codes):
    q = _assess(phantom, SliceThickness=thickness)
    found = tuple(c for c in q.codes if c in ("emphysema_slices", "thick_slices"))
    assert found == codes
    assert (set(EMPHYSEMA_FIGURES) <= set(q.unreliable)) is bool(codes)
    if codes == ("emphysema_slices",):
        (flag,) = [f for f in q.flags if f.code == "emphysema_slices"]
        assert f"2.00 mm > {EMPHYSEMA_SLICE_MM} mm" in flag.message and "emphysema index" in flag.message
        assert flag.severity == "info"  # nothing but the index is in doubt: the case's warnings stay as they were
        assert "emphysema_slices" not in {f.code for f in q.warnings}
        assert mark_unreliable({"emphysema_index_pct": 4.2}, q)["emphysema_index_pct"]["reason"] == "emphysema_slices"


@pytest.mark.parametrize(
    ("kernel", "sharp"),
    [
        ("STANDARD", False),
        ("SOFT", False),
        ("LUNG", True),
        ("BONEPLUS", True),
        ("B31f", False),
        ("B45f", True),
        ("B70f", True),
        (["Br64d", "3"], True),
        (["Br40d", "3"], False),
        ("FC51", True),
        ("FC10", False),
        ("YA", True),
        ("B", False),
        ("mystery", False),
        ("", False),
    ],
)
def test_a_sharp_kernel_marks_the_emphysema_index(phantom, kernel, sharp):
    q = _assess(phantom, ConvolutionKernel=kernel)
    assert q.has("sharp_kernel") is sharp
    assert (set(EMPHYSEMA_FIGURES) <= set(q.unreliable)) is sharp
    if sharp:
        (flag,) = [f for f in q.flags if f.code == "sharp_kernel"]
        assert "ConvolutionKernel" in flag.message and "emphysema index" in flag.message
        assert flag.severity == "warning"


def test_every_cause_is_named_in_the_reason(phantom):
    q = _assess(phantom, GantryTiltCorrectedDeg=15.0, SliceThickness=2.0, ConvolutionKernel="B60f")
    reason = mark_unreliable({"emphysema_index_pct": 1.0}, q)["emphysema_index_pct"]["reason"]
    assert reason == "emphysema_slices, interpolated, sharp_kernel"
