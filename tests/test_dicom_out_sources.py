"""Source series for the DICOM results: each volume slice matched to its source image (LPS mm), bad sources.

Also holds the cases and validators the other ``test_dicom_out_*`` modules share: small phantom series
(HFS, feet-first, prone, multi-frame), findings and nodule masks from the phantom's truth, and the
``dciodvfy`` / ``dsrdump`` runners (installed by ``scripts/install_dicom_tools.sh``).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
from pydicom.uid import generate_uid

from pipeline.detection.findings import Finding
from pipeline.dicom_out import SourceSeries, read_source_series
from pipeline.errors import SourceMismatchError
from pipeline.ingest import load_series
from pipeline.phantom import Confounders, generate_phantom
from pipeline.phantom.dicom_writer import write_phantom_case
from pipeline.reconstruction.nodules import NoduleResult
from pipeline.volume import CTVolume
from tests._support.dicom import write_series

POSITIONS = [("HFS", False), ("FFS", False), ("HFP", False), ("HFS", True)]
ORGANS = ("body", "lung_left", "lung_right", "airway", "bone")


@dataclass
class Case:
    """A phantom written as DICOM and read back: the volume, its source headers, findings and nodule masks (LPS mm)."""

    phantom: Any
    volume: CTVolume
    dicom: Path
    source: SourceSeries
    findings: list[Finding]
    nodules: list[NoduleResult]

    @property
    def organ_masks(self) -> dict[str, np.ndarray]:
        return {name: self.phantom.masks[name] for name in ORGANS}


def phantom_case(
    folder: Path,
    *,
    position: str = "HFS",
    enhanced: bool = False,
    seed: int = 3,
    n_nodules: int = 2,
    matrix: int = 64,
    slices: int = 20,
    pixel_spacing: float = 2.0,
    slice_spacing: float = 5.0,
    confounders: Confounders | None = None,
    **write_options: Any,
) -> Case:
    """A phantom (default 64×64×20, 2 mm pixels, 5 mm slices) with ``n_nodules`` nodules (and ``confounders``), written
    and loaded back.

    Findings: one per nodule at its true centre with a cube box 1.3 times its diameter, scores 0.9, 0.8, ...; plus one
    finding scoring 0.2 (below the 0.5 operating point used by the tests). Nodule results: the phantom's nodule
    labels cropped around each nodule, with their voxel volume and its sphere's diameter.
    """
    ph = generate_phantom(
        seed,
        matrix=matrix,
        slices=slices,
        pixel_spacing=pixel_spacing,
        slice_spacing=slice_spacing,
        n_nodules=n_nodules,
        nodule_diameter_mm=(8.0, 16.0),
        patient_position=position,
        confounders=confounders,
    )
    write_phantom_case(ph, folder, enhanced=enhanced, **write_options)
    main = next(
        ds
        for p in sorted((folder / "dicom").rglob("*"))
        if p.is_file()
        for ds in [pydicom.dcmread(p, stop_before_pixels=True)]
        if int(ds.SeriesNumber) == 1
    )
    vol = load_series(folder / "dicom", series_uid=str(main.SeriesInstanceUID))
    assert vol.geometry.same_grid(ph.volume.geometry)
    source = read_source_series(folder / "dicom", vol)
    g = vol.geometry
    findings, nodules = [], []
    for n, nod in enumerate(ph.nodules):
        c = np.asarray(nod.center_lps)
        r = 1.3 * nod.diameter_mm / 2  # a detector's box is looser than the nodule
        ijk = np.rint(g.lps_to_index(c)).astype(int)
        findings.append(
            Finding(
                tuple(c),
                tuple(c - r),
                tuple(c + r),
                nod.diameter_mm,
                0.9 - 0.1 * n,
                (int(ijk[0]), int(ijk[1]), int(ijk[2])),
                int(ijk[2]) + 1,
            )
        )
        mask = ph.nodule_labels == n + 1
        idx = np.argwhere(mask)
        lo, hi = idx.min(0), idx.max(0) + 1
        crop = g.cropped(lo[::-1].tolist(), hi[::-1].tolist())
        volume_mm3 = float(mask.sum() * np.prod(g.spacing))
        nodules.append(
            NoduleResult(
                index=n,
                center_lps=tuple(c),
                volume_mm3=volume_mm3,
                diameter_mm=float(np.cbrt(6 * volume_mm3 / np.pi)),
                mask=mask[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]],
                geometry=crop,
            )
        )
    mid = (g.shape[2] // 2, g.shape[1] // 2, g.shape[0] // 2)
    c = g.index_to_lps(mid)
    findings.append(Finding(tuple(c), tuple(c - 3), tuple(c + 3), 6.0, 0.2, mid, mid[2] + 1))
    return Case(ph, vol, folder / "dicom", source, findings, nodules)


# --- validators -----------------------------------------------------------------------------------------
def dicom_tool(name: str) -> str:
    """The path of ``dciodvfy`` / ``dsrdump`` / ``dcmdump``, or skip (naming the install script) when it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed: run `bash scripts/install_dicom_tools.sh`")
    return path


def dciodvfy(path: Path) -> tuple[list[str], list[str]]:
    """(errors, warnings) that dicom3tools' ``dciodvfy`` reports for ``path``."""
    result = subprocess.run([dicom_tool("dciodvfy"), str(path)], capture_output=True, timeout=120)
    # it quotes values in the file's own character set, which need not be UTF-8
    lines = (result.stdout + result.stderr).decode("utf-8", errors="replace").splitlines()
    return [x for x in lines if x.startswith("Error")], [x for x in lines if x.startswith("Warning")]


def assert_valid(path: Path, *, allowed_warnings: tuple[str, ...] = ("<99CTPIPE>",)) -> None:
    """No dciodvfy error; every warning mentions one of ``allowed_warnings`` (the private coding scheme by default)."""
    errors, warnings = dciodvfy(path)
    assert errors == [], errors
    unexpected = [w for w in warnings if not any(a in w for a in allowed_warnings)]
    assert unexpected == [], unexpected


# --- tests ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("position", "enhanced"), POSITIONS, ids=["HFS", "FFS", "HFP", "HFS-multiframe"])
def test_every_slice_is_matched_to_its_source_image(tmp_path, position, enhanced):
    case = phantom_case(tmp_path, position=position, enhanced=enhanced)
    src, g = case.source, case.volume.geometry
    assert len(src) == g.shape[0]
    assert src.multiframe == enhanced
    assert src.frame_of_reference_uid == case.phantom.volume.metadata["FrameOfReferenceUID"]
    expected = g.index_to_lps(np.stack([np.zeros(g.shape[0]), np.zeros(g.shape[0]), np.arange(g.shape[0])], axis=1))
    np.testing.assert_allclose(src.positions, expected, atol=1e-3)
    if enhanced:
        assert src.frame_numbers == tuple(range(1, g.shape[0] + 1))  # the phantom writes frame k + 1 at slice k
        assert len(set(src.sop_instance_uids)) == 1
    else:
        # the phantom writes slice k as InstanceNumber k + 1 at origin + k * spacing along the normal
        assert [int(ds.InstanceNumber) for ds in src.datasets] == list(range(1, g.shape[0] + 1))
        for k, ds in enumerate(src.datasets):
            assert str(ds.SOPInstanceUID) == src.sop_instance_uids[k]
            np.testing.assert_allclose([float(v) for v in ds.ImagePositionPatient], expected[k], atol=1e-3)
    assert all(not hasattr(ds, "PixelData") for ds in src.datasets)  # headers only


def test_oblique_source_is_matched(tmp_path):
    a, b = np.radians(20), np.radians(15)  # double oblique: 20° about z, then 15° about x
    rz = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    rx = np.array([[1, 0, 0], [0, np.cos(b), -np.sin(b)], [0, np.sin(b), np.cos(b)]])
    r = rz @ rx
    paths = write_series(tmp_path / "dicom", n=8, rows=16, cols=24, orientation=(*r[:, 0], *r[:, 1]), step=2.0)
    vol = load_series(tmp_path / "dicom")
    assert not np.allclose(vol.geometry.direction, np.eye(3))
    src = read_source_series(list(reversed(paths)), vol)  # a list of files, in any order
    ordered = [str(pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID) for p in paths]
    assert list(src.sop_instance_uids) == ordered


def test_other_series_in_the_folder_are_ignored(tmp_path):
    case = phantom_case(tmp_path, quirks=["second_series", "localizer"])
    assert len(case.source) == case.volume.shape[0]
    assert {str(ds.SeriesInstanceUID) for ds in case.source.datasets} == {case.volume.series_uid}


def test_missing_slice_is_named(tmp_path):
    case = phantom_case(tmp_path)
    files = sorted(case.dicom.rglob("*.dcm"))
    files[7].unlink()
    with pytest.raises(SourceMismatchError, match=r"1 of 20 volume slices have no source image, first slice 7"):
        read_source_series(case.dicom, case.volume)


def test_duplicate_image_is_named(tmp_path):
    case = phantom_case(tmp_path)
    path = sorted(case.dicom.rglob("*.dcm"))[4]
    ds = pydicom.dcmread(path)
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.save_as(case.dicom / "copy.dcm", enforce_file_format=True)
    with pytest.raises(SourceMismatchError, match=r"two source images lie at slice 4 .*copy\.dcm"):
        read_source_series(case.dicom, case.volume)


def test_files_of_another_series_are_refused(tmp_path):
    case = phantom_case(tmp_path / "a")
    other = phantom_case(tmp_path / "b", seed=4)
    with pytest.raises(SourceMismatchError, match="no source file belongs to the volume's series"):
        read_source_series(other.dicom, case.volume)


def test_image_without_sop_instance_uid_is_named(tmp_path):
    case = phantom_case(tmp_path)
    path = sorted(case.dicom.rglob("*.dcm"))[3]
    ds = pydicom.dcmread(path)
    del ds.SOPInstanceUID
    ds.save_as(path, enforce_file_format=True)
    with pytest.raises(SourceMismatchError, match="has no SOPInstanceUID") as info:
        read_source_series(case.dicom, case.volume)
    assert path.name in str(info.value)


def strip_attributes(folder: Path, keywords: tuple[str, ...]) -> None:
    """Remove ``keywords`` from every DICOM file under ``folder`` (in place)."""
    for path in sorted(folder.rglob("*.dcm")):
        ds = pydicom.dcmread(path)
        for kw in keywords:
            if kw in ds:
                delattr(ds, kw)
        ds.save_as(path, enforce_file_format=True)


def without_uids(volume: CTVolume) -> CTVolume:
    """``volume`` without the study and frame-of-reference UIDs in its metadata."""
    drop = ("FrameOfReferenceUID", "StudyInstanceUID")
    return CTVolume(volume.array, volume.geometry, metadata={k: v for k, v in volume.metadata.items() if k not in drop})


NO_IDENTITY = (
    "FrameOfReferenceUID",
    "StudyInstanceUID",
    "PatientName",
    "PatientID",
    "PatientBirthDate",
    "PatientSex",
    "StudyDate",
    "StudyTime",
    "StudyID",
    "AccessionNumber",
    "ReferringPhysicianName",
)


@pytest.mark.parametrize("enhanced", [False, True], ids=["classic", "multiframe"])
def test_missing_frame_of_reference_and_patient_attributes_are_generated(tmp_path, caplog, enhanced):
    case = phantom_case(tmp_path, enhanced=enhanced)
    strip_attributes(case.dicom, NO_IDENTITY)
    volume = without_uids(case.volume)
    with caplog.at_level(logging.WARNING, logger="pipeline.dicom_out"):
        src = read_source_series(case.dicom, volume)
    assert {"FrameOfReferenceUID", "StudyInstanceUID", "PatientID"} <= set(src.generated)
    assert src.frame_of_reference_uid.startswith("2.25.") and src.study_instance_uid.startswith("2.25.")
    assert all(str(ds.FrameOfReferenceUID) == src.frame_of_reference_uid for ds in src.datasets)
    assert src.patient_study()["PatientID"] == ""
    text = caplog.text
    assert "has no FrameOfReferenceUID" in text and "PatientName" in text
    # the same series gives the same generated UIDs (SR and SEG written apart agree)
    again = read_source_series(case.dicom, volume)
    assert (again.frame_of_reference_uid, again.study_instance_uid) == (src.frame_of_reference_uid, src.study_instance_uid)


def _write_results(case: Any, source: SourceSeries, out: Path) -> dict[str, Path]:
    """The SR and SEG of the phantom ``case`` from the headers ``source``."""
    from pipeline.dicom_out import write_dicom_outputs

    return write_dicom_outputs(
        out,
        source=source,
        volume=case.volume,
        findings=case.findings,
        organ_masks=case.organ_masks,
        nodules=case.nodules,
        model_name="m",
        model_version="1",
        score_threshold=0.5,
    )


#: values seen in archives that DICOM results cannot repeat (keyword: VR, value)
MALFORMED = {
    "PatientBirthDate": ("DA", "1970-01-01"),
    "StudyTime": ("TM", "10:10:10"),
    "PatientSex": ("CS", "U"),
    "PatientAge": ("AS", "45 years"),
}


def test_without_identifiers_clears_names_ids_comments_and_physicians(tmp_path):
    """keep_identifiers=False: the SR and SEG hold none of the patient's or staff's names, ids or free-text history
    (PatientComments and the physicians among them); the study's UIDs stay, so the results still file with it."""
    case = phantom_case(tmp_path / "case")
    marked = {
        "PatientName": "ZZNAME^X",
        "PatientID": "ZZID1",
        "PatientComments": "ZZCOMMENT",
        "AdditionalPatientHistory": "ZZHISTORY",
        "RequestingPhysician": "ZZDOC^REQ",
        "NameOfPhysiciansReadingStudy": "ZZDOC^READ",
        "InstitutionName": "ZZHOSPITAL",
    }
    for path in sorted(case.dicom.rglob("*.dcm")):
        ds = pydicom.dcmread(path)
        for kw, value in marked.items():
            setattr(ds, kw, value)
        ds.save_as(path, enforce_file_format=True)
    source = read_source_series(case.dicom, case.volume)
    clean = source.without_identifiers()
    for ds in clean.datasets:
        assert not [kw for kw in marked if str(ds.get(kw, "") or "")], "identifiers left in the headers"
        assert ds.StudyInstanceUID == source.datasets[0].StudyInstanceUID
    assert source.datasets[0].PatientComments == "ZZCOMMENT"  # a copy: the source itself is unchanged


def test_malformed_patient_and_study_values_are_emptied_and_never_quoted(tmp_path, caplog):
    """A birth date as 1970-01-01, a time with colons, PatientSex U: the SR and SEG are still written, valid, with
    those attributes empty (type 2); the warning names the attributes, never a value. PatientAge is not repeated in
    the results whatever its value."""
    import warnings

    case = phantom_case(tmp_path / "case")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydicom warns (and logs) as they are set and written
        for path in sorted(case.dicom.rglob("*.dcm")):
            ds = pydicom.dcmread(path)
            for kw, (vr, value) in MALFORMED.items():
                ds[kw] = pydicom.DataElement(pydicom.datadict.tag_for_keyword(kw), vr, value)
            ds.save_as(path, enforce_file_format=True)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pipeline.dicom_out"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        source = read_source_series(case.dicom, case.volume)
        paths = _write_results(case, source, tmp_path / "out")
    assert set(MALFORMED) - {"PatientAge"} <= set(source.generated)
    said = caplog.text + "".join(str(w.message) for w in caught)
    assert "PatientBirthDate, PatientSex, StudyTime are not valid DICOM" in caplog.text
    assert not [value for _, value in MALFORMED.values() if value in said]
    for kind in ("sr", "seg"):
        ds = pydicom.dcmread(paths[kind])
        assert (ds.PatientBirthDate, ds.StudyTime, ds.PatientSex) == ("", "", ""), kind
        assert "PatientAge" not in ds and ds.PatientID == case.source.datasets[0].PatientID, kind
    for kind in ("sr", "seg"):  # last: it skips the test where dciodvfy is missing
        assert_valid(paths[kind], allowed_warnings=("<99CTPIPE>", "needed to build DICOMDIR - Study Time"))


@pytest.mark.parametrize(
    ("charset", "name"),
    [
        ("ISO_IR 100", "Müller^Jürgen"),
        ("ISO_IR 192", "李^雷"),
        ("ISO_IR 144", "Иванов^Иван"),
        (["", "ISO 2022 IR 87"], "Yamada^Tarou=山田^太郎=やまだ^たろう"),  # PS3.5 H.3.2: an empty first value
    ],
    ids=["latin1", "utf8", "cyrillic", "japanese"],
)
def test_names_in_the_source_character_set_reach_the_results(tmp_path, charset, name):

    case = phantom_case(tmp_path / "case")
    for path in sorted(case.dicom.rglob("*.dcm")):
        ds = pydicom.dcmread(path)
        ds.SpecificCharacterSet, ds.PatientName = charset, name
        ds.save_as(path, enforce_file_format=True)
    paths = _write_results(case, read_source_series(case.dicom, case.volume), tmp_path / "out")
    for kind in ("sr", "seg"):
        assert str(pydicom.dcmread(paths[kind]).PatientName) == name, kind
    for kind in ("sr", "seg"):  # last: it skips the test where dciodvfy is missing
        assert_valid(paths[kind])


def test_source_of_another_grid_is_refused(tmp_path):
    from pipeline.dicom_out import write_seg

    case = phantom_case(tmp_path)
    other = case.volume.geometry.with_(origin=np.asarray(case.volume.origin) + [0, 0, 2.0])
    moved = CTVolume(case.volume.array, other, metadata=case.volume.metadata)
    with pytest.raises(SourceMismatchError, match=r"slice \d+ of the volume lies 2.000 mm from its source image"):
        write_seg(
            tmp_path / "seg.dcm",
            source=case.source,
            volume=moved,
            score_threshold=0.5,
            organ_masks={"lung_left": case.phantom.masks["lung_left"]},
        )
