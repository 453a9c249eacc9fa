"""Lossy compression of a series: LossyImageCompression (0028,2110) and the lossy transfer syntaxes.

A file was lossy compressed when its LossyImageCompression is ``01`` (PS3.3 C.7.6.1.1.5: once lossy compressed,
an image keeps ``01`` even when it is later stored uncompressed) or when its transfer syntax is a lossy one
(:data:`LOSSY_TRANSFER_SYNTAXES`: JPEG baseline and extended, JPEG-LS near-lossless, JPEG 2000, HTJ2K, JPEG XL and
the video syntaxes). JPEG 2000 (1.2.840.10008.1.2.4.91), JPEG 2000 Part 2 (.93) and HTJ2K (.4.203) may also hold
reversibly compressed images: those count as lossy unless the file says ``00``. A series with one lossy
compressed file is lossy compressed: :func:`lossy_compression` gives the metadata ingest records
(LossyImageCompression ``01`` with the ratio and method (0028,2112)/(0028,2114) when the files give them; the
method otherwise from the transfer syntax, the ratio from the size of the compressed pixel data) and
:func:`lossy_warnings` the series warning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..volume import LOSSY_NOTE, lossy_detail
from .headers import SliceHeader

#: transfer syntax UID → (name, LossyImageCompressionMethod defined term) of the syntaxes that compress lossily
LOSSY_TRANSFER_SYNTAXES: dict[str, tuple[str, str]] = {
    "1.2.840.10008.1.2.4.50": ("JPEG Baseline", "ISO_10918_1"),
    "1.2.840.10008.1.2.4.51": ("JPEG Extended", "ISO_10918_1"),
    "1.2.840.10008.1.2.4.81": ("JPEG-LS Near-Lossless", "ISO_14495_1"),
    "1.2.840.10008.1.2.4.91": ("JPEG 2000", "ISO_15444_1"),
    "1.2.840.10008.1.2.4.93": ("JPEG 2000 Part 2 Multi-component", "ISO_15444_2"),
    "1.2.840.10008.1.2.4.100": ("MPEG2 Main Profile", "ISO_13818_2"),
    "1.2.840.10008.1.2.4.101": ("MPEG2 High Profile", "ISO_13818_2"),
    "1.2.840.10008.1.2.4.102": ("MPEG-4 AVC/H.264", "ISO_14496_10"),
    "1.2.840.10008.1.2.4.103": ("MPEG-4 AVC/H.264 BD-compatible", "ISO_14496_10"),
    "1.2.840.10008.1.2.4.104": ("MPEG-4 AVC/H.264 2D video", "ISO_14496_10"),
    "1.2.840.10008.1.2.4.105": ("MPEG-4 AVC/H.264 3D video", "ISO_14496_10"),
    "1.2.840.10008.1.2.4.106": ("MPEG-4 AVC/H.264 Stereo", "ISO_14496_10"),
    "1.2.840.10008.1.2.4.107": ("HEVC/H.265 Main Profile", "ISO_23008_2"),
    "1.2.840.10008.1.2.4.108": ("HEVC/H.265 Main 10 Profile", "ISO_23008_2"),
    "1.2.840.10008.1.2.4.112": ("JPEG XL", "ISO_18181_1"),
    "1.2.840.10008.1.2.4.203": ("HTJ2K", "ISO_15444_15"),
}
#: lossy transfer syntaxes that may also hold reversibly compressed images: lossless when the file says ``00``
MAY_BE_LOSSLESS = frozenset({"1.2.840.10008.1.2.4.91", "1.2.840.10008.1.2.4.93", "1.2.840.10008.1.2.4.203"})

LOSSY_ATTRIBUTE = "LossyImageCompression (0028,2110)"


def is_lossy(transfer_syntax: str | None, lossy_attribute: object) -> bool:
    """Whether a file of ``transfer_syntax`` whose LossyImageCompression is ``lossy_attribute`` (text or None) was
    lossy compressed (see the module docstring)."""
    attr = str(lossy_attribute or "").strip()
    if attr == "01":
        return True
    ts = str(transfer_syntax or "").strip()
    if ts in LOSSY_TRANSFER_SYNTAXES:
        return not (attr == "00" and ts in MAY_BE_LOSSLESS)
    return False


def _values(text: str | None) -> list[str]:
    return [v.strip() for v in str(text or "").split("\\") if v.strip()]


def _ratios(text: str | None) -> list[float]:
    out = []
    for v in _values(text):
        try:
            ratio = float(v)
        except ValueError:
            continue
        if ratio > 0:
            out.append(ratio)
    return out


def _lossy_files(headers: Sequence[SliceHeader]) -> list[SliceHeader]:
    return [h for h in headers if is_lossy(h.transfer_syntax, h.extra_value("LossyImageCompression"))]


#: the Sequence Delimitation Item ending encapsulated pixel data (PS3.5 A.4): not compressed image data
_SEQUENCE_DELIMITER_BYTES = 8


def estimated_ratio(h: SliceHeader) -> float | None:
    """The compression ratio of a file in a lossy transfer syntax, from its header: the uncompressed size of its
    image (Rows × Columns × SamplesPerPixel × BitsAllocated/8 × frames) over the length of its encapsulated pixel
    data (the PixelData (7FE0,0010) value up to its end-of-sequence marker: the fragments with their item tags and
    the basic offset table), rounded to 2 decimals; None for another file, or one whose pixel data was not located
    or is truncated."""
    if h.transfer_syntax not in LOSSY_TRANSFER_SYNTAXES or h.use_pydicom or h.truncated:
        return None
    if h.pixel_length != -1 or not h.pixel_offset or not (h.rows and h.columns and h.bits_allocated):
        return None
    end = h.pixel_end if h.pixel_end is not None else h.file_size  # trailing padding or bytes appended left out
    compressed = end - h.pixel_offset - _SEQUENCE_DELIMITER_BYTES
    if compressed <= 0:
        return None
    uncompressed = h.rows * h.columns * max(h.samples_per_pixel, 1) * h.bits_allocated / 8 * max(h.n_frames, 1)
    return round(uncompressed / compressed, 2)


def lossy_compression(headers: Sequence[SliceHeader]) -> dict[str, Any]:
    """The lossy compression metadata of a series (empty when no file of ``headers`` was lossy compressed).

    ``LossyImageCompression`` ``"01"``; ``LossyImageCompressionRatio`` (floats) and ``LossyImageCompressionMethod``
    (defined terms), one per successive compression, as the file compressed the most states them (the largest first
    ratio; else the first file stating a method); the method of the transfer syntaxes when no lossy file states
    one; ``LossyCompressedFiles``: how many of the files were lossy compressed. When no lossy file states a ratio,
    the ratio is the largest :func:`estimated_ratio` of the files in a lossy transfer syntax (with that file's
    method, stated or of its syntax) and ``LossyImageCompressionRatioEstimated`` is True; no ratio when none can
    be estimated either.
    """
    lossy = _lossy_files(headers)
    if not lossy:
        return {}
    stated = [h for h in lossy if _ratios(h.extra_value("LossyImageCompressionRatio"))]
    estimates = {h: r for h in ([] if stated else lossy) if (r := estimated_ratio(h)) is not None}
    if stated:
        source = max(stated, key=lambda h: _ratios(h.extra_value("LossyImageCompressionRatio"))[0])
    elif estimates:
        source = max(estimates, key=lambda h: estimates[h])
    else:
        source = next((h for h in lossy if _values(h.extra_value("LossyImageCompressionMethod"))), lossy[0])
    ratios = _ratios(source.extra_value("LossyImageCompressionRatio")) or ([estimates[source]] if source in estimates else [])
    methods = _values(source.extra_value("LossyImageCompressionMethod")) or list(
        dict.fromkeys(
            LOSSY_TRANSFER_SYNTAXES[h.transfer_syntax][1]
            for h in ([source] if source in estimates else lossy)
            if h.transfer_syntax in LOSSY_TRANSFER_SYNTAXES
        )
    )
    md: dict[str, Any] = {"LossyImageCompression": "01"}
    if ratios:
        md["LossyImageCompressionRatio"] = ratios
    if source in estimates:
        md["LossyImageCompressionRatioEstimated"] = True
    if methods:
        md["LossyImageCompressionMethod"] = methods
    md["LossyCompressedFiles"] = len(lossy)
    return md


def lossy_warnings(headers: Sequence[SliceHeader]) -> list[str]:
    """The series warning of a lossy compressed series (none for a series without lossy compressed files): the
    quality flag's sentence with the ratio and method, how many files and why they count as lossy."""
    lossy = _lossy_files(headers)
    if not lossy:
        return []
    attribute = any(str(h.extra_value("LossyImageCompression") or "").strip() == "01" for h in lossy)
    why = [f"{LOSSY_ATTRIBUTE} 01"] if attribute else []
    why += [
        f"transfer syntax {ts} ({LOSSY_TRANSFER_SYNTAXES[ts][0]})"
        for ts in dict.fromkeys(h.transfer_syntax for h in lossy)
        if ts in LOSSY_TRANSFER_SYNTAXES
    ]
    metadata = lossy_compression(lossy)
    estimated = (
        "; the files state no LossyImageCompressionRatio (0028,2112): the ratio is estimated from the size of the "
        "compressed pixel data"
        if metadata.get("LossyImageCompressionRatioEstimated")
        else ""
    )
    message = lossy_flag_message(metadata)
    return [f"{message}; {len(lossy)} of {len(headers)} file(s) lossy compressed ({', '.join(why)}){estimated}"]


def lossy_flag_message(metadata: Mapping[str, Any]) -> str:
    """The ``lossy_compressed`` quality flag's sentence with its detail, for a lossy compressed series' metadata."""
    detail = lossy_detail(metadata)
    return f"{LOSSY_NOTE} ({detail})" if detail else LOSSY_NOTE
