"""How a throughput report's rates are computed, in words for the page and ``report.json`` (``throughput.method``,
``capacity.method``), with the report's own figures in them.

Two measured rates, one model:

* the measured rate: completed cases ÷ the runs' active time (each run from its start to its end, or to its last
  recorded stage when it was killed; runs side by side counted once; the time between runs not counted), in cases/hour;
  cases/day is that × the operating hours per day;
* the rate over wall time: completed cases ÷ the time from the first run's start to the last run's end, the idle time
  between runs included (what a nightly job's calendar delivers, not what the machine can do);
* the capacity model (:mod:`.capacity`): each stage's busy time per case, for the cluster asked for, scaled by the
  efficiency measured over the same active time as the measured rate; at the runs' own deployment on one machine it
  gives the measured rate.
"""

from __future__ import annotations

from typing import Any


def _span(seconds: float) -> str:
    return f"{seconds / 3600.0:,.2f} h" if seconds >= 3600 else f"{seconds / 60.0:,.1f} min"


def throughput_method(*, n_done: int, active_s: float, wall_s: float, hours_per_day: float) -> str:
    """The measured rates in words: over active time (the headline) and over wall time (``wall_s``: first start to
    last end, s)."""
    rate = 3600.0 * n_done / active_s if active_s > 0 else 0.0
    wall = 3600.0 * n_done / wall_s if wall_s > 0 else 0.0
    return (
        f"measured rate: {n_done} completed case(s) ÷ {_span(active_s)} of active time = {rate:,.1f} cases/hour "
        "(active time: each run from its start to its end, or to its last recorded stage if it was killed; runs at work "
        "at the same time counted once; the time between runs not counted); cases/day = that rate × "
        f"{hours_per_day:g} operating hours. Over the wall time from the first run's start to the last run's end "
        f"({_span(wall_s)}, the idle time between runs included) it is {wall:,.1f} cases/hour"
    )


def capacity_method(
    *,
    cap: dict[str, Any],
    own: dict[str, Any],
    measured_per_day: float,
    hosts: int,
    shapes: set[tuple[int, int]],
    side_by_side_s: float = 0.0,
) -> str:
    """The capacity model in words: what it computes, and its figure at the runs' own deployment (``own``: the model
    with the default cluster) beside the measured rate (``measured_per_day``: cases/day over active time), with why
    they differ: several machines (``hosts``), runs of several shapes (``shapes``: each run's model workers and
    ``runner.workers``), runs at work side by side on one machine (``side_by_side_s``, s), or runs of one process."""
    text = (
        "the capacity model: each stage's busy time per case (capacity.csv: its successful and failed attempts' wall time "
        "÷ its successful attempts, over all runs) gives the cases/s the model workers (one per GPU) and the CPU workers "
        "(one per core) can sustain; the slower group bounds the rate, scaled by the efficiency (completed cases ÷ the "
        "cases those stage times predict over the same active time as the measured rate)"
    )
    if own.get("cases_per_day") is None:
        return text + "; no completed stage attempts to project from"
    same = all(cap[k] == own[k] for k in ("gpus", "nodes", "cpu_workers_per_node"))
    where = (
        f"{own['gpus']} model worker(s), {own['cpu_workers_per_node']} CPU worker(s), one machine"
        if own["cpu_workers_per_node"]
        else "one machine"
    )
    text += (
        f". At the runs' own deployment ({where}) it gives {own['cases_per_day']:,.0f} cases/day, the measured rate "
        f"{measured_per_day:,.0f} cases/day"
    )
    if own.get("efficiency_measured") is None:
        text += (
            "; no case completed: the efficiency is not measured (1.00 assumed) and the stages no case reached are left "
            "out, so the model is not comparable with the measured rate"
        )
    measured_eff = own.get("efficiency_measured") or 0.0
    if measured_eff > 1.0:
        text += f" (its efficiency, measured {measured_eff:.2f}, counted as 1.00)"
    if not same:
        text += f"; for the cluster asked for it gives {cap['cases_per_day']:,.0f} cases/day"
    if hosts > 1:
        text += (
            f". The runs come from {hosts} machines: the measured rate is theirs together, the model is for the nodes "
            "given (--nodes; default one)"
        )
    if side_by_side_s >= 1.0:
        text += (
            f". Runs of one machine worked side by side for {_span(side_by_side_s)}: the measured rate is theirs "
            "together over that time, where the model takes one run's workers"
        )
    if len(shapes) > 1:
        listed = ", ".join(f"{g} model worker(s) and runner.workers {w}" for g, w in sorted(shapes))
        text += (
            f". The runs ran in different shapes ({listed}): the measured rate mixes them, the model's default is the "
            "largest of each (give --gpus and --cpu-workers for another)"
        )
    elif any("one process" in a for a in own.get("assumptions", [])):
        text += (
            ". The runs ran every stage in one process, one case after another: the model projects separate model and "
            "CPU workers, which overlap cases, so it gives more than was measured"
        )
    return text
