"""Per-case quality flags: what a reader must know before trusting a case's figures.

The vocabulary is small and fixed (:data:`FLAGS`). Each flag has a severity: ``warning`` (a
figure or a finding of the case may be wrong or incomplete; counted in the report's headline)
or ``info`` (a property of the scan worth knowing, e.g. its contrast phase).

=========================== ======== ==========================================================
code                        severity meaning
=========================== ======== ==========================================================
``lungs_absent``            warning  no lungs in the scan (less than 20 mL of lung); no search
``lungs_apex_cut``          warning  the lungs continue above the most superior slice
``lungs_base_cut``          warning  the lungs continue below the most inferior slice
``lung_volume_out_of_range`` warning complete lungs outside 1.5–9.0 L together (both lungs looked for)
``lung_imbalance``          warning  the smaller lung is less than half the larger one
``one_lung``                warning  lung on one side only (the other has none): a pneumonectomy, or a lung the
                                     segmentation or the field of view missed; the missing lung's figures are absent,
                                     the lungs' total volume and emphysema index are the remaining lung's;
                                     the flag's ``side`` is the side without lung (the SR's finding names it)
``thick_slices``            warning  slices thicker than 2.5 mm (LUNA16's limit): small nodules and emphysema index unreliable
``coarse_pixels``           warning  pixels coarser than 2.5 mm (a diagnostic chest series has 0.5–1 mm): small nodules
                                     and emphysema index unreliable
``lossy_compressed``        warning  the series was lossy compressed (ratio and method when stated): HU values, small
                                     nodules and emphysema index unreliable
``emphysema_slices``        info     slices thicker than 1.5 mm (up to 2.5 mm, then ``thick_slices``): outside the
                                     lung-density protocols (COPDGene: 0.625–0.9 mm), emphysema index unreliable (info:
                                     the index is marked, nothing else of an ordinary 2 mm chest series is in doubt)
``interpolated``            warning  ingest resampled the volume (gantry tilt correction): interpolation smooths the
                                     noise, emphysema index unreliable (reads low)
``sharp_kernel``            warning  a sharp (lung, bone) ConvolutionKernel: its noise makes the emphysema index unreliable
                                     (reads high)
``fov_cuts_body``           warning  the body meets the image edge over at least 1.5 cm² (all slices)
``metal_streaks``           warning  metal in the body (≥ 0.05 mL at ≥ 2,500 HU): streak artefacts likely
``contrast_arterial``       info     IV contrast, arterial phase (estimate)
``contrast_venous``         info     IV contrast, venous phase (estimate)
``airway_not_in_scan``      info     no trachea in the field of view; no airway outputs
=========================== ======== ==========================================================

Lung coverage is ``complete``, ``partial`` (apex or base cut) or ``absent``. Measurements that a
flag makes meaningless are listed in :attr:`QualityReport.unreliable` (the emphysema index and lung
volumes of partial lungs; the emphysema index on slices thicker than 1.5 mm, on pixels coarser than 2.5 mm, of a
lossy compressed, interpolated or sharp-kernel series: :mod:`.lung_density` says why each moves LAA-950); the
measurements JSON marks them instead of reporting a plain number, naming the flags. All thresholds are in mm, mL and HU.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
from scipy import ndimage

from ..ingest.measured import measured_mask
from ..volume import (
    COARSE_PIXEL_NOTE,
    LOSSY_NOTE,
    THICK_SLICE_NOTE,
    Geometry,
    coarse_pixel_detail,
    lossy_detail,
    slice_thickness_mm,
    thick_slice_detail,
)
from .lung_density import emphysema_slice_detail, interpolation_detail, sharp_kernel_detail

log = logging.getLogger(__name__)

Severity = Literal["warning", "info"]

# The fixed sentences of the emphysema index's flags (at most 64 characters: the SR codes them); the measured figure
# completes each (lung_density).
EMPHYSEMA_SLICE_NOTE = "slices too thick for lung density: emphysema index unreliable"
INTERPOLATED_NOTE = "interpolated by ingest: emphysema index unreliable"
SHARP_KERNEL_NOTE = "sharp kernel: emphysema index unreliable"

#: code → (severity, sentence). The sentence is completed with the measured figure.
FLAGS: dict[str, tuple[Severity, str]] = {
    "lungs_absent": ("warning", "no lungs in the scan"),
    "lungs_apex_cut": ("warning", "the lung apices are cut by the scan range"),
    "lungs_base_cut": ("warning", "the lung bases are cut by the scan range"),
    "lung_volume_out_of_range": ("warning", "lung volume outside the physiological range"),
    "lung_imbalance": ("warning", "strong left/right lung volume imbalance"),
    "one_lung": ("warning", "one lung only: no lung on the other side"),
    "thick_slices": ("warning", THICK_SLICE_NOTE),
    "coarse_pixels": ("warning", COARSE_PIXEL_NOTE),
    "lossy_compressed": ("warning", LOSSY_NOTE),
    "emphysema_slices": ("info", EMPHYSEMA_SLICE_NOTE),
    "interpolated": ("warning", INTERPOLATED_NOTE),
    "sharp_kernel": ("warning", SHARP_KERNEL_NOTE),
    "fov_cuts_body": ("warning", "the field of view cuts the body"),
    "metal_streaks": ("warning", "metal in the body: streak artefacts likely"),
    "contrast_arterial": ("info", "IV contrast, arterial phase (estimate)"),
    "contrast_venous": ("info", "IV contrast, venous phase (estimate)"),
    "airway_not_in_scan": ("info", "airway not in the scan"),
}

#: The one_lung flag's sentence naming the side without lung (at most 64 characters with either side).
ONE_LUNG_SIDE_NOTE = "one lung only: no {side} lung (pneumonectomy or field of view)"
#: The same where the field of view cuts the body off on the side without lung: that lung may lie beyond the images.
ONE_LUNG_BEYOND_VIEW_NOTE = "one lung in the field of view: the {side} side is cut off"

LUNGS_ABSENT_ML = 20.0
LUNG_CUT_AREA_MM2 = 100.0  # lung cross-section on the most superior/inferior slice that means "cut" (1 cm²)
LUNG_VOLUME_RANGE_ML = (1500.0, 9000.0)
# Lung beyond a cut end: at most its cross-section on the end slice times this depth (mm; a lung tapers to its apex
# or into the costophrenic recesses within a few cm). Lung figures stay reliable while that bound is under
# MAX_MISSING_FRACTION of the lung measured: a scan ending a few cm² into the recesses misses a few mL of 5 L.
MISSING_DEPTH_MM = 40.0
MAX_MISSING_FRACTION = 0.02
IMBALANCE_RATIO = 0.5
# cut surface (cm²: skin on the image edge × slice spacing, summed): a raised arm grazing the edge for a few
# slices makes under 1 cm², arms or a chest cut by the field of view from 2.5 cm² to hundreds
FOV_CUT_AREA_CM2 = 1.5
METAL_HU = 2500.0
METAL_ML = 0.05
CONTRAST_HU = (150.0, 600.0)
CONTRAST_MIN_ML = 15.0
#: The emphysema index figures (% of lung below -950 HU): meaningless for partial lungs, unreliable outside the
#: lung-density protocols (:mod:`.lung_density`).
EMPHYSEMA_FIGURES = ("emphysema_index_pct", "lung_left_emphysema_index_pct", "lung_right_emphysema_index_pct")
#: The flags that make the emphysema index unreliable (besides the cut lungs), named in its reason.
EMPHYSEMA_CAUSES = ("thick_slices", "emphysema_slices", "coarse_pixels", "lossy_compressed", "interpolated", "sharp_kernel")
ARTERIAL_P90_HU = 240.0  # venous phantoms and scans: ~200-215 HU; arterial: 275-400 HU

Coverage = Literal["complete", "partial", "absent"]
Side = Literal["left", "right"]
ContrastPhase = Literal["non_contrast", "arterial", "venous"]


@dataclass(frozen=True)
class QualityFlag:
    """One flag: ``code`` from :data:`FLAGS`, its severity, a sentence with the measured figure and, for a flag about
    one side of the patient (``one_lung``: the side without lung), that side ("left" or "right"). ``beyond_view``
    (``one_lung`` only): the body meets the image edge on that side (:data:`FOV_CUT_AREA_CM2` or more), so that the
    side's lung may lie outside the field of view: the images do not show it, which says nothing of whether the
    patient has it."""

    code: str
    severity: Severity
    message: str
    side: Side | None = None
    beyond_view: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "severity": self.severity, "message": self.message}
        if self.side is not None:
            out["side"] = self.side
        if self.beyond_view:
            out["beyond_field_of_view"] = True
        return out

    @property
    def sentence(self) -> str:
        """The flag's fixed sentence (at most 64 characters: the SR codes it), naming its side when it has one."""
        return flag_sentence(self.code, self.side, beyond_view=self.beyond_view)


def flag_sentence(code: str, side: str | None = None, *, beyond_view: bool = False) -> str:
    """The fixed sentence of flag ``code`` (:data:`FLAGS`), or, for ``one_lung`` with the ``side`` without lung, the
    sentence naming that side, and saying that the field of view cuts that side off where it does (``beyond_view``:
    :class:`QualityFlag`); at most 64 characters: the SR codes it."""
    if code == "one_lung" and side in ("left", "right"):
        return (ONE_LUNG_BEYOND_VIEW_NOTE if beyond_view else ONE_LUNG_SIDE_NOTE).format(side=side)
    return FLAGS[code][1]


@dataclass(frozen=True)
class QualityReport:
    """The quality assessment of one case (see the module docstring for the vocabulary)."""

    lung_coverage: Coverage
    contrast_phase: ContrastPhase
    flags: tuple[QualityFlag, ...] = ()
    unreliable: tuple[str, ...] = ()
    figures: Mapping[str, float | None] = field(default_factory=dict)

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(f.code for f in self.flags)

    @property
    def warnings(self) -> tuple[QualityFlag, ...]:
        return tuple(f for f in self.flags if f.severity == "warning")

    @property
    def lungs_absent(self) -> bool:
        return self.lung_coverage == "absent"

    def has(self, code: str) -> bool:
        return code in self.codes

    def __repr__(self) -> str:
        """One line, as a notebook echoes it: lung coverage, contrast phase, the flags counted by severity with their
        codes and the number of unreliable figures; ``str()`` (``print(report)``) gives the messages and figures."""
        parts = [f"lung_coverage={self.lung_coverage!r}", f"contrast_phase={self.contrast_phase!r}"]
        for severity in get_args(Severity):
            codes = [f.code for f in self.flags if f.severity == severity]
            if codes:
                parts.append(f"{len(codes)} {severity}{'s' if severity == 'warning' and len(codes) > 1 else ''} {codes}")
        if not self.flags:
            parts.append("no flags")
        if self.unreliable:
            parts.append(f"{len(self.unreliable)} unreliable figure{'s' if len(self.unreliable) > 1 else ''}")
        return f"QualityReport({', '.join(parts)}; print() for the messages)"

    def __str__(self) -> str:
        """The whole report, one line each: coverage and phase, every flag (severity, code, message with its measured
        figure), the unreliable figures and the figures measured (their units in their names: mL, mm², cm², HU)."""
        lines = [f"QualityReport: lung coverage {self.lung_coverage}, contrast phase {self.contrast_phase}"]
        width = max((len(f.code) for f in self.flags), default=0)
        lines += [f"  {f.severity:<7}  {f.code:<{width}}  {f.message}" for f in self.flags] or ["  no flags"]
        if self.unreliable:
            lines.append(f"  unreliable: {', '.join(self.unreliable)}")
        if self.figures:
            figures = ", ".join(f"{k} {'none' if v is None else format(float(v), '.6g')}" for k, v in self.figures.items())
            lines.append(f"  figures: {figures}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "lung_coverage": self.lung_coverage,
            "contrast_phase": self.contrast_phase,
            "flags": [f.to_json() for f in self.flags],
            "unreliable": list(self.unreliable),
            "figures": {k: (None if v is None else round(float(v), 3)) for k, v in self.figures.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QualityReport:
        return cls(
            lung_coverage=data["lung_coverage"],
            contrast_phase=data["contrast_phase"],
            flags=tuple(
                QualityFlag(f["code"], f["severity"], f["message"], f.get("side"), bool(f.get("beyond_field_of_view")))
                for f in data.get("flags", ())
            ),
            unreliable=tuple(data.get("unreliable", ())),
            figures=dict(data.get("figures", {})),
        )


def _flag(code: str, detail: str, *, side: Side | None = None, beyond_view: bool = False) -> QualityFlag:
    severity, text = FLAGS[code]
    return QualityFlag(code, severity, f"{text} ({detail})" if detail else text, side, beyond_view)


def side_edge_cm2(body: np.ndarray, geometry: Geometry, side: Side) -> float:
    """Where ``body`` (bool ``[k, j, i]``) meets the image edge on the patient's ``side`` (the edge at the LPS x
    extreme of that side: +x is the patient's left), in cm² (its length on that edge, mm, times the slice spacing,
    mm, summed over the slices): a field of view that cuts the body off on that side."""
    view = geometry.to_lps_view(body)  # [z, y, x], x ascending to the patient's left
    edge = view[:, :, -1] if side == "left" else view[:, :, 0]
    _, sy, sz = geometry.spacing_lps()
    return float(np.count_nonzero(edge)) * float(sy) * float(sz) / 100.0


def _lung_coverage(lungs: np.ndarray, geometry: Geometry) -> tuple[Coverage, float, float, float, float]:
    """Coverage, the lung cross-section (mm²) on the most superior slice where the apex is cut (else 0), the same
    on the most inferior slice where the base is cut, lung volume (mL) and a generous bound on the lung beyond the
    cut ends (mL): the cross-section on each cut end slice (mm²) times :data:`MISSING_DEPTH_MM`."""
    voxel_ml = float(np.prod(geometry.spacing)) / 1000.0
    total_ml = float(np.count_nonzero(lungs)) * voxel_ml
    if total_ml < LUNGS_ABSENT_ML:
        return "absent", 0.0, 0.0, total_ml, 0.0
    view = geometry.to_lps_view(lungs)  # [z, y, x], z ascending = inferior → superior
    sx, sy, _ = geometry.spacing_lps()
    area = view.reshape(view.shape[0], -1).sum(axis=1) * sx * sy
    base_cut = bool(area[0] >= LUNG_CUT_AREA_MM2)
    apex_cut = bool(area[-1] >= LUNG_CUT_AREA_MM2)
    apex_mm2, base_mm2 = float(area[-1]) * apex_cut, float(area[0]) * base_cut
    missing_ml = (apex_mm2 + base_mm2) * MISSING_DEPTH_MM / 1000.0
    return ("partial" if apex_cut or base_cut else "complete"), apex_mm2, base_mm2, total_ml, missing_ml


def fov_cut_area_cm2(body: np.ndarray, geometry: Geometry, *, measured: np.ndarray | None = None) -> float:
    """Where ``body`` (bool ``[k, j, i]``) meets the in-plane image edge: its length on the four edges (mm) times
    the slice spacing (mm), summed over the slices, in cm²; ``fov_cuts_body`` is raised from
    :data:`FOV_CUT_AREA_CM2`. An area, not a count of slices, so that a pixel more or less of a grazing arm
    does not decide.

    ``measured``: bool ``[k, j, i]``, the voxels some image measured (:func:`pipeline.ingest.measured.measured_mask`
    of a tilt-corrected grid); the image's edge is then where a measured voxel has an unmeasured in-plane neighbour
    (or none): the sheared edge of each tilted image inside the grown grid."""
    view = geometry.to_lps_view(body)  # [z, y, x]
    sx, sy, sz = geometry.spacing_lps()
    if measured is not None:
        return _edge_contact_mm2(view, geometry.to_lps_view(measured), sx, sy) * float(sz) / 100.0
    contact = (
        view[:, 0, :].sum(axis=1) * sx
        + view[:, -1, :].sum(axis=1) * sx
        + view[:, :, 0].sum(axis=1) * sy
        + view[:, :, -1].sum(axis=1) * sy
    )
    return float(contact.sum()) * float(sz) / 100.0


def _edge_contact_mm2(body: np.ndarray, measured: np.ndarray, sx: float, sy: float) -> float:
    """In-plane length (mm, summed over the slices) of the edges between the measured voxels of ``body`` and their
    unmeasured or missing neighbours (``[z, y, x]`` views; ``sx``, ``sy``: the spacing along x and y, mm)."""
    inside = np.pad(measured, ((0, 0), (1, 1), (1, 1)), constant_values=False)
    cut = body & measured
    length = 0.0
    for axis, along in ((1, sx), (2, sy)):  # a neighbour along y: an edge running along x, and the reverse
        for step in (-1, 1):
            beside = np.roll(inside, step, axis=axis)[:, 1:-1, 1:-1]
            length += float(np.count_nonzero(cut & ~beside)) * along
    return length


def _contrast(
    hu: np.ndarray, body: np.ndarray | None, bone: np.ndarray | None, geometry: Geometry
) -> tuple[ContrastPhase, float, float]:
    """Enhanced-blood volume (mL) and its 90th percentile HU, from non-bone soft tissue at 150–600 HU.

    Only connected pools of at least :data:`CONTRAST_MIN_ML` count (the heart's chambers with the aorta and the
    pulmonary trunk, the abdominal aorta): trabecular bone the bone mask missed (vertebral bodies and ribs on
    slices of 3-5 mm) and calcifications read 150–600 HU too, but in pieces of a few mL each.

    Computed on a grid of about 2 mm (strided), which is plenty for vessels and heart chambers.
    """
    step = tuple(max(1, int(round(2.0 / s))) for s in geometry.spacing[::-1])  # [k, j, i]
    sub = tuple(slice(None, None, st) for st in step)
    hu, body, bone = hu[sub], (None if body is None else body[sub]), (None if bone is None else bone[sub])
    spacing = [s * st for s, st in zip(geometry.spacing[::-1], step)]  # [k, j, i] mm
    sigma = [1.0 / s for s in spacing]  # ~1 mm smoothing against noise
    smooth = ndimage.gaussian_filter(hu.astype(np.float32, copy=False), sigma=sigma)
    region = (smooth >= CONTRAST_HU[0]) & (smooth <= CONTRAST_HU[1])
    if body is not None:
        region &= body
    if bone is not None and bone.any():
        reach = [max(1, int(round(3.0 / s))) for s in spacing]  # 3 mm around bone
        grown = ndimage.binary_dilation(bone, structure=np.ones([2 * r + 1 for r in reach], dtype=bool))
        region &= ~grown
    region = ndimage.binary_opening(region, iterations=1)
    voxel_ml = float(np.prod(spacing)) / 1000.0
    labels, n = ndimage.label(region)
    sizes = np.bincount(labels.ravel(), minlength=n + 1)[1:] * voxel_ml
    pools = np.flatnonzero(sizes >= CONTRAST_MIN_ML) + 1
    ml = float(sizes[pools - 1].sum())
    if not len(pools):  # scattered spots (bone the bone mask missed on thick slices, calcifications): no blood pool
        return "non_contrast", ml, float("nan")
    p90 = float(np.percentile(smooth[np.isin(labels, pools)], 90))
    return ("arterial" if p90 >= ARTERIAL_P90_HU else "venous"), ml, p90


def assess_quality(
    hu: np.ndarray,
    geometry: Geometry,
    masks: Mapping[str, np.ndarray],
    *,
    metadata: Mapping[str, Any] | None = None,
    airway_in_scan: bool | None = None,
    lungs: Collection[str] = ("lung_left", "lung_right"),
) -> QualityReport:
    """Quality flags of one case from its HU array, geometry and organ masks.

    ``hu`` and the masks are ``[k, j, i]`` arrays on ``geometry`` (LPS); masks used:
    ``lung_left``, ``lung_right``, ``body`` and ``bone`` (each optional). ``metadata`` supplies
    ``SliceThickness`` (mm), ``ConvolutionKernel``, ingest's ``LossyImageCompression`` with its ratio and method
    and its gantry tilt correction (``GantryTiltCorrectedDeg``).
    ``airway_in_scan=False`` adds ``airway_not_in_scan``.
    ``lungs``: the lungs looked for (segmented), ``lung_left`` and/or ``lung_right``. A lung not looked for is not
    missing: ``one_lung``, ``lung_imbalance`` and ``lung_volume_out_of_range`` (a range of both lungs together) are
    judged only when both were looked for; coverage and ``lungs_absent`` judge the lungs looked for.
    """
    metadata = metadata or {}
    both = {"lung_left", "lung_right"} <= set(lungs)
    empty = np.zeros(geometry.shape, dtype=bool)
    left = masks.get("lung_left", empty) if "lung_left" in lungs else empty
    right = masks.get("lung_right", empty) if "lung_right" in lungs else empty
    body = masks.get("body")
    bone = masks.get("bone")
    flags: list[QualityFlag] = []
    unreliable: list[str] = []
    figures: dict[str, float | None] = {}

    coverage, apex_mm2, base_mm2, total_ml, missing_ml = _lung_coverage(left | right, geometry)
    figures["lungs_total_volume_ml"] = total_ml
    if coverage == "partial":
        figures["lungs_missing_ml_bound"] = missing_ml
    if coverage == "absent":
        flags.append(_flag("lungs_absent", f"{total_ml:.0f} mL of lung"))
    if apex_mm2:
        flags.append(_flag("lungs_apex_cut", f"{apex_mm2 / 100:.1f} cm² of lung on the most superior slice"))
    if base_mm2:
        flags.append(_flag("lungs_base_cut", f"{base_mm2 / 100:.1f} cm² of lung on the most inferior slice"))
    voxel_ml = float(np.prod(geometry.spacing)) / 1000.0
    l_ml, r_ml = float(np.count_nonzero(left)) * voxel_ml, float(np.count_nonzero(right)) * voxel_ml
    one_lung = both and coverage != "absent" and not (l_ml and r_ml)
    if one_lung:  # not an imbalance of two lungs, whatever the coverage: the case has one
        missing: Side = "right" if l_ml else "left"
        only = "left" if l_ml else "right"
        cut_cm2 = side_edge_cm2(body, geometry, missing) if body is not None else 0.0
        figures["one_lung_side_cut_cm2"] = cut_cm2
        beyond_view = cut_cm2 >= FOV_CUT_AREA_CM2
        why = (
            f"the field of view cuts the body off on the {missing} side ({cut_cm2:.1f} cm² on the image edge): the "
            f"{missing} lung may lie outside it"
            if beyond_view
            else f"expected after a {missing} pneumonectomy; otherwise check the field of view and the {missing} lung in "
            "the images"
        )
        flags.append(
            _flag(
                "one_lung",
                f"{only} lung {max(l_ml, r_ml):.0f} mL, no {missing} lung in the images: {why}; the lungs' total volume "
                f"and emphysema index are the {only} lung's",
                side=missing,
                beyond_view=beyond_view,
            )
        )
    if coverage == "absent" or missing_ml > MAX_MISSING_FRACTION * total_ml:
        unreliable += ["lung_left_volume_ml", "lung_right_volume_ml", "lungs_total_volume_ml", *EMPHYSEMA_FIGURES]
    elif both:  # the range and the balance are of two lungs: one lung looked for has neither
        lo, hi = LUNG_VOLUME_RANGE_ML
        if not lo <= total_ml <= hi:
            flags.append(
                _flag("lung_volume_out_of_range", f"{total_ml / 1000:.2f} L, expected {lo / 1000:.1f}–{hi / 1000:.1f} L")
            )
        ratio = min(l_ml, r_ml) / max(l_ml, r_ml)
        figures["lung_balance_ratio"] = ratio
        if ratio < IMBALANCE_RATIO and not one_lung:
            flags.append(_flag("lung_imbalance", f"left {l_ml:.0f} mL, right {r_ml:.0f} mL"))

    thickness = slice_thickness_mm(geometry, metadata)
    figures["slice_thickness_mm"] = thickness
    thick = thick_slice_detail(thickness)
    if thick is not None:
        flags.append(_flag("thick_slices", thick))
        # partial volume lifts emphysematous lung above -950 HU on thick slices: the index reads too low
        unreliable += [name for name in EMPHYSEMA_FIGURES if name not in unreliable]
    elif (density_slices := emphysema_slice_detail(thickness)) is not None:
        flags.append(_flag("emphysema_slices", density_slices))
        unreliable += [name for name in EMPHYSEMA_FIGURES if name not in unreliable]
    coarse = coarse_pixel_detail(geometry)
    if coarse is not None:
        flags.append(_flag("coarse_pixels", coarse))
        # the same partial volume within a slice: the index reads too low
        unreliable += [name for name in EMPHYSEMA_FIGURES if name not in unreliable]
    lossy = lossy_detail(metadata)
    if lossy is not None:
        flags.append(_flag("lossy_compressed", lossy))
        # the index counts voxels below -950 HU: compression smooths the noise that puts voxels on either side
        unreliable += [name for name in EMPHYSEMA_FIGURES if name not in unreliable]
    for code, detail in (("interpolated", interpolation_detail(metadata)), ("sharp_kernel", sharp_kernel_detail(metadata))):
        if detail is not None:  # the index's value stays; the flag says why it is not comparable (lung_density)
            flags.append(_flag(code, detail))
            unreliable += [name for name in EMPHYSEMA_FIGURES if name not in unreliable]

    if body is not None and body.any():
        cut_cm2 = fov_cut_area_cm2(body, geometry, measured=measured_mask(geometry, metadata))
        figures["fov_cut_area_cm2"] = cut_cm2
        if cut_cm2 >= FOV_CUT_AREA_CM2:
            flags.append(_flag("fov_cuts_body", f"the body meets the image edge over {cut_cm2:.1f} cm²"))
        metal_ml = float(np.count_nonzero(body & (hu >= METAL_HU))) * float(np.prod(geometry.spacing)) / 1000.0
        figures["metal_ml"] = metal_ml
        if metal_ml >= METAL_ML:
            flags.append(_flag("metal_streaks", f"{metal_ml:.2f} mL at ≥ {METAL_HU:.0f} HU"))

    phase, enhanced_ml, p90 = _contrast(hu, body, bone, geometry)
    figures["enhanced_blood_ml"] = enhanced_ml
    figures["enhanced_blood_p90_hu"] = None if not np.isfinite(p90) else p90
    if phase != "non_contrast":
        flags.append(_flag(f"contrast_{phase}", f"{enhanced_ml:.0f} mL at 150–600 HU, 90th percentile {p90:.0f} HU"))

    if airway_in_scan is False:
        flags.append(_flag("airway_not_in_scan", ""))
    report = QualityReport(
        lung_coverage=coverage, contrast_phase=phase, flags=tuple(flags), unreliable=tuple(unreliable), figures=figures
    )
    log.info("quality: lungs %s, contrast %s, flags %s", coverage, phase, ", ".join(report.codes) or "none")
    return report


def mark_unreliable(figures: Mapping[str, Any], quality: QualityReport) -> dict[str, Any]:
    """``figures`` with every name in ``quality.unreliable`` replaced by ``{"value", "reliable": False, "reason"}``.

    A figure that a flag makes meaningless (the emphysema index of partial lungs) is then never
    read as a plain number; the reason names the flags.
    """
    cut = [f.code for f in quality.warnings if f.code.startswith("lungs_")]
    image = [f.code for f in quality.flags if f.code in EMPHYSEMA_CAUSES]
    out: dict[str, Any] = {}
    for name, value in figures.items():
        if name in quality.unreliable and value is not None:
            reason = ", ".join(cut + image if name in EMPHYSEMA_FIGURES else cut) or "quality flags"
            out[name] = {"value": value, "reliable": False, "reason": reason}
        else:
            out[name] = value
    return out
