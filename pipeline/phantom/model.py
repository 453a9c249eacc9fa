"""Phantom results and their ground truth on disk (``ground_truth.json`` + ``masks.npz``).

Coordinates in the ground truth are DICOM patient coordinates (LPS, mm);
``center_ijk`` gives the same point as a continuous voxel index (i, j, k) of
the phantom's geometry. Masks are boolean arrays indexed ``[k, j, i]`` on the
volume's geometry.
"""

from __future__ import annotations

import io
import json
import logging
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import ndimage

from ..atomic import atomic_write_bytes
from ..errors import PhantomError
from ..volume import CTVolume, Geometry

log = logging.getLogger(__name__)

GROUND_TRUTH_FILE = "ground_truth.json"
MASKS_FILE = "masks.npz"
FORMAT_VERSION = 1
MASK_NAMES = ("body", "lung_left", "lung_right", "airway", "bone", "vessels")
"""Masks every phantom has."""
CONFOUNDER_MASK_NAMES = ("table", "bowel_gas", "contrast_blood", "effusion", "atelectasis", "emphysema", "metal")
"""Masks a phantom made with confounders has as well (each present, possibly empty)."""
ALL_MASK_NAMES = MASK_NAMES + CONFOUNDER_MASK_NAMES
TRACHEA_MIN_ML = 1.0  # the largest connected piece of the airway truth holds a trachea from this volume (mL)
NODULE_KINDS = ("solid", "part_solid", "ground_glass")


@dataclass(frozen=True)
class Nodule:
    """A lung nodule of the phantom.

    center_lps: centre in LPS mm. diameter_mm: nominal diameter (mm) of the
    centrally symmetric, slightly lobulated sphere. kind: ``"solid"``,
    ``"part_solid"`` or ``"ground_glass"``. attached_to: ``"pleura"``,
    ``"vessel"`` or None. lung: ``"lung_left"`` or ``"lung_right"``.
    mean_hu: mean HU over the nodule's voxels before blur and noise.
    volume_mm3: volume of its voxel mask (mm³).
    """

    center_lps: tuple[float, float, float]
    diameter_mm: float
    kind: str
    attached_to: str | None
    lung: str
    mean_hu: float = 0.0
    volume_mm3: float = 0.0

    def to_json(self, *, geometry: Geometry | None = None, label: int | None = None) -> dict[str, Any]:
        """The nodule as JSON: ``center_lps`` in DICOM patient coordinates (LPS), mm; with ``geometry``, also
        ``center_ijk``, the continuous voxel index (i, j, k) of the centre on that grid; ``label``, its value in
        the phantom's nodule label map."""
        out: dict[str, Any] = {
            "center_lps": [round(float(v), 4) for v in self.center_lps],
            "diameter_mm": round(float(self.diameter_mm), 4),
            "kind": self.kind,
            "attached_to": self.attached_to,
            "lung": self.lung,
            "mean_hu": round(float(self.mean_hu), 1),
            "volume_mm3": round(float(self.volume_mm3), 2),
        }
        if geometry is not None:
            out["center_ijk"] = [round(float(v), 3) for v in geometry.lps_to_index(self.center_lps)]
        if label is not None:
            out["label"] = int(label)
        return out


#: How many nodules a :class:`Phantom`'s repr describes; the others it counts.
REPR_NODULES = 3


@dataclass(frozen=True, eq=False)
class Phantom:
    """A synthetic chest CT with its ground truth.

    volume: HU (float32) with LPS geometry and DICOM metadata. masks: bool
    ``[k, j, i]`` arrays on ``volume.geometry`` named in :data:`MASK_NAMES`,
    and with confounders also :data:`CONFOUNDER_MASK_NAMES`:
    ``table`` (table and blanket; never ``body``), ``bowel_gas`` (stomach and
    colon gas; never lung), ``contrast_blood`` (enhanced blood in heart and
    vessels, intrapulmonary vessels included; never ``bone``), ``effusion``
    and ``atelectasis`` (not in the lung masks), ``emphysema`` (low-attenuation
    lung, inside the lung masks), ``metal`` (not ``bone``).
    nodule_labels: uint8 ``[k, j, i]``, 0 background, n for ``nodules[n - 1]``.
    truth: with confounders, what the scan contains (lungs in the scan,
    contrast phase, slices, field of view, metal, emphysema index, ...);
    empty otherwise.
    """

    volume: CTVolume
    masks: dict[str, np.ndarray]
    nodule_labels: np.ndarray
    nodules: tuple[Nodule, ...]
    seed: int
    options: dict[str, Any] = field(default_factory=dict)
    truth: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # short: a notebook echoes the phantom; the arrays are in masks and nodule_labels
        shown = [
            f"{n.diameter_mm:.1f} mm {n.kind} in {n.lung} at LPS ({', '.join(f'{v:.1f}' for v in n.center_lps)}) mm"
            for n in self.nodules[:REPR_NODULES]
        ]
        if len(self.nodules) > REPR_NODULES:  # a dozen nodules would make a screenful: the others counted
            shown.append(f"… {len(self.nodules) - REPR_NODULES} more (.nodules lists them)")
        nodules = "; ".join(shown)
        return (
            f"Phantom(seed={self.seed}, volume={self.volume!r}, masks={sorted(self.masks)}, "
            f"nodules={len(self.nodules)}{': ' + nodules if nodules else ''})"
        )

    def trachea_in_scan(self) -> bool:
        """Whether the field of view holds a trachea: one connected piece of the ``airway`` truth of at least
        :data:`TRACHEA_MIN_ML` (the tips of segmental bronchi at the top of a lung-base scan are not one)."""
        airway = self.masks.get("airway")
        if airway is None or not airway.any():
            return False
        labels, _ = ndimage.label(airway, structure=np.ones((3, 3, 3), dtype=bool))
        voxel_ml = float(np.prod(self.volume.geometry.spacing)) / 1000.0
        return float(np.bincount(labels.ravel())[1:].max()) * voxel_ml >= TRACHEA_MIN_ML

    def ground_truth(self) -> dict[str, Any]:
        """JSON-able ground truth: seed, options, geometry, UIDs, nodules (LPS mm), mask volumes (mm³).

        A phantom with confounders adds ``truth`` (see :class:`Phantom`); its
        options hold the ``confounders`` asked for.
        """
        geom = self.volume.geometry
        voxel_mm3 = float(np.prod(geom.spacing))
        meta = self.volume.metadata
        out: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "coordinates": "DICOM patient coordinates (LPS), mm; arrays indexed [k, j, i]",
            "seed": int(self.seed),
            "options": dict(self.options),
            "geometry": geom.to_json(),
            "patient_id": meta.get("PatientID"),
            "patient_position": meta.get("PatientPosition"),
            "study_uid": meta.get("StudyInstanceUID"),
            "series_uid": meta.get("SeriesInstanceUID"),
            "frame_of_reference_uid": meta.get("FrameOfReferenceUID"),
            "nodules": [n.to_json(geometry=geom, label=i + 1) for i, n in enumerate(self.nodules)],
            "masks": {
                "file": MASKS_FILE,
                "names": sorted(self.masks),
                "volume_mm3": {k: round(float(np.count_nonzero(v)) * voxel_mm3, 1) for k, v in self.masks.items()},
            },
        }
        if self.truth:
            out["truth"] = self.truth
        return out

    def save_ground_truth(self, folder: str | Path) -> Path:
        """Write ``ground_truth.json`` and ``masks.npz`` (compressed masks + ``nodule_labels``) atomically."""
        folder = Path(folder)
        buf = io.BytesIO()
        arrays: dict[str, Any] = {k: np.ascontiguousarray(v) for k, v in self.masks.items()}
        arrays["nodule_labels"] = np.ascontiguousarray(self.nodule_labels)
        np.savez_compressed(buf, **arrays)
        atomic_write_bytes(folder / MASKS_FILE, buf.getvalue())
        text = json.dumps(self.ground_truth(), indent=2)
        atomic_write_bytes(folder / GROUND_TRUTH_FILE, text.encode("utf-8"))
        log.info("ground truth of phantom seed %d written to %s", self.seed, folder)
        return folder / GROUND_TRUTH_FILE


def _gt_path(path: str | Path) -> Path:
    p = Path(path)
    return p / GROUND_TRUTH_FILE if p.is_dir() else p


def load_ground_truth(path: str | Path) -> dict[str, Any]:
    """Read ``ground_truth.json`` (give the file or its folder); nodule centres are LPS mm.

    Raises :class:`~pipeline.errors.PhantomError` naming the file when it is
    missing, not JSON, or lacks the expected keys.
    """
    p = _gt_path(path)
    if not p.is_file():
        raise PhantomError("ground truth file not found", where=p, fix="write it with Phantom.save_ground_truth(folder)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PhantomError(f"not valid JSON ({exc})", where=p, fix="regenerate it with Phantom.save_ground_truth") from exc
    missing = [k for k in ("seed", "geometry", "series_uid", "nodules") if not isinstance(data, dict) or k not in data]
    if missing:
        raise PhantomError(f"ground truth lacks keys {missing}", where=p, fix="regenerate it with Phantom.save_ground_truth")
    return data


def load_masks(path: str | Path) -> dict[str, np.ndarray]:
    """Read ``masks.npz`` (give the file or its folder): bool masks ``[k, j, i]`` and uint8 ``nodule_labels``.

    Every mask in the file is returned: :data:`MASK_NAMES`, and for a phantom
    made with confounders also :data:`CONFOUNDER_MASK_NAMES`.
    """
    p = Path(path)
    if p.is_dir():
        p = p / MASKS_FILE
    if not p.is_file():
        raise PhantomError("mask file not found", where=p, fix="write it with Phantom.save_ground_truth(folder)")
    try:
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise PhantomError(
            f"unreadable mask archive ({exc})", where=p, fix="regenerate it with Phantom.save_ground_truth"
        ) from exc
