"""Online payload tracking on a live sample stream, with payload-change detection (no sockets:
ident/online/service.py feeds it).

With the arm's base parameters known (the model's own, or an identified estimate held fixed), the
payload's 10 parameters chi = [XX XY XZ YY YZ ZZ mX mY mZ m] (about the flange origin, flange axes) are
tracked by recursive least squares on the torque the arm alone does not explain:

    y = tau - Y_base(q, qd, qdd) theta_arm = Y_load(q, qd, qdd) chi      (N m, per joint)

(Y_load = ident.model.dynamics.load_regressor, computed as link n's ten inertial columns of the regressor times
dynamics.flange_to_link_matrix: the same numbers from the one regressor call that Y_base needs.)

The samples go through ident.online.SampleWindow (the batch pipeline's filter and differentiation, causal
with a known delay; gaps, repeats and non-finite samples handled there: nothing non-finite reaches the
filter), and the rows through ident.online.JointWeightedRLS (Gautier's per-joint weights 1/sigma_j from a
first pass over the warm-up rows). Rows of joints slower than `min_speed` are left out, as online.

**Unidentifiable directions.** The filter starts from chi0 (default: no payload) with covariance p0 I, a
weak prior: directions of chi that the motion does not excite stay at the prior instead of drifting. A
direction is *excited* when the data shrank its prior variance by more than EXCITED_SHRINK; a parameter is
identified individually when its unit vector lies in the excited subspace (its component outside below
ALIGN_TOL). Parameters that are not are NaN in the estimate, and the excited directions that involve them
are reported as combinations (PayloadEstimate.combinations) with their values and sigmas.

**Change detection: CUSUM on the normalised prediction residual.** After the first pass, each sample's
a-priori errors give r_k = mean_j e_kj^2 / (sigma_j^2 + c Y_kj P Y_kj') over the joints used, weighted by
their own rows (JointWeightedRLS.provisional false), not reversing inside the filter's window (a
reversal's Coulomb jump is smeared in the filtered torque but not in the row, a burst of 30-50 sigma that
is no payload change) and at least `detect_speed` fast (DETECT_SPEED, twice the slow-row threshold: just
above that threshold a joint's friction still has its breakaway (Stribeck) excess, tens of sigma on the
wrist joints whenever a motion starts or ends; leaving those rows out halved the statistic's peaks over
minutes of motion). sigma_j are the weights' residual standard deviations; Y_kj P Y_kj' (c the rows'
correlation, RecursiveLS.row_correlation) is the variance the estimate's own uncertainty adds to the
prediction: a motion that excites payload directions the data have not yet pinned down predicts badly
there, and r stays about 1 while the payload is the tracked one, whatever the motion. (Without it, the
first excitation after a move of some joints raised events.) The one-sided CUSUM

    g_k = max(0, g_(k-1) + r_k - 1 - drift),    alarm when g_k > threshold

with drift = 1 (a shift of the mean of r by more than 1 accumulates) and threshold = 500 (e.g. r = 50 for
ten samples, 10 ms at 1 kHz; under no change g stays near 0 because r - 2 is negative on average, and the
filtered residuals' time correlation of about 10 samples still leaves bursts far below 500). On an alarm
the covariance is boosted by p0 I (the filter re-converges from its current estimate, as fast as at the
start, and the boosted prediction variance keeps r small meanwhile), the rows of the next filter window
are left out of the fit (their torques straddle the change: fitted with the boosted gain they biased the
new estimate and raised a second event), the residual statistics restart, and the detector holds off
for `holdoff_rows` rows. A `PayloadChange` is recorded (device sample index, the statistic, the estimate
before the change).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from ident.model import dynamics, spatial
from ident.model.base_params import BaseParameters, base_parameters
from ident.fit.batch import DEFAULT_SLOW_VELOCITY
from firmware_bridge.runtime.errors import InputError
from ident.model import PARAMS_PER_JOINT, Model
from ident.online import Counters, JointWeightedRLS, SampleWindow, WindowRows
from ident.online.identifier import StreamEstimator
from ident.payload.result import PARAMETER_NAMES, Combination, PayloadEstimate
from ident.fit.preprocess import MAX_BRIDGED_SAMPLES, NOISE_CUTOFF_HZ

EXCITED_SHRINK = 1e-3   # a direction is excited when the data shrank its prior variance below this fraction
ALIGN_TOL = 1e-3        # a parameter is identified when less than this of its unit vector is unexcited
CUSUM_DRIFT = 1.0       # allowance of the CUSUM, in units of the normalised squared residual
CUSUM_THRESHOLD = 500.0  # alarm level of the CUSUM
DETECT_SPEED = 0.2      # rad/s: slower rows are fitted (above min_speed) but not tested for a change


@njit(cache=True, nogil=True)
def cusum(g: float, r: np.ndarray, drift: float, threshold: float) -> tuple[float, int]:
    """One-sided CUSUM over r (K,) from the statistic g: g = max(0, g + r_k - 1 - drift), skipping
    non-finite r_k. Returns (g at the end, index of the first alarm g > threshold or -1); on an alarm the
    statistic returned is the one at the alarm."""
    for k in range(r.shape[0]):
        if not math.isfinite(r[k]):
            continue
        g = max(0.0, g + r[k] - 1.0 - drift)
        if g > threshold:
            return g, k
    return g, -1


@dataclass(frozen=True)
class PayloadChange:
    """A detected payload change: seq the device sample index of the row that raised the alarm,
    statistic the CUSUM value, before the estimate (10,) just before the covariance was boosted."""

    seq: int
    statistic: float
    before: np.ndarray

    def to_json(self) -> dict:
        return {"event": "payload_change", "seq": self.seq, "statistic": self.statistic,
                "before": dict(zip(PARAMETER_NAMES, (float(x) for x in self.before)))}


class OnlinePayload(StreamEstimator):
    """RLS tracking of the payload's 10 parameters on a stream of (seq, q, tau) samples, with change
    detection (module docstring); push() (StreamEstimator's) appends a detected change to `changes`.
    arm_theta (b,): the arm's base parameters (default: the model's own);
    cutoff_hz, rate_hz, max_fill, effort_delay: as ident.online.OnlineIdentifier; forgetting: lambda per sample;
    joint_sigma (n,) N m: fixed weights (default: first pass over warmup_rows rows per joint); p0: prior
    variance of each payload parameter (SI units squared); chi0 (10,): the prior payload; detect_speed
    (rad/s): the slowest joint speed whose rows the change detection looks at (module docstring)."""

    def __init__(self, model: Model, *, arm_theta=None, base: BaseParameters | None = None,
                 rate_hz: float = 1000.0, cutoff_hz: float = NOISE_CUTOFF_HZ, forgetting: float = 1.0,
                 joint_sigma=None, warmup_rows: int = 1000, p0: float = 100.0, chi0=None,
                 min_speed: float = DEFAULT_SLOW_VELOCITY, max_fill: int = MAX_BRIDGED_SAMPLES, drift: float = CUSUM_DRIFT,
                 threshold: float = CUSUM_THRESHOLD, holdoff_rows: int = 1000, effort_delay: float = 0.0,
                 detect_speed: float = DETECT_SPEED):
        self.model = model
        self.base = base or base_parameters(model)
        self.n = model.n
        theta = self.base.from_standard(model.standard_parameters()) if arm_theta is None else arm_theta
        self.arm_theta = np.asarray(theta, dtype=float).copy()
        if self.arm_theta.shape != (self.base.count,) or not np.isfinite(self.arm_theta).all():
            raise InputError(f"arm_theta: expected {self.base.count} finite base parameters of {model.name}")
        self.chi0 = np.zeros(10) if chi0 is None else np.asarray(chi0, dtype=float).copy()
        if self.chi0.shape != (10,) or not np.isfinite(self.chi0).all():
            raise InputError("chi0: expected 10 finite payload parameters")
        if not (drift >= 0 and threshold > 0 and holdoff_rows >= 0):
            raise InputError("drift, threshold, holdoff_rows: expected drift >= 0, threshold > 0, holdoff_rows >= 0")
        self.samples = SampleWindow(self.n, rate_hz=rate_hz, cutoff_hz=cutoff_hz, max_fill=max_fill,
                                    effort_delay=effort_delay)
        self.fit = JointWeightedRLS(10, self.n, forgetting=forgetting, p0=p0, joint_sigma=joint_sigma,
                                    warmup_rows=warmup_rows, theta0=self.chi0)
        self.rls = self.fit.rls
        self.rls.row_correlation = self.samples.noise_correlation
        first = PARAMS_PER_JOINT * (self.n - 1)
        self._last_link = slice(first, first + 10)                     # link n's XX .. m columns
        self._flange_to_link = dynamics.flange_to_link_matrix(model)
        self.p0 = float(p0)
        self.min_speed = float(min_speed)
        self.detect_speed = float(detect_speed)
        if not self.detect_speed >= 0:
            raise InputError(f"detect_speed: expected a speed >= 0 rad/s, got {detect_speed!r}")
        self.drift, self.threshold, self.holdoff_rows = float(drift), float(threshold), int(holdoff_rows)
        self.statistic = 0.0
        self.changes: list[PayloadChange] = []
        self._holdoff = 0
        self._skip = 0
        self.rows = 0

    @property
    def counters(self) -> Counters:
        return self.samples.counters

    def feed(self, rows: WindowRows, Y: np.ndarray) -> int:
        """Use rows of a SampleWindow (with this tracker's cut-off) and their full regressor Y (K, n, 14 n),
        e.g. those an OnlineIdentifier on the same stream computed. Returns the number of rows."""
        # = dynamics.load_regressor (the payload is rigidly part of the last link), one kernel call for both
        Yl = Y[:, :, self._last_link] @ self._flange_to_link
        y = rows.tau - self.base.regressor(Y) @ self.arm_theta
        use = np.abs(rows.qd) >= self.min_speed
        if self._skip:                             # rows whose window spans a detected change: left out
            s = min(self._skip, rows.count)
            use[:s] = False
            self._skip -= s
        sigma = self.fit.joint_sigma               # None in the first pass: no detection yet
        if sigma is not None:                      # the estimate's own uncertainty in each row's prediction
            spread = np.sum((Yl @ self.rls.P) * Yl, axis=2) * self.rls.row_correlation
            variance = sigma ** 2 + spread
            known = ~self.fit.provisional          # joints weighted by their own rows
        err = self.fit.update(Yl, y, use)
        self.rows += rows.count
        self.counters.rows += rows.count
        if sigma is not None:
            fast = np.abs(rows.qd) >= self.detect_speed
            self._detect(rows.seq, err, use & fast & rows.steady & known, variance)
        return rows.count

    def _detect(self, seq: np.ndarray, err: np.ndarray, use: np.ndarray, variance: np.ndarray) -> None:
        counted = use & np.isfinite(err)
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.sum(np.where(counted, err * err / variance, 0.0), axis=1) / counted.sum(axis=1)   # NaN: no joint
        start = min(self._holdoff, r.shape[0])
        self._holdoff -= start
        if start == r.shape[0]:
            return
        self.statistic, k = cusum(self.statistic, np.ascontiguousarray(r[start:]), self.drift, self.threshold)
        if k >= 0:
            self.changes.append(PayloadChange(int(seq[start + k]), float(self.statistic), self.rls.theta.copy()))
            self.rls.P += self.p0 * np.eye(10)     # re-open every direction: re-converge from here
            self.rls.stats[:2] = 0.0
            self.statistic = 0.0
            self._holdoff = self.holdoff_rows
            # the rows of the next window mix the torques of before and after the change: not fitted
            self._skip = max(self.samples.window - (r.shape[0] - 1 - (start + k)), 0)

    def reset(self) -> None:
        """Back to the prior payload, weights estimated anew, detector cleared (changes kept)."""
        self.fit.reset(self.chi0)
        self.samples.clear()
        self.statistic, self._holdoff, self._skip = 0.0, 0, 0

    def estimate(self) -> PayloadEstimate:
        """The current payload estimate: identified parameters with their sigmas, NaN for the others,
        the excited combinations that involve them, and whether it is a body that can exist."""
        chi = self.rls.theta.copy()
        cov = self.rls.covariance()
        sigma = np.sqrt(np.maximum(np.diag(cov), 0.0))
        lam, V = np.linalg.eigh(self.rls.P)
        excited = lam < EXCITED_SHRINK * self.p0
        outside = np.sum(V[:, ~excited] ** 2, axis=1)          # (10,) share of e_k outside the excited span
        identified = outside < ALIGN_TOL
        combos = []
        for i in np.flatnonzero(excited):
            v = V[:, i]
            if np.any(np.abs(v[~identified]) > ALIGN_TOL):
                v = v / v[np.argmax(np.abs(v))]
                terms = [(c, name) for c, name in zip(v, PARAMETER_NAMES) if abs(c) > ALIGN_TOL]
                expr = " ".join(f"{'+' if c > 0 else '-'} {abs(c):.4g}*{name}" for c, name in terms).lstrip("+ ")
                combos.append(Combination(expr, v.copy(), float(v @ chi), float(np.sqrt(max(v @ cov @ v, 0.0)))))
        notes = []
        if self.fit.joint_sigma is None:
            notes.append(f"first pass: per-joint weights not estimated yet ({self.fit.warmup_rows} rows per joint)")
        if not identified.all():
            notes.append("not excited individually: " + ", ".join(np.asarray(PARAMETER_NAMES)[~identified]))
        out_chi = np.where(identified, chi, np.nan)
        out_sigma = np.where(identified, sigma, np.nan)
        if identified.all():
            ok, why = spatial.is_physically_consistent(chi)
        else:
            ok, why = (bool(chi[9] >= 0), "" if chi[9] >= 0 else f"negative mass {chi[9]:g} kg")
        return PayloadEstimate("online", out_chi, out_sigma, int(self.rls.rows), combos, bool(ok), why, notes=notes,
                               frame=self.model.flange_frame)
