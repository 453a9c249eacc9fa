"""Compare DICOM results apart from the dates and times they were made at."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydicom

#: the attributes that state when a result was made (its content's, its instance's, its series', its contribution's)
MADE_AT = (
    "InstanceCreationDate",
    "InstanceCreationTime",
    "ContentDate",
    "ContentTime",
    "SeriesDate",
    "SeriesTime",
    "ContributionDateTime",
)


#: the SOP Instance UID that :func:`without_dates` states for every instance
MADE_INSTANCE = "1.2.3.4"


def without_dates(path: Path) -> Any:
    """The dataset of ``path`` without :data:`MADE_AT`, at every level (sequences included), and without its SOP
    Instance UID, which derives from when it was made (an instance states one content, its dates included):
    :data:`MADE_INSTANCE` instead."""
    ds = pydicom.dcmread(path)
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = MADE_INSTANCE  # still a file that can be written
    del ds.file_meta.FileMetaInformationGroupLength  # the length of that UID

    def drop(d: Any) -> None:
        for kw in MADE_AT:
            if kw in d:
                delattr(d, kw)
        for elem in d:
            if elem.VR == "SQ":
                for item in elem.value:
                    drop(item)

    drop(ds)
    return ds


def _made_at(ds: Any) -> list[str]:
    return [str(e.value) for e in ds.iterall() if e.keyword in MADE_AT]


def assert_same_but_dates(a: Path, b: Path) -> None:
    """``a`` and ``b`` hold the same series and content; only when they were made may differ, and with it their SOP
    Instance UID: the same instance UID exactly when they state the same time."""
    ra, rb = (pydicom.dcmread(p, stop_before_pixels=True) for p in (a, b))
    assert ra.SeriesInstanceUID == rb.SeriesInstanceUID
    assert (ra.SOPInstanceUID == rb.SOPInstanceUID) == (_made_at(ra) == _made_at(rb)), (_made_at(ra), _made_at(rb))
    assert without_dates(a) == without_dates(b)
