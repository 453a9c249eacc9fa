"""A nodule at the edge of a tilted series' field: its outline is traced on measured voxels, never on the wedge.

The nodule's outline follows rays from the finding's centre to where they fall below the threshold. A ray that
left the field of a tilt-corrected grid ran into the unmeasured wedge's -1024 HU fill and took the field's edge for the
nodule's: the fitted surface was pulled in there, the nodule's level and threshold were read partly off the fill,
and the nodule was measured smaller than the part of it the images did see (a 4 mm ball touching a sloped field
edge: 255 mm³ of its 286 measured, threshold -514 instead of -582 HU). Rays now stop where they leave the field,
and only measured voxels set the nodule's level.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from pipeline.errors import ReconstructionError
from pipeline.ingest.measured import measured_mask, with_measured
from pipeline.reconstruction.nodules import NoduleResult, segment_findings, segment_nodule
from pipeline.volume import CTVolume, Geometry

N, CENTRE, RADIUS_MM = 40, 20, 4.0
FINDING = {"center_lps": [20.0, 20.0, 20.0], "box_min_lps": [15.0, 15.0, 15.0], "box_max_lps": [25.0, 25.0, 25.0]}


def _chest(edge_column: float | None) -> CTVolume:
    """1 mm voxels: noisy lung (-850 HU) with a blurred solid nodule (40 HU, 4 mm radius) at the centre; with
    ``edge_column``, each slice's columns before the field's edge (``edge_column`` at the nodule's slice, moving half
    a column per slice, as a tilted gantry's shear moves it) unmeasured and holding the -1024 HU fill."""
    rng = np.random.default_rng(3)
    hu = -850.0 + rng.normal(0.0, 30.0, (N, N, N))
    kk, jj, ii = np.indices(hu.shape)
    ball = (kk - CENTRE) ** 2 + (jj - CENTRE) ** 2 + (ii - CENTRE) ** 2 <= RADIUS_MM**2
    hu += ndimage.gaussian_filter(ball.astype(float), 0.7) * 890.0
    geom = Geometry(hu.shape, (1.0, 1.0, 1.0), (0.0, 0.0, 0.0))
    if edge_column is None:
        return CTVolume(hu.astype(np.float32), geom)
    measured = np.ones(hu.shape, bool)
    for k in range(N):
        measured[k, :, : max(0, int(round(edge_column + 0.5 * (k - CENTRE))))] = False
    hu[~measured] = -1024.0
    return CTVolume(hu.astype(np.float32), geom, metadata=with_measured({}, measured))


def _on_volume(res: NoduleResult, vol: CTVolume) -> np.ndarray:
    """The nodule's mask on the whole volume's grid."""
    assert res.mask is not None and res.geometry is not None
    out = np.zeros(vol.shape, bool)
    i0 = np.round(vol.geometry.lps_to_index(np.asarray([res.geometry.origin]))[0]).astype(int)
    nk, nj, ni = res.mask.shape
    out[i0[2] : i0[2] + nk, i0[1] : i0[1] + nj, i0[0] : i0[0] + ni] = res.mask
    return out


@pytest.mark.parametrize("edge_column", [16.0, 17.0, 18.0])
def test_a_nodule_at_the_fields_edge_is_outlined_as_the_images_show_it(edge_column):
    """A nodule the sloped field edge touches (16) or cuts (17, 18): in the field, its mask is the one the same
    nodule gets with the whole lung around it measured, its threshold that one's."""
    whole = segment_nodule(_chest(None), FINDING)
    vol = _chest(edge_column)
    measured = measured_mask(vol.geometry, vol.metadata)
    assert measured is not None
    res = segment_nodule(vol, FINDING)
    assert whole.error is None and res.error is None, (whole.error, res.error)
    assert res.threshold_hu is not None and whole.threshold_hu is not None
    assert abs(res.threshold_hu - whole.threshold_hu) < 10.0, (res.threshold_hu, whole.threshold_hu)
    got, seen = _on_volume(res, vol), _on_volume(whole, vol) & measured
    assert not (got & ~measured).any()
    assert (got ^ seen).sum() <= 0.03 * seen.sum(), f"{int(got.sum())} voxels against {int(seen.sum())} seen in the field"


@pytest.mark.parametrize("edge_column", [21.0, 24.0, 30.0])
def test_a_finding_centred_in_the_unmeasured_wedge_is_refused_as_outside_the_field(edge_column):
    """A finding whose centre lies where no image of the tilted series measured anything: the rays from it read no
    nodule, and the error read 'no nodule boundary in or near the finding's box' (the nodule mostly in the field) or
    'no nodule in the box: centre -1024 HU' (the fill value), both pointing at a false positive. It says the centre
    lies outside the scanned field, where in LPS mm, and how far beyond the field's edge in its slice."""
    vol = _chest(edge_column)
    with pytest.raises(ReconstructionError) as err:
        segment_nodule(vol, FINDING, index=2, case_id="c1")
    exc = err.value
    assert exc.where == "case c1, finding 2"
    assert "outside the scanned field" in exc.problem and "(20.0, 20.0, 20.0) mm LPS" in exc.problem, exc.problem
    gap = edge_column - CENTRE  # columns of 1 mm between the centre and the field's first column in its slice
    assert f"{gap:.1f} mm beyond the field's edge in its slice" in exc.problem, exc.problem
    assert "false positive" not in str(exc) and "no nodule boundary" not in str(exc) and "no nodule in the box" not in str(exc)
    assert exc.fix is not None and "series" in exc.fix
    (res,) = segment_findings(vol, [FINDING])
    assert res.error is not None and "outside the scanned field" in res.error


def test_a_finding_centred_just_inside_the_field_is_still_measured():
    """The field's first measured column holds the centre: the nodule is measured on what the images show."""
    res = segment_nodule(_chest(float(CENTRE)), FINDING)
    assert res.error is None and res.volume_mm3 is not None and res.volume_mm3 > 0
