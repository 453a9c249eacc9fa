"""Starting a run on Ray: actors that fail to start on a real local cluster (tests/_support/ray_cluster.py), where a
failure that repeats on a node stops the run with the error, the node and the fix and a one-off failure is retried;
and a private instance (``--ray local``) that leaves no token in the user's home folder.

The cluster has a head node (one CPU: the CPU actor) and one node declaring one GPU and no CPU (the model actor).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._support.ray_cases import needs_ray, shared_cases
from tests._support.runner import db_rows

ROOT = Path(__file__).resolve().parents[1]

#: Connects to a private instance as ``ctpipe run --ray local`` does, asks a task of it for its processes' authentication
#: mode, disconnects, and prints what it saw (JSON).
_PRIVATE_INSTANCE = """
import json, os, ray
from pipeline.runner.ray_connect import connect
session = connect("local", timeout_s=120, init_options={"num_cpus": 1, "object_store_memory": 80 * 2**20})
mode = ray.get(ray.remote(lambda: (os.environ.get("RAY_AUTH_MODE"), bool(os.environ.get("RAY_AUTH_TOKEN")))).remote())
session.close()
print(json.dumps({"worker": mode, "after": [os.environ.get("RAY_AUTH_MODE"), os.environ.get("RAY_AUTH_TOKEN")]}))
"""


@pytest.fixture(scope="module")
def cluster():
    needs_ray()
    from tests._support.ray_cluster import LocalCluster

    c = LocalCluster(head_cpus=1, nodes=[{"num_cpus": 0, "num_gpus": 1}])
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return shared_cases(tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["setup", "init"])
def test_a_stage_failing_to_start_on_every_try_on_a_node_stops_the_run_with_the_error_the_node_and_the_fix(
    cluster, cases, tmp_path, where
):
    """A model file missing on the GPU node: every model actor started there fails, in a stage's setup or in the
    actor's __init__. The run stops after a few tries with that error, not after runner.ray_timeout_s as if other jobs
    held the GPU its own actors held."""
    from pipeline.runner import run_batch
    from pipeline.runner.ray_pool import START_FAILURES
    from pipeline.runner.stages import IngestStage, WriteStage
    from tests._support.ray_cluster import FailingSetup

    markers = tmp_path / "markers"
    markers.mkdir()
    out = tmp_path / "run"
    stages = [IngestStage(), FailingSetup(str(markers), where=where), WriteStage()]
    opts = {**cases["opts"], "runner.ray_timeout_s": 600.0}  # the failures, not the wait for a placed actor, end it
    s = run_batch([cases["src"]], out=out, stages=stages, engine="ray", ray_address=cluster.address, **opts)
    assert s.exit_code == 1 and s.done == 0, s.lines()
    msg = s.fatal or ""
    assert "FileNotFoundError" in msg and "/models/site_model.pt" in msg, msg  # the error itself
    assert "could not be placed" not in msg and "free" not in msg, msg
    gpu_node = cluster.worker_node_ids()[0]
    assert gpu_node[:8] in msg and "127.0.0.1" in msg, msg  # the node
    assert "ray stop" in msg and "same command" in msg, msg  # the fix
    assert len(list(markers.iterdir())) == START_FAILURES  # tried again, then stopped: no endless restarts
    assert not (out / "cases").is_dir() or not list((out / "cases").iterdir())


@pytest.mark.slow
def test_a_one_off_stage_setup_failure_is_retried_and_the_run_finishes(cluster, cases, tmp_path):
    from pipeline.runner import run_batch
    from pipeline.runner.stages import IngestStage, WriteStage
    from tests._support.ray_cluster import FailingSetup

    markers = tmp_path / "markers"
    markers.mkdir()
    out = tmp_path / "run"
    stages = [IngestStage(), FailingSetup(str(markers), times=1), WriteStage()]
    s = run_batch([cases["src"]], out=out, stages=stages, engine="ray", ray_address=cluster.address, **cases["opts"])
    assert s.exit_code == 0 and s.done == 2 and not s.quarantined, s.lines()
    assert len(list(markers.iterdir())) == 2  # failed once, then set up
    assert sorted(r[0] for r in db_rows(out, "SELECT series_uid FROM cases WHERE status='done'")) == sorted(cases["uids"])
    records = [json.loads(line) for line in (out / "run.log").read_text().splitlines()]
    retried = [r["msg"] for r in records if r.get("event") == "worker_died" and "did not start" in r["msg"]]
    assert len(retried) == 1 and "/models/site_model.pt" in retried[0], retried


@pytest.mark.slow
def test_a_private_instance_writes_no_token_into_the_home_folder_and_keeps_token_authentication(tmp_path):
    """Ray's ``ray.init(address="local")`` with RAY_AUTH_MODE unset saves a new token as ~/.ray/auth_token, after which
    every later Ray on the machine (a head started with `ray start`) turns token authentication on: a run on a private
    instance leaves no such file, while the instance itself still uses a token, and the process's environment is as
    it was once the run is over."""
    needs_ray()
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(ROOT))
    p = subprocess.run(
        [sys.executable, "-c", _PRIVATE_INSTANCE], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240
    )
    assert p.returncode == 0, p.stdout + p.stderr
    seen = json.loads(p.stdout.strip().splitlines()[-1])
    assert not (home / ".ray" / "auth_token").exists()
    assert seen["worker"] == ["token", True]  # the instance's processes: token authentication, with a token
    assert seen["after"] == [None, None]  # the caller's environment as before the run
    assert "Token authentication is enabled" not in p.stderr, p.stderr


@pytest.mark.slow
def test_every_ray_process_started_by_the_tests_is_stopped(cluster):
    assert cluster.leftovers(), "the cluster's processes were not found (the check below would prove nothing)"
    cluster.stop()
    assert cluster.leftovers() == []
