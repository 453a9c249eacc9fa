"""How the test command spreads test modules over pytest-xdist workers.

Most test modules keep a core busy. A few mostly wait, on a PACS and its quiet periods, with little
computing of their own; run on one of the core-bound workers, they would leave its core idle. The test command
therefore starts one worker more than there are cores, and :class:`WaitAwareScheduling` keeps that worker for
the waiting modules, so that they wait beside the core-bound ones instead of in their place.

Each module still runs whole on one worker (as with ``--dist loadscope``), so its module fixtures are built
once. The kept worker stops once the waiting modules are done (the others then have the cores to themselves);
the others take the modules of :data:`LONG_MODULES` first, longest first, then the rest in xdist's order (most
tests first), so that the run does not end with one worker on a long module while the other core idles; they
take a waiting module only when nothing else is left.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling

#: Modules that spend most of their time waiting (on Orthanc, a DICOM listener's quiet period, Prometheus)
#: with little CPU of their own, longest first.
WAITING_MODULES = (
    "tests/test_pacs_listener.py",
    "tests/test_pacs_fetch.py",
    "tests/test_runner_prometheus.py",
    "tests/test_pacs_sender.py",
    "tests/test_pacs_ae_titles.py",
    "tests/test_pacs_archive_lost.py",
)


#: The longest of the other modules, with their seconds on two cores beside the rest of the suite (measured with
#: per-test timings; only their order matters): started first, longest first.
LONG_MODULES = {
    "tests/test_runner_ray.py": 116,
    "tests/test_runner_ray_head.py": 101,
    "tests/test_runner_ray_startup.py": 60,
    "tests/test_runner_resume.py": 49,
    "tests/test_runner_disk_full.py": 38,
    "tests/test_reconstruction_body_bone.py": 37,
    "tests/test_real_chest_feet_first.py": 36,
    "tests/test_reconstruction_lungs_confounders.py": 30,
    "tests/test_detection_infer.py": 29,
    "tests/test_api.py": 29,
    "tests/test_runner_faults.py": 25,
    "tests/test_reconstruction_nodules.py": 21,
    "tests/test_dicom_out_integration.py": 18,
}


def _module(scope: str) -> str:
    return scope.split("::", 1)[0]


def is_waiting(scope: str) -> bool:
    """Whether a loadscope work unit (a module's node id prefix) is one of :data:`WAITING_MODULES`."""
    return _module(scope) in WAITING_MODULES


class WaitAwareScheduling(LoadScopeScheduling):
    """``--dist loadscope`` with one worker (the last, when there are three or more) kept for the waiting modules.

    The other workers take the :data:`LONG_MODULES` first, longest first, then the rest in xdist's order (most
    tests first). With fewer than three workers, every worker works that way, waiting modules included.
    """

    _keeper: Any = None
    _chosen = False

    def _waiting_node(self) -> Any:
        """The kept worker, chosen once (at the first assignment, when every worker has collected)."""
        if not self._chosen:
            self._chosen = True
            if len(self.nodes) >= 3:
                self._keeper = max(self.nodes, key=lambda n: int(n.gateway.id.removeprefix("gw")))
        return self._keeper

    def _assign_work_unit(self, node: Any) -> None:
        """Put the unit this worker should take at the front of the queue; xdist then hands it over."""
        keeper = self._waiting_node()
        scopes = list(self.workqueue)
        if node is keeper:
            # only waiting modules: once they are done the keeper stops, leaving the cores to the others
            mine = sorted((s for s in scopes if is_waiting(s)), key=lambda s: WAITING_MODULES.index(_module(s)))
            if not mine:
                node.shutdown()  # no more work for it; it still runs the tests it holds, then exits
                return
        else:
            mine = [s for s in scopes if keeper is None or not is_waiting(s)] or scopes
            # the longest known module first (stable: the others keep xdist's order)
            mine.sort(key=lambda s: -LONG_MODULES.get(_module(s), 0))
        self.workqueue.move_to_end(mine[0], last=False)
        super()._assign_work_unit(node)
