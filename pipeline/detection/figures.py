"""One PNG per finding: the axial slice through its centre and a lung-window MIP slab, box drawn.

Images are drawn in the series' own index grid (rows j, columns i of slice k),
as a viewer shows the original slice; the box is the finding's LPS box mapped
to those indices. The title names the slice as the scanner numbered it (its
InstanceNumber, or frame number, when the series metadata lists them; see
:func:`.findings.slice_ref`). Only reported findings get a PNG. Rendering uses
matplotlib's Agg backend (no display).
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np

from ..atomic import atomic_write_bytes
from ..volume import CTVolume
from .findings import Finding, Findings

log = logging.getLogger(__name__)

LUNG_WINDOW = (-1350.0, 150.0)  # level -600, width 1500 HU
SLAB_MM = 10.0


def _box_ij(volume: CTVolume, f: Finding) -> tuple[float, float, float, float]:
    lo, hi = np.asarray(f.box_min_lps), np.asarray(f.box_max_lps)
    corners = np.array([[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])])
    ijk = volume.lps_to_index(corners)
    return float(ijk[:, 0].min()), float(ijk[:, 0].max()), float(ijk[:, 1].min()), float(ijk[:, 1].max())


def finding_png(volume: CTVolume, f: Finding, *, rank: int = 1, slice_label: str = "slice") -> bytes:
    """PNG bytes: axial slice k (left, titled ``slice_label`` and the finding's ``slice_number``) and a ±5 mm
    MIP slab (right), lung window, box in red."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    i, j, k = f.voxel_ijk
    nk = volume.shape[0]
    half = max(0, int(round(SLAB_MM / 2 / volume.spacing[2])))
    k0, k1 = max(0, k - half), min(nk, k + half + 1)
    axial = np.asarray(volume.array[k], dtype=np.float32)
    mip = np.asarray(volume.array[k0:k1], dtype=np.float32).max(axis=0)
    i0, i1, j0, j1 = _box_ij(volume, f)
    fig = Figure(figsize=(9, 4.8), dpi=90)
    for n, (img, title) in enumerate(((axial, f"{slice_label} {f.slice_number} (k={k})"), (mip, f"MIP {k1 - k0} slices"))):
        ax = fig.add_subplot(1, 2, n + 1)
        ax.imshow(
            img,
            cmap="gray",
            vmin=LUNG_WINDOW[0],
            vmax=LUNG_WINDOW[1],
            interpolation="nearest",
            aspect=volume.spacing[1] / volume.spacing[0],
        )
        ax.add_patch(Rectangle((i0 - 0.5, j0 - 0.5), i1 - i0 + 1, j1 - j0 + 1, fill=False, edgecolor="red", linewidth=1.2))
        ax.set_title(title, fontsize=9)
        ax.set_axis_off()
    c = f.center_lps
    fig.suptitle(
        f"#{rank} score {f.score:.2f}, {f.diameter_mm:.1f} mm at LPS ({c[0]:.1f}, {c[1]:.1f}, {c[2]:.1f}) mm", fontsize=10
    )
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def write_finding_pngs(volume: CTVolume, findings: Findings, out_dir: str | Path, *, max_findings: int = 20) -> list[Path]:
    """Write ``finding_<rank>.png`` for the top ``max_findings`` reported findings into ``out_dir`` (atomic)."""
    out = Path(out_dir)
    paths = []
    label = "slice" if findings.slice_number_source == "index + 1" else findings.slice_number_source
    for rank, f in enumerate(findings.findings[:max_findings], 1):
        p = out / f"finding_{rank:03d}.png"
        atomic_write_bytes(p, finding_png(volume, f, rank=rank, slice_label=label))
        paths.append(p)
    return paths
