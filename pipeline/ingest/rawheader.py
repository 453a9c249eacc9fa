"""A fast, read-only parser of DICOM Part 10 headers.

It reads the file in small chunks, walks the data elements up to the pixel
data without decoding anything it does not need, and records where the pixel
data starts and how long it is. Little-endian transfer syntaxes (implicit and
explicit VR, including every encapsulated/compressed one) are handled here;
big-endian and deflated files raise :class:`RawHeaderUnsupported` so that the
caller can fall back to pydicom.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

IMPLICIT_LE = "1.2.840.10008.1.2"
EXPLICIT_LE = "1.2.840.10008.1.2.1"
DEFLATED_LE = "1.2.840.10008.1.2.1.99"
EXPLICIT_BE = "1.2.840.10008.1.2.2"
DICOMDIR_SOP = "1.2.840.10008.1.3.10"

PIXEL_DATA = 0x7FE00010
_ITEM = 0xFFFEE000
_ITEM_END = 0xFFFEE00D
_SEQ_END = 0xFFFEE0DD
_UNDEFINED = 0xFFFFFFFF
_LONG_VRS = frozenset({b"OB", b"OD", b"OF", b"OL", b"OV", b"OW", b"SQ", b"SV", b"UC", b"UN", b"UR", b"UT", b"UV"})
_CHUNK = 8192

# Tags read by the header scan: tag -> (keyword, value kind).
# Kinds: "str" (text, multi-valued joined by backslash), "us" (unsigned short), "is" (integer string),
# "bin" (the value's bytes as they are, with the explicit VR: ``(vr, bytes)``, vr "" in implicit VR; for values
# whose VR depends on PixelRepresentation, US or SS, read by pipeline.ingest.padding).
WANTED: dict[int, tuple[str, str]] = {
    0x00020002: ("MediaStorageSOPClassUID", "str"),
    0x00020010: ("TransferSyntaxUID", "str"),
    0x00080005: ("SpecificCharacterSet", "str"),
    0x00080008: ("ImageType", "str"),
    0x00080016: ("SOPClassUID", "str"),
    0x00080018: ("SOPInstanceUID", "str"),
    0x00080020: ("StudyDate", "str"),
    0x00080021: ("SeriesDate", "str"),
    0x00080031: ("SeriesTime", "str"),
    0x00080050: ("AccessionNumber", "str"),
    0x00080060: ("Modality", "str"),
    0x00080070: ("Manufacturer", "str"),
    0x0008103E: ("SeriesDescription", "str"),
    0x00100010: ("PatientName", "str"),
    0x00100020: ("PatientID", "str"),
    0x00100030: ("PatientBirthDate", "str"),
    0x00180050: ("SliceThickness", "str"),
    0x00180060: ("KVP", "str"),
    0x00181120: ("GantryDetectorTilt", "str"),
    0x00181210: ("ConvolutionKernel", "str"),
    0x00185100: ("PatientPosition", "str"),
    0x0020000D: ("StudyInstanceUID", "str"),
    0x0020000E: ("SeriesInstanceUID", "str"),
    0x00200011: ("SeriesNumber", "str"),
    0x00200012: ("AcquisitionNumber", "str"),
    0x00200013: ("InstanceNumber", "str"),
    0x00200032: ("ImagePositionPatient", "str"),
    0x00200037: ("ImageOrientationPatient", "str"),
    0x00200052: ("FrameOfReferenceUID", "str"),
    0x00280002: ("SamplesPerPixel", "us"),
    0x00280004: ("PhotometricInterpretation", "str"),
    0x00280008: ("NumberOfFrames", "str"),
    0x00280010: ("Rows", "us"),
    0x00280011: ("Columns", "us"),
    0x00280030: ("PixelSpacing", "str"),
    0x00280100: ("BitsAllocated", "us"),
    0x00280101: ("BitsStored", "us"),
    0x00280103: ("PixelRepresentation", "us"),
    0x00280120: ("PixelPaddingValue", "bin"),
    0x00280121: ("PixelPaddingRangeLimit", "bin"),
    0x00281052: ("RescaleIntercept", "str"),
    0x00281053: ("RescaleSlope", "str"),
    0x00282110: ("LossyImageCompression", "str"),
    0x00282112: ("LossyImageCompressionRatio", "str"),
    0x00282114: ("LossyImageCompressionMethod", "str"),
}


class RawHeaderError(Exception):
    """The bytes are not a readable DICOM header (``kind`` says why)."""

    def __init__(self, kind: str, message: str):
        self.kind = kind  # "not_dicom" | "truncated"
        super().__init__(message)


class RawHeaderUnsupported(Exception):
    """The file is DICOM but uses an encoding this parser leaves to pydicom."""


@dataclass
class RawHeader:
    """What the scan needs from one file: selected values, pixel data location, file size."""

    values: dict[str, object] = field(default_factory=dict)
    pixel_offset: int | None = None  # file offset of the first pixel data byte
    pixel_length: int | None = None  # bytes, or -1 when encapsulated (compressed)
    file_size: int = 0
    file_mtime_ns: int = 0  # the file's modification time (ns since the Unix epoch) when its header was read
    truncated: str | None = None  # why the pixel data is incomplete, if it is
    pixel_end: int | None = None  # where compressed pixel data end when other bytes follow them (else None)


class _Stream:
    """Random access over a file through a small buffer."""

    def __init__(self, fh, size: int, first: bytes):
        self.fh = fh
        self.size = size
        self.buf = first
        self.base = 0

    def get(self, pos: int, n: int) -> bytes:
        end = pos + n
        if pos >= self.base and end <= self.base + len(self.buf):
            return self.buf[pos - self.base : end - self.base]
        if end > self.size:
            raise RawHeaderError("truncated", f"file ends at byte {self.size}, inside an element at byte {pos}")
        self.fh.seek(pos)
        self.buf = self.fh.read(max(n, _CHUNK))
        self.base = pos
        return self.buf[:n]


def _decode(raw: bytes, kind: str, vr: bytes | None = None) -> object:
    if kind == "bin":
        return ((vr or b"").decode("latin-1"), bytes(raw))
    if kind == "us":
        return struct.unpack_from("<H", raw)[0] if len(raw) >= 2 else None
    text = raw.decode("latin-1").strip("\x00 ")
    return text


#: The values among :data:`WANTED` whose text follows SpecificCharacterSet (VRs SH, LO, PN); the others are ASCII.
CHARSET_TEXT_KEYS = frozenset(
    {"SeriesDescription", "PatientName", "PatientID", "Manufacturer", "AccessionNumber", "ConvolutionKernel"}
)
# single-byte and UTF-8 character sets (SpecificCharacterSet with one value) -> Python codec
_CODECS = {
    "ISO_IR 6": "ascii",
    "ISO_IR 100": "latin-1",
    "ISO_IR 101": "iso8859-2",
    "ISO_IR 109": "iso8859-3",
    "ISO_IR 110": "iso8859-4",
    "ISO_IR 144": "iso8859-5",
    "ISO_IR 127": "iso8859-6",
    "ISO_IR 126": "iso8859-7",
    "ISO_IR 138": "iso8859-8",
    "ISO_IR 148": "iso8859-9",
    "ISO_IR 203": "iso8859-15",
    "ISO_IR 166": "tis-620",
    "ISO_IR 13": "shift_jis",
    "ISO_IR 192": "utf-8",
    "GB18030": "gb18030",
    "GBK": "gbk",
}


_told: set[str] = set()
_told_lock = threading.Lock()


def _unknown_charset(charset: str, term: str) -> None:
    """Log once per process (header reads run in threads, and in worker processes for large scans)."""
    with _told_lock:
        if charset in _told:
            return
        _told.add(charset)
    log.warning("SpecificCharacterSet %r: %r is not a DICOM character set; its text is read as Latin-1", charset, term)


def decode_text(text: str, charset: str | None) -> str:
    """A text value the header scan read byte for byte (as Latin-1), decoded with the file's SpecificCharacterSet
    (0008,0005) ``charset``: UTF-8 (ISO_IR 192), the ISO 8859 parts, GB18030, and the ISO 2022 code extensions
    (through pydicom). In a file without SpecificCharacterSet (the default repertoire) bytes that form UTF-8 are
    read as UTF-8 (exporters write it without declaring it; Latin-1 text rarely forms UTF-8 by chance), other stray
    bytes as Latin-1. ASCII text and bytes the declared character set cannot decode come back unchanged."""
    if text.isascii() and "\x1b" not in text:  # ISO 2022 escape sequences are ASCII bytes
        return text
    if not charset:
        try:
            return text.encode("latin-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):  # not bytes read as Latin-1, or not UTF-8
            return text
    raw = text.encode("latin-1")
    terms = [t.strip() for t in charset.split("\\")]
    codec = _CODECS.get(terms[0]) if len(terms) == 1 else None
    try:
        if codec is not None:
            return raw.decode(codec)
        # lazy on purpose: pydicom is slow to import and only the ISO 2022 code extensions need it
        from pydicom.charset import convert_encodings, decode_bytes, python_encoding

        if unknown := [t for t in terms if t and t not in python_encoding]:
            _unknown_charset(charset, unknown[0])  # pydicom would warn on every file; say it once
            return text

        decoded = decode_bytes(raw, convert_encodings(terms), {0x5C, 0x5E, 0x3D})
    except (UnicodeDecodeError, LookupError, ValueError):
        return text
    return text if "\ufffd" in decoded else decoded  # pydicom replaces what it cannot decode (and warns)


def dicom_data_start(head: bytes) -> int | None:
    """Where the DICOM content of a file whose first bytes are ``head`` (132 or more) begins: 132, after the preamble
    and its 'DICM' marker; 0 for a bare data set without them (old ACR-NEMA style files, first tag in group 0002 or
    0008, little endian or, explicit VR, big endian); ``None`` when the file is not DICOM."""
    if len(head) >= 132 and head[128:132] == b"DICM":
        return 132
    if len(head) >= 8 and (head[0:2] in (b"\x02\x00", b"\x08\x00") or bare_big_endian(head)):
        return 0
    return None


def bare_big_endian(head: bytes) -> bool:
    """Whether ``head``, the first bytes of a file, begins a data set in Explicit VR Big Endian without preamble
    and file meta information: the first tag's group 0002 or 0008 written big endian, then a VR (two capital
    letters). Such files (retired transfer syntax, old archives) carry no TransferSyntaxUID to say so."""
    return len(head) >= 8 and head[0:2] in (b"\x00\x02", b"\x00\x08") and head[4:6].isalpha() and head[4:6].isupper()


def read_raw_header(path: str | os.PathLike[str]) -> RawHeader:
    """Parse the header of ``path`` up to the pixel data.

    Raises :class:`RawHeaderError` for non-DICOM or truncated headers and
    :class:`RawHeaderUnsupported` for big-endian/deflated files.
    """
    with open(path, "rb") as fh:
        info = os.fstat(fh.fileno())  # size and modification time at once: what discovery saw of the file
        size = info.st_size
        first = fh.read(_CHUNK)
        out = RawHeader(file_size=size, file_mtime_ns=info.st_mtime_ns)
        start = dicom_data_start(first)
        if start is None:
            raise RawHeaderError("not_dicom", "no 'DICM' marker at byte 128 and no DICOM data set at byte 0")
        pos = start
        st = _Stream(fh, size, first)
        pos = _read_meta(st, pos, out)
        ts = str(out.values.get("TransferSyntaxUID") or "")
        if not ts and start == 0 and bare_big_endian(first):  # pydicom reads it; a header cut short is said here
            _check_big_endian_elements(st, size)
            raise RawHeaderUnsupported(EXPLICIT_BE)
        if ts in (DEFLATED_LE, EXPLICIT_BE):
            raise RawHeaderUnsupported(ts)
        explicit = ts != IMPLICIT_LE
        if not ts and pos < size:  # no meta group: guess the VR encoding from the first element
            probe = st.get(pos, 6)
            explicit = probe[4:6].isalpha() and probe[4:6].isupper()
        _walk(st, pos, size, explicit, out)
        return out


def _check_big_endian_elements(st: _Stream, size: int) -> None:
    """Raise :class:`RawHeaderError` (``truncated``) when the top-level elements of a bare Explicit VR Big Endian
    data set (:func:`bare_big_endian`) run past the end of the file before the pixel data: pydicom, which reads such
    a file without its file meta information, would keep the values cut short (a SeriesInstanceUID missing its
    last digits) and leave out the rest, without a word. An undefined-length sequence ends the check."""
    pos = 0
    while pos < size:
        head = st.get(pos, 8)  # raises when the file ends inside the tag, VR and length
        group, elem = struct.unpack_from(">HH", head)
        if head[4:6] in _LONG_VRS:
            length, start = struct.unpack_from(">I", st.get(pos + 8, 4))[0], pos + 12
        else:
            length, start = struct.unpack_from(">H", head, 6)[0], pos + 8
        if length == 0xFFFFFFFF or (group << 16) | elem == PIXEL_DATA:  # pixel data cut short: said when read
            return
        if start + length > size:
            raise RawHeaderError(
                "truncated",
                f"file ends at byte {size}, inside element ({group:04X},{elem:04X}), whose {length} bytes start at "
                f"byte {start} (Explicit VR Big Endian)",
            )
        pos = start + length


def _read_meta(st: _Stream, pos: int, out: RawHeader) -> int:
    """Read group 0002 (always explicit VR little endian); return the data set start."""
    while pos + 8 <= st.size:
        head = st.get(pos, 8)
        group, elem = struct.unpack_from("<HH", head)
        if group != 0x0002:
            return pos
        vr = head[4:6]
        if vr in _LONG_VRS:
            length = struct.unpack_from("<I", st.get(pos + 8, 4))[0]
            vstart = pos + 12
        else:
            length = struct.unpack_from("<H", head, 6)[0]
            vstart = pos + 8
        tag = (group << 16) | elem
        if vstart + length > st.size:
            raise RawHeaderError("truncated", f"file ends at byte {st.size}, inside file meta element (0002,{elem:04X})")
        if tag in WANTED:
            key, kind = WANTED[tag]
            out.values[key] = _decode(st.get(vstart, length), kind, vr)
        pos = vstart + length
    if pos < st.size:
        raise RawHeaderError("truncated", f"file ends at byte {st.size}, inside the file meta group")
    return pos


def _element_head(st: _Stream, pos: int, explicit: bool) -> tuple[int, bytes | None, int, int]:
    """(tag, vr, value length, value start) of the element at ``pos``."""
    head = st.get(pos, 8)
    group, elem = struct.unpack_from("<HH", head)
    tag = (group << 16) | elem
    if tag in (_ITEM, _ITEM_END, _SEQ_END) or not explicit:
        return tag, None, struct.unpack_from("<I", head, 4)[0], pos + 8
    vr = head[4:6]
    if vr in _LONG_VRS:
        return tag, vr, struct.unpack_from("<I", st.get(pos + 8, 4))[0], pos + 12
    return tag, vr, struct.unpack_from("<H", head, 6)[0], pos + 8


def _skip_undefined(st: _Stream, pos: int, explicit: bool) -> int:
    """Skip the items of an undefined-length sequence starting at ``pos``; return the position after it."""
    while True:
        tag, _, length, vstart = _element_head(st, pos, explicit)
        if tag == _SEQ_END:
            return vstart
        if tag != _ITEM:
            raise RawHeaderError("truncated", f"expected a sequence item at byte {pos}, found tag {tag:08X}")
        if length != _UNDEFINED:
            pos = vstart + length
            continue
        pos = vstart
        while True:  # elements of an undefined-length item, up to its delimiter
            tag, vr, length, vstart = _element_head(st, pos, explicit)
            if tag == _ITEM_END:
                pos = vstart
                break
            if length == _UNDEFINED:
                pos = _skip_undefined(st, vstart, explicit and vr != b"UN")
            else:
                pos = vstart + length


_HEAD = struct.Struct("<HH2sH")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")


_SEQ_END_BYTES = b"\xfe\xff\xdd\xe0\x00\x00\x00\x00"  # (FFFE,E0DD) Sequence Delimitation Item, length 0
_ITEM_HEAD = struct.Struct("<HHI")


def _encapsulated_end(fh, pos: int, size: int) -> int | None:
    """The file offset just after the Sequence Delimitation Item of encapsulated pixel data whose items start at
    ``pos`` (one item header read per fragment), or None when the items run past the end of the file or something
    other than an item or the delimiter comes first (data cut short or damaged)."""
    while pos + 8 <= size:
        fh.seek(pos)
        group, elem, length = _ITEM_HEAD.unpack(fh.read(8))
        if (group, elem) == (0xFFFE, 0xE0DD):
            return pos + 8
        if (group, elem) != (0xFFFE, 0xE000) or length == _UNDEFINED:
            return None
        pos += 8 + length
    return None


def _walk(st: _Stream, pos: int, size: int, explicit: bool, out: RawHeader) -> None:
    buf, base = st.buf, st.base
    blen = len(buf)
    while pos < size:
        if pos + 8 > size:
            raise RawHeaderError("truncated", f"file ends at byte {size}, inside an element header at byte {pos}")
        off = pos - base
        if 0 <= off and off + 12 <= blen:  # fast path: the element header is in the buffer
            group, elem, vr, length = _HEAD.unpack_from(buf, off)
            tag = (group << 16) | elem
            if not explicit or group == 0xFFFE:
                vr, length, vstart = None, _U32.unpack_from(buf, off + 4)[0], pos + 8
            elif vr in _LONG_VRS:
                length, vstart = _U32.unpack_from(buf, off + 8)[0], pos + 12
            else:
                vstart = pos + 8
        else:
            tag, vr, length, vstart = _element_head(st, pos, explicit)
            buf, base = st.buf, st.base
            blen = len(buf)
        if tag == PIXEL_DATA:
            out.pixel_offset = vstart
            if length == _UNDEFINED:
                out.pixel_length = -1
                st.fh.seek(max(vstart, size - 8))
                if st.fh.read(8) != _SEQ_END_BYTES:  # data set trailing padding, or bytes appended: find the marker
                    out.pixel_end = _encapsulated_end(st.fh, vstart, size)
                    if out.pixel_end is None:
                        out.truncated = "the compressed pixel data has no end-of-sequence marker"
            else:
                out.pixel_length = length
                if vstart + length > size:
                    out.truncated = (
                        f"the file is cut short: its pixel data needs {length} bytes but only {size - vstart} of them "
                        f"are present (the pixel data starts at byte {vstart}; the file is {size} bytes in all)"
                    )
            return
        if length == _UNDEFINED:
            pos = _skip_undefined(st, vstart, explicit and vr != b"UN")
            buf, base = st.buf, st.base
            blen = len(buf)
            continue
        want = WANTED.get(tag)
        if want is not None:
            voff = vstart - base
            if 0 <= voff and voff + length <= blen:
                raw = buf[voff : voff + length]
            else:
                raw = st.get(vstart, length)
                buf, base = st.buf, st.base
                blen = len(buf)
            if want[1] == "us":
                out.values[want[0]] = _U16.unpack_from(raw)[0] if length >= 2 else None
            elif want[1] == "bin":
                out.values[want[0]] = _decode(raw, "bin", vr)
            else:
                out.values[want[0]] = raw.decode("latin-1").strip("\x00 ")
        pos = vstart + length
        if pos > size:
            raise RawHeaderError("truncated", f"file ends at byte {size}, inside element ({tag >> 16:04X},{tag & 0xFFFF:04X})")
