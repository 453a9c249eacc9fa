"""A file's header values, as the raw parser (:mod:`pipeline.ingest.rawheader`) or pydicom reads them, made into a
:class:`~pipeline.ingest.headers.SliceHeader`.

:func:`header_from_values` turns the values (text as DICOM stores it, or numbers) into the header record: positions
and orientations as DICOM patient coordinates (LPS, mm), pixel spacing in mm, the rescale that gives HU, and the
values kept as text (:data:`_EXTRA_KEYS`, the patient identifiers among them: :data:`METADATA_IDENTIFIERS`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal, overload

from ._pydicom import PYDICOM_ERRORS, read_dataset
from .headers import CT_SOPS, ENHANCED_CT_SOP, LEGACY_ENHANCED_CT_SOP, SliceHeader
from .padding import pixel_padding
from .rawheader import CHARSET_TEXT_KEYS, EXPLICIT_BE, WANTED, RawHeader, RawHeaderError, decode_text

#: The patient identifiers (of :data:`pipeline.volume.PATIENT_IDENTIFIERS`) the header scan reads: the ones
#: ``keep_identifiers=True`` copies into a volume's metadata (``load_series``, ``ingest_to_cache``, ``ctpipe ingest
#: --keep-identifiers``). The other attributes of that list (InstitutionName, OtherPatientIDs, ...) are never read.
METADATA_IDENTIFIERS = ("PatientID", "PatientName", "PatientBirthDate", "AccessionNumber")
# Header values kept as text on each SliceHeader. The patient identifiers among them stay in memory: they
# reach volume metadata only when a caller asks for them (keep_identifiers=True, see pipeline.ingest.build).
_EXTRA_KEYS = (
    *METADATA_IDENTIFIERS,
    "StudyDate",
    "SeriesDate",
    "SeriesTime",
    "FrameOfReferenceUID",
    "SliceThickness",
    "ConvolutionKernel",
    "KVP",
    "Manufacturer",
    "PatientPosition",
    "GantryDetectorTilt",
    "RescaleSlope",
    "RescaleIntercept",
    "LossyImageCompression",
    "LossyImageCompressionRatio",
    "LossyImageCompressionMethod",
)


@overload
def _floats(text: object, n: Literal[2]) -> tuple[float, float] | None: ...


@overload
def _floats(text: object, n: Literal[3]) -> tuple[float, float, float] | None: ...


@overload
def _floats(text: object, n: Literal[6]) -> tuple[float, float, float, float, float, float] | None: ...


def _floats(text: object, n: int) -> tuple[float, ...] | None:
    if text is None or text == "":
        return None
    try:
        vals = tuple(float(v) for v in str(text).split("\\"))
    except ValueError:
        return None
    return vals if len(vals) == n and all(math.isfinite(v) for v in vals) else None


def _int(text: object) -> int | None:
    if text is None or text == "":
        return None
    try:
        return int(float(str(text).split("\\")[0]))
    except (ValueError, OverflowError):
        return None


def _rescale(text: object, default: float) -> float:
    """A rescale value: ``default`` when absent, NaN when the text is not a number (refused when planning)."""
    if text is None or str(text).strip() == "":
        return default
    try:
        return float(str(text).split("\\")[0])
    except ValueError:
        return math.nan


def header_from_values(path: Path, raw: RawHeader, *, use_pydicom: bool = False) -> SliceHeader:
    """Build a :class:`SliceHeader` from the raw values of one file (text decoded with its SpecificCharacterSet)."""
    v = raw.values
    charset = v.get("SpecificCharacterSet")
    charset = charset if isinstance(charset, str) and charset.strip() else None
    # the raw parser reads text byte for byte; pydicom decodes it itself, as Latin-1 without a SpecificCharacterSet,
    # which decode_text reads again as UTF-8 when it is (as it does for the raw parser's text)
    if not use_pydicom or charset is None:
        v = {k: decode_text(val, charset) if k in CHARSET_TEXT_KEYS and isinstance(val, str) else val for k, val in v.items()}

    def s(key: str) -> str:
        val = v.get(key)
        return "" if val is None else str(val)

    us: dict[str, int | None] = {}
    for k in ("Rows", "Columns", "BitsAllocated", "BitsStored", "PixelRepresentation", "SamplesPerPixel"):
        val = v.get(k)
        us[k] = val if isinstance(val, int) else _int(val)
    sop_class = s("SOPClassUID") or s("MediaStorageSOPClassUID")
    modality = s("Modality").upper()
    n_frames = _int(v.get("NumberOfFrames")) or 1
    padding, padding_error = pixel_padding(
        v.get("PixelPaddingValue"),
        v.get("PixelPaddingRangeLimit"),
        signed=us["PixelRepresentation"] == 1,
        bits_stored=us["BitsStored"],
        bits_allocated=us["BitsAllocated"],
    )
    notes: list[str] = []
    if not modality and sop_class in CT_SOPS:
        modality = "CT"
        notes.append(f"Modality (0008,0060) is missing; taken as CT from the SOP class {sop_class} ({CT_SOPS[sop_class]})")
    single_frame = n_frames == 1 and sop_class not in (ENHANCED_CT_SOP, LEGACY_ENHANCED_CT_SOP)
    if (
        modality == "CT"
        and single_frame
        and raw.pixel_offset is not None
        and (not s("RescaleSlope") or not s("RescaleIntercept"))
    ):
        notes.append(
            "RescaleSlope/RescaleIntercept (0028,1053/1052) missing: slope 1, intercept 0 assumed (stored values taken as HU)"
        )
    return SliceHeader(
        path=path,
        file_size=raw.file_size,
        file_mtime_ns=raw.file_mtime_ns,
        transfer_syntax=s("TransferSyntaxUID") or "1.2.840.10008.1.2",
        sop_class=sop_class,
        sop_instance=s("SOPInstanceUID"),
        study_uid=s("StudyInstanceUID"),
        series_uid=s("SeriesInstanceUID"),
        modality=modality,
        image_type=tuple(p.strip().upper() for p in s("ImageType").split("\\") if p.strip()),
        series_description=s("SeriesDescription"),
        series_number=_int(v.get("SeriesNumber")),
        acquisition_number=_int(v.get("AcquisitionNumber")),
        instance_number=_int(v.get("InstanceNumber")),
        position=_floats(v.get("ImagePositionPatient"), 3),
        orientation=_floats(v.get("ImageOrientationPatient"), 6),
        rows=us["Rows"],
        columns=us["Columns"],
        pixel_spacing=_floats(v.get("PixelSpacing"), 2),
        samples_per_pixel=us["SamplesPerPixel"] or 1,
        bits_allocated=us["BitsAllocated"],
        bits_stored=us["BitsStored"],
        pixel_representation=us["PixelRepresentation"] or 0,
        photometric=s("PhotometricInterpretation"),
        n_frames=n_frames,
        slope=_rescale(v.get("RescaleSlope"), 1.0),
        intercept=_rescale(v.get("RescaleIntercept"), 0.0),
        pixel_offset=raw.pixel_offset,
        pixel_length=raw.pixel_length,
        truncated=raw.truncated,
        pixel_end=raw.pixel_end,
        use_pydicom=use_pydicom,
        extra=tuple((k, s(k)) for k in _EXTRA_KEYS if s(k)),
        notes=tuple(notes),
        padding=padding,
        padding_error=padding_error,
    )


def pydicom_header(path: Path) -> SliceHeader:
    """Header of a big-endian or deflated file through pydicom (pixel data left unread)."""
    # lazy on purpose: pydicom is slow to import and only these rare transfer syntaxes need it here
    from pydicom.errors import InvalidDicomError

    st = path.stat()
    raw = RawHeader(file_size=st.st_size, file_mtime_ns=st.st_mtime_ns)
    try:
        ds = read_dataset(path, defer_size=256)  # a big-endian file without file meta information too
        big_endian = str(ds.file_meta.get("TransferSyntaxUID", "")) == EXPLICIT_BE
        for kw, kind in WANTED.values():
            source = ds.file_meta if kw in ds.file_meta else ds
            if kw not in source:
                continue
            val = source[kw].value
            if kind == "bin" and isinstance(val, bytes) and len(val) == 2:  # VR left open (US or SS): as stored
                signed = ds.get("PixelRepresentation") == 1
                val = int.from_bytes(val, "big" if big_endian else "little", signed=signed)
            elif kind == "bin" and isinstance(val, bytes):
                raw.values[kw] = ("", val)  # not one 16-bit value: refused by pipeline.ingest.padding
                continue
            if isinstance(val, (list, tuple)) or type(val).__name__ == "MultiValue":
                val = "\\".join(str(x) for x in val)
            raw.values[kw] = val if isinstance(val, int) else str(val)
        has_pixels = "PixelData" in ds
    except OSError:
        raise  # the file cannot be read (read_header reports it as unreadable), not a damaged header
    except (InvalidDicomError, *PYDICOM_ERRORS) as exc:
        raise RawHeaderError("truncated", f"pydicom cannot read the header ({type(exc).__name__}: {exc})") from exc
    if has_pixels:
        raw.pixel_offset, raw.pixel_length = 0, -1
    return header_from_values(path, raw, use_pydicom=True)
