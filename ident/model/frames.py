"""The arm's frame tree as ROS tools see it: link names, the transform of each link in its parent for given
joint positions (what /tf carries), and the robot description (the URDF on /robot_description).

The frames are the URDF's links (ident.model.urdf_export): `base_link`, `link1` .. `linkn` (link j moves with joint
j) and the flange frame, fixed to the last link. Publishing these transforms and that URDF lets Foxglove's or
RViz's 3D panel draw the arm moving.
"""
from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

from ident.model.robot import Model
from ident.model.urdf_export import urdf_text


def link_names(model: Model) -> list[str]:
    """The URDF link names: base_link, link1..linkn."""
    return ["base_link"] + [f"link{j + 1}" for j in range(model.n)]


def frame_tree(model: Model) -> list[tuple[str, str]]:
    """(parent, child) of each transform, in the order frame_transforms returns them: one per joint, then the
    flange's."""
    links = link_names(model)
    return [*zip(links[:-1], links[1:]), (links[-1], model.flange_frame)]


_PLACEMENTS: dict[int, tuple[Model, np.ndarray, np.ndarray]] = {}


def _placements(model: Model) -> tuple[np.ndarray, np.ndarray]:
    """The joints' and the flange's fixed rotations as quaternions (x, y, z, w), computed once per model."""
    entry = _PLACEMENTS.get(id(model))
    if entry is None or entry[0] is not model:
        if len(_PLACEMENTS) > 64:
            _PLACEMENTS.clear()
        entry = _PLACEMENTS[id(model)] = (model, Rotation.from_matrix(model.placement_R).as_quat(),
                                          Rotation.from_matrix(model.flange_R).as_quat())
    return entry[1], entry[2]


def _quat_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product a b of quaternions (x, y, z, w), broadcast over the leading axes."""
    ax, ay, az, aw = np.moveaxis(a, -1, 0)
    bx, by, bz, bw = np.moveaxis(b, -1, 0)
    return np.stack([aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw,
                     aw * bw - ax * bx - ay * by - az * bz], axis=-1)


def frame_transforms(model: Model, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each child frame's placement in its parent for joint positions q (n,) or (M, n).

    Returns translations (..., n + 1, 3) in m and rotations as unit quaternions (..., n + 1, 4) in x, y, z, w
    order: frame j's placement in frame j - 1, turned (revolute) or moved (prismatic) by q_j about its axis,
    then the flange in the last link.
    """
    q = np.asarray(q, dtype=float)
    batch = q.reshape(-1, model.n)
    M, n = batch.shape
    place, flange = _placements(model)
    revolute = model.joint_type == 0
    half = np.where(revolute, batch, 0.0)[..., None] / 2                               # (M, n, 1)
    turn = np.concatenate([np.sin(half) * model.axis, np.cos(half)], axis=-1)           # (M, n, 4)
    rot = np.concatenate([_quat_product(place, turn), np.broadcast_to(flange, (M, 1, 4))], axis=1)
    slide = np.where(revolute, 0.0, batch)[..., None] * model.axis                     # (M, n, 3)
    trans = np.concatenate([model.placement_p + (model.placement_R @ slide[..., None])[..., 0],
                            np.broadcast_to(model.flange_p, (M, 1, 3))], axis=1)
    shape = q.shape[:-1] + (n + 1,)
    return trans.reshape(shape + (3,)), rot.reshape(shape + (4,))


def robot_description(model: Model) -> str:
    """The URDF of the model with the link names above and a stick figure to look at: a sphere at each joint and a
    cylinder from each link's origin to the next joint."""
    return urdf_text(model, link_names(model), visuals=True)
