"""Lossy compressed series: LossyImageCompression (0028,2110) or a lossy transfer syntax.

Ingest records the lossy compression in the volume's metadata (with the ratio and method when the files give
them) and as a series warning; the quality flag ``lossy_compressed`` follows from the metadata. Lossless JPEG,
lossless JPEG-LS and uncompressed files are not flagged.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.uid import JPEGLSLossless, JPEGLSNearLossless

from pipeline.cache import CaseCache
from pipeline.cli import main
from pipeline.ingest import load_series
from pipeline.ingest.lossy import is_lossy
from pipeline.reconstruction.quality import FLAGS, assess_quality
from pipeline.volume import LOSSY_NOTE, CTVolume, lossy_detail
from tests._support.dicom import write_series

N = 10  # ingest.min_slices: no short-series warning


def _lossy_attribute(ratio: object = "10", method: object = "ISO_10918_1"):
    def tweak(_k: int, ds: Dataset) -> None:
        ds.LossyImageCompression = "01"
        if ratio is not None:
            ds.LossyImageCompressionRatio = ratio
        if method is not None:
            ds.LossyImageCompressionMethod = method

    return tweak


def _compress(path: Path, syntax: str, **options: object) -> None:
    ds = pydicom.dcmread(path)
    ds.compress(syntax, **options)
    ds.save_as(path)


def near_lossless_without_ratio(paths: list[Path]) -> float:
    """Compress ``paths`` (16-bit unsigned) in place with dcmtk's JPEG-LS near-lossless (1.2.840.10008.1.2.4.81),
    then drop the LossyImageCompressionRatio (0028,2112) dcmtk states, as a source that does not state it (and put
    back the ImageType dcmtk makes DERIVED); returns the largest ratio dcmtk stated (skips when dcmtk is not
    installed)."""
    if shutil.which("dcmcjpls") is None:
        pytest.skip("dcmcjpls (dcmtk) not installed")
    stated = []
    for path in paths:
        image_type = pydicom.dcmread(path, stop_before_pixels=True).ImageType
        subprocess.run(["dcmcjpls", "+en", "+un", str(path), str(path)], check=True, capture_output=True, timeout=60)
        ds = pydicom.dcmread(path)
        assert ds.file_meta.TransferSyntaxUID == JPEGLSNearLossless and ds.LossyImageCompression == "01"
        stated.append(float(ds.LossyImageCompressionRatio))
        del ds.LossyImageCompressionRatio
        ds.ImageType = image_type
        ds.save_as(path)
    return max(stated)


def _flag(vol: CTVolume) -> str | None:
    """The message of the ``lossy_compressed`` quality flag of ``vol`` (None: not flagged)."""
    quality = assess_quality(np.asarray(vol.array), vol.geometry, {}, metadata=vol.metadata)
    return next((f.message for f in quality.flags if f.code == "lossy_compressed"), None)


def test_lossy_attribute_is_recorded_warned_and_flagged(tmp_path, caplog):
    write_series(tmp_path / "s", n=N, tweak=_lossy_attribute())
    with caplog.at_level(logging.WARNING, logger="pipeline.ingest"):
        vol = load_series(tmp_path / "s")
    md = vol.metadata
    assert md["LossyImageCompression"] == "01"
    assert md["LossyImageCompressionRatio"] == [10.0] and md["LossyImageCompressionMethod"] == ["ISO_10918_1"]
    assert md["LossyCompressedFiles"] == N
    message = f"{LOSSY_NOTE} (ratio 10:1 by ISO_10918_1)"
    assert message == "lossy compressed: HU values and small nodules unreliable (ratio 10:1 by ISO_10918_1)"
    assert any(w.startswith(message) and "LossyImageCompression (0028,2110) 01" in w for w in md["warnings"]), md
    assert message in caplog.text
    assert _flag(vol) == message
    assert FLAGS["lossy_compressed"] == ("warning", LOSSY_NOTE)


def test_one_lossy_transfer_syntax_slice_makes_the_series_lossy(tmp_path):
    paths = write_series(tmp_path / "s", n=N, unsigned=True)
    _compress(paths[4], JPEGLSNearLossless, jls_error=3)  # no LossyImageCompression written: the syntax says it
    assert "LossyImageCompression" not in pydicom.dcmread(paths[4], stop_before_pixels=True)
    vol = load_series(tmp_path / "s")
    md = vol.metadata
    assert md["LossyImageCompression"] == "01" and md["LossyCompressedFiles"] == 1
    assert md["LossyImageCompressionMethod"] == ["ISO_14495_1"] and md["LossyImageCompressionRatioEstimated"] is True
    (ratio,) = md["LossyImageCompressionRatio"]  # stated by no file: estimated from the compressed pixel data
    assert ratio > 0
    warning = next(w for w in md["warnings"] if w.startswith(LOSSY_NOTE))
    assert "1 of 10 file(s)" in warning and "1.2.840.10008.1.2.4.81 (JPEG-LS Near-Lossless)" in warning
    assert f"(estimated ratio {ratio:g}:1 by ISO_14495_1)" in warning and "ratio is estimated" in warning
    assert _flag(vol) == f"{LOSSY_NOTE} (estimated ratio {ratio:g}:1 by ISO_14495_1)"


def test_an_unstated_ratio_is_estimated_from_the_compressed_files(tmp_path):
    """Files in a lossy transfer syntax that state no LossyImageCompressionRatio: ingest estimates it per file as the
    uncompressed image size over the encapsulated pixel data's length, and the series takes the largest; the method
    is the syntax's. The estimate agrees with the ratio dcmtk stated when it compressed the files."""
    paths = write_series(tmp_path / "s", n=N, rows=32, cols=32, unsigned=True)
    stated = near_lossless_without_ratio(paths)
    assert "LossyImageCompressionRatio" not in pydicom.dcmread(paths[0], stop_before_pixels=True)
    vol = load_series(tmp_path / "s")
    md = vol.metadata
    assert md["LossyImageCompression"] == "01" and md["LossyCompressedFiles"] == N
    assert md["LossyImageCompressionMethod"] == ["ISO_14495_1"] and md["LossyImageCompressionRatioEstimated"] is True
    (ratio,) = md["LossyImageCompressionRatio"]
    assert ratio > 1 and ratio == pytest.approx(stated, rel=0.05)
    warning = next(w for w in md["warnings"] if w.startswith(LOSSY_NOTE))
    assert "ratio is estimated from the size of the compressed pixel data" in warning
    assert _flag(vol) == f"{LOSSY_NOTE} (estimated ratio {ratio:g}:1 by ISO_14495_1)"


def test_lossless_jpeg_ls_and_uncompressed_are_not_flagged(tmp_path):
    paths = write_series(tmp_path / "s", n=N, unsigned=True)
    _compress(paths[0], JPEGLSLossless)
    vol = load_series(tmp_path / "s")
    assert not any(k.startswith("Lossy") for k in vol.metadata), vol.metadata
    assert not any(w.startswith(LOSSY_NOTE) for w in vol.metadata.get("warnings", ()))
    assert _flag(vol) is None
    write_series(tmp_path / "u", n=N, tweak=lambda _k, ds: setattr(ds, "LossyImageCompression", "00"))
    assert _flag(load_series(tmp_path / "u")) is None


def test_lossless_jpeg_is_not_flagged(tmp_path):
    if shutil.which("dcmcjpeg") is None:
        pytest.skip("dcmcjpeg (dcmtk) not installed")
    paths = write_series(tmp_path / "s", n=N, unsigned=True)
    for path in paths[:3]:  # dcmcjpeg's default: JPEG lossless, first-order prediction (1.2.840.10008.1.2.4.70)
        subprocess.run(["dcmcjpeg", str(path), str(path)], check=True, capture_output=True, timeout=60)
    assert pydicom.dcmread(paths[0], stop_before_pixels=True).file_meta.TransferSyntaxUID == "1.2.840.10008.1.2.4.70"
    vol = load_series(tmp_path / "s")
    assert "LossyImageCompression" not in vol.metadata and _flag(vol) is None


@pytest.mark.parametrize(
    ("syntax", "attribute", "lossy"),
    [
        ("1.2.840.10008.1.2.4.50", None, True),  # JPEG baseline
        ("1.2.840.10008.1.2.4.51", None, True),  # JPEG extended
        ("1.2.840.10008.1.2.4.81", None, True),  # JPEG-LS near-lossless
        ("1.2.840.10008.1.2.4.91", None, True),  # JPEG 2000: lossy unless the file says otherwise
        ("1.2.840.10008.1.2.4.91", "00", False),
        ("1.2.840.10008.1.2.4.50", "00", True),  # baseline JPEG is lossy whatever the attribute says
        ("1.2.840.10008.1.2.4.57", None, False),  # JPEG lossless
        ("1.2.840.10008.1.2.4.70", None, False),
        ("1.2.840.10008.1.2.4.80", None, False),  # JPEG-LS lossless
        ("1.2.840.10008.1.2.4.90", None, False),  # JPEG 2000 lossless only
        ("1.2.840.10008.1.2.1", None, False),
        ("1.2.840.10008.1.2.1", "01", True),  # decompressed after a lossy compression: once lossy, always
        ("1.2.840.10008.1.2.5", " 01 ", True),
    ],
)
def test_is_lossy(syntax, attribute, lossy):
    assert is_lossy(syntax, attribute) is lossy


def test_detail_of_successive_compressions_and_of_none_stated():
    md = {"LossyImageCompression": "01", "LossyImageCompressionRatio": [10, 2.5], "LossyImageCompressionMethod": ["A", "B"]}
    assert lossy_detail(md) == "ratio 10:1 by A, then ratio 2.5:1 by B"
    assert lossy_detail({"LossyImageCompression": "01"}) == "ratio and method not stated"
    assert lossy_detail({"LossyImageCompression": "00"}) is None and lossy_detail({}) is None


def test_ingest_command_shows_the_warning(tmp_path, capsys):
    write_series(tmp_path / "s", n=N, tweak=_lossy_attribute(ratio="12.5", method=None))
    assert main(["ingest", str(tmp_path / "s"), "--out", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    assert f"{LOSSY_NOTE} (ratio 12.5:1)" in out and "  warning " in out
    cache = CaseCache(tmp_path / "cache")
    (case_id,) = cache.case_ids()
    cached = cache.read(case_id)  # the later stages flag the case from the cached metadata
    assert cached.metadata["LossyImageCompressionRatio"] == [12.5] and _flag(cached) == f"{LOSSY_NOTE} (ratio 12.5:1)"


def test_the_series_states_its_most_compressed_file(tmp_path):
    def tweak(k: int, ds: Dataset) -> None:
        if k < 5:
            _lossy_attribute(ratio="5", method="ISO_10918_1")(k, ds)
        else:
            _lossy_attribute(ratio=["15", "2"], method=["ISO_10918_1", "ISO_15444_1"])(k, ds)

    write_series(tmp_path / "s", n=N, tweak=tweak)
    md = load_series(tmp_path / "s").metadata
    assert md["LossyImageCompressionRatio"] == [15.0, 2.0]
    assert md["LossyImageCompressionMethod"] == ["ISO_10918_1", "ISO_15444_1"]


def test_a_series_derived_only_by_lossy_compression_says_so_when_left_out(tmp_path):
    """An archive's lossy copy of the original axial series: DICOM makes its ImageType DERIVED (dcmcjpeg does so), and
    the series is left out by the derived-image rule. The reason names the compression, not only 'derived/secondary'."""
    from pipeline.ingest import scan_directory

    def lossy(k, ds):
        ds.LossyImageCompression = "01"
        ds.DerivationDescription = "Lossy compression with JPEG extended sequential 12 bit, compression ratio 3.2"

    write_series(tmp_path / "lossy", n=N, image_type="DERIVED\\PRIMARY\\AXIAL", tweak=lossy)
    write_series(tmp_path / "mpr", n=N, image_type="DERIVED\\SECONDARY\\MPR", seed=2)
    scan = scan_directory(tmp_path)
    why = {s.headers[0].path.parent.name: s.why_not for s in scan.series}
    assert "lossy compressed (LossyImageCompression (0028,2110) 01)" in why["lossy"], why
    assert "--allow-derived" in why["lossy"] and "lossy_compressed" in why["lossy"], why
    assert "lossy" not in why["mpr"] and "derived/secondary" in why["mpr"], why
