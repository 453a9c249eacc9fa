"""The UIDs ``ctpipe listen`` files a received instance under, read from its encoded dataset without decoding it.

Decoding a C-STORE request's dataset (pynetdicom's ``event.dataset``) to read its SOP Class, SOP Instance, Study and
Series Instance UIDs (the first two checked against the request's Affected ones) took about 0.25 ms of each instance's CPU time. :func:`read_uids` walks the top-level elements of the dataset
as received instead, up to (0020,000E), in the transfer syntax of its presentation context: Implicit or Explicit
VR, little or big endian, deflated (only the start is inflated), sequences of defined or undefined length (skipped
item by item). It returns None whenever it cannot be sure (elements out of order, a length past the end, an
undefined length on an element that is not a sequence, an unknown transfer syntax); the caller then decodes the
dataset in full.
"""

from __future__ import annotations

import struct
import zlib

IMPLICIT_LE = "1.2.840.10008.1.2"
EXPLICIT_LE = "1.2.840.10008.1.2.1"
DEFLATED_LE = "1.2.840.10008.1.2.1.99"
EXPLICIT_BE = "1.2.840.10008.1.2.2"

SOP_CLASS_UID = 0x00080016
SOP_INSTANCE_UID = 0x00080018
STUDY_INSTANCE_UID = 0x0020000D
SERIES_INSTANCE_UID = 0x0020000E
_WANTED = frozenset((SOP_CLASS_UID, SOP_INSTANCE_UID, STUDY_INSTANCE_UID, SERIES_INSTANCE_UID))

_UNDEFINED = 0xFFFFFFFF
_ITEM, _ITEM_END, _SEQ_END = 0xFFFEE000, 0xFFFEE00D, 0xFFFEE0DD
#: explicit VRs with 2 reserved bytes and a 4-byte length (PS3.5 7.1.2)
_LONG_VRS = frozenset({b"OB", b"OD", b"OF", b"OL", b"OV", b"OW", b"SQ", b"SV", b"UC", b"UN", b"UR", b"UT", b"UV"})
#: bytes of a deflated dataset inflated to find the UIDs (they come within the first few kilobytes)
_INFLATE_BYTES = 65536


class _Unsure(Exception):
    """The dataset is not one this scan can read with certainty."""


def read_uids(raw: bytes, transfer_syntax: str) -> dict[str, str | None] | None:
    """``{"sop_class", "sop_uid", "study_uid", "series_uid"}`` (None where absent) of the encoded dataset ``raw`` (no File Meta
    Information) in ``transfer_syntax``, or None when only a full decode can tell (see the module docstring).

    Values are the elements' text with DICOM's padding (NUL, space) removed; they are not checked here."""
    data = raw
    if transfer_syntax == DEFLATED_LE:
        try:
            data = zlib.decompressobj(-zlib.MAX_WBITS).decompress(raw, _INFLATE_BYTES)
        except zlib.error:
            return None
    elif not transfer_syntax.startswith("1.2.840.10008.1.2"):
        return None
    # the encapsulated (compressed) syntaxes encode the dataset itself in Explicit VR Little Endian
    implicit = transfer_syntax == IMPLICIT_LE
    fmt = ">" if transfer_syntax == EXPLICIT_BE else "<"
    try:
        found = _scan(data, implicit=implicit, fmt=fmt)
    except (_Unsure, struct.error, UnicodeDecodeError):
        return None
    return {
        "sop_class": found.get(SOP_CLASS_UID),
        "sop_uid": found.get(SOP_INSTANCE_UID),
        "study_uid": found.get(STUDY_INSTANCE_UID),
        "series_uid": found.get(SERIES_INSTANCE_UID),
    }


def _scan(data: bytes, *, implicit: bool, fmt: str) -> dict[int, str]:
    found: dict[int, str] = {}
    pos, last, end = 0, -1, len(data)
    while pos < end:
        tag, vr, length, pos = _header(data, pos, implicit=implicit, fmt=fmt)
        if tag <= last:
            raise _Unsure("elements out of order")
        last = tag
        if tag > SERIES_INSTANCE_UID:
            return found
        if length == _UNDEFINED:
            pos = _skip_undefined(data, pos, vr, implicit=implicit, fmt=fmt)
            continue
        if pos + length > end:
            raise _Unsure("a length past the end")
        if tag in _WANTED:
            if vr not in (b"UI", None):
                raise _Unsure("a UID element of another VR")
            found[tag] = data[pos : pos + length].decode("ascii").rstrip("\x00 ")
        pos += length
    if end == _INFLATE_BYTES:  # a deflated dataset inflated in part: what follows is unknown
        raise _Unsure("the inflated start ended before (0020,000E)")
    return found


def _header(data: bytes, pos: int, *, implicit: bool, fmt: str) -> tuple[int, bytes | None, int, int]:
    """(tag, VR or None, value length, position of the value) of the element at ``pos``."""
    group, element = struct.unpack_from(fmt + "HH", data, pos)
    tag = (group << 16) | element
    if implicit or group == 0xFFFE:  # item and delimitation tags carry no VR in any syntax
        (length,) = struct.unpack_from(fmt + "I", data, pos + 4)
        return tag, None, length, pos + 8
    vr = data[pos + 4 : pos + 6]
    if vr in _LONG_VRS:
        (length,) = struct.unpack_from(fmt + "I", data, pos + 8)
        return tag, vr, length, pos + 12
    if len(vr) < 2 or not vr.isalpha() or not vr.isupper():
        raise _Unsure("not an explicit VR")
    (length,) = struct.unpack_from(fmt + "H", data, pos + 6)
    return tag, vr, length, pos + 8


def _skip_undefined(data: bytes, pos: int, vr: bytes | None, *, implicit: bool, fmt: str) -> int:
    """The position after the sequence of undefined length whose items start at ``pos``."""
    if vr not in (b"SQ", None):  # UN or encapsulated data of undefined length: left to the full decode
        raise _Unsure("an undefined length on a value that is not a sequence")
    end = len(data)
    while True:
        tag, _, length, pos = _header(data, pos, implicit=True, fmt=fmt)
        if tag == _SEQ_END:
            return pos
        if tag != _ITEM:
            raise _Unsure("a sequence holding something other than items")
        if length != _UNDEFINED:
            if pos + length > end:
                raise _Unsure("an item past the end")
            pos += length
            continue
        while True:  # an item of undefined length: its elements, up to the item delimitation
            tag, vr_in, length, pos = _header(data, pos, implicit=implicit, fmt=fmt)
            if tag == _ITEM_END:
                break
            if length == _UNDEFINED:
                pos = _skip_undefined(data, pos, vr_in, implicit=implicit, fmt=fmt)
            elif pos + length > end:
                raise _Unsure("an element past the end")
            else:
                pos += length
