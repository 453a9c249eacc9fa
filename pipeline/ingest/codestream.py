"""Structural checks of compressed pixel data, frame by frame, before it is decoded.

The decoders are lenient: given a JPEG Lossless or JPEG-LS codestream cut short, or JPEG 2000 data with bytes
overwritten, they return an image of the right size with garbage where the damage is, and no error. ctpipe refuses
such a file instead (a damaged series is never turned into a volume). Each frame's codestream, already in memory,
is checked for what a healthy one always has:

* JPEG (Lossless, Baseline, Extended) and JPEG-LS: the start-of-image marker FFD8 first and the end-of-image
  marker FFD9 last (0x00 padding after it allowed, PS3.5 A.4); well-formed marker segments up to the
  first scan; a frame header (SOF) whose lines, samples per line and components are Rows, Columns and
  SamplesPerPixel; no marker inside the entropy-coded data other than those a scan may hold (restart markers,
  tables, another scan);
* JPEG 2000 and HTJ2K: the codestream start SOC FF4F and the image size marker SIZ FF51 first (or a JP2 file with
  its signature box, whose contiguous codestream box is checked), the end-of-codestream marker EOC FFD9 last, an
  image size (SIZ) of Rows × Columns with SamplesPerPixel components, tile parts whose lengths (SOT Psot) end
  exactly at EOC, and no marker FF90 or above inside their packet data but SOP and EPH (HTJ2K's code-block
  segments avoid those marker codes by bit stuffing, as Part 1's coding passes do, ISO 15444-15);
* RLE Lossless: a 64-byte header declaring SamplesPerPixel × BitsAllocated / 8 segments, the first at byte 64,
  the others in increasing order, all inside the frame.

JPEG-LS frames are decoded by CharLS (pyjpegls) when it is installed: CharLS checks the coded data itself and
refuses damage the other decoder (libjpeg) turns into garbage. What no check sees: bytes changed inside the
entropy-coded data of a JPEG Lossless or JPEG 2000 stream (or the literal runs of an RLE segment) that leave every
marker and length intact; those streams carry no checksum, and they decode to an image of the right size.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptPixelDataError, TruncatedFileError
from ._pydicom import DAMAGED_PIXELS_FIX

RLE_LOSSLESS = "1.2.840.10008.1.2.5"
#: JPEG (ISO 10918-1) transfer syntaxes: Baseline, Extended, Lossless, Lossless SV1
JPEG_SYNTAXES = frozenset(
    {"1.2.840.10008.1.2.4.50", "1.2.840.10008.1.2.4.51", "1.2.840.10008.1.2.4.57", "1.2.840.10008.1.2.4.70"}
)
#: JPEG-LS (ISO 14495-1) transfer syntaxes: Lossless, Near-Lossless
JPEG_LS_SYNTAXES = frozenset({"1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.81"})
#: JPEG 2000 (ISO 15444-1/-2) and HTJ2K (ISO 15444-15) transfer syntaxes
J2K_SYNTAXES = frozenset(
    {
        "1.2.840.10008.1.2.4.90",
        "1.2.840.10008.1.2.4.91",
        "1.2.840.10008.1.2.4.92",
        "1.2.840.10008.1.2.4.93",
        "1.2.840.10008.1.2.4.201",
        "1.2.840.10008.1.2.4.202",
        "1.2.840.10008.1.2.4.203",
    }
)
#: HTJ2K (ISO 15444-15) transfer syntaxes, among :data:`J2K_SYNTAXES`
HTJ2K_SYNTAXES = frozenset({"1.2.840.10008.1.2.4.201", "1.2.840.10008.1.2.4.202", "1.2.840.10008.1.2.4.203"})

_SOI, _EOI = b"\xff\xd8", b"\xff\xd9"
_SOC_SIZ = b"\xff\x4f\xff\x51"
_JP2_SIGNATURE = b"\x00\x00\x00\x0cjP  \r\n\x87\n"
#: frame header (SOF) markers: JPEG SOF0..SOF15 (C4 DHT, C8 JPG, CC DAC are not) and JPEG-LS SOF55 (F7)
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC} | {0xF7}
#: markers that may follow 0xFF inside the data of a scan (up to EOI): 0x00 (a stuffed byte), fill bytes, restart
#: markers, and the marker segments allowed between scans (DHT, DAC, SOS, DQT, DNL, DRI, EXP, APPn, JPEG-LS LSE, COM)
_IN_SCAN = np.zeros(256, dtype=bool)
_IN_SCAN[[0x00, 0xFF, 0xC4, 0xCC, 0xDA, 0xDB, 0xDC, 0xDD, 0xDF, 0xF8, 0xFE, *range(0xD0, 0xD8), *range(0xE0, 0xF0)]] = True
#: in JPEG-LS scan data a 0xFF is followed by a byte below 0x80 (bit stuffing, ISO 14495-1 9.1): those are data too
_IN_SCAN_LS = _IN_SCAN.copy()
_IN_SCAN_LS[:0x80] = True

_REFETCH = DAMAGED_PIXELS_FIX


@dataclass(frozen=True)
class FrameShape:
    """What the DICOM header says a frame holds: Rows, Columns, SamplesPerPixel and BitsAllocated."""

    rows: int
    columns: int
    samples: int
    bits_allocated: int


def check_frame(data: bytes, transfer_syntax: str, shape: FrameShape, *, where: str | Path, frame: int | None = None) -> None:
    """Refuse a frame whose compressed ``data`` (the frame's fragments joined, as stored in PixelData) is damaged.

    ``frame``: the 0-based frame number of a multi-frame file, named in the message (None for a single frame).
    Raises :class:`~pipeline.errors.TruncatedFileError` when the codestream is cut short and
    :class:`~pipeline.errors.CorruptPixelDataError` when it is otherwise damaged or describes another image size;
    syntaxes other than JPEG, JPEG-LS, JPEG 2000 and RLE pass unchecked.
    """
    label = "the pixel data" if frame is None else f"frame {frame + 1}"
    if transfer_syntax in JPEG_SYNTAXES:
        _check_jpeg(data, shape, ls=False, where=where, label=label)
    elif transfer_syntax in JPEG_LS_SYNTAXES:
        _check_jpeg(data, shape, ls=True, where=where, label=label)
    elif transfer_syntax in J2K_SYNTAXES:
        _check_j2k(data, shape, ht=transfer_syntax in HTJ2K_SYNTAXES, where=where, label=label)
    elif transfer_syntax == RLE_LOSSLESS:
        _check_rle(data, shape, where=where, label=label)


def _corrupt(problem: str, *, where: str | Path) -> CorruptPixelDataError:
    return CorruptPixelDataError(problem + ": the compressed pixel data is damaged", where=where, fix=_REFETCH)


def _check_end(data: bytes, marker: bytes, what: str, *, where: str | Path, label: str) -> int:
    """Where the codestream ``data`` ends: after its end ``marker``, trailing 0x00 padding left out (PS3.5 A.4 pads a
    fragment to an even length with one; some writers add more). A codestream cut short at a random byte, even one
    whose lost tail reads back as zeros, does not end with the marker: :class:`TruncatedFileError`."""
    end = len(data)
    while end and data[end - 1] == 0:
        end -= 1
    if data[end - 2 : end] == marker:
        return end
    padding = f" followed by {len(data) - end} zero bytes" if end < len(data) else ""
    raise TruncatedFileError(
        f"{label} ({what}, {len(data)} bytes) ends with bytes {data[max(end - 4, 0) : end].hex().upper()}{padding}, not "
        f"the end marker {marker.hex().upper()}: the codestream is cut short (a partial write or transfer) or its end "
        "is damaged",
        where=where,
        fix=_REFETCH,
    )


def _check_size(width: int, height: int, components: int, shape: FrameShape, what: str, *, where: str | Path, label: str) -> None:
    if width == shape.columns and height in (shape.rows, 0) and components == shape.samples:  # height 0: set by DNL
        return
    raise CorruptPixelDataError(
        f"{label} is a {what} codestream of {width} × {height} pixels with {components} component(s), but Rows × "
        f"Columns = {shape.rows} × {shape.columns} with SamplesPerPixel {shape.samples}: the header does not describe "
        "this image's pixel data (the file was put together wrongly or is damaged)",
        where=where,
        fix=_REFETCH,
    )


def _check_jpeg(data: bytes, shape: FrameShape, *, ls: bool, where: str | Path, label: str) -> None:
    what = "JPEG-LS" if ls else "JPEG"
    if not data.startswith(_SOI):
        raise _corrupt(
            f"{label} ({what}) starts with bytes {data[:4].hex().upper()}, not the start-of-image marker FFD8", where=where
        )
    end = _check_end(data, _EOI, what, where=where, label=label) - 2
    pos, sof = 2, None
    while True:  # marker segments up to the first scan
        if pos + 4 > end:
            raise _corrupt(f"{label} ({what}) has no scan: its marker segments run into the end at byte {end}", where=where)
        if data[pos] != 0xFF:
            raise _corrupt(f"{label} ({what}) has byte {data[pos]:02X} at byte {pos} where a marker (FF..) belongs", where=where)
        marker = data[pos + 1]
        if marker == 0xFF:  # a fill byte before the marker
            pos += 1
            continue
        length = struct.unpack_from(">H", data, pos + 2)[0]
        if length < 2 or pos + 2 + length > end:
            raise _corrupt(f"{label} ({what}): the marker segment FF{marker:02X} at byte {pos} has length {length}", where=where)
        if marker in _SOF and length >= 8:
            sof = struct.unpack_from(">BHHB", data, pos + 4)  # precision, lines, samples per line, components
        pos += 2 + length
        if marker == 0xDA:
            break
    if sof is None:
        raise _corrupt(f"{label} ({what}) has no frame header (SOF marker) before its first scan", where=where)
    _check_size(sof[2], sof[1], sof[3], shape, what, where=where, label=label)
    body = np.frombuffer(data, dtype=np.uint8, count=end - pos, offset=pos)
    ff = np.flatnonzero(body[:-1] == 0xFF)
    after = body[ff + 1]
    bad = np.flatnonzero(~(_IN_SCAN_LS if ls else _IN_SCAN)[after])
    if bad.size:
        raise _corrupt(
            f"{label} ({what}) holds the marker FF{int(after[bad[0]]):02X} at byte {pos + int(ff[bad[0]])}, inside its "
            f"coded image data ({bad.size} such marker(s) in all)",
            where=where,
        )


def _jp2_codestream(data: bytes, *, where: str | Path, label: str) -> bytes:
    """The contiguous codestream (jp2c box) of a JP2 file."""
    pos = 0
    while pos + 8 <= len(data):
        size, kind = struct.unpack_from(">I4s", data, pos)
        head = 8
        if size == 1 and pos + 16 <= len(data):
            size, head = struct.unpack_from(">Q", data, pos + 8)[0], 16
        elif size == 0:
            size = len(data) - pos
        if size < head:
            break
        if kind == b"jp2c":
            return data[pos + head : pos + size]
        pos += size
    raise _corrupt(f"{label} is a JP2 file without a contiguous codestream box (jp2c) within its {len(data)} bytes", where=where)


def _check_j2k(data: bytes, shape: FrameShape, *, ht: bool, where: str | Path, label: str) -> None:
    """``ht``: an HTJ2K codestream (named so in the messages); its packet data is scanned as JPEG 2000's."""
    what = "HTJ2K" if ht else "JPEG 2000"
    if data.startswith(_JP2_SIGNATURE):
        data = _jp2_codestream(data, where=where, label=label)
    if not data.startswith(_SOC_SIZ) or len(data) < 44:
        raise _corrupt(
            f"{label} ({what}) starts with bytes {data[:4].hex().upper()}, not the codestream start FF4F FF51 (SOC, "
            "SIZ) nor a JP2 signature box",
            where=where,
        )
    end = _check_end(data, _EOI, what, where=where, label=label) - 2
    lsiz = struct.unpack_from(">H", data, 4)[0]
    xsiz, ysiz, xosiz, yosiz = struct.unpack_from(">4I", data, 8)
    components = struct.unpack_from(">H", data, 40)[0]
    _check_size(xsiz - xosiz, ysiz - yosiz, components, shape, what, where=where, label=label)
    pos = 4 + lsiz
    while pos + 4 <= end and data[pos : pos + 2] != b"\xff\x90":  # main header marker segments up to the first SOT
        if data[pos] != 0xFF:
            raise _corrupt(f"{label} ({what}) has byte {data[pos]:02X} at byte {pos} where a marker (FF..) belongs", where=where)
        pos += 2 + struct.unpack_from(">H", data, pos + 2)[0]
    if pos >= end:
        raise _corrupt(f"{label} ({what}) has no tile part (SOT marker FF90) before its end at byte {end}", where=where)
    while pos < end:  # tile parts: each SOT's Psot gives its length, the last one (Psot 0 allowed) ends at EOC
        if pos + 10 > end or data[pos : pos + 2] != b"\xff\x90":
            raise _corrupt(
                f"{label} ({what}) has bytes {data[pos : pos + 2].hex().upper()} at byte {pos} where a tile part (SOT "
                f"FF90) or the end-of-codestream marker at byte {end} belongs",
                where=where,
            )
        psot = struct.unpack_from(">I", data, pos + 6)[0]
        if pos + psot > end:
            raise TruncatedFileError(
                f"{label} ({what}): the tile part at byte {pos} is {psot} bytes long but the codestream ends at byte "
                f"{end}: the codestream is cut short",
                where=where,
                fix=_REFETCH,
            )
        stop = end if psot == 0 else pos + psot
        _check_tile_data(data, pos, stop, what=what, where=where, label=label)
        pos = stop


#: markers that may follow 0xFF inside the packet data of a JPEG 2000 tile part: any byte up to 0x8F (ISO 15444-1
#: Annex D.5/B.10: coded data never holds 0xFF90 or above), SOP (FF91) and EPH (FF92) when the coding style uses them
_IN_TILE = np.zeros(256, dtype=bool)
_IN_TILE[:0x90] = True
_IN_TILE[[0x91, 0x92]] = True


def _check_tile_data(data: bytes, start: int, stop: int, *, what: str, where: str | Path, label: str) -> None:
    """The tile part of a JPEG 2000 or HTJ2K (``what``) codestream from its SOT at ``start`` to ``stop``: marker
    segments up to SOD (FF93), then packet data without a marker of FF90 or above."""
    pos = start
    while True:
        if pos + 2 > stop or data[pos] != 0xFF:
            raise _corrupt(f"{label} ({what}): the tile part at byte {start} has no start of data (SOD FF93)", where=where)
        if data[pos + 1] == 0x93:
            pos += 2
            break
        if pos + 4 > stop:
            raise _corrupt(f"{label} ({what}): the tile part at byte {start} has no start of data (SOD FF93)", where=where)
        pos += 2 + struct.unpack_from(">H", data, pos + 2)[0]
    body = np.frombuffer(data, dtype=np.uint8, count=stop - pos, offset=pos)
    ff = np.flatnonzero(body[:-1] == 0xFF)
    after = body[ff + 1]
    bad = np.flatnonzero(~_IN_TILE[after])
    if bad.size:
        raise _corrupt(
            f"{label} ({what}) holds the marker FF{int(after[bad[0]]):02X} at byte {pos + int(ff[bad[0]])}, inside "
            f"the coded data of the tile part at byte {start} ({bad.size} such marker(s) in all)",
            where=where,
        )


def _check_rle(data: bytes, shape: FrameShape, *, where: str | Path, label: str) -> None:
    if len(data) < 64:
        raise TruncatedFileError(
            f"{label} (RLE) is {len(data)} bytes long, shorter than the 64-byte RLE header", where=where, fix=_REFETCH
        )
    header = struct.unpack_from("<16I", data)
    count, offsets = header[0], header[1 : 1 + min(header[0], 15)]
    need = shape.samples * max(shape.bits_allocated // 8, 1)
    if count != need:
        raise _corrupt(
            f"{label} (RLE) declares {count} segment(s) in its header, but {shape.samples} sample(s) of "
            f"{shape.bits_allocated} bits need {need}",
            where=where,
        )
    if offsets[0] != 64 or any(b <= a for a, b in zip(offsets, offsets[1:])):
        raise _corrupt(f"{label} (RLE) has segment offsets {list(offsets)}: the first must be 64 and each larger", where=where)
    if offsets[-1] >= len(data):
        raise TruncatedFileError(
            f"{label} (RLE) has a segment at byte {offsets[-1]} but is only {len(data)} bytes long: the data is cut "
            "short or its header is damaged",
            where=where,
            fix=_REFETCH,
        )


def _single_frame(pixel_data: bytes, *, where: str | Path) -> bytes:
    """The fragments of encapsulated ``pixel_data`` (basic offset table item, then fragment items, PS3.5 A.4) joined:
    the frame of a single-frame image."""
    fragments, pos, n = [], 0, len(pixel_data)
    first = True
    while pos + 8 <= n:
        tag, length = _ITEM_HEAD.unpack_from(pixel_data, pos)
        if tag == _SEQUENCE_END:
            break
        if tag != _ITEM or pos + 8 + length > n:
            raise _corrupt(
                f"the encapsulated pixel data has tag {tag >> 16:04X},{tag & 0xFFFF:04X} with length {length} at byte "
                f"{pos} where an item of at most {n - pos - 8} bytes belongs",
                where=where,
            )
        if not first:  # the first item is the basic offset table
            fragments.append(pixel_data[pos + 8 : pos + 8 + length])
        first = False
        pos += 8 + length
    if not fragments:
        raise _corrupt("the encapsulated pixel data holds no fragment", where=where)
    return fragments[0] if len(fragments) == 1 else b"".join(fragments)


_ITEM_HEAD = struct.Struct("<II")  # tag as (group << 16 | element) read little endian: group first
_ITEM = 0xE000FFFE
_SEQUENCE_END = 0xE0DDFFFE


def check_encapsulated(
    pixel_data: bytes,
    transfer_syntax: str,
    shape: FrameShape,
    *,
    n_frames: int,
    where: str | Path,
    extended_offsets: tuple[bytes, bytes] | None = None,
) -> None:
    """:func:`check_frame` for each of the ``n_frames`` frames of encapsulated ``pixel_data`` (the PixelData value:
    basic offset table and fragments); ``extended_offsets``: the ExtendedOffsetTable (7FE0,0001) and its lengths
    (7FE0,0002) when the file has them. Does nothing for a syntax :func:`check_frame` does not check."""
    if transfer_syntax not in CHECKED_SYNTAXES:
        return
    if n_frames == 1:
        check_frame(_single_frame(pixel_data, where=where), transfer_syntax, shape, where=where)
        return
    from pydicom.encaps import generate_frames  # lazy: see pipeline.ingest._pydicom

    frames = generate_frames(pixel_data, number_of_frames=n_frames, extended_offsets=extended_offsets)
    for k in range(n_frames):
        try:
            data = next(frames)
        except (StopIteration, ValueError, IndexError, struct.error) as exc:
            raise _corrupt(
                f"frame {k + 1} of {n_frames} cannot be found in the encapsulated pixel data ({exc or 'too few fragments'})",
                where=where,
            ) from exc
        check_frame(data, transfer_syntax, shape, where=where, frame=k)


#: the transfer syntaxes whose frames :func:`check_frame` checks
CHECKED_SYNTAXES = JPEG_SYNTAXES | JPEG_LS_SYNTAXES | J2K_SYNTAXES | {RLE_LOSSLESS}


def check_encapsulated_pixels(ds: Any, transfer_syntax: str, shape: FrameShape, *, n_frames: int, where: str | Path) -> None:
    """:func:`check_encapsulated` for the PixelData of pydicom data set ``ds`` (a file of ``transfer_syntax`` with
    ``n_frames`` frames of ``shape``, as its header gives them)."""
    if transfer_syntax not in CHECKED_SYNTAXES or "PixelData" not in ds:
        return
    extended = None
    if n_frames > 1 and "ExtendedOffsetTable" in ds and "ExtendedOffsetTableLengths" in ds:
        extended = (ds.ExtendedOffsetTable, ds.ExtendedOffsetTableLengths)
    check_encapsulated(ds.PixelData, transfer_syntax, shape, n_frames=n_frames, where=where, extended_offsets=extended)


def check_decoded_size(decoded: int, expected: int, *, where: str | Path, frames: int = 1) -> None:
    """Refuse decoded pixel data of ``decoded`` values where Rows × Columns × SamplesPerPixel (× ``frames``) give
    ``expected``: the codestream describes another image than the header."""
    if decoded == expected:
        return
    in_frames = f" in {frames} frames" if frames > 1 else ""
    raise CorruptPixelDataError(
        f"the pixel data decodes to {decoded} values but Rows × Columns × SamplesPerPixel give {expected}{in_frames}: "
        "the header does not describe this image's pixel data (the file was put together wrongly or is damaged)",
        where=where,
        fix=_REFETCH,
    )
