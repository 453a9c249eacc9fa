"""Wrong argument values at the notebook API, refused with a ctpipe error naming the argument, the value and the fix
before any work (no model loaded, nothing segmented), rather than a library's own exception from deep inside."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import pipeline as ctp
from pipeline.config import load_config
from pipeline.detection import detect
from pipeline.errors import (
    CacheError,
    ConfigError,
    CtpipeError,
    DicomError,
    DicomWriteError,
    GeometryError,
    LoaderError,
    ReconstructionError,
    RunStoreError,
)
from pipeline.ingest import load_series
from pipeline.reconstruction import reconstruct
from pipeline.runner.run_config import effective_config
from pipeline.runner.stage import Stage
from pipeline.volume import CTVolume, Geometry

_TINY = CTVolume(np.full((4, 4, 4), -1000, np.int16), Geometry(shape=(4, 4, 4), spacing=(1, 1, 1), origin=(0, 0, 0)))


def _text(err: pytest.ExceptionInfo) -> str:
    assert isinstance(err.value, CtpipeError) and err.value.fix, str(err.value)
    return str(err.value)


@pytest.mark.parametrize("call", [detect, reconstruct], ids=["detect", "reconstruct"])
def test_an_unknown_device_is_named_with_the_devices_there_are(call):
    with pytest.raises(LoaderError) as err:
        call(_TINY, device="tpu")
    text = _text(err)
    assert text.startswith("device: unknown device 'tpu'") and "cpu, gpu or cuda" in text and "cuda:N" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine on which torch sees no CUDA GPU")
@pytest.mark.parametrize("call", [detect, reconstruct], ids=["detect", "reconstruct"])
def test_cuda_without_a_gpu_says_so(call):
    with pytest.raises(LoaderError) as err:
        call(_TINY, device="cuda")
    assert "device 'cuda' was asked for but torch sees no CUDA GPU" in _text(err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine on which torch sees no CUDA GPU")
@pytest.mark.parametrize("call", [detect, reconstruct], ids=["detect", "reconstruct"])
def test_a_gpu_given_by_number_is_that_gpu(call):
    """``device=0`` (torch's GPU 0) was taken as no device given: it ran on the CPU without a word."""
    with pytest.raises(LoaderError) as err:
        call(_TINY, device=0)
    assert "device 0 (cuda:0) was asked for but torch sees no CUDA GPU" in _text(err)


def test_detect_refuses_what_is_not_a_volume_before_loading_the_model(monkeypatch):
    import pipeline.detection.infer as infer

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded for an argument that cannot be detected on")

    monkeypatch.setattr(infer, "Detector", no_model)
    monkeypatch.setattr(infer, "_DETECTORS", {})
    with pytest.raises(CtpipeError, match="must be a CTVolume, got ndarray"):
        detect(_TINY.array)
    with pytest.raises(ConfigError, match=r"^detector: must be a Detector, got str 'models/lung'"):
        detect(_TINY, detector="models/lung")  # was: AttributeError: 'str' object has no attribute 'detect'


@pytest.mark.parametrize(
    ("path", "fix"),
    [
        (["a", "b"], "load one series at a time: load_series(folder); scan_directory(folders)"),
        (5, "pass the folder holding the series"),
    ],
)
def test_load_series_names_a_path_that_is_not_one_path(path, fix):
    with pytest.raises(DicomError) as err:
        load_series(path)
    text = _text(err)
    assert text.startswith(f"path: must be one folder or file (a str or a pathlib.Path), got {type(path).__name__}")
    assert fix in err.value.fix


def test_load_series_given_what_is_already_loaded_says_how_to_use_it():
    """An array, a SimpleITK image or a volume is not read again: the fix says how to make (or that it is) a volume,
    and the message gives an array's shape and type, not its values (200 characters of them, over several lines)."""
    import SimpleITK as sitk

    array = np.zeros((48, 64, 64), np.float32)
    with pytest.raises(DicomError) as err:
        load_series(array)
    assert _text(err) == (
        "path: must be one folder or file (a str or a pathlib.Path), got ndarray of shape (48, 64, 64), dtype float32. "
        "Fix: an array holds no geometry to read: wrap the HU array [k, j, i] with its grid: "
        "CTVolume(array, Geometry(shape, spacing=(i, j, k) mm, origin=LPS mm))"
    )
    with pytest.raises(DicomError) as err:
        load_series(sitk.GetImageFromArray(array))
    assert "got Image" in _text(err) and err.value.fix == "build the volume from the image: CTVolume.from_sitk(image)"
    with pytest.raises(DicomError) as err:
        load_series(_TINY)
    assert err.value.fix == "the CTVolume is already loaded: pass it to detect, reconstruct or show as it is"


@pytest.mark.parametrize("tolerance", [-1, 1.5, float("nan"), "2%"])
def test_load_series_names_a_spacing_tolerance_that_is_not_a_fraction(tmp_path, tolerance):
    with pytest.raises(DicomError) as err:
        load_series(tmp_path, spacing_tolerance=tolerance)
    assert f"spacing_tolerance={tolerance!r} is not a fraction from 0 to 1" in _text(err)


def test_write_phantom_series_of_a_volume_points_to_write_dicom_series(tmp_path):
    from pipeline import write_phantom_series

    out = tmp_path / "case"
    with pytest.raises(DicomWriteError) as err:
        write_phantom_series(_TINY, out)
    assert _text(err).startswith("phantom: must be a Phantom (a volume with its ground truth), got CTVolume")
    assert err.value.fix.startswith(f"write a volume without ground truth with write_dicom_series(volume, {str(out)!r})")
    assert not out.exists()


def test_a_phantom_of_a_negative_seed_is_written_as_any_other(tmp_path):
    """generate_phantom takes any whole number as its seed; was: write_phantom_series of a negative seed's phantom
    stopped with numpy's bare "ValueError: expected non-negative integer" (the file names' random stream)."""
    phantom = ctp.generate_phantom(-3, matrix=64, slices=8, pixel_spacing=2.0, slice_spacing=5.0, n_nodules=0)
    ctp.write_phantom_series(phantom, tmp_path / "plain")
    ctp.write_phantom_series(phantom, tmp_path / "shuffled", quirks=["shuffled_names"])
    for name in ("plain", "shuffled"):
        volume = ctp.load_series(tmp_path / name / "dicom")
        assert volume.series_uid == phantom.volume.series_uid and volume.shape == phantom.volume.shape


@pytest.mark.parametrize("threshold", [5, -0.1, "high", float("nan")])
def test_detect_names_a_score_threshold_that_is_not_a_probability_before_loading_the_model(monkeypatch, threshold):
    import pipeline.detection.infer as infer

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded (and the case searched) for a threshold that is refused")

    monkeypatch.setattr(infer, "Detector", no_model)
    monkeypatch.setattr(infer, "_DETECTORS", {})
    with pytest.raises(CtpipeError) as err:
        detect(_TINY, score_threshold=threshold)
    assert _text(err).startswith(f"score_threshold: score threshold {threshold!r} is not in [0, 1]")
    assert err.value.fix == "pass a probability between 0 and 1, or None for the model's operating point"


@pytest.mark.parametrize(
    ("call", "error", "start"),
    [
        (lambda: ctp.CaseCache(5), CacheError, "root: must be a folder (a str or a pathlib.Path), got int 5"),
        (
            lambda: ctp.open_run(5),
            RunStoreError,
            "run_dir: must be a folder (a str or a pathlib.Path), got int 5",
        ),
        (lambda: ctp.scan_directory(5), DicomError, "path: must be a folder or file, or a list of them"),
        (lambda: ctp.scan_directory(["a", 3]), DicomError, "path: must be a folder or file (a str"),
        # were: TypeError: 'int' object is not iterable / expected str, bytes or os.PathLike object, not int
        (lambda: ctp.run_batch(5, out="r"), ConfigError, "sources: must be a folder or file, or a list of them (a str"),
        (lambda: ctp.run_batch(["a", 5], out="r"), ConfigError, "sources: must be a folder or file (a str"),
        (lambda: ctp.run_batch(["a"], out=5), ConfigError, "out: must be the run folder (a str or a pathlib.Path), got int 5"),
        (lambda: ctp.run_batch(["a"], out="r", config=5), ConfigError, "config: must be a YAML config file"),
        (lambda: load_config(5), ConfigError, "config: must be a YAML config file (a str or a pathlib.Path), got int 5"),
    ],
    ids=[
        "CaseCache",
        "open_run",
        "scan_directory",
        "scan_directory list",
        "run_batch sources",
        "run_batch source list",
        "run_batch out",
        "run_batch config",
        "load_config",
    ],
)
def test_a_folder_argument_that_is_not_a_path_is_named(call, error, start):
    with pytest.raises(error) as err:
        call()
    assert _text(err).startswith(start)


@pytest.mark.parametrize(
    ("stages", "words"),
    [
        (["ingest", "detect"], "stages: must be a list of Stage objects, one is str 'ingest'"),
        ("detect", "stages: must be a list of Stage objects, got str 'detect'"),
        ([Stage], "stages: holds the class Stage, not a stage made from it"),
    ],
    ids=["names", "one name", "class"],
)
def test_run_batch_names_stages_that_are_not_stage_objects_before_the_run_folder(tmp_path, stages, words):
    # was: AttributeError: 'str' object has no attribute 'group', after the run folder was made and the sources scanned
    (tmp_path / "scans").mkdir()
    with pytest.raises(ConfigError) as err:
        ctp.run_batch([tmp_path / "scans"], out=tmp_path / "r", stages=stages)
    assert _text(err).startswith(words) and not (tmp_path / "r").exists()


def test_run_batch_reads_numpy_numbers_as_the_numbers_they_are():
    # was: runner.workers = np.int64(2) is not allowed; allowed: an integer (and a numpy float32 threshold likewise)
    cfg = effective_config(None, {"workers": np.int64(2), "detector.score_threshold": np.float32(0.25)})
    assert cfg.runner.workers == 2 and type(cfg.runner.workers) is int
    assert cfg.detector.score_threshold == 0.25 and type(cfg.detector.score_threshold) is float
    with pytest.raises(ConfigError, match=r"runner.workers = np.float64\(1.5\) is not allowed"):
        effective_config(None, {"workers": np.float64(1.5)})


# -- '~' in a path: a shell expands it, Python does not ---------------------------------------------------------------
@pytest.fixture()
def home(tmp_path, monkeypatch):
    """A home folder holding a series folder ``scans`` (empty: the path, not its content, is what is checked), with
    the working folder elsewhere."""
    (tmp_path / "home" / "scans").mkdir(parents=True)
    (tmp_path / "work").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path / "home"


@pytest.mark.parametrize(
    "call",
    [
        lambda: load_series("~/scans"),
        lambda: ctp.scan_directory("~/scans"),
        lambda: ctp.open_run("~/scans"),
        lambda: ctp.run_batch(["~/scans"], out="runs/r1"),
        lambda: ctp.run_batch(["."], out="runs/r1", config="~/scans"),
    ],
    ids=["load_series", "scan_directory", "open_run", "run_batch sources", "run_batch config"],
)
def test_a_path_starting_with_a_tilde_that_is_not_found_says_python_does_not_expand_it(home, call):
    """``load_series("~/scans")`` said only "no such file or folder. Fix: check the path" of a folder that is there."""
    with pytest.raises(CtpipeError) as err:
        call()
    assert f"Python does not expand '~' as a shell does: pass os.path.expanduser('~/scans') ({home / 'scans'})" in _text(err)


def test_run_batch_refuses_a_run_folder_starting_with_a_tilde_before_making_it(home):
    """``out="~/runs/r1"`` made a folder named '~' in the working folder (which ``rm -rf ~`` then 'cleans')."""
    with pytest.raises(CtpipeError) as err:
        ctp.run_batch([str(home / "scans")], out="~/runs/r1")
    assert _text(err).startswith("out: ~/runs/r1 starts with '~', which Python does not expand")
    assert f"os.path.expanduser('~/runs/r1') ({home / 'runs' / 'r1'})" in err.value.fix
    assert not any(Path.cwd().iterdir()) and not (home / "runs").exists()


def test_files_written_under_a_tilde_path_are_refused_instead_of_made_under_a_folder_named_tilde(home, monkeypatch):
    """``findings.write_json("~/f.json")``, ``reconstruct(..., out_dir="~/recon")`` and ``run.report(out="~/rep")``
    wrote into a new folder named '~' in the working folder; reconstruct says so before segmenting anything."""
    import pipeline.reconstruction.stage as stage
    from pipeline.detection.findings import Findings

    with pytest.raises(CtpipeError) as err:
        Findings([]).write_json("~/out/f.json")
    assert _text(err).startswith("~/out/f.json: ~/out/f.json starts with '~', which Python does not expand")
    assert f"os.path.expanduser('~/out/f.json') ({home / 'out' / 'f.json'})" in err.value.fix

    def no_work(*args, **kwargs):
        raise AssertionError("organs were segmented for an out_dir that cannot be written")

    monkeypatch.setattr(stage, "segment_organs", no_work)
    with pytest.raises(CtpipeError) as err:
        reconstruct(_TINY, out_dir="~/recon")
    assert _text(err).startswith("out_dir: ~/recon starts with '~'")
    from pipeline.runner.report import build_report  # run.report(out=...)

    with pytest.raises(CtpipeError, match=r"^out: ~/rep starts with '~'"):
        build_report([home / "scans"], "~/rep")
    assert not any(Path.cwd().iterdir()) and not any((home / name).exists() for name in ("out", "recon", "rep"))
    (Path.cwd() / "~").mkdir()  # a folder really named '~' here: the path names it, as a shell's '\~' would
    Findings([]).write_json("~/f.json")
    assert (Path.cwd() / "~" / "f.json").is_file()


@pytest.mark.parametrize("name", ["slice.png", "notes.txt"])
def test_load_series_of_one_file_that_is_neither_dicom_nor_an_image_says_what_it_reads(tmp_path, name):
    """The fix was the one for a stray file in a scanned folder: "remove the file from the input folder"."""
    path = tmp_path / name
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200) if name.endswith(".png") else b"a note")
    with pytest.raises(DicomError) as err:
        load_series(path)
    text = _text(err)
    assert text.startswith(f"{path}: not a DICOM file: no 'DICM' marker")
    assert err.value.fix == (
        "pass the folder of a DICOM series, one Enhanced CT (multi-frame) DICOM file, or a NIfTI/MHA/NRRD image "
        "(.nii.gz, .nii, .mha, .mhd, .nrrd)"
    )


@pytest.mark.parametrize("kind", ["zip", "gztar"])
def test_load_series_of_an_archive_says_to_unpack_it(tmp_path, kind):
    """A downloaded data set's archive was called "not a DICOM file: no 'DICM' marker" with no word of unpacking."""
    import shutil

    (tmp_path / "case" / "dicom").mkdir(parents=True)
    (tmp_path / "case" / "dicom" / "a.dcm").write_bytes(b"x")
    archive = Path(shutil.make_archive(str(tmp_path / "case"), kind, tmp_path / "case"))
    with pytest.raises(DicomError) as err:
        load_series(archive)
    assert _text(err).startswith(f"{archive}: an archive ({'ZIP' if kind == 'zip' else 'tar'}), not a DICOM file")
    assert err.value.fix == (
        f"unpack it first, e.g. shutil.unpack_archive({str(archive)!r}, 'folder'), and pass the folder to load_series"
    )
    with pytest.raises(CtpipeError) as err:  # and before a run folder is made
        ctp.run_batch([archive], out=tmp_path / "run")
    assert _text(err).startswith(f"{archive}: an archive ({'ZIP' if kind == 'zip' else 'tar'}), not a DICOM folder or file")
    assert "pass the folder to run_batch" in err.value.fix and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("path", "what"), [("scans/case1", "a DICOM folder"), ("ct.nii.gz", "a NIfTI/MHA/NRRD image"), ("ct.mha", "a NIfTI")]
)
def test_a_path_where_a_volume_belongs_says_how_to_load_it(path, what):
    """A NIfTI path was said to be "(a DICOM folder)"."""
    with pytest.raises(CtpipeError) as err:
        ctp.show(path)
    assert err.value.fix.startswith(f"load it first: volume = pipeline.load_series({path!r}) ({what}")


def test_open_run_takes_what_run_batch_returned(tmp_path):
    """``run = ctp.open_run(ctp.run_batch(...))`` was refused: "must be a folder ..., got RunSummary"."""
    from pipeline.runner.run_summary import RunSummary

    summary = RunSummary(tmp_path / "r1", "20260101T000000Z-abcdef")
    with pytest.raises(RunStoreError) as err:  # the summary's run folder is the one opened (none was written here)
        ctp.open_run(summary)
    assert _text(err).startswith(f"{tmp_path / 'r1' / 'runs.sqlite'}: no run database here: the folder does not exist")


@pytest.mark.parametrize("call", [load_series, ctp.scan_directory], ids=["load_series", "scan_directory"])
@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("keep_identifiers", "no", "keep_identifiers='no' is not True or False"),
        ("allow_gantry_tilt", "yes", "allow_gantry_tilt='yes' is not True or False"),
        ("workers", "4", "workers='4' is not a whole number of threads, 0 or more"),
        ("workers", -1, "workers=-1 is not a whole number of threads, 0 or more"),
        ("rules", "strict", "rules='strict' is not a SelectionRules"),
        ("spacing_tolerance", "2%", "spacing_tolerance='2%' is not a fraction from 0 to 1"),
    ],
)
def test_ingest_options_of_the_wrong_kind_are_refused_naming_them(tmp_path, call, option, value, named):
    """``keep_identifiers="no"`` (a true string) kept the patient's identifiers; ``workers="4"`` and ``rules="strict"``
    raised bare TypeError and AttributeError from deep inside."""
    with pytest.raises(DicomError) as err:
        call(tmp_path, **{option: value})
    assert _text(err).startswith(f"{option}: {named}")


@pytest.mark.parametrize(
    ("call", "option"),
    [
        (detect, "all_candidates"),
        (detect, "restrict_to_lungs"),
        (reconstruct, "render"),
    ],
    ids=["detect all_candidates", "detect restrict_to_lungs", "reconstruct render"],
)
def test_a_switch_given_as_a_string_is_refused_before_any_work(monkeypatch, call, option):
    """``detect(vol, all_candidates="no")`` reported every candidate ("no" is true), silently."""
    import pipeline.detection.infer as infer
    import pipeline.reconstruction.stage as stage

    def no_work(*args, **kwargs):
        raise AssertionError("work was done for an option of the wrong kind")

    monkeypatch.setattr(infer, "Detector", no_work)
    monkeypatch.setattr(infer, "_DETECTORS", {})
    monkeypatch.setattr(stage, "segment_organs", no_work)
    with pytest.raises(CtpipeError) as err:
        call(_TINY, **{option: "no"})
    assert _text(err).startswith(f"{option}: {option}='no' is not True or False")
    assert err.value.fix == f"pass {option}=True or {option}=False"


@pytest.mark.parametrize(
    ("call", "option"), [(detect, "bundle"), (reconstruct, "seg_bundle")], ids=["detect bundle", "reconstruct seg_bundle"]
)
def test_a_bundle_that_is_not_a_path_is_named(call, option):
    """``detect(vol, bundle=5)`` raised "expected str, bytes or os.PathLike object, not int"."""
    from pipeline.errors import BundleError

    with pytest.raises(BundleError) as err:
        call(_TINY, **{option: 5})
    assert _text(err).startswith(f"{option}: must be a MONAI bundle folder (a str or a pathlib.Path), got int 5")


@pytest.mark.parametrize("value", [3, 2.5, object()], ids=["int", "float", "object"])
@pytest.mark.parametrize("call", ["reconstruct", "show"])
def test_findings_of_the_wrong_kind_are_named_before_any_work(call, value):
    """Was: TypeError: 'int' object is not iterable, from inside the findings reader."""
    run = {"reconstruct": lambda: reconstruct(_TINY, findings=value), "show": lambda: ctp.show(_TINY, findings=value)}
    with pytest.raises(ReconstructionError) as err:
        run[call]()
    text = _text(err)
    assert text.startswith("findings: must be a Findings") and type(value).__name__ in text, text
    assert "findings JSON" in err.value.fix


def test_metadata_that_is_not_a_mapping_is_named():
    """Was: TypeError: cannot convert dictionary update sequence element #0 to a sequence."""
    with pytest.raises(GeometryError) as err:
        CTVolume(_TINY.array, _TINY.geometry, metadata=[1])
    assert _text(err).startswith("metadata: must be a mapping of DICOM keywords to values, got list [1]")


def test_an_array_in_another_index_order_than_its_geometry_says_how_to_turn_it():
    """Was: "array shape (6, 5, 4) differs from geometry shape (4, 5, 6)" without a fix, for an array in nibabel's
    [i, j, k] order beside a geometry of the [k, j, i] grid; and no fix for a MONAI channel-first array."""
    from pipeline.volume import LabelMap

    geometry = Geometry(shape=(4, 5, 6), spacing=(1, 1, 2), origin=(0, 0, 0))
    ijk = np.zeros((6, 5, 4), np.int16)
    for build in (CTVolume, LabelMap):
        with pytest.raises(GeometryError) as err:
            build(ijk, geometry)
        assert "array shape (6, 5, 4) differs from geometry shape (4, 5, 6)" in _text(err)
        assert "array.transpose(2, 1, 0)" in err.value.fix and "[k, j, i]" in err.value.fix
        assert build(ijk.transpose(2, 1, 0), geometry).shape == (4, 5, 6)
    with pytest.raises(GeometryError) as err:
        CTVolume(np.zeros((4, 5, 7), np.int16), geometry)
    assert "Geometry(shape=array.shape" in _text(err)
    with pytest.raises(GeometryError) as err:
        CTVolume(ijk[None], geometry)
    assert "array must be 3-D [k, j, i], got shape (1, 6, 5, 4)" in _text(err)
    assert "array[0].transpose(2, 1, 0)" in err.value.fix


def test_label_names_given_the_wrong_way_round_are_named():
    """Was: ValueError: invalid literal for int() with base 10: 'lung_left' for labels={"lung_left": 1}."""
    from pipeline.volume import LabelMap

    array = np.zeros((4, 4, 4), np.uint8)
    with pytest.raises(GeometryError) as err:
        LabelMap(array, _TINY.geometry, labels={"lung_left": 1})
    assert _text(err).startswith("labels: key 'lung_left' (-> 1) is not a label value")
    assert "wrong way round" in err.value.fix
    with pytest.raises(GeometryError) as err:
        LabelMap(array, _TINY.geometry, labels=["lung_left"])
    assert _text(err).startswith("labels: must map each label value to its name, got list")
    kept = LabelMap(array, _TINY.geometry, labels={1: "lung_left", np.uint8(2): "lung_right", "3": "airway"})
    assert dict(kept.labels) == {1: "lung_left", 2: "lung_right", 3: "airway"}


@pytest.mark.parametrize(
    ("call", "start", "fix"),
    [
        # were: ValueError: could not convert string to float: 'abc' (numpy), without the argument or a fix
        (lambda: _TINY.index_to_lps("abc"), "voxel indices (i, j, k) must be numbers, got str 'abc'", "3 numbers"),
        (lambda: _TINY.lps_to_index([[0, 0, "x"]]), "LPS points (x, y, z) in mm must be numbers", "3 numbers"),
        # was: ValueError: order must be 'linear' or 'nearest', got 'cubic' (no fix)
        (lambda: _TINY.resample(2, order="cubic"), "order: 'cubic' is not an interpolation order", "order='nearest'"),
    ],
    ids=["index_to_lps", "lps_to_index", "resample order"],
)
def test_points_and_resampling_options_of_the_wrong_kind_are_named(call, start, fix):
    with pytest.raises(GeometryError) as err:
        call()
    assert _text(err).startswith(start) and fix in err.value.fix, str(err.value)


def test_detect_names_a_case_id_that_is_not_text_before_loading_the_model(monkeypatch):
    """A number as ``case_id`` would name the findings ``3`` and mismatch the runner's text ids: refused, with the fix."""
    import pipeline.detection.infer as infer

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded for a case_id that is not text")

    monkeypatch.setattr(infer, "Detector", no_model)
    monkeypatch.setattr(infer, "_DETECTORS", {})
    with pytest.raises(ConfigError) as err:
        detect(_TINY, case_id=3)
    assert "case_id=3 is not text" in _text(err)
    assert "case_id='3'" in err.value.fix


def test_load_series_names_a_series_uid_that_is_not_text(tmp_path):
    """An int UID is not looked up as "no series 5" after a whole scan: it is refused at once, naming the value."""
    with pytest.raises(DicomError) as err:
        load_series(tmp_path, series_uid=5)
    assert "series_uid=5 is not text" in _text(err)


@pytest.mark.parametrize(
    "call",
    [
        lambda: ctp.run_batch(["scans"], out=""),
        lambda: ctp.run_batch(["scans"], out=Path(" ")),
        lambda: ctp.run_batch([""], out="runs/r1"),
        lambda: ctp.load_series(""),
        lambda: ctp.CaseCache(""),
    ],
    ids=["run_batch out", "run_batch out blank", "run_batch source", "load_series", "CaseCache"],
)
def test_an_empty_path_is_refused_before_anything_is_written(tmp_path, monkeypatch, call):
    """``run_batch(srcs, out=os.environ.get("RUN_DIR", ""))``: an empty path is the current folder, and the run wrote
    its folder (cases, cache, report, runs.sqlite) there."""
    (tmp_path / "scans").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CtpipeError) as err:
        call()
    assert "is empty (" in _text(err) and f"names the current folder ({tmp_path})" in _text(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scans"]
