"""The test command's scheduler: one worker kept for the modules that mostly wait, the others for the rest."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests._support.scheduling import LONG_MODULES, WAITING_MODULES, WaitAwareScheduling

BUSY = ("tests/test_a.py", "tests/test_b.py", "tests/test_c.py")
LONGEST, SECOND = sorted(LONG_MODULES, key=lambda m: -LONG_MODULES[m])[:2]


class _Worker:
    """Stands in for xdist's WorkerController: records the test indices it is sent and whether it was stopped."""

    def __init__(self, n: int):
        self.gateway = SimpleNamespace(id=f"gw{n}")
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices

    def shutdown(self) -> None:
        self.shutting_down = True


def _run(n_workers: int) -> tuple[list[str], dict[str, list[str]], dict[str, bool]]:
    # the long modules with fewer tests than the others: xdist alone would hand them out last
    collection = [f"{m}::test_{i}" for m in (*BUSY, *WAITING_MODULES[:2]) for i in range(3)]
    collection += [f"{m}::test_0" for m in (SECOND, LONGEST)]
    config = SimpleNamespace(getvalue=lambda name: [f"{n_workers}*popen"], option=SimpleNamespace(loadscopereorder=True))
    sched = WaitAwareScheduling(config)
    workers = [_Worker(n) for n in range(n_workers)]
    for w in workers:
        sched.add_node(w)
        sched.add_node_collection(w, collection)
    sched.schedule()
    done: dict[str, list[str]] = {w.gateway.id: [] for w in workers}
    stopped_early: dict[str, bool] = {}  # told to stop while other workers still had modules queued
    while sched.has_pending:  # complete the tests sent so far, the last worker first
        progressed = False
        for w in reversed(workers):
            # as an xdist worker does, keep the last test until more are sent or the worker is told to stop (it
            # needs the next test to know which fixtures to tear down)
            while len(w.sent) > 1 or (w.sent and w.shutting_down):
                i = w.sent.pop(0)
                done[w.gateway.id].append(collection[i])
                sched.mark_test_complete(w, i)
                progressed = True
                if w.shutting_down and sched.workqueue:
                    stopped_early[w.gateway.id] = True
        if not progressed:  # the end of the run: xdist tells every worker to stop
            assert not sched.workqueue, f"modules left unassigned while every worker waits: {list(sched.workqueue)}"
            for w in workers:
                w.shutdown()
    # each worker's modules in the order it ran them
    ran = {k: list(dict.fromkeys(t.split("::")[0] for t in v)) for k, v in done.items()}
    return collection, ran, {w.gateway.id: stopped_early.get(w.gateway.id, False) for w in workers}


def test_the_last_of_three_workers_runs_waiting_modules_only_and_the_others_take_them_last():
    collection, modules, stopped_early = _run(3)
    assert modules["gw2"] and set(modules["gw2"]) <= set(WAITING_MODULES)
    assert stopped_early["gw2"] and not stopped_early["gw0"] and not stopped_early["gw1"]
    assert modules["gw2"][0] == WAITING_MODULES[0]  # the longest first
    assert set(BUSY) <= set(modules["gw0"]) | set(modules["gw1"])
    assert (modules["gw0"][0], modules["gw1"][0]) == (LONGEST, SECOND)  # the long modules first, longest first
    for worker in ("gw0", "gw1"):
        kinds = [m in WAITING_MODULES for m in modules[worker]]
        assert kinds == sorted(kinds), f"{worker} took a waiting module before a busy one: {modules[worker]}"
    ran = [m for ms in modules.values() for m in ms]
    assert sorted(ran) == sorted({t.split("::")[0] for t in collection})  # each module whole, on one worker


@pytest.mark.parametrize("n_workers", [1, 2])
def test_with_fewer_than_three_workers_every_worker_takes_any_module(n_workers):
    collection, modules, _ = _run(n_workers)
    everything = sorted({t.split("::")[0] for t in collection})
    assert sorted({m for ms in modules.values() for m in ms}) == everything
    assert [ms[0] for ms in modules.values()] == [LONGEST, SECOND][:n_workers]
    if n_workers == 2:
        assert all(modules.values())
