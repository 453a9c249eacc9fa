#!/usr/bin/env python
"""ctpipe's lung and airway segmentation on the shared real CT scans, against their references.

Reads every scan in ``../shared/real_ct`` (beside the checkout; ``--root`` elsewhere), runs
``segment_organs`` (lungs and airway) on it and prints one row per scan: Dice per lung side
against the reference (where it has lungs), mL of reference stomach/bowel/colon labelled lung,
lung and airway volumes (mL), the lungs' LPS x centroids (the patient's left is +x), the lowest
lung z against the reference's, flags and seconds. ``--png DIR`` writes lung-window MPR overlays
(axial, coronal, sagittal; ctpipe's masks solid, the reference dashed) for a visual check.

``--bone`` segments bone too and prints a second table: bone mL on every scan and, on the scans with
TotalSegmentator labels, Dice against all bone labels and against the spine, sacrum and ribs, precision
(the share of ctpipe's bone on bone labels), recall per structure (vertebrae, sacrum, ribs, hips) and
the mL of ctpipe's bone on labelled organs that hold none (kidneys, bowel, heart and vessels, liver and
spleen), more than one voxel from a bone label: stones, plaque or contrast taken for bone.

    python scripts/eval_real_ct.py [--root ../shared/real_ct] [--bone] [--png /tmp/real_ct] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.devicetime import DeviceTimer  # noqa: E402
from pipeline.reconstruction.render import lps_aligned  # noqa: E402
from pipeline.reconstruction.segment import segment_organs  # noqa: E402
from tests._support.real_ct import (  # noqa: E402
    CASES,
    REAL_CT_DIR,
    TS_ALL_BONE,
    TS_BONE_RECALL,
    TS_NOT_BONE,
    TS_SPINE_RIBS,
    RealCase,
    totalseg_labels,
)

ORGANS = ("lung_left", "lung_right", "airway")
LUNG_WINDOW = (-1350.0, 150.0)
COLORS = {"lung_left": "#3fa7ff", "lung_right": "#39d98a", "airway": "#ff7f0e", "gas_organs": "#ff3df5"}


def dice(a: np.ndarray, b: np.ndarray) -> float:
    denom = int(a.sum()) + int(b.sum())
    return 1.0 if denom == 0 else 2.0 * float((a & b).sum()) / denom


def bone_row(case: RealCase, bone: np.ndarray, root: Path) -> dict[str, Any]:
    """Bone mL and, where the scan has TotalSegmentator labels, bone Dice, precision, recall per structure, stray mL."""
    from scipy import ndimage

    voxel_ml = float(np.prod(case.volume.geometry.spacing)) / 1000.0
    row: dict[str, Any] = {"scan": case.name, "bone_ml": round(float(bone.sum()) * voxel_ml, 1)}
    labels = totalseg_labels(case, root)
    if labels is None:
        return row
    all_bone, spine_ribs = np.isin(labels, TS_ALL_BONE), np.isin(labels, TS_SPINE_RIBS)
    row["dice_bone"] = round(dice(bone, all_bone), 4)
    row["dice_spine_ribs"] = round(dice(bone, spine_ribs), 4)
    row["precision"] = round(float((bone & all_bone).sum()) / max(1, int(bone.sum())), 4)
    for name, ids in TS_BONE_RECALL.items():
        structure = np.isin(labels, ids)
        row[f"recall_{name}"] = round(float(bone[structure].mean()), 4) if structure.any() else None
    near_bone = ndimage.binary_dilation(all_bone)
    for organ, ids in TS_NOT_BONE.items():
        row[f"{organ}_ml"] = round(float((bone & np.isin(labels, ids) & ~near_bone).sum()) * voxel_ml, 2)
    return row


def _print_table(table: list[list[str]]) -> None:
    """Print ``table`` (its first row the header) in aligned columns: the first left-aligned, the rest right."""
    widths = [max(len(t[n]) for t in table) for n in range(len(table[0]))]
    for n, t in enumerate(table):
        print("  ".join(s.rjust(w) if i else s.ljust(w) for i, (s, w) in enumerate(zip(t, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def print_bone_table(rows: list[dict[str, Any]]) -> None:
    cols = ["scan", "bone_ml", "dice_bone", "dice_spine_ribs", "precision"]
    cols += [f"recall_{n}" for n in TS_BONE_RECALL] + [f"{o}_ml" for o in TS_NOT_BONE]
    table = [cols] + [[_fmt(r.get(c)) for c in cols] for r in rows]
    _print_table(table)


def evaluate(case: RealCase, device: str, *, bone: bool = False) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Segment one scan and measure it against its reference; returns (row, masks); ``bone``: segment bone too."""
    g = case.volume.geometry
    voxel_ml = float(np.prod(g.spacing)) / 1000.0
    organs = (*ORGANS, "bone") if bone else ORGANS
    with DeviceTimer(device) as clock:  # on a GPU: until the work the segmentation queued is done
        seg = segment_organs(case.volume, organs=organs, device=device)
    seconds = clock.seconds
    masks = {o: seg.masks.get(o, np.zeros(g.shape, dtype=bool)) for o in organs}
    lungs = masks["lung_left"] | masks["lung_right"]
    row: dict[str, Any] = {"scan": case.name, "shape_kji": list(g.shape), "seconds": round(seconds, 2)}
    for o in ORGANS:
        row[f"{o}_ml"] = round(float(masks[o].sum()) * voxel_ml, 1)
    for side in ("lung_left", "lung_right"):
        row[f"{side}_x_mm"] = round(float(g.centroid_lps(masks[side])[0]), 1) if masks[side].any() else None
    ref = case.reference
    for side in ("lung_left", "lung_right"):
        if side in ref:
            row[f"dice_{side}"] = round(dice(masks[side], ref[side]), 4) if ref[side].any() else None
            row[f"ref_{side}_ml"] = round(float(ref[side].sum()) * voxel_ml, 1)
    if "lung_left" in ref and "lung_right" in ref:
        both = ref["lung_left"] | ref["lung_right"]
        row["dice_lungs"] = round(dice(lungs, both), 4)
        row["lung_outside_ref_ml"] = round(float((lungs & ~both).sum()) * voxel_ml, 1)
        row["swapped_ml"] = round(
            float((masks["lung_left"] & ref["lung_right"]).sum() + (masks["lung_right"] & ref["lung_left"]).sum()) * voxel_ml, 1
        )
    if "gas_organs" in ref:
        row["gas_organs_as_lung_ml"] = round(float((lungs & ref["gas_organs"]).sum()) * voxel_ml, 2)
    row["flags"] = {k: v for k, v in seg.info.items() if isinstance(v, str) and not k.startswith("work_")}
    row["errors"] = {k: str(v) for k, v in seg.errors.items()}
    return row, masks


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 2 else f"{v:.1f}"
    return str(v)


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = [
        "scan",
        "dice_lung_left",
        "dice_lung_right",
        "dice_lungs",
        "swapped_ml",
        "gas_organs_as_lung_ml",
        "lung_outside_ref_ml",
        "lung_left_ml",
        "ref_lung_left_ml",
        "lung_right_ml",
        "ref_lung_right_ml",
        "airway_ml",
        "lung_left_x_mm",
        "lung_right_x_mm",
        "seconds",
    ]
    head = [
        "scan",
        "Dice L",
        "Dice R",
        "Dice both",
        "swap mL",
        "gut→lung mL",
        "extra mL",
        "L mL",
        "ref L",
        "R mL",
        "ref R",
        "airway mL",
        "L x",
        "R x",
        "s",
    ]
    table = [head] + [[_fmt(r.get(c)) for c in cols] for r in rows]
    _print_table(table)
    for r in rows:
        notes = {**r["flags"], **r["errors"]}
        if notes:
            print(f"{r['scan']}: " + "; ".join(f"{k}={v}" for k, v in notes.items()))


def write_png(case: RealCase, masks: dict[str, np.ndarray], out: Path) -> Path:
    """Lung-window axial (4 levels), coronal and sagittal slices with outlines; radiological display."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    g = case.volume.geometry
    view, sp, _lo = lps_aligned(np.asarray(case.volume.array, dtype=np.float32), g)  # [z, y, x], LPS ascending
    ours = {k: lps_aligned(m, g)[0] for k, m in masks.items() if m.any()}
    refs = {k: lps_aligned(m, g)[0] for k, m in case.reference.items() if m.any()}
    lung = np.logical_or.reduce([m for k, m in {**ours, **refs}.items() if k.startswith("lung")]) if ours or refs else None
    nz, ny, nx = view.shape
    if lung is not None and lung.any():
        zs = np.nonzero(lung.any(axis=(1, 2)))[0]
        cy, cx = (int(round(c)) for c in np.argwhere(lung).mean(axis=0)[1:])
        levels = [int(zs[0] + f * (zs[-1] - zs[0])) for f in (0.1, 0.4, 0.7, 0.95)]
    else:
        cy, cx = ny // 2, nx // 2
        levels = [int(f * (nz - 1)) for f in (0.1, 0.4, 0.7, 0.95)]
    # radiological: axial rows = y (anterior at the top), columns = x ascending (the patient's right on image left)
    planes: list[tuple[str, Any, tuple[float, float]]] = []
    for z in levels[::-1]:
        planes.append((f"axial z#{z}", lambda a, z=z: a[z], (sp[1], sp[0])))
    planes.append((f"coronal y#{cy}", lambda a: a[:, cy, :][::-1], (sp[2], sp[0])))
    planes.append((f"sagittal x#{cx}", lambda a: a[:, :, cx][::-1], (sp[2], sp[1])))
    fig = Figure(figsize=(18, 10), dpi=90, facecolor="black")
    for n, (title, take, (rs, cs)) in enumerate(planes):
        ax = fig.add_subplot(2, 3, n + 1)
        img = take(view)
        extent = (0, img.shape[1] * cs, img.shape[0] * rs, 0)
        ax.imshow(img, cmap="gray", vmin=LUNG_WINDOW[0], vmax=LUNG_WINDOW[1], extent=extent, interpolation="nearest")
        for style, group in (("solid", ours), ("dashed", refs)):
            for k, m in group.items():
                sl = take(m).astype(np.float32)
                if sl.any() and not sl.all():
                    xs = (np.arange(sl.shape[1]) + 0.5) * cs
                    ys = (np.arange(sl.shape[0]) + 0.5) * rs
                    ax.contour(xs, ys, sl, levels=[0.5], colors=[COLORS.get(k, "#ffffff")], linewidths=1.0, linestyles=style)
        ax.set_title(f"{case.name} {title} (R on image left)", color="white", fontsize=9)
        ax.set_axis_off()
    fig.suptitle(
        "solid: ctpipe (blue left lung, green right, orange airway); dashed: reference (magenta gut)", color="white", fontsize=10
    )
    FigureCanvasAgg(fig)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{case.name}.png"
    fig.savefig(path, facecolor="black")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=REAL_CT_DIR, help="the shared real CT folder")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cases", nargs="*", choices=sorted(CASES), help="only these scans")
    ap.add_argument("--bone", action="store_true", help="segment bone too and measure it against TotalSegmentator's labels")
    ap.add_argument("--png", type=Path, help="write MPR overlays here")
    ap.add_argument("--json", type=Path, help="write the rows as JSON here")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if not (args.root / "README.md").is_file():
        print(f"{args.root}: not found (the shared real CT folder beside the checkout); pass --root", file=sys.stderr)
        return 2
    rows, bone_rows = [], []
    for name in args.cases or list(CASES):
        case = CASES[name](args.root)
        row, masks = evaluate(case, args.device, bone=args.bone)
        rows.append(row)
        if args.bone:
            bone_rows.append(bone_row(case, masks.pop("bone", np.zeros(case.volume.geometry.shape, dtype=bool)), args.root))
            row["bone"] = bone_rows[-1]
        if args.png:
            row["png"] = str(write_png(case, masks, args.png))
    print_table(rows)
    if bone_rows:
        print()
        print_bone_table(bone_rows)
    if args.png:
        print("PNGs: " + ", ".join(r["png"] for r in rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
