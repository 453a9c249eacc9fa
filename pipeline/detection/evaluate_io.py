"""Read ground truth and predictions for :func:`.evaluate.evaluate_froc` (all positions LPS mm).

Ground truth: a phantom's ``ground_truth.json`` (or a folder holding one or many,
searched recursively), or a LUNA16-style CSV ``seriesuid,coordX,coordY,coordZ,diameter_mm``
(also the form of LUNA16's ``annotations_excluded.csv``, the irrelevant findings).
Predictions: ctpipe findings JSON files (or folders of them; every candidate, reported or
below the score threshold), or a LUNA16-style candidates CSV
``seriesuid,coordX,coordY,coordZ,probability``.
Scan list: a CSV like LUNA16's ``seriesuids.csv``: one SeriesInstanceUID per line in the first column, with no
header line (as LUNA16 ships it), or under a ``seriesuid`` header column (any column). Without that header every line
must hold a SeriesInstanceUID (digits and dots) or a scan the predictions or truth name: a first line that is neither
is a header under another name, refused rather than counted as a scan.
Folders are searched for ``ground_truth.json`` / ``*.findings.json``; CSV files are read when named.
Scans are keyed by SeriesInstanceUID.
"""

from __future__ import annotations

import csv
import json
import logging
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..csvfile import read_table
from ..errors import ConfigError
from .findings import Findings

log = logging.getLogger(__name__)


def _csv_rows(path: Path, value_key: str, *, what: str = "") -> dict[str, list[tuple[np.ndarray, float]]]:
    """Scan id → [(centre, ``value_key``)] of a LUNA16-style CSV; a ``diameter_mm`` must be positive for ``what`` =
    ``"--truth"`` (a nodule); ``--irrelevant`` takes LUNA16's -1 (no diameter) too."""
    out: dict[str, list[tuple[np.ndarray, float]]] = {}
    try:
        table = read_table(path)
    except (OSError, csv.Error, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the CSV ({exc})", where=path, fix="save it as a UTF-8 CSV file") from exc
    fields = set(table.columns)
    need = {"seriesuid", "coordX", "coordY", "coordZ", value_key}
    if not need <= fields:
        ours = {"series_uid", "center_x_lps", "score"} <= fields  # `ctpipe detect`'s findings CSV: the reported ones only
        raise ConfigError(
            f"CSV columns {sorted(fields)} lack {sorted(need - fields)}",
            where=path,
            fix="pass the .findings.json beside it (it holds every candidate, the CSV only the reported findings)"
            if ours
            else f"use the LUNA16 layout: seriesuid,coordX,coordY,coordZ,{value_key}",
        )
    for n, row in enumerate(table.rows, 2):
        values = [_number(row, key, n, path) for key in ("coordX", "coordY", "coordZ", value_key)]
        if value_key == "diameter_mm" and what == "--truth" and values[3] <= 0:
            raise ConfigError(
                f"row {n}: diameter_mm {row[value_key].strip()!r} is not positive: a nodule of the ground truth needs "
                "its diameter",
                where=path,
                fix="give every nodule its diameter in mm (findings without one, LUNA16's -1, go to --irrelevant)",
            )
        out.setdefault(row["seriesuid"].strip(), []).append((np.array(values[:3]), values[3]))
    return out


def _number(row: dict[str, str], key: str, n: int, path: Path) -> float:
    """The finite number in column ``key`` of CSV row ``n`` (a line number), else :class:`ConfigError` naming both."""
    text = row[key].strip()
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not np.isfinite(value):
        comma = "," in text and "." not in text
        raise ConfigError(
            f"row {n}: {key} {text!r} is not a finite number",
            where=path,
            fix="write numbers with a decimal point (1.5, not 1,5)"
            if comma
            else f"give every row a finite number in {key}" + (" (world coordinates, mm)" if key.startswith("coord") else ""),
        )
    return value


#: what --truth and --pred take, for the fixes of their errors
_TRUTH = "phantom ground_truth.json files or their folders, or a LUNA16 annotations CSV"
_PRED = "findings JSONs of `ctpipe detect`, run folders of `ctpipe run`, or a LUNA16 candidates CSV"


def _files(
    paths: Iterable[str | Path], patterns: tuple[str, ...], *, what: str = "a path", takes: str = "existing paths"
) -> list[Path]:
    """Files given directly (any kind), plus those matching ``patterns`` under given folders (recursive); each file
    once, however often it is named (a folder and a file in it, a folder twice): read twice, its nodules or
    candidates would count twice. A path that does not exist is refused, naming ``what`` (the option) and what it
    ``takes``."""
    files: dict[Path, Path] = {}
    for p in map(Path, paths):
        if p.is_dir():
            found = [f for pat in patterns for f in sorted(p.rglob(pat))]
        elif p.is_file():
            found = [p]
        else:
            raise ConfigError(f"no such file or folder (given as {what})", where=p, fix=f"check the path; {what} takes {takes}")
        for f in found:
            files.setdefault(f.resolve(), f)
    return list(files.values())


def _claim(source: dict[str, Path], scan_id: str, f: Path, *, what: str, items: str, fix: str) -> None:
    """Record that ``f`` holds scan ``scan_id``; refuse a second file of the same scan, whose ``items`` would count
    twice."""
    if scan_id in source:
        raise ConfigError(
            f"scan {scan_id} has {what} here and in {source[scan_id]}: its {items} would count twice", where=f, fix=fix
        )
    source[scan_id] = f


def load_truth(paths: Iterable[str | Path], *, what: str = "--truth") -> dict[str, list[tuple[np.ndarray, float]]]:
    """Scan id → [(centre LPS mm, diameter mm)] from phantom JSONs and/or LUNA16 annotation CSVs.

    ``what`` names the option the paths came from in errors: for ``--truth`` every diameter must be a positive
    number; ``--irrelevant`` (irrelevant findings, LUNA16's ``annotations_excluded.csv``) also takes a negative one,
    LUNA16's "no diameter".
    """
    paths = list(paths)
    truth: dict[str, list[tuple[np.ndarray, float]]] = {}
    source: dict[str, Path] = {}  # scan id → the ground truth JSON it came from
    for f in _files(paths, ("ground_truth.json",), what=what, takes=_TRUTH):
        if f.suffix == ".csv":
            for sid, rows in _csv_rows(f, "diameter_mm", what=what).items():
                truth.setdefault(sid, []).extend(rows)
            continue
        try:
            data = json.loads(f.read_text())
            sid = str(data["series_uid"])
            nods = [(np.asarray(n["center_lps"], float), float(n["diameter_mm"])) for n in data["nodules"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"not a phantom ground truth JSON ({type(exc).__name__}: {exc})",
                where=f,
                fix="pass ground_truth.json files written by the phantom generator, or a LUNA16 CSV",
            ) from exc
        for n, (_, diameter) in enumerate(nods):
            if not (np.isfinite(diameter) and diameter > 0):
                raise ConfigError(
                    f"nodule {n} (counting from 0): diameter_mm {diameter!r} is not a positive number",
                    where=f,
                    fix="give every nodule its diameter in mm (the phantom generator writes them)",
                )
        _claim(
            source,
            sid,
            f,
            what="a ground truth",
            items="nodules",
            fix="pass one ground truth per scan (a copy of a phantom folder holds the same series)",
        )
        truth.setdefault(sid, []).extend(nods)
    if not truth:
        raise ConfigError(
            "no ground truth found (no ground_truth.json, no annotations CSV)",
            where=", ".join(map(str, paths)),
            fix=f"{what} takes {_TRUTH}",
        )
    return truth


def load_predictions(paths: Iterable[str | Path]) -> dict[str, list[tuple[np.ndarray, float]]]:
    """Scan id → [(centre LPS mm, score)] from findings JSONs and/or LUNA16 candidate CSVs."""
    return read_predictions(paths).candidates


@dataclass(frozen=True)
class Predictions:
    """What ``--pred`` holds: ``candidates``, scan id → [(centre LPS mm, score)], every candidate of each scan; and
    ``thresholds``, scan id → the score threshold its findings JSON was reported at (``None``: every candidate was
    reported), for the scans read from findings JSONs (a LUNA16 CSV records none)."""

    candidates: dict[str, list[tuple[np.ndarray, float]]]
    thresholds: dict[str, float | None]

    def reported_threshold(self) -> float | None:
        """The one score threshold every findings JSON was reported at, or ``None`` when there is none (CSV
        predictions, every candidate reported) or they differ."""
        values = set(self.thresholds.values())
        return values.pop() if len(values) == 1 and None not in values else None


def read_predictions(paths: Iterable[str | Path]) -> Predictions:
    """:class:`Predictions` from findings JSONs and/or LUNA16 candidate CSVs (positions LPS mm)."""
    preds: dict[str, list[tuple[np.ndarray, float]]] = {}
    thresholds: dict[str, float | None] = {}
    source: dict[str, Path] = {}  # scan id → the findings JSON it came from
    # `ctpipe detect` writes <case>.findings.json; `ctpipe run` writes cases/<id>/findings.json
    files = _files(paths, ("*findings.json",), what="--pred", takes=_PRED)
    if not files:
        raise ConfigError(
            "no findings JSON or candidates CSV found",
            where=", ".join(map(str, paths)),
            fix=f"--pred takes {_PRED}",
        )
    for f in files:
        if f.suffix == ".csv":
            for sid, rows in _csv_rows(f, "probability").items():
                preds.setdefault(sid, []).extend(rows)
            continue
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"not a ctpipe findings JSON ({type(exc).__name__}: {exc})", where=f, fix=f"--pred takes {_PRED}"
            ) from exc
        kind = data.get("format") if isinstance(data, dict) else None
        if not str(kind).startswith("ctpipe-findings/"):
            raise ConfigError(
                f"not a ctpipe findings JSON (format {kind!r})",
                where=f,
                fix="pass the findings of `ctpipe detect` or `ctpipe run` (ground truth goes to --truth)",
            )
        try:
            fnd = Findings.from_json(data)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"not a ctpipe findings JSON ({type(exc).__name__}: {exc})", where=f, fix=f"--pred takes {_PRED}"
            ) from exc
        scan_id = fnd.series_uid or fnd.case_id
        if not scan_id:
            raise ConfigError("findings name neither a series UID nor a case id", where=f)
        _claim(
            source,
            scan_id,
            f,
            what="findings",
            items="candidates",
            fix="pass one findings JSON per scan (name the files, or the folder of one run, instead of both)",
        )
        preds.setdefault(scan_id, []).extend((np.asarray(x.center_lps, float), float(x.score)) for x in fnd.candidates)
        thresholds[scan_id] = None if fnd.score_threshold is None else float(fnd.score_threshold)
    return Predictions(candidates=preds, thresholds=thresholds)


#: the header names a scan list's column of SeriesInstanceUIDs may have (any case): LUNA16's, ctpipe's, DICOM's
_SCAN_HEADERS = ("seriesuid", "series_uid", "seriesinstanceuid")
#: a DICOM UID: numbers separated by dots, at most 64 characters
_UID = re.compile(r"[0-9]+(\.[0-9]+)+")


def load_scans(path: str | Path, *, known: Collection[str] = ()) -> list[str]:
    """The scan ids (SeriesInstanceUIDs) of a test set, from a CSV like LUNA16's ``seriesuids.csv``.

    With a ``seriesuid`` header (or ``series_uid``, ``SeriesInstanceUID``) the scans are that column's values,
    whatever they look like. Without a header (LUNA16's file has none), the first column, and each value must be a
    DICOM UID or one of the ``known`` scan ids (those the predictions and truth name): anything else, a header under
    another name in particular, is refused with its line number rather than counted as a scan without nodules.
    """
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:  # a spreadsheet's byte-order mark is not the UID's
            rows = [(n, row) for n, row in enumerate(csv.reader(fh), 1) if any(cell.strip() for cell in row)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise ConfigError(
            f"cannot read the scan list ({why})", where=path, fix="--scans takes a CSV file of SeriesInstanceUIDs"
        ) from exc
    header = [cell.strip().lower() for cell in rows[0][1]] if rows else []
    column = next((header.index(name) for name in _SCAN_HEADERS if name in header), None)
    if column is not None:
        scans = [row[column].strip() for _, row in rows[1:] if column < len(row) and row[column].strip()]
    else:
        rows = [(n, row) for n, row in rows if row[0].strip()]
        scans = [row[0].strip() for _, row in rows]
        known = set(known)
        for n, row in rows:
            value = row[0].strip()
            if value in known or (len(value) <= 64 and _UID.fullmatch(value)):
                continue
            first = n == rows[0][0]
            raise ConfigError(
                f"line {n}: {value!r} is neither a SeriesInstanceUID nor a scan of --pred or --truth"
                + (", and the file has no seriesuid header column" if first else ""),
                where=path,
                fix="if line 1 is a header, name its scan column seriesuid; else list one SeriesInstanceUID per line, "
                "as LUNA16's seriesuids.csv"
                if first
                else "check that scan: one SeriesInstanceUID per line, as LUNA16's seriesuids.csv (under a seriesuid "
                "header line, other scan names are taken too)",
            )
    if not scans:
        raise ConfigError("the scan list is empty", where=path, fix="one SeriesInstanceUID per line, as LUNA16's seriesuids.csv")
    return list(dict.fromkeys(scans))
