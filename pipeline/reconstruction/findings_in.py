"""The findings whose nodules are segmented: read from a findings JSON or given as objects, and checked before any
work (a centre of three finite numbers and a positive size, in DICOM patient coordinates, LPS mm), each refusal a
:class:`~pipeline.errors.ReconstructionError` naming the file, the finding, the field and the value."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..errors import CtpipeError, ReconstructionError, described

log = logging.getLogger(__name__)

_T = TypeVar("_T")


def field_of(finding: Any, name: str) -> Any:
    if isinstance(finding, Mapping):
        return finding.get(name)
    return getattr(finding, name, None)


def as_point(values: np.ndarray) -> tuple[float, float, float]:
    """Three coordinates (LPS mm) as plain floats."""
    x, y, z = (float(v) for v in values)
    return x, y, z


#: what a finding must give (the fix of a finding refused by :func:`finding_box` or :func:`read_findings`)
FINDING_FIX = "give box_min_lps/box_max_lps (LPS mm), or center_lps with diameter_mm"
#: the fix of a findings file that cannot be used
FINDINGS_FILE_FIX = (
    "give a findings JSON written by `ctpipe detect` (each finding: center_lps [x, y, z] and diameter_mm or "
    "box_min_lps/box_max_lps, in LPS mm)"
)


def _real(value: Any) -> float | None:
    """``value`` as a float when it is a plain real number (not a bool, a string or None), else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    return float(value)


def finite_vec3(value: Any, name: str, where: str, fix: str) -> np.ndarray:
    """Three finite numbers (LPS mm) as a float array; :class:`ReconstructionError` naming ``name`` and the value."""
    arr = None
    if not isinstance(value, (str, bytes, Mapping)):
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError):  # ragged sequences
            arr = None
    if arr is None or arr.dtype.kind not in "iuf" or arr.shape != (3,) or not np.all(np.isfinite(arr)):
        raise ReconstructionError(f"{name} must be 3 finite numbers (x, y, z in LPS mm), got {value!r}", where=where, fix=fix)
    return arr.astype(np.float64)


def _size(value: Any, name: str, where: str, fix: str) -> float:
    """A positive finite size (mm); :class:`ReconstructionError` naming ``name`` and the value."""
    v = _real(value)
    if v is None or not np.isfinite(v) or v <= 0:
        raise ReconstructionError(f"{name} must be a positive size in mm, got {value!r}", where=where, fix=fix)
    return v


def finding_box(finding: Any, *, where: str = "finding", fix: str = FINDING_FIX) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(centre, box min, box max) in LPS mm from a detector ``Finding`` or a mapping with the same keys.

    Accepts ``box_min_lps``/``box_max_lps`` (and optional ``center_lps``), or ``center_lps`` with ``diameter_mm``.
    Every value given must be usable: positions 3 finite numbers, ``diameter_mm`` a positive size, the box an
    extent along each axis. ``where`` (e.g. ``case c1, finding 2``) is named in the :class:`ReconstructionError`
    of a finding without a box or with a bad value, ``fix`` is its advice.
    """
    c, lo, hi = field_of(finding, "center_lps"), field_of(finding, "box_min_lps"), field_of(finding, "box_max_lps")
    d = field_of(finding, "diameter_mm")
    centre = None if c is None else finite_vec3(c, "center_lps", where, fix)
    diameter = None if d is None else _size(d, "diameter_mm", where, fix)
    if lo is not None or hi is not None:
        if lo is None or hi is None:
            given, missing = ("box_min_lps", "box_max_lps") if hi is None else ("box_max_lps", "box_min_lps")
            raise ReconstructionError(f"{given} is given without {missing}", where=where, fix=fix)
        a, b = finite_vec3(lo, "box_min_lps", where, fix), finite_vec3(hi, "box_max_lps", where, fix)
        lo_a, hi_a = np.minimum(a, b), np.maximum(a, b)
        if np.any(hi_a - lo_a <= 0):
            raise ReconstructionError(
                f"the box box_min_lps {lo!r} .. box_max_lps {hi!r} has no extent along "
                + "/".join(axis for axis, e in zip("LPS", hi_a - lo_a) if e <= 0),
                where=where,
                fix=fix,
            )
        return (centre if centre is not None else (lo_a + hi_a) / 2), lo_a, hi_a
    if centre is not None and diameter is not None:
        return centre, centre - diameter / 2, centre + diameter / 2
    missing = (
        "center_lps is given without diameter_mm"
        if centre is not None
        else "neither center_lps with diameter_mm nor box_min_lps/box_max_lps is given"
    )
    raise ReconstructionError(f"finding {finding!r} has no box: {missing}", where=where, fix=fix)


def check_findings(
    findings: Sequence[Any], *, where: str = "findings", need_score: bool = False, fix: str = FINDING_FIX
) -> list[Any]:
    """``findings`` checked before any work (:func:`finding_box` for each: a centre and a positive size, LPS mm; a
    ``score``, when given or ``need_score``, a number from 0 to 1), as a list; a mapping without ``center_lps`` or
    ``diameter_mm`` gets them from its box (the box's centre and equivalent diameter, as the detector computes it).

    Raises :class:`ReconstructionError` naming ``where``, the finding's index, the field and the bad value.
    """
    out = []
    for n, f in enumerate(findings):
        label = f"{where}, finding {n}"
        if not isinstance(f, Mapping) and not hasattr(f, "center_lps") and not hasattr(f, "box_min_lps"):
            raise ReconstructionError(
                f"finding {n} is not an object with center_lps and diameter_mm or box_min_lps/box_max_lps, got {f!r}",
                where=where,
                fix=fix,
            )
        centre, lo, hi = finding_box(f, where=label, fix=fix)
        score = field_of(f, "score")
        if score is None and need_score:
            raise ReconstructionError(
                "the finding has no score (the detector's confidence, 0 to 1), which the DICOM SR and SEG report",
                where=label,
                fix=f"{fix}, or write no DICOM results (--no-dicom)",
            )
        if score is not None:
            s = _real(score)
            if s is None or not 0.0 <= s <= 1.0:
                raise ReconstructionError(f"score must be a number from 0 to 1, got {score!r}", where=label, fix=fix)
        if isinstance(f, Mapping) and (field_of(f, "center_lps") is None or field_of(f, "diameter_mm") is None):
            f = {**f}
            if f.get("center_lps") is None:
                f["center_lps"] = [float(v) for v in centre]
            if f.get("diameter_mm") is None:
                f["diameter_mm"] = float(np.cbrt(np.prod(hi - lo)))
        out.append(f)
    return out


def series_uid_of(value: Any) -> str | None:
    """A series UID as text; None for a missing one (None, NaN, empty)."""
    return str(value) if isinstance(value, str) and value else None


def _table_value(row: Mapping[str, Any], key: str) -> Any:
    """``row[key]`` of a findings table row; None where the column is absent or the cell empty (None, NaN)."""
    value = row.get(key)
    if value is None or (isinstance(value, (float, np.floating)) and not np.isfinite(value)):
        return None
    return value


def table_findings(table: Any) -> list[dict[str, Any]]:
    """The rows of a findings table as finding dicts (LPS mm): ``open_run(...).findings`` or
    :func:`~pipeline.dicom_out.read_sr_findings` (``center_x/y/z``, ``box_min/max_x/y/z`` or ``box_min/max_lps``,
    ``diameter_mm``, ``score``, ``series_uid``). Empty cells (NaN) are left out, so a finding whose size is not stated
    takes it from its box."""
    out = []
    for row in table.to_dict("records"):
        finding: dict[str, Any] = {}
        centre = [_table_value(row, f"center_{a}") for a in "xyz"]
        if all(v is not None for v in centre):
            finding["center_lps"] = [float(v) for v in centre]
        for end in ("min", "max"):
            corner = [_table_value(row, f"box_{end}_{a}") for a in "xyz"]
            if all(v is not None for v in corner):
                finding[f"box_{end}_lps"] = [float(v) for v in corner]
            elif _table_value(row, f"box_{end}_lps") is not None:
                finding[f"box_{end}_lps"] = list(row[f"box_{end}_lps"])
        for key in ("diameter_mm", "score", "series_uid"):
            if _table_value(row, key) is not None:
                finding[key] = row[key]
        out.append(finding)
    return out


def finding_items(findings: Any) -> tuple[list[Any], list[str | None]]:
    """The findings given as a ``Findings``, one finding (object or dict), a list of them, or a findings table
    (:func:`table_findings`), as a list, and the series UID of each (``None`` where unknown: its own ``series_uid``,
    else that of the ``Findings`` holding it)."""
    if findings is None:
        return [], []
    if hasattr(findings, "columns"):  # a DataFrame
        items: list[Any] = table_findings(findings)
        return items, [series_uid_of(f.get("series_uid")) for f in items]
    common = series_uid_of(getattr(findings, "series_uid", None))  # a Findings' own series
    listed = getattr(findings, "findings", findings)
    if isinstance(listed, Mapping) or hasattr(listed, "center_lps") or hasattr(listed, "box_min_lps"):  # one finding
        listed = [listed]
    if not isinstance(listed, Iterable) or isinstance(listed, (str, bytes)):
        raise ReconstructionError(
            f"must be a Findings, a finding or a list of them, a findings table or the path of a findings JSON, got "
            f"{described(findings)}",
            where="findings",
            fix="pass detect(volume), open_run(...).findings, or the path of a findings JSON written by `ctpipe detect`",
        )
    items = list(listed)
    return items, [series_uid_of(field_of(f, "series_uid")) or common for f in items]


def unknown_series_note(findings: Any) -> str:
    """Why findings given as ``findings`` (as :func:`finding_items` takes them) carry no series UID, with the fix: for
    the warning that they cannot be checked against a volume's series (:func:`of_series`)."""
    if isinstance(findings, (str, os.PathLike)):
        return "the findings JSON has no series_uid"
    if hasattr(findings, "columns"):  # a DataFrame
        return "no series_uid column or value; open_run(...).findings has one"
    if hasattr(findings, "findings"):  # a Findings whose own series_uid is not set
        return "the Findings has no series_uid; set it to the series it was detected on"
    if isinstance(findings, Sequence) and findings and all(isinstance(f, Mapping) for f in findings):
        return "each finding (a dict, or an object of a findings JSON list) needs a series_uid key"
    return (
        "a Finding object does not hold its series, the Findings that detect returns does: pass that Findings itself "
        "(findings=detect(vol)), not a list of its findings (list(...), a slice); a finding dict needs a series_uid key"
    )


def of_series(
    items: Sequence[_T],
    uids: Sequence[str | None],
    series_uid: str | None,
    *,
    consequence: str,
    error: type[CtpipeError] = ReconstructionError,
    warn_unknown: bool = True,
    unknown_note: str = "no series_uid column or value",
) -> list[_T]:
    """The findings ``items`` (series UIDs ``uids``) that belong to the volume of series ``series_uid``.

    Findings all of another series are refused with ``error``, whose message ends in ``consequence`` (what using them
    on this volume would do); of a table of several series only this series' are kept (and none without a series
    UID). Findings without a series UID, or a volume without one, cannot be checked: kept, with a logged warning when
    ``warn_unknown``, which gives ``unknown_note`` (why they carry none and the fix: :func:`unknown_series_note`).
    """
    if not items:
        return list(items)
    if not series_uid:
        if warn_unknown:
            log.warning("the volume has no SeriesInstanceUID: cannot check that the %d finding(s) are of its series", len(items))
        return list(items)
    mine = [f for f, u in zip(items, uids) if u == series_uid]
    other = sorted({u for u in uids if u not in (None, series_uid)})
    if other and not mine:
        raise error(
            f"the findings are of series {', '.join(other[:3])}{' ...' if len(other) > 3 else ''}, "
            f"the volume is series {series_uid}: {consequence}",
            where="findings",
            fix="filter the findings by series, e.g. run.findings[run.findings.series_uid == vol.series_uid], "
            "or load the volume they belong to",
        )
    unknown = [f for f, u in zip(items, uids) if u is None]
    if unknown and other:  # a table of several series: those of no known series may be any case's
        log.warning("%d finding(s) without a series UID among findings of several series: left out", len(unknown))
        return mine
    if other:
        log.info("%d of %d finding(s) are of series %s: only those are used", len(mine), len(items), series_uid)
    if unknown and warn_unknown:
        log.warning(
            "%d finding(s) carry no series UID (%s): cannot check they are of series %s",
            len(unknown),
            unknown_note,
            series_uid,
        )
    return [f for f, u in zip(items, uids) if u is None or u == series_uid]


def read_findings(path: str | Path, *, need_score: bool = False) -> tuple[list[Any], Any]:
    """The findings of a JSON file, checked before any work: the findings to segment (LPS mm) and what a DICOM SR
    reports of them.

    Accepted are the findings document ``ctpipe detect`` writes (``ctpipe-findings/1``: its reported findings, as
    ``Finding`` objects, and the ``Findings`` with its operating point and model), and a JSON list of objects with
    ``center_lps`` and ``diameter_mm``, or ``box_min_lps``/``box_max_lps`` (LPS mm), and optionally ``score`` (0 to
    1; required with ``need_score``, as the DICOM results report it); the list is then reported as it is. Each
    finding is checked as :func:`check_findings` does. Raises :class:`ReconstructionError` naming the file, the
    finding's index, the field and the bad value.
    """
    path = Path(path)
    where = str(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ReconstructionError(f"cannot read the findings ({reason})", where=where, fix=FINDINGS_FILE_FIX) from exc
    if isinstance(data, list):
        listed = check_findings(data, where=where, need_score=need_score, fix=FINDINGS_FILE_FIX)
        return listed, listed
    if not isinstance(data, dict) or not str(data.get("format", "")).startswith("ctpipe-findings/"):
        kind = f"format {data.get('format')!r}" if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise ReconstructionError(
            f"not a ctpipe findings JSON ({kind})",
            where=where,
            fix="pass the JSON written by `ctpipe detect`, or a list of objects with center_lps and diameter_mm "
            "or box_min_lps/box_max_lps (LPS mm)",
        )
    from ..detection.findings import Finding, Findings

    for key in ("findings", "below_threshold"):
        items = data.get(key, [])
        if not isinstance(items, list):
            raise ReconstructionError(f"{key!r} must be a list of findings, got {items!r}", where=where, fix=FINDINGS_FILE_FIX)
        label = where if key == "findings" else f"{where}, below_threshold"
        check_findings(items, where=label, fix=FINDINGS_FILE_FIX)  # a missing score: from_json names it below
        for n, item in enumerate(items):
            try:
                Finding.from_json(item)
            except KeyError as exc:
                raise ReconstructionError(
                    f"{exc.args[0]} is missing", where=f"{label}, finding {n}", fix=FINDINGS_FILE_FIX
                ) from exc
            except (TypeError, ValueError) as exc:
                raise ReconstructionError(
                    f"the finding is incomplete ({type(exc).__name__}: {exc})",
                    where=f"{label}, finding {n}",
                    fix=FINDINGS_FILE_FIX,
                ) from exc
    try:
        found = Findings.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ReconstructionError(
            f"findings JSON is incomplete ({type(exc).__name__}: {exc})", where=where, fix=FINDINGS_FILE_FIX
        ) from exc
    return list(found.findings), found


def given_findings(findings: Any) -> tuple[list[Any], list[str | None]]:
    """:func:`finding_items` of ``findings`` as :func:`~pipeline.reconstruction.reconstruct` and :func:`pipeline.show`
    take them: also the path of a findings JSON, read by :func:`read_findings` (the ``Findings`` of a ``ctpipe detect``
    document, whose series the caller checks; a :class:`ReconstructionError` naming a file that cannot be read)."""
    if isinstance(findings, (str, os.PathLike)):
        findings = read_findings(Path(findings))[1]
    return finding_items(findings)


def findings_of_series(findings: Any, series_uid: str | None, *, warn_unknown: bool = True) -> list[Any]:
    """The findings to segment on a volume of series ``series_uid``, checked before any work: ``findings`` as
    :func:`~pipeline.reconstruction.reconstruct` takes them (a ``Findings``, a list, a findings table, or the path of a
    findings JSON, read by :func:`read_findings`), those of the volume's series (:func:`of_series`), each with a usable
    centre and size (:func:`check_findings`; LPS mm). Raises :class:`ReconstructionError` for findings of another
    series, naming both series. Findings without a series UID are kept, with a logged warning that says why they carry
    none and the fix (:func:`unknown_series_note`) unless ``warn_unknown`` is false (a caller that checks them again)."""
    items, uids = given_findings(findings)
    items = of_series(
        items,
        uids,
        series_uid,
        consequence="segmented on this volume they would measure another scan's anatomy",
        warn_unknown=warn_unknown,
        unknown_note=unknown_series_note(findings),
    )
    return check_findings(items)
