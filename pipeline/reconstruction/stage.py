"""The reconstruction stage: segment → mesh → measure → (nodules) → files and renderings.

Every organ is handled on its own: an organ that cannot be segmented, meshed or
measured gets an entry in :attr:`Reconstruction.errors` and the other organs'
outputs (masks, meshes, measurements, files, renderings) still appear.
All coordinates are DICOM patient coordinates (LPS, mm).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..atomic import atomic_write_bytes
from ..cache import is_plain_file_name, nonfinite_set_to_air
from ..config_schema import SCHEMA
from ..detection.infer_input import clean_volume
from ..devicetime import DeviceTimer
from ..errors import (
    BundleError,
    CtpipeError,
    ReconstructionError,
    described,
    refuse_unexpanded_home,
    require_bool,
    require_path,
)
from ..ingest.api import safe_case_id
from ..ingest.image import label_map_note
from ..intensity import not_hu_hint
from ..load.base import resolve_device
from ..volume import CTVolume, Geometry, LabelMap, default_device, require_volume
from . import export, measure
from .bundle_seg import SegBundle, read_bundle, run_seg_bundle
from .findings_in import findings_of_series
from .mesh import Mesh, mesh_from_mask
from .nodule_geometry import axes_json
from .nodules import NoduleResult, segment_findings
from .organs import ORGANS, organ_names
from .preview import PreviewViews, preview_meshes, preview_views
from .quality import QualityReport, assess_quality, mark_unreliable
from .render import render_all
from .segment import segment_organs

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..detection.findings import Findings

log = logging.getLogger(__name__)

# label values of the combined label map (later entries win where organs overlap)
LABEL_VALUES = {"body": 1, "lung_left": 2, "lung_right": 3, "airway": 4, "bone": 5}


class StageTimer:
    """Seconds per step (:class:`~pipeline.devicetime.DeviceTimer`: on CUDA the work a step queued counts too); a step
    run several times (``measure``: every organ's and the lungs' figures) adds up."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict[str, float] = {}

    def run(self, step: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        clock = DeviceTimer(self.device)
        try:
            with clock:
                return fn(*args, **kwargs)
        finally:
            self.seconds[step] = self.seconds.get(step, 0.0) + clock.seconds


@dataclass
class Reconstruction:
    """Result of :func:`reconstruct` (LPS mm throughout).

    masks: one binary :class:`LabelMap` per organ (``labels={1: organ}``) on the input grid.
    meshes: closed, outward surfaces per organ (vertices LPS mm).
    measurements: ``{"organs": {organ: {...}}, "lungs": {...}, "nodules": [...]}``; ``nonfinite_voxels_set_to_air``:
        how many NaN or infinite voxels were set to -1024 HU (air) before the volume was measured, by the case cache
        when it wrote the case or by :func:`reconstruct` itself (an image file's), 0 when none were.
    files: every file written, by kind ("mesh", "measurements", "render", "mask").
    errors: organ or step → message, for whatever could not be produced.
    seconds: wall time (s) per step: ``segment``, ``seg_bundle``, ``mesh:<organ>``, ``measure``, ``quality``,
        ``nodules``, ``write`` (those that ran); together the reconstruction's time.
    quality: the case's quality flags (:mod:`pipeline.reconstruction.quality`), also under
        ``measurements["quality"]``; lung figures they make meaningless are marked there (see
        :func:`~pipeline.reconstruction.quality.mark_unreliable`). They are the scan's whatever the organs asked for:
        the body and bone they read (the contrast phase, the field of view, metal) are segmented for them when not
        asked for (:data:`QUALITY_ORGANS`), and kept nowhere else.
    nodules: the segmentation of each finding (:class:`~pipeline.reconstruction.nodules.NoduleResult`, masks
        included; their JSON is ``measurements["nodules"]``), empty without findings.
    preview: the 3-D preview's organ views as rendered (:class:`~.preview.PreviewViews`; None when nothing was
        rendered), over which nodules found later are drawn (``ctpipe run`` reconstructs before it detects).

    ``repr()`` is a short summary (one line per organ: voxels, mL, mesh vertex and face counts; the quality
    flags; which outputs failed), not the arrays.
    """

    geometry: Geometry
    masks: dict[str, LabelMap] = field(default_factory=dict)
    meshes: dict[str, Mesh] = field(default_factory=dict)
    measurements: dict[str, Any] = field(default_factory=dict)
    files: dict[str, list[Path]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    quality: QualityReport | None = None
    nodules: list[NoduleResult] = field(default_factory=list)
    preview: PreviewViews | None = None

    def mask(self, organ: str) -> np.ndarray:
        """Boolean mask ``[k, j, i]`` of ``organ`` on :attr:`geometry` (KeyError naming the organs there are when it
        was not produced: not asked for, or its segmentation failed, see :attr:`errors`)."""
        if organ not in self.masks:
            failed = f"; {organ} failed: {self.errors[organ]}" if organ in self.errors else ""
            raise KeyError(
                f"no mask of organ {organ!r}: this reconstruction has {', '.join(self.masks) or 'none'}{failed} "
                "(reconstruct(volume, organs=[...]) names those made)"
            )
        return self.masks[organ].array.astype(bool)

    def label_map(self) -> LabelMap:
        """All organs in one label map (values from :data:`LABEL_VALUES`; later organs win overlaps)."""
        arr = np.zeros(self.geometry.shape, dtype=np.uint8)
        labels = {}
        for organ, value in LABEL_VALUES.items():
            if organ in self.masks:
                arr[self.masks[organ].array.astype(bool)] = value
                labels[value] = organ
        for organ, lm in self.masks.items():
            if organ not in LABEL_VALUES:
                value = max(labels, default=len(LABEL_VALUES)) + 1
                arr[lm.array.astype(bool)] = value
                labels[value] = organ
        return LabelMap(arr, self.geometry, labels=labels)

    def add_file(self, kind: str, path: Path) -> None:
        self.files.setdefault(kind, []).append(Path(path))

    def __repr__(self) -> str:
        sp = ", ".join(f"{s:.3g}" for s in self.geometry.spacing)
        lines = [f"Reconstruction(shape={self.geometry.shape} [k,j,i], spacing=({sp}) mm [i,j,k]"]
        voxel_ml = float(np.prod(self.geometry.spacing)) / 1000.0
        organ_meas = self.measurements.get("organs", {})
        width = max((len(o) for o in self.masks), default=0)
        for organ, lm in self.masks.items():
            meas = organ_meas.get(organ, {})
            voxels = int(meas["voxels"]) if "voxels" in meas else int(np.count_nonzero(lm.array))
            mesh = self.meshes.get(organ)
            surface = f"mesh {mesh.n_vertices:,} vertices, {mesh.n_triangles:,} faces" if mesh is not None else "no mesh"
            lines.append(f"  {organ:<{width}}  {voxels:>11,} voxels  {voxels * voxel_ml:>9.1f} mL  {surface}")
        if not self.masks:
            lines.append("  no organ masks")
        if self.nodules:
            lines.append(f"  nodules: {len(self.nodules)} segmented")
        if self.quality is not None:
            flags = ", ".join(self.quality.codes) or "none"
            lines.append(f"  quality: lungs {self.quality.lung_coverage}, flags: {flags}")
        if self.errors:
            lines.append(f"  errors: {', '.join(self.errors)} (messages in .errors)")
        if self.files:
            lines.append("  files: " + ", ".join(f"{len(v)} {k}" for k, v in self.files.items()))
        return "\n".join(lines) + "\n)"


def _error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, CtpipeError) else f"{type(exc).__name__}: {exc}"


def reconstruct(
    volume: CTVolume,
    *,
    organs: Iterable[str] = ORGANS,
    findings: Findings | Sequence[Any] | pd.DataFrame | str | Path | None = None,
    out_dir: str | Path | None = None,
    mesh_formats: Iterable[str] = ("stl",),
    smoothing: int = 20,
    target_triangles: int | None = None,
    device: str | int | None = None,
    seg_bundle: str | Path | SegBundle | None = None,
    render: bool = True,
    stem: str | None = None,
) -> Reconstruction:
    """Segment, mesh and measure the chest organs of ``volume`` (HU, LPS geometry).

    Parameters
    ----------
    organs: organ names from :data:`ORGANS` (plus any a ``seg_bundle`` provides); one name as a string
        (``"lung_left"``) is that organ alone, several may be separated by commas (``"lung_left,lung_right"``).
    findings: detector findings (LPS centres / boxes, mm) whose nodules are segmented and measured: a
        :class:`~pipeline.detection.Findings` (``detect(volume)``), a list of findings or of dicts with ``center_lps``
        and ``diameter_mm`` or ``box_min_lps``/``box_max_lps``, a findings table (``open_run(...).findings``,
        :func:`~pipeline.dicom_out.read_sr_findings`: ``center_x/y/z``, ``diameter_mm`` or the box), or the path of a
        findings JSON (:func:`~pipeline.reconstruction.findings_in.read_findings`: what ``ctpipe detect`` writes, or a
        list of findings). Each finding is checked before any work (a centre and a positive size). Findings of another
        series than the volume's (their ``series_uid``) are refused; of a table of several series, only the volume's
        rows are used (:func:`~pipeline.reconstruction.findings_in.of_series`).
    out_dir: where to write meshes (``<stem>_<organ>.<fmt>``), ``<stem>_measurements.json``,
        ``<stem>_labels.npz`` and PNG renderings (with ``findings``, the nodules outlined in the MPRs and drawn in the
        3-D preview, and lung-window MPRs through each: ``<stem>_nodule_NN_mpr_<plane>.png``, NN the finding's number
        from 1); nothing is written without it.
    stem: the start of those file names, a plain file name (no path separator, not starting with '.'; default: the
        series UID, path characters replaced), so every file stays in ``out_dir``.
    mesh_formats: any of ``stl``, ``ply``, ``obj``, ``glb``; one as a string (``"ply"``), several as a list or
        separated by commas (``"stl,glb"``).
    smoothing: Taubin smoothing iterations, 0..500 (0 = raw marching cubes).
    target_triangles: cap on triangles per organ, at least 100 (coarser surface extraction), None = full resolution.
    device: torch device for segmentation: a device name of :mod:`pipeline.devices` (``"auto"``, ``"cpu"``, ``"gpu"``
        or ``"cuda"``, ``"cuda:N"``) or N (GPU N) ("cuda" when present by default).
    seg_bundle: a MONAI segmentation bundle folder whose labels replace or add organs (or the bundle
        :func:`~pipeline.reconstruction.bundle_seg.read_bundle` read). A bundle that cannot segment (its network fails
        to load or to run) or labels it cannot name are reported in ``errors`` and the classical organs stay.

    Raises :class:`~pipeline.errors.ReconstructionError` for an unknown organ name (listing the known ones)
    or mesh format, a ``smoothing`` or ``target_triangles`` out of range, a ``stem`` that is not a plain file name, a ``render`` that is not True or False, an
    ``out_dir`` starting with ``~`` (not expanded: a :class:`~pipeline.errors.CtpipeError`), a ``device`` that is unknown or absent (a
    :class:`~pipeline.errors.LoaderError`), a finding without a usable centre and size, or findings of another series;
    :class:`~pipeline.errors.BundleError` for a
    ``seg_bundle`` that does not exist or is not a bundle (no ``configs/metadata.json``, ``models/model.ts``).
    Both are raised before any work, as is :class:`~pipeline.errors.InvalidVolumeError` naming the case for a
    volume of which more than :data:`~pipeline.cache.MAX_NONFINITE_FRACTION` of the voxels are NaN or infinite (fewer are
    set to -1024 HU, air, with a warning naming the case and the count, as ``detect`` does: the caller's volume is
    left as it is). Values that cannot be HU (none below 0: stored pixel values, intensities normalised to
    0..1) find no lungs; the ``lungs_absent`` quality flag, the lungs' errors and the log then say so. A volume
    ``load_series`` loaded from a label map (its warning in ``metadata["warnings"]``) is reconstructed as given, with
    that warning logged again.
    """
    volume = require_volume(volume)
    require_bool(render, name="render", error=ReconstructionError)
    formats = export.check_formats(mesh_formats)
    _check_mesh_options(smoothing, target_triangles)
    organs = organ_names(organs)
    dev = torch.device(resolve_device(device, where="device") if device not in (None, "") else default_device())
    timer = StageTimer(dev)
    rec = Reconstruction(geometry=volume.geometry, seconds=timer.seconds)
    if stem is not None and not isinstance(stem, str):  # a case number, say: said now, not after the segmentation
        raise ReconstructionError(
            f"must be text, got {described(stem)}",
            where="stem",
            fix=f"pass the start of the file names as a str, e.g. stem='case_{stem}'",
        )
    if stem is not None and not is_plain_file_name(stem):  # it names files: a path would write outside out_dir
        raise ReconstructionError(
            f"stem={stem!r} is not a plain file name",
            where="stem",
            fix="give a name without '/' or '\\' that does not start with '.': it starts each file's name in out_dir",
        )
    if out_dir is not None:  # said now, not after the segmentation
        require_path(
            out_dir, where="out_dir", error=ReconstructionError, what="a folder", fix="pass a folder, e.g. out_dir='recon'"
        )
        refuse_unexpanded_home(out_dir, what="out_dir")
    where = stem or volume.series_uid or "volume"
    stem = stem or volume.series_uid or "case"
    if note := label_map_note(volume.metadata):  # load_series warned once; the organs would be of label values
        log.warning("%s: its values are taken as HU, but it was loaded from a label map: %s", where, note)
    if not is_plain_file_name(stem):  # a series UID no DICOM file would hold: its files still stay in out_dir
        stem = safe_case_id(stem)
    classical = [o for o in organs if o in ORGANS]
    if seg_bundle is None and len(classical) != len(organs):
        raise ReconstructionError(
            f"unknown organ name(s) {sorted(set(organs) - set(ORGANS))}; the organs are {', '.join(ORGANS)}",
            where="organs",
            fix=f"choose from {list(ORGANS)}, e.g. organs=['lung_left', 'lung_right'] "
            "(other organs need a segmentation bundle: seg_bundle=..., --seg-bundle on the command line)",
        )
    if seg_bundle is not None and not isinstance(seg_bundle, SegBundle):
        require_path(
            seg_bundle,
            where="seg_bundle",
            error=BundleError,
            what="a MONAI bundle folder",
            fix="pass the segmentation bundle's folder (or the bundle read_bundle read), or leave seg_bundle out",
        )
    nodule_findings = findings_of_series(findings, volume.series_uid)
    bundle = None if seg_bundle is None else seg_bundle if isinstance(seg_bundle, SegBundle) else read_bundle(seg_bundle)
    # NaN or infinite voxels (an image file's; those the case cache set to air when it wrote the case) as ctpipe
    # detect takes them: a few set to air and said, more refused by name
    volume = clean_volume(volume, where)
    rec.measurements["nonfinite_voxels_set_to_air"] = nonfinite_set_to_air(volume.metadata)
    # the quality report reads the body and bone masks too (contrast without the bone it would take for blood, the
    # body's cut by the field of view, metal): segmented for it when not asked for, so it is the scan's whatever the
    # organs, and given only to it
    for_quality = [o for o in QUALITY_ORGANS if o not in classical]
    seg = timer.run("segment", segment_organs, volume, organs=[*classical, *for_quality], device=dev)
    quality_masks: dict[str, np.ndarray] = dict(seg.masks)
    masks: dict[str, np.ndarray] = {o: m for o, m in seg.masks.items() if o not in for_quality}
    rec.info.update({k: v for k, v in seg.info.items() if k not in for_quality})
    for organ, exc in seg.errors.items():
        if organ not in for_quality:
            rec.errors[organ] = _error_text(exc)
    if bundle is not None:
        try:
            bundle_masks, bundle_errors = timer.run("seg_bundle", run_seg_bundle, volume, bundle, device=dev)
        except CtpipeError as exc:
            rec.errors["seg_bundle"] = _error_text(exc)
        else:
            rec.errors.update(bundle_errors)
            for organ, m in bundle_masks.items():
                masks[organ] = m
                rec.errors.pop(organ, None)
    for organ, m in masks.items():
        rec.masks[organ] = LabelMap(m, volume.geometry, labels={1: organ})

    organ_meas: dict[str, Any] = {}
    for organ, m in masks.items():
        try:
            rec.meshes[organ] = timer.run(
                f"mesh:{organ}",
                mesh_from_mask,
                m,
                volume.geometry,
                name=organ,
                smoothing_iterations=smoothing,
                target_triangles=target_triangles,
            )
        except ReconstructionError as exc:
            rec.errors[organ] = _error_text(exc)
        organ_meas[organ] = timer.run("measure", measure.organ_measurements, m, volume.geometry, mesh=rec.meshes.get(organ))
    rec.measurements["organs"] = organ_meas
    quality = timer.run(
        "quality",
        assess_quality,
        np.asarray(volume.array),
        volume.geometry,
        {**quality_masks, **masks},
        metadata=volume.metadata,
        airway_in_scan=_airway_in_scan(seg.info, organs),
        lungs=[o for o in organs if o in ("lung_left", "lung_right")],
    )
    if quality.lungs_absent:
        quality = _with_not_hu_hint(quality, volume, where)
    rec.quality = quality
    rec.measurements["quality"] = quality.to_json()
    if any(o in organs for o in ("lung_left", "lung_right")):
        one_lung = quality.has("one_lung") and {"lung_left", "lung_right"} <= set(organs)
        lungs = timer.run(
            "measure", measure.lung_measurements, np.asarray(volume.array), masks, volume.geometry, one_lung=one_lung
        )
        rec.measurements["lungs"] = mark_unreliable(lungs, quality)
    if nodule_findings:
        results = timer.run("nodules", segment_findings, volume, nodule_findings, lung_mask=_lungs(masks))
        rec.nodules = list(results)
        rec.measurements["nodules"] = [r.to_json() | axes_json(r, volume.geometry, volume.metadata) for r in results]
        for r in results:
            if r.error:
                rec.errors[f"nodule:{r.index}"] = r.error
    if out_dir is not None:
        timer.run("write", _write_outputs, rec, volume, Path(out_dir), stem, formats, render, where)
    rec.measurements["errors"] = dict(rec.errors)
    log.info(
        "reconstruction of %s: %d organs meshed, %d errors, %.2f s",
        where,
        len(rec.meshes),
        len(rec.errors),
        sum(rec.seconds.values()),
    )
    return rec


def _check_mesh_options(smoothing: Any, target_triangles: Any) -> None:
    """:class:`ReconstructionError` naming ``smoothing`` or ``target_triangles`` when it is not a whole number in the
    range ``reconstruct.smoothing_iterations`` / ``reconstruct.target_triangles`` take in the configuration."""
    for name, value, option in (
        ("smoothing", smoothing, SCHEMA["reconstruct"]["smoothing_iterations"]),
        ("target_triangles", target_triangles, SCHEMA["reconstruct"]["target_triangles"]),
    ):
        if value is None and option.nullable:
            continue
        whole = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
        if whole and (option.lo is None or value >= option.lo) and (option.hi is None or value <= option.hi):
            continue
        span = f"{option.lo:g}..{option.hi:g}" if option.hi is not None else f"{option.lo:g} or more"
        default = "None (full resolution)" if option.nullable else f"{option.default}"
        raise ReconstructionError(
            f"{name}={value!r} is not a whole number of {option.unit} in {span}",
            where=name,
            fix=f"pass {name}=<{span}> (default {default})",
        )


def _with_not_hu_hint(quality: QualityReport, volume: CTVolume, where: str) -> QualityReport:
    """``quality`` with :func:`~pipeline.intensity.not_hu_hint` added to its ``lungs_absent`` flag (and logged),
    when the volume's values cannot be HU; else ``quality`` itself."""
    hint = not_hu_hint(volume.array)
    if not hint:
        return quality
    log.warning("%s: no lungs found%s", where, hint)
    flags = tuple(replace(f, message=f.message + hint) if f.code == "lungs_absent" else f for f in quality.flags)
    return replace(quality, flags=flags)


#: Organs the quality report reads beyond the lungs (:func:`~pipeline.reconstruction.quality.assess_quality`).
QUALITY_ORGANS = ("body", "bone")


def _airway_in_scan(info: Mapping[str, Any], organs: Sequence[str]) -> bool | None:
    """False when the segmentation found no trachea in the field of view; None when not asked or it failed."""
    if "airway" not in organs:
        return None
    state = info.get("airway")  # "found", "not_in_scan" or "failed" (segment_organs)
    return None if state in (None, "failed") else state != "not_in_scan"


def _lungs(masks: Mapping[str, np.ndarray]) -> np.ndarray | None:
    parts = [masks[o] for o in ("lung_left", "lung_right") if o in masks]
    if not parts:
        return None
    return np.logical_or.reduce(parts)


def _write_outputs(
    rec: Reconstruction, volume: CTVolume, out: Path, stem: str, formats: Sequence[str], render: bool, where: str
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for organ, mesh in rec.meshes.items():
        for fmt in formats:
            try:
                rec.add_file("mesh", export.write_mesh(mesh, out, fmt=fmt, stem=stem))
            except OSError as exc:
                rec.errors[f"{organ}.{fmt}"] = f"{out}: could not write the {fmt} mesh ({exc})"
    if rec.masks:
        lm = rec.label_map()
        buf = io.BytesIO()
        np.savez_compressed(
            buf,
            labels=lm.array,
            geometry=json.dumps(lm.geometry.to_json()),
            names=json.dumps({str(k): v for k, v in lm.labels.items()}),
        )
        path = out / f"{stem}_labels.npz"
        atomic_write_bytes(path, buf.getvalue())
        rec.add_file("mask", path)
    if render:
        try:
            masks = {o: lm.array.astype(bool) for o, lm in rec.masks.items()}
            if rec.meshes:
                rec.preview = preview_views(preview_meshes(rec.meshes, masks, volume.geometry))
            for path in render_all(volume, masks, rec.meshes, out, stem=stem, nodules=rec.nodules, preview=rec.preview):
                rec.add_file("render", path)
        except (CtpipeError, ValueError, OSError) as exc:
            rec.errors["render"] = _error_text(exc)
    meas = dict(rec.measurements)
    meas["errors"] = dict(rec.errors)
    meas["case"] = where
    meas["coordinates"] = "DICOM patient coordinates (LPS), mm"
    meas["files"] = {k: [p.name for p in v] for k, v in rec.files.items()}
    path = out / f"{stem}_measurements.json"
    atomic_write_bytes(path, json.dumps(meas, indent=1, default=float).encode())
    rec.add_file("measurements", path)
