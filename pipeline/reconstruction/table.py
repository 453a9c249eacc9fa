"""What lies under the patient on the working grid: the table, couch, mattress or blankets.

It is found by its shape and its constancy along z (:func:`table_zone`): the shell of a diagnostic table or of a
radiotherapy couch is thin tissue present in nearly every slice and spread from side to side,
on the floor side of the patient: gravity comes from the DICOM PatientPosition and the image
orientation (:func:`gravity_axis`), and only without a position from where the shell lies along
the anterior-posterior axis (a supine or prone patient); under a mattress the shell is no longer thin
tissue, and is found as thin bright tissue (carbon fibre) next to the table's foam core.
Beside the patient, whatever rests on the shell (a mattress, a blanket) shows as a thin layer;
its thickness is carried under the patient, and everything from that layer's top down is
left out of the body, in every slice (a mattress
pressed by the patient takes at most ``LAYER_MAX`` of the patient's depth). A small field of view that
cuts a curved shell under the patient's centre leaves it on the image's edge, where it does not
look thin (the array border does not erode); it is found there too (:func:`_shell_at_edge`). Where no shell is in
the image at all (a flat table below a small field of view), a thin layer that the image's lower edge cuts on both
sides of the patient, with air above it, is what rests on the table (:func:`_layer_at_edge`).

Masks are boolean ``[k, j, i]`` arrays on the grid's geometry (LPS mm); HU thresholds and sizes in mm.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import ndimage

from ..geometry import Geometry
from . import morph
from .grid import Grid

TABLE_SHELL_MM = 1.5  # half-thickness (mm) below which z-persistent tissue is a table or couch shell
TABLE_PERSIST = 0.9  # share of slices in which a pixel must be thin tissue to be table
TABLE_ELONGATION = 4.0  # a table's shell spreads this much more (variance) across than along gravity
TABLE_MIN_SLICES = 8  # fewer slices than this cannot tell a table from a thin body part
TABLE_MIN_EXTENT_MM = 30.0  # nor a scan shorter than this along z (mm)
TABLE_SPAN = 0.5  # a shell alone in its piece spans at least this share of the patient's width
TRUNK_OPEN = 0.06  # in-plane opening radius for the trunk, as a share of the footprint's size (sqrt of area)
LAYER_MAX = 0.15  # a mattress or blanket is thinner than this share of the patient's depth
# gaps up to this width (mm) in a bright shell under a mattress are bridged (a sag of 1.5 mm on a 550 mm curve)
TOP_WINDOW_MM = 80.0
TOP_TOL_MM = 4.0  # a shell's column more than this (mm) off its neighbours' median row is not on the shell
SHELL_MEDIAN = 7  # columns in that median
BARE_GAP = 0.08  # under the patient, air thinner than this share of the patient's depth lies on a bare shell (not foam)
LAYER_COVER = 0.5  # share of the columns beside the patient that must carry a layer for it to count
SHELL_HU = 350.0  # a table's shell under a mattress is brighter than this (HU; carbon fibre, not skin's edge)
SHELL_NEAR = 2  # pixels between a bright shell and the foam or air it bounds


def _persistent_footprint(mask: torch.Tensor, slice_axis: int) -> np.ndarray:
    """2-D map (the two in-plane axes, in array order) of pixels set in at least :data:`TABLE_PERSIST` of the slices."""
    return (mask.to(torch.float32).mean(dim=slice_axis) >= TABLE_PERSIST).cpu().numpy()


def _layer_beside(solid: np.ndarray, trunk: np.ndarray, below: np.ndarray, top: np.ndarray) -> np.ndarray | None:
    """Thickness per column (pixels along axis 0, gravity downwards) of the table's top and what rests on it, or None.

    Measured beside the patient (columns the trunk does not cross) where the first tissue
    under the patient's centre line is a thin run (a mattress or blanket on the table, or
    the table's own top; not an arm): the distance from that first tissue down to the
    shell's pixel ``top`` (per column; the lower shell where the upper one was not seen),
    carried under the patient as the median or, with columns on both sides of the patient
    on a curved table, as ``a + b (w - centre)**2`` across the columns ``w``. None without
    such columns.
    """
    depth_n = solid.shape[0]
    cols = trunk.any(axis=0)
    trunk_rows = np.nonzero(trunk.any(axis=1))[0]
    if trunk_rows.size == 0:
        return None
    thick_max = max(2, int(LAYER_MAX * trunk_rows.size))
    beside = (top < depth_n) & ~cols
    sample = solid & below
    first = np.argmax(sample, axis=0)
    gap = ~solid & (np.arange(depth_n)[:, None] > first[None, :])
    run = np.where(gap.any(axis=0), np.argmax(gap, axis=0), depth_n) - first  # the first tissue run's thickness
    ok = beside & sample.any(axis=0) & (first <= top) & (run <= thick_max) & (top - first <= trunk_rows.size // 2)
    if not ok.any():
        return None
    width = solid.shape[1]
    w = np.nonzero(ok)[0].astype(np.float64)
    t = (top[ok] - first[ok]).astype(np.float64)
    cw = np.nonzero(cols)[0]
    c = 0.5 * (cw[0] + cw[-1]) if cw.size else float(np.mean(w))
    q = (w - c) ** 2
    layer = np.full(width, float(np.median(t)))
    both_sides = (w < c).sum() >= 3 and (w > c).sum() >= 3
    if both_sides and q.min() < 0.5 * q.max():  # a curved table: its top and the layer thicken towards the sides
        design = np.stack([q, np.ones_like(q)], axis=1)
        (a2, b0), *_ = np.linalg.lstsq(design, t, rcond=None)
        layer = a2 * (np.arange(width) - c) ** 2 + b0
    return np.clip(np.round(layer), 0, t.max()).astype(np.int64)


def _layer_on_shell(solid: np.ndarray, top: np.ndarray, depth: int) -> int:
    """Thickness (pixels along axis 0, gravity downwards) of the mattress or blanket on the table's upper shell.

    For a field of view with no column beside the patient that misses the patient: per
    column, the run of persistent tissue resting directly on the shell (ending at the
    shell's first pixel ``top``); a run thinner than ``LAYER_MAX`` of the patient's ``depth``
    is what lies on the table beside the patient (under the patient or an arm resting on the
    table, the run is the patient). The layer is the median of the runs where most such
    columns carry one, else zero (a bare table).
    """
    depth_n = solid.shape[0]
    thick_max = max(2, int(LAYER_MAX * depth))
    rows = np.arange(depth_n)[:, None]
    last_gap = _last_row((rows < top[None, :]) & ~solid)  # the first non-tissue pixel above the shell ends the run
    has = top < depth_n
    run = np.where(has, top - 1 - last_gap, 0)
    ok = has & (run <= thick_max)
    if not ok.any():
        return 0
    runs = run[ok]
    covered = runs[runs > 0]
    if covered.size < LAYER_COVER * runs.size:
        return 0
    return int(np.median(covered))


def _last_row(mask: np.ndarray) -> np.ndarray:
    """Per column (axis 1): the last row (axis 0) of ``mask``, -1 where the column holds none."""
    return np.where(mask.any(axis=0), mask.shape[0] - 1 - np.argmax(mask[::-1], axis=0), -1)


def _first_below(mask: np.ndarray, below: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column (axis 1): the first row of ``mask`` under the centre line, and whether there is one."""
    hit = mask & below
    has = hit.any(axis=0)
    return np.where(has, np.argmax(hit, axis=0), mask.shape[0]), has


def _shell_at_edge(solid: np.ndarray, top: np.ndarray, has: np.ndarray, *, thin: int) -> tuple[np.ndarray, np.ndarray]:
    """The table's shell where it leaves the image at its lower edge (axis 0, gravity downwards): ``top`` and ``has``
    (:func:`_first_below`) with those columns added.

    The array border does not erode (:mod:`.morph`), so a curved shell cut by the image's lower edge under the
    patient's centre (a small field of view) does not look thin there and is not seen. A column between the first
    and the last column where the shell is seen, with none seen, whose lowest run of tissue is at most ``thin``
    pixels thick, with no tissue right above it, and ends within ``thin`` pixels of the last row, sees the shell
    leave the image: its top is that run's first row. The patient's back cut by the edge is a run as deep as the
    patient, not thin.
    """
    seen = np.nonzero(has)[0]
    if seen.size < 2:
        return top, has
    depth_n = solid.shape[0]
    rows = np.arange(depth_n)[:, None]
    last = _last_row(solid)
    run = last - _last_row(~solid & (rows < last[None, :]))  # the lowest run of tissue; last + 1 where it starts at row 0
    cols = np.arange(solid.shape[1])
    edge = ~has & (cols > seen[0]) & (cols < seen[-1]) & (last >= depth_n - 1 - thin) & (run <= thin) & (run <= last)
    return np.where(edge, last + 1 - run, top), has | edge


def _layer_at_edge(solid: np.ndarray, trunk: np.ndarray, *, thick: int, tol: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Where no shell is seen: a layer on the table (a blanket, a mattress, the table's top) that the image's lower
    edge cuts (axis 0, gravity downwards; a small field of view): the row of its top per column and where known
    (:func:`_first_below`'s form), or None.

    A column sees the layer when its lowest run of tissue reaches the image's last row, is at most ``thick`` pixels
    thick and has air right above it (beside the patient, or under a flank that does not rest on it); the patient's
    back cut by the edge is a run as deep as the patient. With such columns on both sides of the ``trunk``'s middle
    whose tops (medians per side) agree within ``tol`` pixels, the layer's top is interpolated across the columns
    between (where the patient rests on it) and held beyond.
    """
    depth_n = solid.shape[0]
    rows = np.arange(depth_n)[:, None]
    last = _last_row(solid)
    run = last - _last_row(~solid & (rows < last[None, :]))  # last + 1 where the run starts at row 0 (no air above)
    seen = np.nonzero((last == depth_n - 1) & (run <= thick) & (run <= last))[0]
    t_cols = np.nonzero(trunk.any(axis=0))[0]
    if seen.size < 2 or t_cols.size == 0:
        return None
    middle = 0.5 * (t_cols[0] + t_cols[-1])
    tops = last + 1 - run
    left, right = seen[seen < middle], seen[seen > middle]
    if left.size == 0 or right.size == 0 or abs(float(np.median(tops[left]) - np.median(tops[right]))) > tol:
        return None
    cols = np.arange(solid.shape[1])
    top = np.round(np.interp(cols, seen, tops[seen])).astype(np.int64)
    return top, np.ones(cols.size, dtype=bool)


def _shell_under_layer(
    bright: np.ndarray, solid: np.ndarray, below: np.ndarray, contact: np.ndarray, *, window: int, tol: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """The table's upper shell under a mattress (row of its top per column, and where known), or None.

    Columns whose first thin bright pixel under the centre line carries tissue directly on
    it (two pixels: a mattress, or the patient on the bare shell) and lies within ``tol``
    pixels of the median row of the neighbouring such columns see the upper shell; the others (a
    gap in a shell split by partial volume, which shows the lower shell with foam above it,
    or nothing) take its row interpolated from the nearest seeing columns, across gaps of
    at most ``window`` columns. Beyond the last seeing column, where the shell runs into the image's lower edge
    (a small field of view cuts a curved table under the patient), the shell lies under the image: its row is the
    image's depth. None unless every ``contact`` column (where the patient's back rests) is known: then the lower
    shell is all that is seen under the patient.
    """
    top, has = _first_below(bright, below)
    width = top.size
    cols = np.arange(width)
    ok = has & (top >= 2)
    ok[ok] = solid[top[ok] - 1, cols[ok]] & solid[top[ok] - 2, cols[ok]]  # not a partial-volume pixel over foam
    seen = np.nonzero(ok)[0]
    if seen.size >= 3:  # a shell is smooth: drop columns off the curve of their neighbours
        med = ndimage.median_filter(top[seen], size=SHELL_MEDIAN, mode="nearest")
        seen = seen[np.abs(top[seen] - med) <= tol]
        ok = np.isin(cols, seen)
    if seen.size < 2:
        return None
    known = ok.copy()
    for a, b in zip(seen[:-1], seen[1:], strict=True):
        if 1 < b - a <= window + 1:
            known[a + 1 : b] = True
    rows = np.round(np.interp(cols, seen, top[seen])).astype(np.int64)
    depth_n = solid.shape[0]
    for end, beyond in ((seen[0], cols < seen[0]), (seen[-1], cols > seen[-1])):
        if top[end] >= depth_n - 1 - tol:  # the shell runs into the image's lower edge: it lies under it beyond
            rows[beyond], known[beyond] = depth_n, True
    if not known[contact].all():
        return None
    return np.where(known, rows, depth_n), known


# DICOM PatientPosition (C.7.3.1.1.2) by its last letters: the LPS unit vector pointing to the floor (supine: posterior,
# prone: anterior, decubitus right / left: the patient's right / left)
FLOOR_LPS = {"DR": (-1.0, 0.0, 0.0), "DL": (1.0, 0.0, 0.0), "S": (0.0, 1.0, 0.0), "P": (0.0, -1.0, 0.0)}


def floor_lps(patient_position: object) -> np.ndarray | None:
    """The LPS unit vector (3,) pointing to the floor for a DICOM PatientPosition (HFS, FFS: +P; HFP, FFP: -P; HFDR,
    FFDR: -L; HFDL, FFDL: +L), or None where the position is missing or not one of these."""
    pos = str(patient_position or "").strip().upper()
    for suffix, vec in FLOOR_LPS.items():
        if len(pos) > len(suffix) and pos.endswith(suffix) and pos[: -len(suffix)] in ("HF", "FF"):
            return np.asarray(vec, dtype=np.float64)
    return None


def gravity_axis(geom: Geometry, patient_position: object) -> tuple[int, int] | None:
    """Which in-plane axis of a 2-D footprint (the two in-plane array axes, in array order) gravity runs along and its
    sign (+1: towards higher indices), from the PatientPosition (:func:`floor_lps`) and the image orientation in LPS;
    None where the position is not known or the floor is not within the slices' plane."""
    floor = floor_lps(patient_position)
    if floor is None:
        return None
    sa = geom.array_axis(2)
    comp = np.array([float(geom.direction[:, 2 - d] @ floor) for d in range(3) if d != sa])
    ax = int(np.argmax(np.abs(comp)))
    if abs(comp[ax]) < 0.5:
        return None
    return ax, 1 if comp[ax] > 0 else -1


def _gravity(shell: np.ndarray, c_trunk: np.ndarray, known: tuple[int, int] | None, ap_axis: int) -> tuple[int, int] | None:
    """The in-plane axis gravity runs along and its sign (+1: towards higher indices): ``known`` (from the patient
    position, :func:`gravity_axis`), else along ``ap_axis`` (the in-plane axis nearest anterior-posterior: a supine or
    prone patient) towards the side of the trunk's centre ``c_trunk`` (pixels) where the 2-D ``shell`` lies. None
    unless the shell spreads ``TABLE_ELONGATION`` times more (variance) across gravity than along it (a table is long
    from side to side) and, without a known position, lies off the trunk's centre."""
    pts = np.argwhere(shell)
    if pts.shape[0] < 2:
        return None
    ax = known[0] if known is not None else ap_axis
    spread = pts.var(axis=0)
    if spread[1 - ax] < TABLE_ELONGATION * max(spread[ax], 1.0):
        return None
    if known is not None:
        return known
    d = pts[:, ax].mean() - c_trunk[ax]
    if abs(d) < 1.0:
        return None
    return ax, 1 if d > 0 else -1


def _main_piece(shell: np.ndarray, trunk: np.ndarray) -> np.ndarray | None:
    """The largest 8-connected piece of the 2-D ``shell``, or None unless it spans (along either axis, pixels) at least
    ``TABLE_SPAN`` of the ``trunk``'s extent along that axis: a table is about as wide as the patient, a thin bit of
    the patient's edge (seen as thin at coarse pixels) is short."""
    labels, sizes = morph.label(shell, structure=ndimage.generate_binary_structure(2, 2))
    if sizes.size <= 1:
        return None
    piece = labels == int(np.argmax(sizes))
    for a in range(2):
        p_idx, t_idx = np.nonzero(piece.any(axis=1 - a))[0], np.nonzero(trunk.any(axis=1 - a))[0]
        if p_idx[-1] - p_idx[0] + 1 >= TABLE_SPAN * (t_idx[-1] - t_idx[0] + 1):
            return piece
    return None


def _level_pieces(shell: np.ndarray, trunk: np.ndarray, c_trunk: np.ndarray, ax: int) -> np.ndarray | None:
    """The pieces of the 2-D ``shell`` that lie level across gravity (along axis ``ax``, pixels) on one side of the
    trunk's centre ``c_trunk``, or None unless together they span ``TABLE_SPAN`` of the ``trunk``'s width.

    With gravity known from the patient position, a blanket draped down the patient's side or a curved piece of the
    patient's edge (steep along gravity) may outweigh a table cut by a small field of view in the whole shell's
    spread; the table's shell is still level piece by piece. Pieces are 8-connected across one-pixel gaps (a curved
    shell seen as a staircase of short runs); a piece is level when it spreads ``TABLE_ELONGATION`` times more
    (variance) across gravity than along it; the side with the wider span is kept.
    """
    bridged = ndimage.binary_dilation(shell, structure=np.ones((3, 3), dtype=bool))
    labels, sizes = morph.label(bridged, structure=ndimage.generate_binary_structure(2, 2))
    level = np.zeros(sizes.size, dtype=bool)
    side = np.zeros(sizes.size, dtype=np.int64)
    for n in np.nonzero(sizes)[0]:
        pts = np.argwhere(shell & (labels == n))
        if pts.shape[0] < 2:
            continue
        spread = pts.var(axis=0)
        level[n] = spread[1 - ax] >= TABLE_ELONGATION * max(spread[ax], 1.0)
        side[n] = 1 if pts[:, ax].mean() > c_trunk[ax] else -1
    t_idx = np.nonzero(trunk.any(axis=ax))[0]
    best: np.ndarray | None = None
    best_span = TABLE_SPAN * (t_idx[-1] - t_idx[0] + 1) if t_idx.size else np.inf
    for sign in (1, -1):
        pieces = shell & level[labels] & (side[labels] == sign)
        p_idx = np.nonzero(pieces.any(axis=ax))[0]
        if p_idx.size and p_idx[-1] - p_idx[0] + 1 >= best_span:
            best, best_span = pieces, p_idx[-1] - p_idx[0] + 1
    return best


def table_zone(tissue: torch.Tensor, grid: Grid) -> np.ndarray | None:
    """The 2-D region (in-plane axes in array order) taken by the table and what lies on it, or None.

    The table's shell is thin (thinner than ``TABLE_SHELL_MM`` in-plane) tissue present in
    nearly every slice, spread from side to side; under a mattress, which makes it part of a
    thick layer of tissue, it is thin tissue brighter than ``SHELL_HU`` next to the table's
    foam core or the air under it. Gravity runs along the in-plane axis the patient position
    and the image orientation give (:func:`gravity_axis`; without a position, the axis nearest
    anterior-posterior, towards the side of the patient where the shell lies); the shell must
    spread across it (:func:`_gravity`). On coarse pixels (4 mm), where thin bits of the
    patient's edge also count as shell, the shell's largest piece alone is tried when it spans
    half the patient's width (:func:`_main_piece`), and then the shell's level pieces on one side
    of the patient (:func:`_level_pieces`: a table cut by a small field of view beside a blanket
    draped down the patient's side). Along that axis, each line
    of the image crosses the shell's top at some depth (the upper shell where a mattress
    lies on it under the whole patient, see :func:`_shell_under_layer`; else the first thin
    tissue: the bare upper shell, or the lower one under a mattress). Where the line misses
    the patient (beside it), the tissue resting on the shell is a mattress or blanket,
    whose thickness is carried under the patient (:func:`_layer_beside`); with no such line
    (a small field of view), the thin runs of tissue resting on the upper shell tell it
    (:func:`_layer_on_shell`). The zone is everything from that layer's top down, in every
    slice.
    """
    geom = grid.geometry
    sa = geom.array_axis(2)
    n = tissue.shape[sa]
    if n < TABLE_MIN_SLICES or n * geom.spacing[2 - sa] < TABLE_MIN_EXTENT_MM:
        return None
    known = known_floor = gravity_axis(geom, grid.full.metadata.get("PatientPosition"))
    r = grid.in_plane_radius(TABLE_SHELL_MM)
    thin_shell = _persistent_footprint(tissue & ~morph.opening(tissue, r), sa)
    bright = grid.hu > SHELL_HU
    bright_shell = _persistent_footprint(bright & ~morph.opening(bright, r), sa)
    hollow = torch.from_numpy(_persistent_footprint(~tissue, sa))[None]
    bright_shell &= morph.dilate(hollow, (0, SHELL_NEAR, SHELL_NEAR))[0].numpy()
    shell = thin_shell | bright_shell
    solid = _persistent_footprint(tissue, sa)
    core = solid & ~shell
    if not core.any() or (shell.sum() < 3 and known_floor is None):
        return None
    # the patient's trunk: what stays of the footprint after an opening wider than any mattress
    r_big = max(1, int(round(TRUNK_OPEN * np.sqrt(core.sum()))))
    core_t = torch.from_numpy(core)[None]
    opened = morph.opening(core_t, (0, r_big, r_big))[0].numpy()
    labels, sizes = morph.label(opened if opened.any() else core, structure=ndimage.generate_binary_structure(2, 1))
    trunk = labels == int(np.argmax(sizes))
    c_trunk = np.argwhere(trunk).mean(axis=0)
    plane = [d for d in range(3) if d != sa]
    ap_axis = int(np.argmax([abs(geom.direction[1, 2 - d]) for d in plane]))
    found = _gravity(shell, c_trunk, known, ap_axis)
    if found is None:  # coarse pixels: thin bits of the patient's edge count as shell and skew its spread
        piece = _main_piece(shell, trunk)
        found = _gravity(piece, c_trunk, known, ap_axis) if piece is not None else None
        if found is None or piece is None:  # a table cut by the field of view, outweighed by a blanket at the side
            piece = _level_pieces(shell, trunk, c_trunk, known[0] if known is not None else ap_axis)
            found = _gravity(piece, c_trunk, known, ap_axis) if piece is not None else None
        if found is None or piece is None:  # no shell seen: only a layer the image's lower edge cuts (below)
            if known is None:
                return None
            found, piece = known, np.zeros_like(shell)
        thin_shell, bright_shell = thin_shell & piece, bright_shell & piece
    ax, down = found
    # put gravity on axis 0, increasing downwards
    th, br, so, tr = (np.moveaxis(a, ax, 0) for a in (thin_shell, bright_shell, solid, trunk))
    if down < 0:
        th, br, so, tr = th[::-1], br[::-1], so[::-1], tr[::-1]
    depth = np.arange(so.shape[0])[:, None]
    centre = int(round(c_trunk[ax])) if down > 0 else so.shape[0] - 1 - int(round(c_trunk[ax]))
    below = depth > centre
    top, has = _first_below(th, below)
    top, has = _shell_at_edge(so, top, has, thin=2 * r[[d for d in range(3) if d != sa][ax]])
    trunk_rows = np.nonzero(tr.any(axis=1))[0]
    if trunk_rows.size == 0:
        return None
    t_depth = trunk_rows.size
    lowest = _last_row(tr)
    contact = lowest >= trunk_rows[-1] - LAYER_MAX * t_depth  # columns where the patient's back rests
    pixel = min(geom.spacing[2 - a] for a in range(3) if a != sa)
    window, tol = max(2, int(round(TOP_WINDOW_MM / pixel))), max(1, int(round(TOP_TOL_MM / pixel)))
    upper = _shell_under_layer(br, so, below, contact, window=window, tol=tol)
    if upper is not None:  # the upper shell under the mattress: the runs resting on it are the layer
        top, has = upper
        start = top - _layer_on_shell(so, top, t_depth)
    else:  # the bare upper shell, or the lower one under a mattress whose upper shell was not seen
        if not has.any():  # no shell seen under the patient: a layer on the table the image's lower edge cuts
            edge = _layer_at_edge(so, tr, thick=max(2, int(LAYER_MAX * t_depth)), tol=tol)
            if edge is None:
                return None
            top, has = edge
        last = _last_row((depth < top[None, :]) & so)
        gap = (top - 1 - last)[contact & has]  # what separates the shell from the patient resting on the table
        if gap.size and np.median(gap) <= BARE_GAP * t_depth:  # an air gap: the bare upper shell
            start = top - _layer_on_shell(so, top, t_depth)
        else:  # the table's foam core: the lower shell, and the layer is measured beside the patient
            layer = _layer_beside(so, tr, below, top)
            start = top - (layer if layer is not None else 0)
    # a mattress pressed by the patient takes at most LAYER_MAX of the trunk's depth, under the patient's back
    # and under its flanks; beside the patient a curved table and its mattress rise above the back's lowest row
    pressed = int(LAYER_MAX * t_depth)
    floor = np.where(tr.any(axis=0), lowest - pressed, 0)
    start = np.maximum(start, np.where(contact, trunk_rows[-1] - pressed, floor))
    zone = (depth >= start[None, :]) & has[None, :]
    if down < 0:
        zone = zone[::-1]
    return np.ascontiguousarray(np.moveaxis(zone, 0, ax))
