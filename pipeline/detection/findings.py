"""Detector output: :class:`Finding` (one candidate nodule) and :class:`Findings` (one case).

Every position is in DICOM patient coordinates (LPS, mm); voxel indices refer to
the ORIGINAL series as loaded (``(i, j, k)`` = column, row, slice; arrays ``[k, j, i]``).
Each finding names the source slice nearest its centre as a viewer shows it: the slice's
InstanceNumber (the frame number in an enhanced multi-frame object), with its SOP Instance UID,
when the series metadata lists them (ingest records ``InstanceNumbers``, ``SOPInstanceUIDs`` and,
for multi-frame objects, ``FrameNumbers`` in volume order k); ``k + 1`` otherwise.

Reported findings and candidates: a :class:`Findings` holds every candidate the detector
kept, split by the score threshold in force (the model's operating point unless configured
otherwise, see :mod:`.operating_point`): ``findings`` are those scoring at or above it (what
iteration, ``len``, the CSV and the PNGs give), ``below_threshold`` the rest. The JSON holds
both lists and the threshold with its source, so ``ctpipe evaluate`` scores the full candidate
list (:attr:`Findings.candidates`). JSON and CSV files are written atomically
(:func:`pipeline.atomic.atomic_write_bytes`).
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..atomic import atomic_write_bytes
from ..volume import float3, int3

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

log = logging.getLogger(__name__)

CSV_FIELDS = [
    "case_id",
    "series_uid",
    "rank",
    "score",
    "center_x_lps",
    "center_y_lps",
    "center_z_lps",
    "diameter_mm",
    "box_min_x",
    "box_min_y",
    "box_min_z",
    "box_max_x",
    "box_max_y",
    "box_max_z",
    "voxel_i",
    "voxel_j",
    "voxel_k",
    "slice_number",
    "sop_instance_uid",
    "frame_number",
    "flags",
]

#: Columns of :meth:`Findings.to_dataframe` (positions LPS mm, named as in ``open_run(...).findings``).
DATAFRAME_COLUMNS = [c.removesuffix("_lps") for c in CSV_FIELDS if c != "flags"]


#: What ``slice_number`` holds (:func:`slice_number_source`).
SLICE_NUMBER_SOURCES = ("InstanceNumber", "FrameNumber", "index + 1")


def box_extents(items: Sequence[Finding]) -> np.ndarray:
    """The box size of each finding along L, P, S (mm), as an ``(N, 3)`` float64 array."""
    return np.array([np.subtract(f.box_max_lps, f.box_min_lps) for f in items], dtype=np.float64).reshape(-1, 3)


def _per_slice(metadata: Mapping[str, Any], key: str, n_slices: int, kind: type) -> list[Any] | None:
    values = metadata.get(key)
    if (
        isinstance(values, (list, tuple))
        and len(values) == n_slices
        and all(isinstance(v, kind) and not isinstance(v, bool) and v != "" for v in values)
    ):
        return list(values)
    return None


def slice_label(source: str) -> str:
    """How a title names a slice whose number comes from ``source`` (:func:`slice_number_source`): ``InstanceNumber``,
    ``FrameNumber``, or ``slice`` for the 1-based index."""
    return "slice" if source == "index + 1" else source


def slice_number_source(metadata: Mapping[str, Any], n_slices: int) -> str:
    """Where slice numbers of a series with ``n_slices`` slices come from (one of :data:`SLICE_NUMBER_SOURCES`):
    the ``InstanceNumbers`` ingest recorded (one per slice, all present), else the ``FrameNumbers`` of a
    multi-frame object, else the 1-based index ``k + 1``."""
    if _per_slice(metadata, "InstanceNumbers", n_slices, int) is not None:
        return "InstanceNumber"
    if _per_slice(metadata, "FrameNumbers", n_slices, int) is not None:
        return "FrameNumber"
    return "index + 1"


@dataclass(frozen=True)
class SliceRef:
    """The source slice at index ``k``: ``number`` as a viewer shows it (see :func:`slice_number_source`),
    its ``sop_instance_uid`` (``None`` when unknown) and, in a multi-frame object, its 1-based ``frame_number``."""

    number: int
    sop_instance_uid: str | None = None
    frame_number: int | None = None


def slice_ref(k: int, metadata: Mapping[str, Any], n_slices: int) -> SliceRef:
    """The :class:`SliceRef` of slice index ``k`` (0-based, volume order) of a series of ``n_slices`` slices."""
    k = int(k)
    uids = _per_slice(metadata, "SOPInstanceUIDs", n_slices, str)
    frames = _per_slice(metadata, "FrameNumbers", n_slices, int)
    numbers = _per_slice(metadata, "InstanceNumbers", n_slices, int)
    number = numbers[k] if numbers is not None else frames[k] if frames is not None else k + 1
    return SliceRef(
        number=int(number),
        sop_instance_uid=uids[k] if uids is not None else None,
        frame_number=int(frames[k]) if frames is not None else None,
    )


def slice_number_of(k: int, metadata: Mapping[str, Any], n_slices: int) -> int:
    """The slice number a viewer shows for index ``k``: :attr:`SliceRef.number` of :func:`slice_ref`."""
    return slice_ref(k, metadata, n_slices).number


def slice_fields(k: int, metadata: Mapping[str, Any], n_slices: int) -> dict[str, Any]:
    """The slice fields of a :class:`Finding` whose centre's nearest slice is index ``k`` (``Finding(..., **fields)``)."""
    ref = slice_ref(k, metadata, n_slices)
    return {"slice_number": ref.number, "sop_instance_uid": ref.sop_instance_uid, "frame_number": ref.frame_number}


@dataclass(frozen=True)
class Finding:
    """One candidate nodule.

    center_lps: box centre, LPS mm.
    box_min_lps / box_max_lps: opposite corners of the axis-aligned box, LPS mm (min ≤ max per axis).
    diameter_mm: equivalent diameter, ``(w·h·d)^(1/3)`` of the box extents in mm (the diameter of the
        sphere with the volume of the ellipsoid inscribed in the box).
    score: detector confidence, 0..1.
    voxel_ijk: nearest voxel of the centre in the original series, (i, j, k) = (column, row, slice index).
    slice_number: the slice a viewer shows for ``k``: its InstanceNumber (frame number in a multi-frame
        object) when the series metadata lists them, else ``k + 1`` (see :func:`slice_number_source`).
    sop_instance_uid: SOP Instance UID of that slice (of the multi-frame object), when known.
    frame_number: 1-based frame of that slice in a multi-frame object, else ``None``.
    """

    center_lps: tuple[float, float, float]
    box_min_lps: tuple[float, float, float]
    box_max_lps: tuple[float, float, float]
    diameter_mm: float
    score: float
    voxel_ijk: tuple[int, int, int]
    slice_number: int
    sop_instance_uid: str | None = None
    frame_number: int | None = None

    def __repr__(self) -> str:  # short: a notebook echoes findings[0]; to_json() has every field at full precision
        c = ", ".join(f"{v:.1f}" for v in self.center_lps)
        uid = f", sop_instance_uid=...{self.sop_instance_uid[-8:]}" if self.sop_instance_uid else ""
        return (
            f"Finding(score={self.score:.3f}, center_lps=({c}) mm, box {self.diameter_mm:.1f} mm, "
            f"slice_number={self.slice_number}{uid})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "center_lps": [float(v) for v in self.center_lps],
            "box_min_lps": [float(v) for v in self.box_min_lps],
            "box_max_lps": [float(v) for v in self.box_max_lps],
            "diameter_mm": float(self.diameter_mm),
            "score": float(self.score),
            "voxel_ijk": [int(v) for v in self.voxel_ijk],
            "slice_number": int(self.slice_number),
            "sop_instance_uid": self.sop_instance_uid,
            "frame_number": self.frame_number,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        frame = data.get("frame_number")
        return cls(
            center_lps=float3(data["center_lps"]),
            box_min_lps=float3(data["box_min_lps"]),
            box_max_lps=float3(data["box_max_lps"]),
            diameter_mm=float(data["diameter_mm"]),
            score=float(data["score"]),
            voxel_ijk=int3(data["voxel_ijk"]),
            slice_number=int(data["slice_number"]),
            sop_instance_uid=data.get("sop_instance_uid"),
            frame_number=int(frame) if frame is not None else None,
        )


@dataclass
class Findings:
    """Findings of one case, highest score first.

    ``findings`` are the reported findings: every candidate when no threshold has been applied
    (``score_threshold`` is ``None``), else those scoring at or above ``score_threshold``;
    ``below_threshold`` holds the other candidates (:meth:`select` splits them, :attr:`candidates`
    joins them). ``threshold_source`` says where the threshold came from (the model's operating
    point, a configured value, or none with ``--all-candidates``). ``reason`` explains an empty
    result that is not a plain "nothing found" (e.g. no lungs in the series); ``timings_ms`` holds
    per-step times in ms (model time measured with CUDA events on a GPU) and ``total``, the whole detection, post-processing included; ``slice_number_source`` says
    what each finding's ``slice_number`` is (:func:`slice_number_source`); ``score_calibration`` names the map
    applied to the scores of a thick-slice series (:mod:`.score_calibration`), ``None`` when none was; ``flags`` maps
    the code of each quality flag that bears on the findings to its sentence (codes and sentences as the
    reconstruction's, :data:`pipeline.reconstruction.quality.FLAGS`): ``thick_slices`` when the series' slices are
    thicker than :data:`pipeline.volume.THICK_SLICE_MM` (2.5 mm), so small nodules are unreliable; ``coarse_pixels``
    when its pixels are coarser than :data:`pipeline.volume.COARSE_PIXEL_MM` (2.5 mm), likewise;
    ``lossy_compressed`` when ingest found the series lossy compressed (:mod:`pipeline.ingest.lossy`).
    ``nonfinite_voxels_set_to_air`` counts the NaN or infinite voxels set to -1024 HU (air) in the volume the findings
    were made of (by the detector, or by the case cache when it wrote the case); 0 when none were.
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
    score_threshold: float | None = None
    threshold_source: str | None = None
    below_threshold: list[Finding] = field(default_factory=list)
    slice_number_source: str = "index + 1"
    score_calibration: str | None = None
    flags: dict[str, str] = field(default_factory=dict)
    nonfinite_voxels_set_to_air: int = 0

    def __len__(self) -> int:
        return len(self.findings)

    def __repr__(self) -> str:  # short: a notebook shows it for every Findings it echoes
        thr = "no threshold" if self.score_threshold is None else f"{len(self.below_threshold)} below {self.score_threshold:.3g}"
        top = ", ".join(f"{f.score:.2f}" for f in self.findings[:5]) + (", ..." if len(self.findings) > 5 else "")
        extra = f", reason={self.reason!r}" if self.reason else ""
        flags = f", flags={sorted(self.flags)}" if self.flags else ""
        return (
            f"Findings({len(self.findings)} reported [{top}], {thr}, series={self.series_uid}, "
            f"model={self.model!r}{extra}{flags})"
        )

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def __getitem__(self, index: int) -> Finding:
        return self.findings[index]

    @property
    def candidates(self) -> list[Finding]:
        """Every candidate, reported or not, highest score first (what evaluation scores)."""
        return sorted([*self.findings, *self.below_threshold], key=lambda f: -f.score)

    def with_candidates(self, candidates: list[Finding], *, keep_threshold: bool = False) -> Findings:
        """A copy holding ``candidates`` (in their order), every one reported: no threshold applied; with
        ``keep_threshold``, split again by this object's threshold if one was applied (:meth:`select`)."""
        out = self._copy(findings=list(candidates), below_threshold=[], score_threshold=None, threshold_source=None)
        if keep_threshold and self.threshold_source is not None:
            return out.select(self.score_threshold, self.threshold_source)
        return out

    def _copy(self, **changes: Any) -> Findings:
        """A copy with ``changes``; its dicts (``timings_ms``, ``flags``) are its own: timing or flagging the copy
        leaves this object as it is."""
        return replace(self, **{"timings_ms": dict(self.timings_ms), "flags": dict(self.flags), **changes})

    def select(self, threshold: float | None, source: str) -> Findings:
        """A copy reporting the candidates scoring at or above ``threshold`` (``None``: all of them), the
        rest kept in ``below_threshold``; ``source`` says where the threshold came from."""
        every = self.candidates
        if threshold is None:
            return self._copy(findings=every, below_threshold=[], score_threshold=None, threshold_source=source)
        t = float(threshold)
        return self._copy(
            findings=[f for f in every if f.score >= t],
            below_threshold=[f for f in every if f.score < t],
            score_threshold=t,
            threshold_source=source,
        )

    def to_json(self) -> dict[str, Any]:
        """The findings document (``ctpipe-findings/1``): centres and box corners in DICOM patient coordinates
        (LPS), mm; sizes in mm; ``voxel_ijk`` the (column, row, slice) index in the original series."""
        return {
            "format": "ctpipe-findings/1",
            "coordinates": "LPS mm (DICOM patient coordinates); voxel_ijk = (column, row, slice) of the original series",
            "case_id": self.case_id,
            "series_uid": self.series_uid,
            "model": self.model,
            "reason": self.reason,
            "flags": [{"code": code, "message": message} for code, message in self.flags.items()],
            "nonfinite_voxels_set_to_air": self.nonfinite_voxels_set_to_air,
            "restricted_to_lungs": self.restricted_to_lungs,
            "device": self.device,
            "precision": self.precision,
            "input_shape_xyz": list(self.input_shape_xyz) if self.input_shape_xyz else None,
            "sliding_window": self.sliding_window,
            "timings_ms": self.timings_ms,
            "score_threshold": self.score_threshold,
            "score_threshold_source": self.threshold_source,
            "slice_number_source": self.slice_number_source,
            "score_calibration": self.score_calibration,
            "n_candidates": len(self.findings) + len(self.below_threshold),
            "findings": [f.to_json() for f in self.findings],
            "below_threshold": [f.to_json() for f in self.below_threshold],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Findings:
        thr = data.get("score_threshold")
        return cls(
            findings=[Finding.from_json(f) for f in data.get("findings", [])],
            case_id=data.get("case_id"),
            series_uid=data.get("series_uid"),
            model=str(data.get("model", "")),
            reason=data.get("reason"),
            restricted_to_lungs=bool(data.get("restricted_to_lungs", False)),
            timings_ms=dict(data.get("timings_ms", {})),
            device=str(data.get("device", "cpu")),
            input_shape_xyz=int3(shape) if (shape := data.get("input_shape_xyz")) else None,
            sliding_window=bool(data.get("sliding_window", False)),
            precision=str(data.get("precision", "float32")),
            score_threshold=float(thr) if thr is not None else None,
            threshold_source=data.get("score_threshold_source"),
            below_threshold=[Finding.from_json(f) for f in data.get("below_threshold", [])],
            slice_number_source=str(data.get("slice_number_source", "index + 1")),
            score_calibration=data.get("score_calibration"),
            flags={str(f["code"]): str(f["message"]) for f in data.get("flags", [])},
            nonfinite_voxels_set_to_air=int(data.get("nonfinite_voxels_set_to_air") or 0),
        )

    def csv_rows(self) -> list[dict[str, Any]]:
        """One row per reported finding (:attr:`findings`), ranked by score; ``center_*_lps`` and the box corners in
        DICOM patient coordinates (LPS), mm."""
        rows = []
        for rank, f in enumerate(self.findings, 1):
            rows.append(
                {
                    "case_id": self.case_id or "",
                    "series_uid": self.series_uid or "",
                    "rank": rank,
                    "score": f"{f.score:.5f}",
                    "center_x_lps": f"{f.center_lps[0]:.2f}",
                    "center_y_lps": f"{f.center_lps[1]:.2f}",
                    "center_z_lps": f"{f.center_lps[2]:.2f}",
                    "diameter_mm": f"{f.diameter_mm:.2f}",
                    "box_min_x": f"{f.box_min_lps[0]:.2f}",
                    "box_min_y": f"{f.box_min_lps[1]:.2f}",
                    "box_min_z": f"{f.box_min_lps[2]:.2f}",
                    "box_max_x": f"{f.box_max_lps[0]:.2f}",
                    "box_max_y": f"{f.box_max_lps[1]:.2f}",
                    "box_max_z": f"{f.box_max_lps[2]:.2f}",
                    "voxel_i": f.voxel_ijk[0],
                    "voxel_j": f.voxel_ijk[1],
                    "voxel_k": f.voxel_ijk[2],
                    "slice_number": f.slice_number,
                    "sop_instance_uid": f.sop_instance_uid or "",  # the slice's, as a PACS viewer looks it up
                    "frame_number": "" if f.frame_number is None else f.frame_number,
                    "flags": ";".join(self.flags),
                }
            )
        return rows

    def to_dataframe(self) -> pd.DataFrame:
        """The reported findings (:attr:`findings`) as a pandas DataFrame, one row per finding by rank, with numbers as
        numbers (:meth:`csv_rows` gives the CSV's text): ``case_id``, ``series_uid``, ``rank``, ``score``,
        ``center_x/y/z`` and ``box_min/max_x/y/z`` in DICOM patient coordinates (LPS), mm, as in
        ``open_run(...).findings``, ``diameter_mm``, ``voxel_i/j/k`` (column, row, slice index of the original series),
        ``slice_number``, ``sop_instance_uid`` and ``frame_number`` (missing, NA, where unknown). Every candidate:
        ``findings.with_candidates(findings.candidates).to_dataframe()``. :func:`pipeline.show` and
        :func:`pipeline.reconstruct` take the table as ``findings=``."""
        import pandas as pd

        rows = [
            {
                "case_id": self.case_id,
                "series_uid": self.series_uid,
                "rank": rank,
                "score": float(f.score),
                **{f"center_{a}": float(v) for a, v in zip("xyz", f.center_lps, strict=True)},
                "diameter_mm": float(f.diameter_mm),
                **{f"box_min_{a}": float(v) for a, v in zip("xyz", f.box_min_lps, strict=True)},
                **{f"box_max_{a}": float(v) for a, v in zip("xyz", f.box_max_lps, strict=True)},
                **{f"voxel_{a}": int(v) for a, v in zip("ijk", f.voxel_ijk, strict=True)},
                "slice_number": int(f.slice_number),
                "sop_instance_uid": f.sop_instance_uid,
                "frame_number": f.frame_number,
            }
            for rank, f in enumerate(self.findings, 1)
        ]
        return pd.DataFrame(rows, columns=DATAFRAME_COLUMNS)

    def write_json(self, path: str | Path) -> Path:
        """Write :meth:`to_json` to ``path`` atomically (positions LPS mm); returns the path."""
        path = Path(path)
        atomic_write_bytes(path, (json.dumps(self.to_json(), indent=1) + "\n").encode())
        return path

    def write_csv(self, path: str | Path) -> Path:
        """The reported findings as CSV (:data:`CSV_FIELDS`: positions in DICOM patient coordinates, LPS mm;
        ``slice_number``, ``sop_instance_uid`` and ``frame_number`` of the nearest slice as in :class:`Finding`, empty
        where unknown)."""
        path = Path(path)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.csv_rows())
        atomic_write_bytes(path, buf.getvalue().encode())
        return path


#: The fix of a file :func:`load_findings` cannot read.
FINDINGS_JSON_FIX = (
    "pass the findings.json that ctpipe detect or a run wrote (a run's findings, all cases: open_run(...).findings)"
)


def load_findings(path: str | Path) -> Findings:
    """Read a findings JSON written by :meth:`Findings.write_json` (``ctpipe detect``'s, a run case's
    ``findings.json``): positions LPS mm, its reported findings and those below its threshold.

    Raises :class:`~pipeline.errors.FindingsFileError` naming the file for one that cannot be read, is not JSON (the
    findings CSV: the JSON beside it; a DICOM SR: :func:`pipeline.read_sr_findings` reads it), is another JSON document
    than a ctpipe findings document, or is incomplete.
    """
    from ..errors import FindingsFileError

    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FindingsFileError(f"cannot read the findings ({exc.strerror or exc})", where=path, fix=FINDINGS_JSON_FIX) from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        from ..ingest.image import starts_like_dicom

        if starts_like_dicom(path):
            raise FindingsFileError(
                "not a findings JSON (a DICOM file)",
                where=path,
                fix="read a ctpipe DICOM SR with pipeline.read_sr_findings(path) (a table of its findings)",
            ) from exc
        fix = f"pass the findings.json beside this CSV ({path.with_suffix('.json')})" if path.suffix.lower() == ".csv" else ""
        raise FindingsFileError("not a findings JSON (the file is not JSON)", where=path, fix=fix or FINDINGS_JSON_FIX) from exc
    if not isinstance(data, dict) or not str(data.get("format", "")).startswith("ctpipe-findings/"):
        kind = f"format {data.get('format')!r}" if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise FindingsFileError(f"not a ctpipe findings document ({kind})", where=path, fix=FINDINGS_JSON_FIX)
    try:
        return Findings.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise FindingsFileError(
            f"the findings document is incomplete ({type(exc).__name__}: {exc})", where=path, fix=FINDINGS_JSON_FIX
        ) from exc
