"""Grouping files into series, splitting mixed series, and the selection rules.

Files are grouped by (StudyInstanceUID, SeriesInstanceUID). A group is split
into parts when some of its images are localizers (ImageType LOCALIZER), when
its images differ in orientation (e.g. a scout stored in the axial series),
when whole sub-stacks differ in matrix size or pixel spacing,
or when acquisitions repeat the same positions (e.g. two phases in one
series). Parts are named ``<uid>#1``, ``<uid>#2``, ... (largest first).

Files without a SeriesInstanceUID (common after de-identification) are grouped
by a fallback key made of what they do have (see :func:`fallback_series_uid`)
and get a generated series id, derived only from that key, so the same files
get the same id in every scan. The series carries a warning that says so.

:class:`SelectionRules` decides which (sub-)series are CT volumes to process
and records, for every other one, why it was not chosen.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..identifiers import description_without_identifiers
from .headers import SECONDARY_CAPTURE_SOPS, SliceHeader
from .lossy import LOSSY_ATTRIBUTE, is_lossy, lossy_warnings
from .padding import padding_warnings

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
            raise ConfigError(
                f"modalities must be non-empty strings, got {self.modalities!r}",
                where="SelectionRules.modalities",
                fix='pass e.g. modalities=("CT",)',
            )
        object.__setattr__(self, "modalities", tuple(m.upper() for m in mods))
        if not (isinstance(self.axial_tolerance_deg, (int, float)) and 0 <= self.axial_tolerance_deg <= 90):
            raise ConfigError(
                f"axial_tolerance_deg must be within 0..90 degrees, got {self.axial_tolerance_deg!r}",
                where="SelectionRules.axial_tolerance_deg",
                fix="use e.g. 30 (90 accepts any orientation)",
            )
        if isinstance(self.min_slices, bool) or not isinstance(self.min_slices, int) or self.min_slices < 2:
            raise ConfigError(
                f"min_slices must be an integer >= 2, got {self.min_slices!r}",
                where="SelectionRules.min_slices",
                fix="a volume needs at least 2 slices; use e.g. 10",
            )
        for name in ("exclude_localizers", "allow_derived"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}", where=f"SelectionRules.{name}")


@dataclass
class SeriesInfo:
    """One (sub-)series found by a scan.

    ``key`` is the SeriesInstanceUID (generated when the files have none, see
    :func:`fallback_series_uid`), or ``<uid>#<part>`` when the series was split;
    ``selected`` says whether the rules chose it and ``reasons`` why not; ``warnings``
    list what ingest assumed to take it (they travel into the volume's metadata).
    """

    key: str
    uid: str
    study_uid: str
    part: int
    headers: tuple[SliceHeader, ...]
    split_reason: str | None = None
    selected: bool = False
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __repr__(self) -> str:  # short: every slice's header is in .headers, the whole of why it was not chosen in .why_not
        why = self.why_not if len(self.why_not) <= 80 else self.why_not[:79] + "…"
        state = "selected" if self.selected else "not selected" + (f": {why}" if why else "")
        return f"SeriesInfo({self.key!r}, {self.modality or '?'}, {self.n_slices} slices, {self.description!r}, {state})"

    @property
    def files(self) -> list[Path]:
        return [h.path for h in self.headers]

    @property
    def first(self) -> SliceHeader:
        return self.headers[0]

    @functools.cached_property
    def description(self) -> str:
        """The SeriesDescription, each identifier of the series' patient in it as ``<patient>`` (see
        :func:`pipeline.identifiers.description_without_identifiers`): what messages, reprs and reports show; the
        header's own text is ``first.series_description``."""
        return description_without_identifiers(self.first.series_description, self.first.extra)

    def description_shown(self, *, keep_identifiers: bool) -> str:
        """The description a command shows or writes: the header's own with ``keep_identifiers`` (the user asked for
        the patient's identifiers: ``--keep-identifiers``), else :attr:`description`."""
        return self.first.series_description if keep_identifiers else self.description

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

    def summary(self, *, keep_identifiers: bool = False) -> dict[str, object]:
        """JSON-able description for reports; its description as :meth:`description_shown` gives it."""
        return {
            "key": self.key,
            "series_uid": self.uid,
            "study_uid": self.study_uid,
            "part": self.part,
            "description": self.description_shown(keep_identifiers=keep_identifiers),
            "modality": self.modality,
            "n_files": len(self.headers),
            "n_slices": self.n_slices,
            "selected": self.selected,
            "why_not": self.reasons,
            "split_reason": self.split_reason,
            "warnings": self.warnings,
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
    """Split one series' headers into parts that can each form a volume: localizer images (ImageType LOCALIZER)
    stored among the slices of a series go to parts of their own, whatever their orientation."""
    scouts = [h for h in headers if "LOCALIZER" in h.image_type]
    if scouts and len(scouts) < len(headers):
        reason = f"{len(scouts)} of its {len(headers)} images have ImageType LOCALIZER"
        if len(_cluster_orientations(headers)) > 1:
            reason += "; images have different ImageOrientationPatient"
        slices = [h for h in headers if "LOCALIZER" not in h.image_type]
        return [(part, why or reason) for group in (slices, scouts) for part, why in _split_geometry(group)]
    return _split_geometry(headers)


def _split_geometry(headers: list[SliceHeader]) -> list[tuple[list[SliceHeader], str | None]]:
    """Split headers by orientation, then matrix/pixel spacing, then repeated acquisitions."""
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


#: Namespace of the generated series ids (name-based UUIDs, RFC 4122 version 5).
_FALLBACK_NAMESPACE = uuid.UUID("6f1c1b8e-3c52-5d7e-9a43-2f0c1d6b7a10")


def fallback_series_uid(h: SliceHeader) -> tuple[str, str]:
    """A series id for a file without SeriesInstanceUID, and the fields it was derived from (in words).

    The fallback key is made of the fields the file has among: StudyInstanceUID,
    FrameOfReferenceUID, SeriesNumber, SeriesDate + SeriesTime, Modality,
    SeriesDescription, ImageOrientationPatient (rounded to 0.01) and PixelSpacing
    (rounded to 0.001 mm); when it has none of the first four, its folder is added,
    so that unrelated exports in different folders stay apart. AcquisitionTime and
    InstanceNumber are left out on purpose: they vary from slice to slice.

    The id is ``2.25.<n>``, a DICOM UID made of the decimal value of the name-based UUID
    (version 5, SHA-1) of that key (PS3.5 B.2): the same key always gives the same id.
    """
    fields: list[tuple[str, str]] = []

    def add(name: str, value: object) -> None:
        if value not in (None, "", ()):
            fields.append((name, str(value)))

    add("StudyInstanceUID", h.study_uid)
    add("FrameOfReferenceUID", h.extra_value("FrameOfReferenceUID"))
    add("SeriesNumber", h.series_number)
    add("SeriesDate", h.extra_value("SeriesDate"))
    add("SeriesTime", h.extra_value("SeriesTime"))
    anchored = bool(fields)
    add("Modality", h.modality)
    add("SeriesDescription", h.series_description)
    if h.orientation is not None:
        add("ImageOrientationPatient", "\\".join(f"{v:.2f}".replace("-0.00", "0.00") for v in h.orientation))
    if h.pixel_spacing is not None:
        add("PixelSpacing", "\\".join(f"{v:.3f}" for v in h.pixel_spacing))
    if not anchored:
        add("folder", h.path.parent)
    text = "|".join(f"{k}={v}" for k, v in fields)
    uid = f"2.25.{uuid.uuid5(_FALLBACK_NAMESPACE, text).int}"
    return uid, ", ".join(k for k, _ in fields) or "nothing"


def group_series(headers: Sequence[SliceHeader]) -> list[SeriesInfo]:
    """Group headers by study and series, splitting mixed series (see the module docstring)."""
    groups: dict[tuple[str, str], list[SliceHeader]] = defaultdict(list)
    generated: dict[str, str] = {}
    for h in headers:
        uid = h.series_uid
        if not uid:
            uid, basis = fallback_series_uid(h)
            generated[uid] = basis
        groups[(h.study_uid, uid)].append(h)
    out: list[SeriesInfo] = []
    for (study, uid), members in groups.items():
        parts = _split(members)
        parts.sort(key=lambda p: (-sum(h.n_frames for h in p[0]), str(p[0][0].path)))
        for n, (part, reason) in enumerate(parts, start=1):
            key = uid if len(parts) == 1 else f"{uid}#{n}"
            info = SeriesInfo(
                key=key, uid=uid, study_uid=study, part=n if len(parts) > 1 else 0, headers=tuple(part), split_reason=reason
            )
            if uid in generated:
                info.warnings.append(
                    f"the files have no SeriesInstanceUID (0020,000E): grouped by {generated[uid]}; "
                    f"series id {uid} generated from those values"
                )
            info.warnings.extend(dict.fromkeys(note for h in part for note in h.notes))
            info.warnings.extend(padding_warnings(part))
            info.warnings.extend(lossy_warnings(part))
            out.append(info)
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
        why = f"ImageType {'/'.join(h.image_type)} is derived/secondary"
        if h.image_type[1:2] != ("SECONDARY",) and is_lossy(h.transfer_syntax, h.extra_value("LossyImageCompression")):
            # DICOM makes a lossy compressed image DERIVED: an archive's compressed copy of the original series
            how = (
                f"{LOSSY_ATTRIBUTE} 01"
                if (h.extra_value("LossyImageCompression") or "").strip() == "01"
                else f"transfer syntax {h.transfer_syntax}"
            )
            why += (
                f" (DERIVED because lossy compressed ({how}): likely an archive's compressed copy of the original "
                "series; if taken, its results carry the lossy_compressed flag)"
            )
        return why
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


def _rule_reasons(s: SeriesInfo, rules: SelectionRules) -> list[tuple[str, str]]:
    """(rule, reason in words) for every rule that leaves ``s`` out."""
    reasons: list[tuple[str, str]] = []
    h = s.first
    if h.modality not in rules.modalities:
        reasons.append(("modalities", f"modality is {h.modality or 'missing'}, not {'/'.join(rules.modalities)}"))
    if all(x.pixel_length is None for x in s.headers):
        # a report, structure set or document: what the image rules would add (no orientation, 1 slice) is noise
        reasons.append(("pixels", f"no pixel data (SOP class {h.sop_class or 'missing'}): not an image series"))
        return reasons
    if rules.exclude_localizers and (why := is_localizer(s)):
        reasons.append(("exclude_localizers", f"localizer/scout: {why}"))
    if not rules.allow_derived and (why := is_derived(s)):
        if h.modality in rules.modalities:  # a derived CT: allowing derived images takes it
            why += (
                "; to include it: allow_derived=True (--allow-derived for ctpipe ingest, "
                "--set ingest.allow_derived=true for ctpipe run)"
            )
        reasons.append(("allow_derived", why))  # a SEG or other modality: no option makes it a CT volume
    angle = axial_angle_deg(h)
    if angle is None:
        reasons.append(("orientation", h.geometry_error or "no valid ImageOrientationPatient (0020,0037)"))
    elif angle > rules.axial_tolerance_deg:
        reasons.append(
            (
                "axial_tolerance_deg",
                f"not axial: slice normal is {angle:.1f} deg from the patient z axis "
                f"(limit axial_tolerance_deg={rules.axial_tolerance_deg:g})",
            )
        )
    n = s.n_slices
    if n < rules.min_slices:
        how = (
            f"to include it: --min-slices {n} for ctpipe ingest, config key ingest.min_slices "
            f"(--set ingest.min_slices={n}) for ctpipe run; load_series and ctpipe ingest/detect/reconstruct "
            "of a folder holding no other CT series take it anyway"
            if n >= 2
            else "a volume needs at least 2 slices"
        )
        reasons.append(("min_slices", f"only {n} slice(s), fewer than min_slices={rules.min_slices} ({how})"))
    return reasons


def apply_rules(series: Sequence[SeriesInfo], rules: SelectionRules) -> None:
    """Set ``selected``/``reasons`` on every series according to ``rules``."""
    for s in series:
        s.reasons = [text for _, text in _rule_reasons(s, rules)]
        s.selected = not s.reasons


def select_lone_series(series: Sequence[SeriesInfo], rules: SelectionRules) -> SeriesInfo | None:
    """Take the one CT series of a folder the user named even though it has fewer than ``min_slices`` slices.

    When no series is selected and exactly one series has the accepted modality, pixel
    data and is no localizer, and ``min_slices`` is the only rule that leaves it out (it
    has at least 2 slices), that series is selected with a warning and returned; else
    nothing changes and None is returned. Call it after :func:`apply_rules`, only where
    one folder or file was named (not in batch scans, where the rule stays).
    """
    if any(s.selected for s in series):
        return None
    images = [s for s in series if not {"modalities", "pixels", "exclude_localizers"} & {r for r, _ in _rule_reasons(s, rules)}]
    if len(images) != 1:
        return None
    (lone,) = images
    if [r for r, _ in _rule_reasons(lone, rules)] != ["min_slices"] or lone.n_slices < 2:
        return None
    lone.selected, lone.reasons = True, []
    lone.warnings.append(
        f"only {lone.n_slices} slices, fewer than min_slices={rules.min_slices}: loaded anyway because "
        "it is the only CT series where it was asked for"
    )
    return lone
