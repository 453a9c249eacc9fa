"""``show``: draw an axial slice of a CT volume with findings and organ outlines (matplotlib)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import GeometryError
from .volume import CTVolume, Geometry, LabelMap, require_volume

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
    if isinstance(items, Mapping) or hasattr(items, "center_lps"):  # one finding
        items = [items]
    out = []
    for f in items:
        score = _field(f, "score")
        out.append(
            (
                np.asarray(_field(f, "center_lps"), float),
                float(_field(f, "diameter_mm")),
                np.nan if score is None else float(score),
            )
        )
    return out


def _same_series(volume: CTVolume, findings: Any) -> Any:
    """``findings`` limited to ``volume``'s series: the rows of a run's findings table with its series UID; a
    :class:`~pipeline.detection.Findings` of another series is refused (drawn on this anatomy it would mislead)."""
    uid = volume.series_uid
    if findings is None or not uid:
        return findings
    if hasattr(findings, "columns") and "series_uid" in findings.columns:
        mine = findings[findings["series_uid"] == uid]
        if len(findings) and not len(mine):
            raise GeometryError(
                f"none of the {len(findings)} findings is of series {uid} (they are of "
                f"{sorted(set(findings['series_uid']))[:3]})",
                fix="pass that volume's findings, e.g. run.findings[run.findings.series_uid == vol.series_uid]",
            )
        return mine
    other = getattr(findings, "series_uid", None)
    if other and other != uid:
        raise GeometryError(f"the findings are of series {other}, the volume is series {uid}", fix="pass that volume's findings")
    return findings


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

    volume = require_volume(volume)
    rows = _finding_rows(_same_series(volume, findings))
    masks = _masks(recon)
    wrong = sorted(organ for organ, m in masks.items() if m.shape != volume.shape)
    grid = getattr(recon, "geometry", None)
    if wrong or (isinstance(grid, Geometry) and not grid.same_grid(volume.geometry)):
        raise GeometryError(
            f"the reconstruction's masks {wrong or sorted(masks)} lie on another grid than the volume {volume.shape} [k, j, i]",
            fix="pass the reconstruction of this volume",
        )
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
    for organ, m in masks.items():
        if not m[slice].any():
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
        if np.isfinite(score):
            ax.text(i + r_vox + 2, j, f"{score:.2f}", color="#ff3030", fontsize=8)
    uid = volume.series_uid or ""
    ax.set_title(f"slice k={slice} ({len(rows)} finding(s)) {uid[-24:]}", fontsize=9)
    ax.set_axis_off()
    if masks:
        ax.legend(loc="lower right", fontsize=7)
    return ax
