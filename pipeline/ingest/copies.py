"""Files that hold one SOP instance twice: copies (one is kept) or different images under one SOPInstanceUID.

Archives and exports hold the same instance more than once (a series sent again, a DICOMDIR tree beside a flat
copy): those copies are one image, and one file of each is kept. A file that reuses an SOPInstanceUID for a
different image (a corrected image sent again under its old UID, a different slice position, another rescale) is not
a copy: which of the two is right cannot be told from the files, so the series it belongs to is refused naming both.
Positions are DICOM patient coordinates (LPS, mm).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..errors import CtpipeError, DuplicateSliceError
from .discover import SkippedFile
from .headers import SliceHeader
from .pixels import read_stored

log = logging.getLogger(__name__)

#: Header fields that make two files of one SOPInstanceUID different images (with their names in messages), and
#: how far their values may lie apart in copies (positions and spacings in mm, written again with other digits).
_IMAGE_FIELDS = (
    ("position", "ImagePositionPatient (0020,0032)", 1e-3),
    ("orientation", "ImageOrientationPatient (0020,0037)", 1e-5),
    ("pixel_spacing", "PixelSpacing (0028,0030)", 1e-5),
    ("rows", "Rows (0028,0010)", 0.0),
    ("columns", "Columns (0028,0011)", 0.0),
    ("n_frames", "NumberOfFrames (0028,0008)", 0.0),
    ("slope", "RescaleSlope (0028,1053)", 1e-9),
    ("intercept", "RescaleIntercept (0028,1052)", 1e-9),
)


def _close(va: object, vb: object, tol: float) -> bool:
    if va is None or vb is None:
        return va is vb
    a = np.asarray(va, dtype=np.float64)
    b = np.asarray(vb, dtype=np.float64)
    return a.shape == b.shape and bool(np.all((np.abs(a - b) <= tol) | (np.isnan(a) & np.isnan(b))))


@dataclass(frozen=True)
class Conflict:
    """Two files of one SOPInstanceUID that hold different images: ``kept`` stays in its series (which is refused),
    ``other`` is left out; ``how`` says what differs."""

    kept: SliceHeader
    other: SliceHeader
    how: str

    def error(self, where: str) -> DuplicateSliceError:
        """The error that refuses the series of ``kept`` (``where``: the series in words)."""
        return DuplicateSliceError(
            f"two files hold SOP instance {self.kept.sop_instance} with different images ({self.how}): "
            f"{self.kept.path} and {self.other.path}; an SOPInstanceUID names one image, so one of them was changed "
            "and sent again under its old SOPInstanceUID, or is damaged",
            where=where,
            fix="find out from the archive/PACS which file is current (retrieve the series again into an empty "
            "folder), keep that one and remove the other, then ingest again",
        )


def _differences(a: SliceHeader, b: SliceHeader) -> str | None:
    """What makes ``a`` and ``b`` different images, in words, or None when they are copies of one image."""
    out = []
    for attr, name, tol in _IMAGE_FIELDS:
        va, vb = getattr(a, attr), getattr(b, attr)
        if not _close(va, vb, tol):
            out.append(f"{name} {va} and {vb}")
    if out:
        return "; ".join(out)
    try:
        if a.transfer_syntax == b.transfer_syntax and not (a.use_pydicom or b.use_pydicom):
            same = _same_pixel_bytes(a, b)  # one encoding, the pixel data located: their bytes tell
        elif a.n_frames == 1 and b.n_frames == 1:  # transcoded by an archive (e.g. to JPEG 2000), or deflated as a
            # whole (one header value changed changes every byte after it): the decoded values
            same = np.array_equal(read_stored([a], workers=0), read_stored([b], workers=0))
        else:
            log.info("copies of SOP instance %s in two transfer syntaxes: pixel data not compared", a.sop_instance)
            return None
    except (CtpipeError, OSError) as exc:  # a damaged copy: the whole one is kept, the other fails where it is read
        log.info("copies of SOP instance %s not compared: %s", a.sop_instance, exc)
        return None
    return None if same else "their pixel data differ"


def _pixel_range(h: SliceHeader) -> tuple[int, int]:
    """Where the pixel data of ``h`` lie in its file: [start, end) in bytes."""
    start = h.pixel_offset or 0
    if h.pixel_length is not None and h.pixel_length >= 0:
        return start, start + h.pixel_length
    return start, h.pixel_end if h.pixel_end is not None else h.file_size


def _same_pixel_bytes(a: SliceHeader, b: SliceHeader, chunk: int = 1 << 20) -> bool:
    """Whether the two files hold the same pixel data bytes (read in 1 MiB chunks)."""
    (a0, a1), (b0, b1) = _pixel_range(a), _pixel_range(b)
    if a1 - a0 != b1 - b0:
        return False
    with open(a.path, "rb") as fa, open(b.path, "rb") as fb:
        fa.seek(a0)
        fb.seek(b0)
        left = a1 - a0
        while left > 0:
            n = min(chunk, left)
            da, db = fa.read(n), fb.read(n)
            if da != db:
                return False
            if len(da) < n:  # both end early alike
                return True
            left -= n
    return True


def _whole(h: SliceHeader) -> tuple[bool, bool]:
    return h.truncated is None, h.pixel_length is not None


def drop_copies(headers: list[SliceHeader], skipped: list[SkippedFile]) -> tuple[list[SliceHeader], dict[str, Conflict]]:
    """Keep one file per SOPInstanceUID; the other copies are skipped with a reason (kind ``duplicate_copy``, or
    ``conflicting_copy`` for a file whose image differs from the kept one's). A whole copy is kept rather than
    a truncated one or one without pixel data (a series sent again after a broken transfer), else the first.

    Returns the headers kept and, by SOPInstanceUID, the :class:`Conflict` of each instance held by two files of one
    series whose images differ (the first of them is kept; its series is to be refused with :meth:`Conflict.error`).
    Two files whose images differ and whose SeriesInstanceUIDs differ are both kept, each in its series."""
    kept: dict[str, SliceHeader] = {}
    conflicts: dict[str, Conflict] = {}
    order: list[SliceHeader | str] = []  # headers without a UID, and the UIDs in the order first seen
    for h in headers:
        if not h.sop_instance:
            order.append(h)
            continue
        first = kept.get(h.sop_instance)
        if first is None:
            kept[h.sop_instance] = h
            order.append(h.sop_instance)
            continue
        keep, drop = (h, first) if _whole(h) > _whole(first) else (first, h)
        kept[h.sop_instance] = keep
        if _whole(keep) == _whole(drop) == (True, True) and h.sop_instance not in conflicts:
            how = _differences(keep, drop)
            if how is not None and keep.series_uid != drop.series_uid:
                # different images in different series: each series keeps its file, only the UID is shared
                log.info(
                    "%s and %s: SOP instance %s reused for another image in another series", keep.path, drop.path, h.sop_instance
                )
                order.append(drop)
                continue
            if how is not None:
                conflicts[h.sop_instance] = Conflict(keep, drop, how)
                skipped.append(
                    SkippedFile(
                        drop.path,
                        "conflicting_copy",
                        f"a different image under SOP instance {h.sop_instance} ({how}) than {keep.path}: the series is refused",
                    )
                )
                continue
        why = (
            ", not truncated"
            if drop.truncated and not keep.truncated
            else ", with pixel data"
            if _whole(keep) > _whole(drop)
            else ""
        )
        skipped.append(
            SkippedFile(drop.path, "duplicate_copy", f"another copy of SOP instance {h.sop_instance} (kept {keep.path}{why})")
        )
    return [kept[x] if isinstance(x, str) else x for x in order], conflicts
