"""Joining a run to a Ray cluster (``runner.engine = ray``): the address, the token, bounded waits.

Ray is imported here, and only when a run uses it, so ctpipe works without Ray installed
(``pip install 'ctpipe[cluster]'`` adds it). ``runner.ray_address`` is

* ``auto``: the cluster this machine joined with ``ray start`` (or ``RAY_ADDRESS``),
* ``HOST:PORT``: the head's GCS address that ``ray start --head`` printed,
* ``local`` or null: a private Ray instance on this machine, started for the run and stopped after it.

Before Ray is asked to connect, the head's port is probed with a plain TCP connection and an HTTP/2
preface (the GCS answers it as a gRPC server), so a wrong address, a head that is down or a port
where something else listens is one :class:`~pipeline.errors.ClusterError` within seconds (Ray
itself retries such a connection for minutes). Ray's token authentication (``RAY_AUTH_MODE=token``;
the token in ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``) is passed through
from the environment; a refused token is a ClusterError naming those variables. A private instance without a token
anywhere (RAY_AUTH_MODE unset or ``token``) gets one of its own, in this process's environment for the instance's
lifetime (:func:`_own_token`): Ray would otherwise write a new ``~/.ray/auth_token``, after which every later Ray
instance on the machine, a cluster's head started with ``ray start`` included, turns token authentication on and
refuses the nodes and drivers that have no token. The cluster's error messages that Ray
pushes to the driver (a node marked dead, with its raylet's last log lines) go to the run's log, not to its stdout.
Joining a cluster, the driver's Ray is told to wait for a head it lost longer than ``runner.ray_reconnect_s`` (Ray ends
such a process after a minute by default), so that the run's own wait (:class:`.ray_executor.HeadWatch`) decides.
Ray puts the driver's working folder first on the import path of every worker of the run, on every node; the run
leaves it out (:class:`_WithoutWorkingFolder`), a private instance's as a joined cluster's, so that the workers import
their installed ctpipe, not a ``pipeline`` package of the folder the run was started in. The process's working folder
itself is never changed (``os.chdir`` would move it under every other thread of the process, a notebook's included).
The run's own handling of the stop signals stays while ``ray.init`` starts a private instance, whose driver would put
its own SIGTERM handler in place (:mod:`.ray_start_signals`).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import ClusterError
from .ray_start_signals import stops_held_while_starting

log = logging.getLogger(__name__)

#: Environment of every Ray worker of a run: the same hash seed as the local worker processes (reproducible outputs).
WORKER_ENV = {"PYTHONHASHSEED": "0"}
_SCALE_OUT = "see README 'Scale out'"


def import_ray(*, set_by: str = "runner.engine") -> ModuleType:
    """The ``ray`` module, or a ClusterError saying how to install it, named after ``set_by``: where
    ``runner.engine = ray`` was set (``--ray``, ``--set runner.engine=ray``, a config file, ``environment variable
    CTPIPE_RUNNER_ENGINE``: :meth:`~pipeline.config.Config.source_of`)."""
    try:
        import ray
    except ImportError as exc:
        raise ClusterError(
            "runner.engine = ray needs Ray, which is not installed",
            where=set_by,
            fix="pip install 'ctpipe[cluster]' (or bash scripts/setup.sh), or use runner.engine = local",
        ) from exc
    return ray


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 hosts in brackets) → (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def resolve_address(address: str | None, *, set_by: str = "runner.ray_address") -> str | None:
    """The head's ``HOST:PORT`` for ``address`` (``auto`` looked up on this machine); None for a private instance.
    ``set_by``: where ``runner.ray_address`` was set (:meth:`~pipeline.config.Config.source_of`), named by its errors."""
    if address in (None, "local"):
        return None
    if address != "auto":
        return address
    ray = import_ray()
    try:
        found = ray._private.services.canonicalize_bootstrap_address("auto")
    except (ConnectionError, ValueError) as exc:
        raise ClusterError(
            f"runner.ray_address = auto but no Ray cluster was found on this machine ({exc})",
            where=set_by,
            fix=f"start one with `ray start --head` (or join one with `ray start --address=HEAD:6379`), "
            f"or give the head's address: ctpipe run --ray HEAD:6379 ({_SCALE_OUT})",
        ) from exc
    if found is None:
        raise ClusterError(
            "runner.ray_address = auto but no Ray cluster was found on this machine",
            where=set_by,
            fix=f"start one with `ray start --head`, or give the head's address: ctpipe run --ray HEAD:6379 ({_SCALE_OUT})",
        )
    return str(found)


def probe(address: str, *, timeout_s: float, set_by: str = "runner.ray_address") -> None:
    """Raise ClusterError unless a TCP connection to ``address`` (HOST:PORT) opens within ``timeout_s``; the error is
    named after ``set_by``, where the address was set (:meth:`~pipeline.config.Config.source_of`)."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise ClusterError(
            f"cannot reach the Ray head at {address} ({why})",
            where=set_by,
            fix=f"start the head there (`ray start --head --port={port}`) or pass the address it printed, "
            f"e.g. ctpipe run --ray HEAD:6379; `--ray auto` finds the cluster this machine joined ({_SCALE_OUT})",
        ) from exc


def raylet_answers(node: dict[str, Any], *, timeout_s: float) -> bool:
    """Whether the raylet of ``node`` (a ``ray.nodes()`` record) accepts a TCP connection within ``timeout_s``: its
    machine and its Ray are up, whatever became of one of its worker processes."""
    host, port = node.get("NodeManagerAddress"), node.get("NodeManagerPort")
    if not host or not port:
        return False
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


#: What an HTTP/2 client (gRPC, as Ray's GCS speaks it) sends first: the connection preface and an empty SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def check_speaks_grpc(address: str, *, timeout_s: float, set_by: str = "runner.ray_address") -> None:
    """Raise ClusterError unless ``address`` (HOST:PORT) answers an HTTP/2 preface with a SETTINGS frame, as the
    gRPC server of a Ray head's GCS does at once. Catches a port where something else listens (the dashboard's
    8265, a web server), which Ray itself would retry for ``runner.ray_timeout_s``. Skipped with ``RAY_USE_TLS``
    (a TLS handshake comes first there). The error is named after ``set_by``, where the address was set."""
    if os.environ.get("RAY_USE_TLS", "0").lower() not in ("0", "false", ""):
        return
    host, port = split_address(address)
    answer = b""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall(_H2_PREFACE)
            while len(answer) < 9:
                chunk = conn.recv(9 - len(answer))
                if not chunk:
                    break
                answer += chunk
    except OSError:
        pass  # a silent or closed port: told apart below by what did come
    if len(answer) >= 9 and answer[3] == 0x04:  # an HTTP/2 frame of type SETTINGS
        return
    text = answer.decode("ascii", "replace")
    if answer and text.isprintable() or text.startswith(("HTTP/", "<")):
        heard = f"it answered in text ({text.strip()!r}...), as an HTTP server does (Ray's dashboard, a web server)"
    elif answer:
        heard = f"something answered that is not gRPC ({answer[:9]!r})"
    else:
        heard = (
            f"nothing answered within {timeout_s:g} s after the connection opened (a Ray head answers at once: "
            "something else listens there, or the head hangs)"
        )
    raise ClusterError(
        f"{address} is not a Ray head's GCS port: {heard}",
        where=set_by,
        fix=f"pass the address `ray start --head` printed (port 6379 unless it was started with --port; the dashboard's "
        f"8265 is not it), e.g. ctpipe run --ray HEAD:6379; `--ray auto` finds the cluster this machine joined ({_SCALE_OUT})",
    )


class _WithoutSigtermNote(logging.Filter):
    """Drops Ray's note that a driver joining from a helper thread has no SIGTERM handler (ctpipe run sets its own)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


#: the name of the thread in which Ray's driver prints the cluster's error messages (ray._private.worker)
_ERROR_THREAD = "ray_listen_error_messages"


def _cluster_messages_to_log(ray: ModuleType) -> None:
    """Have the cluster's error messages that Ray pushes to this driver (a node marked dead, a raylet that ended, each
    with the last twenty lines of its log) logged here, the first line as a warning and the rest at debug level,
    instead of printed to stdout by Ray's own thread, which it does whatever ``log_to_driver`` says: the run's console
    (``--quiet`` for cron) stays its own. What Ray prints from other threads is left as it is."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    printer = getattr(worker, "print_to_stdstream", None)
    if worker is None or printer is None or getattr(printer, "ctpipe_logs", False):
        return

    def to_log(data: dict[str, Any], ignore_prefix: bool = False) -> None:
        if threading.current_thread().name != _ERROR_THREAD:
            printer(data, ignore_prefix=ignore_prefix)
            return
        for text in data.get("lines") or ():
            first, _, rest = str(text).strip().partition("\n")
            log.warning("Ray: %s", first.strip(), extra={"event": "ray_message"})
            if rest.strip():
                log.debug("Ray (continued): %s", rest, extra={"event": "ray_message"})

    to_log.ctpipe_logs = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_log


@dataclass
class RaySession:
    """This run's connection to Ray: what it joined and whether the run owns it (shut down at the end)."""

    address: str  # HOST:PORT of the head, or "local" for a private instance
    owned: bool
    #: the Ray authentication variables :func:`_own_token` set for a private instance, with their values before
    auth_env: dict[str, str | None] = field(default_factory=dict)

    def describe(self) -> str:
        """The cluster in words for the run record: address, nodes, CPUs, GPUs."""
        ray = import_ray()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        cpus = sum(n["Resources"].get("CPU", 0.0) for n in nodes)
        gpus = sum(n["Resources"].get("GPU", 0.0) for n in nodes)
        return f"ray {self.address}: {len(nodes)} node(s), {cpus:g} CPU(s), {gpus:g} GPU(s)"

    def close(self) -> None:
        if self.owned:
            ray = import_ray()
            ray.shutdown()
        _restore(self.auth_env)
        self.auth_env = {}


#: Ray's token authentication: the mode (``token``, ``disabled``), the token, the file holding it.
_AUTH_MODE, _AUTH_TOKEN, _AUTH_TOKEN_PATH = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"


def _own_token() -> dict[str, str | None]:
    """Give a private Ray instance a random token of its own through this process's environment (``RAY_AUTH_MODE=token``
    and ``RAY_AUTH_TOKEN``, which the instance's processes inherit when ``ray.init`` starts them), where Ray would
    otherwise generate one and save it as ``~/.ray/auth_token`` for good: with RAY_AUTH_MODE unset or
    ``token`` and no token in ``RAY_AUTH_TOKEN``, the file of ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``. The
    instance keeps token authentication. Returns the variables changed with their values before, for
    :func:`_restore`; empty where the environment already decides (a token the user has, or authentication
    ``disabled``), which is then left as it is."""
    mode = os.environ.get(_AUTH_MODE)
    if mode is not None and mode.lower() != "token":
        return {}
    path = os.environ.get(_AUTH_TOKEN_PATH)
    if os.environ.get(_AUTH_TOKEN) or (path and Path(path).expanduser().is_file()):
        return {}
    if (Path.home() / ".ray" / "auth_token").is_file():
        return {}
    before = {k: os.environ.get(k) for k in (_AUTH_MODE, _AUTH_TOKEN)}
    os.environ[_AUTH_MODE], os.environ[_AUTH_TOKEN] = "token", secrets.token_hex(32)
    _reload_authentication()
    log.debug("a private Ray instance with a token of its own, kept out of ~/.ray/auth_token")
    return before


def _restore(before: dict[str, str | None]) -> None:
    """Put back the Ray authentication variables :func:`_own_token` changed (``before``: their values then)."""
    if not before:
        return
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _reload_authentication()


def _reload_authentication() -> None:
    """Have this process's Ray read the authentication mode and token from the environment again (it keeps what it
    read first), so that it uses the token the private instance was started with, and after it the user's again."""
    try:
        import ray._raylet as raylet
    except ImportError:  # Ray stood in for (tests): nothing read, nothing to read again
        return
    config, loader = getattr(raylet, "Config", None), getattr(raylet, "AuthenticationTokenLoader", None)
    if config is None or loader is None:  # a Ray without token authentication
        return
    config.initialize("")
    loader.instance().reset_cache()


#: Ray's own limit (its configuration ``gcs_rpc_server_reconnect_timeout_s``, 60 s by default) on how long a process
#: waits for a GCS it lost before it ends itself with a native error.
_RAY_GCS_WAIT = "RAY_gcs_rpc_server_reconnect_timeout_s"
#: Seconds this driver's Ray waits for a lost head beyond ``runner.ray_reconnect_s``, so that the run's own stop comes first.
GCS_WAIT_MARGIN_S = 60
#: Ray's default for :data:`_RAY_GCS_WAIT`, in seconds.
RAY_GCS_WAIT_DEFAULT_S = 60


def _ray_gcs_wait_s(value: str | None) -> float:
    """Seconds that ``RAY_gcs_rpc_server_reconnect_timeout_s`` (``value``, None where unset) gives Ray's wait; 0 for a
    value Ray could not read either."""
    if value is None:
        return float(RAY_GCS_WAIT_DEFAULT_S)
    try:
        return float(value)
    except ValueError:
        return 0.0


class _WithoutWorkingFolder(list[str]):
    """The folders Ray puts first on every worker's import path (``JobConfig._py_driver_sys_path``), less this process's
    working folder, which ``ray.init`` adds to them last (as ``os.path.abspath(os.curdir)``, in the calling thread).

    A run started in a folder that holds another ``pipeline`` package (a checkout, an unpacked release) or a ``ray``
    folder would otherwise have the workers import that one, on every node and on a private instance alike. The folder
    of the driver's script, which Ray adds before it where it is on the driver's own import path, stays (the driver
    imports from it too)."""

    def extend(self, paths: Iterable[str]) -> None:
        given = list(paths)
        if given and given[-1] == os.path.abspath(os.curdir):
            given.pop()
        super().extend(given)


def _job_config(ray: ModuleType) -> Any:
    """The ``job_config`` for ``ray.init``: Ray's own, whose workers' import path leaves out this process's working
    folder (:class:`_WithoutWorkingFolder`); None where this Ray keeps that path otherwise (then Ray's default)."""
    make = getattr(getattr(ray, "job_config", None), "JobConfig", None)
    config = make() if make is not None else None
    paths = getattr(config, "_py_driver_sys_path", None)
    if config is None or not isinstance(paths, list):
        log.debug("this Ray has no list of the workers' import path to keep the working folder out of")
        return None
    config._py_driver_sys_path = _WithoutWorkingFolder(paths)
    return config


def connect(
    address: str | None,
    *,
    timeout_s: float,
    reconnect_s: float | None = None,
    init_options: dict[str, Any] | None = None,
    set_by: str = "runner.ray_address",
    engine_set_by: str = "runner.engine",
) -> RaySession:
    """Connect this process to the cluster of ``runner.ray_address`` (see the module docstring).

    A process already connected (``ray.init`` called by the caller) keeps its connection, which the
    run then neither changes nor shuts down. ``init_options`` go to ``ray.init`` (e.g. ``num_cpus``
    or ``object_store_memory`` of a private instance). Waits at most about ``timeout_s`` seconds.
    ``reconnect_s`` (``runner.ray_reconnect_s``): how long the run waits for a head that stops answering mid-run;
    this process's Ray is told to wait :data:`GCS_WAIT_MARGIN_S` longer for it (unless
    ``RAY_gcs_rpc_server_reconnect_timeout_s`` already gives it that long or longer), since it would otherwise end the
    process first (after a minute by default) with a native error.
    ``set_by`` and ``engine_set_by``: where ``runner.ray_address`` and ``runner.engine`` were set (``--ray``, a ``--set``
    item, a config file, ``environment variable CTPIPE_RUNNER_RAY_ADDRESS``: :meth:`~pipeline.config.Config.source_of`),
    named by the errors instead of the options' names, so that the user knows which to change.
    """
    ray = import_ray(set_by=engine_set_by)
    if ray.is_initialized():
        return RaySession(address="connected", owned=False)
    target = resolve_address(address, set_by=set_by)
    if target is not None:
        try:
            probe(target, timeout_s=min(timeout_s, 10.0), set_by=set_by)
        except ClusterError as exc:
            if address != "auto":
                raise
            # auto took the address from RAY_ADDRESS or from Ray's record of the last cluster started here, which
            # outlives a head that crashed or a machine that rebooted
            source = (
                "RAY_ADDRESS" if os.environ.get("RAY_ADDRESS") else "Ray's record of the last cluster started on this machine"
            )
            cause = exc.__cause__
            why = getattr(cause, "strerror", None) or type(cause).__name__
            raise ClusterError(
                f"runner.ray_address = auto found the head {target} through {source}, but nothing answers there ({why})",
                where=set_by,
                fix="start the cluster again (`ray start --head`), or give the head's address: ctpipe run --ray HEAD:6379; "
                f"if that cluster is gone, `ray stop` here clears the record (and unset RAY_ADDRESS) ({_SCALE_OUT})",
            ) from exc
        check_speaks_grpc(target, timeout_s=min(timeout_s, 5.0), set_by=set_by)
    options: dict[str, Any] = {
        "address": target or "local",
        "log_to_driver": False,  # the workers write RUN_DIR/run.log; the console stays the run's own
        "logging_level": logging.WARNING,
        "runtime_env": {"env_vars": dict(WORKER_ENV)},
        **(init_options or {}),
    }
    if "job_config" not in options and (job_config := _job_config(ray)) is not None:
        options["job_config"] = job_config
    _cluster_messages_to_log(ray)
    if target is None:
        options.setdefault("include_dashboard", False)
    if target is None or target.rsplit(":", 1)[0] in ("127.0.0.1", "localhost"):
        # a private instance, or a head on the loopback interface: this process's node is on it too
        options.setdefault("_node_ip_address", "127.0.0.1")
    # Ray's crash handler would print a native stack dump ("*** SIGTERM received ***") on every SIGTERM of the run
    # (systemd, kill, a closed terminal): a normal stop, answered with exit 130 and a line saying to rerun
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if constants is not None and "RAY_DISABLE_FAILURE_SIGNAL_HANDLER" not in os.environ:  # read when Ray was imported
        constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    outcome: dict[str, BaseException | None] = {}
    auth_env: dict[str, str | None] = {}  # what _own_token changed for a private instance

    def init() -> None:
        try:
            ray.init(**options)
            outcome["error"] = None
        except Exception as exc:  # noqa: BLE001 - reported below as one ClusterError with the address and the fix
            outcome["error"] = exc

    if target is None:  # a private instance: started here (its processes die with the thread that starts them)

        def stopped() -> None:  # by a stop signal as it started (:mod:`.ray_start_signals`)
            if outcome.get("error") is None:  # started, or cut short as it started (a second signal)
                log.info("stopped while the private Ray instance started: shutting it down")
                try:
                    ray.shutdown()
                except Exception as exc:  # noqa: BLE001 - what is left of a start cut short: ended with the process
                    log.debug("shutting down the private Ray instance: %s", exc)
            _restore(auth_env)

        auth_env = _own_token()
        with stops_held_while_starting(ray, stopped=stopped):
            init()
        if outcome["error"] is not None:
            _restore(auth_env)
    else:  # joining: bounded, since Ray retries a connection that opens but never answers for minutes
        quiet = _WithoutSigtermNote()
        ray_log = logging.getLogger("ray._private.worker")
        ray_log.addFilter(quiet)
        given_wait = os.environ.get(_RAY_GCS_WAIT)
        needed_wait = int(reconnect_s or 0) + GCS_WAIT_MARGIN_S
        own_wait = reconnect_s is not None and _ray_gcs_wait_s(given_wait) < needed_wait
        if own_wait:  # read by this process's Ray when it connects
            os.environ[_RAY_GCS_WAIT] = str(needed_wait)
        t = threading.Thread(target=init, name="ray-connect", daemon=True)
        t.start()
        t.join(timeout_s)
        if own_wait and "error" in outcome:  # read: a later ray.init in this process reads it afresh
            if given_wait is None:
                os.environ.pop(_RAY_GCS_WAIT, None)
            else:
                os.environ[_RAY_GCS_WAIT] = given_wait
        ray_log.removeFilter(quiet)
    where = target or "a private Ray instance on this machine"
    if "error" not in outcome:
        raise ClusterError(
            f"{where} accepted a connection but did not answer as a Ray cluster within {timeout_s:g} s",
            where=set_by,
            fix="check that the address is the head's GCS port (6379 unless `ray start --head --port` said otherwise) and that "
            f"RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN or ~/.ray/auth_token) are set here ({_SCALE_OUT})",
        )
    err = outcome["error"]
    if err is not None:
        # Ray's message on one line: a version mismatch lists the cluster's and this process's versions on later lines
        text = " ".join(str(err).split())[:400] or type(err).__name__
        token_fix = (
            "set RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token; "
            "`ray get-auth-token` on the head prints it)"
        )
        if "auth" in type(err).__name__.lower() or "token" in text.lower():
            fix = f"{token_fix} ({_SCALE_OUT})"
        elif "version mismatch" in text.lower():
            fix = (
                f"install the cluster's Ray and Python versions on this machine (or run ctpipe on a cluster node) ({_SCALE_OUT})"
            )
        elif os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
            # a head that wants a token refuses a driver without one with nothing but "Failed to connect";
            # `ray start` turns token authentication on by itself where ~/.ray/auth_token exists
            fix = (
                f"if the cluster uses token authentication (`ray start` turns it on where ~/.ray/auth_token exists), "
                f"{token_fix}; otherwise check the address and that this machine runs the cluster's Ray and Python "
                f"versions ({_SCALE_OUT})"
            )
        else:
            fix = f"check the address, the token and that this machine runs the cluster's Ray and Python versions ({_SCALE_OUT})"
        raise ClusterError(f"cannot join {where}: {text}", where=set_by, fix=fix) from err
    log.info("joined %s", where, extra={"event": "ray_connected"})
    return RaySession(address=target or "local", owned=True, auth_env=auth_env)
