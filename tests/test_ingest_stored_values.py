"""Stored pixel formats that change from slice to slice within one series, as archives hold them: each slice's
values read with its own BitsStored / PixelRepresentation, the HU the same as SimpleITK's (pydicom's) reading."""

from __future__ import annotations

import numpy as np
import pydicom

from pipeline.ingest import SelectionRules, load_series
from tests._support.dicom import hu_pattern, write_series

RULES = SelectionRules(min_slices=2)


def _pydicom_hu(paths) -> np.ndarray:
    """HU of each file as pydicom decodes it (its own BitsStored, sign and rescale), in slice order."""
    out = []
    for p in paths:
        ds = pydicom.dcmread(p)
        out.append(ds.pixel_array.astype(np.float64) * float(ds.RescaleSlope) + float(ds.RescaleIntercept))
    return np.stack(out)


def test_bits_stored_varying_per_slice_keeps_metal(tmp_path):
    """A scanner writes BitsStored 12 on ordinary slices and 16 on the one holding metal (3000 HU): the metal slice
    is read with its own 16 bits, not cut to the first slice's 12 (which made 3000 HU into -1096 HU, air)."""
    n, metal_k = 8, 5
    hu = hu_pattern(n, 16, 20)
    hu = np.clip(hu, -1000, 1000)  # stored = HU (intercept 0): fits 12 signed bits, checked below
    hu[metal_k, 4:7, 4:7] = 3000

    def tweak(k: int, ds: pydicom.Dataset) -> None:
        if k != metal_k:
            ds.BitsStored, ds.HighBit = 12, 11

    paths = write_series(tmp_path, n=n, hu=hu, intercept=0.0, tweak=tweak)
    stored = np.stack([pydicom.dcmread(p).pixel_array for p in paths])
    assert stored[np.arange(n) != metal_k].min() >= -2048 and stored[np.arange(n) != metal_k].max() <= 2047
    vol = load_series(tmp_path, rules=RULES, workers=0)
    assert np.array_equal(vol.array, _pydicom_hu(paths))
    assert vol.array[metal_k, 4:7, 4:7].min() == 3000
