"""Compressed series whose pixel data an archive damaged: refused naming the file, never decoded into garbage.

Each damage is made the way storage and naive repair tools make it, on a small phantom compressed with a real
encoder (RLE, JPEG 2000, JPEG-LS by pydicom; JPEG Lossless by dcmtk), with the encapsulation (item lengths,
sequence delimiter) left intact: (a) a frame cut short, (b) bytes overwritten mid-stream, (c) no end marker,
(d) no start marker / a nonsense RLE header, (e) RLE segment offsets beyond the frame, (f) a frame of another size.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.encaps import encapsulate, generate_frames

from pipeline.cache import CaseCache
from pipeline.cli import main
from pipeline.errors import CorruptPixelDataError, TruncatedFileError
from pipeline.ingest import ingest_to_cache, load_series
from pipeline.ingest.codestream import FrameShape, check_frame
from tests._support.dicom import write_enhanced
from tests._support.fault_corpus import (
    COMPRESSED,
    compress_files,
    frame_bytes,
    replace_frame,
    write_compressed_phantom,
    write_phantom,
)
from tests._support.real_ct import require_real_ct

DAMAGED = 5  # the damaged slice of the 12


def _refused(folder: Path, error: type[Exception], *words: str) -> str:
    """load_series(folder) raises exactly ``error``, naming the damaged file, the fix and each of ``words``."""
    with pytest.raises(TruncatedFileError) as err:
        load_series(folder)
    text = str(err.value)
    assert type(err.value) is error, text
    assert f"CT001_{DAMAGED + 1:05d}.dcm" in text and "copy the file again from the archive/PACS" in text, text
    for word in words:
        assert word in text, text
    return text


def _damaged(tmp_path: Path, syntax: str, change) -> Path:
    folder = tmp_path / syntax
    paths = write_compressed_phantom(folder, syntax)
    replace_frame(paths[DAMAGED], change)
    return folder


@pytest.mark.parametrize("syntax", ["rle", "jpeg2000", "jpegls", "jpeg_lossless"])
def test_healthy_compressed_series_load_as_the_uncompressed_one(tmp_path, syntax):
    plain = load_series(write_phantom(tmp_path / "plain")[0].parent).array
    np.testing.assert_array_equal(load_series(write_compressed_phantom(tmp_path / syntax, syntax)[0].parent).array, plain)


def test_frames_split_into_many_fragments_and_a_pad_byte_are_healthy(tmp_path):
    paths = write_compressed_phantom(tmp_path / "split", "jpeg_lossless", fragment_kb=1)
    assert len(list(pydicom.encaps.generate_fragments(pydicom.dcmread(paths[0]).PixelData))) > 2
    plain = load_series(write_phantom(tmp_path / "plain")[0].parent).array
    np.testing.assert_array_equal(load_series(tmp_path / "split").array, plain)
    frame = frame_bytes(paths[0])
    shape = FrameShape(rows=64, columns=64, samples=1, bits_allocated=16)
    for pad in (b"", b"\x00", bytes(4)):  # the pad byte of an odd-length stream, and writers that add more
        check_frame(frame.rstrip(b"\x00") + pad, COMPRESSED["jpeg_lossless"], shape, where="x")
    with pytest.raises(TruncatedFileError, match="not the end marker FFD9"):  # cut short, the lost tail read as zeros
        check_frame(frame[: len(frame) // 2] + bytes(4096), COMPRESSED["jpeg_lossless"], shape, where="x")


@pytest.mark.parametrize("syntax", ["jpegls", "jpeg_lossless", "jpeg2000"])
def test_a_frame_cut_short_inside_intact_items_is_refused(tmp_path, syntax):
    """(a) A partial write repaired by a naive tool: half the codestream, the items' lengths made to fit."""
    folder = _damaged(tmp_path, syntax, lambda b: b[: len(b) // 2])
    _refused(folder, TruncatedFileError, "not the end marker FFD9", "cut short")


def test_an_rle_frame_cut_short_is_refused_as_damaged(tmp_path):
    folder = _damaged(tmp_path, "rle", lambda b: b[: len(b) * 3 // 4])
    _refused(folder, CorruptPixelDataError, "cannot be decoded", "RLE Lossless")


def test_bytes_zeroed_in_a_jpeg_ls_stream_are_refused(tmp_path):
    """(b) JPEG-LS is decoded by CharLS, which refuses the damage libjpeg decodes into garbage without error."""
    folder = _damaged(tmp_path, "jpegls", lambda b: b[: len(b) // 2] + bytes(16) + b[len(b) // 2 + 16 :])
    _refused(folder, CorruptPixelDataError, "cannot be decoded", "JPEG-LS Lossless")


def test_a_block_of_another_file_written_into_a_jpeg_stream_is_refused(tmp_path):
    """(b) A misdirected write: 600 bytes of another image's codestream in the middle of a JPEG Lossless frame."""
    paths = write_compressed_phantom(tmp_path / "jpeg", "jpeg_lossless")
    other = frame_bytes(paths[0])[:600]
    replace_frame(paths[DAMAGED], lambda b: b[: len(b) // 2] + other + b[len(b) // 2 + 600 :])
    _refused(tmp_path / "jpeg", CorruptPixelDataError, "holds the marker FFD8", "inside its coded image data")


def test_a_block_of_another_file_written_into_a_jpeg_2000_stream_is_refused(tmp_path):
    """(b) The same for JPEG 2000: the other codestream's tile-part header markers (SOT FF90, SOD FF93) land in the
    packet data, where no marker from FF90 up belongs."""
    paths = write_compressed_phantom(tmp_path / "j2k", "jpeg2000")
    other = frame_bytes(paths[0])[:600]
    assert b"\xff\x90" in other
    replace_frame(paths[DAMAGED], lambda b: b[: len(b) // 2] + other + b[len(b) // 2 + 600 :])
    _refused(tmp_path / "j2k", CorruptPixelDataError, "holds the marker FF", "inside the coded data of the tile part")


@pytest.mark.parametrize("syntax", ["jpegls", "jpeg_lossless", "jpeg2000"])
def test_a_frame_without_its_end_marker_is_refused(tmp_path, syntax):
    """(c) Everything but the end-of-image / end-of-codestream marker FFD9."""
    folder = _damaged(tmp_path, syntax, lambda b: b.rstrip(b"\x00")[:-2])
    _refused(folder, TruncatedFileError, "not the end marker FFD9")


@pytest.mark.parametrize(
    ("syntax", "words"),
    [
        ("jpegls", "not the start-of-image marker FFD8"),
        ("jpeg_lossless", "not the start-of-image marker FFD8"),
        ("jpeg2000", "not the codestream start FF4F FF51"),
    ],
)
def test_a_frame_without_its_start_marker_is_refused(tmp_path, syntax, words):
    """(d) The first bytes of the codestream overwritten."""
    folder = _damaged(tmp_path, syntax, lambda b: b"\x00\x00" + b[2:])
    _refused(folder, CorruptPixelDataError, words, "the compressed pixel data is damaged")


def test_an_rle_header_declaring_no_segments_is_refused(tmp_path):
    """(d) The RLE header zeroed: the decoder returned an image of padding without a word."""
    folder = _damaged(tmp_path, "rle", lambda b: bytes(4) + b[4:])
    _refused(folder, CorruptPixelDataError, "declares 0 segment(s)", "16 bits need 2")


def test_rle_segment_offsets_beyond_the_frame_are_refused(tmp_path):
    """(e) The second segment's offset pointing past the end of the frame."""
    folder = _damaged(tmp_path, "rle", lambda b: b[:8] + struct.pack("<I", len(b) + 1000) + b[12:])
    _refused(folder, TruncatedFileError, "has a segment at byte", "cut short or its header is damaged")


def test_rle_segment_offsets_out_of_order_are_refused(tmp_path):
    folder = _damaged(tmp_path, "rle", lambda b: b[:4] + struct.pack("<II", 64, 60) + b[12:])
    _refused(folder, CorruptPixelDataError, "segment offsets [64, 60]")


def _half_height_codestream(path: Path, syntax: str) -> bytes:
    """The codestream of the top half of the image in ``path``, compressed as ``syntax``."""
    ds = pydicom.dcmread(path)
    top = ds.pixel_array[: ds.Rows // 2].copy()
    ds.decompress()
    ds.Rows = top.shape[0]
    ds.PixelData = top.tobytes()
    ds.compress(COMPRESSED[syntax])
    return next(generate_frames(ds.PixelData, number_of_frames=1))


@pytest.mark.parametrize("syntax", ["jpeg2000", "jpegls"])
def test_a_frame_of_another_size_is_refused(tmp_path, syntax):
    """(f) A file put together wrongly: its codestream holds a 64 × 32 image, its header says 64 × 64."""
    paths = write_compressed_phantom(tmp_path / syntax, syntax)
    half = _half_height_codestream(paths[DAMAGED], syntax)
    replace_frame(paths[DAMAGED], lambda _b: half)
    _refused(tmp_path / syntax, CorruptPixelDataError, "codestream of 64 × 32 pixels", "Rows × Columns = 64 × 64")


def test_an_rle_frame_of_another_size_is_refused(tmp_path):
    paths = write_compressed_phantom(tmp_path / "rle", "rle")
    half = _half_height_codestream(paths[DAMAGED], "rle")
    replace_frame(paths[DAMAGED], lambda _b: half)
    _refused(tmp_path / "rle", CorruptPixelDataError, "cannot be decoded", "RLE Lossless")


def test_a_damaged_frame_of_an_enhanced_file_is_named(tmp_path):
    path, _ = write_enhanced(tmp_path / "enh" / "ct.dcm", rows=64, cols=64)
    ds = pydicom.dcmread(path)
    ds.compress(COMPRESSED["rle"])
    frames = list(generate_frames(ds.PixelData, number_of_frames=int(ds.NumberOfFrames)))
    frames[2] = bytes(4) + frames[2][4:]
    ds.PixelData = encapsulate(frames, has_bot=True)
    ds.save_as(path, enforce_file_format=True)
    with pytest.raises(CorruptPixelDataError) as err:
        load_series(tmp_path / "enh")
    assert "ct.dcm" in str(err.value) and "frame 3 (RLE) declares 0 segment(s)" in str(err.value)


def test_jp2_wrapped_codestreams_are_checked_inside_their_box(tmp_path):
    paths = write_compressed_phantom(tmp_path / "j2k", "jpeg2000")
    codestream = frame_bytes(paths[0]).rstrip(b"\x00")
    signature = b"\x00\x00\x00\x0cjP  \r\n\x87\n"
    ftyp = struct.pack(">I4s4sI4s", 20, b"ftyp", b"jp2 ", 0, b"jp2 ")
    shape = FrameShape(rows=64, columns=64, samples=1, bits_allocated=16)
    jp2 = signature + ftyp + struct.pack(">I4s", 8 + len(codestream), b"jp2c") + codestream
    check_frame(jp2, COMPRESSED["jpeg2000"], shape, where="x")
    with pytest.raises(TruncatedFileError, match="not the end marker FFD9"):
        check_frame(jp2[:-2], COMPRESSED["jpeg2000"], shape, where="x")
    with pytest.raises(CorruptPixelDataError, match="without a contiguous codestream box"):
        check_frame(signature + ftyp, COMPRESSED["jpeg2000"], shape, where="x")


def test_ingest_caches_the_healthy_series_and_names_the_damaged_file(tmp_path, capsys):
    """One damaged series never stops a batch: the healthy one is cached, the damaged one refused naming its file."""
    write_compressed_phantom(tmp_path / "src" / "healthy", "jpegls", seed=2)
    damaged = write_compressed_phantom(tmp_path / "src" / "damaged", "jpegls", seed=3)
    replace_frame(damaged[DAMAGED], lambda b: b[: len(b) // 2])
    report = ingest_to_cache(tmp_path / "src", CaseCache(tmp_path / "cache"))
    assert len(report.written) == 1 and [type(r.error) for r in report.scan.rejected] == [TruncatedFileError]
    assert main(["ingest", str(tmp_path / "src"), "--out", str(tmp_path / "cli")]) == 1
    out = capsys.readouterr().out
    assert "REJECTED" in out and str(damaged[DAMAGED]) in out and "not the end marker FFD9" in out


@pytest.mark.parametrize("syntax", ["jpegls", "jpeg_lossless", "jpeg2000", "rle"])
def test_real_ct_compressed_by_real_encoders_passes_the_checks(tmp_path, syntax):
    """Twelve slices of the real chest CT (512 × 512, BitsStored 12; its vendor's private tags dropped, which
    pydicom cannot write back), compressed by real encoders: loaded, identical to the uncompressed slices."""
    source = sorted((require_real_ct() / "chest_ct_rt_planning_dicom").glob("*.dcm"))[60:72]
    for folder in (tmp_path / "plain", tmp_path / syntax):
        folder.mkdir()
        for f in source:
            ds = pydicom.dcmread(f)
            ds.remove_private_tags()
            ds.save_as(folder / f.name, enforce_file_format=True)
    compress_files(sorted((tmp_path / syntax).iterdir()), syntax)
    np.testing.assert_array_equal(load_series(tmp_path / syntax).array, load_series(tmp_path / "plain").array)


@pytest.fixture
def charls_then_libjpeg(monkeypatch):
    """pydicom set to try CharLS first and libjpeg after it for JPEG-LS (its own plugins, reordered with its public
    add/remove_plugin), and ctpipe's choice of CharLS alone left out: the set-up of a site that keeps a fallback."""
    from pydicom.pixels import get_decoder

    import pipeline.ingest._pydicom as pd

    decoder = get_decoder(COMPRESSED["jpegls"])
    if "pyjpegls" not in decoder.available_plugins:
        pytest.skip("pyjpegls (CharLS) not installed")
    decoder.remove_plugin("pylibjpeg")
    decoder.add_plugin("pylibjpeg", ("pydicom.pixels.decoders.pylibjpeg", "_decode_frame"))
    monkeypatch.setattr(pd, "decoding_plugin", lambda uid: "")
    yield
    decoder.remove_plugin("pyjpegls")
    decoder.add_plugin("pyjpegls", ("pydicom.pixels.decoders.pyjpegls", "_decode_frame"))


def test_a_decoder_refusing_a_frame_that_the_next_decoder_accepts_is_refused(tmp_path, charls_then_libjpeg):
    """CharLS refuses the damaged JPEG-LS frame and pydicom decodes it with libjpeg, which returns garbage without an
    error: CharLS's refusal is the file's error."""
    folder = _damaged(tmp_path, "jpegls", lambda b: b[: len(b) // 2] + bytes(16) + b[len(b) // 2 + 16 :])
    _refused(folder, CorruptPixelDataError, "a decoder refused the compressed pixel data", "and another decoded it")


def test_the_decoders_tracebacks_are_not_logged_for_a_refused_file(tmp_path, caplog):
    folder = _damaged(tmp_path, "rle", lambda b: b[: len(b) * 3 // 4])
    with pytest.raises(CorruptPixelDataError):
        load_series(folder)
    assert not [r for r in caplog.records if r.name.startswith("pydicom") and r.levelno >= 40]


def test_without_charls_jpeg_ls_loads_with_a_warning_naming_what_is_lost(tmp_path, caplog):
    """pydicom without its CharLS plugin (removed with its public remove_plugin): the healthy series loads, and a
    warning says that damaged JPEG-LS data is no longer refused and how to install CharLS."""
    from pydicom.pixels import get_decoder

    from pipeline.ingest._pydicom import decoding_plugin

    decoder = get_decoder(COMPRESSED["jpegls"])
    if "pyjpegls" not in decoder.available_plugins:
        pytest.skip("pyjpegls (CharLS) not installed")
    write_compressed_phantom(tmp_path / "jpegls", "jpegls")
    decoder.remove_plugin("pyjpegls")
    decoding_plugin.cache_clear()
    try:
        assert load_series(tmp_path / "jpegls").shape == (12, 64, 64)
    finally:
        decoder.add_plugin("pyjpegls", ("pydicom.pixels.decoders.pyjpegls", "_decode_frame"))
        decoding_plugin.cache_clear()
    assert any("pyjpegls is not installed" in r.getMessage() and "pip install pyjpegls" in r.getMessage() for r in caplog.records)
