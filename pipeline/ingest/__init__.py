"""DICOM ingest: folders of DICOM files → validated CT volumes in HU (LPS, mm).

Public API::

    from pipeline.ingest import load_series, scan_directory, SelectionRules, ingest_to_cache
    vol = load_series("study/")                       # the one selected CT series
    vol = load_series("chest.nii.gz")                 # a NIfTI/MHA/NRRD image (read with SimpleITK, in LPS)
    scan = scan_directory("archive/")                 # every series, chosen or not, and why
    report = ingest_to_cache("archive/", CaseCache("cache/"))

All positions, origins and direction cosines are DICOM patient coordinates
(LPS: +x left, +y posterior, +z superior), in millimetres.
"""

from __future__ import annotations

from .api import IngestReport, ingest_to_cache, load_series, safe_case_id
from .build import VolumePlan, build_volume, plan_volume, read_volume
from .discover import SkippedFile, discover_files, find_files, read_header, read_headers
from .headers import SliceHeader
from .scan import RejectedSeries, ScanResult, scan_directory
from .series import SelectionRules, SeriesInfo

__all__ = [
    "IngestReport",
    "RejectedSeries",
    "ScanResult",
    "SelectionRules",
    "SeriesInfo",
    "SkippedFile",
    "SliceHeader",
    "VolumePlan",
    "build_volume",
    "discover_files",
    "find_files",
    "ingest_to_cache",
    "load_series",
    "plan_volume",
    "read_header",
    "read_headers",
    "read_volume",
    "safe_case_id",
    "scan_directory",
]
