"""Versions of ctpipe and of the installed packages that shape its results (for run records and cluster checks)."""

from __future__ import annotations

from collections.abc import Iterable
from importlib import metadata

from . import __version__


def package_versions(dists: Iterable[str]) -> dict[str, str]:
    """``{"ctpipe": version, dist: version, ...}`` for each of ``dists`` installed here (absent ones left out)."""
    out = {"ctpipe": __version__}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out
