"""The disk fills up just as a case's image array is written to the run's cache: numpy reports it as "Not enough
free space to write N bytes after offset M" (its preallocation, an OSError without an error number). That is the
machine's problem, not the case's: the run stops admitting cases and exits 4 naming the folder and the fix, the case
is left unfinished (not quarantined), and the same command finishes it once there is room."""

from __future__ import annotations

import errno
from typing import Any

import numpy as np
import pytest

from pipeline.runner import run_batch
from pipeline.runner.faults import environment_failure
from pipeline.runner.stages import IngestStage, WriteStage
from tests._support.runner import PHANTOM, can_mount, db_rows, resize_tmpfs, small_tmpfs

#: a run folder's disk with room for the run store, not for a case's image array (numpy preallocates only an array
#: of 16 MiB or more, as every real scan's is: 512 x 512 x 141 int16 is 74 MB)
ROOM_KB = 2048
#: a phantom whose image array is 20 MiB
BIG = {**PHANTOM, "matrix": 512, "pixel_spacing": 0.5, "slices": 40, "slice_spacing": 3.0}


@pytest.fixture
def tmpfs(tmp_path):
    why = can_mount()
    if why:
        pytest.skip(f"a full disk at the array's write needs a small tmpfs: {why}")
    with small_tmpfs(tmp_path / "run", ROOM_KB) as folder:
        yield folder


def test_numpys_not_enough_free_space_is_a_full_disk(tmpfs):
    with open(tmpfs / "big.npy", "wb") as fh, pytest.raises(OSError) as caught:
        np.zeros(32 * 1024 * 1024, np.uint8).tofile(fh)
    assert caught.value.errno is None and "Not enough free space" in str(caught.value)
    env = environment_failure(caught.value, run_dir=tmpfs)
    assert env is not None and env.errno == errno.ENOSPC and env.folder == str(tmpfs)


def test_a_disk_full_at_the_cached_array_stops_the_run_and_leaves_the_case_for_the_same_command(tmpfs, tmp_path):
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    src = tmp_path / "src"
    write_dicom_series(generate_phantom(34, n_nodules=1, **BIG).volume, src / "a", seed=34)
    opts: dict[str, Any] = {"workers": 0, "report.enabled": False}

    s = run_batch([src], out=tmpfs, stages=[IngestStage(), WriteStage()], **opts)

    assert s.exit_code == 4 and s.quarantined == [], s.lines()
    assert s.stopped and "No space left on device (ENOSPC)" in s.stopped and str(tmpfs) in s.stopped, s.stopped
    assert any("run the same command again" in line for line in s.lines()), s.lines()
    ((status, reason),) = db_rows(tmpfs, "SELECT status, reason FROM cases")
    assert status == "pending" and "No space left on device (ENOSPC)" in reason, reason  # unfinished, with why
    assert not (tmpfs / "quarantine").exists() or not list((tmpfs / "quarantine").iterdir())
    resize_tmpfs(tmpfs, 256 * 1024)  # room again

    again = run_batch([src], out=tmpfs, stages=[IngestStage(), WriteStage()], **opts)

    assert again.exit_code == 0 and again.done == 1, again.lines()
