"""Pinocchio as the independent oracle: our URDF import and numba dynamics against pinocchio's, on the
UR5 and the Panda (fingers locked) shipped with example-robot-data."""
from pathlib import Path

import numpy as np
import pytest

pin = pytest.importorskip("pinocchio")

from ident.model import dynamics as dyn  # noqa: E402
from ident.model import load_model  # noqa: E402


def robots_dir() -> Path:
    prefix = Path(pin.__file__).resolve()
    while prefix.name != "cmeel.prefix":
        prefix = prefix.parent
    return prefix / "share" / "example-robot-data" / "robots"


ARMS = {
    "ur5": ("ur_description/urdf/ur5_robot.urdf", "", "wrist_3_link"),
    "panda": ("panda_description/urdf/panda.urdf", "panda_link8", "panda_link8"),
}

# pinocchio's per-body dynamic parameters [m, mX, mY, mZ, XX, XY, YY, XZ, YZ, ZZ] -> our positions
PIN_TO_OURS = [9, 6, 7, 8, 0, 1, 3, 2, 4, 5]


@pytest.fixture(scope="module", params=sorted(ARMS))
def arm(request):
    rel, tip, frame = ARMS[request.param]
    path = robots_dir() / rel
    if not path.exists():
        pytest.skip(f"{path} not shipped by this example-robot-data")
    ours = load_model(path, tip=tip)
    full = pin.buildModelFromUrdf(str(path))
    chain = set(ours.joint_names)
    lock = [full.getJointId(nm) for nm in full.names[1:] if nm not in chain]
    model = pin.buildReducedModel(full, lock, pin.neutral(full)) if lock else full
    assert model.nq == ours.n and list(model.names[1:]) == list(ours.joint_names)
    rng = np.random.default_rng(0)
    lo = np.where(np.isfinite(ours.q_min), ours.q_min, -np.pi)
    hi = np.where(np.isfinite(ours.q_max), ours.q_max, np.pi)
    q = rng.uniform(lo, hi, size=(50, ours.n))
    qd, qdd = rng.normal(0, 2, size=(2, 50, ours.n))
    return ours, model, model.createData(), frame, q, qd, qdd


def test_urdf_import_gives_pinocchios_inertias(arm):
    ours, model, *_ = arm
    for j in range(ours.n):
        theirs = model.inertias[j + 1].toDynamicParameters()
        np.testing.assert_allclose(ours.inertial[j][PIN_TO_OURS], theirs, atol=1e-12)


def test_rnea_matches(arm):
    ours, model, data, _, q, qd, qdd = arm
    tau = dyn.rnea(ours, q, qd, qdd, drive=False)
    for s in range(len(q)):
        np.testing.assert_allclose(tau[s], pin.rnea(model, data, q[s], qd[s], qdd[s]), rtol=0, atol=1e-9)


def test_regressor_matches_with_explicit_column_map(arm):
    ours, model, data, _, q, qd, qdd = arm
    Y = dyn.regressor(ours, q, qd, qdd)
    n = ours.n
    cols = np.array([14 * j + k for j in range(n) for k in PIN_TO_OURS])
    for s in range(len(q)):
        theirs = pin.computeJointTorqueRegressor(model, data, q[s], qd[s], qdd[s])
        np.testing.assert_allclose(Y[s][:, cols], theirs, rtol=0, atol=1e-9)


def test_mass_matrix_gravity_and_forward_dynamics_match(arm):
    ours, model, data, _, q, qd, qdd = arm
    M = dyn.mass_matrix(ours, q, drive=False)
    G = dyn.gravity_torques(ours, q)
    tau = dyn.rnea(ours, q, qd, qdd, drive=False)
    acc = dyn.forward_dynamics(ours, q, qd, tau, drive=False)
    for s in range(len(q)):
        Mp = pin.crba(model, data, q[s])
        Mp = np.triu(Mp) + np.triu(Mp, 1).T
        np.testing.assert_allclose(M[s], Mp, atol=1e-10)
        np.testing.assert_allclose(G[s], pin.computeGeneralizedGravity(model, data, q[s]), atol=1e-9)
        np.testing.assert_allclose(acc[s], pin.aba(model, data, q[s], qd[s], tau[s]), atol=1e-8)


def test_flange_pose_and_jacobian_match(arm):
    ours, model, data, frame, q, *_ = arm
    pose, J = dyn.flange_kinematics(ours, q)
    fid = model.getFrameId(frame)
    for s in range(len(q)):
        pin.framesForwardKinematics(model, data, q[s])
        np.testing.assert_allclose(pose[s], data.oMf[fid].homogeneous, atol=1e-12)
        Jp = pin.computeFrameJacobian(model, data, q[s], fid, pin.LOCAL_WORLD_ALIGNED)
        np.testing.assert_allclose(J[s], Jp, atol=1e-12)


def test_payload_matches_a_body_appended_in_pinocchio(arm):
    ours, model, _, frame, q, qd, qdd = arm
    payload = pin.Inertia(1.7, np.array([0.02, -0.01, 0.08]), np.array([[5e-3, 1e-4, 2e-4], [1e-4, 6e-3, -3e-4],
                                                                         [2e-4, -3e-4, 4e-3]]))
    chi_load = payload.toDynamicParameters()[np.argsort(PIN_TO_OURS)]
    loaded = model.copy()
    f = loaded.frames[loaded.getFrameId(frame)]
    loaded.appendBodyToJoint(f.parentJoint, payload, f.placement)
    data = loaded.createData()
    tau_load = dyn.load_regressor(ours, q, qd, qdd) @ chi_load
    base = dyn.rnea(ours, q, qd, qdd, drive=False)
    for s in range(len(q)):
        np.testing.assert_allclose(base[s] + tau_load[s], pin.rnea(loaded, data, q[s], qd[s], qdd[s]), atol=1e-9)
