"""``show``: draw an axial slice of a CT volume with findings and organ outlines (matplotlib)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .volume import CTVolume, LabelMap

_COLORS = {"body": "#f5d142", "lung_left": "#3a9ad9", "lung_right": "#45c46b", "airway": "#e377c2", "bone": "#ffffff"}


def _field(finding: Any, key: str) -> Any:
    """``finding[key]`` of a dict (None when absent), else the attribute ``key`` of a Finding."""
    return finding.get(key) if isinstance(finding, Mapping) else getattr(finding, key)


def _finding_rows(findings: Any) -> list[tuple[np.ndarray, float, float]]:
    """(centre LPS mm, diameter mm, score) of findings given as Findings, Finding/dict list or a DataFrame."""
    if findings is None:
        return []
    if hasattr(findings, "columns"):  # a DataFrame from open_run(...).findings
        df = findings
        return [
            (np.array([r.center_x, r.center_y, r.center_z], float), float(r.diameter_mm), float(r.score)) for r in df.itertuples()
        ]
    items = getattr(findings, "findings", findings)
    return [
        (np.asarray(_field(f, "center_lps"), float), float(_field(f, "diameter_mm")), float(_field(f, "score"))) for f in items
    ]


def _masks(recon: Any) -> dict[str, np.ndarray]:
    if recon is None:
        return {}
    if isinstance(recon, LabelMap):
        return {name: recon.array == value for value, name in recon.labels.items()}
    masks = getattr(recon, "masks", recon)
    return {k: (v.array.astype(bool) if isinstance(v, LabelMap) else np.asarray(v, bool)) for k, v in masks.items()}


def show(
    volume: CTVolume,
    findings: Any = None,
    recon: Any = None,
    *,
    slice: int | None = None,
    ax: Any = None,
    window: tuple[float, float] = (-1350.0, 150.0),
) -> Any:
    """Draw axial slice ``slice`` (index k) of ``volume`` in a lung window, with findings and organ outlines.

    findings: :class:`~pipeline.detection.Findings`, a list of findings/dicts with ``center_lps`` (LPS mm) and
        ``diameter_mm``, or ``open_run(...).findings`` rows; each finding whose sphere crosses the slice is
        circled and labelled with its score.
    recon: a :class:`~pipeline.reconstruction.Reconstruction`, a :class:`LabelMap` or a dict of bool masks
        ``[k, j, i]`` on the volume's grid; outlines are drawn per organ.
    slice: the slice index k; default the slice of the highest-scoring finding, else the middle slice.
    window: HU range shown (default lung window, W 1500 / L -600).
    Returns the matplotlib Axes. Image columns are i (patient left at larger i for an LPS-aligned series).
    """
    import matplotlib.pyplot as plt

    rows = _finding_rows(findings)
    nk = volume.shape[0]
    if slice is None:
        if rows:
            best = max(rows, key=lambda r: r[2])
            slice = int(np.clip(np.round(volume.lps_to_index(best[0])[2]), 0, nk - 1))
        else:
            slice = nk // 2
    if not 0 <= slice < nk:
        raise IndexError(f"slice {slice} is outside the volume's {nk} slices (0..{nk - 1})")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 6))
    si, sj, sk = volume.spacing
    img = np.asarray(volume.array[slice], dtype=np.float32)
    ax.imshow(img, cmap="gray", vmin=window[0], vmax=window[1], aspect=sj / si, interpolation="nearest")
    for organ, m in _masks(recon).items():
        if m.shape != volume.shape or not m[slice].any():
            continue
        ax.contour(m[slice].astype(np.float32), levels=[0.5], colors=[_COLORS.get(organ, "#ff7f0e")], linewidths=1.0)
        ax.plot([], [], color=_COLORS.get(organ, "#ff7f0e"), label=organ)
    for centre, diam, score in rows:
        i, j, k = volume.lps_to_index(centre)
        r_mm = diam / 2.0
        dz = abs(k - slice) * sk
        if dz > r_mm:
            continue
        r_vox = np.sqrt(max(r_mm**2 - dz**2, 0.0)) / si
        ax.add_patch(plt.Circle((i, j), max(r_vox, 2.0), fill=False, color="#ff3030", linewidth=1.5))
        ax.text(i + r_vox + 2, j, f"{score:.2f}", color="#ff3030", fontsize=8)
    uid = volume.series_uid or ""
    ax.set_title(f"slice k={slice} ({len(rows)} finding(s)) {uid[-24:]}", fontsize=9)
    ax.set_axis_off()
    if _masks(recon):
        ax.legend(loc="lower right", fontsize=7)
    return ax
