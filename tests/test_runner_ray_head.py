"""The batch runner on Ray (runner.engine = ray) when the head goes away or a node runs another ctpipe, on clusters on
this machine (tests/_support/ray_cluster.py): a test that takes a head down (kills it, or starts its GCS again) or
adds a node of its own starts its own cluster; the module's shared cluster (a head and one GPU node) serves the runs
that leave it as it was: the link to the driver cut and restored, the rerun after a head was lost.
tests/test_runner_ray.py holds the other tests on one cluster, so that pytest-xdist can run the two modules side by
side.
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

from tests._support.ray_cases import a_case_running, needs_ray, shared_cases
from tests._support.runner import as_cli, db_rows

ROOT = Path(__file__).resolve().parents[1]

#: Ray's own limit on the wait for a lost head, as a user sets it (RAY_gcs_rpc_server_reconnect_timeout_s), in seconds:
#: the outages and the run's wait below last longer, so that Ray would have ended the driver had the run not raised it
RAY_OWN_LIMIT_S = 2
#: runner.ray_reconnect_s of the run whose head is lost, in seconds (longer than Ray's own limit)
RECONNECT_S = 6
#: How long the driver's link to the head is cut, in seconds: longer than Ray's own limit, and over before the driver's
#: fourth try to reach the head (its tries come 1 s, 3 s and 7 s after its first), at which the run goes on
OUTAGE_S = 6.0


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """Two tiny phantom cases and a small detector (random weights): the options of a quick, deterministic run."""
    needs_ray()
    return shared_cases(tmp_path_factory)


@pytest.fixture(scope="module")
def cluster():
    """A head node (one CPU: the CPU actor) and a node declaring one GPU and no CPU (the model actor), for the tests
    that leave it as they found it."""
    needs_ray()
    from tests._support.ray_cluster import LocalCluster

    c = LocalCluster(head_cpus=1, nodes=[{"num_cpus": 0, "num_gpus": 1}])
    c.start()
    yield c
    c.stop()


@pytest.mark.slow
def test_a_head_lost_mid_run_names_the_address_and_a_rerun_on_a_new_head_finishes(cluster, cases, tmp_path):
    """The head (its GCS) dies with a case running and does not come back: the driver waits runner.ray_reconnect_s
    (here RECONNECT_S, longer than the RAY_OWN_LIMIT_S after which Ray, told so by RAY_gcs_rpc_server_reconnect_timeout_s
    as by a user, would end the process itself), then stops naming the cluster's address and the fix, with nothing published
    half-done; the same command on another cluster (the module's, its head another GCS than the lost one's) finishes
    every case once."""
    import os

    from tests._support.ray_cluster import LocalCluster, ray_environment

    out = tmp_path / "headless"
    sets = [*as_cli(cases["opts"]), "--set", f"runner.ray_reconnect_s={RECONNECT_S}"]
    env = {**os.environ, **ray_environment(), "RAY_gcs_rpc_server_reconnect_timeout_s": str(RAY_OWN_LIMIT_S)}

    def args(address: str) -> list[str]:
        return [sys.executable, "-m", "pipeline", "run", str(cases["src"]), "--out", str(out), "--ray", address, *sets]

    first = LocalCluster(head_cpus=1, nodes=[{"num_cpus": 0, "num_gpus": 1}]).start()
    try:
        address = first.address
        proc = subprocess.Popen(args(address), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        deadline = time.monotonic() + 120
        while not a_case_running(out):
            assert proc.poll() is None, "the run ended before the head could be lost: " + proc.stderr.read()
            assert time.monotonic() < deadline, "no case started in time"
            time.sleep(0.05)
        first.kill_head()  # the head machine fails
        t0 = time.monotonic()
        try:
            _, err = proc.communicate(timeout=200)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"the driver hung after the head died: {err[-2000:]}")
        took = time.monotonic() - t0
    finally:
        first.stop()
    assert proc.returncode == 1, err
    assert "Traceback" not in err and f"within {RAY_OWN_LIMIT_S} seconds" not in err, err  # the run's stop, not Ray's
    # the stop itself names the head's address and the fix (the retry warnings before it name the address too)
    stop = [
        line for line in err.splitlines() if f"runner.ray_reconnect_s = {RECONNECT_S} s" in line and "stopped answering" in line
    ]
    assert len(stop) == 1 and f"the Ray head at {address} " in stop[0] and "Fix: start the head again" in stop[0], err
    assert RECONNECT_S <= took < 45, f"took {took:.0f} s"
    assert db_rows(out, "SELECT COUNT(*) FROM stage_attempts WHERE status='running'") == [(0,)]
    done = {r[0] for r in db_rows(out, "SELECT series_uid FROM cases WHERE status='done'")}
    published = list((out / "cases").iterdir()) if (out / "cases").is_dir() else []
    assert len(published) == len(done) < 2, err  # nothing published half-done; the head was lost with a case to go

    assert cluster.address != address
    p = subprocess.run(args(cluster.address), capture_output=True, text=True, env=env, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(r[0] for r in db_rows(out, "SELECT series_uid FROM cases WHERE status='done'")) == sorted(cases["uids"])
    ok = db_rows(out, "SELECT case_key, stage, COUNT(*) FROM stage_attempts WHERE status='ok' GROUP BY case_key, stage")
    assert ok and all(r[2] == 1 for r in ok)
    assert len(list((out / "cases").iterdir())) == 2


@pytest.mark.slow
def test_a_node_with_another_ctpipe_stops_the_run_naming_the_node_both_versions_and_the_fix(cases, tmp_path):
    """A real node whose Python finds another ctpipe first (a copy of the package with another version, first on that
    node's PYTHONPATH, as after a `pip install` of another release on that machine): `ctpipe run` on the cluster stops
    with exit status 1 and one line naming that node, both versions and the fix, before any case is published."""
    import os
    import shutil

    from tests._support.ray_cluster import LocalCluster, ray_environment

    other = tmp_path / "other_release"
    shutil.copytree(ROOT / "pipeline", other / "pipeline", ignore=shutil.ignore_patterns("__pycache__", "weights"))
    init = other / "pipeline" / "__init__.py"
    import pipeline

    mine = pipeline.__version__
    theirs = f"{mine}.dev7"
    init.write_text(init.read_text().replace(f'__version__ = "{mine}"', f'__version__ = "{theirs}"'))
    assert f'__version__ = "{theirs}"' in init.read_text()

    cluster = LocalCluster(head_cpus=1).start()  # the head: this checkout's ctpipe, the CPU actor
    try:
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([str(other), *(saved.split(os.pathsep) if saved else [])])
        try:  # the node's raylet and its worker processes inherit the environment it is started with
            odd = cluster.add_node(num_cpus=0, num_gpus=1)  # the model actor's only place
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH")
            else:
                os.environ["PYTHONPATH"] = saved
        cluster.cluster.wait_for_nodes()
        out = tmp_path / "run"
        env = {**os.environ, **ray_environment(), "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), saved]))}
        args = [sys.executable, "-m", "pipeline", "run", str(cases["src"]), "--out", str(out), "--ray", cluster.address]
        # started outside the checkout: Ray puts the driver's working folder first on every worker's sys.path
        p = subprocess.run(
            [*args, "--quiet", *as_cli(cases["opts"])], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240
        )
    finally:
        cluster.stop()
    assert p.returncode == 1, p.stdout + p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    msg = lines[0]
    assert odd.node_id[:8] in msg, msg  # the node
    assert f"ctpipe {theirs} there, {mine} here" in msg, msg  # both versions, which is where
    assert "Fix:" in msg or "install the same ctpipe" in msg, msg
    assert "Traceback" not in p.stderr + p.stdout
    assert not (out / "cases").is_dir() or not list((out / "cases").iterdir())  # nothing published
    assert db_rows(out, "SELECT status FROM runs") != [("completed",)]


class _LinkToHead:
    """The network between the driver and the head, on this machine: a TCP relay from a port of its own to the head's
    GCS port. :meth:`cut` drops every connection and refuses new ones (an outage: the head itself runs on),
    :meth:`restore` listens on the same port again."""

    def __init__(self, head: str):
        host, _, port = head.rpartition(":")
        self.head = (host, int(port))
        self.port = 0
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.restore()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def restore(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        self.port = s.getsockname()[1]
        s.listen(64)
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def cut(self) -> None:
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                near, _ = listener.accept()
            except OSError:  # cut
                return
            try:
                far = socket.create_connection(self.head)
            except OSError:
                near.close()
                continue
            with self._lock:
                self._conns += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for c in (src, dst):
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.mark.slow
def test_a_network_outage_to_the_head_longer_than_rays_own_limit_is_waited_out_and_every_case_finishes_once(
    cluster, cases, tmp_path
):
    """The driver's link to the head drops for OUTAGE_S with a case running (the head and its nodes run on), longer than
    the RAY_OWN_LIMIT_S after which Ray, told so by RAY_gcs_rpc_server_reconnect_timeout_s, would end the driver: the run logs each
    try to reach the head, goes on when the head answers again (runner.ray_reconnect_s, 600 s by default) and
    finishes with exit status 0, every case published once and one successful attempt per case and stage."""
    import os

    from tests._support.ray_cluster import ray_environment

    out = tmp_path / "outage"
    env = {**os.environ, **ray_environment(), "RAY_gcs_rpc_server_reconnect_timeout_s": str(RAY_OWN_LIMIT_S)}
    link = _LinkToHead(cluster.address)
    try:
        args = [sys.executable, "-m", "pipeline", "run", str(cases["src"]), "--out", str(out), "--ray", link.address]
        proc = subprocess.Popen(
            [*args, *as_cli(cases["opts"])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
        )
        deadline = time.monotonic() + 120
        while not a_case_running(out):
            assert proc.poll() is None, "the run ended before the link could be cut: " + proc.stderr.read()
            assert time.monotonic() < deadline, "no case started in time"
            time.sleep(0.05)
        link.cut()
        time.sleep(OUTAGE_S)  # the outage itself
        assert proc.poll() is None, "the run stopped during the outage: " + proc.stderr.read()
        link.restore()
        try:
            _, err = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"the run did not finish after the outage: {err[-2000:]}")
    finally:
        link.cut()
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert sorted(r[0] for r in db_rows(out, "SELECT series_uid FROM cases WHERE status='done'")) == sorted(cases["uids"])
    ok = db_rows(out, "SELECT case_key, stage, COUNT(*) FROM stage_attempts WHERE status='ok' GROUP BY case_key, stage")
    assert ok and all(r[2] == 1 for r in ok)
    assert len(list((out / "cases").iterdir())) == 2
    records = [json.loads(line) for line in (out / "run.log").read_text().splitlines()]
    lost = [r for r in records if r.get("event") == "head_lost"]
    assert len(lost) >= 2 and all(link.address in r["msg"] for r in lost), lost  # each try logged, naming the head
    assert any(r.get("event") == "head_back" for r in records)


@pytest.mark.slow
def test_a_head_started_again_mid_run_is_a_new_cluster_and_stops_the_run_with_the_fix(cases, tmp_path):
    """The head's GCS is killed (its PID) with a case running and started again on the same port within
    runner.ray_reconnect_s: it answers as a new cluster, which Ray's calls from this driver would end with a native
    error and stack trace. The run stops with exit status 1 and a line saying so, with the fix; nothing half-done is
    published."""
    import os

    from tests._support.ray_cluster import LocalCluster, ray_environment

    out = tmp_path / "restarted"
    env = {**os.environ, **ray_environment()}
    cluster = LocalCluster(head_cpus=1, nodes=[{"num_cpus": 0, "num_gpus": 1}]).start()
    try:
        address = cluster.address
        args = [sys.executable, "-m", "pipeline", "run", str(cases["src"]), "--out", str(out), "--ray", address]
        proc = subprocess.Popen(
            [*args, *as_cli(cases["opts"])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
        )
        deadline = time.monotonic() + 120
        while not a_case_running(out):
            assert proc.poll() is None, "the run ended before the head could be restarted: " + proc.stderr.read()
            assert time.monotonic() < deadline, "no case started in time"
            time.sleep(0.05)
        head = cluster.cluster.head_node
        gcs_pid = head.all_processes["gcs_server"][0].process.pid
        head.kill_gcs_server()  # SIGKILL of that PID
        assert not Path(f"/proc/{gcs_pid}").exists() or "Z" in Path(f"/proc/{gcs_pid}/stat").read_text().split()[2]
        deadline = time.monotonic() + 60
        while not _logged(out, "head_lost"):  # the driver found the head gone; it is started again within reconnect_s
            assert proc.poll() is None, "the run ended before the head was started again: " + proc.stderr.read()
            assert time.monotonic() < deadline, "the driver did not notice the head was gone"
            time.sleep(0.05)
        head.start_gcs_server()
        assert f"127.0.0.1:{head._ray_params.gcs_server_port}" == address  # the same port
        try:
            _, err = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"the driver hung after the head was started again: {err[-2000:]}")
    finally:
        cluster.stop()
    assert proc.returncode == 1, err
    assert "Check failed" not in err and "WrongClusterID" not in err and "Traceback" not in err, err
    assert address in err and "new cluster" in err and "Fix:" in err and "same command" in err, err
    assert db_rows(out, "SELECT COUNT(*) FROM stage_attempts WHERE status='running'") == [(0,)]
    done = {r[0] for r in db_rows(out, "SELECT series_uid FROM cases WHERE status='done'")}
    published = list((out / "cases").iterdir()) if (out / "cases").is_dir() else []
    assert len(published) == len(done) < 2, err


def _logged(run_dir: Path, event: str) -> bool:
    """Whether the run's log (``run_dir``/run.log, one JSON object a line) holds a record of ``event``."""
    try:
        text = (run_dir / "run.log").read_text()
    except FileNotFoundError:
        return False
    lines = text.split("\n")[:-1]  # whole lines only: the last may still be being written
    return any(json.loads(line).get("event") == event for line in lines if line.strip())
