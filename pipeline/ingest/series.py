"""Grouping files into series, splitting mixed series, and the selection rules.

Files are grouped by (StudyInstanceUID, SeriesInstanceUID). A group is split
into parts when its images differ in orientation (e.g. a scout stored in the
axial series), when whole sub-stacks differ in matrix size or pixel spacing,
or when acquisitions repeat the same positions (e.g. two phases in one
series). Parts are named ``<uid>#1``, ``<uid>#2``, ... (largest first).

:class:`SelectionRules` decides which (sub-)series are CT volumes to process
and records, for every other one, why it was not chosen.
"""

from __future__ import annotations

import logging
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .headers import SECONDARY_CAPTURE_SOPS, SliceHeader

log = logging.getLogger(__name__)

_LOCALIZER_WORDS = re.compile(r"scout|locali[sz]er|topogram|surview|scanogram|pilot|survey", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class SelectionRules:
    """Which series count as CT volumes to process.

    Attributes
    ----------
    modalities: accepted Modality values (default only ``"CT"``).
    axial_tolerance_deg: largest angle (degrees) between the slice normal and the
        patient's z axis (LPS +z, superior) for a series to count as axial.
        30° keeps gantry-tilted axial series.
    min_slices: fewest images a volume must have (default 10; a scout or a few
        key images are not a volume).
    exclude_localizers: leave out scout/localizer images (ImageType LOCALIZER or a
        description like "scout", "topogram").
    allow_derived: also accept DERIVED/SECONDARY images (reformats, secondary capture).
    """

    modalities: tuple[str, ...] = ("CT",)
    axial_tolerance_deg: float = 30.0
    min_slices: int = 10
    exclude_localizers: bool = True
    allow_derived: bool = False

    def __post_init__(self) -> None:
        mods = (self.modalities,) if isinstance(self.modalities, str) else tuple(self.modalities)
        if not mods or not all(isinstance(m, str) and m for m in mods):
            raise ConfigError(f"modalities must be non-empty strings, got {self.modalities!r}", where="SelectionRules.modalities",
                              fix='pass e.g. modalities=("CT",)')
        object.__setattr__(self, "modalities", tuple(m.upper() for m in mods))
        if not (isinstance(self.axial_tolerance_deg, (int, float)) and 0 <= self.axial_tolerance_deg <= 90):
            raise ConfigError(f"axial_tolerance_deg must be within 0..90 degrees, got {self.axial_tolerance_deg!r}",
                              where="SelectionRules.axial_tolerance_deg", fix="use e.g. 30 (90 accepts any orientation)")
        if isinstance(self.min_slices, bool) or not isinstance(self.min_slices, int) or self.min_slices < 2:
            raise ConfigError(f"min_slices must be an integer >= 2, got {self.min_slices!r}", where="SelectionRules.min_slices",
                              fix="a volume needs at least 2 slices; use e.g. 10")
        for name in ("exclude_localizers", "allow_derived"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}", where=f"SelectionRules.{name}")


@dataclass
class SeriesInfo:
    """One (sub-)series found by a scan.

    ``key`` is the SeriesInstanceUID, or ``<uid>#<part>`` when the series was split;
    ``selected`` says whether the rules chose it and ``reasons`` why not.
    """

    key: str
    uid: str
    study_uid: str
    part: int
    headers: tuple[SliceHeader, ...]
    split_reason: str | None = None
    selected: bool = False
    reasons: list[str] = field(default_factory=list)

    @property
    def files(self) -> list[Path]:
        return [h.path for h in self.headers]

    @property
    def first(self) -> SliceHeader:
        return self.headers[0]

    @property
    def description(self) -> str:
        return self.first.series_description

    @property
    def modality(self) -> str:
        return self.first.modality

    @property
    def n_slices(self) -> int:
        """Images in the series (frames for a multi-frame file)."""
        return sum(h.n_frames for h in self.headers)

    @property
    def why_not(self) -> str:
        return "; ".join(self.reasons)

    def summary(self) -> dict[str, object]:
        """JSON-able description for reports."""
        return {
            "key": self.key, "series_uid": self.uid, "study_uid": self.study_uid, "part": self.part,
            "description": self.description, "modality": self.modality, "n_files": len(self.headers),
            "n_slices": self.n_slices, "selected": self.selected, "why_not": self.reasons,
            "split_reason": self.split_reason,
        }


def _cluster_orientations(headers: list[SliceHeader], tol: float = 1e-3) -> list[list[SliceHeader]]:
    """Group headers whose ImageOrientationPatient agree within ``tol`` (missing ones form their own group)."""
    refs: list[tuple[float, ...] | None] = []
    groups: list[list[SliceHeader]] = []
    for h in headers:
        o = h.orientation
        for n, ref in enumerate(refs):
            if o == ref or (o is not None and ref is not None and max(abs(a - b) for a, b in zip(o, ref)) <= tol):
                groups[n].append(h)
                break
        else:
            refs.append(o)
            groups.append([h])
    return groups


def _matrix_key(h: SliceHeader) -> tuple:
    ps = None if h.pixel_spacing is None else tuple(round(v, 4) for v in h.pixel_spacing)
    return (h.rows, h.columns, ps, h.is_enhanced)


def _normal_distance(h: SliceHeader) -> float | None:
    if h.orientation is None or h.position is None:
        return None
    o = h.orientation
    n = np.cross(o[:3], o[3:])
    return float(np.dot(n, h.position))


def _split(headers: list[SliceHeader]) -> list[tuple[list[SliceHeader], str | None]]:
    """Split one series' headers into parts that can each form a volume."""
    parts: list[tuple[list[SliceHeader], str | None]] = []
    by_orient = _cluster_orientations(headers)
    orient_reason = "images have different ImageOrientationPatient" if len(by_orient) > 1 else None
    for group in by_orient:
        by_matrix: dict[tuple, list[SliceHeader]] = defaultdict(list)
        for h in group:
            by_matrix[_matrix_key(h)].append(h)
        if len(by_matrix) > 1 and all(len(g) >= 2 for g in by_matrix.values()):
            sizes = ", ".join(f"{k[0]}x{k[1]} at {k[2]} mm" for k in by_matrix)
            subgroups: list[tuple[list[SliceHeader], str | None]] = [
                (g, f"sub-stacks differ in matrix/pixel spacing ({sizes})") for g in by_matrix.values()
            ]
        else:
            subgroups = [(group, orient_reason)]
        for sub, reason in subgroups:
            parts.extend(_split_acquisitions(sub, reason))
    return parts


def _split_acquisitions(headers: list[SliceHeader], reason: str | None) -> list[tuple[list[SliceHeader], str | None]]:
    """Split by AcquisitionNumber only when acquisitions repeat the same slice positions."""
    by_acq: dict[int | None, list[SliceHeader]] = defaultdict(list)
    for h in headers:
        by_acq[h.acquisition_number].append(h)
    if len(by_acq) < 2:
        return [(headers, reason)]
    seen: set[float] = set()
    overlap = False
    for group in by_acq.values():
        mine = {round(d, 2) for d in (_normal_distance(h) for h in group) if d is not None}
        if mine & seen:
            overlap = True
            break
        seen |= mine
    if not overlap:
        return [(headers, reason)]
    nums = ", ".join(str(a) for a in sorted(by_acq, key=lambda a: (a is None, a or 0)))
    return [(g, f"acquisitions {nums} repeat the same slice positions") for g in by_acq.values()]


def group_series(headers: Sequence[SliceHeader]) -> list[SeriesInfo]:
    """Group headers by study and series, splitting mixed series (see the module docstring)."""
    groups: dict[tuple[str, str], list[SliceHeader]] = defaultdict(list)
    for h in headers:
        groups[(h.study_uid, h.series_uid)].append(h)
    out: list[SeriesInfo] = []
    for (study, uid), members in groups.items():
        parts = _split(members)
        parts.sort(key=lambda p: (-sum(h.n_frames for h in p[0]), str(p[0][0].path)))
        for n, (part, reason) in enumerate(parts, start=1):
            key = uid if len(parts) == 1 else f"{uid}#{n}"
            out.append(SeriesInfo(key=key, uid=uid, study_uid=study, part=n if len(parts) > 1 else 0,
                                  headers=tuple(part), split_reason=reason))
    out.sort(key=lambda s: (s.study_uid, s.first.series_number or 0, s.uid, s.part))
    return out


def is_localizer(s: SeriesInfo) -> str | None:
    """Why ``s`` looks like a scout/localizer, or None."""
    types = {t for h in s.headers for t in h.image_type}
    if "LOCALIZER" in types:
        return "ImageType says LOCALIZER"
    if _LOCALIZER_WORDS.search(s.description or ""):
        return f"SeriesDescription {s.description!r} names a scout/localizer"
    return None


def is_derived(s: SeriesInfo) -> str | None:
    """Why ``s`` is a derived/secondary image set, or None."""
    h = s.first
    if h.sop_class in SECONDARY_CAPTURE_SOPS:
        return f"SOP class {h.sop_class} is Secondary Capture"
    if h.image_type and (h.image_type[0] == "DERIVED" or (len(h.image_type) > 1 and h.image_type[1] == "SECONDARY")):
        return f"ImageType {'/'.join(h.image_type)} is derived/secondary"
    return None


def axial_angle_deg(h: SliceHeader) -> float | None:
    """Angle in degrees between the slice normal and the patient's z axis (LPS)."""
    if h.orientation is None:
        return None
    n = np.cross(h.orientation[:3], h.orientation[3:])
    norm = float(np.linalg.norm(n))
    if norm < 1e-6:
        return None
    return math.degrees(math.acos(min(1.0, abs(float(n[2])) / norm)))


def apply_rules(series: Sequence[SeriesInfo], rules: SelectionRules) -> None:
    """Set ``selected``/``reasons`` on every series according to ``rules``."""
    for s in series:
        reasons: list[str] = []
        h = s.first
        if h.modality not in rules.modalities:
            reasons.append(f"modality is {h.modality or 'missing'}, not {'/'.join(rules.modalities)}")
        if all(x.pixel_length is None for x in s.headers):
            reasons.append(f"no pixel data (SOP class {h.sop_class or 'missing'}): not an image series")
        if rules.exclude_localizers and (why := is_localizer(s)):
            reasons.append(f"localizer/scout: {why}")
        if not rules.allow_derived and (why := is_derived(s)):
            reasons.append(f"{why}; pass allow_derived=True (--allow-derived) to include it")
        angle = axial_angle_deg(h)
        if angle is None:
            reasons.append("no valid ImageOrientationPatient (0020,0037)")
        elif angle > rules.axial_tolerance_deg:
            reasons.append(f"not axial: slice normal is {angle:.1f} deg from the patient z axis "
                           f"(limit axial_tolerance_deg={rules.axial_tolerance_deg:g})")
        if s.n_slices < rules.min_slices:
            reasons.append(f"only {s.n_slices} slice(s), fewer than min_slices={rules.min_slices} (lower --min-slices to include it)")
        s.reasons = reasons
        s.selected = not s.reasons
