"""Confounders of real chest CT that a phantom can carry: :class:`Confounders`, named scenarios, realistic draws.

``generate_phantom(seed, confounders=Confounders(...))`` adds what real scans
have and the plain phantom lacks, each with ground truth:

* ``table`` / ``blanket``: a curved diagnostic table or a flat radiotherapy
  couch under the patient (dense shell, foam core, an air gap above it), and a
  mattress/blanket (about -80..-20 HU) touching the patient's back. Mask
  ``table`` (couch and blanket); ``body`` excludes both.
* ``arms``: at the sides (a thin air gap from the chest wall, or touching it)
  or raised beside the head (in the scan's top slices only). Arms are
  ``body``, the humerus and forearm bones are ``bone``.
* ``contrast``: IV contrast phase: ``arterial`` (aorta, left heart, arch
  vessels 250..400 HU), ``pulmonary`` (right heart and pulmonary arteries
  300..500 HU), ``venous`` (all blood 150..200 HU, liver, spleen and kidneys
  enhanced). Mask ``contrast_blood``; it is never ``bone``.
* ``bowel_gas``: stomach and colon with gas on the non-dependent side and
  fluid below a horizontal air-fluid level, under the diaphragm. Mask
  ``bowel_gas``; it is never lung.
* ``coverage``: the scanned z-range relative to the anatomy (which keeps its
  size): ``full`` (lungs and upper abdomen), ``chest_only`` (lungs with thin
  margins), ``apices_cut``, ``bases_only`` (lung bases at the top of an
  abdomen scan), ``abdomen_only`` (no lungs).
* ``fov_factor`` / ``fov_centre``: the reconstruction field of view: the
  anatomy keeps the size it has for ``matrix * pixel_spacing`` and the image
  covers ``fov_factor`` times that field (same matrix, pixels scaled by the
  factor, as a zoomed reconstruction), centred on the body or on one lung.
  Below 1 it is smaller than the patient, so body and lungs touch the image
  edge; above 1 it holds the arms at the sides and more of the table.
* ``emphysema`` (fraction of the lungs below -950 HU), ``effusion``
  (dependent pleural fluid 0..20 HU), ``atelectasis`` (collapsed dependent
  lung, soft tissue): masks ``emphysema``, ``effusion``, ``atelectasis``.
  Effusion and atelectasis are *not* lung: the lung masks exclude them, as
  LUNA16's automatically computed lung masks (air-threshold region growing)
  do with dense lung.
* ``kernel`` (``sharp``: edge-enhancing reconstruction, four times the noise
  of the standard kernel at the same dose), ``thick_slices_mm`` (the series'
  slice thickness and spacing), ``metal`` (a chest ``port`` or ``spine``
  hardware above 2000 HU with streak artefacts): mask ``metal``.
* ``pneumonectomy`` (``left`` / ``right``): that lung removed, its space filled with fluid or soft tissue
  (``pneumonectomy_fill``), the mediastinum shifted towards it and the remaining lung across the midline;
  ``collapsed_lung`` (``left`` / ``right``): a large effusion with that lung collapsed into a small remnant
  at the hilum (:mod:`.one_lung`). The lung masks hold the remaining (aerated) lung under its own side.
* ``fine_vessels``: peripheral vessels finer than a voxel, painted by their
  partial volume (faint dots and short lines of about -700..-150 HU, as real
  lungs are full of; :mod:`.fine_vessels`). Not in the ``vessels`` mask,
  which holds the resolved trees.
* ``bronchovascular``: segmental and subsegmental bronchi beside the lung
  arteries (walls of soft tissue, air lumens in the ``airway`` mask), the
  bronchovascular bundles of a real hilum (:mod:`.bronchi`).

Gravity follows ``patient_position`` (supine: posterior is down, prone:
anterior); everything is built in patient coordinates (LPS, mm).

:data:`CONFOUNDER_SCENARIOS` names combinations that together cover every
confounder and the positions HFS, FFS and HFP; each has a fixed seed in the
held-out range :data:`SCENARIO_SEEDS` (5000..5099), never to be used for
training. :func:`realistic_confounders` draws a realistic mix for training.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ..errors import PhantomError

TABLES = ("none", "curved", "flat")
ARMS = ("none", "sides", "sides_touching", "raised")
CONTRAST_PHASES = ("none", "arterial", "pulmonary", "venous")
COVERAGES = ("full", "chest_only", "apices_cut", "bases_only", "abdomen_only")
FOV_CENTRES = ("body", "left_lung", "right_lung")
SIDES = ("none", "left", "right", "both")
ONE_SIDE = ("none", "left", "right")
FILLS = ("fluid", "soft_tissue")
KERNELS = ("standard", "sharp")
METALS = ("none", "port", "spine")

_CHOICES = {
    "table": TABLES,
    "arms": ARMS,
    "contrast": CONTRAST_PHASES,
    "coverage": COVERAGES,
    "fov_centre": FOV_CENTRES,
    "effusion": SIDES,
    "atelectasis": SIDES,
    "kernel": KERNELS,
    "metal": METALS,
    "pneumonectomy": ONE_SIDE,
    "pneumonectomy_fill": FILLS,
    "collapsed_lung": ONE_SIDE,
}
_RANGES = {"fov_factor": (0.5, 1.5), "emphysema": (0.0, 0.6), "thick_slices_mm": (2.0, 10.0)}


def _bad(name: str, value: Any, allowed: str) -> PhantomError:
    return PhantomError(f"confounders.{name}={value!r} is not allowed", where=f"Confounders({name}=...)", fix=f"use {allowed}")


@dataclass(frozen=True)
class Confounders:
    """Which confounders of real CT a phantom carries (see the module docstring); all off by default.

    Values are checked on construction; a bad one raises
    :class:`~pipeline.errors.PhantomError` naming the field and the allowed values.
    ``fov_factor`` (0.5..1.5) is the image's field of view over the one the
    anatomy is sized for (``matrix * pixel_spacing``; the pixels scale by
    this factor); ``emphysema`` the fraction (0..0.6) of lung painted
    below -950 HU; ``thick_slices_mm`` (2..10 mm or None) replaces
    ``generate_phantom``'s ``slice_spacing`` and ``slice_thickness``.
    """

    table: str = "none"
    blanket: bool = False
    arms: str = "none"
    contrast: str = "none"
    bowel_gas: bool = False
    coverage: str = "full"
    fov_factor: float = 1.0
    fov_centre: str = "body"
    emphysema: float = 0.0
    effusion: str = "none"
    atelectasis: str = "none"
    kernel: str = "standard"
    thick_slices_mm: float | None = None
    metal: str = "none"
    fine_vessels: bool = False
    bronchovascular: bool = False
    pneumonectomy: str = "none"
    pneumonectomy_fill: str = "fluid"
    collapsed_lung: str = "none"

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if not isinstance(value, str) or value not in allowed:
                raise _bad(name, value, "one of " + ", ".join(repr(a) for a in allowed))
        for name in ("blanket", "bowel_gas", "fine_vessels", "bronchovascular"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, getattr(self, name), "True or False")
        for name, (lo, hi) in _RANGES.items():
            value = getattr(self, name)
            if value is None and name == "thick_slices_mm":
                continue
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= float(value) <= hi
            if not ok:
                extra = " or None" if name == "thick_slices_mm" else ""
                raise _bad(name, value, f"a number from {lo:g} to {hi:g}{extra}")
            object.__setattr__(self, name, float(value))
        if self.pneumonectomy != "none":
            other = {"collapsed_lung": self.collapsed_lung, "effusion": self.effusion, "atelectasis": self.atelectasis}
            for name, value in other.items():
                if value in (self.pneumonectomy, "both") or (name == "collapsed_lung" and value != "none"):
                    raise PhantomError(
                        f"confounders.{name}={value!r} with pneumonectomy={self.pneumonectomy!r}: "
                        "the removed lung has no pleura left to collapse or fill, and one lung cannot be both",
                        where=f"Confounders(pneumonectomy=..., {name}=...)",
                        fix=f"put {name} on the remaining lung's side, or leave it 'none'",
                    )
        if self.blanket and self.table == "none":
            raise PhantomError(
                "confounders.blanket=True needs a table to lie on (table='none')",
                where="Confounders(blanket=...)",
                fix="set table='curved' or table='flat', or blanket=False",
            )

    def to_json(self) -> dict[str, Any]:
        """The options as a JSON-able dict (the ``confounders`` entry of a phantom's ``options``)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Confounders:
        """Inverse of :meth:`to_json`; unknown keys raise :class:`~pipeline.errors.PhantomError`."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise PhantomError(
                f"unknown confounder options {unknown}", where="Confounders.from_json", fix=f"use only {sorted(names)}"
            )
        return cls(**data)

    @property
    def has_lungs(self) -> bool:
        """False when the scan holds no lung at all (``coverage='abdomen_only'``)."""
        return self.coverage != "abdomen_only"


@dataclass(frozen=True)
class Scenario:
    """A named confounder combination for held-out evaluation: confounders, patient position and seed."""

    confounders: Confounders
    patient_position: str = "HFS"
    seed: int = 0
    description: str = field(default="", compare=False)


SCENARIO_SEEDS = range(5000, 5100)
"""Seeds of the evaluation scenarios (held out: never train on them); :func:`scenarios_at` moves them
to another block (``scenarios_at(2000)``: seeds 7000..7031, also never to be trained on)."""

_TYPICAL = dict(table="curved", arms="raised", bowel_gas=True)
_SCENARIO_LIST: list[tuple[str, str, str, dict[str, Any]]] = [
    ("routine_chest", "HFS", "diagnostic chest CT: curved table, arms raised, stomach gas", {}),
    (
        "flat_couch_blanket",
        "HFS",
        "radiotherapy couch with a blanket under the back, arms at the sides",
        dict(table="flat", blanket=True, arms="sides"),
    ),
    (
        "arms_touching_blanket",
        "HFS",
        "arms at the sides touching the chest wall, mattress on the table, large field of view",
        dict(blanket=True, arms="sides_touching", fov_factor=1.3),
    ),
    (
        "arms_sides_gap",
        "HFS",
        "arms at the sides, a thin air gap from the chest wall, large field of view",
        dict(arms="sides", fov_factor=1.4),
    ),
    ("no_table_arms_sides", "HFS", "no table in the image, arms at the sides", dict(table="none", arms="sides")),
    ("arterial_phase", "HFS", "systemic arterial phase: aorta and left heart 250-400 HU", dict(contrast="arterial")),
    ("pulmonary_phase", "HFS", "CT pulmonary angiography: right heart and pulmonary arteries bright", dict(contrast="pulmonary")),
    (
        "venous_bases_only",
        "HFS",
        "portal venous abdomen scan with the lung bases at the top",
        dict(contrast="venous", coverage="bases_only"),
    ),
    ("bases_only_bowel_gas", "HFS", "abdomen scan: lung bases next to stomach and colon gas", dict(coverage="bases_only")),
    ("abdomen_only", "HFS", "upper abdomen, no lung in the scan", dict(coverage="abdomen_only", contrast="venous")),
    ("apices_cut", "HFS", "chest scan starting below the lung apices", dict(coverage="apices_cut")),
    (
        "chest_only_tight",
        "HFS",
        "tight chest range, lungs complete, little abdomen, arms out of the scan",
        dict(coverage="chest_only", arms="none"),
    ),
    (
        "small_fov_centred",
        "HFS",
        "reconstruction field of view 60 % of the nominal one: body and both lungs cut",
        dict(fov_factor=0.6),
    ),
    ("small_fov_left_lung", "HFS", "small field of view centred on the left lung", dict(fov_factor=0.65, fov_centre="left_lung")),
    (
        "small_fov_right_lung_arms",
        "HFS",
        "small field of view on the right lung, arms at the sides",
        dict(fov_factor=0.6, fov_centre="right_lung", arms="sides"),
    ),
    ("emphysema_moderate", "HFS", "emphysema in 12 % of the lungs", dict(emphysema=0.12)),
    ("emphysema_severe", "HFS", "emphysema in 35 % of the lungs, sharp kernel", dict(emphysema=0.35, kernel="sharp")),
    ("effusion_both", "HFS", "bilateral pleural effusions", dict(effusion="both")),
    (
        "effusion_atelectasis_right",
        "HFS",
        "right effusion with compressive atelectasis, venous phase",
        dict(effusion="right", atelectasis="right", contrast="venous"),
    ),
    ("atelectasis_left", "HFS", "dependent atelectasis of the left lower lobe", dict(atelectasis="left")),
    ("sharp_kernel", "HFS", "sharp (lung) reconstruction kernel", dict(kernel="sharp")),
    ("thick_slices_5mm", "HFS", "5 mm slices", dict(thick_slices_mm=5.0)),
    ("thick_slices_3mm_arterial", "HFS", "3 mm slices, arterial phase", dict(thick_slices_mm=3.0, contrast="arterial")),
    ("metal_port", "HFS", "chest port with streak artefacts", dict(metal="port", contrast="venous")),
    ("metal_spine", "HFS", "spinal rods and screws with streak artefacts", dict(metal="spine")),
    ("prone", "HFP", "prone: table under the anterior chest, gas and fluid levels flipped", dict(blanket=True)),
    (
        "prone_effusion_small_fov",
        "HFP",
        "prone with bilateral effusion and a small field of view",
        dict(effusion="both", fov_factor=0.75),
    ),
    (
        "prone_bases_only_arms_sides",
        "HFP",
        "prone abdomen scan with lung bases, arms at the sides",
        dict(coverage="bases_only", arms="sides"),
    ),
    ("feet_first_venous", "FFS", "feet first supine, venous phase", dict(contrast="venous")),
    (
        "feet_first_small_fov_metal",
        "FFS",
        "feet first, small field of view on the left lung, chest port",
        dict(fov_factor=0.65, fov_centre="left_lung", metal="port"),
    ),
    (
        "feet_first_apices_cut_sharp",
        "FFS",
        "feet first, apices cut, sharp kernel, emphysema",
        dict(coverage="apices_cut", kernel="sharp", emphysema=0.2),
    ),
    (
        "everything",
        "HFS",
        "all at once: blanket, arms touching, arterial phase, bases only, small FOV, left effusion, "
        "atelectasis, emphysema, sharp thick slices, spine hardware",
        dict(
            blanket=True,
            arms="sides_touching",
            contrast="arterial",
            coverage="bases_only",
            fov_factor=0.8,
            effusion="left",
            atelectasis="both",
            emphysema=0.1,
            kernel="sharp",
            thick_slices_mm=3.0,
            metal="spine",
        ),
    ),
]

CONFOUNDER_SCENARIOS: dict[str, Scenario] = {
    name: Scenario(Confounders(**{**_TYPICAL, **opts}), patient_position=pos, seed=SCENARIO_SEEDS[i], description=text)
    for i, (name, pos, text, opts) in enumerate(_SCENARIO_LIST)
}
"""Named scenarios for held-out segmentation evaluation (seeds 5000.., in this order).

Each is a typical diagnostic chest CT (curved table, arms raised, stomach gas,
full coverage) changed by its own options; ``generate_phantom(s.seed,
confounders=s.confounders, patient_position=s.patient_position)`` makes it.
"""


def scenarios_at(seed_offset: int = 0) -> dict[str, Scenario]:
    """:data:`CONFOUNDER_SCENARIOS` with every seed moved by ``seed_offset`` (same confounders and positions).

    ``scenarios_at(2000)`` makes the same 32 scenarios as new cases (seeds 7000..7031): the anatomy,
    framing and every random draw change, the confounders do not. Raises
    :class:`~pipeline.errors.PhantomError` for an offset that is not a whole number.
    """
    if not isinstance(seed_offset, int) or isinstance(seed_offset, bool):
        raise PhantomError(
            f"seed_offset must be an integer, got {seed_offset!r}", where="scenarios_at(seed_offset=...)", fix="pass e.g. 2000"
        )
    return {name: replace(s, seed=s.seed + seed_offset) for name, s in CONFOUNDER_SCENARIOS.items()}


def realistic_confounders(seed: int) -> Confounders:
    """A realistic random combination of confounders, deterministic from ``seed``.

    Most cases are diagnostic chest CTs (curved table, arms raised or at the
    sides, full coverage, stomach gas); some have IV contrast, partial
    coverage, a small field of view, lung disease, a sharp kernel, thick
    slices or metal. Keep training seeds out of :data:`SCENARIO_SEEDS`.
    """
    import numpy as np

    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise PhantomError(
            f"seed must be an integer, got {seed!r}", where="realistic_confounders(seed=...)", fix="pass a whole number"
        )
    seed = int(seed)
    rng = np.random.default_rng([abs(seed), int(seed < 0), 20251105])

    def pick(options: dict[str, float]) -> str:
        keys = list(options)
        p = np.array(list(options.values()), dtype=float)
        return keys[int(rng.choice(len(keys), p=p / p.sum()))]

    def chance(p: float) -> bool:
        return bool(rng.random() < p)

    table = pick({"curved": 0.85, "flat": 0.08, "none": 0.07})
    fov = pick({"nominal": 0.68, "small": 0.2, "large": 0.12})
    thick = chance(0.12)
    return Confounders(
        table=table,
        blanket=table != "none" and chance(0.3),
        arms=pick({"raised": 0.6, "sides": 0.15, "sides_touching": 0.15, "none": 0.1}),
        contrast=pick({"none": 0.55, "venous": 0.25, "arterial": 0.14, "pulmonary": 0.06}),
        bowel_gas=chance(0.9),
        coverage=pick({"full": 0.72, "chest_only": 0.1, "apices_cut": 0.07, "bases_only": 0.08, "abdomen_only": 0.03}),
        fov_factor={
            "nominal": 1.0,
            "small": round(float(rng.uniform(0.6, 0.85)), 2),
            "large": round(float(rng.uniform(1.15, 1.4)), 2),
        }[fov],
        fov_centre=pick({"body": 0.5, "left_lung": 0.25, "right_lung": 0.25}) if fov == "small" else "body",
        emphysema=round(float(rng.uniform(0.03, 0.3)), 3) if chance(0.15) else 0.0,
        effusion=pick({"left": 0.3, "right": 0.35, "both": 0.35}) if chance(0.1) else "none",
        atelectasis=pick({"left": 0.4, "right": 0.3, "both": 0.3}) if chance(0.1) else "none",
        kernel="sharp" if chance(0.25) else "standard",
        thick_slices_mm=float(rng.choice([3.0, 5.0])) if thick else None,
        metal=pick({"none": 0.92, "port": 0.05, "spine": 0.03}),
    )
