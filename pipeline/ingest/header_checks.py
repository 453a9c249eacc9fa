"""Checks of one (sub-)series' headers before any pixel is read (:func:`.build.plan_volume`).

:func:`check_headers` refuses a series that is not CT or not grayscale, whose files hold unreadable or absurd
header values or lack their geometry (position, orientation, pixel spacing, rows, columns), whose files belong
to more than one patient or study (:data:`ONE_PATIENT`; the message names the attribute and the odd files,
never the values), whose files disagree on what must be the same in every slice (the majority's value is
named), or whose transfer syntax no installed decoder reads. Each refusal is a specific
:class:`~pipeline.errors.CtpipeError` saying where and how to fix it. Geometry is DICOM patient space (LPS, mm).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from ..errors import (
    InconsistentSeriesError,
    MixedPatientsError,
    NotCTError,
    SeriesGeometryError,
)
from ._pydicom import check_decoder, stored_text
from .headers import SliceHeader
from .multiframe import read_frames
from .pixels import check_readable
from .sanity import check_header_values

#: the attributes that must be the same in every file of a series: one patient, one study
ONE_PATIENT = ("PatientID", "PatientName", "PatientBirthDate", "StudyInstanceUID")


def _check_one_patient(headers: Sequence[SliceHeader], where: str) -> None:
    """Raise :class:`MixedPatientsError` when the series' files differ in :data:`ONE_PATIENT`. The message names the
    attribute and the odd files, never the values (patient identifiers stay in the DICOM files)."""
    for key in ONE_PATIENT:
        values = [(h.extra_value(key) or "").strip() for h in headers]
        if len(set(values)) == 1:
            continue
        common = Counter(values).most_common(1)[0][0]
        odd = [h.path.name for h, v in zip(headers, values) if v != common]
        raise MixedPatientsError(
            f"{key} differs within the series: {len(values) - len(odd)} file(s) have one value, {len(odd)} another "
            f"({', '.join(odd[:4])}{' and more' if len(odd) > 4 else ''}): images of two patients or studies under "
            "one SeriesInstanceUID",
            where=where,
            fix="do not process it as one case: have the archive's administrator correct the misfiled image(s), or "
            "remove the odd file(s) from the folder",
        )


def _majority_check(headers, attr: str, label: str, where: str, close: float | None = None) -> None:
    values = [getattr(h, attr) for h in headers]
    common = Counter(values).most_common(1)[0][0]
    if close is None:
        if len(set(values)) == 1:
            return
        odd = [h for h, v in zip(headers, values) if v != common]
    else:
        arr = np.asarray(values, dtype=np.float64)
        bad = np.abs(arr - np.asarray(common, dtype=np.float64)).max(axis=1) > close
        odd = [h for h, b in zip(headers, bad) if b]
    if odd:
        shown = ", ".join(f"{h.path.name} has {getattr(h, attr)}" for h in odd[:4])
        more = f" and {len(odd) - 4} more" if len(odd) > 4 else ""
        raise InconsistentSeriesError(
            f"{label} differs within the series: {len(headers) - len(odd)} file(s) have {common} but {shown}{more}",
            where=where,
            fix="remove the odd file(s) from the folder, or load the series they belong to separately",
        )


def _no_geometry(h: SliceHeader, name: str, tag: int, count: int) -> SeriesGeometryError:
    """The error for a file whose ``name`` (element ``tag``, ``count`` decimal numbers; 0: a binary value) could not
    be read: what the file holds there, when it holds text (decimal commas, a value missing)."""
    text = stored_text(h.path, tag) if count else None
    if not text:
        return SeriesGeometryError(
            f"the image has no valid {name}",
            where=h.path,
            fix="the file lacks geometry; re-export the series or remove this file",
        )
    commas = ": it is written with decimal commas, where DICOM decimal strings use a point" if "," in text else ""
    return SeriesGeometryError(
        f"the image's {name} is '{text}', which is not {count} numbers{commas}",
        where=h.path,
        fix=f"re-export the series from the scanner/PACS (the software that wrote this file wrote its {name.split()[0]} "
        "wrongly), or remove this file",
    )


def check_headers(headers: tuple[SliceHeader, ...], where: str, check_modality: bool) -> None:
    h0 = headers[0]
    if check_modality and h0.modality != "CT":
        raise NotCTError(
            f"Modality is {h0.modality or 'missing'} (SOP class {h0.sop_class}), not CT",
            where=where,
            fix="choose a CT series (see the series list of `ctpipe ingest` or scan_directory())",
        )
    for h in headers:
        check_readable(h)
        check_header_values(h)
        if h.samples_per_pixel != 1:
            raise NotCTError(
                f"SamplesPerPixel is {h.samples_per_pixel} ({h.photometric}); CT images are grayscale",
                where=h.path,
                fix="this is a colour/secondary image; choose the CT series instead",
            )
        for name, tag, count, value in (
            ("ImagePositionPatient (0020,0032)", 0x00200032, 3, h.position),
            ("ImageOrientationPatient (0020,0037)", 0x00200037, 6, h.orientation),
            ("PixelSpacing (0028,0030)", 0x00280030, 2, h.pixel_spacing),
            ("Rows (0028,0010)", 0x00280010, 0, h.rows),
            ("Columns (0028,0011)", 0x00280011, 0, h.columns),
        ):
            if value is None:
                if h.geometry_error:
                    read_frames(h.path)  # raises the multi-frame file's own error: which frame lacks what
                raise _no_geometry(h, name, tag, count)
    _check_one_patient(headers, where)
    _majority_check(headers, "rows", "Rows", where)
    _majority_check(headers, "columns", "Columns", where)
    _majority_check(headers, "pixel_spacing", "PixelSpacing (mm)", where, close=1e-4)
    _majority_check(headers, "orientation", "ImageOrientationPatient", where, close=1e-4)
    _majority_check(headers, "bits_allocated", "BitsAllocated", where)
    for ts in {h.transfer_syntax for h in headers}:
        check_decoder(ts, next(h.path for h in headers if h.transfer_syntax == ts))
