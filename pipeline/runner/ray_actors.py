"""What runs inside a Ray actor of a run: one group's stages, set up once, then one task at a time.

A :class:`StageActor` is the Ray counterpart of a local worker process (:func:`.worker_process.worker_main`):
``place()`` says where Ray put it (node, device), ``setup()`` calls every stage's ``setup`` once
(the model is loaded once per actor), ``run(task)`` runs one stage of one case with
:func:`.task_run.run_task` and returns its :class:`~.stage.TaskResult`. The class is plain Python;
the executor wraps it with ``ray.remote`` (this module does not import Ray at import time).

The model actor's device: Ray hands an actor asking ``num_gpus=1`` a GPU id and sets
``CUDA_VISIBLE_DEVICES`` to it, so torch sees that GPU as ``cuda:0``. Where torch sees no CUDA device
(a node that only declares GPUs, as in tests), the model runs on ``cpu`` and the actor says so in the log.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import from_dict
from ..errors import FatalRunError
from .logs import log_as_worker
from .ray_marks import FINISHED, STARTED, write_mark
from .redact_active import redact_in_worker
from .stage import Stage, Task, TaskResult, WorkerInfo
from .task_run import run_task, setup_stages

log = logging.getLogger(__name__)


def pick_device(*, group: str, wanted: str, gpu_ids: Sequence[Any], cuda_available: bool) -> tuple[str, str | None]:
    """The torch device of an actor of ``group`` and, when it differs from what Ray granted, why (for the log).

    ``wanted`` is ``runner.device``; ``gpu_ids`` what ``ray.get_gpu_ids()`` returned in the actor.
    """
    if group != "model" or wanted == "cpu":
        return "cpu", None
    if gpu_ids and cuda_available:
        return "cuda:0", None  # CUDA_VISIBLE_DEVICES holds exactly the GPU Ray granted
    if gpu_ids:
        return "cpu", f"Ray granted GPU {list(gpu_ids)} but torch sees no CUDA device here: the model runs on cpu"
    return "cpu", None


def software() -> dict[str, str]:
    """The versions of ctpipe and of the packages that decide its findings in this process's environment."""
    from ..versions import package_versions

    return package_versions(("torch", "monai"))


class StageActor:
    """The stages of one group (``cpu`` or ``model``) in one Ray worker process (see the module docstring)."""

    def __init__(
        self, *, name: str, group: str, stages: list[Stage], config: dict, run_dir: str, device: str, torch_threads: int
    ):
        self.name = name
        self.group = group
        self.stages = stages
        self.config = config
        self.run_dir = run_dir
        self.wanted = device
        self.torch_threads = torch_threads
        self.info: WorkerInfo | None = None
        self.by_name = {s.name: s for s in stages}

    def place(self) -> dict[str, Any]:
        """Where this actor runs: node id and address, process id, the torch device it will use, the GPU id(s) Ray
        granted it on its node (``ray.get_gpu_ids()``, as strings; none for a CPU actor)."""
        import ray

        ctx = ray.get_runtime_context()
        gpu_ids = list(ray.get_gpu_ids()) if self.group == "model" else []
        cuda = False
        if gpu_ids:
            import torch

            cuda = torch.cuda.is_available()
        device, note = pick_device(group=self.group, wanted=self.wanted, gpu_ids=gpu_ids, cuda_available=cuda)
        node = ctx.get_node_id()
        self.info = WorkerInfo(f"{self.name}@{node[:8]}", device, from_dict(self.config), Path(self.run_dir))
        return {
            "node": node,
            "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "device": device,
            "gpus": [str(g) for g in gpu_ids],
            "note": note,
            "software": software(),
        }

    def setup(self, redacted: dict[str, str] | None = None) -> dict[str, Any]:
        """Set up the stages (load the model) once; ``fatal`` says why this actor cannot work, else None.
        ``redacted``: the run's patient-named path components and their tokens (:mod:`.redact`), kept out of the
        actor's run.log records."""
        assert self.info is not None, "place() first"
        run_dir = Path(self.run_dir)
        if not run_dir.is_dir():
            return {
                "fatal": f"the run folder {run_dir} is not there on node {self.info.name.split('@')[1]} "
                "(ray stages need the run folder on storage every node mounts at the same path; see README 'Scale out')"
            }
        log_as_worker(run_dir / "run.log", process=self.info.name)  # run.log; the driver talks to the user
        if redacted is not None:
            redact_in_worker(redacted)
        if self.torch_threads > 0:
            import torch

            torch.set_num_threads(self.torch_threads)
        for module in sorted({m for s in self.stages for m in s.preload}):  # imported once, not in the first case's time
            importlib.import_module(module)
        try:
            setup_stages(self.stages, self.info)
        except FatalRunError as exc:
            return {"fatal": str(exc)}
        return {"fatal": None}

    def run(self, task: Task) -> TaskResult:
        """Run one stage of one case (failures of the case come back in the result, never raised). The task is marked
        started and finished (:mod:`.ray_marks`): should this process die, the driver knows which task it ran."""
        assert self.info is not None, "place() first"
        run_dir = Path(self.run_dir)
        write_mark(run_dir, self.name, seq=task.seq, state=STARTED)
        res = run_task(self.by_name[task.stage], task, self.info)
        write_mark(run_dir, self.name, seq=task.seq, state=FINISHED)
        return res
