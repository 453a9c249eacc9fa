"""The host a run runs on, for the batch runner: which devices its model workers use (:func:`resolve_devices`,
answered without importing torch where the host has no GPU) and the software versions the run records."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

from ..errors import ConfigError
from ..versions import package_versions


def software_versions() -> dict[str, str]:
    dists = ("torch", "monai", "pydicom", "numpy", "SimpleITK", "nvidia-dali-cuda120", "pandas", "prometheus-client")
    return {"python": platform.python_version(), "platform": platform.platform(), **package_versions(dists)}


def no_gpu_here(dev: Path = Path("/dev")) -> bool:
    """Whether this host certainly has no GPU a CUDA program could use: Linux with none of the NVIDIA driver's
    device nodes (``/dev/nvidia0``, ...) nor WSL's ``/dev/dxg`` under ``dev``. Answered without importing torch
    (about 2 s on a small CPU server, paid before any worker starts); elsewhere (other systems, a device node
    present) False, and torch decides."""
    if not sys.platform.startswith("linux"):
        return False
    return not (any(dev.glob("nvidia[0-9]*")) or (dev / "dxg").exists())


def resolve_devices(device: str, need_model: bool, *, set_by: str = "runner.device") -> tuple[list[str], str]:
    """Model worker devices and a description of the device for the run record; ``set_by``: where ``device`` was set
    (``--device``, a config file, ``environment variable CTPIPE_RUNNER_DEVICE``: the configuration's source of
    ``runner.device``), named by the error for a GPU this host lacks."""
    if not need_model or device == "cpu" or (device == "auto" and no_gpu_here()):
        return ["cpu"], "cpu"
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        device = "cuda" if n else "cpu"
    if device == "cpu":
        return ["cpu"], "cpu"
    if not n:
        raise ConfigError(f"runner.device = {device!r} but torch sees no CUDA GPU", where=set_by, fix="use --device cpu or auto")
    ids = list(range(n)) if device == "cuda" else [int(x) for x in device[5:].split(",")]
    bad = [i for i in ids if i >= n]
    if bad:
        raise ConfigError(
            f"runner.device = {device!r} names GPU(s) {bad} but only {n} exist",
            where=set_by,
            fix=f"use cuda:0..cuda:{n - 1}",
        )
    devs = [f"cuda:{i}" for i in ids]
    return devs, ", ".join(f"{d} ({torch.cuda.get_device_name(int(d[5:]))})" for d in devs)
