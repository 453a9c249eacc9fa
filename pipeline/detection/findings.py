"""Detector output: :class:`Finding` (one candidate nodule) and :class:`Findings` (one case).

Every position is in DICOM patient coordinates (LPS, mm); voxel indices refer to
the ORIGINAL series as loaded (``(i, j, k)`` = column, row, slice; arrays ``[k, j, i]``).
JSON and CSV files are written atomically (:func:`pipeline.cache.atomic_write_bytes`).
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_bytes

log = logging.getLogger(__name__)

CSV_FIELDS = [
    "case_id", "series_uid", "rank", "score", "center_x_lps", "center_y_lps", "center_z_lps", "diameter_mm",
    "box_min_x", "box_min_y", "box_min_z", "box_max_x", "box_max_y", "box_max_z", "voxel_i", "voxel_j", "voxel_k",
    "slice_number",
]


def slice_number_of(k: int, metadata: Mapping[str, Any], n_slices: int) -> int:
    """The 1-based slice a viewer jumps to for index ``k``: the slice's InstanceNumber when the
    metadata lists one per slice (``InstanceNumbers``), else ``k + 1``."""
    numbers = metadata.get("InstanceNumbers")
    if isinstance(numbers, (list, tuple)) and len(numbers) == n_slices:
        return int(numbers[k])
    return k + 1


@dataclass(frozen=True)
class Finding:
    """One candidate nodule.

    center_lps: box centre, LPS mm.
    box_min_lps / box_max_lps: opposite corners of the axis-aligned box, LPS mm (min ≤ max per axis).
    diameter_mm: equivalent diameter, ``(w·h·d)^(1/3)`` of the box extents in mm (the diameter of the
        sphere with the volume of the ellipsoid inscribed in the box).
    score: detector confidence, 0..1.
    voxel_ijk: nearest voxel of the centre in the original series, (i, j, k) = (column, row, slice index).
    slice_number: 1-based slice position a viewer jumps to (``k + 1``, or the slice's InstanceNumber when
        the series metadata lists them).
    """

    center_lps: tuple[float, float, float]
    box_min_lps: tuple[float, float, float]
    box_max_lps: tuple[float, float, float]
    diameter_mm: float
    score: float
    voxel_ijk: tuple[int, int, int]
    slice_number: int

    def to_json(self) -> dict[str, Any]:
        return {
            "center_lps": [float(v) for v in self.center_lps],
            "box_min_lps": [float(v) for v in self.box_min_lps],
            "box_max_lps": [float(v) for v in self.box_max_lps],
            "diameter_mm": float(self.diameter_mm),
            "score": float(self.score),
            "voxel_ijk": [int(v) for v in self.voxel_ijk],
            "slice_number": int(self.slice_number),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        return cls(
            center_lps=tuple(float(v) for v in data["center_lps"]),  # type: ignore[arg-type]
            box_min_lps=tuple(float(v) for v in data["box_min_lps"]),  # type: ignore[arg-type]
            box_max_lps=tuple(float(v) for v in data["box_max_lps"]),  # type: ignore[arg-type]
            diameter_mm=float(data["diameter_mm"]),
            score=float(data["score"]),
            voxel_ijk=tuple(int(v) for v in data["voxel_ijk"]),  # type: ignore[arg-type]
            slice_number=int(data["slice_number"]),
        )


@dataclass
class Findings:
    """Findings of one case, highest score first.

    ``reason`` explains an empty result that is not a plain "nothing found" (e.g. no lungs in the
    series); ``timings_ms`` holds per-step times (model time measured with CUDA events on a GPU).
    """

    findings: list[Finding]
    case_id: str | None = None
    series_uid: str | None = None
    model: str = ""
    reason: str | None = None
    restricted_to_lungs: bool = False
    timings_ms: dict[str, float] = field(default_factory=dict)
    input_shape_xyz: tuple[int, int, int] | None = None
    device: str = "cpu"
    sliding_window: bool = False
    precision: str = "float32"

    def __len__(self) -> int:
        return len(self.findings)

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def __getitem__(self, index: int) -> Finding:
        return self.findings[index]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "ctpipe-findings/1",
            "coordinates": "LPS mm (DICOM patient coordinates); voxel_ijk = (column, row, slice) of the original series",
            "case_id": self.case_id,
            "series_uid": self.series_uid,
            "model": self.model,
            "reason": self.reason,
            "restricted_to_lungs": self.restricted_to_lungs,
            "device": self.device,
            "precision": self.precision,
            "input_shape_xyz": list(self.input_shape_xyz) if self.input_shape_xyz else None,
            "sliding_window": self.sliding_window,
            "timings_ms": self.timings_ms,
            "findings": [f.to_json() for f in self.findings],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Findings:
        return cls(
            findings=[Finding.from_json(f) for f in data.get("findings", [])],
            case_id=data.get("case_id"),
            series_uid=data.get("series_uid"),
            model=str(data.get("model", "")),
            reason=data.get("reason"),
            restricted_to_lungs=bool(data.get("restricted_to_lungs", False)),
            timings_ms=dict(data.get("timings_ms", {})),
            device=str(data.get("device", "cpu")),
            input_shape_xyz=tuple(int(v) for v in shape) if (shape := data.get("input_shape_xyz")) else None,  # type: ignore[arg-type]
            sliding_window=bool(data.get("sliding_window", False)),
            precision=str(data.get("precision", "float32")),
        )

    def csv_rows(self) -> list[dict[str, Any]]:
        rows = []
        for rank, f in enumerate(self.findings, 1):
            rows.append({
                "case_id": self.case_id or "", "series_uid": self.series_uid or "", "rank": rank, "score": f"{f.score:.5f}",
                "center_x_lps": f"{f.center_lps[0]:.2f}", "center_y_lps": f"{f.center_lps[1]:.2f}", "center_z_lps": f"{f.center_lps[2]:.2f}",
                "diameter_mm": f"{f.diameter_mm:.2f}",
                "box_min_x": f"{f.box_min_lps[0]:.2f}", "box_min_y": f"{f.box_min_lps[1]:.2f}", "box_min_z": f"{f.box_min_lps[2]:.2f}",
                "box_max_x": f"{f.box_max_lps[0]:.2f}", "box_max_y": f"{f.box_max_lps[1]:.2f}", "box_max_z": f"{f.box_max_lps[2]:.2f}",
                "voxel_i": f.voxel_ijk[0], "voxel_j": f.voxel_ijk[1], "voxel_k": f.voxel_ijk[2], "slice_number": f.slice_number,
            })
        return rows

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        atomic_write_bytes(path, (json.dumps(self.to_json(), indent=1) + "\n").encode())
        return path

    def write_csv(self, path: str | Path) -> Path:
        path = Path(path)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.csv_rows())
        atomic_write_bytes(path, buf.getvalue().encode())
        return path


def load_findings(path: str | Path) -> Findings:
    """Read a findings JSON written by :meth:`Findings.write_json`."""
    return Findings.from_json(json.loads(Path(path).read_text()))
