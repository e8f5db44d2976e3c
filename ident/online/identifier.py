"""Online identification of the base parameters from a live sample stream (no sockets: ident/online/service.py
feeds it).

Per sample: joint positions q (rad) and joint torques tau (N m) at a fixed rate, with a sequence number.

**The batch pipeline's filter, causal with a known delay** (`zero_phase_kernels`, `SampleWindow`). The batch
pipeline (ident.fit.preprocess.prepare) low-passes q and tau with a zero-phase (forward-backward) Butterworth
of order 4 and differentiates the filtered q by central differences. Online, the same operation is a FIR:
the forward-backward filter's impulse response (symmetric), truncated where the batch pipeline trims its
edges (ident.fit.preprocess.edge_samples: the slowest pole decayed by 1e-4), convolved with the central
difference stencils. Its window is L = 2 D + 3 samples and it estimates q, qd, qdd and the filtered tau
at the window's centre, D + 1 samples in the past (98 ms at 1 kHz with the default 40 Hz cut-off, the
batch pipeline's noise floor). The torque of a row is that same sample's torque through the same filter,
so regressor rows and torques are aligned in time and filtered alike, as in the batch pipeline. (A
differentiator with another band, e.g. a 41-sample Savitzky-Golay window whose band ends near 30 Hz,
cuts into the servo's real motion: on the HIL stream it moved ZZR2 by 130 % from the batch estimate.)

Samples carry the drives' sample index. A non-finite sample is dropped (it then counts as missing), and
nothing non-finite reaches the filter. Up to `max_fill` (3, as the batch pipeline bridges) missing samples in a
row are bridged by linear interpolation of the positions, for the differentiation window only: no row is
built at an interpolated sample. A longer gap restarts the window: no row spans it.

Rows of the base regressor (ident.model.dynamics.regressor, ident.model.base_params) feed ident.online.rls.RecursiveLS.
Rows of joints slower than `min_speed` (rad/s, by default the batch pipeline's threshold), where Coulomb
friction is ill-modelled, get weight 0.

**Per-joint weights as in the batch WLS (Gautier), by a first pass** (`JointWeightedRLS`): until every
joint has `warmup_rows` used rows (joints with fewer than a tenth of that are taken as not moving), the
rows are kept and fed with unit weights (the estimate is the OLS one). Then each joint's sigma_j from the
a-posteriori residuals of those rows, unbiased for the parameters the joints share (the batch pipeline's
ident.fit.hac.noise_variances), the filter restarts and replays them with weights 1/sigma_j, and every later row of
joint j is weighted 1/sigma_j. With no forgetting the estimate is then the WLS estimate of all rows with
those weights. A joint that had not moved is weighted by the largest sigma_j of the others until it has
`warmup_rows` rows of its own (it is `provisional` until then), and then by the spread of those rows'
a-priori errors (1.4826 times their median absolute value). Giving `joint_sigma` skips the first pass.

Convergence: the estimate is `converged` when its relative change between consecutive reports stayed
below `converge_tol` for `converge_reports` reports and at least 20 rows per parameter were used.
"""
from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.interpolate
import scipy.signal

from ident.model import dynamics
from ident.model.base_params import BaseParameters, base_parameters
from ident.fit.batch import DEFAULT_SLOW_VELOCITY
from ident.fit.hac import noise_variances
from firmware_bridge.runtime.errors import InputError
from firmware_bridge.runtime.counters import Counters as CountersBase
from ident.model import Model
from ident.fit.preprocess import MAX_BRIDGED_SAMPLES, NOISE_CUTOFF_HZ, check_effort_delay, edge_samples
from ident.online.rls import RecursiveLS


class EstimateFileError(InputError):
    """A saved estimate cannot be loaded (file, field, or model mismatch)."""


@dataclass
class Counters(CountersBase):
    """What the sample window did with the stream's samples."""

    samples: int = 0          # samples received
    rejected: int = 0         # non-finite samples dropped
    repeated: int = 0         # samples not after the previous one (dropped)
    filled: int = 0           # missing samples bridged by interpolation (no row built there)
    gaps: int = 0             # longer gaps (each restarts the window)
    lost: int = 0             # samples missing in those gaps
    rows: int = 0             # samples whose rows reached the filter


@dataclass
class Report:
    """One published estimate."""

    names: list[str]
    theta: np.ndarray
    sigma_percent: np.ndarray
    prediction_rms: np.ndarray       # (n,) N m, a-priori torque prediction error of the rows used since the last report
    rows: int
    converged: bool
    frozen: bool
    counters: Counters = field(default_factory=Counters)
    joint_sigma: np.ndarray | None = None   # (n,) N m, the per-joint weights' sigma_j (None: first pass)

    def to_json(self) -> dict:
        def finite(a):
            return [float(x) if math.isfinite(x) else None for x in a]

        return {"names": self.names, "theta": finite(self.theta), "sigma_percent": finite(self.sigma_percent),
                "prediction_rms": finite(self.prediction_rms), "samples": self.rows, "converged": self.converged,
                "frozen": self.frozen, "counters": self.counters.as_dict(),
                "joint_sigma": None if self.joint_sigma is None else finite(self.joint_sigma)}


MAX_KERNEL_EDGE = 50_000   # samples at each side of zero_phase_kernels' window (the 40 Hz default at 1 kHz: ~50)


def zero_phase_kernels(cutoff_hz: float, rate_hz: float, order: int = 4, effort_shift: float = 0.0) -> np.ndarray:
    """The batch pipeline's preprocessing as four FIR kernels (4, L) applied as dot products over a window
    of L = 2 (D + s) + 3 samples (oldest first): the zero-phase Butterworth (order `order`, cut-off in Hz)
    value, and the central-difference first (1/s) and second (1/s^2) derivatives of the filtered signal,
    all at the window's centre; and the filtered value effort_shift samples after the centre (for an effort
    that lags the positions by that much: ident.fit.preprocess.Recording.effort_delay times the rate), read
    from a cubic spline through the kernel as the batch pipeline reads the filtered effort from a cubic
    spline. D = ident.fit.preprocess.edge_samples (where the batch pipeline trims its edges); s = ceil(|shift|)."""
    if not (math.isfinite(cutoff_hz) and 0 < cutoff_hz < rate_hz / 2):
        raise InputError(f"cutoff: expected a frequency between 0 and {rate_hz / 2:g} Hz, got {cutoff_hz!r}")
    if not math.isfinite(effort_shift):
        raise InputError(f"effort shift: expected a finite number of samples, got {effort_shift!r}")
    with warnings.catch_warnings():    # a cut-off far below the rate warns of bad coefficients; refused below
        warnings.simplefilter("ignore", scipy.signal.BadCoefficients)
        sos = scipy.signal.butter(order, cutoff_hz, fs=rate_hz, output="sos")
        D = edge_samples(sos)
    if D > MAX_KERNEL_EDGE:     # the window grows with rate / cut-off: 1e12 Hz streams or 1e-9 Hz cut-offs
        raise InputError(f"cutoff: {cutoff_hz:g} Hz at a stream rate of {rate_hz:g} Hz needs a filter window of "
                         f"{2 * D + 3} samples; expected at most {2 * MAX_KERNEL_EDGE + 3} (a higher cut-off or the "
                         f"stream's real rate)")
    impulse = np.zeros(3 * D + 1)
    impulse[0] = 1.0
    g = scipy.signal.sosfilt(sos, impulse)                     # the causal impulse response
    h = np.correlate(g, g, "full")[g.size - 1 - D:g.size + D]  # forward-backward: its autocorrelation
    h /= h.sum()                                               # unit gain at 0 Hz (truncation ~1e-4)
    s = math.ceil(abs(effort_shift))
    hp = np.pad(h, 2 + s)
    dt = 1.0 / rate_hz
    L = 2 * (D + s) + 3
    i = np.arange(L)
    later = scipy.interpolate.CubicSpline(np.arange(hp.size), hp)(i + 1 - effort_shift) if effort_shift else hp[i + 1]
    return np.stack([hp[i + 1], (hp[i] - hp[i + 2]) / (2.0 * dt), (hp[i] - 2.0 * hp[i + 1] + hp[i + 2]) / dt ** 2,
                     later / later.sum()])


def _window_dot(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """(N - L + 1, n): for every window of L = len(c) samples of x (N, n), sum_i x[k + i] c[i]."""
    return np.stack([np.correlate(x[:, j], c, "valid") for j in range(x.shape[1])], axis=1)


@dataclass
class WindowRows:
    """Samples at the centres of the window: seq (K,) device sample indices; q (rad), qd (rad/s),
    qdd (rad/s^2) and tau (N m, filtered like q) (K, n)."""

    seq: np.ndarray
    q: np.ndarray
    qd: np.ndarray
    qdd: np.ndarray
    tau: np.ndarray
    steady: np.ndarray      # (K, n) bool: no velocity reversal of the joint inside the window

    @property
    def count(self) -> int:
        return int(self.seq.shape[0])


class SampleWindow:
    """The sliding window over a stream of (seq, q, tau) samples: gaps, repeats, non-finite samples, and
    the batch pipeline's filter and differentiation at the window centre (zero_phase_kernels). effort_delay
    (s): how late the torques are against the positions (ident.fit.preprocess.Recording.effort_delay); a row's
    torque is then the filtered torque that much after the row's motion."""

    def __init__(self, n: int, *, rate_hz: float = 1000.0, cutoff_hz: float = NOISE_CUTOFF_HZ,
                 max_fill: int = MAX_BRIDGED_SAMPLES, effort_delay: float = 0.0):
        self.n = int(n)
        self.rate_hz, self.cutoff_hz = float(rate_hz), float(cutoff_hz)
        self.effort_delay = check_effort_delay(effort_delay, "effort_delay")
        self._c = zero_phase_kernels(self.cutoff_hz, self.rate_hz, effort_shift=self.effort_delay * self.rate_hz)
        self.window = self._c.shape[1]
        self.delay = (self.window - 1) // 2     # samples between the newest sample and the rows built
        self.max_fill = int(max_fill)
        self.counters = Counters()
        self.clear()

    @property
    def noise_correlation(self) -> float:
        """(sum h)^2 / sum h^2 of the filter h applied to the torque: white torque noise comes out of it
        correlated, and a least-squares estimate from its rows (regressors slow beside the filter) has
        this many times the variance it would have from as many independent rows (about 14 at 1 kHz and
        40 Hz: one row in 14 counts). RecursiveLS.row_correlation."""
        h = self._c[3]
        return float(h.sum() ** 2 / np.dot(h, h))

    def clear(self) -> None:
        """Forget the window and the last sample (the next sample starts afresh)."""
        self._restart()
        self._last: tuple[int, np.ndarray, np.ndarray] | None = None

    def _restart(self) -> None:
        self._hist_q = np.empty((0, self.n))
        self._hist_tau = np.empty((0, self.n))
        self._hist_measured = np.empty(0, dtype=bool)
        self._hist_seq = np.empty(0, dtype=np.int64)

    def push(self, seq, q, tau) -> WindowRows:
        """Feed B samples: seq (B,) device sample indices, q and tau (B, n). Returns the rows that became
        complete (at measured samples only).

        Non-finite samples are dropped (counted `rejected`) and then count as missing. A sample whose index
        is not after the last one (a repeat) is dropped (`repeated`). Up to `max_fill` missing samples in a
        row are bridged: positions (and torques) are interpolated linearly for the differentiation window
        only, and no row is built at an interpolated sample (`filled`). A longer gap restarts the window
        (`gaps`, `lost`): no row spans it."""
        seq = np.asarray(seq, dtype=np.int64).reshape(-1)
        q = np.asarray(q, dtype=float).reshape(-1, self.n)
        tau = np.asarray(tau, dtype=float).reshape(-1, self.n)
        if not (seq.shape[0] == q.shape[0] == tau.shape[0]):
            raise InputError(f"push: seq, q and tau must hold the same number of samples, got "
                             f"{seq.shape[0]}, {q.shape[0]}, {tau.shape[0]}")
        c = self.counters
        c.samples += seq.shape[0]
        ok = np.isfinite(q).all(axis=1) & np.isfinite(tau).all(axis=1)
        c.rejected += int((~ok).sum())
        seq, q, tau = seq[ok], q[ok], tau[ok]
        if self._last is not None:                     # anchor: the last sample already in the window
            seq = np.concatenate([[self._last[0]], seq])
            q = np.concatenate([self._last[1][None], q])
            tau = np.concatenate([self._last[2][None], tau])
        out: list[WindowRows] = []
        if seq.shape[0] == 0:
            return self._rows(out)
        later = np.r_[True, seq[1:] > np.maximum.accumulate(seq)[:-1]]
        c.repeated += int((~later).sum())
        seq, q, tau = seq[later], q[later], tau[later]
        anchored = self._last is not None
        step = np.diff(seq)
        cuts = np.flatnonzero(step > self.max_fill + 1) + 1
        for i, (a, b) in enumerate(zip(np.r_[0, cuts], np.r_[cuts, seq.shape[0]])):
            if i > 0:                                  # a long gap before this segment
                c.gaps += 1
                c.lost += int(seq[a] - seq[a - 1] - 1)
                self._restart()
            s_seq, s_q, s_tau = seq[a:b], q[a:b], tau[a:b]
            full = np.arange(s_seq[0], s_seq[-1] + 1)
            measured = np.ones(full.shape[0], dtype=bool)
            if full.shape[0] != s_seq.shape[0]:
                measured[:] = False
                measured[s_seq - s_seq[0]] = True
                c.filled += int((~measured).sum())
                s_q = np.stack([np.interp(full, s_seq, s_q[:, j]) for j in range(self.n)], axis=1)
                s_tau = np.stack([np.interp(full, s_seq, s_tau[:, j]) for j in range(self.n)], axis=1)
            if i == 0 and anchored:                    # the anchor is in the window already
                full, s_q, s_tau, measured = full[1:], s_q[1:], s_tau[1:], measured[1:]
            if full.shape[0]:
                out.append(self._run(full, s_q, s_tau, measured))
        self._last = (int(seq[-1]), q[-1].copy(), tau[-1].copy())
        return self._rows(out)

    def _rows(self, parts: list[WindowRows]) -> WindowRows:
        parts = [p for p in parts if p.count]
        if not parts:
            e = np.empty((0, self.n))
            return WindowRows(np.empty(0, dtype=np.int64), e, e, e, e, np.empty((0, self.n), dtype=bool))
        if len(parts) == 1:
            return parts[0]
        return WindowRows(*(np.concatenate([getattr(p, k) for p in parts]) for k in ("seq", "q", "qd", "qdd", "tau", "steady")))

    def _run(self, seq, q, tau, measured) -> WindowRows:
        S = np.concatenate([self._hist_seq, seq])
        Q = np.concatenate([self._hist_q, q])
        T = np.concatenate([self._hist_tau, tau])
        M = np.concatenate([self._hist_measured, measured])
        L = self.window
        keep = L - 1
        self._hist_seq, self._hist_q = S[-keep:].copy(), Q[-keep:].copy()
        self._hist_tau, self._hist_measured = T[-keep:].copy(), M[-keep:].copy()
        if Q.shape[0] < L:
            return self._rows([])
        centre = slice(self.delay, Q.shape[0] - self.delay)
        real = M[centre]                                                    # rows only at measured samples
        if not real.any():
            return self._rows([])
        q_c, qd_c, qdd_c = (_window_dot(Q, self._c[d])[real] for d in range(3))
        # a velocity reversal of joint j inside the window: sign(q[i+1] - q[i-1]) not constant over it
        direction = np.sign(Q[2:] - Q[:-2])
        steady = np.abs(_window_dot(direction, np.ones(L - 2))[real]) == L - 2
        return WindowRows(S[centre][real], q_c, qd_c, qdd_c, _window_dot(T, self._c[3])[real], steady)


class JointWeightedRLS:
    """RecursiveLS with Gautier's per-joint weights 1/sigma_j, sigma_j from a first pass over the warm-up
    rows (see the module docstring). joint_sigma (n,) N m given: fixed weights, no first pass."""

    def __init__(self, p: int, n: int, *, forgetting: float = 1.0, p0: float = 1e4, trace_max: float | None = None,
                 joint_sigma=None, warmup_rows: int = 2000, theta0=None):
        self.p, self.n = int(p), int(n)
        self.warmup_rows = int(warmup_rows)
        if self.warmup_rows < 1:
            raise InputError(f"warmup_rows: expected a positive number of rows, got {warmup_rows}")
        self.rls = RecursiveLS(p, n, forgetting=forgetting, p0=p0, trace_max=trace_max, theta0=theta0)
        self.fixed_sigma = None if joint_sigma is None else _checked_sigma(joint_sigma, n)
        self.reset(theta0)

    @property
    def joint_sigma(self) -> np.ndarray | None:
        """(n,) the sigma_j (units of y) the rows are weighted by; None during the first pass."""
        return None if self._pending else 1.0 / self.rls.weights

    @property
    def provisional(self) -> np.ndarray:
        """(n,) bool: joints whose sigma_j is not yet estimated from their own rows (all during the first
        pass; after it, the joints that had not moved, weighted meanwhile by the largest of the others)."""
        return self._provisional.copy()

    def reset(self, theta0=None, P0=None, *, factors=None) -> None:
        """Start again from theta0 (default 0) and P0 (default p0 I) or P's factors (U, D), with the weights
        estimated anew (unless fixed)."""
        self.rls.reset(theta0, P0, factors=factors)
        self._origin = (self.rls.theta.copy(), (self.rls.U, self.rls.D.copy()))   # where the first pass restarts
        self._pending = self.fixed_sigma is None
        self.rls.weights[:] = 1.0 if self._pending else 1.0 / self.fixed_sigma
        self._kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._kept_rows = np.zeros(self.n, dtype=np.int64)
        self._provisional = np.full(self.n, self._pending)
        self._late_err, self._late_rows = np.zeros((self.n, self.warmup_rows)), np.zeros(self.n, dtype=np.int64)

    def set_weights(self, joint_sigma) -> None:
        """Use these sigma_j (n,) from now on (e.g. restored from a file); ends a pending first pass."""
        self.rls.weights[:] = 1.0 / _checked_sigma(joint_sigma, self.n)
        self._pending = False
        self._kept, self._kept_rows = [], np.zeros(self.n, dtype=np.int64)
        self._provisional[:] = False

    def update(self, Phi: np.ndarray, y: np.ndarray, use: np.ndarray) -> np.ndarray:
        """Rows Phi (N, n, p), y (N, n), use (N, n) bool; returns the a-priori errors (N, n)."""
        err = self.rls.update(Phi, y, use=use)
        if self._pending:
            # C order: the replay's concatenation then goes to the kernel without another copy
            self._kept.append((np.array(Phi, dtype=float, order="C"), np.array(y, dtype=float, order="C"),
                               np.array(use, dtype=bool)))
            self._kept_rows += np.asarray(use, dtype=bool).sum(axis=0)
            kept, enough = self._kept_rows, self.warmup_rows
            if kept.max() >= enough and np.all((kept >= enough) | (kept < enough // 10)):
                self._first_pass_done()
        elif self._provisional.any():
            self._own_sigma(err, use)
        return err

    def _own_sigma(self, err: np.ndarray, use: np.ndarray) -> None:
        """A joint that had not moved in the first pass: its sigma_j from the a-priori errors of its first
        warmup_rows rows, by their median absolute value (1.4826 MAD: the standard deviation of normal
        errors). The first rows of a joint that starts moving can be predicted far off, in directions the
        other joints' rows did not pin down: a few errors of 1000 sigma that the median ignores and an RMS
        would not."""
        counted = np.asarray(use, dtype=bool) & np.isfinite(err) & self._provisional
        for j in np.flatnonzero(counted.any(axis=0)):
            e = err[counted[:, j], j][:self.warmup_rows - self._late_rows[j]]
            self._late_err[j, self._late_rows[j]:self._late_rows[j] + e.size] = e
            self._late_rows[j] += e.size
        done = self._provisional & (self._late_rows >= self.warmup_rows)
        if done.any():
            sigma = 1.4826 * np.median(np.abs(self._late_err[done]), axis=1)
            self.rls.weights[done] = 1.0 / np.maximum(sigma, 1e-12 * np.max(1.0 / self.rls.weights))
            self._provisional[done] = False

    def _first_pass_done(self) -> None:
        Phi = np.concatenate([k[0] for k in self._kept])
        y = np.concatenate([k[1] for k in self._kept])
        use = np.concatenate([k[2] for k in self._kept])
        e = np.where(use, y - Phi @ self.rls.theta, 0.0)
        rows = use.sum(axis=0)
        A = np.where(use[:, :, None], Phi, 0.0)
        plain = np.einsum("tja,tjb->jab", A, A)
        bread = np.linalg.pinv(plain.sum(axis=0), hermitian=True)
        sigma = np.sqrt(noise_variances(bread, plain, plain, rows, np.sum(e * e, axis=0)))
        moving = rows >= self.warmup_rows // 10
        sigma[~moving] = np.max(sigma[moving])                      # a joint not moving yet: the largest
        scale = np.sqrt(np.mean(np.where(use, y * y, 0.0)))
        sigma = np.maximum(sigma, max(1e-12 * scale, 1e-300))      # exact data still give finite weights
        self.rls.reset(self._origin[0], factors=self._origin[1])
        self.set_weights(sigma)
        self._provisional[:] = ~moving
        self.rls.update(Phi, y, use=use)
        # the residual variance of the replayed rows is the first pass's a-posteriori one (about 1 by
        # construction), not the a-priori errors of the replay's own start-up
        self.rls.stats[0] = float(np.sum((e / sigma) ** 2))
        self.rls.stats[1] = float(use.sum())


def _checked_sigma(sigma, n: int) -> np.ndarray:
    sigma = np.asarray(sigma, dtype=float)
    if sigma.shape != (n,) or not np.all(np.isfinite(sigma)) or np.any(sigma <= 0):
        raise InputError(f"joint_sigma: expected {n} positive numbers (N m)")
    return sigma.copy()


class StreamEstimator:
    """An estimator fed by its SampleWindow (`samples`) of a stream of (seq, q, tau) samples: push() turns samples
    into rows and their full regressor, feed() (the subclass's) uses them."""

    model: Model
    samples: SampleWindow

    def push(self, seq, q, tau) -> int:
        """Feed B samples: seq (B,) device sample indices, q (rad) and tau (N m) (B, n) (SampleWindow.push
        says how gaps, repeats and non-finite samples are handled). Returns the number of rows built."""
        rows = self.samples.push(seq, q, tau)
        if not rows.count:
            return 0
        return self.feed(rows, dynamics.regressor(self.model, rows.q, rows.qd, rows.qdd))

    def feed(self, rows: WindowRows, Y: np.ndarray) -> int:
        """Use rows of the SampleWindow and their full regressor Y (K, n, 14 n); the number of rows used."""
        raise NotImplementedError


class OnlineIdentifier(StreamEstimator):
    """RLS identification of a model's base parameters on a stream of (seq, q, tau) samples.

    rate_hz: the stream's sample rate; cutoff_hz: the low-pass cut-off (the batch pipeline's, default its
    40 Hz noise floor); forgetting: lambda per sample (1: none); joint_sigma (n,) N m: fixed weights
    (default: estimated by the first pass over warmup_rows rows per joint); p0: initial covariance scale;
    effort_delay (s): how late the torques are against the positions (SampleWindow)."""

    def __init__(self, model: Model, *, rate_hz: float = 1000.0, cutoff_hz: float = NOISE_CUTOFF_HZ,
                 forgetting: float = 1.0, joint_sigma=None, warmup_rows: int = 2000, p0: float = 1e4,
                 trace_max: float | None = None, min_speed: float = DEFAULT_SLOW_VELOCITY, converge_tol: float = 1e-3,
                 converge_reports: int = 3, max_fill: int = MAX_BRIDGED_SAMPLES, base: BaseParameters | None = None,
                 effort_delay: float = 0.0):
        self.model = model
        self.base = base or base_parameters(model)
        self.n, self.p = model.n, self.base.count
        self.fit = JointWeightedRLS(self.p, self.n, forgetting=forgetting, p0=p0, trace_max=trace_max,
                                    joint_sigma=joint_sigma, warmup_rows=warmup_rows)
        self.rls = self.fit.rls
        self.samples = SampleWindow(self.n, rate_hz=rate_hz, cutoff_hz=cutoff_hz, max_fill=max_fill,
                                    effort_delay=effort_delay)
        self._window_changed()
        self.min_speed = float(min_speed)
        self.converge_tol, self.converge_reports = float(converge_tol), int(converge_reports)
        self.frozen = False
        self._sq_err = np.zeros(self.n)
        self._err_rows = np.zeros(self.n, dtype=np.int64)
        self._theta_prev: np.ndarray | None = None
        self._steady = 0

    @property
    def counters(self) -> Counters:
        return self.samples.counters

    @property
    def effort_delay(self) -> float:
        """How late the torques are against the positions, s (SampleWindow)."""
        return self.samples.effort_delay

    def set_effort_delay(self, seconds: float) -> None:
        """Align the torques by a new effort delay (s) from the next sample on: the window starts afresh (its
        counters go on); the estimate stays."""
        s = self.samples
        fresh = SampleWindow(self.n, rate_hz=s.rate_hz, cutoff_hz=s.cutoff_hz, max_fill=s.max_fill,
                             effort_delay=seconds)
        fresh.counters = s.counters
        self.samples = fresh
        self._window_changed()

    def _window_changed(self) -> None:
        s = self.samples
        self.rate_hz = s.rate_hz
        self.window, self.delay, self.max_fill = s.window, s.delay, s.max_fill
        self.rls.row_correlation = s.noise_correlation

    # -- feeding -------------------------------------------------------------------------------------
    def feed(self, rows: WindowRows, Y: np.ndarray) -> int:
        """Use rows of a SampleWindow with their full regressor Y (K, n, 14 n) (push does both; a caller
        that feeds several estimators from one window computes them once)."""
        return self._feed(self.base.regressor(Y), rows.tau, np.abs(rows.qd) >= self.min_speed)

    def _feed(self, Yb: np.ndarray, y: np.ndarray, use: np.ndarray) -> int:
        if self.frozen:
            err = y - Yb @ self.rls.theta
        else:
            err = self.fit.update(Yb, y, use).copy()
        counted = use & np.isfinite(err)             # the prediction error of the rows the fit uses
        self._sq_err += np.sum(np.where(counted, err, 0.0) ** 2, axis=0)
        self._err_rows += counted.sum(axis=0)
        self.counters.rows += y.shape[0]
        return y.shape[0]

    # -- reporting -----------------------------------------------------------------------------------
    def report(self) -> Report:
        """The current estimate; resets the prediction-error accumulator."""
        theta = self.rls.theta.copy()
        with np.errstate(invalid="ignore", divide="ignore"):
            rms = np.where(self._err_rows > 0, np.sqrt(self._sq_err / np.maximum(self._err_rows, 1)), np.nan)
        self._sq_err[:] = 0.0
        self._err_rows[:] = 0
        if self._theta_prev is not None and self.rls.rows > 0:
            change = np.linalg.norm(theta - self._theta_prev) / max(np.linalg.norm(theta), 1e-12)
            self._steady = self._steady + 1 if change < self.converge_tol else 0
        self._theta_prev = theta
        converged = self._steady >= self.converge_reports and self.counters.rows >= 20 * self.p // self.n
        return Report(self.base.names, theta, self.rls.sigma_percent(), rms, self.counters.rows, bool(converged),
                      self.frozen, Counters(**self.counters.as_dict()), self.fit.joint_sigma)

    def reset(self) -> None:
        """Forget the estimate, the estimated weights and the window (counters too)."""
        self.fit.reset()
        self.samples.clear()
        self.samples.counters = Counters()
        self._theta_prev, self._steady = None, 0
        self._sq_err[:] = 0.0
        self._err_rows[:] = 0

    # -- persistence ---------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write the estimate (theta, covariance P and its factors U, D, names, model) as JSON; written
        atomically."""
        path = Path(path)
        doc = {"format": "armid-online-estimate", "version": 1, "model": self.model.name,
               "names": self.base.names, "theta": self.rls.theta.tolist(), "P": self.rls.P.tolist(),
               "U": self.rls.U.tolist(), "D": self.rls.D.tolist(), "stats": self.rls.stats.tolist(), "counters": self.counters.as_dict(),
               "joint_sigma": None if self.fit.joint_sigma is None else self.fit.joint_sigma.tolist()}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(path)

    def load(self, path: str | Path) -> None:
        """Restore an estimate written by save(); refuses a file of another model or base set."""
        src = str(path)
        try:
            doc = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise EstimateFileError(f"{src}: no such file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EstimateFileError(f"{src}: not a saved estimate: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != "armid-online-estimate":
            raise EstimateFileError(f"{src}: format: expected 'armid-online-estimate'")
        if doc.get("names") != self.base.names:
            raise EstimateFileError(f"{src}: names: the estimate's base parameters are not this model's "
                                    f"({doc.get('model')!r} vs {self.model.name!r})")
        try:
            theta = np.asarray(doc["theta"], dtype=float)
            P = np.asarray(doc["P"], dtype=float)
            stats = np.asarray(doc["stats"], dtype=float)
        except (KeyError, TypeError, ValueError) as exc:
            raise EstimateFileError(f"{src}: theta/P/stats: {exc}") from None
        if stats.shape == (3,):                     # written before the kernel counted indefinite samples
            stats = np.r_[stats, 0.0]
        if theta.shape != (self.p,) or P.shape != (self.p, self.p) or stats.shape != self.rls.stats.shape:
            raise EstimateFileError(f"{src}: theta/P/stats: expected shapes ({self.p},), ({self.p}, {self.p}) "
                                    f"and {self.rls.stats.shape}")
        if not (np.isfinite(theta).all() and np.isfinite(P).all()):
            raise EstimateFileError(f"{src}: theta/P: non-finite values")
        sigma = doc.get("joint_sigma")
        try:
            sigma = None if sigma is None else _checked_sigma(sigma, self.n)
        except (InputError, TypeError, ValueError):
            raise EstimateFileError(f"{src}: joint_sigma: expected null or {self.n} positive numbers") from None
        try:
            if "U" in doc or "D" in doc:             # P's factors: the state exactly as saved
                self.fit.reset(theta, factors=(np.asarray(doc["U"], dtype=float), np.asarray(doc["D"], dtype=float)))
            else:                                    # written before the filter kept P factored
                self.fit.reset(theta, P)
        except (KeyError, TypeError, ValueError) as exc:
            raise EstimateFileError(f"{src}: P/U/D: {exc}") from None
        self.rls.stats[:] = stats
        if sigma is not None:
            self.fit.set_weights(sigma)
        self.samples.clear()
        self._theta_prev, self._steady = None, 0
