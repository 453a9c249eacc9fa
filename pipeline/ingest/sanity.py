"""Plausibility checks of the values ingest takes from DICOM files, so that absurd ones are refused at ingest.

A header can be well formed and still hold values no CT image has: a RescaleSlope of 0,
NaN or 1e30, Rows × Columns that do not match the pixel data, stored values that rescale
to millions of HU. Taken as they are, such values are silently replaced, crop the image
or fail much later far from their cause. Each check here raises
:class:`~pipeline.errors.CorruptHeaderError` naming the file (or frame), the value and the fix.

Limits (documented in the error messages too):

* RescaleSlope: a finite number, not 0, ``|slope| <= SLOPE_MAX`` (1e4);
* RescaleIntercept: a finite number, ``|intercept| <= INTERCEPT_MAX`` (1e5);
* uncompressed pixel data: exactly Rows × Columns × SamplesPerPixel × frames ×
  BitsAllocated / 8 bytes (plus one pad byte when that is odd), neither more nor less;
* HU after rescale: within ``HU_REFUSED`` = (−67,584, +98,303), the plausible CT range
  ``HU_PLAUSIBLE`` (−2048..+32767) widened by the span of a 16-bit store (65,536), so that
  padding values such as −33,792 (stored −32,768, intercept −1024) still pass.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import CorruptHeaderError
from ._pydicom import NATIVE_SYNTAXES
from .headers import SliceHeader

log = logging.getLogger(__name__)

SLOPE_MAX = 1e4
INTERCEPT_MAX = 1e5
HU_PLAUSIBLE = (-2048, 32767)
HU_REFUSED = (HU_PLAUSIBLE[0] - 65536, HU_PLAUSIBLE[1] + 65536)

_REEXPORT = "re-export the series from the scanner/PACS; the header is damaged or was edited wrongly"


def check_rescale(
    slope: float, intercept: float, *, where: str | Path, slope_text: str | None = None, intercept_text: str | None = None
) -> None:
    """Refuse a slope that is not finite, 0 or beyond ±SLOPE_MAX, and an intercept not finite or beyond ±INTERCEPT_MAX.

    ``*_text``: the header's text of the value, quoted in the message when it is not a number.
    """

    def shown(value: float, text: str | None) -> str:
        return repr(text) if text is not None and math.isnan(value) else f"{value:g}"

    if not math.isfinite(slope) or slope == 0 or abs(slope) > SLOPE_MAX:
        raise CorruptHeaderError(
            f"RescaleSlope (0028,1053) is {shown(slope, slope_text)}; a CT image needs a finite, non-zero slope "
            f"within ±{SLOPE_MAX:g}",
            where=where,
            fix=_REEXPORT,
        )
    if not math.isfinite(intercept) or abs(intercept) > INTERCEPT_MAX:
        raise CorruptHeaderError(
            f"RescaleIntercept (0028,1052) is {shown(intercept, intercept_text)}; a CT image needs a finite intercept "
            f"within ±{INTERCEPT_MAX:g}",
            where=where,
            fix=_REEXPORT,
        )


def check_header_values(h: SliceHeader) -> None:
    """Rescale values (single-frame files) and the matrix size against the pixel data length (uncompressed files):
    less pixel data than Rows × Columns need, or a row or more in excess, is refused; less than a row in excess is
    padding after the image, left out."""
    if not h.is_enhanced:  # multi-frame rescale lives in the functional groups: checked per frame when planning
        check_rescale(
            h.slope,
            h.intercept,
            where=h.path,
            slope_text=h.extra_value("RescaleSlope"),
            intercept_text=h.extra_value("RescaleIntercept"),
        )
    rows, cols = int(h.rows or 0), int(h.columns or 0)
    if rows <= 0 or cols <= 0:
        raise CorruptHeaderError(
            f"Rows × Columns is {rows} × {cols}; an image needs at least one pixel", where=h.path, fix=_REEXPORT
        )
    native = h.transfer_syntax in NATIVE_SYNTAXES and not h.use_pydicom
    if not native or h.pixel_length is None or h.pixel_length < 0 or h.truncated:
        return
    bits = h.bits_allocated or 16
    need_bits = rows * cols * h.samples_per_pixel * h.n_frames * bits
    need = (need_bits + 7) // 8
    if h.pixel_length in (need, need + need % 2):
        return
    row = (cols * h.samples_per_pixel * bits + 7) // 8
    if need < h.pixel_length < need + row:  # less than a row more: padding after the image (pydicom drops it too)
        log.info("%s: %d bytes of padding after the pixel data left out", h.path, h.pixel_length - need)
        return
    frames = f" × {h.n_frames} frames" if h.n_frames > 1 else ""
    raise CorruptHeaderError(
        f"Rows × Columns = {rows} × {cols} ({h.samples_per_pixel} sample(s), {bits} bits{frames}) needs {need} bytes of "
        f"pixel data but PixelData (7FE0,0010) holds {h.pixel_length}: the header does not describe this image",
        where=h.path,
        fix=_REEXPORT,
    )


def check_hu_range(
    lo: np.ndarray, hi: np.ndarray, names: Sequence[str], slopes: np.ndarray, intercepts: np.ndarray, *, where: str
) -> None:
    """Refuse when a slice's HU range (``lo``/``hi`` per slice, after rescale) leaves :data:`HU_REFUSED`."""
    bad = np.flatnonzero((lo < HU_REFUSED[0]) | (hi > HU_REFUSED[1]))
    if not bad.size:
        return
    k = int(bad[0])
    more = f" (and {bad.size - 1} more slice(s))" if bad.size > 1 else ""
    raise CorruptHeaderError(
        f"{names[k]}: HU after rescale span {lo[k]:.6g}..{hi[k]:.6g} (RescaleSlope {slopes[k]:g}, RescaleIntercept "
        f"{intercepts[k]:g}){more}, far outside the CT range {HU_PLAUSIBLE[0]}..{HU_PLAUSIBLE[1]} "
        f"(refused beyond {HU_REFUSED[0]}..{HU_REFUSED[1]})",
        where=where,
        fix="check RescaleSlope/RescaleIntercept and the pixel data of that file; " + _REEXPORT,
    )
