"""A run on Ray with a bad GPU on a multi-GPU node, on a real local cluster (tests/_support/ray_cluster.py): model
actors that fail to start on one GPU retire that GPU for the run, which goes on with the node's other GPUs; a stage
that fails on every GPU of the node still stops the run with the error, the node and the fix.

The cluster has a head node (one CPU: the CPU actor) and one node declaring two GPUs and no CPU (two model actors;
Ray hands each its own GPU id, ``ray.get_gpu_ids()``, though torch sees no CUDA here).
"""

from __future__ import annotations

import json

import pytest

from tests._support.ray_cases import needs_ray, shared_cases
from tests._support.runner import db_rows

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    needs_ray()
    from tests._support.ray_cluster import LocalCluster

    c = LocalCluster(head_cpus=1, nodes=[{"num_cpus": 0, "num_gpus": 2}])
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return shared_cases(tmp_path_factory)


def test_a_gpu_on_which_every_start_fails_is_retired_and_the_run_finishes_on_the_nodes_other_gpu(cluster, cases, tmp_path):
    from pipeline.runner import run_batch
    from pipeline.runner.ray_pool import START_FAILURES
    from pipeline.runner.stages import IngestStage, WriteStage
    from tests._support.ray_cluster import FailingOnGpu

    markers = tmp_path / "markers"
    markers.mkdir()
    out = tmp_path / "run"
    stages = [IngestStage(), FailingOnGpu(str(markers), bad_gpu="1", failures=START_FAILURES), WriteStage()]
    opts = {**cases["opts"], "runner.ray_timeout_s": 600.0}
    s = run_batch([cases["src"]], out=out, stages=stages, engine="ray", ray_address=cluster.address, **opts)
    assert s.exit_code == 0 and s.done == 2 and not s.quarantined, s.lines()
    assert sorted(r[0] for r in db_rows(out, "SELECT series_uid FROM cases WHERE status='done'")) == sorted(cases["uids"])
    assert len(list(markers.glob("gpu1-*"))) == START_FAILURES  # retired: no actor of the run set up there again
    assert list(markers.glob("gpu0-*"))
    records = [json.loads(line) for line in (out / "run.log").read_text().splitlines()]
    retired = [r for r in records if r.get("event") == "gpu_retired"]
    assert len(retired) == 1 and retired[0]["level"] == "warning", retired  # said once
    msg = retired[0]["msg"]
    gpu_node = cluster.worker_node_ids()[0]
    assert "GPU 1" in msg and gpu_node[:8] in msg and "127.0.0.1" in msg, msg  # the GPU and the node
    assert "RuntimeError: CUDA error: an illegal memory access" in msg, msg  # the error
    assert "CUDA_VISIBLE_DEVICES" in msg and "ray start" in msg, msg  # the fix


def test_a_stage_failing_on_every_gpu_of_the_node_still_stops_the_run_with_the_error_the_node_and_the_fix(
    cluster, cases, tmp_path
):
    from pipeline.runner import run_batch
    from pipeline.runner.ray_pool import START_FAILURES
    from pipeline.runner.stages import IngestStage, WriteStage
    from tests._support.ray_cluster import FailingSetup

    markers = tmp_path / "markers"
    markers.mkdir()
    out = tmp_path / "run"
    stages = [IngestStage(), FailingSetup(str(markers)), WriteStage()]
    opts = {**cases["opts"], "runner.ray_timeout_s": 600.0}  # the failures, not the wait for a placed actor, end it
    s = run_batch([cases["src"]], out=out, stages=stages, engine="ray", ray_address=cluster.address, **opts)
    assert s.exit_code == 1 and s.done == 0, s.lines()
    msg = s.fatal or ""
    assert "FileNotFoundError" in msg and "/models/site_model.pt" in msg, msg
    assert cluster.worker_node_ids()[0][:8] in msg and "GPU 0" in msg and "GPU 1" in msg, msg
    assert "ray stop" in msg and "same command" in msg, msg
    # START_FAILURES tries on one GPU, the same failure on the other: then it stops, no endless restarts
    assert START_FAILURES < len(list(markers.iterdir())) <= 3 * START_FAILURES
    records = [json.loads(line) for line in (out / "run.log").read_text().splitlines()]
    assert not [r for r in records if r.get("event") == "gpu_retired"]  # not the GPU's fault: none is retired


def test_every_ray_process_started_by_the_tests_is_stopped(cluster):
    assert cluster.leftovers(), "the cluster's processes were not found (the check below would prove nothing)"
    cluster.stop()
    assert cluster.leftovers() == []
