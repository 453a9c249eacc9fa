"""The DICOM results ctpipe writes per case, and how a user chooses them (configuration, command line).

``sr``: the Comprehensive 3D SR (TID 1500) of the findings, measurements and quality flags;
``seg``: the binary SEG of the organ and nodule masks. This module imports nothing heavy, so the
configuration schema (:mod:`pipeline.config`) and the command line read the names from here
without loading pydicom.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from ..errors import DicomOutputError

#: the DICOM results of a case, in the order they are written
OUTPUTS: tuple[str, ...] = ("sr", "seg")


def parse_outputs(value: str | Iterable[str] | None, *, where: str = "outputs") -> tuple[str, ...]:
    """The outputs named by ``value``: ``"sr,seg"``, ``"sr"``, ``"none"`` (or empty, or None: no output), or a list.

    Returns them in :data:`OUTPUTS` order; raises :class:`~pipeline.errors.DicomOutputError` naming an unknown one.
    """
    if value is None:
        return ()
    items = [v.strip().lower() for v in (value.split(",") if isinstance(value, str) else value)]
    items = [v for v in items if v and v != "none"]
    unknown = [v for v in items if v not in OUTPUTS]
    if unknown:
        raise DicomOutputError(
            f"unknown DICOM output(s) {unknown} in {value!r}",
            where=where,
            fix=f"choose from {', '.join(OUTPUTS)}, a comma-separated list of them, or none",
        )
    return tuple(o for o in OUTPUTS if o in items)


def _outputs_arg(text: str) -> tuple[str, ...]:
    try:
        return parse_outputs(text, where="--dicom")
    except DicomOutputError as exc:  # argparse names the option itself: "argument --dicom: unknown ..."
        raise argparse.ArgumentTypeError(f"{exc.problem}. Fix: {exc.fix}") from exc


def add_dicom_options(parser: argparse.ArgumentParser, *, default: str | None) -> None:
    """Add ``--dicom none|sr|seg|sr,seg`` and ``--no-dicom`` (= ``--dicom none``) to a command.

    ``args.dicom`` is then a tuple of outputs: ``default``'s when neither is given, or None when ``default`` is None
    (the configuration's ``outputs.dicom`` decides).
    """
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--dicom",
        type=_outputs_arg,
        default=None if default is None else parse_outputs(default),
        metavar="none|sr|seg|sr,seg",
        help="DICOM results to write: a structured report (TID 1500 SR), a segmentation (SEG), both or none "
        f"(default {default or 'outputs.dicom of the configuration'})",
    )
    group.add_argument("--no-dicom", dest="dicom", action=_NoDicom, help="write no DICOM results")


class _NoDicom(argparse.Action):
    """``--no-dicom``: ``args.dicom`` = () (no DICOM results), as ``--dicom none``; ``args.dicom_flag`` names the flag
    typed, the source a run's configuration records for ``outputs.dicom``."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option_string: str | None = None
    ) -> None:
        setattr(namespace, self.dest, ())
        namespace.dicom_flag = option_string
