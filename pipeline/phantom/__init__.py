"""Synthetic chest CT phantoms with ground truth (anatomy, organ masks, lung nodules).

Conventions
-----------
* All positions are DICOM patient coordinates (LPS, mm): +x is the patient's
  left, +y posterior, +z superior. The left lung lies at larger x than the right.
* ``phantom.volume`` is a :class:`~pipeline.volume.CTVolume` of HU (float32)
  indexed ``[k, j, i]``. For HFS the direction is the identity: i runs to the
  patient's left, j posterior, k superior (slices ordered by increasing z, the
  first slice is the most inferior); the origin is the centre of the top-left
  voxel of the first slice. Other patient positions (FFS, HFP, ...) change the
  direction cosines, origin and voxel order as a scanner would (see
  :mod:`pipeline.phantom.scanner`); LPS ground truth is unchanged by them.
* Masks (bool ``[k, j, i]`` on ``volume.geometry``) are the crisp truth under
  the blurred, noisy image:
  ``body`` the filled patient outline (includes lungs and airways, and the
  arms when a confounded phantom has them; never the table);
  ``lung_left`` / ``lung_right`` the pleural cavities including intrapulmonary
  vessels, bronchial walls and nodules, excluding the airway lumen and bone
  (the two never touch: the mediastinum always separates them);
  ``airway`` the air lumen of trachea and bronchi (not the wall);
  ``bone`` spine, ribs, sternum, clavicle and scapula bone voxels (not discs,
  spinal canal or costal cartilage);
  ``vessels`` the pulmonary vessel tree inside the lungs (not nodule voxels).
* ``nodule_labels`` (uint8) holds n inside ``nodules[n - 1]``; each nodule is
  centrally symmetric about its ``center_lps`` and lies fully inside one lung mask.
  Kinds: solid (about 0..70 HU), ground glass (about -600..-400 HU, vessels stay
  visible through it), part solid (ground glass with a solid core); some touch
  the pleura or a vessel (``attached_to``).
* Tissue (HU before blur and noise): air -1000, skin 35, fat -100, muscle 48,
  mediastinal fat -85, blood/heart/vessels 42, costal cartilage 120, lung parenchyma about -870..-800
  (smooth texture, denser posteriorly), cancellous bone 360, cortical bone 950.
  The image is blurred along k by the slice profile (``slice_thickness``) and
  in-plane by the kernel, then carries noise of ``noise_hu`` HU (correlated
  within a slice). Airway lumen is separated from lung by a wall at least one
  voxel thick, so a region grown from the trachea at about -600 HU stays in it.
* The anatomy scales with the field of view (``matrix * pixel_spacing``);
  nodule diameters are absolute mm (in small chests at most half the largest
  sphere the lungs can hold). Everything is deterministic from ``seed``.
* HU values are clipped to -1024..3071 as a scanner stores them.
* ``confounders=Confounders(...)`` adds what real scans have (table, arms,
  IV contrast, bowel gas, partial coverage, a small field of view, emphysema,
  effusion, atelectasis, a sharp kernel, thick slices, metal), the masks of
  :data:`CONFOUNDER_MASK_NAMES` and ``phantom.truth`` (see
  :mod:`pipeline.phantom.confounders`); :data:`CONFOUNDER_SCENARIOS` names
  held-out evaluation cases, :func:`realistic_confounders` draws a realistic
  mix for training. Without confounders a phantom is exactly the plain one.

Main entry points: :func:`generate_phantom`, :class:`Phantom`, :class:`Nodule`,
:func:`load_ground_truth`, :func:`load_masks`, :class:`Confounders`; DICOM output is in
:mod:`pipeline.phantom.dicom_writer` (``write_phantom_series`` is re-exported here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from .confounders import CONFOUNDER_SCENARIOS, SCENARIO_SEEDS, Confounders, Scenario, realistic_confounders
    from .dicom_writer import write_dicom_series, write_phantom_case, write_phantom_series
    from .generate import generate_phantom
    from .model import ALL_MASK_NAMES, CONFOUNDER_MASK_NAMES, MASK_NAMES, Nodule, Phantom, load_ground_truth, load_masks

__all__ = [
    "ALL_MASK_NAMES",
    "CONFOUNDER_MASK_NAMES",
    "CONFOUNDER_SCENARIOS",
    "Confounders",
    "MASK_NAMES",
    "Nodule",
    "Phantom",
    "SCENARIO_SEEDS",
    "Scenario",
    "generate_phantom",
    "load_ground_truth",
    "load_masks",
    "realistic_confounders",
    "write_dicom_series",
    "write_phantom_case",
    "write_phantom_series",
]

# names are imported on first use, so importing the package (e.g. for the CLI) stays fast
_LAZY = {
    "ALL_MASK_NAMES": "pipeline.phantom.model",
    "CONFOUNDER_MASK_NAMES": "pipeline.phantom.model",
    "CONFOUNDER_SCENARIOS": "pipeline.phantom.confounders",
    "Confounders": "pipeline.phantom.confounders",
    "SCENARIO_SEEDS": "pipeline.phantom.confounders",
    "Scenario": "pipeline.phantom.confounders",
    "realistic_confounders": "pipeline.phantom.confounders",
    "generate_phantom": "pipeline.phantom.generate",
    "MASK_NAMES": "pipeline.phantom.model",
    "Nodule": "pipeline.phantom.model",
    "Phantom": "pipeline.phantom.model",
    "load_ground_truth": "pipeline.phantom.model",
    "load_masks": "pipeline.phantom.model",
    "write_dicom_series": "pipeline.phantom.dicom_writer",
    "write_phantom_case": "pipeline.phantom.dicom_writer",
    "write_phantom_series": "pipeline.phantom.dicom_writer",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
