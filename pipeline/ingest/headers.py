"""The header record of one DICOM image file, and the SOP classes that ingest tells apart.

:class:`SliceHeader` holds the header fields ingest needs; discovery fills it, series grouping,
volume planning and pixel reading consume it. Positions and orientations are DICOM patient
coordinates (LPS, mm).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CT_IMAGE_SOP = "1.2.840.10008.5.1.4.1.1.2"
ENHANCED_CT_SOP = "1.2.840.10008.5.1.4.1.1.2.1"
LEGACY_ENHANCED_CT_SOP = "1.2.840.10008.5.1.4.1.1.2.2"
#: SOP classes whose instances are CT images whatever their Modality (0008,0060) says or lacks.
CT_SOPS = {
    CT_IMAGE_SOP: "CT Image Storage",
    ENHANCED_CT_SOP: "Enhanced CT Image Storage",
    LEGACY_ENHANCED_CT_SOP: "Legacy Converted Enhanced CT Image Storage",
}
SECONDARY_CAPTURE_SOPS = frozenset(
    {
        "1.2.840.10008.5.1.4.1.1.7",
        "1.2.840.10008.5.1.4.1.1.7.1",
        "1.2.840.10008.5.1.4.1.1.7.2",
        "1.2.840.10008.5.1.4.1.1.7.3",
        "1.2.840.10008.5.1.4.1.1.7.4",
    }
)


@dataclass(frozen=True)
class SliceHeader:
    """The header fields of one DICOM image file that ingest needs.

    Positions and orientations are DICOM patient coordinates (LPS, mm).
    ``pixel_offset``/``pixel_length`` locate the pixel data in the file
    (``pixel_length == -1``: encapsulated/compressed; ``None``: no pixel data).
    ``slope``/``intercept`` are NaN when the header holds text that is not a number
    (their text is in ``extra``); ``notes`` say what ingest assumed for this file
    (e.g. a Modality taken from the SOP class) and end up as warnings on the volume; ``geometry_error`` says why
    the position, orientation and spacing of a multi-frame file are missing, when its functional groups lack them.
    ``padding`` is the inclusive range of stored values that are padding (PixelPaddingValue (0028,0120), up to
    PixelPaddingRangeLimit (0028,0121) when present; None: no padding), read with PixelRepresentation;
    ``padding_error`` says why a padding attribute of the file was ignored (see :mod:`pipeline.ingest.padding`).
    """

    path: Path
    file_size: int
    transfer_syntax: str
    sop_class: str
    sop_instance: str
    study_uid: str
    series_uid: str
    modality: str
    image_type: tuple[str, ...]
    series_description: str
    series_number: int | None
    acquisition_number: int | None
    instance_number: int | None
    position: tuple[float, float, float] | None
    orientation: tuple[float, float, float, float, float, float] | None
    rows: int | None
    columns: int | None
    pixel_spacing: tuple[float, float] | None
    samples_per_pixel: int
    bits_allocated: int | None
    bits_stored: int | None
    pixel_representation: int
    photometric: str
    n_frames: int
    slope: float
    intercept: float
    pixel_offset: int | None
    pixel_length: int | None
    truncated: str | None
    use_pydicom: bool
    extra: tuple[tuple[str, str], ...]  # PatientID, SliceThickness, KVP, ... as text
    notes: tuple[str, ...] = ()
    geometry_error: str | None = None  # why a multi-frame file's per-frame geometry cannot be read (None: it can)
    padding: tuple[int, int] | None = None  # stored values (inclusive) that are padding, not image
    padding_error: str | None = None  # why the file's padding attributes were ignored
    file_mtime_ns: int = 0  # the file's modification time (ns since the Unix epoch) when the header was read
    pixel_end: int | None = None  # where compressed pixel data end when bytes follow them (trailing padding, junk)

    @property
    def is_enhanced(self) -> bool:
        return self.sop_class == ENHANCED_CT_SOP or self.n_frames > 1

    def extra_value(self, key: str) -> str | None:
        for k, v in self.extra:
            if k == key:
                return v
        return None
