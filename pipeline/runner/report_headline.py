"""The headlines of a throughput report (:mod:`.report_summary`): the cases/day projection from the measured rate,
what it rests on and whether that is enough to project from (:data:`MIN_CASES_TO_PROJECT` completed cases,
:data:`MIN_MINUTES_TO_PROJECT` active minutes), where the rate was measured, and the capacity model's text for runs
that recorded no GPU."""

from __future__ import annotations

import re
from typing import Any

#: The fewest completed cases, and active minutes, a cases/day projection is made from: a rate measured over fewer
#: is dominated by start-up and chance (see :mod:`.report_summary`).
MIN_CASES_TO_PROJECT = 10
MIN_MINUTES_TO_PROJECT = 5.0


def _span(minutes: float) -> str:
    """Active time in words: seconds below a minute (a short run is not "0.0" minutes), minutes below an hour, else
    hours."""
    if minutes * 60.0 < 59.95:
        return f"{minutes * 60.0:.1f} active seconds" if minutes < 10 / 60.0 else f"{minutes * 60.0:.0f} active seconds"
    return f"{minutes / 60.0:.2f} active hours" if minutes >= 60 else f"{minutes:.1f} active minutes"


def machines(runs: Any) -> tuple[str, bool]:
    """Where the runs' rate was measured, in words, and whether that is several machines: one machine (its host
    name), several together (the rate is theirs combined), or a Ray cluster (named by its head)."""
    hosts = sorted(set(runs.host.dropna().astype(str))) or ["unknown host"]
    ray = any(str(d).startswith("ray ") for d in runs.device.dropna())
    if ray:
        heads = "head" if len(hosts) == 1 else "heads"
        return f"the Ray cluster(s) of these runs ({heads} {', '.join(hosts)})", True
    if len(hosts) == 1:
        return f"machine {hosts[0]}", False
    return f"{len(hosts)} machines together ({', '.join(hosts)})", True


def projection(rate_h: float, hours_per_day: float, n_done: int, minutes: float, enough: bool, *, where: tuple[str, bool]) -> str:
    """The cases/day headline: the figure, what it rests on, and whether that is enough to project from.

    ``rate_h``: measured cases/hour; ``minutes``: active minutes; ``where``: :func:`machines` (the rate of several
    machines is their combined rate). When ``enough`` is false the headline leads with the measured rate and says the
    cases/day projection has not enough data, without its figure.
    """
    machines, several = where
    basis = f"{rate_h:,.1f} cases/hour from {n_done} completed case(s) over {_span(minutes)}"
    if not enough:
        return (
            f"measured {basis} on {machines}; cases/day projection: not enough data (too few to project from: fewer than "
            f"{MIN_CASES_TO_PROJECT} completed cases or {MIN_MINUTES_TO_PROJECT:g} active minutes)"
        )
    return (
        f"at the measured rate {machines} {'handle' if several else 'handles'} {rate_h * hours_per_day:,.0f} cases/day "
        f"({basis}, {hours_per_day:g} operating hours/day)"
    )


#: Devices a run records with a GPU: ``cuda:0 (NVIDIA A100...)``; a Ray cluster's ``..., 4 GPU(s)``.
_CUDA_DEVICE = re.compile(r"\bcuda:\d+")


_RAY_GPUS = re.compile(r"(\d+(?:\.\d+)?) GPU\(s\)")


def gpu_recorded(runs: Any) -> bool:
    """Whether any run recorded a GPU device (a CUDA device, or a Ray cluster with GPUs)."""
    for device in runs.device.dropna().astype(str):
        ray = _RAY_GPUS.search(device)
        if _CUDA_DEVICE.search(device) or (ray is not None and float(ray.group(1)) > 0):
            return True
    return False


def _cpu_capacity_text(c: dict[str, Any]) -> str:
    """The capacity headline of runs that recorded no GPU: model workers, no per-GPU figure, no reference deployment."""
    where = f"{c['gpus']} model worker(s) over {c['nodes']} node(s), {c['cpu_workers_per_node']} CPU worker(s) per node"
    if c["cases_per_day"] is None:
        return f"capacity model for {where}: no completed stage attempts to project from"
    rate = (
        f"{c['cases_per_day']:,.0f} cases/day ({c['hours_per_day']:g} operating hours/day); bottleneck: {c['bottleneck']} "
        f"stages (model {c['model_busy_s_per_case']:.2f} s/case per model worker, CPU {c['cpu_busy_s_per_case']:.2f} core-s/case)"
    )
    parts = [f"capacity model for {where} (no GPU recorded: the model stages ran on the CPU)"]
    parts.append(
        f"too few to project from (see the cases/day headline); indicative only: {rate}" if not c["enough_to_project"] else rate
    )
    parts.append("model stages scale per model worker, CPU stages per CPU worker (one per core), over every node")
    parts += [a for a in c["assumptions"] if "GPU" not in a]
    parts.append("no per-GPU figure or comparison with the reference without a GPU")
    return "; ".join(parts)


def capacity_summary(capacity: Any, *, gpu: bool) -> dict[str, Any]:
    """The capacity model's JSON, ``gpu_recorded`` added; when ``gpu`` is false its text speaks of model workers and
    ``cases_per_gpu_day`` is None."""
    out = {**capacity.to_dict(), "gpu_recorded": gpu}
    if not gpu:
        out["text"] = _cpu_capacity_text(out)
        out["cases_per_gpu_day"] = None  # no GPU ran: no per-GPU figure, as the text says
    return out
