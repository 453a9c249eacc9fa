"""When the emphysema index (LAA-950, % of lung voxels below -950 HU) cannot be compared with the protocols' figures.

LAA-950 counts voxels: whatever moves lung voxels across -950 HU moves the index, whatever the lungs hold. It is known
to depend on slice thickness, reconstruction kernel, noise and interpolation, so the lung-density protocols fix them:
COPDGene (Regan et al., COPD 2010;7:32-43) reconstructs 0.625-0.9 mm slices with a soft kernel (GE STANDARD,
Siemens B31f, Philips B) and no smoothing, and the QIBA lung-density profile standardises the same parameters. Each function here states, for a series' geometry and metadata, the figure that puts
its index outside them (``None`` when it is within); :mod:`.quality` turns each into a flag that marks the index
unreliable. None changes the index itself.

* interpolation by ingest: a gantry tilt correction (``ingest.allow_gantry_tilt``) shifts each slice in-plane by a
  fraction of a pixel with linear interpolation, which averages neighbouring pixels and so the noise that puts
  lung voxels below -950 HU: the index reads low (a real planning chest tilted 15 deg: 0.10 % → 0.01 %).
* slices thicker than :data:`EMPHYSEMA_SLICE_MM`: partial volume lifts emphysematous lung above -950 HU; the index
  reads low (above :data:`~pipeline.volume.THICK_SLICE_MM` the ``thick_slices`` flag already says so).
* a sharp (lung or bone) kernel named in ``ConvolutionKernel``: its noise puts normal lung below -950 HU; the index
  reads high (several percentage points against a soft kernel on the same scan, Gallardo-Estrella et al., Eur
  Radiol 2016;26:478-486). Only kernel names known to be sharp count; an unknown name is not flagged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: Slices thicker than this (mm) are outside the lung-density protocols: COPDGene reconstructs 0.625-0.9 mm; the
#: margin accepts the 1-1.25 mm "thin" series that sites archive beside their 2.5-5 mm reading series.
EMPHYSEMA_SLICE_MM = 1.5
#: Metadata key ingest writes with every gantry tilt correction (:mod:`pipeline.ingest.build`): the tilt (deg).
TILT_CORRECTED_KEY = "GantryTiltCorrectedDeg"

#: Kernel names (upper case) known to be sharp: GE LUNG, BONE, BONEPLUS, EDGE; Philips L, YA-YC (lung).
_SHARP_NAMES = frozenset({"LUNG", "BONE", "BONEPLUS", "EDGE", "SHARP", "L", "YA", "YB", "YC"})
#: Siemens body kernels (B, Br, Bl, Bv, Bf, I, Ir, Q, Qr and a sharpness number, e.g. B31f, Br40d): 45 and above
#: are the sharp (lung and bone) ones.
_SIEMENS = re.compile(r"^(?:B|BR|BL|BV|BF|I|IR|Q|QR)(\d{2})[A-Z]?$")
SIEMENS_SHARP_FROM = 45
#: Canon (Toshiba) lung kernels FC50-FC59.
_CANON_LUNG = re.compile(r"^FC5\d$")


def interpolation_detail(metadata: Mapping[str, Any]) -> str | None:
    """For a volume ingest resampled (a gantry tilt correction, :data:`TILT_CORRECTED_KEY` in its ``metadata``):
    "gantry tilt of 15.00 deg corrected by linear interpolation in-plane, ...", the figure the ``interpolated`` flag
    states; else ``None`` (ingest resamples nothing else)."""
    tilt = metadata.get(TILT_CORRECTED_KEY)
    if tilt is None:
        return None
    try:
        shown = f"{float(tilt):.2f} deg"
    except (TypeError, ValueError):
        shown = str(tilt)
    return f"gantry tilt of {shown} corrected by linear interpolation in-plane, which smooths the noise: the index reads low"


def emphysema_slice_detail(thickness_mm: float) -> str | None:
    """For slices ``thickness_mm`` thick: "2.00 mm > 1.5 mm" when they are thicker than :data:`EMPHYSEMA_SLICE_MM`
    (the figure the ``emphysema_slices`` flag states), else ``None``."""
    return f"{thickness_mm:.2f} mm > {EMPHYSEMA_SLICE_MM} mm" if thickness_mm > EMPHYSEMA_SLICE_MM else None


def kernel_names(metadata: Mapping[str, Any]) -> list[str]:
    """The series' ConvolutionKernel values (a DICOM multi-value as a list or backslash-joined text), stripped."""
    value = metadata.get("ConvolutionKernel")
    if value in (None, ""):
        return []
    values = list(value) if isinstance(value, (list, tuple)) else str(value).split("\\")
    return [str(v).strip() for v in values if str(v).strip()]


def is_sharp_kernel(name: str) -> bool:
    """Whether the kernel ``name`` (e.g. "LUNG", "B60f", "Br64d", "FC51", "YA") is one known to be sharp."""
    upper = name.strip().upper()
    if upper in _SHARP_NAMES or _CANON_LUNG.match(upper):
        return True
    siemens = _SIEMENS.match(upper)
    return siemens is not None and int(siemens.group(1)) >= SIEMENS_SHARP_FROM


def sharp_kernel_detail(metadata: Mapping[str, Any]) -> str | None:
    """For a series reconstructed with a sharp kernel (:func:`is_sharp_kernel` of a ConvolutionKernel value):
    "ConvolutionKernel LUNG: ...", the figure the ``sharp_kernel`` flag states; else ``None``."""
    sharp = [name for name in kernel_names(metadata) if is_sharp_kernel(name)]
    if not sharp:
        return None
    return f"ConvolutionKernel {', '.join(sharp)}: its noise puts lung below -950 HU, the index reads high"
