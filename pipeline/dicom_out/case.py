"""A case's DICOM results from what ctpipe's commands produce (``ctpipe detect``, ``reconstruct``, ``run``).

:func:`dicom_source_of` finds the DICOM files a command's input was loaded from; :func:`write_case_dicom`
writes the SR and the SEG of one case from its :class:`~pipeline.detection.findings.Findings` (the
operating point and the model name come from them) and its reconstruction. Positions are DICOM
patient coordinates (LPS, mm).
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..ingest.image import image_suffix
from ..volume import CTVolume
from .api import SourceArg, write_dicom_outputs

log = logging.getLogger(__name__)

#: the algorithm an SR names when no detector ran (a reconstruction alone)
RECONSTRUCTION_ALGORITHM = "ctpipe reconstruction"
#: the organ masks that give each reported finding its side (the patient's left and right lung)
SIDE_ORGANS = ("lung_left", "lung_right")


def dicom_source_of(src: str | os.PathLike[str]) -> Path | None:
    """The DICOM folder or file a command's input ``src`` holds or was ingested from, or None.

    A DICOM folder or file is its own source; a case-cache entry (``<case>.json`` / ``<case>.npy``) names the
    folder it was ingested from in its sidecar (``extra.source``); an image file (NIfTI, MHA, NRRD) has none.
    """
    path = Path(src)
    if path.is_dir():
        return path
    if image_suffix(path) is not None:
        return None
    if path.suffix in (".npy", ".json") and path.is_file():
        from ..cache import CaseCache

        extra = CaseCache(path.parent).entry(path.stem).sidecar.get("extra") or {}
        source = extra.get("source") if isinstance(extra, Mapping) else None
        return Path(source) if source else None
    return path if path.is_file() else None


def lung_side_masks(volume: CTVolume, *, device: str | None = None, step_mm: float = 2.0) -> dict[str, np.ndarray]:
    """The patient's left and right lungs of ``volume`` (``lung_left`` / ``lung_right``: bool ``[k, j, i]`` on its
    grid), the masks that give each finding its side in an SR written without a reconstruction (``ctpipe detect``).

    They are the reconstruction's lung segmentation (:func:`~pipeline.reconstruction.segment.segment_organs`, as
    ``ctpipe reconstruct`` and ``ctpipe run`` segment the lungs), so the three commands state the same side for the
    same finding: left and right from anatomy (the airway between the lungs, else the two lungs' relation, else the
    body's mid-line) in DICOM patient coordinates (LPS mm: +x is the patient's left), whatever the patient position
    and the order of the rows, columns and slices; never from which half of the image a lung lies in. It runs on
    blocks of about ``step_mm`` (mm; the mean HU of each block, as the detector's own lung search does; 0: the
    full grid), and each block's label is given back to its voxels: a side is a matter of centimetres, and the
    blocks make it about 4 times quicker for a 512 x 512 chest (2 s on 2 CPU cores). A lung the segmentation does
    not find (a field of view holding one lung, a scan without lungs) is left out, with its reason logged; a
    finding then takes the side of a lung within :data:`~pipeline.reconstruction.nodule_geometry.SIDE_SEARCH_MM` of it, or none.
    ``device``: torch device of the segmentation (``"cpu"``, ``"cuda"``; default CUDA when available).
    """
    from ..detection.lungs import block_means, strides
    from ..ingest.measured import measured_mask, with_measured
    from ..reconstruction.segment import segment_organs

    step_kji = strides(volume.spacing, step_mm) if step_mm > 0 else (1, 1, 1)
    coarse = volume
    if step_kji != (1, 1, 1):
        # a tilt-corrected grid's blocks holding an unmeasured voxel are unmeasured: the segmentation reads them as
        # the images continued past their edge, not as air joining the lungs cut there to the air outside
        measured = measured_mask(volume.geometry, volume.metadata)
        md = {} if measured is None else with_measured({}, block_means(measured, step_kji) >= 1.0 - 1e-6)
        coarse = CTVolume(block_means(np.asarray(volume.array), step_kji), volume.geometry.binned(step_kji), metadata=md)
    seg = segment_organs(coarse, organs=SIDE_ORGANS, device=device)
    for organ, error in seg.errors.items():
        side = organ.removeprefix("lung_")
        log.warning("no finding is stated to lie in the %s lung, which was not found: %s", side, error)
    out: dict[str, np.ndarray] = {}
    for organ in SIDE_ORGANS:
        if organ in seg.masks:
            m = np.asarray(seg.masks[organ], dtype=bool)
            for axis, step in enumerate(step_kji):
                m = np.repeat(m, step, axis=axis) if step > 1 else m
            out[organ] = np.ascontiguousarray(m[: volume.shape[0], : volume.shape[1], : volume.shape[2]])
    return out


def side_masks_for(
    volume: CTVolume, organs: Sequence[str], findings: Any, *, device: str | None = None
) -> dict[str, np.ndarray] | None:
    """The lungs that give each finding its side in the SR when ``organs`` (those the reconstruction was asked
    for) leave out a lung: :func:`lung_side_masks` of ``volume`` on ``device``, segmented for the SR alone (never
    a SEG segment); None when ``organs`` hold both lungs (theirs give the sides) or there is no finding to place."""
    if findings is None or not len(findings) or set(SIDE_ORGANS) <= set(organs):
        return None
    log.info("the organs asked for (%s) leave out a lung: segmenting the lungs for each finding's side", ",".join(organs))
    return lung_side_masks(volume, device=device)


def model_identity(findings: Any) -> tuple[str, str]:
    """(name, version) of the algorithm an SR names: the detector of ``findings`` (``Findings.model``), or the
    reconstruction when there are no findings; the version is ctpipe's (the demo weights ship with it; a bundle's
    own version is part of its model name)."""
    name = str(getattr(findings, "model", "") or "") if findings is not None else ""
    return (name or (RECONSTRUCTION_ALGORITHM if findings is None else "ctpipe detector")), __version__


def write_case_dicom(
    out_dir: str | os.PathLike[str],
    *,
    source: SourceArg,
    volume: CTVolume,
    findings: Any,
    outputs: Sequence[str],
    reconstruction: Any = None,
    nodules: Sequence[Any] | None = None,
    measurements: Mapping[str, Any] | None = None,
    organ_masks: Mapping[str, Any] | None = None,
    side_masks: Mapping[str, Any] | None = None,
    quality: Any = None,
    stem: str | None = None,
    names: Mapping[str, str] | None = None,
    omit_empty_frames: bool = True,
    keep_identifiers: bool = True,
    uid_seed: str | Mapping[str, str] | None = None,
    created: datetime.datetime | None = None,
    stable_uids: bool = False,
) -> dict[str, Path]:
    """Write the ``outputs`` (``"sr"``, ``"seg"``) of one case into ``out_dir``; returns output → path.

    findings: the case's ``Findings`` (its reported findings at its ``score_threshold``, the operating point; None
    when no threshold was applied: every finding), or None when no detector ran. side_masks: the lungs that give each
    finding's side when the organ masks (the SEG's segments) leave one out (:func:`lung_side_masks`). The other
    arguments are those of :func:`~pipeline.dicom_out.api.write_dicom_outputs`. Raises
    :class:`~pipeline.errors.DicomOutputError`.
    """
    if not outputs:
        return {}
    name, version = model_identity(findings)
    threshold = getattr(findings, "score_threshold", None)
    return write_dicom_outputs(
        out_dir,
        source=source,
        volume=volume,
        findings=findings,
        model_name=name,
        model_version=version,
        score_threshold=threshold,
        reconstruction=reconstruction,
        nodules=nodules,
        measurements=measurements,
        organ_masks=organ_masks,
        side_masks=side_masks,
        quality=quality,
        outputs=outputs,
        stem=stem,
        names=names,
        omit_empty_frames=omit_empty_frames,
        keep_identifiers=keep_identifiers,
        uid_seed=uid_seed,
        created=created,
        stable_uids=stable_uids,
    )
