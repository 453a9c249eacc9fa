"""Quirks of real-world CT series for the phantom DICOM writer, and file naming.

The quirks (:data:`QUIRKS`) imitate what scanners and PACS exports do to a series:
a tilted gantry (:func:`tilt_stack`), an extra thick-slice reconstruction
(:func:`thick_stack`), a scout image (:func:`localizer_stack`) and shuffled file
names in nested folders (:class:`FileNamer`). ``reversed_order``,
``missing_slice`` and ``duplicate_slice`` only change which slices are written
and how they are numbered (see :func:`pipeline.phantom.dicom_writer.write_dicom_series`).
Positions and directions are DICOM patient coordinates (LPS, mm).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..volume import CTVolume
from .dicom_common import Stack, volume_stack

QUIRKS = ("shuffled_names", "reversed_order", "gantry_tilt", "missing_slice", "duplicate_slice", "localizer", "second_series")
ENHANCED_QUIRKS = ("shuffled_names", "localizer", "second_series")
GANTRY_TILT_DEG = 15.0
THICK_SLICE_MM = 5.0
AIR_HU = -1000.0


def tilt_stack(stack: Stack, volume: CTVolume, tilt_deg: float) -> Stack:
    """Resample onto the grid of a gantry tilted by ``tilt_deg`` about the row axis.

    The column direction becomes ``cos(t) d1 + sin(t) d2``; the table still moves
    along ``d2`` by ``sk`` per slice, so successive positions are sheared along the
    tilted column direction instead of advancing along the slice normal. Each
    tilted plane passes through the centre row of the original slice k, where its
    values are the original voxels; other rows are bilinear in (j, k); rows that
    reach past the phantom's slab take its first or last slice (a tilted scanner images
    anatomy in every row: air there would cut through the body and join the trachea to
    the air around it). Anatomy keeps its LPS position.
    """
    g = volume.geometry
    si, sj, sk = g.spacing
    nk, nj, _ = g.shape
    t = np.deg2rad(tilt_deg)
    d = g.direction
    col = np.cos(t) * d[:, 1] + np.sin(t) * d[:, 2]
    jc = (nj - 1) / 2.0
    rel = np.arange(nj, dtype=np.float64) - jc
    jj = jc + rel * np.cos(t)
    j0 = np.clip(np.floor(jj).astype(np.int64), 0, nj - 1)
    j1 = np.minimum(j0 + 1, nj - 1)
    wj = (jj - j0)[:, None].astype(np.float32)
    src = volume.array.astype(np.float32, copy=False)
    out = np.empty((nk, nj, g.shape[2]), dtype=np.float32)
    for k in range(nk):
        kc = np.clip(k + rel * sj * np.sin(t) / sk, 0, nk - 1)
        k0 = np.floor(kc).astype(np.int64)
        k1 = np.minimum(k0 + 1, nk - 1)
        wk = (kc - k0)[:, None].astype(np.float32)
        top = src[k0, j0] * (1 - wj) + src[k0, j1] * wj
        bottom = src[k1, j0] * (1 - wj) + src[k1, j1] * wj
        out[k] = top * (1 - wk) + bottom * wk
    shift = jc * sj * (d[:, 1] - col)
    stack.hu = out
    stack.positions = stack.positions + shift[None, :]
    stack.col_dir = col
    stack.spacing_between = sk * float(np.cos(t))
    stack.tilt_deg = tilt_deg
    return stack


def thick_stack(volume: CTVolume, *, series_uid: str, series_number: int) -> Stack:
    """A thick-slice (≈5 mm) reconstruction: means of consecutive slices, same plane orientation.

    Like a scanner's second reconstruction of one acquisition it is ORIGINAL/PRIMARY/AXIAL.
    """
    g = volume.geometry
    nk = g.shape[0]
    sk = g.spacing[2]
    factor = max(1, min(int(round(THICK_SLICE_MM / sk)), nk // 2 if nk >= 2 else 1))
    n = nk // factor
    hu = volume.array[: n * factor].astype(np.float32).reshape(n, factor, *g.shape[1:]).mean(axis=1)
    stack = volume_stack(volume, series_uid=series_uid, series_number=series_number)
    centres = np.arange(n) * factor + (factor - 1) / 2.0
    stack.hu = hu
    stack.positions = np.asarray(g.origin)[None, :] + (centres * sk)[:, None] * g.direction[:, 2][None, :]
    stack.spacing_between = sk * factor
    stack.thickness = sk * factor
    stack.instance_numbers = list(range(1, n + 1))
    stack.description = f"Chest phantom {sk * factor:g} mm"
    return stack


def localizer_stack(volume: CTVolume, *, series_uid: str, series_number: int) -> Stack:
    """One coronal projection image (mean HU along j), superior slice at the top."""
    g = volume.geometry
    si, sj, sk = g.spacing
    nk, nj, _ = g.shape
    d = g.direction
    proj = volume.array.astype(np.float32).mean(axis=1)[::-1]  # [rows = k from last to first, cols = i]
    top_left = np.asarray(g.origin) + (nk - 1) * sk * d[:, 2] + (nj - 1) / 2.0 * sj * d[:, 1]
    return Stack(
        hu=proj[None],
        positions=top_left[None],
        row_dir=d[:, 0].copy(),
        col_dir=-d[:, 2],
        pixel_spacing=(sk, si),
        spacing_between=None,
        thickness=sk,  # detector row width of the scout
        instance_numbers=[1],
        image_type=["ORIGINAL", "PRIMARY", "LOCALIZER"],
        series_uid=series_uid,
        series_number=series_number,
        description="Scout",
    )


class FileNamer:
    """File names: ``CT<series>_<instance>.dcm``, or random hex names in nested folders."""

    def __init__(self, out_dir: Path, shuffled: bool, seed: int):
        self.out_dir = out_dir
        self.shuffled = shuffled
        # a negative seed (generate_phantom takes any integer) gets a stream of its own; numpy's seeds are >= 0
        self.rng = np.random.default_rng([int(seed), 0x5EED] if seed >= 0 else [-int(seed), 0x5EED, 1])
        self.used: set[Path] = set()

    def __call__(self, series_number: int, instance: int, tag: str = "") -> Path:
        if not self.shuffled:
            return self.out_dir / f"CT{series_number:03d}_{instance:05d}{tag}.dcm"
        while True:
            depth = int(self.rng.integers(0, 3))
            parts = [self.rng.bytes(1).hex() for _ in range(depth)]
            path = self.out_dir.joinpath(*parts, self.rng.bytes(8).hex().upper())
            if path not in self.used:
                self.used.add(path)
                return path
