"""The shared real CT scans (``../shared/real_ct`` beside the checkout) as ``CTVolume`` + reference masks.

The scans are public data that must never be copied into the repository. Tests call
:func:`require_real_ct` (or a loader, which calls it), and skip with a clear reason when the
folder is absent. SimpleITK reads the NIfTI/NRRD files in LPS (ITK's convention); the DICOM
series goes through ctpipe's own ingest. Reference masks are boolean ``[k, j, i]`` arrays on
the volume's grid.

Cases (see the folder's README.md):

* ``copdgene``: COPDGene 10002K at 64×64×79 (4.2×4.2×4.0 mm), whole-lung mask split into left and
  right by the CIP labelmap's lung-third regions (9–11 one lung, 12–14 the other; the side is
  taken from the LPS x of each group, never from the region numbers).
* ``totalseg_abdomen`` / ``totalseg_abdomen_sm``: abdomen with only the lung bases at the top
  (TotalSegmentator model labels: left lung lobes 10, 11; right 12, 13, 14; stomach 6, small
  bowel 18, duodenum 19, colon 20).
* ``rt_planning_chest``: a full chest on a flat RT couch, 512×512×141, no annotations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.volume import CTVolume, Geometry

REPO_ROOT = Path(__file__).resolve().parents[2]
REAL_CT_DIR = REPO_ROOT.parent / "shared" / "real_ct"
SKIP_REASON = "../shared/real_ct not found: real-scan tests need the shared real CT folder beside the checkout"

# TotalSegmentator "total" task label ids
TS_LUNG_LEFT = (10, 11)
TS_LUNG_RIGHT = (12, 13, 14)
TS_GAS_ORGANS = (6, 18, 19, 20)  # stomach, small bowel, duodenum, colon
TS_SACRUM = (25,)
TS_VERTEBRAE = tuple(range(26, 51))  # S1, L5 .. C1
TS_RIBS = tuple(range(92, 116))
TS_HIPS = (77, 78)
TS_SPINAL_CORD = (79,)
TS_SPINE_RIBS = (*TS_SACRUM, *TS_VERTEBRAE, *TS_RIBS)
TS_ALL_BONE = (*TS_SPINE_RIBS, *range(69, 79), 116)  # + humeri, scapulae, clavicles, femurs, hips; sternum
TS_BONE_RECALL = {"vertebrae": TS_VERTEBRAE, "sacrum": TS_SACRUM, "ribs": TS_RIBS, "hips": TS_HIPS}
# labelled organs that hold no bone, whose calcifications or contrast must not be taken for it
TS_NOT_BONE = {
    "kidneys": (2, 3),
    "bowel": (6, 18, 19, 20),
    "vessels": (*range(51, 69),),  # heart, aorta, pulmonary vein .. iliac veins (venae cavae, portal vein)
    "liver_spleen": (1, 5),
}
TOTALSEG_LABEL_FILES = {
    "totalseg_abdomen": "example_seg_fast_force_split.nii.gz",
    "totalseg_abdomen_sm": "example_seg.nii.gz",
}


@dataclass
class RealCase:
    """One real scan: the HU volume (LPS) and whatever reference masks it has (bool ``[k, j, i]``).

    ``reference`` may hold ``lung_left``, ``lung_right`` (patient's left = larger LPS x) and
    ``gas_organs`` (stomach, bowel and colon: organs whose gas must never be labelled lung).
    """

    name: str
    volume: CTVolume
    reference: dict[str, np.ndarray] = field(default_factory=dict)
    description: str = ""


def real_ct_dir() -> Path | None:
    """The shared real CT folder, or None when it is not beside the checkout."""
    return REAL_CT_DIR if (REAL_CT_DIR / "README.md").is_file() else None


def require_real_ct() -> Path:
    """The shared real CT folder; skips the calling test (pytest) when it is absent."""
    root = real_ct_dir()
    if root is None:
        import pytest

        pytest.skip(SKIP_REASON)
    return root


def read_image(path: Path, name: str) -> CTVolume:
    """An image file SimpleITK reads (NIfTI, NRRD) as a ``CTVolume`` (LPS geometry, array ``[k, j, i]``)."""
    import SimpleITK as sitk

    return CTVolume.from_sitk(sitk.ReadImage(str(path)), metadata={"SeriesInstanceUID": name})


def read_labels(path: Path, geometry: Geometry) -> np.ndarray:
    """An integer label image on ``geometry``'s grid (raises AssertionError when the grids differ)."""
    lab = read_image(path, path.name)
    assert lab.geometry.same_grid(geometry, atol=1e-3), f"{path}: label grid {lab.geometry} differs from {geometry}"
    return np.asarray(lab.array).astype(np.int32)


def _mean_x(mask: np.ndarray, geometry: Geometry) -> float:
    idx = np.argwhere(mask)[:, ::-1].mean(axis=0)
    return float(geometry.index_to_lps(idx)[0])


def copdgene(root: Path | None = None) -> RealCase:
    """COPDGene 10002K (NRRD): reference lungs per side from ``wholeLung-64`` and the CIP labelmap."""
    folder = (root or require_real_ct()) / "cip_copdgene_chest_64"
    vol = read_image(folder / "ct-64.nrrd", "copdgene_10002K_64")
    whole = read_labels(folder / "wholeLung-64.nrrd", vol.geometry) > 0
    region = read_labels(folder / "lm-64.nrrd", vol.geometry) % 256
    a = whole & np.isin(region, (9, 10, 11))
    b = whole & np.isin(region, (12, 13, 14))
    left, right = (a, b) if _mean_x(a, vol.geometry) > _mean_x(b, vol.geometry) else (b, a)
    return RealCase(
        "copdgene",
        vol,
        {"lung_left": left, "lung_right": right},
        "COPDGene chest 64x64x79, 4.2 mm; whole-lung reference (vessels inside, main airways outside)",
    )


def _totalseg(root: Path | None, ct: str, seg: str, name: str) -> RealCase:
    folder = (root or require_real_ct()) / "totalseg_abdomen_lung_bases"
    vol = read_image(folder / ct, name)
    lab = read_labels(folder / seg, vol.geometry)
    ref = {
        "lung_left": np.isin(lab, TS_LUNG_LEFT),
        "lung_right": np.isin(lab, TS_LUNG_RIGHT),
        "gas_organs": np.isin(lab, TS_GAS_ORGANS),
    }
    return RealCase(name, vol, ref, f"TotalSegmentator abdomen ({ct}), lung bases at the top; model labels")


def totalseg_labels(case: RealCase, root: Path | None = None) -> np.ndarray | None:
    """The TotalSegmentator label image of a ``totalseg_*`` case on its grid (``[k, j, i]`` int), None for other cases."""
    name = TOTALSEG_LABEL_FILES.get(case.name)
    if name is None:
        return None
    return read_labels((root or require_real_ct()) / "totalseg_abdomen_lung_bases" / name, case.volume.geometry)


def totalseg_abdomen(root: Path | None = None) -> RealCase:
    """The full TotalSegmentator abdomen (122×101×112, 3 mm) with its ``fast_force_split`` labels."""
    return _totalseg(root, "example_ct.nii.gz", "example_seg_fast_force_split.nii.gz", "totalseg_abdomen")


def totalseg_abdomen_sm(root: Path | None = None) -> RealCase:
    """The 30-slice crop of the TotalSegmentator abdomen with its labels."""
    return _totalseg(root, "example_ct_sm.nii.gz", "example_seg.nii.gz", "totalseg_abdomen_sm")


def rt_planning_chest(root: Path | None = None) -> RealCase:
    """The RT-planning chest DICOM series (512×512×141, flat couch), read by ctpipe's ingest; no references."""
    from pipeline.ingest import load_series

    folder = (root or require_real_ct()) / "chest_ct_rt_planning_dicom"
    vol = load_series(folder)
    return RealCase("rt_planning_chest", vol, {}, "RT-planning chest DICOM 512x512x141, flat couch; no annotations")


CASES: dict[str, Callable[..., RealCase]] = {
    "copdgene": copdgene,
    "totalseg_abdomen": totalseg_abdomen,
    "totalseg_abdomen_sm": totalseg_abdomen_sm,
    "rt_planning_chest": rt_planning_chest,
}


def all_cases(root: Path | None = None) -> Iterator[RealCase]:
    """Every shared real scan, loaded one at a time."""
    for load in CASES.values():
        yield load(root)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch on one thread inside the block, as on every pytest-xdist worker: the shared results made for the whole
    pytest run are the same whichever test module or process makes them (on two threads the network's sums run in
    another order, which moves a score in its third decimal)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


#: ``ctpipe detect``'s arguments for :func:`detected_rt_planning_chest`, after the source and ``--out``
RT_PLANNING_DETECT_ARGS = ("--case-id", "c", "--no-png", "--device", "cpu")


def detected_rt_planning_chest(tmp_path_factory: Any) -> Path:
    """The folder of ``ctpipe detect`` of the RT-planning chest (:data:`RT_PLANNING_DETECT_ARGS`: case id ``c``, no
    PNGs, on the CPU; the model's operating point): ``c.findings.json`` (positions LPS mm) and ``c_sr.dcm``.

    Run once for the whole pytest run (:func:`~tests._support.shared.build_once`), for every
    test module that reads the planning chest's findings; the folder is read-only for the tests. Made on one torch thread
    (:func:`one_torch_thread`). Skips when the shared scans are absent.
    """
    from pipeline.cli import main
    from tests._support.shared import build_once

    source = require_real_ct() / "chest_ct_rt_planning_dicom"

    def build(folder: Path) -> dict[str, Any]:
        with one_torch_thread():
            rc = main(["detect", str(source), "--out", str(folder / "out"), *RT_PLANNING_DETECT_ARGS])
        if rc != 0:
            raise RuntimeError(f"ctpipe detect {source} exited {rc}: its error is in the log above")
        return {"rc": rc}

    folder, _ = build_once(tmp_path_factory, "rt_planning_chest_detect", build)
    return folder / "out"


#: the organs of :func:`segmented_rt_planning_chest`
RT_PLANNING_ORGANS = ("body", "lung_left", "lung_right", "airway")


def segmented_rt_planning_chest(tmp_path_factory: Any) -> dict[str, np.ndarray]:
    """The reconstruction's segmentation of the RT-planning chest (:data:`RT_PLANNING_ORGANS`: bool ``[k, j, i]`` on
    its grid by organ): :func:`~pipeline.reconstruction.segment.segment_organs` on the CPU, whose masks ``ctpipe
    reconstruct``, ``reconstruct()`` and ``ctpipe run`` keep; each organ's mask is the same whichever others are
    segmented with it.

    Segmented once for the whole pytest run (:func:`~tests._support.shared.build_once`), for the test modules that
    limit findings by the lungs or compare another scan of the chest with it; each caller reads its own copy back
    from a compressed ``.npz``. Made on one torch thread, as :func:`detected_rt_planning_chest`. Skips when the shared
    scans are absent.
    """
    from pipeline.reconstruction.segment import segment_organs
    from tests._support.shared import build_once

    require_real_ct()  # skips the caller now, not in the build

    def build(folder: Path) -> dict[str, Any]:
        with one_torch_thread():
            seg = segment_organs(rt_planning_chest().volume, organs=RT_PLANNING_ORGANS, device="cpu")
        missing = [o for o in RT_PLANNING_ORGANS if o not in seg.masks]
        if missing:
            raise RuntimeError(f"the planning chest's {missing} were not segmented: {seg.info}, {seg.errors}")
        np.savez_compressed(folder / "masks.npz", **{o: np.asarray(seg.masks[o], dtype=bool) for o in RT_PLANNING_ORGANS})
        return {"info": {k: v for k, v in seg.info.items() if isinstance(v, (str, int, float, bool))}}

    folder, _ = build_once(tmp_path_factory, "rt_planning_chest_segmented", build)
    with np.load(folder / "masks.npz") as npz:
        return {o: npz[o] for o in RT_PLANNING_ORGANS}
