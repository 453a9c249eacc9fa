"""Completed cases per calendar day in a local time zone, for the throughput report.

The run store keeps Unix seconds and the report's CSV times are UTC; a hospital counts its days from local
midnight. :func:`report_zone` names the zone the report's local days are in (an IANA name such as
``Europe/Berlin``, by default this machine's local time: ``$TZ``, else ``/etc/localtime``), and
:func:`cases_per_local_day` counts completed cases by the local day they ended on, listing with 0 a local day
during which a run was active without completing a case.
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

__all__ = ["cases_per_local_day", "per_local_day", "report_zone", "zone_label"]


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
    offset = dt.datetime.fromtimestamp(at, zone).strftime("%z")
    return f"{name}, UTC{offset[:3]}:{offset[3:]}" if offset else name


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


def per_local_day(done: Any, intervals: Sequence[tuple[float, float]], timezone: str | None) -> dict[str, Any]:
    """The report's ``throughput`` entries for local days: ``per_day_local`` (:func:`cases_per_local_day` of the
    completed cases ``done``) and ``timezone`` (:func:`zone_label`, the offset as of the latest run's end)."""
    zone, name = report_zone(timezone)
    latest = max((e for _, e in intervals), default=time.time())
    return {
        "per_day_local": cases_per_local_day(list(done.ended_at), intervals, zone),
        "timezone": zone_label(zone, name, latest),
    }
