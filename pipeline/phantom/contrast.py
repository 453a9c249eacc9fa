"""IV contrast: HU of blood and enhancing organs by phase, and the heart's chambers (canonical grid, LPS mm).

Phases (values drawn per case within these ranges, HU):

* ``none``: blood 42, myocardium 42, liver 58, spleen 45, kidneys 30;
* ``arterial`` (systemic, about 25 s): aorta, arch branches, left heart and
  pulmonary veins 250..400; right heart 120..200 and pulmonary arteries
  150..250; lung vessels 180..260; kidney cortex 180..250 brighter than medulla;
* ``pulmonary`` (CT pulmonary angiography): right heart and pulmonary
  arteries 300..500; left heart, aorta and pulmonary veins 150..250;
* ``venous`` (portal venous, about 70 s): all blood 150..200; liver 100..130,
  spleen 110..130, kidneys 150..200.

Enhanced blood is never bone: the ``bone`` mask keeps bone only, and the
blood is recorded in the ``contrast_blood`` mask. With contrast the heart is
painted as blood pools (left and right, split by the septum) inside a
myocardial wall.
"""

from __future__ import annotations

import numpy as np

from .anatomy import AnatomyPainter
from .scene import Scene

BASE = {
    "aorta": 42.0,
    "left_heart": 42.0,
    "right_heart": 42.0,
    "pulmonary_artery": 42.0,
    "pulmonary_vein": 42.0,
    "lung_vessels": 42.0,
    "myocardium": 42.0,
    "liver": 58.0,
    "spleen": 45.0,
    "kidney_cortex": 30.0,
    "kidney_medulla": 30.0,
    "bowel_wall": 40.0,
    "atelectasis_gain": 0.0,
}


def blood_values(phase: str, rng: np.random.Generator) -> dict[str, float]:
    """HU of blood pools and enhancing organs for a contrast phase (see the module docstring)."""
    U = rng.uniform
    v = dict(BASE)
    if phase == "arterial":
        a = U(250.0, 400.0)
        v.update(
            aorta=a,
            left_heart=a * U(0.92, 1.0),
            pulmonary_vein=a * U(0.85, 1.0),
            right_heart=U(120.0, 200.0),
            pulmonary_artery=U(150.0, 250.0),
            lung_vessels=U(180.0, 260.0),
            myocardium=U(90.0, 130.0),
            liver=U(65.0, 80.0),
            spleen=U(90.0, 130.0),
            kidney_cortex=U(180.0, 250.0),
            kidney_medulla=U(70.0, 100.0),
            bowel_wall=U(70.0, 100.0),
            atelectasis_gain=U(40.0, 70.0),
        )
    elif phase == "pulmonary":
        p = U(300.0, 500.0)
        v.update(
            pulmonary_artery=p,
            right_heart=p * U(0.85, 1.0),
            left_heart=U(150.0, 250.0),
            pulmonary_vein=U(150.0, 250.0),
            lung_vessels=U(220.0, 320.0),
            myocardium=U(70.0, 100.0),
            liver=U(60.0, 70.0),
            spleen=U(60.0, 80.0),
            kidney_cortex=U(80.0, 120.0),
            kidney_medulla=U(40.0, 60.0),
            bowel_wall=U(50.0, 70.0),
            atelectasis_gain=U(30.0, 50.0),
        )
        v["aorta"] = v["left_heart"]
    elif phase == "venous":
        b = U(150.0, 200.0)
        v.update(
            aorta=b,
            left_heart=b,
            right_heart=b,
            pulmonary_artery=b,
            pulmonary_vein=b,
            lung_vessels=b * U(0.9, 1.0),
            myocardium=U(90.0, 120.0),
            liver=U(100.0, 130.0),
            spleen=U(110.0, 130.0),
            kidney_cortex=U(150.0, 200.0),
            bowel_wall=U(80.0, 110.0),
            atelectasis_gain=U(50.0, 80.0),
        )
        v["kidney_medulla"] = v["kidney_cortex"] * U(0.9, 1.0)
    return {k: round(float(x), 1) for k, x in v.items()}


def paint_heart(scene: Scene, painter: AnatomyPainter, hu: np.ndarray, slab: int = 16) -> None:
    """Repaint the heart as myocardium around left and right blood pools; pools go to ``contrast_blood``."""
    L = scene.layout
    grid = scene.grid
    s = L.scale
    blood = scene.blood
    wall = max(7.0 * s, 1.2 * grid.pixel_spacing)
    septum = max(4.0 * s, 1.0 * grid.pixel_spacing)
    cx, cy, cz = L.heart_c
    a, b, c = (max(v - wall, 0.5 * v) for v in L.heart_axes)
    ca, sa = np.cos(L.heart_angle), np.sin(L.heart_angle)
    dx = scene.x - cx
    dy = scene.y - cy
    xy = ((dx * ca + dy * sa) / a) ** 2 + ((-dx * sa + dy * ca) / b) ** 2
    n = np.array([-0.6, -0.8])  # towards the patient's right and front: the right heart
    side = dx * n[0] + dy * n[1] - 0.12 * L.heart_axes[0]
    right2 = side > 0.5 * septum
    left2 = side < -0.5 * septum
    pools = np.zeros(grid.shape, dtype=bool)
    for k0 in range(0, grid.shape[0], slab):
        k1 = min(k0 + slab, grid.shape[0])
        zs = grid.zs[k0:k1]
        heart = painter.heart_region(zs)
        if heart is None:
            continue
        inner = heart & (xy[None] + (((zs - cz) / c) ** 2)[:, None, None] < 1.0)
        sub = hu[k0:k1]
        sub[heart] = blood["myocardium"]
        right = inner & right2[None]
        left = inner & left2[None]
        sub[right] = blood["right_heart"]
        sub[left] = blood["left_heart"]
        pools[k0:k1] = right | left
    scene.add_mask("contrast_blood", pools)
