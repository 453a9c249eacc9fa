"""Pixel data: parallel reads of stored values and the conversion to HU.

Uncompressed little-endian pixel data is read straight from the file offset
found by the header scan into a preallocated stack (no decoding, no second
header parse). Compressed transfer syntaxes (RLE, JPEG 2000, JPEG lossless,
...) are decoded by pydicom with the pylibjpeg plugins. Both run in a thread
pool; numpy and the decoders release the GIL for the heavy work.

HU = stored value × RescaleSlope + RescaleIntercept, computed over the whole
stack at once; the result is int16 when every slope and intercept is an
integer and the values fit, else float32.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import MissingPixelDataError, TruncatedFileError, UnreadableFileError
from ._pydicom import NATIVE_SYNTAXES, PYDICOM_ERRORS, check_decoder, decode_failure, syntax_name
from .discover import os_reason
from .headers import SliceHeader

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
    import pydicom  # lazy on purpose: slow to import, needed only for compressed or big-endian files

    check_decoder(h.transfer_syntax, h.path)
    try:
        ds = pydicom.dcmread(h.path)
    except OSError as exc:
        raise _unreadable(h, exc) from exc
    except PYDICOM_ERRORS as exc:
        raise TruncatedFileError(
            f"the file cannot be read again ({type(exc).__name__}: {exc})",
            where=h.path,
            fix="copy the file again from the archive/PACS; it may be damaged",
        ) from exc
    try:
        arr = ds.pixel_array
    except BaseException as exc:
        if not decode_failure(exc):
            raise
        raise TruncatedFileError(
            f"pixel data cannot be decoded ({type(exc).__name__}: {exc}); "
            f"transfer syntax {h.transfer_syntax} ({syntax_name(h.transfer_syntax)})",
            where=h.path,
            fix="copy the file again from the archive/PACS; it may be damaged",
        ) from exc
    if arr.size != out.size:
        raise TruncatedFileError(
            f"decoded pixel data has {arr.size} values, expected {out.size}",
            where=h.path,
            fix="copy the file again from the archive/PACS",
        )
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
    """Stored values of single-frame files, stacked ``[k, j, i]`` in the given order (threads)."""
    h0 = headers[0]
    dtype = stored_dtype(h0)
    stack = np.empty((len(headers), int(h0.rows or 0), int(h0.columns or 0)), dtype=dtype)
    for h in headers:
        check_readable(h)
    syntaxes = {h.transfer_syntax for h in headers}
    for ts in syntaxes:
        check_decoder(ts, next(h.path for h in headers if h.transfer_syntax == ts))

    def job(k: int) -> None:
        h = headers[k]
        if not h.use_pydicom and h.transfer_syntax in NATIVE_SYNTAXES and h.pixel_length != -1:
            _read_native(h, stack[k])
        else:
            _read_pydicom(h, stack[k])

    run_parallel(job, len(headers), workers)
    if (h0.bits_stored or 16) < (h0.bits_allocated or 16):
        _fix_bits(stack, h0)
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
    n = stored.shape[0]
    mins = np.empty(n)
    maxs = np.empty(n)

    def minmax(k: int) -> None:
        mins[k], maxs[k] = stored[k].min(), stored[k].max()

    run_parallel(minmax, n, workers)
    return mins, maxs


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
) -> np.ndarray:
    """HU = stored × slope + intercept per slice (vectorised; may reuse ``stored``'s memory).

    ``ranges``: the :func:`stored_range` of ``stored`` when the caller has it (saves a pass).
    Returns int16 when every slope/intercept is an integer and the result fits int16, else float32.
    """
    n = stored.shape[0]
    s = np.asarray(slopes, dtype=np.float64).reshape(n)
    b = np.asarray(intercepts, dtype=np.float64).reshape(n)
    lo, hi = hu_range(ranges if ranges is not None else stored_range(stored, workers=workers), s, b)
    as_int = _integral(s) and _integral(b) and lo.min() >= -32768 and hi.max() <= 32767
    if as_int and stored.dtype == np.int16 and np.all(s == 1) and np.all(np.abs(b) <= 32767):

        def shift(k: int) -> None:  # in place, int16 wrap-around is exact because the result fits
            if b[k]:
                np.add(stored[k], np.int16(b[k]), out=stored[k], casting="unsafe")

        run_parallel(shift, n, workers)
        return stored
    out = np.empty(stored.shape, dtype=np.int16 if as_int else np.float32)
    if as_int:

        def conv(k: int) -> None:
            out[k] = stored[k].astype(np.int32) * np.int32(s[k]) + np.int32(b[k])
    else:

        def conv(k: int) -> None:
            out[k] = stored[k].astype(np.float64) * s[k] + b[k]

    run_parallel(conv, n, workers)
    return out
