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


def without_dates(path: Path) -> Any:
    """The dataset of ``path`` without :data:`MADE_AT`, at every level (sequences included)."""
    ds = pydicom.dcmread(path)

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


def assert_same_but_dates(a: Path, b: Path) -> None:
    """``a`` and ``b`` hold the same UIDs and content; only when they were made may differ."""
    da, db = without_dates(a), without_dates(b)
    assert da.SOPInstanceUID == db.SOPInstanceUID and da.SeriesInstanceUID == db.SeriesInstanceUID
    assert da == db
