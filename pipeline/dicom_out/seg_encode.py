"""Fast encoding of a binary SEG's frames: per-frame functional groups and bit-packed pixel data.

A SEG of a chest CT holds thousands of frames (segments × slices). Building one pydicom Dataset per
frame and serialising it costs about a millisecond a frame; here each frame's functional groups are
assembled from pre-encoded Explicit VR Little Endian byte strings (the pieces that depend on the
slice are encoded once per slice, those that depend on the segment once per segment), and the
pixel data is bit-packed with :func:`numpy.packbits` (first pixel in the least significant bit,
frames back to back, as PS3.5 §8.1.1 requires for Bits Allocated 1).

Each frame carries the macros a viewer needs to place it: Derivation Image (the source image, or
image and frame number, it was derived from), Frame Content (dimension index values: segment
number, then the position's rank along the slice normal), Plane Position (the source image's
ImagePositionPatient, LPS mm) and Segment Identification.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_open
from ..errors import DicomOutputError

_LONG_VRS = frozenset({"OB", "OD", "OF", "OL", "OV", "OW", "SQ", "SV", "UC", "UN", "UR", "UT", "UV"})
PER_FRAME_TAG = 0x52009230
PIXEL_DATA_TAG = 0x7FE00010
SOURCE_PURPOSE = ("121322", "DCM", "Source image for image processing operation")
DERIVATION = ("113076", "DCM", "Segmentation")


def element(tag: int, vr: str, value: bytes) -> bytes:
    """One Explicit VR Little Endian data element; ``value`` must already have even length."""
    head = struct.pack("<HH", tag >> 16, tag & 0xFFFF) + vr.encode("ascii")
    if vr in _LONG_VRS:
        return head + struct.pack("<HI", 0, len(value)) + value
    return head + struct.pack("<H", len(value)) + value


def text(value: str, *, uid: bool = False) -> bytes:
    """A string value padded to even length (UIDs with NUL, other strings with a space)."""
    raw = value.encode("ascii")
    return raw + (b"\0" if uid else b" ") if len(raw) % 2 else raw


def item(content: bytes) -> bytes:
    """A sequence item of defined length."""
    return struct.pack("<HHI", 0xFFFE, 0xE000, len(content)) + content


def sequence(tag: int, items: Iterable[bytes]) -> bytes:
    """A sequence element (defined length) holding already-encoded item contents."""
    return element(tag, "SQ", b"".join(item(c) for c in items))


def code_item(value: str, scheme: str, meaning: str) -> bytes:
    """The content of a code sequence item (CodeValue, CodingSchemeDesignator, CodeMeaning)."""
    return (
        element(0x00080100, "SH", text(value))
        + element(0x00080102, "SH", text(scheme))
        + element(0x00080104, "LO", text(meaning))
    )


@dataclass(frozen=True)
class FrameSource:
    """What a frame at slice ``k`` references, the source image (and frame), and the frame's position (DS strings,
    LPS mm)."""

    sop_class_uid: str
    sop_instance_uid: str
    frame_number: int | None
    position: tuple[str, str, str]
    #: the frame's pixels are the source image's (same position, rows and columns): SpatialLocationsPreserved YES
    locations_preserved: bool = True


def _slice_parts(src: FrameSource) -> tuple[bytes, bytes]:
    """(Derivation Image Sequence, Plane Position Sequence) elements of a frame at this source slice."""
    ref = element(0x00081150, "UI", text(src.sop_class_uid, uid=True)) + element(
        0x00081155, "UI", text(src.sop_instance_uid, uid=True)
    )
    if src.frame_number is not None:
        ref += element(0x00081160, "IS", text(str(src.frame_number)))
    ref += element(0x0028135A, "CS", text("YES" if src.locations_preserved else "NO")) + sequence(
        0x0040A170, [code_item(*SOURCE_PURPOSE)]
    )
    derivation = sequence(0x00089124, [sequence(0x00082112, [ref]) + sequence(0x00089215, [code_item(*DERIVATION)])])
    position = sequence(0x00209113, [element(0x00200032, "DS", text("\\".join(src.position)))])
    return derivation, position


def raw_sequence(tag: int, items: Iterable[bytes]) -> Any:
    """A pydicom RawDataElement holding a sequence of already-encoded items (Explicit VR Little Endian), written as is."""
    from pydicom.dataelem import RawDataElement
    from pydicom.tag import Tag

    value = b"".join(item(c) for c in items)
    return RawDataElement(Tag(tag), "SQ", len(value), value, 0, False, True)


def instance_refs(refs: Iterable[tuple[str, str]]) -> list[bytes]:
    """Encoded items (Referenced SOP Class UID, Referenced SOP Instance UID) of (class, instance) pairs."""
    return [element(0x00081150, "UI", text(c, uid=True)) + element(0x00081155, "UI", text(i, uid=True)) for c, i in refs]


def per_frame_groups(frames: Sequence[tuple[int, int]], sources: Sequence[FrameSource]) -> bytes:
    """The Per-Frame Functional Groups Sequence element for ``frames`` = (segment number, slice k) in file order.

    ``sources[k]`` describes slice k. The position index of a frame is the rank of its slice among the
    slices that occur in the SEG (1-based, in k order).
    """
    used = sorted({k for _, k in frames})
    rank = {k: r + 1 for r, k in enumerate(used)}
    slice_parts = {k: _slice_parts(sources[k]) for k in used}
    seg_parts = {s: sequence(0x0062000A, [element(0x0062000B, "US", struct.pack("<H", s))]) for s in {s for s, _ in frames}}
    chunks = []
    for s, k in frames:
        derivation, position = slice_parts[k]
        content = sequence(0x00209111, [element(0x00209157, "UL", struct.pack("<II", s, rank[k]))])
        chunks.append(item(derivation + content + position + seg_parts[s]))
    body = b"".join(chunks)
    return struct.pack("<HH", PER_FRAME_TAG >> 16, PER_FRAME_TAG & 0xFFFF) + b"SQ" + struct.pack("<HI", 0, len(body)) + body


class SegmentFrames:
    """The frames of one segment: boolean slices ``[rows, cols]`` at slices ``ks`` of a full mask or of a crop.

    full: bool ``[k, j, i]`` on the volume's grid; or crop: bool ``[k, j, i]`` placed at ``offset_kji``
    (slices outside the crop are empty).
    """

    def __init__(
        self,
        *,
        shape: tuple[int, int, int],
        ks: Sequence[int],
        full: np.ndarray | None = None,
        crop: np.ndarray | None = None,
        offset_kji: tuple[int, int, int] = (0, 0, 0),
    ):
        self.shape = shape
        self.ks = list(ks)
        self.full = full
        self.crop = crop
        self.offset = offset_kji

    def _runs(self) -> Iterator[list[int]]:
        """``ks`` split into runs of consecutive slices."""
        run: list[int] = []
        for k in self.ks:
            if run and k != run[-1] + 1:
                yield run
                run = []
            run.append(k)
        if run:
            yield run

    def frames(self, ks: Sequence[int]) -> np.ndarray:
        """Bool frames ``[len(ks), rows, cols]`` at slices ``ks``."""
        _, rows, cols = self.shape
        if self.full is not None:
            return self.full[ks[0] : ks[-1] + 1] if list(ks) == list(range(ks[0], ks[-1] + 1)) else self.full[list(ks)]
        out = np.zeros((len(ks), rows, cols), dtype=bool)
        if self.crop is not None:
            k0, j0, i0 = self.offset
            nk, nj, ni = self.crop.shape
            for n, k in enumerate(ks):
                if k0 <= k < k0 + nk:
                    out[n, j0 : j0 + nj, i0 : i0 + ni] = self.crop[k - k0]
        return out

    def packed(self) -> Iterator[bytes | np.ndarray]:
        """The frames bit-packed (each frame a whole number of bytes: rows × cols divisible by 8), in ``ks`` order,
        as byte strings or uint8 arrays."""
        _, rows, cols = self.shape
        frame_bytes = rows * cols // 8
        for run in self._runs():
            if self.full is not None:
                yield np.packbits(self.full[run[0] : run[-1] + 1], bitorder="little")
                continue
            k0 = self.offset[0]
            k1 = k0 + (self.crop.shape[0] if self.crop is not None else 0)
            inside = [k for k in run if k0 <= k < k1]
            before = sum(1 for k in run if k < k0)
            after = len(run) - before - len(inside)
            if before:
                yield bytes(before * frame_bytes)
            if inside:
                yield np.packbits(self.frames(inside), bitorder="little")
            if after:
                yield bytes(after * frame_bytes)


def pack_frames(segments: Sequence[SegmentFrames]) -> list[bytes | np.ndarray]:
    """Bit-packed pixel data of all segments' frames, segment after segment, as chunks in file order (byte strings
    or uint8 arrays, written without a copy)."""
    if not segments:
        return []
    _, rows, cols = segments[0].shape
    if (rows * cols) % 8 == 0:  # each frame ends on a byte: pack run by run
        return [chunk for seg in segments for chunk in seg.packed()]
    # frames share bytes: pack everything at once
    allframes = np.concatenate([seg.frames(seg.ks) for seg in segments], axis=0)
    return [np.packbits(allframes, bitorder="little")]


def write_seg_file(path: Path, head: Any, per_frame: bytes, pixels: Sequence[bytes | np.ndarray]) -> Path:
    """Write ``head`` (a pydicom Dataset with file_meta, no per-frame groups or pixel data) followed by the raw
    per-frame functional groups and the pixel data (``pixels``: byte chunks, padded here to even length),
    atomically. Every element of ``head`` must sort before the Per-Frame Functional Groups Sequence (5200,9230)."""
    from pydicom import dcmwrite

    late = [elem.tag for elem in head if elem.tag >= PER_FRAME_TAG]
    if late:
        raise DicomOutputError(
            f"header elements {late} would follow the per-frame functional groups (5200,9230)",
            where=str(path),
            fix="keep such attributes out of the SEG header",
        )
    path = Path(path)
    with atomic_open(path) as fh:
        dcmwrite(fh, head, enforce_file_format=True)
        fh.write(per_frame)
        size = sum(len(c) if isinstance(c, bytes) else c.nbytes for c in pixels)
        pad = size % 2
        fh.write(struct.pack("<HH", PIXEL_DATA_TAG >> 16, PIXEL_DATA_TAG & 0xFFFF) + b"OB" + struct.pack("<HI", 0, size + pad))
        for chunk in pixels:
            fh.write(chunk if isinstance(chunk, bytes) else np.ascontiguousarray(chunk).data)
        if pad:
            fh.write(b"\0")
    return path
