"""The batch runner on Ray (runner.engine = ray): configuration, connection errors, and a real multi-node cluster
on this machine (tests/_support/ray_cluster.py) with faults: an actor crashing on one case, a node lost mid-run.

The cluster has a head node (one CPU: the CPU actor) and two nodes declaring one GPU each and no CPU (a model
actor each; torch sees no CUDA here, so they run the model on cpu). Cases are tiny phantoms and the detector a
small random network, so the cluster tests take about a minute on two cores, cluster start included.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.errors import ClusterError, ConfigError
from pipeline.runner.ray_actors import pick_device
from tests._support.ray_cases import a_case_running, findings, needs_ray, shared_cases
from tests._support.runner import as_cli, ctpipe, db_rows

ROOT = Path(__file__).resolve().parents[1]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- without a cluster --------------------------------------------------------------------------------------------------
def test_engine_and_address_are_validated_with_precedence(tmp_path):
    assert load_config(environ={}).runner.engine == "local"  # the local executor stays the default
    f = tmp_path / "c.yaml"
    f.write_text("runner:\n  engine: ray\n  ray_address: 10.0.0.5:6379\n")
    assert load_config(f, environ={}).runner.ray_address == "10.0.0.5:6379"
    env = {"CTPIPE_RUNNER_RAY_ADDRESS": "auto"}
    assert load_config(f, environ=env).runner.ray_address == "auto"
    cfg = load_config(f, environ=env, overrides={"engine": "local", "ray_address": "local"})
    assert (cfg.runner.engine, cfg.runner.ray_address) == ("local", "local")
    with pytest.raises(ConfigError, match=r"runner.engine = 'dask'.*one of local, ray"):
        load_config(environ={"CTPIPE_RUNNER_ENGINE": "dask"})
    for bad in ("10.0.0.5", "head:port", ":6379", "h:70000"):
        with pytest.raises(ConfigError, match=r"runner.ray_address.*HOST:PORT"):
            load_config(environ={}, overrides={"ray_address": bad})


def test_the_wait_for_a_head_that_stops_answering_is_a_validated_setting():
    assert load_config(environ={}).runner.ray_reconnect_s == 600.0
    assert load_config(environ={"CTPIPE_RUNNER_RAY_RECONNECT_S": "1800"}).runner.ray_reconnect_s == 1800.0
    for bad in ("0", "-5", "ten"):
        with pytest.raises(ConfigError, match=r"runner.ray_reconnect_s"):
            load_config(environ={"CTPIPE_RUNNER_RAY_RECONNECT_S": bad})


def test_model_device_follows_torch_not_the_gpu_id_ray_grants():
    assert pick_device(group="model", wanted="auto", gpu_ids=[0], cuda_available=True) == ("cuda:0", None)
    device, note = pick_device(group="model", wanted="auto", gpu_ids=[0], cuda_available=False)
    assert device == "cpu" and "torch sees no CUDA" in note
    assert pick_device(group="model", wanted="cpu", gpu_ids=[0], cuda_available=True) == ("cpu", None)
    assert pick_device(group="model", wanted="auto", gpu_ids=[], cuda_available=True) == ("cpu", None)
    assert pick_device(group="cpu", wanted="cuda", gpu_ids=[], cuda_available=True) == ("cpu", None)


def test_the_package_works_without_ray(monkeypatch):
    code = (
        "import sys; import pipeline.runner.batch, pipeline.runner.ray_executor, pipeline.runner.ray_connect; "
        "assert 'ray' not in sys.modules, 'ray imported eagerly'"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    from pipeline.runner.ray_connect import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ClusterError, match=r"ctpipe\[cluster\]"):
        import_ray()


def test_an_unreachable_head_is_one_clear_line_and_exit_1(tmp_path):
    needs_ray()
    port = _closed_port()
    src = ROOT / "data_samples" / "phantom_00001" / "dicom"
    t0 = time.monotonic()
    p = ctpipe("run", str(src), "--out", str(tmp_path / "r"), "--ray", f"127.0.0.1:{port}", "--quiet", timeout=120)
    took = time.monotonic() - t0
    assert p.returncode == 1, p.stdout + p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "ray start --head" in lines[0] and "Fix:" in lines[0]
    assert "Traceback" not in p.stderr + p.stdout
    assert took < 60
    assert db_rows(tmp_path / "r", "SELECT COUNT(*) FROM runs") == [(0,)]  # nothing was recorded as a run


def test_an_http_server_given_as_the_head_is_named_within_seconds(tmp_path):
    """A port that answers, but not as Ray's GCS (the dashboard's 8265, a web server): refused at once, not after
    runner.ray_timeout_s of Ray's retries."""
    needs_ray()
    from http.server import HTTPServer, SimpleHTTPRequestHandler

    server = HTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    src = ROOT / "data_samples" / "phantom_00001" / "dicom"
    try:
        t0 = time.monotonic()
        p = ctpipe("run", str(src), "--out", str(tmp_path / "r"), "--ray", address, "--quiet", timeout=120)
        took = time.monotonic() - t0
    finally:
        server.shutdown()
        server.server_close()
    assert p.returncode == 1, p.stdout + p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert address in lines[0] and "not a Ray head" in lines[0] and "HTTP server" in lines[0] and "Fix:" in lines[0]
    assert "6379" in lines[0]
    assert took < 45, f"took {took:.0f} s"  # Ray's own retries would last runner.ray_timeout_s = 60 s
    assert db_rows(tmp_path / "r", "SELECT COUNT(*) FROM runs") == [(0,)]


# -- on a cluster ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    needs_ray()
    from tests._support.ray_cluster import LocalCluster

    c = LocalCluster(head_cpus=1, nodes=[{"num_cpus": 0, "num_gpus": 1}, {"num_cpus": 0, "num_gpus": 1}])
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """Two tiny phantom cases and a small detector (random weights): the options of a quick, deterministic run."""
    return shared_cases(tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("told_late", [False, True], ids=["death-told-in-time", "death-told-late"])
def test_an_actor_crashing_on_one_case_is_quarantined_and_the_others_go_on(cluster, cases, tmp_path, monkeypatch, told_late):
    from pipeline.runner import run_batch
    from pipeline.runner.stages import IngestStage, WriteStage
    from tests._support.ray_cluster import CrashOn

    if told_late:
        # on a busy machine the GCS's account of the crashed process can reach the driver after Ray's wait for it (1 s):
        # the driver's Ray (read at each ray.init, the cluster's processes keep theirs) then waits for none at all, so
        # that the crash always reaches the run as an unavailable actor on a live node, as it did there by chance
        monkeypatch.setenv("RAY_timeout_ms_task_wait_for_death_info", "0")
    victim = cases["uids"][0]
    out = tmp_path / "crash"
    stages = [IngestStage(), CrashOn(victim), WriteStage()]
    s = run_batch([cases["src"]], out=out, stages=stages, engine="ray", ray_address=cluster.address, **cases["opts"])
    assert s.exit_code == 3 and s.done == 1, s.lines()
    assert len(s.quarantined) == 1 and s.quarantined[0][1] == "WorkerDiedError"
    assert "crashed" in s.quarantined[0][2] and "stage crash" in s.quarantined[0][2]
    rows = db_rows(out, "SELECT c.series_uid, a.status FROM stage_attempts a JOIN cases c USING (case_key) WHERE a.stage='crash'")
    assert sorted(st for uid, st in rows if uid == victim) == ["interrupted", "interrupted"]  # 1 + runner.retries tries
    assert [st for uid, st in rows if uid != victim] == ["ok"]
    events = [json.loads(ln).get("event") for ln in (out / "run.log").read_text().splitlines()]
    assert "node_lost" not in events and events.count("worker_died") == 2  # one model actor per try, none taken for a node


@pytest.mark.slow
def test_actors_slow_to_start_on_a_busy_machine_are_waited_for_not_taken_for_unplaceable(cluster, cases, tmp_path):
    # runner.ray_timeout_s bounds the wait for a node's CPU or GPU; once Ray gave them, an actor whose process is slow
    # to start (a busy machine) is placed, and the run waits for it as for a model loading in its setup
    from pipeline.runner import run_batch
    from pipeline.runner.stages import IngestStage, WriteStage
    from tests._support.ray_cluster import SlowStart

    opts = {**cases["opts"], "runner.ray_timeout_s": 10.0}
    stages = [IngestStage(), SlowStart(start_s=14.0), WriteStage()]  # longer than runner.ray_timeout_s
    s = run_batch([cases["src"]], out=tmp_path / "slow", stages=stages, engine="ray", ray_address=cluster.address, **opts)
    assert s.exit_code == 0 and s.done == 2 and not s.quarantined, s.lines()
    # actors that Ray cannot give a GPU (another job holds them all) still stop the run after runner.ray_timeout_s
    import ray

    ray.init(address=cluster.address, log_to_driver=False)
    try:
        holders = [ray.remote(num_gpus=1, num_cpus=0)(_Holder).remote() for _ in cluster.worker_node_ids()]
        ray.get([h.ready.remote() for h in holders], timeout=120)
        opts["runner.ray_timeout_s"] = 5.0
        s = run_batch([cases["src"]], out=tmp_path / "held", stages=stages, engine="ray", ray_address=cluster.address, **opts)
    finally:
        ray.shutdown()
    assert s.exit_code == 1 and s.done == 0, s.lines()
    assert "no Ray actor for the model stages could be placed within 5 s" in " ".join(s.lines()), s.lines()


class _Holder:
    """An actor of another job holding a GPU."""

    def ready(self) -> bool:
        return True


@pytest.fixture(scope="module")
def local_run(cases, tmp_path_factory):
    """The cases run by the local executor in this process (no Ray): the reference a run on the cluster must match,
    read only."""
    from pipeline.runner import run_batch

    out = tmp_path_factory.mktemp("ray_local") / "local"
    ref = run_batch([cases["src"]], out=out, workers=0, **cases["opts"])
    assert ref.exit_code == 0 and ref.done == 2, ref.lines()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("graceful", [False, True], ids=["kill-9", "ray-stop"])
def test_a_node_lost_mid_run_loses_no_case_and_changes_no_finding(cluster, cases, local_run, tmp_path, graceful):
    from pipeline.config import load_config
    from pipeline.runner import run_batch
    from pipeline.runner.stages import build_stages
    from tests._support.ray_cluster import HoldOnce

    while len(cluster.worker_node_ids()) < 2:  # a node for the one taken away, one to take over (after a former run)
        cluster.add_node(num_cpus=0, num_gpus=1)

    marker_dir = tmp_path / "markers"
    marker_dir.mkdir()
    stages = build_stages(load_config(environ={}, overrides=cases["opts"]))
    at = next(i for i, s in enumerate(stages) if s.name == "detect")
    stages.insert(at, HoldOnce(str(marker_dir)))
    removed: list[str] = []

    def take_the_node_away() -> None:
        marker = marker_dir / "held"
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if marker.exists():
            time.sleep(0.3)
            node = marker.read_text().split()[0]
            cluster.remove_node(node, graceful=graceful)  # kill -9 of its raylet, or `ray stop` on it
            removed.append(node)

    watcher = threading.Thread(target=take_the_node_away, daemon=True)
    watcher.start()
    out = tmp_path / "ray"
    s = run_batch([cases["src"]], out=out, stages=stages, engine="ray", ray_address=cluster.address, **cases["opts"])
    watcher.join(timeout=30)
    assert removed, "the hold stage never ran"
    assert s.exit_code == 0 and s.done == 2 and not s.quarantined, s.lines()
    # every case once: one published folder, one successful attempt per stage, no attempt of the lost run recorded
    assert sorted(p.name for p in (out / "cases").iterdir()) == sorted(p.name for p in (local_run / "cases").iterdir())
    att = db_rows(out, "SELECT case_key, stage, status, worker FROM stage_attempts")
    assert len(att) == 2 * len(stages) and {a[2] for a in att} == {"ok"}
    hold = [a for a in att if a[1] == "hold"]
    assert all(removed[0][:8] not in a[3] for a in hold)  # the held stage finished on the node that was left
    events = [json.loads(ln).get("event") for ln in (out / "run.log").read_text().splitlines()]
    assert "node_lost" in events
    assert findings(out) == findings(local_run)
    assert all(len(f) > 0 for f in findings(out).values())


@pytest.mark.slow
def test_a_driver_killed_with_sigkill_then_a_plain_rerun_finishes_every_case_once(cluster, cases, tmp_path):
    import os
    import signal

    from tests._support.ray_cluster import ray_environment

    out = tmp_path / "killed"
    sets = as_cli(cases["opts"])
    args = [
        sys.executable,
        "-m",
        "pipeline",
        "run",
        str(cases["src"]),
        "--out",
        str(out),
        "--ray",
        cluster.address,
        "--quiet",
        *sets,
    ]
    env = {**os.environ, **ray_environment()}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while not a_case_running(out):
        assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read().decode()
        assert time.monotonic() < deadline, "no case started in time"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # the driver, with a case admitted: its actors die with it
    proc.wait()
    assert db_rows(out, "SELECT status FROM runs") == [("running",)]
    assert db_rows(out, "SELECT COUNT(*) FROM cases WHERE status='done'")[0][0] < 2, (
        "the kill came too late to interrupt anything"
    )

    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert {r[0] for r in db_rows(out, "SELECT status FROM runs")} == {"interrupted", "completed"}
    assert sorted(r[0] for r in db_rows(out, "SELECT series_uid FROM cases WHERE status='done'")) == sorted(cases["uids"])
    ok = db_rows(out, "SELECT case_key, stage, COUNT(*) FROM stage_attempts WHERE status='ok' GROUP BY case_key, stage")
    assert ok and all(r[2] == 1 for r in ok)  # one successful attempt per case and stage
    assert db_rows(out, "SELECT COUNT(*) FROM stage_attempts WHERE status='running'") == [(0,)]
    assert len(list((out / "cases").iterdir())) == 2


@pytest.mark.slow
def test_sigterm_of_the_driver_stops_its_actors_and_asks_for_a_rerun(cluster, cases, tmp_path):
    import os
    import signal

    from tests._support.ray_cluster import ray_environment

    out = tmp_path / "stopped"
    args = [sys.executable, "-m", "pipeline", "run", str(cases["src"]), "--out", str(out), "--ray", cluster.address]
    env = {**os.environ, **ray_environment()}
    proc = subprocess.Popen([*args, "--quiet", *as_cli(cases["opts"])], stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not a_case_running(out):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    # this cluster's actors only (another Ray test's cluster may run beside it, e.g. under pytest -n 2): found here,
    # so that the check below proves something
    deadline = time.monotonic() + 60
    while not (ours := cluster.processes("ray::StageActor")):
        assert proc.poll() is None and time.monotonic() < deadline, "the run's actors were not found among the cluster's"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "run the same command again to resume" in err and "SIGTERM received" not in err, err  # no native stack dump
    assert db_rows(out, "SELECT status FROM runs") == [("interrupted",)]
    deadline = time.monotonic() + 60
    while cluster.processes("ray::StageActor") and time.monotonic() < deadline:
        time.sleep(0.5)
    left = cluster.processes("ray::StageActor")
    assert not left, f"the run's actors live on (of {len(ours)} found while it ran): {left}"


@pytest.mark.slow
def test_two_runs_given_shares_of_one_cluster_run_side_by_side(cluster, cases, tmp_path):
    """runner.ray_max_cpus / ray_max_gpus: with a node of one more CPU the cluster has 2 CPUs and 2 GPUs; two runs
    started together each take one of each and both finish (without the shares the first takes all of them)."""
    import os

    from tests._support.ray_cluster import ray_environment

    # a GPU node that an earlier test of this module took away comes back with the extra CPU, so that both runs find
    # their GPU at once rather than the second waiting for the first to end
    lost_gpus = 2 - len(cluster.worker_node_ids())
    extra = cluster.add_node(num_cpus=1, num_gpus=lost_gpus)
    try:
        env = {**os.environ, **ray_environment()}
        shares = ["--set", "runner.ray_max_cpus=1", "--set", "runner.ray_max_gpus=1"]
        procs = {
            name: subprocess.Popen(
                [sys.executable, "-m", "pipeline", "run", str(cases["src"]), "--out", str(tmp_path / name)]
                + ["--ray", cluster.address, "--quiet", *as_cli(cases["opts"]), *shares],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for name in ("nightly", "listener")
        }
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, f"{name}: {out}{err}"
            records = [json.loads(line) for line in (tmp_path / name / "run.log").read_text().splitlines()]
            started = [r["msg"] for r in records if r.get("event") == "worker_start"]
            assert sum("actor cpu-" in m for m in started) == 1, started
            start = next(r["msg"] for r in records if r.get("event") == "run_start")
            assert "this run's share: at most 1 CPU(s) and 1 GPU(s)" in start, start
            assert sum("actor model-" in m and "num_gpus" in m for m in started) == 1, started
            assert sorted(r[0] for r in db_rows(tmp_path / name, "SELECT series_uid FROM cases WHERE status='done'")) == sorted(
                cases["uids"]
            )
    finally:
        cluster.cluster.remove_node(extra, allow_graceful=True)


@pytest.mark.slow
def test_a_run_started_in_a_folder_holding_another_pipeline_package_runs_the_installed_one_on_the_nodes(cluster, cases, tmp_path):
    """Ray puts the driver's working folder first on every worker's import path: a `ctpipe run` started in a folder
    holding another `pipeline/` package (a checkout, an unpacked release) must not have the nodes import it."""
    import os

    from tests._support.ray_cluster import ray_environment

    here = tmp_path / "elsewhere"
    (here / "pipeline").mkdir(parents=True)
    (here / "pipeline" / "__init__.py").write_text('raise ImportError("the pipeline package of the working folder")\n')
    out = tmp_path / "run"
    env = {
        **os.environ,
        **ray_environment(),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    # -P: the driver itself does not look in its working folder, as the installed `ctpipe` command does not
    args = [sys.executable, "-P", "-m", "pipeline", "run", str(cases["src"]), "--out", str(out), "--ray", cluster.address]
    p = subprocess.run([*args, "--quiet", *as_cli(cases["opts"])], capture_output=True, text=True, env=env, cwd=here, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(r[0] for r in db_rows(out, "SELECT series_uid FROM cases WHERE status='done'")) == sorted(cases["uids"])


@pytest.mark.slow
def test_a_run_on_a_private_instance_started_in_a_folder_holding_another_pipeline_package_runs_the_installed_one(cases, tmp_path):
    """Ray puts the driver's working folder first on its workers' import path on a private instance (`--ray local`) too:
    a folder holding another `pipeline/` package there must not be what its workers import."""
    import os

    from tests._support.ray_cluster import ray_environment

    here = tmp_path / "elsewhere"
    (here / "pipeline").mkdir(parents=True)
    (here / "pipeline" / "__init__.py").write_text('raise ImportError("the pipeline package of the working folder")\n')
    out = tmp_path / "run"
    env = {**os.environ, **ray_environment()}  # its PYTHONPATH: the checkout, as the installed package would be
    # -P: the driver itself does not look in its working folder, as the installed `ctpipe` command does not
    args = [sys.executable, "-P", "-m", "pipeline", "run", str(cases["src"]), "--out", str(out), "--ray", "local"]
    p = subprocess.run([*args, "--quiet", *as_cli(cases["opts"])], capture_output=True, text=True, env=env, cwd=here, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(r[0] for r in db_rows(out, "SELECT series_uid FROM cases WHERE status='done'")) == sorted(cases["uids"])


@pytest.mark.slow
def test_a_stage_module_the_nodes_cannot_import_stops_the_run_naming_the_module_the_node_and_the_fix(
    cluster, cases, tmp_path, monkeypatch
):
    """A site's own model stage installed on this machine only: the nodes' workers cannot import its module, so no
    model actor can start. The run stops as soon as one fails, with that import error, the node and the fix, not
    after runner.ray_timeout_s as if the cluster had no GPU free."""
    from pipeline.runner import run_batch
    from pipeline.runner.stages import IngestStage, WriteStage

    site = tmp_path / "site_stages"
    site.mkdir()
    (site / "site_only_stage.py").write_text(
        "from pipeline.runner.stage import Stage\n\n\n"
        "class SiteOnly(Stage):\n"
        "    name = 'site_only'\n"
        "    group = 'model'\n\n"
        "    def process(self, ctx):\n"
        "        return {}\n"
    )
    monkeypatch.syspath_prepend(str(site))  # on this process's import path, not on the nodes'
    monkeypatch.delitem(sys.modules, "site_only_stage", raising=False)
    from site_only_stage import SiteOnly  # type: ignore[import-not-found]

    out = tmp_path / "run"
    stages = [IngestStage(), SiteOnly(), WriteStage()]
    s = run_batch([cases["src"]], out=out, stages=stages, engine="ray", ray_address=cluster.address, **cases["opts"])
    assert s.exit_code == 1 and s.done == 0, s.lines()
    msg = s.fatal or ""
    assert "No module named 'site_only_stage'" in msg, msg  # the import error itself
    assert "could not be placed" not in msg and "free" not in msg, msg
    assert any(node.node_id[:8] in msg for node in cluster.cluster.list_all_nodes()) and "127.0.0.1" in msg, msg  # the node
    assert "PYTHONPATH" in msg and "every node" in msg, msg  # the fix
    assert not (out / "cases").is_dir() or not list((out / "cases").iterdir())


@pytest.mark.slow
def test_every_ray_process_started_by_the_tests_is_stopped(cluster):
    assert cluster.leftovers(), "the cluster's processes were not found (the check below would prove nothing)"
    cluster.stop()
    assert cluster.leftovers() == []
