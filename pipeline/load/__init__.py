"""Case cache → model-ready tensors, with the geometry to map every voxel back to the patient (LPS, mm).

Usage::

    from pipeline.cache import CaseCache
    from pipeline.load import PreprocessSpec, make_loader

    spec = PreprocessSpec(spacing=(0.703125, 0.703125, 1.25),      # mm along model axes x, y, z (RAS)
                          intensity_window=(-1024, 300),             # HU → output_range (0, 1), clipped
                          size_divisible=(16, 16, 8))                # pad each axis to a multiple
    # or: spec = PreprocessSpec.from_bundle_config("bundle/configs/inference.json")
    loader = make_loader(CaseCache("cache/"), spec, loader="auto", device="auto", batch_size=2)
    failed = {}
    for case in loader.load(["case1", "case2"]):                     # one LoadedCase per id, in order
        if not case.ok:
            failed[case.case_id] = case.error                        # CacheError/LoaderError naming the case
            continue
        x = case.tensor                                              # float32 (1, X, Y, Z), RAS, loader's device
        lps = case.geometry.input_index_to_lps([[10, 20, 30]])       # tensor voxel (x, y, z) → LPS mm
        idx = case.geometry.lps_to_input_index(lps)                  # and back

What the tensor is: MONAI's ``Orientationd(axcodes="RAS")`` → ``Spacingd(pixdim=spacing,
mode="bilinear")`` → ``ScaleIntensityRanged(a_min, a_max, b_min, b_max, clip)`` →
``DivisiblePadd(k=size_divisible)`` applied to the cached HU volume (tests check the
match), with an optional crop (``Roi`` in LPS mm or source voxel indices + margin; per
case via ``load(ids, rois={id: Roi(...)})``, ``spec.roi`` or ``spec.roi_key``).
``case.geometry.affine_ras`` equals the MetaTensor affine MONAI would give;
``affine_lps`` maps (x, y, z, 1) to LPS mm. Detector boxes ``[x0, y0, z0, x1, y1, z1]`` in
tensor voxel coordinates go to LPS boxes with ``case.geometry.input_boxes_to_lps(boxes)``
(and back with ``lps_boxes_to_input``); ``case.geometry.geometry`` is the model grid as a
``Geometry`` and ``case.to_volume()`` wraps the tensor as a ``CTVolume`` (model units).

Agreement with MONAI's transforms (tests, small volumes): max abs difference < 1e-5 and
mean < 1e-6 in output units for both loaders; on 256–512-matrix chests the torch loader
stays ~1e-7 and DALI ~4e-5 (float32 sampling positions). Affines agree to 1e-6 mm.

Loaders: ``DaliLoader`` (NVIDIA DALI; GPU with GPUDirect Storage when a GPU is
present, CPU mode otherwise) and ``TorchLoader`` (torch ops, GPU when present) give
the same output; ``make_loader`` picks DALI when installed and logs which one runs and
why. ``preprocess_volume(volume, spec)`` does the same for an in-memory ``CTVolume`` (always the torch route);
``loader.load_one(case_id, array=voxels)`` has the loader itself prepare a cached case's voxels changed in memory
(e.g. NaN voxels set to air) in place of its file's, on the entry's grid and with its metadata.
"""

from __future__ import annotations

from .base import BaseLoader
from .dali_loader import DaliLoader, dali_available
from .geometry import InputGeometry, plan_input, ras_orientation
from .result import LoadedCase
from .select import make_loader
from .spec import BUNDLE_LUNG_NODULE, PreprocessSpec, Roi
from .torch_loader import TorchLoader, preprocess_array, preprocess_volume

#: Alias: the object a loader yields (the model input with its geometry).
ModelInput = LoadedCase

__all__ = [
    "BUNDLE_LUNG_NODULE",
    "BaseLoader",
    "DaliLoader",
    "InputGeometry",
    "LoadedCase",
    "ModelInput",
    "PreprocessSpec",
    "Roi",
    "TorchLoader",
    "dali_available",
    "make_loader",
    "plan_input",
    "preprocess_array",
    "preprocess_volume",
    "ras_orientation",
]
