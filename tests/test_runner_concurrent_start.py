"""Two cron jobs that start ``ctpipe run`` on the same run folder at the same moment: the second is refused as a
second run (exit 1, naming the pid of the run that holds the folder), never told that the folder cannot be written."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipeline.cli import main
from pipeline.runner.resume import RunLock, remove_temp_files

_RUN_A: dict[str, Path] = {}  # the folder whose first run cleans up while the second starts (empty: no such run)


def _run_a_cleans_up_now(event: str, args: tuple) -> None:
    """Audit hook: just before the second run removes its write probe, the first run (holding the folder) removes
    the temporary files a killed run left there, as it does at its start: the moment the two runs meet."""
    if event == "os.remove" and "run_dir" in _RUN_A and ".write-probe-" in os.fspath(args[0]):
        remove_temp_files(_RUN_A.pop("run_dir"))  # once: its own removals pass through here too


sys.addaudithook(_run_a_cleans_up_now)


def test_a_second_run_started_at_the_same_moment_is_refused_as_such(tmp_path, capsys, own_signals):
    # was: "cannot write the run folder: ...: No such file or directory (ENOENT). Fix: make the folder writable"
    # and exit 4: the first run's clean-up removed the second's write probe before the second removed it
    (tmp_path / "src").mkdir()
    run_dir = tmp_path / "runs" / "2027-01-15"
    lock = RunLock(run_dir)  # the first run holds the folder
    _RUN_A["run_dir"] = run_dir
    try:
        rc = main(["run", str(tmp_path / "src"), "--out", str(run_dir), "--workers", "0", "--quiet"])
    finally:
        _RUN_A.clear()
        lock.release()
    err = capsys.readouterr().err
    assert rc == 1 and f"another ctpipe run (pid {os.getpid()}) is using this folder" in err, err
    assert "cannot write" not in err


def test_the_refusal_names_the_pid_the_holder_writes_a_moment_after_it_locks(tmp_path):
    # was: "another ctpipe run is using this folder", no pid, when the second run looked between the first's lock and
    # its writing its pid into the lock file (two cron jobs starting at once)
    import fcntl
    import threading

    import pytest

    from pipeline.errors import RunStoreError

    tmp_path.mkdir(exist_ok=True)
    with open(tmp_path / ".lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # locked, pid not written yet

        def write_pid() -> None:
            held.write("4242")
            held.flush()

        late = threading.Timer(0.2, write_pid)
        late.start()
        try:
            with pytest.raises(RunStoreError) as err:
                RunLock(tmp_path)
        finally:
            late.join()
    assert "another ctpipe run (pid 4242) is using this folder" in str(err.value)
