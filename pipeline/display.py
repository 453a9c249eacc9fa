"""``show``: draw an axial plane of a CT volume with findings and organ outlines (matplotlib).

It is ``pipeline.show``; the module has another name than the function, so that importing the module never hides the
function (``ctp.show(vol)`` after ``import pipeline.show`` called the module).

The plane is drawn in the radiological convention whatever the series' storage order (a NIfTI file in RAS
order, a feet-first or prone series): seen from the feet, the patient's right on the image's left and anterior
at the top, edges lettered R, L, A, P. The voxels are transposed and flipped only
(:meth:`pipeline.geometry.Geometry.to_lps_view`), and the findings (LPS mm) and organ masks follow the same mapping.
An oblique series (a gantry-tilt corrected series, an oblique acquisition) is resampled onto patient axes first, as
the renderings resample it (:func:`~pipeline.reconstruction.render_planes.to_patient_axes`): the plane drawn is a true
axial plane, where its letters and title say.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .detection.findings import slice_label, slice_number_of, slice_number_source
from .dicom_out.model import stated_score
from .errors import DisplayArgumentError, GeometryError
from .reconstruction.findings_in import check_findings, given_findings, of_series, series_uid_of, unknown_series_note
from .reconstruction.organs import organ_colours, organ_label
from .reconstruction.render_layout import outline_halo, scale_bar_mm, side_labelled_bar, window_note
from .reconstruction.render_planes import (
    OBLIQUE_DEG,
    OUTSIDE_SCAN,
    OUTSIDE_SCAN_LEGEND,
    OUTSIDE_SCAN_RGB,
    oblique_deg,
    patient_axes_grid,
    resampled_note,
    to_patient_axes,
)
from .volume import CTVolume, Geometry, LabelMap, require_volume

log = logging.getLogger(__name__)

#: Orientation letters of the axial view beside the image's sides (axes fraction x, y): the patient's right in the
#: margin left of the image, left in the margin on its right.
EDGE_LETTERS = (("R", 0.025, 0.5), ("L", 0.975, 0.5))
#: Anterior above the image and posterior below it, each :data:`LETTER_GAP_PT` points off its edge: on no anatomy,
#: where the body fills the field of view to its upper or lower edge.
TOP_BOTTOM_LETTERS = (("A", True), ("P", False))
LETTER_FONTSIZE = 9  # points, the orientation letters
LETTER_GAP_PT = 3.0  # points between the image's edge and the A or P letter's box
#: Points the title is raised and the legend lowered by, to make room for the A and P letters.
LETTER_ROOM_PT = LETTER_FONTSIZE + 2 * LETTER_GAP_PT + 4.0
_LETTER_BOX = {"facecolor": "black", "alpha": 0.6, "pad": 1.0, "linewidth": 0.0}


@dataclass(frozen=True)
class _Row:
    """One finding to draw: centre (LPS mm), diameter (mm), score (NaN when none), its series UID (None: unknown)."""

    centre: np.ndarray
    diameter_mm: float
    score: float
    series_uid: str | None


def _field(finding: Any, key: str) -> Any:
    """``finding[key]`` of a dict, else the attribute ``key`` of a Finding (None when absent)."""
    return finding.get(key) if isinstance(finding, Mapping) else getattr(finding, key, None)


def _table_diameter(row: Any) -> float:
    """A table row's ``diameter_mm``; where it is missing or NaN (an SR read back by
    :func:`~pipeline.dicom_out.read_sr_findings` states no size for an unsegmented finding), the equivalent diameter
    of its box (``box_min/max_x/y/z``, LPS mm), as a finding's own; 0 when neither is known (a point)."""
    diameter = float(getattr(row, "diameter_mm", np.nan))
    if np.isfinite(diameter):
        return diameter
    lo = np.array([getattr(row, f"box_min_{a}", np.nan) for a in "xyz"], float)
    hi = np.array([getattr(row, f"box_max_{a}", np.nan) for a in "xyz"], float)
    from_box = float(np.cbrt(np.prod(hi - lo)))
    return from_box if np.isfinite(from_box) and from_box > 0 else 0.0


def _table_score(row: Any) -> float:
    value = getattr(row, "score", None)
    return np.nan if value is None else float(value)


def _finding_rows(findings: Any) -> list[_Row]:
    """The findings given as :class:`~pipeline.detection.Findings`, a Finding/dict or a list of them (checked: a centre
    and a positive size), the path of a findings JSON, or a DataFrame (``open_run(...).findings``: ``center_x/y/z`` LPS
    mm, ``diameter_mm``, ``score``, ``series_uid``), of any series (:func:`_same_series` picks the volume's)."""
    if findings is None:
        return []
    if hasattr(findings, "columns"):  # a DataFrame
        uids = findings["series_uid"] if "series_uid" in findings.columns else [None] * len(findings)
        return [
            _Row(np.array([r.center_x, r.center_y, r.center_z], float), _table_diameter(r), _table_score(r), series_uid_of(u))
            for r, u in zip(findings.itertuples(), uids)
        ]
    items, uids = given_findings(findings)
    items = check_findings(items)  # a centre and a positive size (LPS mm), as reconstruct checks them; a box alone gives both
    out = []
    for f, uid in zip(items, uids):
        score = _field(f, "score")
        out.append(
            _Row(
                np.asarray(_field(f, "center_lps"), float),
                float(_field(f, "diameter_mm")),
                np.nan if score is None else float(score),
                uid,
            )
        )
    return out


def _same_series(volume: CTVolume, rows: list[_Row], findings: Any) -> list[_Row]:
    """The findings of ``volume``'s series (:func:`~pipeline.reconstruction.findings_in.of_series`): findings of
    another series are refused (circles drawn on this anatomy would point at another patient's nodules); of a run's
    table of several cases only this series' are kept. Findings without a series UID, or a volume without one, cannot
    be checked: a warning says so, why they carry none and the fix (``findings``: as the caller gave them)."""
    return of_series(
        rows,
        [r.series_uid for r in rows],
        volume.series_uid,
        consequence="drawn on this volume they would mark another scan",
        error=GeometryError,
        unknown_note=unknown_series_note(findings),
    )


def _masks(recon: Any) -> dict[str, np.ndarray]:
    if recon is None:
        return {}
    if isinstance(recon, LabelMap):
        return {name: recon.array == value for value, name in recon.labels.items()}
    masks = getattr(recon, "masks", recon)
    if not isinstance(masks, Mapping):
        shape = f" of shape {np.shape(masks)}" if isinstance(masks, np.ndarray) else f" {masks!r:.80}"
        raise DisplayArgumentError(
            f"recon= must be a Reconstruction, a LabelMap or a dict of bool masks [k, j, i] on the volume's grid, "
            f"got {type(recon).__name__}{shape}: pass a dict naming each mask, e.g. recon={{'lesion': mask}} "
            "(the name labels its outline)"
        )
    return {k: (v.array.astype(bool) if isinstance(v, LabelMap) else np.asarray(v, bool)) for k, v in masks.items()}


def _not_axes(ax: Any) -> str:
    """What ``ax`` is and how to pass one Axes of it: an array of Axes (``plt.subplots(1, 2)``), a Figure, ..."""
    if isinstance(ax, np.ndarray):
        return f"ndarray of {ax.size} Axes: pass one of them, e.g. ax=axes[0]"
    if hasattr(ax, "gca"):
        return f"{type(ax).__name__}: pass one of its Axes, e.g. ax=fig.gca() or ax=fig.add_subplot()"
    return f"{type(ax).__name__} {ax!r:.80}: pass the Axes to draw in (fig, ax = plt.subplots()) or leave ax out"


def _series_label(volume: CTVolume) -> str:
    """A short name of the series: its SeriesNumber and SeriesDescription, else the end of its UID."""
    number, text = volume.metadata.get("SeriesNumber"), str(volume.metadata.get("SeriesDescription") or "").strip()
    parts = ([f"series {number}"] if number not in (None, "") else []) + ([text] if text else [])
    if not parts and volume.series_uid:
        uid = volume.series_uid
        parts = [f"series {uid}" if len(uid) <= 12 else f"series …{uid[-12:]}"]
    return " ".join(parts)


def _whole(value: Any, name: str, what: str) -> int:
    """``value`` as an int (a Python or NumPy integer, or a float that is one: a pandas column with gaps holds its
    numbers as floats); TypeError naming ``name=`` and ``what`` it is otherwise."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        raise DisplayArgumentError(f"{name}={value!r} is not a whole number: pass {what} as an int") from None


def _slice_k(volume: CTVolume, slice: int | None, k: int | None) -> int | None:
    """The array index k that ``slice=`` (the slice number findings give: InstanceNumber, else k + 1) or ``k=``
    names; None when neither is given."""
    nk = volume.shape[0]
    if slice is not None and k is not None:
        raise DisplayArgumentError(
            f"pass slice= (the slice number the findings give: InstanceNumber) or k= (the array index), not both "
            f"(got slice={slice}, k={k})"
        )
    if k is not None:
        k = _whole(k, "k", "the array index of volume.array[k], from 0")
        if not 0 <= k < nk:
            raise DisplayArgumentError(f"k={k} is outside the volume's {nk} slices (k = 0..{nk - 1})")
        return k
    if slice is None:
        return None
    slice = _whole(slice, "slice", "the slice number a viewer and the findings' slice_number give (its InstanceNumber)")
    source = slice_number_source(volume.metadata, nk)
    label = slice_label(source)
    numbers = [slice_number_of(kk, volume.metadata, nk) for kk in range(nk)]
    matches = [kk for kk, n in enumerate(numbers) if n == slice]
    if not matches:
        how = (
            "slice= counts from 1 (k + 1) as the series has no InstanceNumbers"
            if source == "index + 1"
            else f"slice= is the {label}; k= takes the array index"
        )
        raise DisplayArgumentError(
            f"{label} {slice} is not in this series: its {nk} slices have {label}s {min(numbers)}..{max(numbers)} ({how})"
        )
    if len(matches) > 1:
        raise DisplayArgumentError(f"{label} {slice} names {len(matches)} slices of this series (k = {matches}): pass k= instead")
    return matches[0]


def _plane(volume: CTVolume, k: int | None, scored_z: list[tuple[float, float]]) -> tuple[int, int | None]:
    """The axial plane to draw, as an index z of :meth:`~pipeline.geometry.Geometry.to_lps_view`'s ``[z, y, x]``, and
    its array index k (None for a series whose slices are not axial): slice ``k`` when given, else the plane of the
    highest-scoring finding (``scored_z``: score and view z of each), else the middle plane."""
    geometry = volume.geometry
    amap = geometry.axis_map()  # (LPS axis, sign) of index axes i, j, k
    axial = amap[2][0] == 2  # index axis k runs along the patient's long axis (LPS z)
    nz = geometry.size_ijk[next(c for c, (a, _) in enumerate(amap) if a == 2)]  # planes of the view along z
    if k is not None:
        if not axial:
            raise GeometryError(
                "the series' slices are not axial: slice= and k= name no axial plane", fix="pass neither (show picks the plane)"
            )
        return int(np.rint(geometry.lps_view_index([0, 0, k])[0, 2])), k
    z = _best_z(scored_z, nz)
    k_of_plane = geometry.view_plane_slices()
    return z, None if k_of_plane is None else int(k_of_plane[z])


def _best_z(scored_z: list[tuple[float, float]], nz: int) -> int:
    """The view plane of the highest-scoring finding (``scored_z``: score and view z of each), else the middle one."""
    if not scored_z:
        return nz // 2
    best = max(scored_z, key=lambda sz: sz[0] if np.isfinite(sz[0]) else -np.inf)
    return int(np.clip(np.rint(best[1]), 0, nz - 1))


def _slice_name(volume: CTVolume, k: int) -> str:
    """``InstanceNumber 63 (k=62)``: slice ``k`` as findings and viewers number it."""
    nk = volume.shape[0]
    return f"{slice_label(slice_number_source(volume.metadata, nk))} {slice_number_of(k, volume.metadata, nk)} (k={k})"


def _resampled_plane(volume: CTVolume, grid: Geometry, k: int | None, scored_z: list[tuple[float, float]]) -> tuple[int, str]:
    """The axial plane to draw of ``volume`` resampled onto patient axes (``grid``:
    :func:`~pipeline.reconstruction.render_planes.patient_axes_grid`), as an index z of ``grid``, and where it is
    (``axial at z=15.0 mm (LPS) through the centre of InstanceNumber 63 (k=62)``): the true axial plane through the
    centre of ``volume``'s slice ``k`` when given, else that of the highest-scoring finding, else the middle one."""
    nz = grid.size_ijk[2]
    through = ""
    if k is None:
        z = _best_z(scored_z, nz)
    else:
        if volume.geometry.axis_map()[2][0] != 2:
            raise GeometryError(
                "the series' slices are not axial: slice= and k= name no axial plane", fix="pass neither (show picks the plane)"
            )
        ni, nj = volume.geometry.size_ijk[:2]
        centre = volume.index_to_lps(np.array([[(ni - 1) / 2, (nj - 1) / 2, k]], float))
        z = int(np.clip(np.rint(grid.lps_to_index(centre)[0, 2]), 0, nz - 1))
        through = f" through the centre of {_slice_name(volume, k)}"
    return z, f"axial at z={grid.origin[2] + z * grid.spacing[2]:.1f} mm (LPS){through}"


def _title(volume: CTVolume, z: int, k: int | None, n_drawn: int, n_findings: int, *, where: str = "") -> str:
    """``InstanceNumber 63 (k=62) · 2 of 13 finding(s) on this slice · series 3 Chest``: the slice as findings and
    viewers number it (or ``where``, when given), and how many of the findings given cross it (are drawn)."""
    if not where:
        where = f"axial plane {z + 1} (series not stored in axial slices)" if k is None else _slice_name(volume, k)
    shown = f"{n_drawn} of {n_findings} finding(s) on this slice" if n_findings else "no findings"
    return " · ".join(part for part in (where, shown, _series_label(volume)) if part)


def _window(window: Any) -> tuple[float, float]:
    """``window`` as (lowest, highest) HU; ValueError naming it unless it is two finite numbers, lowest first."""
    try:
        low, high = (float(v) for v in window)
    except (TypeError, ValueError):
        low = high = float("nan")
    if not (np.isfinite(low) and np.isfinite(high) and low < high):
        raise DisplayArgumentError(
            f"window={window!r} is not an HU range (lowest, highest): pass two numbers, lowest first, e.g. "
            "window=(-1350, 150) (lung: W 1500 / L -600) or window=(-160, 240) (mediastinum: W 400 / L 40)"
        )
    return low, high


def show(
    volume: CTVolume,
    *,
    findings: Any = None,
    recon: Any = None,
    slice: int | None = None,
    k: int | None = None,
    ax: Any = None,
    window: tuple[float, float] = (-1350.0, 150.0),
) -> Any:
    """Draw one axial plane of ``volume`` in a lung window, with findings and organ outlines, in the radiological
    convention: seen from the feet, the patient's right on the image's left, anterior at the top (edges lettered
    R, L, A, P), whatever the series' storage order or direction cosines: an oblique series (a gantry-tilt corrected
    series, an oblique acquisition) is resampled onto patient axes, as the renderings are, and its title says so.
    Pixels are square in mm.

    findings: :class:`~pipeline.detection.Findings`, a finding or list of findings/dicts with ``center_lps``
        (LPS mm) and ``diameter_mm`` (or ``box_min_lps``/``box_max_lps``), the path of a findings JSON (what
        ``ctpipe detect`` writes), or a table: ``open_run(...).findings`` or
        :func:`~pipeline.dicom_out.read_sr_findings` (``center_x/y/z`` LPS mm; where ``diameter_mm`` is NaN, the
        box's equivalent diameter); each finding whose sphere crosses the plane, or whose centre is nearest to it, is
        circled, its score as the PNGs and the SR state it (three decimals, never a score below 1 as 1) written in a
        margin beside the image at its height (on the finding's side), joined to the circle by a dotted line, on no
        anatomy. Findings of another series than the volume's are refused (a table of
        several series: only this series' rows are drawn); findings without a series UID are drawn with a logged
        warning that they could not be checked, saying why: a list of Finding objects (``list(detect(vol))``) has
        none, as a Finding does not hold its series; the Findings itself does.
    recon: a :class:`~pipeline.reconstruction.Reconstruction`, a :class:`LabelMap` or a dict of bool masks
        ``[k, j, i]`` on the volume's grid; outlines are drawn per organ, each in its colour (the MPR PNGs' for the
        lungs, airway, body and bone; a distinct one for each other mask), and the legend below the image names the masks outlined
        on the plane drawn (not one that misses it, or fills it and so has no edge there). The voxels of a
        tilt-corrected series that no image measured are painted "not scanned" in the MPRs' colour and named in the
        legend, not drawn as air (:data:`~pipeline.reconstruction.render_planes.OUTSIDE_SCAN_RGB`).
    slice: the slice as the findings' ``slice_number`` (CSV, JSON, PNG titles) and a DICOM viewer name it: its
        InstanceNumber (a multi-frame object's FrameNumber) when the volume's metadata lists them, else ``k + 1``.
        Of an oblique series, the true axial plane through the slice's centre is drawn.
    k: the array index k (0-based, ``volume.array[k]``) instead. At most one of ``slice`` and ``k``; with
        neither, the plane of the highest-scoring finding, else the middle plane. Both need an axial series.
    ax: the matplotlib Axes to draw in, one of them (default a new 6 × 6 inch figure).
    window: HU range shown, (lowest, highest) (default lung window, W 1500 / L -600: (-1350, 150)).
    Returns the matplotlib Axes; its title names the slice (``InstanceNumber 63 (k=62)``) and the series, and below
    them the window (``lung window W1500 L-600``); the letters R and L lie in the margins beside the image, A above it
    and P below it, on none of it. Without ``ax`` each call opens a pyplot figure, kept until closed: in a script or a
    loop, save it and close it (``ax.figure.savefig("slice.png"); plt.close(ax.figure)``).
    Raises ValueError for a ``window`` that is not two numbers, lowest first; TypeError for a ``slice`` or ``k`` that
    is not a whole number, a ``recon`` of another kind and an ``ax`` that is not one Axes;
    :class:`~pipeline.errors.ReconstructionError` for a finding without a usable centre and size (as
    ``reconstruct(findings=...)`` checks them) or a findings JSON that cannot be read;
    :class:`~pipeline.errors.GeometryError` for findings of another series or masks on another grid.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Ellipse

    volume = require_volume(volume)
    low, high = _window(window)
    geometry = volume.geometry
    rows = _same_series(volume, _finding_rows(findings), findings)
    masks = _masks(recon)
    wrong = sorted(organ for organ, m in masks.items() if m.shape != volume.shape)
    grid = getattr(recon, "geometry", None)
    if wrong or (isinstance(grid, Geometry) and not grid.same_grid(geometry)):
        raise GeometryError(
            f"the reconstruction's masks {wrong or sorted(masks)} lie on another grid than the volume {volume.shape} [k, j, i]",
            fix="pass the reconstruction of this volume",
        )
    k_given = _slice_k(volume, slice, k)
    centres = np.array([r.centre for r in rows]).reshape(-1, 3)
    where, first = "", 0  # the plane's name when resampled; the first plane of the view
    if oblique_deg(geometry) <= OBLIQUE_DEG:
        xyz = geometry.lps_view_index(volume.lps_to_index(centres))
        z, k_here = _plane(volume, k_given, [(r.score, p[2]) for r, p in zip(rows, xyz)])
        shown, masks, _ = to_patient_axes(volume, masks, None)  # as it is: its grid lies on patient axes
    else:  # a true axial plane of an oblique series, resampled onto patient axes as the PNGs are: that plane only
        geometry = patient_axes_grid(geometry)
        xyz = geometry.lps_to_index(centres)  # identity direction: (i, j, k) is (x, y, z) of the view
        z, where = _resampled_plane(volume, geometry, k_given, [(r.score, p[2]) for r, p in zip(rows, xyz)])
        shown, masks, _ = to_patient_axes(volume, masks, None, axial_planes=(z, z + 1))
        where, first, k_here = where + resampled_note(shown), z, None
    outside = masks.pop(OUTSIDE_SCAN, None)  # voxels no image measured (a tilt-corrected grid): painted, not outlined
    view = shown.geometry.to_lps_view(shown.array)  # [z, y, x], LPS ascending: rows run anterior → posterior, columns R → L
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 6))
    elif not hasattr(ax, "imshow"):
        raise DisplayArgumentError(f"ax= must be one matplotlib Axes, got {_not_axes(ax)}")
    sx, sy, sz = geometry.spacing_lps()
    ax.imshow(np.asarray(view[z - first], np.float32), cmap="gray", vmin=low, vmax=high, aspect=sy / sx, interpolation="nearest")
    n_rows, n_cols = view.shape[1:]
    pad = SCORE_MARGIN * n_cols  # image pixels: the margins beside the image that hold the scores
    ax.set_xlim(-0.5 - pad, n_cols - 0.5 + pad)
    unscanned = np.asarray(shown.geometry.to_lps_view(outside)[z - first] if outside is not None else np.zeros(1), bool)
    painted = bool(unscanned.any())
    if painted:  # as the MPRs paint it: a flat colour no window gives a CT value, not the fill value read as air
        paint = np.zeros((*unscanned.shape, 4), dtype=np.float32)
        paint[unscanned] = (*OUTSIDE_SCAN_RGB, 1.0)
        ax.imshow(paint, aspect=sy / sx, interpolation="nearest")
        ax.fill([], [], color=OUTSIDE_SCAN_RGB, label=OUTSIDE_SCAN_LEGEND)
    colours = organ_colours(masks)  # as the MPR PNGs outline them; other masks each a colour of its own
    outlined = 0
    for organ, m in masks.items():
        plane = shown.geometry.to_lps_view(m)[z - first]
        if plane.any() and not plane.all():  # an edge to draw (a mask filling the plane has none): legend only then
            halo = outline_halo()  # as the MPRs draw it: legible on the bone the lung window draws near white
            ax.contour(plane.astype(np.float32), levels=[0.5], colors=[colours[organ]], linewidths=1.0, path_effects=halo)
            ax.plot([], [], color=colours[organ], label=organ_label(organ), path_effects=halo)
            outlined += 1
    drawn = 0
    # the rows of the scores in each margin (left: True); the R and L letters hold the middle one
    taken: dict[bool, list[float]] = {True: [(n_rows - 1) / 2], False: [(n_rows - 1) / 2]}
    for row, (x, y, zf) in zip(rows, xyz):
        r_mm, dz = row.diameter_mm / 2.0, abs(zf - z) * sz
        if dz > max(r_mm, sz / 2.0):  # the sphere misses this plane, and its centre is nearer another plane
            continue
        drawn += 1
        r = max(np.sqrt(max(r_mm**2 - dz**2, 0.0)), 2.0 * sx)  # radius (mm) in this plane, at least 2 pixels
        halo = outline_halo(1.5)  # the circle and its score legible on the grey lung and the near-white tissue
        ax.add_patch(Ellipse((x, y), 2 * r / sx, 2 * r / sy, fill=False, color="#ff3030", linewidth=1.5, path_effects=halo))
        if np.isfinite(row.score):  # in the margin on the finding's side, at its height: on no anatomy
            left = x < (n_cols - 1) / 2
            y_text = _free_row(y, taken[left], line=SCORE_LINE * n_rows)
            edge = -0.5 - pad * 0.1 if left else n_cols - 0.5 + pad * 0.1
            ax.plot(
                [x - r / sx if left else x + r / sx, edge],
                [y, y_text],
                color="#ff3030",
                linewidth=0.8,
                linestyle=":",
                path_effects=outline_halo(0.8),
                zorder=0.9,  # under the circle (1): its halo never covers the circle's red where they meet
            )
            score = f"{stated_score(row.score):.3f}"
            ha = "right" if left else "left"
            ax.text(edge, y_text, score, color="#ff3030", fontsize=8, ha=ha, va="center", path_effects=outline_halo(0.0))
    _orientation_letters(ax, n_rows, n_cols)
    _scale_bar(ax, n_rows, n_cols, sx)
    title = _title(volume, z, k_here, drawn, len(rows), where=where) + f"\n{window_note(low, high)}"
    ax.set_title(title, fontsize=9, pad=6.0 + LETTER_ROOM_PT)  # above the A letter
    ax.set_axis_off()
    if outlined or painted:  # the outlines drawn on this plane, each named, and the wedge painted; none: no legend
        entries = outlined + painted  # below the image and its P letter, on none of it
        pad = (LETTER_ROOM_PT + 3.0) / 7  # legend font sizes
        ax.legend(
            loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(entries, 3), fontsize=7, frameon=False, borderaxespad=pad
        )
    return ax


def _orientation_letters(ax: Any, n_rows: int, n_cols: int) -> None:
    """R and L in the margins beside the image (``n_rows`` x ``n_cols`` pixels, drawn ``[row, column]``, row 0 at the
    top), A above and P below it (:data:`TOP_BOTTOM_LETTERS`), none on the image."""
    style = {"color": "yellow", "fontsize": LETTER_FONTSIZE, "ha": "center", "bbox": _LETTER_BOX}
    for letter, fx, fy in EDGE_LETTERS:
        ax.text(fx, fy, letter, transform=ax.transAxes, va="center", **style)
    middle = (n_cols - 1) / 2
    for letter, top in TOP_BOTTOM_LETTERS:
        ax.annotate(
            letter,
            xy=(middle, -0.5 if top else n_rows - 0.5),  # the middle of the image's upper or lower edge
            xytext=(0.0, LETTER_GAP_PT + 1.0 if top else -(LETTER_GAP_PT + 1.0)),  # the box's pad beyond the gap
            textcoords="offset points",
            va="bottom" if top else "top",
            annotation_clip=False,
            **style,
        )


def _scale_bar(ax: Any, n_rows: int, n_cols: int, col_mm: float) -> None:
    """A yellow bar under the image's lower left corner (``n_rows`` x ``n_cols`` pixels of ``col_mm`` mm), level with
    the P letter, labelled with its length: the longest of
    :func:`~pipeline.reconstruction.render_layout.scale_bar_mm` of the image's width, as the MPRs'."""
    from matplotlib.transforms import offset_copy

    width_mm = n_cols * col_mm
    length = scale_bar_mm(width_mm)
    x0, y = -0.5 + 0.03 * n_cols, n_rows - 0.5
    below = offset_copy(ax.transData, fig=ax.figure, y=-(LETTER_GAP_PT + LETTER_FONTSIZE / 2 + 1.0), units="points")
    side_labelled_bar(
        ax,
        x0,
        y,
        length,
        col_mm,
        label_offset_pt=(4.0, -(LETTER_GAP_PT + LETTER_FONTSIZE / 2 + 1.0)),
        transform=below,
        clip=False,
    )


#: The margins beside ``show``'s image that hold the findings' scores, each a share of the image's width, and the
#: height of a score's line (a share of the image's height): two scores in one margin lie at least that far apart.
SCORE_MARGIN = 0.14
SCORE_LINE = 0.04


def _free_row(y: float, taken: list[float], *, line: float) -> float:
    """The row nearest ``y`` (image pixels) at least ``line`` from each row ``taken`` (added to it)."""
    for step in range(len(taken) + 1):
        for cand in (y,) if step == 0 else (y + step * line, y - step * line):
            if all(abs(cand - t) >= line for t in taken):
                taken.append(cand)
                return cand
    taken.append(y)
    return y
