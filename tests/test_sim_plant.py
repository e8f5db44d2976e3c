"""The simulated arm's plant: exactly ident's dynamics (with Ia) when friction is off, energy conserved to the
integrator's order, free fall as an independent ODE solver says, friction dissipating exactly its power,
locked joints, the payload, and the sensors (current identity, quantisation, seeded noise)."""
import math

import numpy as np
import pytest
from scipy.integrate import solve_ivp
from sim_helpers import pinocchio_twin, total_energy

from ident.model import dynamics as dyn
from firmware_bridge.runtime.errors import InputError
from ident.model import load_model
from ident.payload import payload_parameters
from sim.plant import FrictionConfig, NoiseConfig, Plant

Q0 = np.array([0.1, 0.2, -0.3, 0.4, 0.5, 0.6])
QD0 = np.array([0.5, -0.4, 0.3, 1.0, 0.2, -0.6])
NO_FRICTION = FrictionConfig(enabled=False)


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def without_friction(model):
    """The model with fc = fv = offset = 0 (Ia kept)."""
    P = model.params_matrix().copy()
    P[:, 11:] = 0.0
    return model.with_parameters(P.ravel())


def friction_formula(model, v, ratio=0.25, vs=0.05, veps=0.01):
    """The documented friction curve, written out here independently of the kernel."""
    fc, fv, off = model.drive[:, 1], model.drive[:, 2], model.drive[:, 3]
    return (fc + ratio * fc * np.exp(-(v / vs) ** 2)) * np.tanh(v / veps) + fv * v + off


def test_friction_free_plant_is_ident_forward_dynamics_with_rotor_inertia(model):
    plant = Plant(model, friction=NO_FRICTION, noise=NoiseConfig.off())
    ref_model = without_friction(model)
    rng = np.random.default_rng(3)
    for _ in range(20):
        q, qd, tau = rng.uniform(-2, 2, (3, model.n))
        expected = dyn.forward_dynamics(ref_model, q, qd, tau, drive=True)
        np.testing.assert_allclose(plant.acceleration(q, qd, tau), expected, rtol=0, atol=1e-12)
        # and Ia really is in there: without it the answer differs
        assert np.abs(dyn.forward_dynamics(ref_model, q, qd, tau, drive=False) - expected).max() > 1e-3


def test_away_from_zero_speed_the_friction_is_idents_coulomb_viscous_offset(model):
    plant = Plant(model, friction=FrictionConfig(stribeck_ratio=0.0, smoothing_velocity=1e-3), noise=NoiseConfig.off(),
                  substeps=20)
    rng = np.random.default_rng(4)
    for _ in range(10):
        q, tau = rng.uniform(-2, 2, (2, model.n))
        qd = rng.choice([-1.0, 1.0], model.n) * rng.uniform(0.5, 2.0, model.n)  # tanh(qd / 1e-3) == +-1 exactly
        np.testing.assert_allclose(plant.acceleration(q, qd, tau), dyn.forward_dynamics(model, q, qd, tau),
                                   rtol=0, atol=1e-12)


def energy_drift(model, twin, integrator: str, substeps: int, seconds: float = 1.0) -> float:
    plant = Plant(model, friction=NO_FRICTION, noise=NoiseConfig.off(), integrator=integrator, substeps=substeps,
                  q0=Q0, qd0=QD0)
    e0 = total_energy(model, twin, plant.q, plant.qd)
    worst = 0.0
    for _ in range(round(seconds / plant.dt)):
        plant.advance(np.zeros(model.n))
        worst = max(worst, abs(total_energy(model, twin, plant.q, plant.qd) - e0))
    return worst


def test_energy_is_conserved_and_the_drift_shrinks_with_the_integrators_order(model):
    twin = pinocchio_twin(model)  # kinetic and potential energy from Pinocchio, rotors added
    rk1, rk2 = energy_drift(model, twin, "rk4", 1), energy_drift(model, twin, "rk4", 2)
    assert rk1 < 1e-6 * total_energy(model, twin, Q0, QD0)
    assert 12.0 < rk1 / rk2 < 20.0  # 4th order: halving h divides the error by 16
    se1, se2 = energy_drift(model, twin, "semi-implicit", 1), energy_drift(model, twin, "semi-implicit", 2)
    assert 1.7 < se1 / se2 < 2.3    # 1st order: by 2
    assert se2 > 100 * rk1


def test_free_fall_from_rest_matches_forward_dynamics_and_an_accurate_ode_solver(model):
    plant = Plant(model, friction=NO_FRICTION, noise=NoiseConfig.off(), q0=Q0)
    ref_model = without_friction(model)
    zero = np.zeros(model.n)
    plant.advance(zero)
    np.testing.assert_allclose(plant.qdd, dyn.forward_dynamics(ref_model, Q0, zero, zero), rtol=0, atol=1e-12)

    def rhs(t, x):
        return np.r_[x[6:], dyn.forward_dynamics(ref_model, x[:6], x[6:], zero)]

    ref = solve_ivp(rhs, (0.0, 0.5), np.r_[Q0, zero], method="DOP853", rtol=1e-12, atol=1e-12, t_eval=[0.001, 0.5])
    np.testing.assert_allclose(plant.q, ref.y[:6, 0], rtol=0, atol=1e-13)
    for _ in range(499):
        plant.advance(zero)
    assert np.abs(plant.q - Q0).max() > 1.0  # it really fell
    np.testing.assert_allclose(plant.q, ref.y[:6, 1], rtol=0, atol=1e-9)
    np.testing.assert_allclose(plant.qd, ref.y[6:, 1], rtol=0, atol=1e-8)


def test_fall_with_friction_matches_the_documented_friction_curve(model):
    plant = Plant(model, friction=FrictionConfig(), noise=NoiseConfig.off(), q0=Q0, substeps=8)
    ref_model = without_friction(model)

    def rhs(t, x):
        return np.r_[x[6:], dyn.forward_dynamics(ref_model, x[:6], x[6:], -friction_formula(model, x[6:]))]

    ref = solve_ivp(rhs, (0.0, 0.3), np.r_[Q0, np.zeros(6)], method="Radau", rtol=1e-10, atol=1e-10)
    for _ in range(300):
        plant.advance(np.zeros(model.n))
    np.testing.assert_allclose(plant.q, ref.y[:6, -1], rtol=0, atol=1e-7)
    np.testing.assert_allclose(plant.friction_torques(QD0), friction_formula(model, QD0), rtol=0, atol=1e-12)


def test_friction_dissipates_exactly_its_power(model):
    P = model.params_matrix().copy()
    P[:, 13] = 0.0  # no offset: the remaining friction is purely dissipative
    m = model.with_parameters(P.ravel())
    twin = pinocchio_twin(m)
    plant = Plant(m, friction=FrictionConfig(), noise=NoiseConfig.off(), q0=Q0, qd0=QD0, substeps=8)
    energy = [total_energy(m, twin, plant.q, plant.qd)]
    work = 0.0  # trapezoidal integral of qd . f(qd)
    power_prev = float(plant.qd @ friction_formula(m, plant.qd))
    for _ in range(400):
        plant.advance(np.zeros(m.n))
        energy.append(total_energy(m, twin, plant.q, plant.qd))
        power = float(plant.qd @ friction_formula(m, plant.qd))
        work += 0.5 * (power + power_prev) * plant.dt
        power_prev = power
    energy = np.array(energy)
    assert (np.diff(energy) < 1e-9).all()           # never gains energy
    lost = energy[0] - energy[-1]
    assert lost > 1.0                                # a real loss (J)
    assert abs(lost - work) < 2e-3 * lost            # and exactly what friction did


def test_locked_joints_stay_put_and_the_others_follow_the_reduced_dynamics(model):
    ref_model = without_friction(model)
    plant = Plant(model, friction=NO_FRICTION, noise=NoiseConfig.off(), q0=Q0, qd0=QD0)
    plant.brake[1] = True
    plant.stalled[4] = True
    tau = np.array([1.0, 2.0, -3.0, 0.5, 0.2, -0.1])
    qd = QD0.copy()
    qd[[1, 4]] = 0.0
    free = np.array([0, 2, 3, 5])
    M = dyn.mass_matrix(ref_model, Q0)
    bias = dyn.rnea(ref_model, Q0, qd, np.zeros(6))
    expected = np.zeros(6)
    expected[free] = np.linalg.solve(M[np.ix_(free, free)], (tau - bias)[free])
    np.testing.assert_allclose(plant.acceleration(Q0, qd, tau), expected, rtol=0, atol=1e-12)
    for _ in range(100):
        plant.advance(tau)
    assert plant.q[1] == Q0[1] and plant.q[4] == Q0[4] and plant.qd[1] == 0.0 and plant.qd[4] == 0.0
    assert np.abs(plant.q[free] - Q0[free]).min() > 1e-3


def test_payload_changes_the_gravity_torque_by_exactly_its_load_regressor_term(model):
    plant = Plant(model, friction=NO_FRICTION, noise=NoiseConfig.off())
    chi = payload_parameters(2.5, [0.02, -0.01, 0.07], [0.004, 0.0001, 0.0, 0.005, 0.0002, 0.003])
    rng = np.random.default_rng(7)
    zero = np.zeros(model.n)
    for _ in range(10):
        q = rng.uniform(-2, 2, model.n)
        hold_empty = dyn.gravity_torques(model, q)
        hold_loaded = hold_empty + dyn.load_regressor(model, q, zero, zero) @ chi  # independent kernel
        plant.detach_payload()
        np.testing.assert_allclose(plant.acceleration(q, zero, hold_empty), zero, atol=1e-10)
        plant.attach_payload(chi)
        np.testing.assert_allclose(plant.acceleration(q, zero, hold_loaded), zero, atol=1e-10)
        assert np.abs(plant.acceleration(q, zero, hold_empty)).max() > 1e-2  # it weighs
        qd, tau = rng.uniform(-1, 1, (2, model.n))
        np.testing.assert_allclose(plant.acceleration(q, qd, tau),
                                   dyn.forward_dynamics(without_friction(dyn.merge_payload(model, chi)), q, qd, tau),
                                   rtol=0, atol=1e-11)


def test_payload_that_cannot_exist_is_refused(model):
    with pytest.raises(InputError, match="mass"):
        payload_parameters(-1.0, [0, 0, 0])
    with pytest.raises(InputError, match="not a physical body"):
        payload_parameters(1.0, [0, 0, 0], [1.0, 0, 0, 0.1, 0, 0.1])  # triangle inequality broken
    with pytest.raises(InputError, match="com"):
        payload_parameters(1.0, [0, float("nan"), 0])


def test_motor_current_is_torque_over_gear_times_torque_constant(model):
    plant = Plant(model, noise=NoiseConfig.off())
    tau = np.array([40.0, -60.0, 12.0, -3.0, 1.5, 0.25])
    plant.advance(tau)
    current = np.empty(model.n)
    plant.measure_current(current)
    np.testing.assert_array_equal(current, tau / (model.gear_ratio * model.torque_constant))
    np.testing.assert_allclose(current * model.gear_ratio * model.torque_constant, tau, rtol=1e-15)
    assert current[0] == pytest.approx(40.0 / (100 * 0.12))


def test_quantisation_step_is_2pi_over_motor_counts_times_gear(model):
    counts = 1000  # coarse, so the steps are easy to see
    plant = Plant(model, noise=NoiseConfig(position_std=0.0, current_std=0.0, encoder_counts=counts))
    step = 2 * math.pi / (counts * model.gear_ratio)
    pos, cnt = np.empty(model.n), np.empty(model.n, dtype=np.int64)
    seen = [set() for _ in range(model.n)]
    for x in np.linspace(0.3, 0.3 + 5 * step.max(), 400):
        plant.set_state(np.full(model.n, x))
        plant.measure_position(pos, cnt)
        assert (np.abs(pos - x) <= step / 2 + 1e-15).all()
        np.testing.assert_allclose(pos, cnt * step, rtol=0, atol=1e-15)
        np.testing.assert_array_equal(cnt, np.round(x / step))
        for j in range(model.n):
            seen[j].add(pos[j])
    for j in range(model.n):
        levels = np.sort(list(seen[j]))
        np.testing.assert_allclose(np.diff(levels), step[j], rtol=1e-9)


def test_sensor_noise_has_the_configured_statistics_and_the_seed_repeats_it(model):
    def samples(seed):
        plant = Plant(model, noise=NoiseConfig(position_std=1e-4, current_std=0.05, encoder_counts=None), seed=seed,
                      q0=Q0)
        plant.advance(np.zeros(model.n))  # a motionless arm would fall: freeze it
        plant.brake[:] = True
        plant.set_state(Q0)
        plant.tau[:] = 1.2
        pos, cur, cnt = np.empty((4000, model.n)), np.empty((4000, model.n)), np.empty(model.n, dtype=np.int64)
        for k in range(4000):
            plant.measure_position(pos[k], cnt)
            plant.measure_current(cur[k])
        return pos - Q0, cur - 1.2 / (model.gear_ratio * model.torque_constant)

    pe, ce = samples(11)
    n = pe.size
    assert abs(pe.std() / 1e-4 - 1) < 4 / math.sqrt(2 * n) + 0.01
    assert abs(ce.std() / 0.05 - 1) < 4 / math.sqrt(2 * n) + 0.01
    assert abs(pe.mean()) < 4 * 1e-4 / math.sqrt(n) and abs(ce.mean()) < 4 * 0.05 / math.sqrt(n)
    assert abs(np.corrcoef(pe.ravel(), ce.ravel())[0, 1]) < 4 / math.sqrt(n)
    pe2, ce2 = samples(11)
    np.testing.assert_array_equal(pe, pe2)
    np.testing.assert_array_equal(ce, ce2)
    pe3, _ = samples(12)
    assert not np.array_equal(pe, pe3)


def test_too_few_substeps_for_the_friction_zone_is_refused_naming_the_joint(model):
    with pytest.raises(InputError, match=r"joint 4 \(j4\) needs >= \d+ substeps"):
        Plant(model, friction=FrictionConfig(smoothing_velocity=1e-4), substeps=1)
    with pytest.raises(InputError, match="smoothing_velocity"):
        Plant(model, friction=FrictionConfig(smoothing_velocity=0.0))
    with pytest.raises(InputError, match="integrator"):
        Plant(model, integrator="euler")
    with pytest.raises(InputError, match="encoder_counts"):
        Plant(model, noise=NoiseConfig(encoder_counts=0))
    with pytest.raises(InputError, match="q0"):
        Plant(model, q0=[0, 0, float("nan"), 0, 0, 0])
