"""The frame tree ROS tools see (ident.model.frames): the transforms compose to armid's own flange kinematics, batch and
single agree, and the robot description is a URDF that Pinocchio (the independent oracle) reads to the same
link placements."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from ident.model import dynamics, frames
from ident.model import load_model

PRISMATIC_URDF = """<?xml version="1.0"?>
<robot name="slider">
  <link name="b"/>
  <link name="l1"><inertial><mass value="1.0"/><origin xyz="0 0 0.1"/>
    <inertia ixx="0.01" ixy="0" ixz="0" iyy="0.01" iyz="0" izz="0.01"/></inertial></link>
  <link name="l2"><inertial><mass value="0.5"/><origin xyz="0.05 0 0"/>
    <inertia ixx="0.002" ixy="0" ixz="0" iyy="0.002" iyz="0" izz="0.002"/></inertial></link>
  <link name="l3"><inertial><mass value="0.3"/><origin xyz="0 0.02 0"/>
    <inertia ixx="0.001" ixy="0" ixz="0" iyy="0.001" iyz="0" izz="0.001"/></inertial></link>
  <joint name="a" type="revolute"><parent link="b"/><child link="l1"/><origin xyz="0 0 0.3" rpy="0.1 0 0"/>
    <axis xyz="0 0 1"/><limit lower="-3" upper="3" effort="10" velocity="2"/></joint>
  <joint name="s" type="prismatic"><parent link="l1"/><child link="l2"/><origin xyz="0.2 0 0.1" rpy="0 0.4 0.2"/>
    <axis xyz="0.6 0 0.8"/><limit lower="-0.5" upper="0.5" effort="10" velocity="1"/></joint>
  <joint name="c" type="revolute"><parent link="l2"/><child link="l3"/><origin xyz="0 0.1 0" rpy="0 0 0.3"/>
    <axis xyz="0 1 0"/><limit lower="-3" upper="3" effort="10" velocity="2"/></joint>
</robot>
"""


@pytest.fixture(params=["generic6", "puma560", "prismatic"])
def model(request, tmp_path):
    if request.param != "prismatic":
        return load_model(request.param)
    path = tmp_path / "slider.urdf"
    path.write_text(PRISMATIC_URDF)
    return load_model(path)


def _random_q(model, seed: int, count: int) -> np.ndarray:
    lo = np.where(np.isfinite(model.q_min), model.q_min, -np.pi)
    hi = np.where(np.isfinite(model.q_max), model.q_max, np.pi)
    return np.random.default_rng(seed).uniform(lo, hi, size=(count, model.n))


def _compose(t: np.ndarray, r: np.ndarray) -> list[np.ndarray]:
    """Poses (4, 4) in the base of every child frame, composing the transforms in order."""
    T, out = np.eye(4), []
    for k in range(len(t)):
        step = np.eye(4)
        step[:3, :3], step[:3, 3] = Rotation.from_quat(r[k]).as_matrix(), t[k]
        T = T @ step
        out.append(T)
    return out


def test_the_transforms_compose_to_the_flange_pose_of_armids_kinematics(model):
    q = _random_q(model, 1, 25)
    t, r = frames.frame_transforms(model, q)
    assert t.shape == (25, model.n + 1, 3) and r.shape == (25, model.n + 1, 4)
    np.testing.assert_allclose(np.linalg.norm(r, axis=-1), 1.0, atol=1e-12)
    poses = dynamics.flange_pose(model, q)
    for m in range(len(q)):
        np.testing.assert_allclose(_compose(t[m], r[m])[-1], poses[m], atol=1e-12)
        t1, r1 = frames.frame_transforms(model, q[m])          # one sample, the same numbers
        np.testing.assert_array_equal(t1, t[m])
        np.testing.assert_allclose(r1, r[m], atol=1e-15)
    tree = frames.frame_tree(model)
    assert tree[0][0] == "base_link" and tree[-1] == (f"link{model.n}", model.flange_frame)
    assert all(child == parent for (_, child), (parent, _) in zip(tree, tree[1:]))   # one chain


def test_pinocchio_reads_the_robot_description_to_the_same_link_placements(model):
    pin = pytest.importorskip("pinocchio")
    urdf = frames.robot_description(model)
    assert urdf.count("<visual>") >= model.n + 1 and "<cylinder" in urdf
    pm = pin.buildModelFromXML(urdf)
    data = pm.createData()
    assert pm.nq == model.n
    for q in _random_q(model, 2, 10):
        pin.framesForwardKinematics(pm, data, q)
        t, r = frames.frame_transforms(model, q)
        for (_, child), ours in zip(frames.frame_tree(model), _compose(t, r)):
            np.testing.assert_allclose(data.oMf[pm.getFrameId(child)].homogeneous, ours, atol=1e-12, err_msg=child)


def test_the_robot_description_reads_back_into_the_same_kinematics(model, tmp_path):
    path = tmp_path / "described.urdf"
    path.write_text(frames.robot_description(model))
    back = load_model(path, tip=model.flange_frame)
    q = _random_q(model, 3, 10)
    np.testing.assert_allclose(dynamics.flange_pose(back, q), dynamics.flange_pose(model, q), atol=1e-12)
