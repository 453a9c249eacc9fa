"""Argument types for the ``ctpipe`` sub-commands: numbers in their range, refused by argparse with the range."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def number_in(kind: type[int] | type[float], lo: float | None = None, hi: float | None = None) -> Callable[[str], float]:
    """An argparse ``type`` reading ``kind`` (int or float) within ``lo..hi`` (either end open when ``None``)."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value):  # float('nan') and float('inf') parse, and NaN passes every comparison
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            span = f"{lo}..{hi}" if lo is not None and hi is not None else (f">= {lo}" if lo is not None else f"<= {hi}")
            raise argparse.ArgumentTypeError(f"{text} is out of range ({span})")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse
