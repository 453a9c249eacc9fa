"""The classical organ segmentation's organs and parameters.

:data:`ORGANS` names the organs :func:`~pipeline.reconstruction.segment.segment_organs`
makes, in the order masks and meshes are reported; :class:`SegmentParams` holds its
thresholds (HU) and sizes (mm, mL). This module imports nothing heavy, so the
configuration schema (:mod:`pipeline.config`) and the command line read the organ
names from here without loading torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import ReconstructionError
from ..intensity import BODY_HU, LUNG_AIR_HU, SOFT_TISSUE_HU

ORGANS: tuple[str, ...] = ("body", "lung_left", "lung_right", "airway", "bone")

#: The one palette (RGB hex) of the organs, nodules and vessels: their outlines in every MPR, MIP and ``show()``, their
#: surfaces in the 3-D preview, the GLB meshes' material and the SEG's recommended display colours
#: (:data:`~pipeline.dicom_out.codes.ORGAN_COLOURS`), so that an organ reads the same in each. Bone is yellow (white
#: outlines vanish on white bone in the soft-tissue window; a cyan read as the left lung's blue where a rib meets the
#: lung) and the body white (its edge, the skin against the air outside; a tan read as the bone's yellow). Any two
#: differ by a CIEDE2000 of at least 30, so that two organs whose outlines touch (the lungs at their anterior junction,
#: a lung on a rib, a bronchus beside its artery, a nodule on any of them) are told apart.
ORGAN_COLORS: dict[str, str] = {
    "body": "#ffffff",
    "lung_left": "#3fa7ff",
    "lung_right": "#39d98a",
    "airway": "#ff7f0e",
    "bone": "#ffdd00",
    "vessels": "#dd1144",
    "nodules": "#ff3df5",
}
#: The outlines' colours: :data:`ORGAN_COLORS` itself (the name earlier versions gave the outlines' own palette).
OUTLINE_COLORS: dict[str, str] = ORGAN_COLORS

#: Colours for organs without one of their own in :data:`ORGAN_COLORS` (a segmentation bundle's liver,
#: spleen, ...; a notebook's ``lesion``), given in the order the organs come: distinct from each other and from the
#: organs' of :data:`ORGAN_COLORS` (a CIEDE2000 of at least 15: no red of the vessels, yellow of the bone, magenta of
#: the nodules or orange of the airway), legible on grey CT and on black.
EXTRA_COLORS = (
    "#bcf60c", "#fabebe", "#9a6324", "#e6beff", "#ffd8b1", "#808000", "#911eb4", "#008080", "#fffac8", "#800000",
    "#4363d8",
)  # fmt: skip


def organ_colours(organs: Iterable[str], *, outline: bool | None = None) -> dict[str, str]:
    """The colour (``#rrggbb``) of each organ: its :data:`ORGAN_COLORS` colour, else the next of :data:`EXTRA_COLORS`
    in the order the organs are given (after 11 such organs the colours repeat). The same for an outline on grey CT
    slices and a surface: ``outline`` changes nothing (earlier versions drew bone and the body otherwise)."""
    out: dict[str, str] = {}
    extra = 0
    for organ in organs:
        if organ in ORGAN_COLORS:
            out[organ] = ORGAN_COLORS[organ]
        elif organ not in out:
            out[organ] = EXTRA_COLORS[extra % len(EXTRA_COLORS)]
            extra += 1
    return out


#: What the renderings' titles and legends call an organ, as the SEG's segment labels do (``Left lung``); other organs
#: by their name, underscores as spaces (:func:`organ_label`).
ORGAN_LABELS: dict[str, str] = {"lung_left": "left lung", "lung_right": "right lung"}


def organ_label(organ: str) -> str:
    """An organ's name as a reader says it (``lung_left`` → ``left lung``; ``small_bowel`` → ``small bowel``)."""
    return ORGAN_LABELS.get(organ, organ.replace("_", " "))


def organ_names(organs: str | Iterable[str]) -> tuple[str, ...]:
    """``organs`` as a tuple of names, in the order given, each once.

    A string is one organ name (``"lung_left"``) or several separated by commas (``"lung_left,lung_right"``,
    as on the command line), never a sequence of letters. The names are not checked here; what is neither a string
    nor an iterable of names (None, a number) is a :class:`~pipeline.errors.ReconstructionError`.
    """
    if not isinstance(organs, (str, Iterable)):
        raise ReconstructionError(
            f"organs={organs!r} is not organ names",
            where="organs",
            fix=f"pass names such as organs=['lung_left', 'lung_right'], or leave organs out for {', '.join(ORGANS)}",
        )
    items = organs.split(",") if isinstance(organs, str) else organs
    return tuple(dict.fromkeys(str(o).strip() for o in items if str(o).strip()))


@dataclass(frozen=True)
class SegmentParams:
    """Thresholds (HU) and sizes (mm, mL) of the classical segmentation."""

    body_hu: float = BODY_HU  # tissue vs air outside the patient
    lung_hu: float = LUNG_AIR_HU  # air-filled (aerated lung, airway, gas) vs soft tissue
    bone_hu: float = 300.0  # bone vs soft tissue and blood
    tissue_hu: float = SOFT_TISSUE_HU  # soft tissue (airway wall): far side of the airway's and lungs' edges
    body_open_mm: float = 2.0  # detaches the table and blankets
    lung_close_mm: float = 3.0  # closes vessels at the lung hilum into the lung
    min_lung_ml: float = 2.0  # air components smaller than this are not lungs
    min_bone_ml: float = 0.02  # bone components smaller than this are noise
    airway_leak_fraction: float = 0.1  # growth above this share of the lungs is a leak
    work_voxel_mm: float = 2.0  # working voxel size (mm) for volumes above work_min_voxels
    work_min_voxels: int = 12_000_000
    cpu_threads: int | None = 1  # torch intra-op threads for CPU segmentation (None = leave as set)
