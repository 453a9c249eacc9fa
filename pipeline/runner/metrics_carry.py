"""Counters that go on from the previous run's textfile, so that they never go down across runs.

Each ``ctpipe run`` is a new process with a new registry: alone, its counters would start at 0 again. Prometheus
takes a drop for a restart, but a textfile rewritten by each nightly run (node_exporter's textfile collector) shows
only each run's final value: a second night that completes as many cases as the first shows no increase at all, and
a run that resumes with nothing left to do shows the counter falling to 0. :class:`CarriedCollector` exposes the
run's counters and histograms with the values of the previous textfile (``metrics.textfile_name`` in ``metrics.textfile_dir``,
else ``RUN_DIR/metrics.prom``) added, series that this run did not touch included; gauges are this run's own.
The ``*_created`` samples are left out: the carried series did not start with this process.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

log = logging.getLogger(__name__)

_CARRIED_TYPES = ("counter", "histogram")
_Key = tuple[str, tuple[tuple[str, str], ...]]


def _key(name: str, labels: dict[str, str]) -> _Key:
    return name, tuple(sorted(labels.items()))


def read_carried(paths: Iterable[Path], node: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """The counter and histogram samples (``{family: [(sample name, labels, value), ...]}``) of the node ``node`` in
    the first of ``paths`` that exists, without ``*_created`` (a folder resumed on another node starts its own); ``{}`` when none does. A file that cannot be read or parsed is logged (its
    path, the error, and that the counters start at 0 again) and skipped."""
    from prometheus_client.parser import text_string_to_metric_families

    for path in paths:
        if not path.is_file():
            continue
        try:
            families = list(text_string_to_metric_families(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            log.warning(
                "%s: cannot read the previous run's metrics (%s); the counters start at 0 again (Prometheus counts a "
                "restart). Fix: remove or repair the file",
                path,
                exc,
                extra={"event": "metrics_carry_failed"},
            )
            continue
        out: dict[str, list[tuple[str, dict[str, str], float]]] = {}
        for fam in families:
            if fam.type in _CARRIED_TYPES:
                out[fam.name] = [
                    (s.name, dict(s.labels), s.value)
                    for s in fam.samples
                    if not s.name.endswith("_created") and s.labels.get("node") == node
                ]
        return out
    return {}


class CarriedCollector(Collector):
    """The metrics of ``registry``, with ``carried`` (:func:`read_carried`) added to its counters and histograms."""

    def __init__(self, registry: CollectorRegistry, carried: dict[str, list[tuple[str, dict[str, str], float]]]):
        self.registry = registry
        self.carried = carried

    def collect(self) -> Iterator[Metric]:
        for fam in self.registry.collect():
            yield self._added(fam, self.carried.get(fam.name, ())) if fam.type in _CARRIED_TYPES else fam

    @staticmethod
    def _added(fam: Metric, earlier: Sequence[tuple[str, dict[str, str], float]]) -> Metric:
        base = {_key(n, lab): v for n, lab, v in earlier}
        out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        now = set()
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            key = _key(s.name, s.labels)
            now.add(key)
            out.add_sample(s.name, s.labels, s.value + base.get(key, 0.0))
        for n, lab, v in earlier:  # series of earlier runs this run did not touch (a failure reason not seen tonight)
            if _key(n, lab) not in now:
                out.add_sample(n, lab, v)
        return out


def carrying_registry(registry: CollectorRegistry, paths: Iterable[Path], node: str) -> CollectorRegistry:
    """A registry that exposes ``registry``'s metrics with the counters of node ``node`` in the first existing file
    of ``paths`` added (:class:`CarriedCollector`)."""
    out = CollectorRegistry()
    out.register(CarriedCollector(registry, read_carried(paths, node)))
    return out
