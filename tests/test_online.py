"""Online identification on a sample stream: the batch pipeline's filter as a causal FIR with a known
delay, aligned torques, Gautier's per-joint weights by a first pass, gaps and bad samples, agreement with
batch least squares on the same rows, persistence."""
import json

import numpy as np
import pytest

from ident.model import dynamics
from ident.model.base_params import base_parameters
from ident.fit.excitation import FourierTrajectory
from ident.fit.batch import identify
from ident.model import load_model
from ident.online import EstimateFileError, JointWeightedRLS, OnlineIdentifier, SampleWindow
from ident.fit.preprocess import Recording, prepare
from rounding import assert_equal_up_to_rounding, factorization_bound, least_squares_bound_of, relative_difference

RATE = 1000.0


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


@pytest.fixture(scope="module")
def base(model):
    return base_parameters(model)


def _motion():
    rng = np.random.default_rng(7)
    traj = FourierTrajectory(0.25, rng.uniform(-0.3, 0.3, 6), rng.uniform(-0.6, 0.6, (6, 4)), rng.uniform(-0.6, 0.6, (6, 4)))
    t = np.arange(int(12 * RATE)) / RATE
    return t, *traj.evaluate(t)


@pytest.fixture(scope="module")
def run(model):
    """12 s of an exciting motion at 1 kHz: q and the exact inverse-dynamics torque."""
    t, q, qd, qdd = _motion()
    tau = dynamics.rnea(model, q, qd, qdd)
    return np.arange(t.size), q, tau, qd, qdd


@pytest.fixture(scope="module")
def smooth(model):
    """The same motion with a torque free of Coulomb jumps (fc = 0 in the arm that made it): a low-pass
    that smears a jump of the measured torque cannot meet the unsmeared sign(qd) column of its row, so
    exact-recovery checks use this torque. Returns seq, q, tau, qd, qdd and the arm's base parameters."""
    chi = model.standard_parameters().copy()
    chi[11::14] = 0.0                        # fc of every joint (XX .. m Ia fc fv offset)
    arm = model.with_parameters(chi)
    t, q, qd, qdd = _motion()
    return np.arange(t.size), q, dynamics.rnea(arm, q, qd, qdd), qd, qdd, base_parameters(model).from_standard(chi)


def _feed(ident, seq, q, tau, batch=500):
    for k in range(0, seq.size, batch):
        ident.push(seq[k:k + batch], q[k:k + batch], tau[k:k + batch])


def test_the_causal_filter_is_the_batch_pipelines_zero_phase_filter_and_central_differences(smooth):
    """q, qd, qdd and the torque at the window centres equal ident.fit.preprocess.prepare (sosfiltfilt
    Butterworth + central differences) on the same samples, to the truncation of the impulse response."""
    seq, q, tau = smooth[:3]
    t = seq / RATE
    s = prepare(Recording(t, q, tau, None, None, "run"), cutoff_hz=40.0)
    window = SampleWindow(6, rate_hz=RATE, cutoff_hz=40.0)
    rows = window.push(seq, q, tau)
    assert window.delay == (window.window - 1) // 2 and rows.count == seq.size - (window.window - 1)
    common, a, b = np.intersect1d(rows.seq, np.rint(s.t * RATE).astype(int), return_indices=True)
    assert common.size > 0.95 * rows.count
    inner = slice(window.window, -window.window)     # where the batch's own edge padding has died out too
    a, b = a[inner], b[inner]
    for got, want in ((rows.q, s.q), (rows.qd, s.qd), (rows.qdd, s.qdd), (rows.tau, s.y)):
        scale = np.max(np.abs(want), axis=0)
        assert np.max(np.abs(got[a] - want[b]) / scale) < 2e-4


@pytest.mark.parametrize("delay_samples", [0.5, 2.25])
def test_a_lagging_torque_is_read_as_late_as_the_batch_pipeline_reads_it(smooth, delay_samples):
    """A torque recorded d late (tau_rec(t) = tau(t - d)): the rows' torques equal the batch pipeline's
    (prepare with the recording's effort_delay: a spline through the filtered torque read at t + d) and the
    undelayed torque's rows, and not the unaligned ones."""
    seq, q, tau = smooth[:3]
    t = seq / RATE
    d = delay_samples / RATE
    late = np.stack([np.interp(t - d, t, tau[:, j]) for j in range(6)], axis=1)    # tau is smooth: exact to 1e-7
    rec = Recording(t, q, late, None, None, "late", d)
    s = prepare(rec, cutoff_hz=40.0)
    window = SampleWindow(6, rate_hz=RATE, cutoff_hz=40.0, effort_delay=d)
    rows = window.push(seq, q, late)
    on_time = SampleWindow(6, rate_hz=RATE, cutoff_hz=40.0).push(seq, q, tau)
    unaligned = SampleWindow(6, rate_hz=RATE, cutoff_hz=40.0).push(seq, q, late)
    assert window.window == SampleWindow(6, rate_hz=RATE, cutoff_hz=40.0).window + 2 * int(np.ceil(delay_samples))
    common, a, b = np.intersect1d(rows.seq, np.rint(s.t * RATE).astype(int), return_indices=True)
    inner = slice(window.window, -window.window)
    a, b = a[inner], b[inner]
    scale = np.max(np.abs(s.y), axis=0)
    assert np.max(np.abs(rows.tau[a] - s.y[b]) / scale) < 2e-5          # measured 6e-6
    _, c, e = np.intersect1d(rows.seq, on_time.seq, return_indices=True)
    _, f, g = np.intersect1d(rows.seq, unaligned.seq, return_indices=True)
    aligned_error = np.max(np.abs(rows.tau[c] - on_time.tau[e]) / scale)
    assert aligned_error < 2e-5                                              # measured 4e-6
    assert np.max(np.abs(unaligned.tau[g] - rows.tau[f]) / scale) > 100 * aligned_error   # 3e-3, 1.4e-2


def test_the_effort_delay_is_checked_and_can_change_on_a_running_identifier(model, base):
    with pytest.raises(Exception, match="effort_delay: expected a finite number of seconds within"):
        SampleWindow(6, effort_delay=float("nan"))
    ident = OnlineIdentifier(model, base=base, effort_delay=0.0005)
    assert ident.effort_delay == 0.0005 and ident.window == SampleWindow(6).window + 2
    ident.samples.counters.samples = 7
    ident.set_effort_delay(0.003)
    assert ident.effort_delay == 0.003 and ident.window == SampleWindow(6).window + 6
    assert ident.counters.samples == 7 and ident.delay == (ident.window - 1) // 2


def test_noise_free_stream_predicts_torque_to_a_tiny_fraction_and_recovers_the_model(model, base, smooth):
    seq, q, tau, qd, qdd, truth = smooth
    ident = OnlineIdentifier(model, base=base, p0=1e8)
    _feed(ident, seq, q, tau)
    rep = ident.report()
    # the torque the estimate predicts from the exact states, vs the torque itself
    pred = base.regressor(dynamics.regressor(model, q, qd, qdd)) @ rep.theta
    # the filter passes this motion's band untouched and central differences are exact to ~1e-5: so is the fit
    assert np.sqrt(np.mean((pred - tau) ** 2)) < 1e-3 * np.sqrt(np.mean(tau ** 2))
    well = rep.sigma_percent < 1.0
    assert well.sum() >= 10
    # (atol: a few parameters are ~1e-5 kg m^2, below what this motion's torques resolve relatively)
    np.testing.assert_allclose(rep.theta[well], truth[well], rtol=2e-3, atol=1e-5)
    assert rep.rows == seq.size - (ident.window - 1)


def test_per_joint_weights_come_from_the_first_pass_and_the_estimate_is_then_batch_wls(model, base, smooth):
    """After warmup_rows rows per joint, the weights are Gautier's 1/sigma_j of the first pass's OLS
    residuals (close to the batch's on the same rows); with no forgetting the estimate is then exactly the
    WLS of all rows with those weights, and within 3 sigma of the batch pipeline with the same filter."""
    seq, q, tau = smooth[:3]
    noisy = tau + np.random.default_rng(3).normal(size=tau.shape) * np.linspace(0.01, 0.05, 6)
    ident = OnlineIdentifier(model, base=base, p0=1e8, warmup_rows=3000)   # a huge prior: a ridge of 1e-8
    _feed(ident, seq[:2000], q[:2000], noisy[:2000])
    assert ident.fit.joint_sigma is None                     # still in the first pass
    _feed(ident, seq[2000:], q[2000:], noisy[2000:])
    sigma = ident.fit.joint_sigma
    assert sigma is not None and np.all(np.diff(sigma[3:]) > 0)      # the noise grows with the joint
    rec = Recording(seq / RATE, q, noisy, None, None, "run")
    same_rows = identify(model, rec, base=base, cutoff_hz=40.0, decimate=1).fit
    np.testing.assert_allclose(sigma, same_rows.sigma_joint, rtol=0.2)    # 3000 of 11800 rows: close
    # the batch pipeline as it runs (decimated: nearly independent rows, so its sigmas are honest; the
    # 1 kHz rows after a 40 Hz filter are correlated over ~10 samples and their sigmas would be too small)
    batch = identify(model, rec, base=base, cutoff_hz=40.0).fit
    well = batch.relative_std_pct < 1.0
    assert well.sum() >= 10
    assert np.all(np.abs(ident.rls.theta - batch.beta)[well] < 3 * batch.std[well])
    # and the WLS (with the prior 1/p0 as a ridge) of the same rows with the first pass's weights, to
    # rounding (the factored filter: 1e-10 here; the test allowed the covariance form 2e-3, at p0 = 1e4)
    rows = SampleWindow(6, rate_hz=RATE, cutoff_hz=40.0).push(seq, q, noisy)
    Yb = base.regressor(dynamics.regressor(model, rows.q, rows.qd, rows.qdd))
    use = np.abs(rows.qd) >= ident.min_speed
    A, b = (Yb / sigma[None, :, None])[use], (rows.tau / sigma)[use]
    wls = np.linalg.solve(A.T @ A + np.eye(A.shape[1]) / 1e8, A.T @ b)
    np.testing.assert_allclose(ident.rls.theta[well], wls[well], rtol=1e-8)


def test_a_joint_that_did_not_move_in_the_first_pass_is_weighted_by_its_own_rows_once_it_moves():
    """The first pass ends while joint 6 has no rows: it is provisional, weighted meanwhile by the largest
    sigma_j of the others; once it has warmup_rows rows of its own its weight is its own 1/sigma_6 (here
    ten times the others' noise; a few wild first errors do not inflate it), and the other joints' weights
    stay."""
    rng = np.random.default_rng(4)
    p, n, N, warmup = 8, 6, 6000, 1000
    theta = rng.normal(size=p)
    noise = np.array([0.01, 0.02, 0.015, 0.01, 0.02, 0.2])
    Phi = rng.normal(size=(N, n, p))
    y = Phi @ theta + rng.normal(size=(N, n)) * noise
    use = np.ones((N, n), dtype=bool)
    use[:3000, 5] = False                                    # joint 6 still for the first 3 s
    y[3000:3003, 5] += 20.0             # its first rows predicted far off (100 sigma): the median ignores them
    fit = JointWeightedRLS(p, n, warmup_rows=warmup)
    fit.update(Phi[:1500], y[:1500], use[:1500])
    first = fit.joint_sigma
    assert first is not None and fit.provisional.tolist() == [False] * 5 + [True]
    assert first[5] == np.max(first[:5])
    np.testing.assert_allclose(first[:5], noise[:5], rtol=0.1)
    fit.update(Phi[1500:3900], y[1500:3900], use[1500:3900])  # 900 rows of joint 6: not enough yet
    assert fit.provisional[5] and fit.joint_sigma[5] == first[5]
    fit.update(Phi[3900:], y[3900:], use[3900:])
    assert not fit.provisional.any()
    assert fit.joint_sigma[5] == pytest.approx(noise[5], rel=0.08)       # 1000 rows: ~2 % of scatter
    np.testing.assert_array_equal(fit.joint_sigma[:5], first[:5])
    np.testing.assert_allclose(fit.rls.theta, theta, atol=5e-3)


def test_torques_are_aligned_with_the_delayed_regressor_rows(model, base, smooth):
    """Shifting the torque by one sample against the positions makes the prediction error grow by orders
    of magnitude: the identifier's own alignment is exact."""
    seq, q, tau = smooth[:3]
    aligned = OnlineIdentifier(model, base=base, p0=1e8)
    shifted = OnlineIdentifier(model, base=base, p0=1e8)
    _feed(aligned, seq[:6000], q[:6000], tau[:6000])
    _feed(shifted, seq[:6000], q[:6000], np.roll(tau, 1, axis=0)[:6000])
    aligned.report(), shifted.report()       # errors are counted from here, after the start-up transient
    _feed(aligned, seq[6000:], q[6000:], tau[6000:])
    _feed(shifted, seq[6000:], q[6000:], np.roll(tau, 1, axis=0)[6000:])
    assert shifted.report().prediction_rms.max() > 30 * aligned.report().prediction_rms.max()


def test_a_sequence_gap_restarts_the_window_and_no_row_spans_it(model, base, run):
    seq, q, tau = run[:3]
    keep = np.r_[0:3000, 3100:6000]
    ident = OnlineIdentifier(model, base=base)
    _feed(ident, seq[:3000], q[:3000], tau[:3000], batch=137)          # the gap arrives with the next push
    _feed(ident, seq[3100:6000], q[3100:6000], tau[3100:6000], batch=137)
    c = ident.counters
    assert (c.gaps, c.lost) == (1, 100)
    assert c.rows == keep.size - 2 * (ident.window - 1)
    two = OnlineIdentifier(model, base=base)       # in the same pushes: the weights' first pass ends after one
    _feed(two, seq[:3000], q[:3000], tau[:3000], batch=137)
    two.samples.clear()
    _feed(two, seq[3100:6000], q[3100:6000], tau[3100:6000], batch=137)
    # equal to rounding: the same rows in other blocks of samples can differ in their last bits (BLAS and
    # numba's threads sum in an order that depends on the blocks and the memory): a least-squares problem's
    # perturbation, amplified by its conditioning, read from the information matrix P^-1 (tests/rounding.py);
    # a row spanning the gap would move the estimate far more
    rls = two.rls
    info = np.linalg.eigvalsh(np.linalg.inv(rls.P))
    bound = least_squares_bound_of(np.sqrt(info[-1] / info[0]), np.sqrt(info[-1]), np.linalg.norm(rls.theta),
                                   np.sqrt(rls.residual_variance * rls.rows), rls.rows, rls.p)
    assert_equal_up_to_rounding(ident.rls.theta, two.rls.theta, bound)


def test_non_finite_samples_are_dropped_and_never_reach_the_filter(model, base, run):
    seq, q, tau = run[:3]
    q2, tau2 = q[:4000].copy(), tau[:4000].copy()
    q2[1500, 2] = np.nan
    tau2[2500, 4] = np.inf
    ident = OnlineIdentifier(model, base=base)
    _feed(ident, seq[:4000], q2, tau2)
    assert ident.counters.rejected == 2 and ident.counters.filled == 2 and ident.counters.gaps == 0
    assert np.isfinite(ident.rls.theta).all() and np.isfinite(ident.rls.P).all()
    assert ident.counters.rows == 4000 - 2 - (ident.window - 1)      # no row at the two dropped samples


def test_short_gaps_are_bridged_without_rows_at_missing_samples_and_repeats_are_dropped(model, base, run):
    """Asynchronous clocks make the stream skip or repeat a device sample now and then: the window
    bridges up to max_fill missing samples, builds rows only at measured ones, and drops repeats."""
    seq, q, tau = run[:3]
    keep = np.flatnonzero((np.arange(seq.size) % 10 != 3) & (np.arange(seq.size) % 37 != 5))
    order = np.sort(np.r_[keep, keep[::50]])                  # every 50th kept sample arrives twice
    ident = OnlineIdentifier(model, base=base, p0=1e8)
    _feed(ident, seq[order], q[order], tau[order], batch=333)
    c = ident.counters
    assert c.repeated == keep[::50].size and c.gaps == 0
    assert c.filled == seq.size - keep.size
    assert c.rows == keep.size - np.sum(keep < ident.delay) - np.sum(keep >= seq.size - ident.delay)
    full = OnlineIdentifier(model, base=base, p0=1e8)
    _feed(full, seq, q, tau)
    # this exact stream's only residual is a model error (the filter smears the Coulomb jumps, the row's
    # sign(qd) does not), not noise: the two row sets differ by a few sigmas, so compare the parameters
    # known to 0.3 %
    well = full.report().sigma_percent < 0.3
    assert well.sum() >= 10
    np.testing.assert_allclose(ident.rls.theta[well], full.rls.theta[well], rtol=5e-3)


def test_report_converges_on_steady_data_and_not_before(model, base, run):
    seq, q, tau = run[:3]
    ident = OnlineIdentifier(model, base=base, p0=1e8)   # a huge prior: P = U D U' stays positive definite
    _feed(ident, seq[:200], q[:200], tau[:200])
    assert not ident.report().converged
    flags = []
    for k in range(200, seq.size, 1000):
        _feed(ident, seq[k:k + 1000], q[k:k + 1000], tau[k:k + 1000])
        flags.append(ident.report().converged)
    assert flags[-1] and not flags[0]


def test_at_a_large_prior_covariance_the_convergence_flag_once_set_stays_set(model, base, run):
    """p0 = 1e8 (with Gautier's weights, a prior about 1e20 times a row's weight): the covariance form went
    through rounding-indefinite states early on, and its scalar row updates drifted enough to flip the flag
    (True, False, False, False, True on this feed). The factored filter (P = U D U', D > 0) stays
    converged once it is, keeps P positive definite, and ends at the default p0's estimate."""
    seq, q, tau = run[:3]
    flags, estimates = {}, {}
    for p0 in (1e4, 1e8):
        ident = OnlineIdentifier(model, base=base, p0=p0)
        _feed(ident, seq[:200], q[:200], tau[:200])
        flags[p0] = [ident.report().converged]
        for k in range(200, seq.size, 1000):
            _feed(ident, seq[k:k + 1000], q[k:k + 1000], tau[k:k + 1000])
            flags[p0].append(ident.report().converged)
        estimates[p0] = ident.report()
        assert ident.rls.stats[3] == 0                       # no sample skipped
        assert np.all(ident.rls.D > 0) and np.linalg.eigvalsh(ident.rls.P).min() > 0
        assert np.isfinite(estimates[p0].sigma_percent).all()
    for f in flags.values():
        assert f[-1] and not f[0] and f == sorted(f), f       # False ... False, True ... True
    well = estimates[1e4].sigma_percent < 0.3
    assert well.sum() >= 10
    np.testing.assert_allclose(estimates[1e8].theta[well], estimates[1e4].theta[well], rtol=2e-3)


def test_saved_estimate_survives_a_restart_and_refuses_another_model(model, base, run, tmp_path):
    seq, q, tau = run[:3]
    ident = OnlineIdentifier(model, base=base)
    _feed(ident, seq[:3000], q[:3000], tau[:3000])
    path = tmp_path / "estimate.json"
    ident.save(path)
    fresh = OnlineIdentifier(model, base=base)
    fresh.load(path)
    np.testing.assert_array_equal(fresh.rls.theta, ident.rls.theta)
    np.testing.assert_array_equal(fresh.rls.P, ident.rls.P)      # P's factors saved: the same state exactly
    np.testing.assert_array_equal(fresh.rls.D, ident.rls.D)
    # a file written before the factors were saved: P is factored, the same P to rounding
    doc = json.loads(path.read_text())
    old = tmp_path / "old.json"
    old.write_text(json.dumps({k: v for k, v in doc.items() if k not in ("U", "D")}))
    fresh.load(old)
    assert_equal_up_to_rounding(fresh.rls.P, ident.rls.P, factorization_bound(ident.p))
    # a covariance that is not positive definite, or broken factors, is refused naming the field
    doc_bad = {k: v for k, v in doc.items() if k not in ("U", "D")}
    doc_bad["P"] = (-np.eye(ident.p)).tolist()
    old.write_text(json.dumps(doc_bad))
    with pytest.raises(EstimateFileError, match="P/U/D: P0: not positive definite"):
        fresh.load(old)
    doc["D"][3] = -1.0
    old.write_text(json.dumps(doc))
    with pytest.raises(EstimateFileError, match="P/U/D: factors: D is not finite and positive"):
        fresh.load(old)
    other = OnlineIdentifier(load_model("puma560"))
    with pytest.raises(EstimateFileError, match="not this model's"):
        other.load(path)
    path.write_text("{broken")
    with pytest.raises(EstimateFileError, match="not a saved estimate"):
        fresh.load(path)
