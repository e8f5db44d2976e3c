"""The dynamic payload methods of seed 000 (ident.payload.dynamic) and the payload excitation plan.

Noise-free runs come from Pinocchio (the UR5 of example-robot-data, a body appended at the flange) so that
the data do not share code with the identification; the seed 000 scenario runs the simulator."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg

from ident.model import dynamics, spatial
from ident.fit import excitation
from firmware_bridge.runtime.errors import InputError
from ident.model import load_model
from design_gradients import assert_design_gradients_exact  # noqa: E402  (tests/ is on sys.path)
from ident.payload import PARAMETER_NAMES, dynamic, payload_parameters
from ident.payload.result import Combination
from ident.model.base_params import base_parameters
from ident.payload.excitation import moving_joints, payload_columns, payload_criterion, plan
from ident.fit.preprocess import Recording

pin = pytest.importorskip("pinocchio")

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import payload_seed000  # noqa: E402

PIN_TO_OURS = [9, 6, 7, 8, 0, 1, 3, 2, 4, 5]   # pinocchio's [m, mX, mY, mZ, XX, XY, YY, XZ, YY, ZZ] -> ours
RATE = 1000.0
SECONDS = 8.0


def _robots_dir() -> Path:
    prefix = Path(pin.__file__).resolve()
    while prefix.name != "cmeel.prefix":
        prefix = prefix.parent
    return prefix / "share" / "example-robot-data" / "robots"


def _pin_runs(chi_load: np.ndarray, traj: excitation.FourierTrajectory, seconds: float = SECONDS):
    """(our model, unloaded and loaded Recordings of torques) computed by pinocchio's RNEA on the UR5, the
    loaded one with the payload chi_load (our order, flange frame) appended to the last body."""
    path = _robots_dir() / "ur_description/urdf/ur5_robot.urdf"
    if not path.exists():
        pytest.skip(f"{path} not shipped by this example-robot-data")
    ours = load_model(path)
    arm = pin.buildModelFromUrdf(str(path))
    loaded = arm.copy()
    frame = loaded.frames[loaded.getFrameId("wrist_3_link")]
    loaded.appendBodyToJoint(frame.parentJoint, pin.Inertia.FromDynamicParameters(chi_load[PIN_TO_OURS]),
                             frame.placement)
    t = np.arange(int(seconds * RATE)) / RATE
    q, qd, qdd = traj.evaluate(t)
    taus = []
    for m in (arm, loaded):
        data = m.createData()
        taus.append(np.array([pin.rnea(m, data, q[k], qd[k], qdd[k]) for k in range(len(t))]))
    return ours, Recording(t, q, taus[0], None, None, "unloaded.npz"), Recording(t, q, taus[1], None, None, "loaded.npz")


CHI = payload_parameters(2.5, (0.012, -0.008, 0.07), (0.011, 4e-4, -3e-4, 0.013, 5e-4, 0.004))


WRIST_PAYLOAD = (3.0, (0.0, 0.0, 0.05), (0.01, 0.0, 0.0, 0.01, 0.0, 0.003))   # the heaviest, for the limits
WRIST_POSE = np.array([0.3, -0.2, 0.4, 0.0, 0.0, 0.0])


@pytest.fixture(scope="module")
def wrist_plan():
    return plan(load_model("generic6"), "wrist", payload=WRIST_PAYLOAD, start_pose=WRIST_POSE, max_iter=15)


@pytest.fixture(scope="module")
def pin_runs():
    return _pin_runs(CHI, excitation.preset("seed000"))


@pytest.mark.parametrize("method", dynamic.METHODS)
def test_noise_free_runs_recover_every_payload_parameter_exactly(pin_runs, method):
    model, unloaded, loaded = pin_runs
    est = dynamic.identify(model, loaded, unloaded, method, trajectory=excitation.preset("seed000"))
    assert est.method == method and est.identified == PARAMETER_NAMES
    np.testing.assert_allclose(est.chi, CHI, rtol=0, atol=1e-6)
    assert est.consistent and est.consistency == "" and est.combinations == []
    assert np.all(est.sigma < 1e-6) and np.all(np.isfinite(est.sigma))
    np.testing.assert_allclose(est.com, CHI[6:9] / CHI[9], atol=1e-6)


def test_runs_read_from_npz_files_give_the_same_estimate(pin_runs, tmp_path):
    model, unloaded, loaded = pin_runs
    traj = excitation.preset("seed000")
    files = dynamic.identify(model, _npz(tmp_path / "l.npz", loaded), _npz(tmp_path / "u.npz", unloaded), "torque",
                             trajectory=traj)
    arrays = dynamic.identify(model, loaded, unloaded, "torque", trajectory=traj)
    np.testing.assert_array_equal(files.chi, arrays.chi)
    assert files.samples == arrays.samples > 100


def test_the_consistent_global_fit_is_exact_on_noise_free_runs(pin_runs):
    model, unloaded, loaded = pin_runs
    est = dynamic.identify(model, loaded, unloaded, "global", consistent=True, trajectory=excitation.preset("seed000"))
    assert est.method == "global-consistent" and est.consistent
    np.testing.assert_allclose(est.chi, CHI, rtol=0, atol=1e-6)


def test_a_non_physical_estimate_is_flagged_and_the_constrained_fit_makes_it_a_body(pin_runs):
    """A 'payload' whose inertia about its centre of mass breaks the triangle inequality (no body has it):
    every method reports it inconsistent; the constrained global fit returns a real body."""
    model, unloaded, _ = pin_runs
    bad = spatial.body_parameters(2.5, (0.012, -0.008, 0.07), np.diag([1e-3, 1e-3, 0.01]))   # 1e-3 + 1e-3 < 0.01
    Yl = dynamics.load_regressor(model, *excitation.preset("seed000").evaluate(unloaded.t))
    loaded = Recording(unloaded.t, unloaded.q, unloaded.tau + Yl @ bad, None, None, "bad.npz")
    for method in dynamic.METHODS:
        est = dynamic.identify(model, loaded, unloaded, method, trajectory=excitation.preset("seed000"))
        np.testing.assert_allclose(est.chi, bad, atol=1e-6)
        assert not est.consistent and "triangle" in est.consistency, method
    fixed = dynamic.identify(model, loaded, unloaded, "global", consistent=True, trajectory=excitation.preset("seed000"))
    assert fixed.consistent, fixed.consistency
    ok = payload_parameters(fixed.mass, fixed.com, fixed.inertia_com)   # raises for a body that cannot exist
    assert np.isfinite(ok).all() and abs(fixed.mass - bad[9]) < 0.01


def test_a_negative_mass_is_flagged():
    assert dynamic.physical_consistency(-CHI) == (False, f"mass {-CHI[9]:.6g} kg is not positive")
    assert dynamic.physical_consistency(CHI) == (True, "")


def test_partial_estimates_are_consistent_only_if_some_body_matches_them():
    """Only ZZ (about the flange origin) known: any body has ZZ >= 0. With a combination XX - YY = 0.01 and
    ZZ = 0.001 known: XX - YY <= ZZ for every body (triangle inequality about the origin), so none matches."""
    only_zz = np.full(10, np.nan)
    only_zz[5] = -0.01
    ok, why = dynamic.physical_consistency(only_zz)
    assert not ok and "no body matches" in why
    only_zz[5] = 0.01
    assert dynamic.physical_consistency(only_zz) == (True, "")
    c = np.zeros(10)
    c[[0, 3]] = 1.0, -1.0
    only_zz[5] = 0.001
    assert not dynamic.physical_consistency(only_zz, [Combination("XX - YY", c, 0.01, 0.0)])[0]
    assert dynamic.physical_consistency(only_zz, [Combination("XX - YY", c, 0.0005, 0.0)]) == (True, "")


def test_wrist_only_runs_identify_exactly_what_the_wrist_torques_determine(wrist_plan):
    """Only the wrist moves, so only the wrist joints' rows count (the others are slow rows): one payload
    direction is invisible. The estimate names the combinations it does determine, each exact, and none
    of them sees the invisible direction (the null space of the wrist rows of the payload regressor,
    computed here by scipy)."""
    model, traj = load_model("generic6"), wrist_plan
    t = np.arange(int(0.5 * traj.period * RATE)) / RATE
    q, qd, qdd = traj.evaluate(t)
    tau_u = dynamics.rnea(model, q, qd, qdd)
    tau_l = dynamics.rnea(dynamics.merge_payload(model, CHI), q, qd, qdd)
    unloaded = Recording(t, q, tau_u, None, None, "u.npz")
    loaded = Recording(t, q, tau_l, None, None, "l.npz")
    wrist = moving_joints(model, "wrist")
    invisible = scipy.linalg.null_space(dynamics.load_regressor(model, q[::50], qd[::50], qdd[::50])[:, wrist, :]
                                        .reshape(-1, 10))
    assert invisible.shape[1] == 1
    for method in ("torque", "global"):
        est = dynamic.identify(model, loaded, unloaded, method, trajectory=traj)
        assert len(est.identified) + len(est.combinations) == 9, method
        assert est.combinations, method
        for c in est.combinations:
            assert abs(c.coefficients @ invisible[:, 0]) < 1e-9
            assert c.value == pytest.approx(c.coefficients @ CHI, abs=1e-6)
        for k, name in enumerate(PARAMETER_NAMES):
            if name in est.identified:
                assert est.chi[k] == pytest.approx(CHI[k], abs=1e-6)
                assert abs(invisible[k, 0]) < 1e-9
            else:
                assert np.isnan(est.chi[k]) and np.isnan(est.sigma[k])
        assert est.consistent, est.consistency
        doc = est.to_json()
        assert doc["combinations"] and None in doc["parameters"].values()
    body = dynamic.identify(model, loaded, unloaded, "global", consistent=True, trajectory=traj)
    assert body.consistent and body.identified == est.identified
    np.testing.assert_allclose([c.value for c in body.combinations], [c.coefficients @ CHI for c in body.combinations],
                               atol=1e-6)


def test_the_wrist_plan_moves_only_the_wrist_and_keeps_the_limits_with_the_payload(wrist_plan):
    model, traj, payload = load_model("generic6"), wrist_plan, WRIST_PAYLOAD
    assert np.all(traj.a[:3] == 0) and np.all(traj.b[:3] == 0) and np.abs(traj.a[3:]).max() > 0.1
    np.testing.assert_array_equal(traj.q0[:3], WRIST_POSE[:3])          # the held joints stay at the start pose
    assert excitation.at_rest(traj)
    excitation.check(dynamics.merge_payload(model, payload_parameters(*payload)), traj)
    assert traj.info["cond"] < traj.info["start_cond"]
    assert traj.info["identifiable_combinations"] == 9
    full = dynamic.plan(model, "all", max_iter=15)        # the entry `armid payload plan` calls
    assert np.abs(full.a).max(axis=1).min() > 0 and full.info["identifiable_combinations"] == 10
    Y = dynamics.regressor(model, *full.evaluate(np.linspace(0, full.period, 120, endpoint=False))) @ payload_columns(model)
    s = np.linalg.svd(Y.reshape(-1, 10), compute_uv=False)
    assert s[0] / s[-1] == pytest.approx(full.info["cond"], rel=1e-6)   # the criterion is the payload regressor's cond
    with pytest.raises(InputError, match="joints: expected 'wrist' or 'all'"):
        plan(model, "elbow")


def test_payload_design_gradients_are_exact_with_only_the_wrist_free():
    """The payload criterion and the held joints go through the design's chain rule: its gradients against
    tests/design_gradients.py's fourth-order central difference, off the rest samples where sign(qd) jumps."""
    model = load_model("generic6")
    wrist = moving_joints(model, "wrist")
    pose = WRIST_POSE
    target = payload_criterion(model, wrist, pose)
    p = excitation._Problem(model, base_parameters(model), 0.2, 3, pose, "cond", None, 24, target, wrist)
    assert p.size == 3 * p.k
    z = assert_design_gradients_exact(p)
    q = p.motion(z)[0]
    np.testing.assert_allclose(q[:, :3], np.broadcast_to(pose[:3], q[:, :3].shape), atol=1e-12)   # held at the pose
    assert np.ptp(q[:, 3:], axis=0).min() > 0


def test_seed000_scenario_global_mass_error_within_the_seeds(tmp_path):
    """1.5 kg and 3 kg on generic6 in the simulator (CSP drives, encoder quantisation, Stribeck friction,
    current noise, currents turned into torques with the drive gains), half a period of the seed's
    excitation: the global method's mass error at most the seed's 0.12 % / 0.33 %."""
    model, traj, unloaded, loaded = payload_seed000.scenario(seconds=5.0)
    for name, rec in loaded.items():
        truth = payload_seed000.CAD[name]
        for method in dynamic.METHODS:
            est = dynamic.identify(model, rec, unloaded, method, trajectory=traj)
            dm, pct, dc = payload_seed000.errors(est, truth)
            assert est.consistent, (method, name, est.consistency)
            assert np.isfinite(est.sigma[9]) and est.sigma[9] > 0
            if method == "global":
                assert pct <= payload_seed000.SEED_MASS_ERROR_PCT[name], (name, est.mass)
                assert dc < 2.0, (name, est.com)            # mm
                assert any("nominal drive gains" in n for n in est.notes)


def _npz(path: Path, rec: Recording, **override) -> Path:
    arrays = dict(t=rec.t, q=rec.q, tau=rec.tau)
    arrays.update(override)
    np.savez(path, **arrays)
    return path


def test_bad_input_gives_one_clear_error(pin_runs, tmp_path):
    model, unloaded, loaded = pin_runs
    u = _npz(tmp_path / "u.npz", unloaded)
    nan_tau = loaded.tau.copy()
    nan_tau[123, 2] = np.nan
    cases = {
        "method: expected one of": dict(loaded=loaded, unloaded=unloaded, method="magic"),
        "bad.npz": dict(loaded=_npz(tmp_path / "bad.npz", loaded, tau=nan_tau), unloaded=u, method="global"),
        "the torque method subtracts the runs sample by sample": dict(
            loaded=Recording(loaded.t[:-500], loaded.q[:-500], loaded.tau[:-500], None, None, "short.npz"),
            unloaded=unloaded, method="torque"),
        "5 joints recorded": dict(loaded=Recording(loaded.t, loaded.q[:, :5], loaded.tau[:, :5], None, None, "five.npz"),
                                  unloaded=unloaded, method="global"),
        "record both alike": dict(loaded=Recording(loaded.t, loaded.q, None, loaded.tau / 10, None, "amps.npz"),
                                  unloaded=unloaded, method="global"),
        "too few": dict(loaded=Recording(loaded.t[:60], loaded.q[:60], loaded.tau[:60], None, None, "tiny.npz"),
                        unloaded=Recording(unloaded.t[:60], unloaded.q[:60], unloaded.tau[:60], None, None, "tiny0.npz"),
                        method="global"),
        "constrained fit is offered for the global method": dict(loaded=loaded, unloaded=unloaded, method="torque",
                                                                 consistent=True),
        "unknown option 'cutoff'": dict(loaded=loaded, unloaded=unloaded, cutoff=3.0),
    }
    for expected, kwargs in cases.items():
        with pytest.raises(InputError) as info:
            dynamic.identify(model, **kwargs)
        message = str(info.value)
        assert expected in message and "\n" not in message, (expected, message)
