"""The device names every ctpipe command and API function reads, with one meaning in each.

``auto`` (a GPU where torch sees one, else the CPU), ``cpu``, ``gpu`` or ``cuda`` (the same: CUDA; every GPU for the
model workers of ``ctpipe run`` and ``ctpipe listen``, the current GPU for a one-process command) and ``cuda:N`` (GPU
N), in any case. The batch runner also reads ``cuda:N,M...`` (one model worker on each GPU named). From Python a GPU
number N (``device=1``, as torch reads it) is ``cuda:N`` in every function that takes a device.

:func:`device_name` turns a name into the one torch and the runner read (``gpu`` → ``cuda``, lower case) and
:func:`allowed_devices` lists the names, as each error and ``--help`` gives them. Whether torch sees the GPU named is
checked where the device is used (:func:`resolve_device`, :func:`pipeline.runner.run_host.
resolve_devices`).
"""

from __future__ import annotations

import numbers

#: Names of a device, each its own meaning but ``gpu``, which is ``cuda``.
DEVICE_WORDS = ("auto", "cpu", "gpu", "cuda")


def allowed_devices(*, several: bool = False) -> str:
    """The device names a command reads, for its errors and ``--help``; ``several``: the batch runner's, which also
    reads a list of GPU numbers (``cuda:0,1``)."""
    gpus = "every GPU" if several else "the GPU torch uses"
    numbered = "cuda:N[,M...] (GPU numbers, e.g. cuda:0 or cuda:0,1)" if several else "cuda:N (GPU N, e.g. cuda:0)"
    return f"auto (a GPU where torch sees one, else the CPU), cpu, gpu or cuda (the same: {gpus}), or {numbered}"


def gpu_number_name(value: object) -> str | None:
    """``cuda:N`` for a GPU number N given from Python (a non-negative integer, not a bool), as torch reads it; ``None``
    for anything else (a name is read by :func:`device_name`)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0:
        return f"cuda:{int(value)}"
    return None


def device_name(text: str, *, several: bool = False) -> str | None:
    """``text`` as a device name torch and the runner read: stripped, lower case, ``gpu`` as ``cuda``; ``None`` when it
    names no device (``several``: ``cuda:`` may be followed by GPU numbers and commas, checked further by the
    runner's configuration)."""
    name = text.strip().lower()
    if name in DEVICE_WORDS:
        return "cuda" if name == "gpu" else name
    number = name[5:].replace(",", "") if several else name[5:]
    if name.startswith("cuda:") and number.isdigit() and number.isascii():
        return name
    return None


def resolve_device(device: str | int, *, where: str = "loader device") -> str:
    """The torch device of a device name (:mod:`pipeline.devices`: ``auto``, ``cpu``, ``gpu``, ``cuda``, ``cuda:N``, in
    any case) or a GPU number N: ``"auto"`` → ``"cuda"`` when torch sees a GPU, else ``"cpu"``; ``"gpu"`` is
    ``"cuda"``; N is ``"cuda:N"``, as torch reads it; ``where`` names the setting in errors."""
    import torch

    from .errors import LoaderError

    number = gpu_number_name(device) is not None
    dev = gpu_number_name(device) or device_name(str(device))
    if dev is None:
        raise LoaderError(f"unknown device {device!r}", where=where, fix=f"use one of: {allowed_devices()}")
    if dev == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        named = f"{device!r} ({dev})" if number else repr(device)
        raise LoaderError(
            f"device {named} was asked for but torch sees no CUDA GPU",
            where=where,
            fix="ask for cpu, or auto (the GPU where there is one, else the CPU)",
        )
    return dev
