"""``ctpipe reconstruct``: organ masks, meshes, measurements and renderings of one CT series.

With a DICOM source (a DICOM folder, or a cache entry ingested from one) it also writes the DICOM
results, after every other file (a failure to write them loses none of those; exit status 1):
``<stem>_seg.dcm``, a SEG of the organ masks and of the nodule masks of ``--findings``, and
``<stem>_sr.dcm``, a TID 1500 SR of those findings (at the operating point their JSON names) with
the nodules' volumes, the lung volumes, the emphysema index and the quality flags; without
``--findings`` the SR reports the measurements and flags and makes no statement on nodules.
The SEG holds only the ``--organs``; each finding's side in the SR comes from their lungs or, when
they leave out a lung, from the lungs segmented for the SR alone (as ``ctpipe detect`` does).
``--dicom none|sr|seg|sr,seg`` or ``--no-dicom`` chooses them.

The loaders and the reconstruction stage (numpy, torch, pydicom) are imported inside the
command's functions, so ``ctpipe --help`` starts without them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..argtypes import add_keep_identifiers, as_choice, device_name, in_path, number_in, out_path
from ..devices import allowed_devices
from ..dicom_out.kinds import add_dicom_options
from ..errors import CtpipeError, DicomOutputError, UsageError
from .organs import ORGANS

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``reconstruct`` sub-command."""
    p = subparsers.add_parser(
        "reconstruct",
        help="segment, mesh and measure chest organs (STL/PLY/OBJ/GLB, measurements, PNG renderings, DICOM SR and SEG)",
        description=(
            "Reconstruct the body, lungs (left/right), airways and bone of SRC: a DICOM folder or file, a case-cache "
            "entry (<case>.json or <case>.npy written by `ctpipe ingest`) or a NIfTI/MHA/NRRD image. Writes "
            "<stem>_<organ>.<format> meshes in DICOM patient coordinates (LPS, mm), <stem>_measurements.json, "
            "<stem>_labels.npz and PNG renderings into --out, then, for a DICOM source, <stem>_seg.dcm (organ and "
            "--findings nodule masks) and <stem>_sr.dcm (TID 1500: measurements, quality flags and the --findings; "
            "--dicom chooses). It prints each organ's volume and, per --findings finding, its nodule's lung, centre "
            "(LPS mm), diameter, long axis and volume, or why it was not segmented. Exit status 0 done, 1 a bad source "
            "or findings file, no mesh made, or DICOM results not "
            "written (the other files are kept), 2 bad arguments (an unknown option, a value not allowed: an unknown "
            "--formats, --organs or --device, a number out of its range)."
        ),
    )
    p.add_argument(
        "src", metavar="SRC", type=in_path, help="DICOM folder/file, case-cache entry (.npy/.json) or NIfTI/MHA/NRRD image"
    )
    p.add_argument("--out", required=True, type=out_path, help="output folder")
    p.add_argument("--formats", default="stl", help="comma-separated mesh formats: stl,ply,obj,glb (default stl)")
    p.add_argument("--organs", default=",".join(ORGANS), help=f"comma-separated organs (default {','.join(ORGANS)})")
    p.add_argument("--seg-bundle", type=Path, default=None, metavar="PATH", help="MONAI segmentation bundle folder (optional)")
    p.add_argument(
        "--findings",
        type=Path,
        default=None,
        help="findings JSON to segment nodules: what `ctpipe detect` writes, or a list of objects with center_lps "
        "and diameter_mm or box_min_lps/box_max_lps (LPS mm) and score (0-1, for the DICOM results)",
    )
    p.add_argument(
        "--smoothing", type=number_in(int, 0, 500), default=20, help="Taubin smoothing iterations, 0..500 (default 20, 0 = none)"
    )
    p.add_argument(
        "--target-triangles",
        type=number_in(int, 100),
        default=None,
        metavar="N",
        help="at most this many triangles per organ, at least 100 (default: the full-resolution surface)",
    )
    p.add_argument(
        "--device",
        type=device_name,
        default=None,
        metavar="DEV",
        help=f"{allowed_devices()} (default auto)",
    )
    p.add_argument("--no-render", action="store_true", help="skip the PNG renderings")
    p.add_argument("--series-uid", default=None, help="series to load when the DICOM folder holds several")
    p.add_argument(
        "--allow-gantry-tilt",
        action="store_true",
        help="resample a tilted-gantry DICOM series onto an orthogonal grid instead of rejecting it (as ctpipe ingest)",
    )
    p.add_argument(
        "--case-id",
        default=None,
        help="start of the output file names, and the series in the measurements for an image file (default: from the "
        "source: the series UID, the cache entry's name, or for an image file image-<12 hex digits>, a digest of the "
        "image: its file's name, which may be a patient's, only with --keep-identifiers); --findings of an image file "
        "must be of the same --case-id (ctpipe detect --case-id)",
    )
    add_dicom_options(p, default="sr,seg")
    add_keep_identifiers(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``ctpipe reconstruct``, a patient-named source folder shown and written as its token (as ``ctpipe run``), or
    as it is with ``--keep-identifiers``."""
    from ..runner.redact_sources import redacting_sources

    with redacting_sources([args.src], keep_identifiers=args.keep_identifiers):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from ..atomic import check_out_outside_sources, ensure_dir
    from ..detection.cli import check_case_id
    from ..ingest.source import image_named, read_source
    from ..load.base import resolve_device
    from .bundle_seg import read_bundle
    from .export import FORMATS, check_formats
    from .findings_in import findings_of_series, read_findings
    from .stage import reconstruct

    # every input is checked before any work, so a mistake leaves no half-written --out folder
    # auto, gpu: the torch device they stand for ("cuda" or "cpu"), as ctpipe run's --device reads them
    if args.case_id is not None:
        check_case_id(args.case_id)
    device = resolve_device(args.device, where="--device") if args.device is not None else None
    check_out_outside_sources([args.src], args.out, beside="recon")  # else the next scan reads the SEG, SR back
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    try:
        check_formats(formats)
    except CtpipeError as exc:  # named by the flag, not by the library's keyword: a bad argument
        raise UsageError(exc.problem, where="--formats", fix=f"choose from {','.join(FORMATS)}, e.g. --formats stl,glb") from None
    if not formats:
        raise UsageError("names no mesh format", where="--formats", fix=f"choose from {','.join(FORMATS)}")
    # the built-in organs in any letter case, as they are spelt; a segmentation bundle's own names as given
    organs = [as_choice(o.strip(), ORGANS) or o.strip() for o in args.organs.split(",") if o.strip()]
    if not organs:
        raise UsageError("names no organ", where="--organs", fix=f"choose from {','.join(ORGANS)}")
    unknown = [o for o in organs if o not in ORGANS]
    if unknown and args.seg_bundle is None:
        raise UsageError(
            f"unknown organ name(s) {', '.join(unknown)}",
            where="--organs",
            fix=f"choose from {','.join(ORGANS)} (other organs need a segmentation bundle, --seg-bundle)",
        )
    reported = None
    if args.findings is not None:  # the DICOM results report each finding's score: a list must give them then
        from ..dicom_out.case import dicom_source_of

        need_score = bool(args.dicom) and dicom_source_of(args.src) is not None
        _, reported = read_findings(args.findings, need_score=need_score)
    bundle = read_bundle(args.seg_bundle) if args.seg_bundle is not None else None
    volume, stem = read_source(
        args.src, series_uid=args.series_uid, allow_gantry_tilt=args.allow_gantry_tilt, keep_identifiers=args.keep_identifiers
    )
    # an image file's name, which may be a patient's, names the outputs only with --keep-identifiers
    volume, stem = image_named(volume, stem, args.src, case_id=args.case_id, keep_identifiers=args.keep_identifiers)
    stem = args.case_id or stem
    if reported is not None:  # findings of another scan are refused before --out is made
        findings_of_series(reported, volume.series_uid, warn_unknown=False)  # reconstruct() warns of them once
    ensure_dir(args.out)
    rec = reconstruct(
        volume,
        organs=organs,
        findings=reported,
        out_dir=args.out,
        mesh_formats=formats,
        smoothing=args.smoothing,
        target_triangles=args.target_triangles,
        device=device,
        seg_bundle=bundle,
        render=not args.no_render,
        stem=stem,
    )
    organ_meas = rec.measurements.get("organs", {})
    for organ, m in organ_meas.items():
        mesh = rec.meshes.get(organ)
        tri = f"{mesh.n_triangles} triangles" if mesh else "no mesh"
        print(f"{organ:12s} {m['volume_ml']:10.1f} mL  {tri}")
    lungs = rec.measurements.get("lungs")
    if lungs and lungs.get("lungs_total_volume_ml"):
        covers = lungs.get("lungs_total_covers")
        only = f" ({covers} lung only)" if covers in ("left", "right") else ""
        print(
            f"lungs total{only} {_figure(lungs['lungs_total_volume_ml'], '.1f', 'mL')}, emphysema index "
            f"{_figure(lungs.get('emphysema_index_pct'), '.2f', '%')} (< {lungs['emphysema_threshold_hu']:.0f} HU)"
        )
    for line in nodule_lines(rec, metadata=volume.metadata):
        print(line)
    for flag in rec.measurements.get("quality", {}).get("flags", ()):  # the README's quality flags, as ctpipe detect's
        print(f"  {flag['severity']}: {flag['message']} [{flag['code']}]")
    for what, msg in rec.errors.items():
        print(f"ctpipe reconstruct: {what}: {msg}", file=sys.stderr)
    n_files = sum(len(v) for v in rec.files.values())
    print(f"wrote {n_files} files to {args.out}")
    status = 0 if rec.meshes else 1
    return max(status, _write_dicom(args, volume, rec, reported, stem, organs=organs, device=device))


def nodule_lines(rec: Any, *, metadata: Mapping[str, Any] | None = None) -> list[str]:
    """One line per finding of ``--findings`` (``rec``: the :class:`~.stage.Reconstruction`): its number in the
    findings file (1-based: ``ctpipe detect``'s ``#N``), the lung holding it, the segmented nodule's centre (its
    centroid, DICOM patient coordinates LPS, mm), its long and short axis on the slice where it is largest and their
    mean (mm, as Fleischner 2017 and Lung-RADS v2022 size a nodule; the mean also to the nearest mm, as they state it)
    with that slice's number (``metadata``: the series', for its InstanceNumbers), its longest 3-D extent and
    equivalent-sphere diameter (mm, as the SR reports them) and its volume (mL); or why it could not be segmented."""
    import numpy as np

    from ..detection.findings import slice_label, slice_number_source
    from .nodule_geometry import axes_json, boundary_voxels, long_axis_mm, lung_side, nodule_mask, plane_note

    geometry = rec.geometry
    metadata = metadata or {}
    label = slice_label(slice_number_source(metadata, geometry.shape[0]))
    lungs = {o: rec.mask(o) for o in ("lung_left", "lung_right") if o in rec.masks}
    lines = []
    for r in rec.nodules:
        head = f"nodule of finding #{r.index + 1}"
        if r.error is not None or r.volume_mm3 is None or r.diameter_mm is None:
            lines.append(f"{head}: not segmented: {r.error}")
            continue
        centre = np.asarray(r.centroid_lps if r.centroid_lps is not None else r.center_lps, dtype=float)
        missing = [o for o in ("lung_left", "lung_right") if o not in lungs]
        if missing:  # one lung alone cannot tell a nodule of the other from one outside the lungs
            side = f"lung side unknown (no {' or '.join(missing)} mask: --organs, or its segmentation failed)"
        else:
            found = lung_side(centre, geometry, lungs)
            side = f"{found} lung" if found else "outside the lungs"
        nm = nodule_mask(r, geometry)
        voxels = boundary_voxels(nm) if nm is not None else None
        axes = axes_json(r, geometry, metadata)
        if axes["long_axis_mm"] is not None and voxels is not None:
            extent_mm = max(long_axis_mm(voxels, geometry, r.diameter_mm), axes["long_axis_mm"])
            mean = axes["mean_diameter_mm"]
            sizes = (
                f"long axis {axes['long_axis_mm']:.1f} mm, short axis {axes['short_axis_mm']:.1f} mm, "
                f"mean diameter {mean:.1f} mm ({int(np.floor(round(mean, 1) + 0.5))} mm) on {label} {axes['axes_instance_number']}"
                f"{plane_note(axes['axes_plane_tilt_deg'])}, "
                f"3-D extent {extent_mm:.1f} mm"
            )
        else:
            sizes = "long axis n/a, 3-D extent n/a"
        x, y, z = centre
        lines.append(
            f"{head}: {side}, centre LPS ({x:.1f}, {y:.1f}, {z:.1f}) mm, {sizes}, diameter {r.diameter_mm:.1f} mm "
            f"(equivalent sphere), volume {r.volume_mm3 / 1000.0:.2f} mL"
        )
    return lines


def _figure(value: Any, spec: str, unit: str) -> str:
    """A lung figure as the summary prints it: the number and its unit, "n/a" for none, and a figure a quality flag
    makes unreliable (``{"value", "reliable": False, "reason"}``, :func:`.quality.mark_unreliable`) with the reason."""
    if isinstance(value, dict):
        return f"{_figure(value.get('value'), spec, unit)} (unreliable: {value.get('reason')})"
    return "n/a" if value is None else f"{value:{spec}} {unit}"


def _write_dicom(
    args: argparse.Namespace,
    volume: Any,
    rec: Any,
    findings: Any,
    stem: str,
    *,
    organs: list[str],
    device: str | None = None,
) -> int:
    """The SR and SEG (after every other output): 0 when written or not asked for, 1 when they failed.

    The SEG holds the ``organs`` reconstructed; each finding's side in the SR comes from their lungs, or, when
    ``organs`` leave out a lung, from the lungs segmented for the SR alone on ``device`` (torch device; None: CUDA
    when available), as ``ctpipe detect`` does (:func:`~pipeline.dicom_out.case.side_masks_for`)."""
    from ..dicom_out.case import dicom_source_of, side_masks_for, write_case_dicom
    from ..ingest.source import source_shown

    outputs = tuple(args.dicom)
    if not outputs:
        return 0
    source = dicom_source_of(args.src)
    if source is None:
        log.warning(
            "%s is not DICOM (nor a cache entry ingested from DICOM): no DICOM results written",
            source_shown(args.src, case_id=args.case_id, name=stem),
        )
        return 0
    if findings is None and "sr" in outputs:
        log.info("no findings given (--findings): the SR reports the measurements and quality flags, no nodules")
    sides = side_masks_for(volume, organs, findings, device=device) if "sr" in outputs else None
    try:
        paths = write_case_dicom(
            args.out,
            source=source,
            volume=volume,
            findings=findings,
            outputs=outputs,
            reconstruction=rec,
            nodules=rec.nodules,
            side_masks=sides,
            stem=stem,
            stable_uids=True,
        )
    except (DicomOutputError, OSError) as exc:
        print(
            f"ctpipe reconstruct: error: the DICOM results were not written ({exc}); the meshes, measurements and "
            f"renderings are written in {args.out}",
            file=sys.stderr,
        )
        return 1
    if paths:
        print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
