"""The phantoms of the demo detector's training, validation and held-out evaluation (``scripts/train_detector.py``).

Their confounders (:func:`phantom_confounders`), the realistic training and validation phantoms
(:func:`training_phantom`, seeds the training scripts choose) and the held-out evaluation phantoms
(:func:`heldout_phantom`, seeds 1..999 only), each deterministic from its seed. ``train_detector`` names
them too, as the model's training record and the other scripts do.
"""

from __future__ import annotations

import numpy as np

#: Share of the training, validation and evaluation phantoms drawn without any nodule (vessels, bifurcations and
#: the confounders are then the only things the detector sees there: negatives to learn).
NO_NODULE_FRACTION = 0.2
#: Patient positions of the training phantoms and their shares (the network input is reoriented to RAS).
POSITIONS = {"HFS": 0.85, "FFS": 0.1, "HFP": 0.05}


def phantom_confounders(seed: int):  # -> pipeline.phantom.Confounders
    """The confounders of every training, validation and held-out phantom: ``realistic_confounders(seed)`` with
    the lungs' sub-voxel peripheral vessels (``fine_vessels``: the faint dots real lungs are full of)."""
    from dataclasses import replace

    from pipeline.phantom import realistic_confounders

    return replace(realistic_confounders(seed), fine_vessels=True)


def training_phantom(seed: int, rng: np.random.Generator):  # -> pipeline.phantom.Phantom
    """A realistic training phantom, deterministic from ``seed`` (``rng`` = ``default_rng(seed)``).

    Random protocol (matrix 160-256, field of view 200-360 mm, slices 1.25-2.5 mm), a patient position
    (:data:`POSITIONS`) and the realistic confounders of ``realistic_confounders(seed)`` (table, blanket, arms,
    contrast, bowel gas, partial coverage, small or large field of view, emphysema, effusion, atelectasis, sharp
    kernel, thick slices, metal) over the vessel trees (bifurcating, tapering from the hila) and the lungs' sub-voxel
    peripheral vessels (:func:`phantom_confounders`); a share
    :data:`NO_NODULE_FRACTION` has no nodule at all, the rest 3-8 (fewer where the lungs hold fewer).
    """
    from pipeline.errors import PhantomError
    from pipeline.phantom import generate_phantom

    matrix = int(rng.choice([160, 192, 256]))
    fov = float(rng.uniform(200.0, 360.0))
    slice_spacing = float(rng.choice([1.25, 2.0, 2.5]))
    n_nodules = 0 if rng.random() < NO_NODULE_FRACTION else int(rng.integers(3, 9))
    position = str(rng.choice(list(POSITIONS), p=np.asarray(list(POSITIONS.values()))))
    conf = phantom_confounders(seed)
    if not conf.has_lungs:
        n_nodules = 0
    options = {
        "matrix": matrix,
        "pixel_spacing": min(2.0, fov / matrix),
        "slice_spacing": slice_spacing,
        "patient_position": position,
        "confounders": conf,
    }
    try:
        return generate_phantom(seed, n_nodules=n_nodules, **options)
    except PhantomError:  # the cropped lungs hold fewer nodules: as many as fit
        return generate_phantom(seed, n_nodules=None if n_nodules else 0, **options)


EVAL_PHANTOM = {"matrix": 256, "pixel_spacing": 1.2, "slice_spacing": 2.0}


def heldout_phantom(seed: int, *, protocol: dict | None = None):  # -> pipeline.phantom.Phantom
    """A held-out evaluation phantom (seeds 1..999 only): :data:`EVAL_PHANTOM`'s protocol (or ``protocol``: matrix,
    pixel_spacing and slice_spacing in mm) with the realistic confounders of :func:`phantom_confounders` and 0-6
    nodules (``n_nodules=None``), head first supine. The nodules are placed on the protocol's grid, so another
    protocol of the same seed holds other nodules."""
    from pipeline.phantom import generate_phantom

    return generate_phantom(seed, confounders=phantom_confounders(seed), **(protocol or EVAL_PHANTOM))
