"""The simulated drives' CSP interpolation below 1 kHz (sim.drive_control.interpolant): it passes through the
targets one cycle behind the newest, is C2 across cycles, takes at each target the derivatives of the cubic
through its neighbours (numpy's interpolating polynomial as the oracle), reproduces cubic target sequences
exactly (and a quartic not), feeds the servo the interpolant's own mean velocity and acceleration over each
loop tick, and continues a lost target on the same cubic. In the simulator: the drive's reference at the end
of a cycle is the previous cycle's target, and a 250 Hz recording identifies viscous friction as a 1 kHz one."""
import numpy as np
import pytest
from numpy.polynomial import polynomial as P
from sim_helpers import enable, noise_free_seed000

from firmware_bridge.cia402 import Mode
from sim import Simulator
from sim import drive_control as dc
from sim.plant import NoiseConfig
from sim.simulator import interpolation_delay

T = 0.004                      # s, a 250 Hz cycle
K = dc.TARGETS_KEPT
S = np.linspace(0.0, 1.0, 9)   # fractions of the cycle


def evaluate(targets: np.ndarray, s: np.ndarray = S, period: float = T):
    """The interpolant of targets (n, K) at the fractions s: x, dx, ddx (len(s), n)."""
    out = [np.zeros((len(s), targets.shape[0])) for _ in range(3)]
    dc.interpolant(np.ascontiguousarray(targets), period, s, *out)
    return out


def samples(coefficients, m: int, first: int = -(K - 1)) -> np.ndarray:
    """A polynomial (coefficients low to high, per joint: (n, degree + 1)) at t = (first .. first + m - 1) T."""
    t = (first + np.arange(m)) * T
    return np.array([P.polyval(t, c) for c in coefficients])


def test_the_interpolant_runs_from_the_target_before_last_to_the_last_but_one_target():
    """One cycle behind the newest target: s = 0 is p[k-2], s = 1 is p[k-1] (the newest only shapes it)."""
    rng = np.random.default_rng(1)
    targets = rng.normal(size=(6, K))
    x, _, _ = evaluate(targets)
    np.testing.assert_allclose(x[0], targets[:, K - 3], rtol=0, atol=1e-12)
    np.testing.assert_allclose(x[-1], targets[:, K - 2], rtol=0, atol=1e-12)
    assert interpolation_delay(250.0) == pytest.approx(T) and interpolation_delay(1000.0) == 0.0


def test_at_each_target_the_velocity_and_acceleration_are_those_of_the_cubic_through_its_neighbours():
    """Oracle: numpy's cubic through p[m-2], p[m-1], p[m], p[m+1], differentiated at t_m."""
    rng = np.random.default_rng(2)
    targets = rng.normal(size=(3, K))
    _, dx, ddx = evaluate(targets)
    t = np.arange(K) * T
    for end, m in ((0, K - 3), (-1, K - 2)):
        for j in range(3):
            cubic = P.polyfit(t[m - 2:m + 2], targets[j, m - 2:m + 2], 3)
            assert dx[end, j] == pytest.approx(P.polyval(t[m], P.polyder(cubic)), rel=1e-9)
            assert ddx[end, j] == pytest.approx(P.polyval(t[m], P.polyder(cubic, 2)), rel=1e-9)


def test_the_interpolant_is_c2_across_cycles():
    """Consecutive cycles' pieces meet with equal position, velocity and acceleration at their common target
    (a random target stream: no smoothness to lean on); the jerk is free to jump."""
    rng = np.random.default_rng(3)
    stream = np.cumsum(rng.normal(size=(6, 20)), axis=1)
    ends = [evaluate(stream[:, w:w + K], np.array([0.0, 1.0])) for w in range(20 - K + 1)]
    for this, following in zip(ends, ends[1:]):
        for derivative in range(3):
            scale = np.abs(this[derivative]).max()
            np.testing.assert_allclose(this[derivative][1], following[derivative][0], rtol=0, atol=1e-12 * scale)


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_a_target_sequence_from_a_cubic_is_reproduced_exactly_with_its_derivatives(degree):
    rng = np.random.default_rng(degree)
    c = np.zeros((4, 4))
    c[:, :degree + 1] = rng.normal(size=(4, degree + 1)) * 10.0 ** np.arange(degree + 1)
    x, dx, ddx = evaluate(samples(c, K))
    t = (S - 2.0) * T                          # the cycle from t = -2T to -T, the newest target at 0
    for j in range(4):
        np.testing.assert_allclose(x[:, j], P.polyval(t, c[j]), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dx[:, j], P.polyval(t, P.polyder(c[j])), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(ddx[:, j], P.polyval(t, P.polyder(c[j], 2)), rtol=1e-7, atol=1e-7)


def test_a_quartic_target_sequence_is_not_reproduced_exactly():
    """The exactness stops at EXACT_DEGREE = 3: t^4 samples leave an error of the order of T^4."""
    assert dc.EXACT_DEGREE == 3
    c = np.array([[0.0, 0.0, 0.0, 0.0, 1.0e6]])         # 1e6 t^4 rad: 0.26 mrad at t = 4 ms
    x, _, _ = evaluate(samples(c, K))
    err = np.abs(x[:, 0] - P.polyval((S - 2.0) * T, c[0]))
    assert 1e-9 < err.max() < 1e6 * T ** 4


@pytest.mark.parametrize("ticks", [2, 3, 4])
def test_each_ticks_feed_forward_is_the_interpolants_mean_velocity_and_acceleration_over_that_tick(ticks):
    """tick_references: the reference at the end of tick i is x(i/k); vff and aff times the tick's length are
    the changes of x and of dx over the tick (a torque held over the tick then gives exactly that change of
    velocity on a pure inertia). On a constant-acceleration stream aff is that acceleration at every tick:
    no spike at the cycle boundaries (linear interpolation put the whole change of velocity into one tick)."""
    rng = np.random.default_rng(ticks)
    targets = rng.normal(size=(6, K))
    ref, vff, aff = (np.zeros((ticks, 6)) for _ in range(3))
    dc.tick_references(targets, T, ref, vff, aff)
    s = np.arange(ticks + 1) / ticks
    x, dx, _ = evaluate(targets, s)
    h = T / ticks
    np.testing.assert_allclose(ref, x[1:], rtol=0, atol=1e-12)
    np.testing.assert_allclose(vff * h, np.diff(x, axis=0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(aff * h, np.diff(dx, axis=0), rtol=0, atol=1e-9)
    accel = 7.5
    dc.tick_references(samples(np.array([[0.3, -1.2, 0.5 * accel]]), K), T, ref[:, :1], vff[:, :1], aff[:, :1])
    np.testing.assert_allclose(aff[:, 0], accel, rtol=1e-9)


def test_a_lost_target_continues_the_cubic_through_the_last_four_so_the_interpolant_does_not_change():
    """extrapolate on cubic samples at consecutive cycles gives the next sample exactly (fewer targets: the
    line, the parabola); a target stream with one extrapolated target interpolates exactly as the true stream."""
    c = np.array([[0.2, -1.0, 30.0, 2000.0]])
    stream = samples(c, K + 1)[0]
    def next_target(recent):
        return dc.extrapolate(list(range(len(recent))), list(recent), len(recent))

    assert next_target(stream[:4]) == pytest.approx(stream[4], abs=1e-13)
    assert next_target([1.0, 3.0]) == 5.0 and next_target([0.0, 1.0, 4.0]) == 9.0
    assert next_target([2.5]) == 2.5
    for bad in ([], [0.0] * 5):
        with pytest.raises(ValueError, match="stamps"):
            next_target(bad)
    # the drive's window when p[k] was lost: p[k-4] .. p[k-1] then the extrapolated p[k]
    lost = np.array([list(stream[:4]) + [next_target(stream[:4])]])
    for a, b in zip(evaluate(lost), evaluate(stream[None, :K])):     # x, dx, ddx: to rounding
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-11 * np.abs(b).max())


def test_at_250_hz_the_drives_reference_at_each_cycles_end_is_the_previous_cycles_target():
    """In the simulator, a drive in CSP streaming targets: after each cycle its reference (the last tick's)
    is the target latched one cycle before, interpolation_delay(250) = 4 ms; at 1 kHz the target itself."""
    for rate, lag in ((250.0, 1), (1000.0, 0)):
        sim = Simulator("generic6", rate_hz=rate, noise=NoiseConfig.off(), seed=0)
        q0 = sim.read_state().position.copy()
        enable(sim, Mode.CSP)
        assert round(interpolation_delay(rate) * rate) == lag
        sent = []
        for k in range(40):
            sent.append(q0 + 0.05 * np.sin(np.arange(1, 7) * 0.02 * k))
            sim.set_commands(target_position=sent[-1])
            sim.step(1)
            if k >= 6:     # the history has filled with streamed targets
                np.testing.assert_allclose(sim.drives.st[:, dc.PREV_REF], sent[-1 - lag], rtol=0, atol=1e-12)


def _identify_friction(rate: float, seconds: float) -> np.ndarray:
    """fv1..fv6 identified from a noise-free recording of seed000 at rate, relative errors (%)."""
    from ident.fit import batch, excitation
    from ident.model.base_params import base_parameters
    from ident.model import load_model

    model = load_model("generic6")
    base = base_parameters(model)
    truth = base.from_standard(model.standard_parameters())
    traj = excitation.preset("seed000")
    rec = noise_free_seed000(model, rate, seconds)
    fit = batch.identify(model, rec, trajectory=traj, slow_velocity=0.2).fit
    fv = [base.names.index(f"fv{j}") for j in range(1, 7)]
    return 100.0 * (fit.beta - truth)[fv] / truth[fv]


def test_a_noise_free_250_hz_recording_identifies_viscous_friction_without_bias():
    """8 s of seed000 at 250 Hz, perfect sensors: fv1..fv6 within 0.06 % of the truth (1 kHz gives 0.00-0.03 %
    over 40 s). With the targets interpolated linearly, as the drives did before, the same run gave
    +0.12, +0.20, +0.28, +0.09, +0.09, +0.07 %: the velocity kinks every cycle and the acceleration
    feed-forward's spike at each cycle's first tick, averaged into the cycle's current (docs/reference/simulator.md)."""
    err = _identify_friction(250.0, 8.0)
    assert np.abs(err).max() < 0.06, err
