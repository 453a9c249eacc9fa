"""Choose a loader: DALI where it is installed, torch otherwise or on request, with a log line saying why."""

from __future__ import annotations

import logging
import os
from typing import Literal

from ..cache import CaseCache
from ..errors import LoaderError
from .base import BaseLoader, resolve_device
from .dali_loader import DaliLoader, dali_available
from .spec import PreprocessSpec
from .torch_loader import TorchLoader

log = logging.getLogger(__name__)

__all__ = ["make_loader", "LOADERS"]

LOADERS = ("auto", "dali", "torch")


def make_loader(
    cache: CaseCache | str | os.PathLike[str],
    spec: PreprocessSpec,
    *,
    loader: Literal["auto", "dali", "torch"] = "auto",
    device: str = "auto",
    batch_size: int = 1,
    num_threads: int | None = None,
) -> BaseLoader:
    """A loader for ``cache`` under ``spec``.

    ``loader="auto"`` takes DALI when ``nvidia.dali`` imports and the torch loader
    otherwise; ``"dali"`` fails with :class:`LoaderError` when DALI is missing;
    ``"torch"`` always takes the torch loader. ``device`` is ``"auto"`` (GPU when
    torch sees one), ``"cpu"`` or ``"gpu"``. One INFO log line states the choice and
    the reason.
    """
    choice = str(loader).lower()
    if choice not in LOADERS:
        raise LoaderError(f"unknown loader {loader!r}", where="loader", fix=f"use one of {', '.join(LOADERS)}")
    dev = resolve_device(device)
    where = "GPU" if dev != "cpu" else "CPU"
    if choice == "torch":
        log.info("loader: torch on %s (asked for with loader='torch')", where)
        return TorchLoader(cache, spec, device=dev, batch_size=batch_size, num_threads=num_threads)
    ok, why = dali_available()
    if choice == "dali" and not ok:
        raise LoaderError(
            f"loader='dali' was asked for but {why}",
            where="loader",
            fix="pip install nvidia-dali-cuda120 (Linux x86_64 only) or use loader='auto' / 'torch'",
        )
    if not ok:
        log.info("loader: torch on %s (DALI unavailable: %s)", where, why)
        return TorchLoader(cache, spec, device=dev, batch_size=batch_size, num_threads=num_threads)
    reason = "asked for with loader='dali'" if choice == "dali" else f"nvidia-dali {why} is installed"
    mode = "GPU mode, numpy reader with GPUDirect Storage where available" if dev != "cpu" else "CPU mode, device_id=None"
    log.info("loader: DALI on %s (%s; %s)", where, reason, mode)
    return DaliLoader(cache, spec, device=dev, batch_size=batch_size, num_threads=num_threads)
