"""3-D reconstruction: organ segmentation, surface meshes, measurements and renderings (LPS, mm).

``reconstruct(volume, ...)`` segments the body, the left and right lungs, the
airways and bone (classical methods in torch; optionally a MONAI segmentation
bundle), meshes every organ as a closed outward surface in DICOM patient
coordinates, measures it and writes meshes (STL/PLY/OBJ/GLB), measurements and
PNG renderings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "FORMATS": ".export",
    "write_mesh": ".export",
    "lung_measurements": ".measure",
    "organ_measurements": ".measure",
    "Mesh": ".mesh",
    "mesh_from_mask": ".mesh",
    "NoduleResult": ".nodules",
    "segment_findings": ".nodules",
    "segment_nodule": ".nodules",
    "ORGANS": ".organs",
    "SegmentParams": ".organs",
    "Segmentation": ".segment",
    "segment_organs": ".segment",
    "Reconstruction": ".stage",
    "reconstruct": ".stage",
}

if TYPE_CHECKING:  # pragma: no cover
    from .export import FORMATS, write_mesh
    from .measure import lung_measurements, organ_measurements
    from .mesh import Mesh, mesh_from_mask
    from .nodules import NoduleResult, segment_findings, segment_nodule
    from .organs import ORGANS, SegmentParams
    from .segment import Segmentation, segment_organs
    from .stage import Reconstruction, reconstruct


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "FORMATS",
    "ORGANS",
    "Mesh",
    "NoduleResult",
    "Reconstruction",
    "SegmentParams",
    "Segmentation",
    "lung_measurements",
    "mesh_from_mask",
    "organ_measurements",
    "reconstruct",
    "segment_findings",
    "segment_nodule",
    "segment_organs",
    "write_mesh",
]
