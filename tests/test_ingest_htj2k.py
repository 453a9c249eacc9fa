"""HTJ2K (ISO 15444-15) frames damaged in an archive: refused naming the file, the frame and the fix.

HTJ2K codestreams share JPEG 2000 Part 1's markers (SOC, SIZ, CAP, COD, SOT, SOD, EOC) and, like Part 1's coding
passes, the HT code-block segments never hold a marker code FF90..FFFF: a block of another codestream written into
the packet data is as visible as in JPEG 2000. No HTJ2K encoder is a dependency, so the frame below is kept as
bytes: OpenJPH 0.26.3's reversible (lossless) codestream of the stored values (HU + 1024, signed 16 bits) of
``hu_pattern(1, 16, 20, 3)[0]``.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.encaps import encapsulate

from pipeline.errors import CorruptPixelDataError, TruncatedFileError
from pipeline.ingest import load_series
from pipeline.ingest.codestream import FrameShape, check_frame
from tests._support.dicom import hu_pattern, write_enhanced

HTJ2K_LOSSLESS = "1.2.840.10008.1.2.4.201"
FRAME = base64.b64decode(
    "/0//UQApQAAAAAAUAAAAEAAAAAAAAAAAAAAAFAAAABAAAAAAAAAAAAABjwEB/1AACAACAAAACv9SAAwAAgABAAUEBEAB/1wAEyCIkJCQkJCQkJCQkJCQiIiI/2QAFwABT3BlbkpQSCBWZXIgMC4yNi4zLv+QAAoAAAAAAX4AAf+TwAAlogEHdADAABKA4ACHdADAABJAABNAABKA/hdzAAL9AQF0APwAx3QAwAATwAAVUAAE4KKy8AADlACIAhEK4AOTfrUA2QXxAAOUAMAAFqQAAWpAABaw1ZgmQwCPTGuqCcLoHQ7gG8kimAAnKFOVKbBgWS4C/gBzZJB7fQC5AEUbJKTIFBqMWX6vU/wCzzg6b2RQuQDAAC9DgABehwAAvSRZSAwKoRx8iamwyt08hgD0ClIN29RpCe+ZB52I1uQevWDd8JGNVFwhBfg2jHkakfYCOaSpuWUPjPkBVFHKqSYolZMBt9hdoaaIaQlsilGSR3NqYIYPM35MsJKh7+5ncV3BiPqKY4YeGQM1IRui9TID6AEXULDHI646rSC0idCiARQZVLqVAQz1+4mGzB8EH9aQLtFEPgF8BMB+ToUfOCLGYpFxgagCGPA8IU6WzlCcQymK94RqEhhG+ECSqnrCXFKAAA87cVk4hEEmEBHPlgH/2Q=="
)
SOT = FRAME.index(b"\xff\x90")  # the one tile part: SOT, then its packet data up to EOC
SHAPE = FrameShape(rows=16, columns=20, samples=1, bits_allocated=16)
N = 3
DAMAGED = 1  # 0-based: frame 2


def _htj2k_file(folder: Path, change: Callable[[bytes], bytes] = lambda b: b) -> tuple[Path, np.ndarray]:
    """An Enhanced CT file of N frames of :data:`FRAME`, stored as HTJ2K Lossless; frame DAMAGED is
    ``change(FRAME)``, encapsulated with correct item lengths (only the codestream is damaged)."""
    hu = np.repeat(hu_pattern(1, 16, 20, 3), N, axis=0)
    path, _ = write_enhanced(folder / "ct.dcm", n=N, rows=16, cols=20, hu=hu, shuffle=False)
    ds = pydicom.dcmread(path)
    frames = [FRAME] * N
    damaged = change(FRAME)
    frames[DAMAGED] = damaged + b"\x00" * (len(damaged) % 2)
    ds.file_meta.TransferSyntaxUID = HTJ2K_LOSSLESS
    ds.PixelData = encapsulate(frames, has_bot=True)
    ds["PixelData"].VR = "OB"
    ds["PixelData"].is_undefined_length = True
    ds.save_as(path, enforce_file_format=True)
    return path, hu


def _refused(folder: Path, error: type[Exception], *words: str) -> None:
    with pytest.raises(TruncatedFileError) as err:
        load_series(folder)
    text = str(err.value)
    assert type(err.value) is error, text
    assert "ct.dcm" in text and f"frame {DAMAGED + 1} " in text, text
    assert "copy the file again from the archive/PACS" in text, text
    for word in words:
        assert word in text, text


def test_the_htj2k_frame_is_a_real_ht_codestream_and_loads_as_its_values(tmp_path):
    """The bytes are HTJ2K (SIZ Rsiz with the HT bit 0x4000, a CAP marker) and decode to the values they encode."""
    assert FRAME[:4] == b"\xff\x4f\xff\x51" and FRAME[6:8] == b"\x40\x00" and b"\xff\x50" in FRAME[:SOT]
    _, hu = _htj2k_file(tmp_path / "ht")
    np.testing.assert_array_equal(load_series(tmp_path / "ht").array, hu)


def test_a_truncated_htj2k_frame_is_refused_naming_the_file_frame_and_fix(tmp_path):
    """A frame cut short mid packet data (its tail lost in a partial transfer)."""
    _htj2k_file(tmp_path / "cut", lambda b: b[: (SOT + len(b)) // 2])
    _refused(tmp_path / "cut", TruncatedFileError, "not the end marker FFD9", "cut short")


def test_a_truncated_htj2k_frame_closed_with_another_codestream_is_refused(tmp_path):
    """A frame cut short whose fragment goes on with another frame's whole codestream (a splice of two writes):
    it ends with EOC, but the other codestream's markers lie in its tile part's packet data."""
    _htj2k_file(tmp_path / "spliced", lambda b: b[: (SOT + len(b)) // 2] + b)
    _refused(tmp_path / "spliced", CorruptPixelDataError, "(HTJ2K) holds the marker FF90", "the tile part at byte")


def test_a_block_of_another_codestream_written_into_htj2k_packet_data_is_refused(tmp_path):
    """A misdirected write of 40 bytes of another codestream (its tile part's SOT and SOD markers and first packet
    data) over the packet data: every length and the end marker stay intact and the decoder returns an image of the
    right size with most pixels wrong, without a word; only the packet scan sees it."""
    block = FRAME[SOT : SOT + 40]
    start = 225
    _htj2k_file(tmp_path / "block", lambda b: b[:start] + block + b[start + len(block) :])
    _refused(tmp_path / "block", CorruptPixelDataError, "holds the marker FF", "inside the coded data of the tile part")


def test_htj2k_packet_data_is_scanned_as_jpeg_2000_s(tmp_path):
    """The same check for HTJ2K as for JPEG 2000: a marker FF90 or above in the packet data is damage, FF91 (SOP)
    and FF92 (EPH) are not."""
    end = len(FRAME) - 2
    for marker, refused in ((b"\xff\x93", True), (b"\xff\xd9", True), (b"\xff\x91", False), (b"\xff\x8f", False)):
        data = FRAME[: end - 4] + marker + FRAME[end - 2 :]
        for syntax in (HTJ2K_LOSSLESS, "1.2.840.10008.1.2.4.202", "1.2.840.10008.1.2.4.203"):
            if refused:
                with pytest.raises(CorruptPixelDataError, match=f"holds the marker {marker.hex().upper()}"):
                    check_frame(data, syntax, SHAPE, where="x.dcm", frame=DAMAGED)
            else:
                check_frame(data, syntax, SHAPE, where="x.dcm", frame=DAMAGED)
