"""The run store under a file-size limit (``ulimit -f`` in a cron script, ``LimitFSIZE=`` in a systemd unit): when its
write-ahead log outgrows the limit, SQLite says only "disk I/O error"; the run names the limit, stops as for any
other failure of the run folder (exit 4) and says how to raise it, rather than ending with a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

_FILL_THE_STORE = textwrap.dedent(
    """
    import json, resource, sqlite3, sys
    from pathlib import Path
    from pipeline.runner.faults import environment_failure
    from pipeline.runner.store import RunStore

    run_dir = Path(sys.argv[1])
    store = RunStore(run_dir)
    store.start_run("r1", command="ctpipe run", sources=[], config={}, versions={}, device="cpu", host="h", pid=1)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, resource.RLIM_INFINITY))  # ulimit -f 256
    try:
        for n in range(100_000):  # a month of stage attempts, as a long run records them
            store.upsert_discovered(case_key=f"k{n}", case_id=f"c{n}", series_uid=f"u{n}", fingerprint="f" * 24,
                                    source="/src/" + "x" * 200)
        print(json.dumps(None))
    except sqlite3.Error as exc:
        env = environment_failure(exc, run_dir=run_dir)
        print(json.dumps([str(exc), None if env is None else [env.name, str(env.error())]]))
    """
)


def test_a_store_outgrowing_the_file_size_limit_is_named_as_the_limit(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", _FILL_THE_STORE, str(run_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    said, env = json.loads(done.stdout)
    assert "disk I/O error" in said  # all SQLite tells
    assert env is not None, said
    name, error = env
    assert name == "EFBIG" and error.startswith(f"{run_dir}: File too large (EFBIG)"), error
    assert "file-size limit of 262144 bytes" in error and "ulimit -f unlimited" in error
