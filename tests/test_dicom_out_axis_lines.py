"""Each nodule's long and short axis drawn as a line on the image it is measured on, as a reader's own measurement is.

The SR holds, per measured nodule, two TID 1410 Planar ROI groups (highdicom
``PlanarROIMeasurementsAndQualitativeEvaluations``): an SCOORD POLYLINE of the axis' two endpoints in the referenced
image's pixel coordinates (column, row; the top left corner of the top left pixel at 0, 0) with the axis' length, and
the nodule's tracking identifier and UID. Mapped back to LPS mm with that image's own ImagePositionPatient,
ImageOrientationPatient and PixelSpacing (highdicom's transformer, not ctpipe's), the endpoints are those of the
reconstruction's nodule results, on feet-first (rows running to the patient's right, slices running inferior), prone
and multi-frame phantoms.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.dicom_out import read_sr_findings, write_sr
from tests.test_dicom_out_sources import POSITIONS, assert_valid, phantom_case


def _case(tmp_path, position: str, enhanced: bool):
    return phantom_case(
        tmp_path / "case",
        position=position,
        enhanced=enhanced,
        n_nodules=2,
        pixel_spacing=0.9,
        slice_spacing=2.0,
        matrix=96,
        slices=40,
    )


def _write(case, path):
    return write_sr(
        path,
        source=case.source,
        volume=case.volume,
        findings=case.findings,
        model_name="demo",
        model_version="1",
        score_threshold=0.5,
        nodules=case.nodules,
    )


def _image_plane(dataset, frame: int | None) -> tuple[list[float], list[float], list[float]]:
    """ImagePositionPatient, ImageOrientationPatient and PixelSpacing of a single-frame image or one frame."""
    if frame is None:
        return (
            [float(v) for v in dataset.ImagePositionPatient],
            [float(v) for v in dataset.ImageOrientationPatient],
            [float(v) for v in dataset.PixelSpacing],
        )
    item = dataset.PerFrameFunctionalGroupsSequence[frame - 1]
    shared = dataset.SharedFunctionalGroupsSequence[0]

    def macro(name: str):
        return (item if name in item else shared)[name][0]

    return (
        [float(v) for v in macro("PlanePositionSequence").ImagePositionPatient],
        [float(v) for v in macro("PlaneOrientationSequence").ImageOrientationPatient],
        [float(v) for v in macro("PixelMeasuresSequence").PixelSpacing],
    )


@pytest.mark.parametrize(("position", "enhanced"), POSITIONS, ids=["HFS", "FFS", "HFP", "HFS-multiframe"])
def test_each_axis_is_a_line_on_its_image_at_the_nodule_results_endpoints(tmp_path, position, enhanced) -> None:
    import highdicom as hd
    import pydicom

    from pipeline.reconstruction.nodule_geometry import axes_json

    case = _case(tmp_path, position, enhanced)
    path = _write(case, tmp_path / "sr.dcm")
    report = hd.sr.srread(path).content
    g = case.volume.geometry
    by_uid = {str(v.tracking_uid): v for v in report.get_volumetric_roi_measurement_groups()}
    assert by_uid
    headers = {
        uid: pydicom.dcmread(p, stop_before_pixels=True)
        for p in case.dicom.rglob("*")
        if p.is_file()
        for uid in [str(pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID)]
    }
    checked = 0
    for nodule in case.nodules:
        results = axes_json(nodule, g, case.volume.metadata)
        (volumetric,) = [v for v in by_uid.values() if v.tracking_identifier == f"Nodule {nodule.index + 1}"]
        uid = str(volumetric.tracking_uid)
        planar = report.get_planar_roi_measurement_groups(tracking_uid=uid)
        assert len(planar) == 2, [str(p.tracking_identifier) for p in planar]
        for group, key, concept in zip(planar, ("long_axis", "short_axis"), ("103339001", "103340004")):
            assert str(group.tracking_identifier) == f"Nodule {nodule.index + 1}"  # the nodule's, with its UID
            assert group.finding_type is not None and group.finding_type.value == "27925004"
            region = group.roi
            assert region.graphic_type == hd.sr.GraphicTypeValues.POLYLINE
            (measurement,) = group.get_measurements()
            assert measurement.name.value == concept
            assert measurement.value == pytest.approx(results[f"{key}_mm"], abs=0.051)
            (image,) = region.ContentSequence  # the image the line is drawn on: that of the nodule results
            assert image.RelationshipType == "SELECTED FROM" and image.ValueType == "IMAGE"
            (ref,) = image.ReferencedSOPSequence
            sop = str(ref.ReferencedSOPInstanceUID)
            k = int(results["axes_slice_k"])
            assert sop == case.source.sop_instance_uids[k]
            frame = int(ref.ReferencedFrameNumber) if "ReferencedFrameNumber" in ref else None
            assert frame == case.source.frame_of(k)
            ipp, iop, spacing = _image_plane(headers[sop], frame)
            to_lps = hd.spatial.ImageToReferenceTransformer(image_position=ipp, image_orientation=iop, pixel_spacing=spacing)
            coords = np.asarray(region.value, dtype=np.float64)
            assert coords.shape == (2, 2)
            rows, columns = int(headers[sop].Rows), int(headers[sop].Columns)
            assert np.all((coords >= 0) & (coords <= [columns, rows]))
            back = to_lps(coords)
            ends = np.asarray(results[f"{key}_lps_mm"], dtype=np.float64)
            half_pixel = 0.5 * min(spacing)
            assert np.linalg.norm(back - ends, axis=1).max() <= half_pixel, (back, ends)
            assert np.linalg.norm(back[1] - back[0]) == pytest.approx(measurement.value, abs=0.1)
            checked += 1
    assert checked == 2 * len(case.nodules)
    assert_valid(path)  # last: it skips where dciodvfy is missing


def test_findings_read_alike_with_and_without_the_axis_lines(tmp_path, monkeypatch) -> None:
    """read_sr_findings reads an SR with the lines as it reads one of an earlier version, without them."""
    import highdicom as hd
    import pandas as pd

    from pipeline.dicom_out import sr

    case = _case(tmp_path, "HFS", False)
    new_path = _write(case, tmp_path / "new.dcm")
    assert hd.sr.srread(new_path).content.get_planar_roi_measurement_groups()
    new = read_sr_findings(new_path)
    monkeypatch.setattr(sr, "_axis_lines", lambda *args, **kwargs: [])
    old_path = _write(case, tmp_path / "old.dcm")
    assert hd.sr.srread(old_path).content.get_planar_roi_measurement_groups() == []
    old = read_sr_findings(old_path)
    assert len(new) == len(old) == len(case.nodules)
    pd.testing.assert_frame_equal(new, old)


def _oblique_source(rows: int, columns: int, spacing: tuple[float, float], orientation: np.ndarray, position):
    from pydicom.dataset import Dataset

    from pipeline.dicom_out import SourceSeries

    ds = Dataset()
    ds.Rows, ds.Columns = rows, columns
    ds.PixelSpacing = [f"{v:.6f}" for v in spacing]
    ds.ImageOrientationPatient = [f"{v:.8f}" for v in orientation]
    ds.ImagePositionPatient = [f"{v:.4f}" for v in position]
    return SourceSeries(
        datasets=(ds,),
        sop_class_uids=("1.2.840.10008.5.1.4.1.1.2",),
        sop_instance_uids=("1.2.3.4",),
        frame_numbers=None,
        positions=np.asarray([position], dtype=np.float64),
        frame_of_reference_uid="1.2.3",
        study_instance_uid="1.2.3.5",
        series_instance_uid="1.2.3.6",
    )


def test_image_coordinates_follow_the_images_own_rows_columns_and_pixel_spacing() -> None:
    """An oblique image (rows to the patient's right and posterior, columns tilted towards the head) of unequal pixel
    spacing (PixelSpacing is row spacing, then column spacing): the coordinates are those highdicom's transformer
    gives, and map back."""
    import highdicom as hd

    from pipeline.dicom_out.image_plane import image_coordinates, image_geometry, image_points_lps

    a, b = np.radians(30.0), np.radians(15.0)
    row = np.array([-np.cos(a), np.sin(a), 0.0])
    col = np.cross(np.array([0.0, 0.0, 1.0]), row)
    col = np.cos(b) * col + np.sin(b) * np.array([0.0, 0.0, -1.0])
    col -= (col @ row) * row
    col /= np.linalg.norm(col)
    orientation = np.concatenate([row, col])
    position = (120.5, -80.25, 310.0)
    spacing = (0.6, 1.1)  # between rows, between columns
    source = _oblique_source(300, 200, spacing, orientation, position)
    plane = image_geometry(source, 0)
    points = image_points_lps(plane, [[0.5, 0.5], [10.25, 3.75], [199.5, 299.5]])
    expected = hd.spatial.ReferenceToImageTransformer(
        image_position=list(position), image_orientation=orientation.tolist(), pixel_spacing=list(spacing)
    )(points)
    np.testing.assert_allclose(image_coordinates(plane, points), expected[:, :2], atol=1e-3)
    np.testing.assert_allclose(expected[0, :2], [0.5, 0.5], atol=1e-3)  # the first pixel's centre at its position
    np.testing.assert_allclose(points[0], position, atol=1e-3)
    far = points[2] + 5.0 * np.cross(row, col)  # off the plane: projected on it
    np.testing.assert_allclose(image_coordinates(plane, far[None, :])[0], [199.5, 299.5], atol=1e-3)


def test_a_tilt_corrected_volumes_axis_lines_lie_on_the_nodule_in_its_own_image(tmp_path) -> None:
    """A series of 20° tilted images, resampled onto a grown grid whose slices are shifted in-plane off their images:
    each line's endpoints, placed with the referenced image's own header, are the axes' (LPS mm, within half a pixel)
    and its midpoint is on the ball's pixels of that image."""
    import highdicom as hd
    import pydicom
    from scipy import ndimage

    from pipeline.detection.findings import Finding
    from pipeline.dicom_out import read_source_series
    from pipeline.ingest import load_series
    from pipeline.reconstruction.nodule_geometry import axes_json
    from tests.test_gantry_tilt import MARKER_HU, _write_tilted

    s = _write_tilted(tmp_path / "dicom", tilt_deg=-20.0, feet_first=False)
    vol = load_series(tmp_path / "dicom", allow_gantry_tilt=True)
    g = vol.geometry
    source = read_source_series(tmp_path / "dicom", vol)
    labels, _count = ndimage.label(vol.array > 0)
    c = s.markers[0]
    ijk = np.rint(g.lps_to_index(c)).astype(int)
    mask = labels == labels[ijk[2], ijk[1], ijk[0]]
    idx = np.argwhere(mask)
    lo, hi = idx.min(0), idx.max(0) + 1
    volume_mm3 = float(mask.sum() * np.prod(g.spacing))
    nodule = {
        "index": 0,
        "mask": mask[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]],
        "geometry": g.cropped(lo[::-1].tolist(), hi[::-1].tolist()),
        "volume_mm3": volume_mm3,
        "diameter_mm": float(np.cbrt(6 * volume_mm3 / np.pi)),
    }
    finding = Finding(tuple(c), tuple(c - 2.5), tuple(c + 2.5), 5.0, 0.9, tuple(int(v) for v in ijk), int(ijk[2]) + 1)
    path = write_sr(
        tmp_path / "sr.dcm",
        source=source,
        volume=vol,
        findings=[finding],
        model_name="test",
        model_version="1",
        score_threshold=0.5,
        nodules=[nodule],
    )
    results = axes_json(nodule, g, vol.metadata)
    planar = hd.sr.srread(path).content.get_planar_roi_measurement_groups()
    assert len(planar) == 2
    images = {str(ds.SOPInstanceUID): ds for p in (tmp_path / "dicom").iterdir() for ds in [pydicom.dcmread(p)]}
    for group, key in zip(planar, ("long_axis", "short_axis")):
        (ref,) = group.roi.ContentSequence[0].ReferencedSOPSequence
        ds = images[str(ref.ReferencedSOPInstanceUID)]
        spacing = [float(v) for v in ds.PixelSpacing]
        to_lps = hd.spatial.ImageToReferenceTransformer(
            image_position=[float(v) for v in ds.ImagePositionPatient],
            image_orientation=[float(v) for v in ds.ImageOrientationPatient],
            pixel_spacing=spacing,
        )
        coords = np.asarray(group.roi.value, dtype=np.float64)
        back = to_lps(coords)
        ends = np.asarray(results[f"{key}_lps_mm"], dtype=np.float64)
        assert np.linalg.norm(back - ends, axis=1).max() <= 0.5 * min(spacing), (back, ends)
        column, row = np.floor(coords.mean(axis=0)).astype(int)  # the pixel holding the line's midpoint
        assert ds.pixel_array[row, column] * float(ds.RescaleSlope) + float(ds.RescaleIntercept) == MARKER_HU
    assert_valid(path, allowed_warnings=("<99CTPIPE>",))


def test_an_axis_outside_its_image_is_not_drawn_and_is_said(tmp_path, caplog) -> None:
    """Endpoints that fall outside the referenced image (a nodule results file of another grid) give no line, and a
    warning naming the nodule and the axis; the other axis is still drawn and the volumetric group still states both."""
    import dataclasses
    import logging

    import highdicom as hd

    from pipeline.dicom_out import reported_findings
    from pipeline.dicom_out.sr import build_sr

    case = _case(tmp_path, "FFS", False)
    g = case.volume.geometry
    (first, *_rest) = reported_findings(case.findings, g, series_uid="1.2.3", score_threshold=0.5, nodules=case.nodules)
    assert first.axes is not None
    far = np.asarray(first.axes.long_lps) + 1000.0 * g.direction[:, 0]  # 1 m along the image's rows
    moved = dataclasses.replace(first, axes=dataclasses.replace(first.axes, long_lps=tuple(map(tuple, far))))
    with caplog.at_level(logging.WARNING, logger="pipeline.dicom_out.sr"):
        sr = build_sr([moved], case.source, model_name="demo", model_version="1", score_threshold=0.5)
    path = tmp_path / "sr.dcm"
    sr.save_as(path)
    planar = hd.sr.srread(path).content.get_planar_roi_measurement_groups()
    assert [g.get_measurements()[0].name.value for g in planar] == ["103340004"]  # the short axis alone
    assert any("Nodule 1" in r.getMessage() and "Long axis" in r.getMessage() for r in caplog.records), caplog.text
