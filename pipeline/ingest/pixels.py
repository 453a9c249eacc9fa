"""Pixel data: parallel reads of stored values and the conversion to HU.

Uncompressed little-endian pixel data is read straight from the file offset
found by the header scan into a preallocated stack (no decoding, no second
header parse). Compressed transfer syntaxes (RLE, JPEG 2000, JPEG lossless,
...) are decoded by pydicom with the pylibjpeg plugins (JPEG-LS by CharLS),
after the structural checks of :mod:`pipeline.ingest.codestream` on each frame:
damaged compressed data is refused naming the file, never decoded into an image
with garbage in it. Both run in a thread pool; numpy and the decoders release
the GIL for the heavy work.

HU = stored value × RescaleSlope + RescaleIntercept, computed over the whole
stack at once; pixels whose stored value is padding (PixelPaddingValue, up to
PixelPaddingRangeLimit: see :mod:`pipeline.ingest.padding`) become
:data:`~pipeline.ingest.padding.PADDING_HU` (-1024 HU, air) instead. The result is
int16 when every slope and intercept is an integer and the HU values fit (the
padding pixels' own stored values left out: they are not in the result), else
float32.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import MissingPixelDataError, TruncatedFileError, UnreadableFileError
from ._pydicom import NATIVE_SYNTAXES, PYDICOM_ERRORS, check_decoder, decode_pixels, read_dataset, through_pixel_data
from .codestream import FrameShape, check_decoded_size, check_encapsulated_pixels
from .discover import os_reason
from .headers import SliceHeader
from .padding import PADDING_HU

log = logging.getLogger(__name__)


def stored_dtype(h: SliceHeader) -> np.dtype:
    """numpy dtype of the stored pixel values (little endian)."""
    bits = h.bits_allocated or 16
    if bits not in (8, 16, 32):
        raise MissingPixelDataError(
            f"BitsAllocated={bits} is not supported for CT images (8, 16 or 32 expected)",
            where=h.path,
            fix="re-export the series with 16-bit pixel data",
        )
    kind = "i" if h.pixel_representation == 1 else "u"
    return np.dtype(f"<{kind}{bits // 8}")


def _read_native(h: SliceHeader, out: np.ndarray) -> None:
    need = out.nbytes
    if h.pixel_length is not None and 0 <= h.pixel_length < need:
        raise TruncatedFileError(
            f"pixel data holds {h.pixel_length} bytes but {h.rows}x{h.columns} pixels need {need}",
            where=h.path,
            fix="copy the file again from the archive/PACS",
        )
    try:
        with open(h.path, "rb") as fh:
            fh.seek(int(h.pixel_offset or 0))
            got = fh.readinto(out.data.cast("B"))
    except OSError as exc:
        raise _unreadable(h, exc) from exc
    if got != need:
        raise TruncatedFileError(
            f"file ends after {got} of {need} pixel data bytes",
            where=h.path,
            fix="copy the file again from the archive/PACS; the transfer was incomplete",
        )


def _read_pydicom(h: SliceHeader, out: np.ndarray, frame_count: int = 1) -> None:

    check_decoder(h.transfer_syntax, h.path)
    try:
        ds = read_dataset(through_pixel_data(h.path, h.pixel_end))
    except OSError as exc:
        raise _unreadable(h, exc) from exc
    except PYDICOM_ERRORS as exc:
        raise TruncatedFileError(
            f"the file cannot be read again ({type(exc).__name__}: {exc})",
            where=h.path,
            fix="copy the file again from the archive/PACS; it may be damaged",
        ) from exc
    shape = FrameShape(int(h.rows or 0), int(h.columns or 0), h.samples_per_pixel, int(h.bits_allocated or 16))
    check_encapsulated_pixels(ds, h.transfer_syntax, shape, n_frames=frame_count, where=h.path)
    arr = decode_pixels(ds, h.transfer_syntax, h.path)
    check_decoded_size(arr.size, out.size, where=h.path)
    out[...] = arr.reshape(out.shape)


def _unreadable(h: SliceHeader, exc: OSError) -> UnreadableFileError:
    return UnreadableFileError(
        f"cannot read the pixel data: {os_reason(exc)} (the header was read during the scan)",
        where=h.path,
        fix="make the file readable again (permissions, storage), then ingest again",
    )


def _fix_bits(stack: np.ndarray, h: SliceHeader) -> None:
    """Mask unused high bits (BitsStored < BitsAllocated), sign-extending signed values, in place."""
    bits, stored = h.bits_allocated or 16, h.bits_stored or h.bits_allocated or 16
    if stored >= bits:
        return
    shift = bits - stored
    if h.pixel_representation == 1:
        np.left_shift(stack, shift, out=stack)
        np.right_shift(stack, shift, out=stack)
    else:
        np.bitwise_and(stack, (1 << stored) - 1, out=stack)


def check_readable(h: SliceHeader) -> None:
    """Raise if the file of ``h`` is truncated or has no pixel data (the errors name the file)."""
    if h.truncated:
        raise TruncatedFileError(
            h.truncated, where=h.path, fix="copy the file again from the archive/PACS; the transfer was incomplete"
        )
    if h.pixel_length is None:
        raise MissingPixelDataError(
            "the image has no PixelData (7FE0,0010) element",
            where=h.path,
            fix="re-export the series from the scanner/PACS with pixel data, or remove this file",
        )


def read_stored(headers: Sequence[SliceHeader], *, workers: int | None = None) -> np.ndarray:
    """Stored values of single-frame files, stacked ``[k, j, i]`` in the given order (threads).

    Each file's values are masked (or sign-extended) to its own BitsStored and read with its own PixelRepresentation:
    the files of one series may differ in them (the stack is int32 when signed and unsigned files meet).
    """
    h0 = headers[0]
    dtypes = [stored_dtype(h) for h in headers]
    dtype = np.result_type(*set(dtypes))  # signed and unsigned 16-bit files together: int32
    stack = np.empty((len(headers), int(h0.rows or 0), int(h0.columns or 0)), dtype=dtype)
    for h in headers:
        check_readable(h)
    syntaxes = {h.transfer_syntax for h in headers}
    for ts in syntaxes:
        check_decoder(ts, next(h.path for h in headers if h.transfer_syntax == ts))

    def job(k: int) -> None:
        h = headers[k]
        out = stack[k] if dtypes[k] == dtype else np.empty(stack.shape[1:], dtype=dtypes[k])
        if not h.use_pydicom and h.transfer_syntax in NATIVE_SYNTAXES and h.pixel_length != -1:
            _read_native(h, out)
        else:
            _read_pydicom(h, out)
        _fix_bits(out, h)  # each file's own BitsStored: a scanner may write 12 on most slices, 16 on one with metal
        if out is not stack[k]:
            stack[k] = out

    run_parallel(job, len(headers), workers)
    return stack


def run_parallel(job: Callable[[int], None], n: int, workers: int | None) -> None:
    """Run ``job(k)`` for k in range(n) on a thread pool; the first error propagates."""
    if workers is None:
        workers = min(8, 2 * (os.cpu_count() or 2))
    if workers <= 1 or n < 4:
        for k in range(n):
            job(k)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(job, range(n)):
            pass


def _integral(values: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(values)) and np.all(values == np.round(values)))


def stored_range(stored: np.ndarray, *, workers: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Smallest and largest stored value of each slice (two float64 arrays)."""
    mins, maxs, _ = padded_range(stored, [None] * stored.shape[0], workers=workers)
    return mins, maxs


def padding_mask(values: np.ndarray, padding: tuple[int, int]) -> np.ndarray:
    """Where ``values`` (stored values) lie in the inclusive ``padding`` range (bool, same shape)."""
    lo, hi = padding
    if np.issubdtype(values.dtype, np.integer):  # a bound beyond the dtype's range cannot match: clip it
        info = np.iinfo(values.dtype)
        if hi < info.min or lo > info.max:
            return np.zeros(values.shape, dtype=bool)
        lo, hi = max(lo, int(info.min)), min(hi, int(info.max))
    if lo == hi:
        return values == values.dtype.type(lo)
    return (values >= values.dtype.type(lo)) & (values <= values.dtype.type(hi))


def padded_range(
    stored: np.ndarray, padding: Sequence[tuple[int, int] | None], *, workers: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per slice: the smallest and largest stored value of the pixels that are not padding (float64; NaN where every
    pixel is padding) and the number of padding pixels (int64). ``padding[k]``: slice k's inclusive range of padding
    stored values, or None (no padding: the range of :func:`stored_range`)."""
    n = stored.shape[0]
    mins = np.empty(n)
    maxs = np.empty(n)
    counts = np.zeros(n, dtype=np.int64)

    def job(k: int) -> None:
        s, p = stored[k], padding[k]
        mask = padding_mask(s, p) if p is not None else None
        c = int(np.count_nonzero(mask)) if mask is not None else 0
        if mask is None or c == 0:
            mins[k], maxs[k] = s.min(), s.max()
        elif c == s.size:
            mins[k] = maxs[k] = np.nan
        else:
            keep = ~mask
            mins[k] = s.min(where=keep, initial=s.max())
            maxs[k] = s.max(where=keep, initial=s.min())
        counts[k] = c

    run_parallel(job, n, workers)
    return mins, maxs, counts


def hu_range(ranges: tuple[np.ndarray, np.ndarray], slopes: np.ndarray, intercepts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-slice HU (lowest, highest) from the stored ranges of :func:`stored_range`."""
    mins, maxs = ranges
    return np.minimum(slopes * mins, slopes * maxs) + intercepts, np.maximum(slopes * mins, slopes * maxs) + intercepts


def to_hu(
    stored: np.ndarray,
    slopes: Sequence[float] | np.ndarray,
    intercepts: Sequence[float] | np.ndarray,
    *,
    workers: int | None = None,
    ranges: tuple[np.ndarray, np.ndarray] | None = None,
    padding: Sequence[tuple[int, int] | None] | None = None,
) -> np.ndarray:
    """HU = stored × slope + intercept per slice (vectorised; may reuse ``stored``'s memory).

    ``padding[k]``: the inclusive range of stored values of slice k that are padding (None: none); those pixels
    become :data:`~pipeline.ingest.padding.PADDING_HU` (-1024 HU). ``ranges``: the :func:`stored_range` of
    ``stored`` when the caller has it (saves a pass); with ``padding``, the :func:`padded_range` (padding left out).
    Returns int16 when every slope/intercept is an integer and the HU values fit int16, else float32.
    """
    n = stored.shape[0]
    s = np.asarray(slopes, dtype=np.float64).reshape(n)
    b = np.asarray(intercepts, dtype=np.float64).reshape(n)
    pads: list[tuple[int, int] | None] = list(padding) if padding is not None else [None] * n
    if ranges is None:
        ranges = padded_range(stored, pads, workers=workers)[:2] if padding is not None else stored_range(stored, workers=workers)
    lo, hi = hu_range(ranges, s, b)
    padded = np.array([p is not None for p in pads], dtype=bool)
    if padded.any():  # the padding pixels are PADDING_HU; a slice of padding only has no other value (NaN)
        lo[padded] = np.fmin(lo[padded], PADDING_HU)
        hi[padded] = np.fmax(hi[padded], PADDING_HU)
    as_int = _integral(s) and _integral(b) and lo.min() >= -32768 and hi.max() <= 32767

    def mask(k: int) -> np.ndarray | None:
        p = pads[k]
        return padding_mask(stored[k], p) if p is not None else None

    def pad(out_k: np.ndarray, m: np.ndarray | None) -> None:  # m: the slice's padding, found before out_k is written
        if m is not None:
            out_k[m] = PADDING_HU

    if as_int and stored.dtype == np.int16 and np.all(s == 1) and np.all(np.abs(b) <= 32767):

        def shift(k: int) -> None:  # in place, int16 wrap-around is exact because the result fits
            m = mask(k)  # before the shift: padding is a stored value
            if b[k]:
                np.add(stored[k], np.int16(b[k]), out=stored[k], casting="unsafe")
            pad(stored[k], m)

        run_parallel(shift, n, workers)
        return stored
    out = np.empty(stored.shape, dtype=np.int16 if as_int else np.float32)
    if as_int:

        def conv(k: int) -> None:
            out[k] = stored[k].astype(np.int32) * np.int32(s[k]) + np.int32(b[k])
            pad(out[k], mask(k))
    else:

        def conv(k: int) -> None:
            out[k] = stored[k].astype(np.float64) * s[k] + b[k]
            pad(out[k], mask(k))

    run_parallel(conv, n, workers)
    return out
