"""Arms shared by the calibration tests, and the elementary-transform kinematics checked against
ident's kernels, Pinocchio (independent oracle) and finite differences."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chains import CHAINS, mdh_chain
from ident.model import dynamics, spatial
from ident.calibration.model import from_axes, from_model, home_geometry, tool_kinematics, tool_pose
from ident.model import REVOLUTE, JointSpec, build_model, load_model


def planar_2r(a1: float = 0.25, a2: float = 0.16):
    """The seed's planar RzRz arm: link lengths a1, a2 (m), the tool point at the end of link 2."""
    specs = []
    for j, d in enumerate((0.0, a1)):
        R, p = spatial.mdh_placement(0.0, d, 0.0, 0.0)
        specs.append(JointSpec(f"j{j + 1}", REVOLUTE, R, p, np.array([0.0, 0.0, 1.0]), np.zeros(10),
                               q_limits=(-np.pi, np.pi), dh=(0.0, d, 0.0, 0.0)))
    return build_model("planar2r", "<planar 2R>", specs, [0.0, 0.0, -9.81], np.eye(3), np.array([a2, 0.0, 0.0]))


def ur5_path() -> Path:
    """example-robot-data's UR5 URDF (skips the test when Pinocchio's data is not installed)."""
    pin = pytest.importorskip("pinocchio")
    prefix = Path(pin.__file__).resolve()
    while prefix.name != "cmeel.prefix":
        prefix = prefix.parent
    path = prefix / "share" / "example-robot-data" / "robots" / "ur_description" / "urdf" / "ur5_robot.urdf"
    if not path.exists():
        pytest.skip(f"{path} not installed")
    return path


def arm(name: str):
    """An ident Model by name: shipped models, test chains of tests/chains.py, 'planar2r', 'ur5'."""
    if name == "planar2r":
        return planar_2r()
    if name == "ur5":
        return load_model(ur5_path(), tip="wrist_3_link")
    if name in CHAINS:
        return mdh_chain(name)
    return load_model(name)


def random_q(model, count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    wide = np.where(model.joint_type == REVOLUTE, np.pi, 1.0)
    lo = np.where(np.isfinite(model.q_min), model.q_min, -wide)
    hi = np.where(np.isfinite(model.q_max), model.q_max, wide)
    return rng.uniform(lo, hi, size=(count, model.n))


@pytest.mark.parametrize("name", ["puma560", "generic6", "planar2r", "ur5", *sorted(CHAINS)])
def test_nominal_chain_reproduces_the_flange_pose_of_the_dynamics_core(name):
    model = arm(name)
    cm = from_model(model)
    assert cm.m == 6 * (model.n + 1) + model.n
    q = random_q(model, 40, seed=1)
    np.testing.assert_allclose(tool_pose(cm, q), dynamics.flange_pose(model, q), atol=1e-12)


def test_tool_point_is_the_flange_point_in_pinocchio_for_the_ur5():
    pin = pytest.importorskip("pinocchio")
    model = arm("ur5")
    full = pin.buildModelFromUrdf(str(ur5_path()))
    data = full.createData()
    tool = np.array([0.03, 0.12, -0.02])
    cm = from_model(model, tool)
    q = random_q(model, 10, seed=2)
    ours = tool_pose(cm, q)
    fid = full.getFrameId("wrist_3_link")
    for i in range(len(q)):
        pin.framesForwardKinematics(full, data, q[i])
        M = data.oMf[fid]
        np.testing.assert_allclose(ours[i, :3, 3], M.translation + M.rotation @ tool, atol=1e-12)


@pytest.mark.parametrize("name", ["puma560", "stanford_RRPRRR", "skew_RRR"])
def test_identification_jacobian_matches_central_differences(name):
    cm = from_model(arm(name), (0.05, -0.03, 0.12))
    rng = np.random.default_rng(3)
    values = cm.nominal + rng.normal(0, 0.01, cm.m)
    q = random_q(arm(name), 7, seed=4)
    pose, J = tool_kinematics(cm, q, values)
    h = 1e-6
    for k in range(cm.m):
        dv = np.zeros(cm.m)
        dv[k] = h
        Tp, Tm = tool_pose(cm, q, values + dv), tool_pose(cm, q, values - dv)
        dp = (Tp[:, :3, 3] - Tm[:, :3, 3]) / (2 * h)
        dR = (Tp[:, :3, :3] - Tm[:, :3, :3]) / (2 * h)
        W = dR @ pose[:, :3, :3].transpose(0, 2, 1)          # skew(dω)
        dw = np.stack([W[:, 2, 1], W[:, 0, 2], W[:, 1, 0]], axis=1)
        np.testing.assert_allclose(J[:, :3, k], dp, atol=1e-8, err_msg=cm.names()[k])
        np.testing.assert_allclose(J[:, 3:, k], dw, atol=1e-8, err_msg=cm.names()[k])


def test_home_geometry_alone_rebuilds_the_same_arm_whatever_the_base_frame():
    """from_axes needs no DH values: lines and a tool pose give the same kinematics."""
    model = arm("generic6")
    points, dirs, fR, fp = home_geometry(model)
    B = spatial.rot_z(0.4) @ spatial.rot_y(0.3)
    b = np.array([0.2, -0.1, 0.5])
    cm = from_axes(points @ B.T + b, dirs @ B.T, model.joint_type, B @ fR, B @ fp + b)
    q = random_q(model, 20, seed=5)
    T = dynamics.flange_pose(model, q)
    np.testing.assert_allclose(tool_pose(cm, q)[:, :3, 3], T[:, :3, 3] @ B.T + b, atol=1e-12)
    np.testing.assert_allclose(tool_pose(cm, q)[:, :3, :3], B @ T[:, :3, :3], atol=1e-12)
