"""The arm's frame tree as ROS tools see it: link names, the transform of each link in its parent for given
joint positions (what /tf carries), and the robot description (the URDF on /robot_description).

The frames are the URDF's links (ident.urdf_export): `base_link`, `link1` .. `linkn` (link j moves with joint
j) and the flange frame, fixed to the last link. Publishing these transforms and that URDF lets Foxglove's or
RViz's 3D panel draw the arm moving.
"""
from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

from ident.model import Model


def link_names(model: Model) -> list[str]:
    """The URDF link names: base_link, link1..linkn."""
    return ["base_link"] + [f"link{j + 1}" for j in range(model.n)]


def frame_tree(model: Model) -> list[tuple[str, str]]:
    """(parent, child) of each transform, in the order frame_transforms returns them: one per joint, then the
    flange's."""
    links = link_names(model)
    return [*zip(links[:-1], links[1:]), (links[-1], model.flange_frame)]


def frame_transforms(model: Model, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each child frame's placement in its parent for joint positions q (n,) or (M, n).

    Returns translations (..., n + 1, 3) in m and rotations as unit quaternions (..., n + 1, 4) in x, y, z, w
    order: frame j's placement in frame j - 1, turned (revolute) or moved (prismatic) by q_j about its axis,
    then the flange in the last link.
    """
    q = np.asarray(q, dtype=float)
    batch = q.reshape(-1, model.n)
    M, n = batch.shape
    revolute = model.joint_type == 0
    place = Rotation.from_quat(np.tile(Rotation.from_matrix(model.placement_R).as_quat(), (M, 1)))   # (M n,)
    angle = np.where(revolute, batch, 0.0)                                             # (M, n)
    turn = Rotation.from_rotvec((angle[..., None] * model.axis).reshape(-1, 3))        # (M n,)
    rot = np.concatenate([(place * turn).as_quat().reshape(M, n, 4),
                          np.broadcast_to(Rotation.from_matrix(model.flange_R).as_quat(), (M, 1, 4))], axis=1)
    slide = np.where(revolute, 0.0, batch)[..., None] * model.axis                     # (M, n, 3)
    trans = np.concatenate([model.placement_p + np.einsum("jab,mjb->mja", model.placement_R, slide),
                            np.broadcast_to(model.flange_p, (M, 1, 3))], axis=1)
    shape = q.shape[:-1] + (n + 1,)
    return trans.reshape(shape + (3,)), rot.reshape(shape + (4,))


def robot_description(model: Model) -> str:
    """The URDF of the model with the link names above and a stick figure to look at: a sphere at each joint and a
    cylinder from each link's origin to the next joint."""
    from ident.urdf_export import urdf_text

    return urdf_text(model, link_names(model), visuals=True)
