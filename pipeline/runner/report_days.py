"""Completed cases per calendar day in a local time zone, for the throughput report.

The run store keeps Unix seconds and the report's CSV times are UTC; a hospital counts its days from local
midnight. :func:`report_zone` names the zone the report's local days are in (an IANA name such as
``Europe/Berlin``, by default this machine's local time: ``$TZ``, else ``/etc/localtime``), and
:func:`cases_per_local_day` counts completed cases by the local day they ended on, listing with 0 a local day
during which a run was active without completing a case. :func:`every_day` lists every calendar day of the
report's period, from its first day to its last, a day without any run with 0 too, and names those days: the mean of
the rows is then the mean per calendar day, and "no run" is told from "ran, completed nothing". Each local day is named with its UTC offset, both on the
day of a daylight-saving change (:func:`days_label`). :func:`redo_ends` gives when the cases done again (their
published folder removed) were, and :func:`throughput_tables` the report's CSV tables of cases per day and hour: new
cases, cases done again and the two together.
"""

from __future__ import annotations

import datetime as dt
import os
import time
import zoneinfo
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = [
    "cases_per_local_day",
    "day_offsets",
    "days_label",
    "every_day",
    "per_local_day",
    "report_zone",
    "zone_label",
]


def _machine_zone_name() -> str | None:
    """The IANA name of this machine's local time zone (``$TZ``, else the target of ``/etc/localtime``), or None."""
    name = os.environ.get("TZ", "").lstrip(":")
    if name:
        return name
    try:
        target = Path("/etc/localtime").resolve(strict=True)
    except OSError:
        return None
    parts = target.parts
    return "/".join(parts[parts.index("zoneinfo") + 1 :]) if "zoneinfo" in parts else None


def report_zone(name: str | None = None) -> tuple[dt.tzinfo, str]:
    """The time zone of the report's local days and its name: the IANA zone ``name`` (``Asia/Tokyo``), or with
    None this machine's local time. Raises :class:`~pipeline.errors.ConfigError` for a name that is no time zone."""
    if name is None:
        machine = _machine_zone_name()
        try:
            return (zoneinfo.ZoneInfo(machine), machine) if machine else _libc_zone()
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            return _libc_zone()
    try:
        return zoneinfo.ZoneInfo(name), name
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(
            f"time zone {name!r} is not known",
            fix="give an IANA time zone name such as Europe/Berlin, America/New_York or UTC",
        ) from exc


def _libc_zone() -> tuple[dt.tzinfo, str]:
    """This machine's local time as the C library applies it (no IANA name to be had), named by its abbreviations."""
    from dateutil import tz

    names = "/".join(dict.fromkeys(n for n in time.tzname if n)) or "local time"
    return tz.tzlocal(), names


def zone_label(zone: dt.tzinfo, name: str, at: float) -> str:
    """``name`` with its UTC offset at Unix time ``at`` (s): ``Asia/Tokyo, UTC+09:00``."""
    offset = _offset(dt.datetime.fromtimestamp(at, zone))
    return f"{name}, {offset}" if offset else name


def _offset(when: dt.datetime) -> str:
    """The UTC offset of the aware ``when`` as ``UTC+01:00`` ("" where the zone gives none)."""
    text = when.strftime("%z")
    return f"UTC{text[:3]}:{text[3:]}" if text else ""


def day_offsets(day: str, zone: dt.tzinfo) -> list[str]:
    """The UTC offsets the local calendar day ``day`` (``YYYY-MM-DD`` in ``zone``) begins and ends with, in order, the
    same one once (``["UTC+01:00", "UTC+02:00"]`` on the day the clocks go forward)."""
    d = dt.date.fromisoformat(day)
    start = dt.datetime(d.year, d.month, d.day, tzinfo=zone)
    end = dt.datetime(d.year, d.month, d.day, 23, 59, 59, tzinfo=zone)
    return list(dict.fromkeys(o for o in (_offset(start), _offset(end)) if o))


def days_label(days: Sequence[str], zone: dt.tzinfo, name: str) -> str:
    """``name`` with the UTC offsets the local ``days`` (in order) are in: ``Europe/Berlin, UTC+01:00`` for days of
    one offset, ``Europe/Berlin, UTC+01:00 then UTC+02:00`` over a daylight-saving change."""
    offsets: list[str] = []
    for day in days:
        for o in day_offsets(day, zone):
            if not offsets or offsets[-1] != o:
                offsets.append(o)
    return f"{name}, {' then '.join(offsets)}" if offsets else name


def cases_per_local_day(ended_s: Sequence[float], intervals: Sequence[tuple[float, float]], zone: dt.tzinfo) -> dict[str, int]:
    """Completed cases per local calendar day (``YYYY-MM-DD`` in ``zone``, sorted): ``ended_s`` the cases' end times,
    ``intervals`` the runs' active ``(start, end)`` (Unix s, UTC); a local day a run was active on counts 0 when
    no case ended on it."""
    import pandas as pd

    def day(t: float) -> dt.date:
        return dt.datetime.fromtimestamp(t, zone).date()

    counts: dict[str, int] = {}
    for s, e in intervals:  # every local day from each run's start to its end
        d, last = day(s), day(max(s, e - 1e-3))
        while d <= last:
            counts.setdefault(d.isoformat(), 0)
            d += dt.timedelta(days=1)
    for t in pd.to_numeric(pd.Series(list(ended_s), dtype=float), errors="coerce").dropna():
        key = day(float(t)).isoformat()
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def every_day(counts: dict[str, int]) -> tuple[dict[str, int], list[str]]:
    """``counts`` (cases per calendar day, ``YYYY-MM-DD``: the days a run was active or a case ended) with every day
    between its first and last added with 0, sorted, and the days so added: those on which no run was active."""
    if not counts:
        return {}, []
    first, last = dt.date.fromisoformat(min(counts)), dt.date.fromisoformat(max(counts))
    days = [(first + dt.timedelta(days=n)).isoformat() for n in range((last - first).days + 1)]
    return {d: counts.get(d, 0) for d in days}, [d for d in days if d not in counts]


def per_local_day(done: Any, intervals: Sequence[tuple[float, float]], timezone: str | None) -> dict[str, Any]:
    """The report's ``throughput`` entries for local days: ``per_day_local`` (:func:`cases_per_local_day` of the
    completed cases ``done``, each at its first completion ``first_done_at``, every day of the period listed: :func:`every_day`), ``days_without_run_local`` (the
    days listed with 0 on which no run was active), ``redone_per_day_local`` (the cases done again on each of those
    days: :func:`redo_ends`), ``timezone`` (the zone and the UTC offsets of those days, :func:`days_label`; without
    days, the offset as of the latest run's end) and ``timezone_by_day_local`` (each day's own, with both offsets on
    the day of a daylight-saving change)."""
    zone, name = report_zone(timezone)
    per_day, no_run = every_day(cases_per_local_day(list(done.first_done_at), intervals, zone))
    redone = cases_per_local_day(redo_ends(done), [], zone)
    latest = max((e for _, e in intervals), default=time.time())
    return {
        "per_day_local": per_day,
        "redone_per_day_local": {day: redone.get(day, 0) for day in per_day},
        "days_without_run_local": no_run,
        "timezone": days_label(list(per_day), zone, name) if per_day else zone_label(zone, name, latest),
        "timezone_by_day_local": {day: days_label([day], zone, name) for day in per_day},
    }


def redo_ends(done: Any) -> list[float]:
    """When each completed case of ``done`` (the report's cases table) that was done again, its published folder
    removed, last completed (Unix s): its ``ended_at``, later than its first completion ``first_done_at``. A case
    counts once, at its latest completion: work done then, no new case."""
    import pandas as pd

    ended = pd.to_numeric(done.ended_at, errors="coerce").astype(float)
    first = pd.to_numeric(done.first_done_at, errors="coerce").astype(float).fillna(ended)
    return [float(t) for t in ended[first < ended]]


#: The throughput tables' columns beside ``cases`` (new cases): the cases done again (their published folder removed)
#: and the two together, the cases worked on.
REDONE_COLUMNS = ["cases_redone", "cases_total_work"]


def _with_redone(new: int, redone: int) -> tuple[int, int]:
    """The :data:`REDONE_COLUMNS` of a day or hour with ``new`` new cases and ``redone`` cases done again."""
    return redone, new + redone


def throughput_tables(tp: dict[str, Any]) -> dict[str, Any]:
    """The report's throughput CSV tables by file name (DataFrames), from its summary's ``throughput`` entries ``tp``:
    ``throughput_daily.csv`` (UTC days), ``throughput_daily_local.csv`` (local days) and ``throughput_hourly.csv``
    (UTC hours), each with ``cases`` (new cases) and the :data:`REDONE_COLUMNS`."""
    import pandas as pd

    return {
        # every day of the period, run_active False on a day without any run (its 0 is not "ran, completed nothing");
        # cases: new cases, as ever; cases_redone: cases done again then; cases_total_work: both, the work done
        "throughput_daily.csv": pd.DataFrame(
            [
                (day, n, *_with_redone(n, tp["redone_per_day_utc"].get(day, 0)), day not in tp["days_without_run_utc"])
                for day, n in tp["per_day_utc"].items()
            ],
            columns=["day_utc", "cases", *REDONE_COLUMNS, "run_active"],
        ),
        "throughput_daily_local.csv": pd.DataFrame(
            [
                (
                    day,
                    tp["timezone_by_day_local"].get(day, tp["timezone"]),
                    n,
                    *_with_redone(n, tp["redone_per_day_local"].get(day, 0)),
                    day not in tp["days_without_run_local"],
                )
                for day, n in tp["per_day_local"].items()
            ],
            columns=["day_local", "timezone", "cases", *REDONE_COLUMNS, "run_active"],
        ),
        "throughput_hourly.csv": pd.DataFrame(
            [
                (f"{hour.replace(' ', 'T')}:00Z", n, *_with_redone(n, tp["redone_per_hour_utc"].get(hour, 0)))
                for hour, n in tp["per_hour_utc"].items()
            ],
            columns=["hour_utc", "cases", *REDONE_COLUMNS],
        ),
    }
