"""Stage latency in a throughput report (:mod:`.report_summary`): percentiles (s) of the attempts that did a
stage's work, which attempts returned without it (:func:`skipped_attempts`), and per node."""

from __future__ import annotations

from typing import Any

import numpy as np

#: The percentiles a report gives of each latency and wait.
PCTS = (50, 90, 99)


def pct(values: Any) -> dict[str, float | None]:
    """``n``, ``mean`` and the :data:`PCTS` percentiles of ``values`` (s), not-a-number values left out; None for
    each figure when none is left."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return {"n": 0, "mean": None, **{f"p{p}": None for p in PCTS}}
    return {"n": int(len(v)), "mean": float(v.mean()), **{f"p{p}": float(np.percentile(v, p)) for p in PCTS}}


#: The stages a completed case can skip, and its column in ``cases`` saying why (None: the stage ran).
SKIPPABLE = {"detect": "detect_skipped"}


def skipped_attempts(stages: Any, cases: Any) -> Any:
    """Per stage attempt (row of ``stages``) whether it is a stage its case skipped (detection of a scan without
    lungs): the attempt is recorded ``ok`` with the fraction of a millisecond it took to return, which is
    no measure of the stage's latency. The attempt's own ``skip_reason`` says so, whatever became of its case; a
    store of a ctpipe before it says so only of completed cases (:data:`SKIPPABLE`)."""
    import pandas as pd

    out = stages.skip_reason.notna() if "skip_reason" in stages else pd.Series(False, index=stages.index)
    out = out.astype(bool)
    for stage, col in SKIPPABLE.items():
        if col not in cases:
            continue
        why = cases[cases.status == "done"].set_index(["run_dir", "case_key"])[col]
        keys = set(why[why.notna()].index)
        out |= (stages.stage == stage) & pd.Series(
            [(d, k) in keys for d, k in zip(stages.run_dir, stages.case_key)], index=stages.index, dtype=bool
        )
    return out


def node_latency(ok: Any, runs: Any, stage_order: list[str]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Stage wall times (s) per node: the node of a Ray actor (its worker is ``name@node``), else the host of the
    run (local workers). {node: {stage: percentiles}}."""
    if not len(ok):
        return {}
    host = {(d, r): h for d, r, h in zip(runs.run_dir, runs.run_id, runs.host)}
    workers = ok.worker.fillna("").astype(str)
    nodes = [w.partition("@")[2] or str(host.get((d, r)) or "unknown") for w, d, r in zip(workers, ok.run_dir, ok.run_id)]
    ok = ok.assign(node=nodes)
    return {
        node: {s: pct(grp[grp.stage == s].wall_s) for s in stage_order if (grp.stage == s).any()}
        for node, grp in ok.groupby("node", sort=True)
    }
