"""Pixel padding: PixelPaddingValue (0028,0120) and PixelPaddingRangeLimit (0028,0121).

Scanners mark the pixels outside the reconstruction circle (and other pixels that are not part of the
image) with a padding value, given in stored pixel values (before RescaleSlope/RescaleIntercept). DICOM
PS3.3 C.7.5.1.1.2: a pixel is padding when its stored value equals PixelPaddingValue or, when
PixelPaddingRangeLimit is present, lies between the two values (inclusive). PixelPaddingValue alone is
enough: without the range limit only the one value is padding. Both are US or SS after the file's
PixelRepresentation (0: unsigned, 1: signed); in implicit VR files their two bytes carry no VR and are read
with PixelRepresentation, and a US value in a signed image (or SS in an unsigned one) is read the same way.
In the CT Image IOD PixelPaddingValue is in the General Equipment module; in Enhanced CT it is at the top
level of the data set too, so it holds for every frame of the file.

Ingest sets padding pixels to :data:`PADDING_HU` (air). Padding attributes that cannot be used (text that is
not a number, several values, a value outside the stored range of BitsStored, a range limit without a
padding value) are ignored with a warning on the series naming the file(s): those pixels keep their
rescaled values, as without the attributes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from .headers import SliceHeader

#: HU given to padding pixels (stored values matching PixelPaddingValue / PixelPaddingRangeLimit): air, -1024 HU,
#: the value of the air around the patient inside the reconstruction circle, so that padding reads as outside
#: the body (not as metal or bone: 63536 unsigned with intercept -1024 would otherwise be +62512 HU) and fits int16.
PADDING_HU = -1024

PADDING_VALUE = "PixelPaddingValue (0028,0120)"
PADDING_LIMIT = "PixelPaddingRangeLimit (0028,0121)"

# explicit VRs holding the value as text (a file written with a wrong VR); any other VR holds binary values
_TEXT_VRS = frozenset({"AE", "AS", "CS", "DA", "DS", "DT", "IS", "LO", "LT", "PN", "SH", "ST", "TM", "UC", "UI", "UR", "UT"})

#: Padding files named in one series warning; the others are counted.
_NAMES_SHOWN = 3


def stored_limits(signed: bool, bits_stored: int | None, bits_allocated: int | None) -> tuple[int, int]:
    """The smallest and largest stored value of ``bits_stored``-bit pixels (signed or unsigned); BitsAllocated or
    16 bits when BitsStored is missing or not a usable number."""
    bits = bits_stored if bits_stored and 1 <= bits_stored <= 32 else bits_allocated
    bits = bits if bits and 1 <= bits <= 32 else 16
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def _as_16bit(value: int, signed: bool) -> int:
    """A 16-bit value read as US or SS after PixelRepresentation (63536 in a signed image is -2000)."""
    if signed and 32768 <= value <= 65535:
        return value - 65536
    if not signed and -32768 <= value < 0:
        return value + 65536
    return value


def _text_value(text: str, signed: bool) -> int:
    text = text.strip("\x00 ")
    if not text:
        raise ValueError("has no value")
    if "\\" in text:
        raise ValueError(f"holds {text.count(chr(92)) + 1} values ({text!r}); one is expected")
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"is {text!r}, not a number") from None
    if not number.is_integer():
        raise ValueError(f"is {text!r}, not a whole number")
    return _as_16bit(int(number), signed)


def _binary_value(data: bytes, signed: bool) -> int:
    if not data:
        raise ValueError("has no value")
    if len(data) % 2:
        raise ValueError(f"holds {len(data)} bytes; one 16-bit value (2 bytes) is expected")
    if len(data) > 2:
        raise ValueError(f"holds {len(data) // 2} values ({len(data)} bytes); one 16-bit value is expected")
    return int(struct.unpack("<h" if signed else "<H", data)[0])


def padding_value(raw: object, signed: bool) -> int | None:
    """One padding attribute as a stored value: ``None`` when absent; raises ValueError (the reason) when unusable.

    ``raw``: what the header scan holds for it: ``(VR, bytes)`` from the raw parser (VR ``""`` in implicit VR
    files; bytes are little endian), an int or text (pydicom). ``signed``: PixelRepresentation is 1.
    """
    if raw is None:
        return None
    if isinstance(raw, tuple) and len(raw) == 2 and isinstance(raw[1], (bytes, bytearray)):
        vr, data = str(raw[0]), bytes(raw[1])
        if vr in _TEXT_VRS:
            return _text_value(data.decode("latin-1"), signed)
        return _binary_value(data, signed)
    if isinstance(raw, bool):
        raise ValueError(f"is {raw!r}, not a number")
    if isinstance(raw, int):
        return _as_16bit(raw, signed)
    if isinstance(raw, (bytes, bytearray)):
        return _binary_value(bytes(raw), signed)
    if isinstance(raw, str):
        return _text_value(raw, signed)
    if isinstance(raw, (list, tuple)):
        raise ValueError(f"holds {len(raw)} values; one is expected")
    raise ValueError(f"is {raw!r}, not a number")


def pixel_padding(
    value: object,
    limit: object,
    *,
    signed: bool,
    bits_stored: int | None,
    bits_allocated: int | None,
) -> tuple[tuple[int, int] | None, str | None]:
    """The padding of one file: (inclusive range of stored values that are padding, or None; why an attribute was
    ignored, or None). ``value``/``limit``: the raw PixelPaddingValue and PixelPaddingRangeLimit (see
    :func:`padding_value`); the range is checked against the stored values of BitsStored."""
    lo, hi = stored_limits(signed, bits_stored, bits_allocated)
    kind = f"{'signed' if signed else 'unsigned'} stored values {lo}..{hi}"

    def read(raw: object, name: str) -> int | None:
        try:
            v = padding_value(raw, signed)
        except ValueError as exc:
            raise ValueError(f"{name} {exc}") from None
        if v is not None and not lo <= v <= hi:
            raise ValueError(f"{name} is {v}, outside the {kind} (PixelRepresentation, BitsStored)")
        return v

    kept = "ignored, the pixels keep their rescaled values"
    try:
        v = read(value, PADDING_VALUE)
    except ValueError as exc:
        return None, f"{exc}: {kept}"
    try:
        lim = read(limit, PADDING_LIMIT)
    except ValueError as exc:
        if v is None:
            return None, f"{exc} (and there is no {PADDING_VALUE}): {kept}"
        return (v, v), f"{exc}: ignored, only the {PADDING_VALUE} {v} itself is taken as padding"
    if v is None:
        return None, f"{PADDING_LIMIT} is present without PixelPaddingValue (0028,0120): {kept}" if lim is not None else None
    if lim is None:
        return (v, v), None
    return (min(v, lim), max(v, lim)), None


def padding_warnings(headers: Sequence[SliceHeader]) -> list[str]:
    """One warning per distinct padding problem among ``headers``, naming the files (the first few, then a count)."""
    files: dict[str, list[str]] = {}
    for h in headers:
        if h.padding_error:
            files.setdefault(h.padding_error, []).append(h.path.name)
    out = []
    for why, names in files.items():
        more = f" and {len(names) - _NAMES_SHOWN} more file(s)" if len(names) > _NAMES_SHOWN else ""
        out.append(f"{', '.join(names[:_NAMES_SHOWN])}{more}: {why}")
    return out
