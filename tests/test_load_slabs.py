"""Memory-bounded preprocessing: slab by slab, straight from a memory-mapped int16 array, crops read as views."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pipeline.cache import CaseCache
from pipeline.load import BUNDLE_LUNG_NODULE, PreprocessSpec, Roi, TorchLoader, plan_input, preprocess_array, preprocess_volume
from tests._support.volumes import synthetic


class _Reads(np.ndarray):
    """An array that records the index boxes read from it (as a memory map would page them in)."""

    def __array_finalize__(self, obj):
        self.boxes = getattr(obj, "boxes", None)

    def __getitem__(self, key):
        if self.boxes is not None and isinstance(key, tuple) and all(isinstance(k, slice) for k in key):
            self.boxes.append(tuple((k.start or 0, k.stop if k.stop is not None else n) for k, n in zip(key, self.shape)))
        return np.asarray(super().__getitem__(key))


def _recording(array: np.ndarray) -> _Reads:
    rec = array.view(_Reads)
    rec.boxes = []
    return rec


def test_slabs_equal_whole_volume_and_stay_bounded():
    vol = synthetic((60, 40, 36), (0.8, 0.9, 1.0), direction=np.diag([-1.0, 1.0, -1.0]))
    spec = BUNDLE_LUNG_NODULE.replace(spacing=(1.1, 1.3, 1.7))
    geom = plan_input(vol.geometry, spec)
    whole = preprocess_array(vol.array, geom, spec, slab_voxels=10**9)
    rec = _recording(vol.array)
    slabs = preprocess_array(rec, geom, spec, slab_voxels=3000)
    assert torch.equal(whole, slabs)
    assert len(rec.boxes) > 5  # many slabs, each reading only a few source slices
    nk = vol.shape[0]
    assert max(b[0][1] - b[0][0] for b in rec.boxes) < nk / 3


def test_roi_crop_reads_only_its_box_and_matches_the_uncropped_input():
    vol = synthetic((50, 64, 64), (0.7, 0.7, 1.25))
    spec = PreprocessSpec(spacing=(1.0, 1.0, 1.5))
    roi = Roi(lo=(10, 20, 5), hi=(40, 50, 30), space="index")
    rec = _recording(vol.array)
    crop_geom = plan_input(vol.geometry, spec, roi=roi)
    tensor = preprocess_array(rec, crop_geom, spec)
    crop = preprocess_volume(vol, spec, device="cpu", roi=roi)
    assert torch.equal(tensor, crop.unwrap()) and crop.geometry == crop_geom
    full = preprocess_volume(vol, spec, device="cpu")
    (k0, k1), (j0, j1), (i0, i1) = rec.boxes[0]
    assert len(rec.boxes) == 1 and (k1 - k0) * (j1 - j0) * (i1 - i0) < 0.4 * vol.array.size  # only the crop's voxels
    # the crop is a window of the full input, same values
    lo = np.round(full.geometry.lps_to_input_index(crop.geometry.input_index_to_lps([0, 0, 0]))).astype(int)
    x, y, z = crop.tensor.shape[1:]
    assert torch.allclose(crop.tensor[0], full.tensor[0, lo[0] : lo[0] + x, lo[1] : lo[1] + y, lo[2] : lo[2] + z], atol=1e-6)


def test_torch_loader_reads_the_cache_memory_mapped(tmp_path, monkeypatch):
    vol = synthetic((80, 32, 32), (1.0, 1.0, 1.0))
    cache = CaseCache(tmp_path / "cache")
    cache.write("long", vol)
    spec = BUNDLE_LUNG_NODULE.replace(spacing=(1.5, 1.5, 2.0), size_divisible=(1, 1, 1))
    reads: list[tuple[Path, object]] = []
    np_load = np.load

    def recording_load(path, *args, **kwargs):  # the real np.load, its file and mmap_mode recorded
        reads.append((Path(path), kwargs.get("mmap_mode")))
        return np_load(path, *args, **kwargs)

    monkeypatch.setattr(np, "load", recording_load)
    loaded = TorchLoader(cache, spec, device="cpu", num_threads=1).load_one("long")
    monkeypatch.undo()
    arrays = [mode for path, mode in reads if path.suffix == ".npy"]
    assert arrays == ["r"], reads  # the case's array read once, memory-mapped
    mm = cache.read("long", mmap=True)
    assert not mm.array.flags.owndata
    ref = preprocess_volume(mm, spec, device="cpu", slab_voxels=500)
    assert torch.equal(loaded.unwrap(), ref.unwrap())
    assert loaded.geometry == ref.geometry
