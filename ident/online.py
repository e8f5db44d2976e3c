"""Online identification of the base parameters from a live sample stream (no sockets: ident/service.py
feeds it).

Per sample: joint positions q (rad) and joint torques tau (N m) at a fixed rate, with a sequence number.

Causal differentiation with a known delay: a sliding Savitzky-Golay window of L samples (polynomial
order `polyorder`) estimates q, qd and qdd at the window's centre, d = (L - 1) / 2 samples in the past.
The torque used with that row is the measured torque of that same sample, so regressor rows and torques
are aligned in time. (The torque is not smoothed: Coulomb friction makes it jump where a joint reverses,
and a smoothed jump would not match the regressor row; its noise is white and the least squares average
it.)

Samples carry the drives' sample index. A non-finite sample is dropped (it then counts as missing), and
nothing non-finite reaches the filter. Up to `max_fill` missing samples in a row are bridged by linear
interpolation of the positions, for the differentiation window only: no row is built at an interpolated
sample. A longer gap restarts the window: no row spans it.

Rows of the base regressor (ident.dynamics.regressor, ident.base_params) feed ident.rls.RecursiveLS with
per-joint weights (1/sigma_j, as in WLS). Rows of joints slower than `min_speed` (rad/s, by default the
batch pipeline's threshold), where Coulomb friction is ill-modelled, get weight 0.

Convergence: the estimate is `converged` when its relative change between consecutive reports stayed
below `converge_tol` for `converge_reports` reports and at least 20 rows per parameter were used.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.signal

from ident import dynamics
from ident.base_params import BaseParameters, base_parameters
from ident.batch import DEFAULT_SLOW_VELOCITY
from ident.errors import InputError
from ident.model import Model
from ident.rls import RecursiveLS


class EstimateFileError(InputError):
    """A saved estimate cannot be loaded (file, field, or model mismatch)."""


@dataclass
class Counters:
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
    prediction_rms: np.ndarray       # (n,) N m, a-priori torque prediction error since the last report
    rows: int
    converged: bool
    frozen: bool
    counters: Counters = field(default_factory=Counters)

    def to_json(self) -> dict:
        def finite(a):
            return [float(x) if math.isfinite(x) else None for x in a]

        return {"names": self.names, "theta": finite(self.theta), "sigma_percent": finite(self.sigma_percent),
                "prediction_rms": finite(self.prediction_rms), "samples": self.rows, "converged": self.converged,
                "frozen": self.frozen, "counters": vars(self.counters)}


class OnlineIdentifier:
    """RLS identification of a model's base parameters on a stream of (seq, q, tau) samples."""

    def __init__(self, model: Model, *, rate_hz: float = 1000.0, window: int = 41, polyorder: int = 3,
                 forgetting: float = 1.0, joint_sigma=None, p0: float = 1e4, trace_max: float | None = None,
                 min_speed: float = DEFAULT_SLOW_VELOCITY, converge_tol: float = 1e-3, converge_reports: int = 3, max_fill: int = 3,
                 base: BaseParameters | None = None):
        if window < polyorder + 2 or window % 2 == 0:
            raise InputError(f"window: expected an odd number of samples > polyorder + 1, got {window}")
        self.model = model
        self.base = base or base_parameters(model)
        self.n, self.p = model.n, self.base.count
        self.rate_hz, self.window = float(rate_hz), int(window)
        self.delay = (window - 1) // 2          # samples between the newest sample and the rows built
        dt = 1.0 / rate_hz
        # coefficients estimating at the window centre, applied as a dot product over the window
        self._c = np.stack([scipy.signal.savgol_coeffs(window, polyorder, deriv=d, delta=dt, use="dot")
                            for d in (0, 1, 2)])                                   # (3, L)
        sigma = np.ones(self.n) if joint_sigma is None else np.asarray(joint_sigma, dtype=float)
        if sigma.shape != (self.n,) or not np.all(np.isfinite(sigma)) or np.any(sigma <= 0):
            raise InputError(f"joint_sigma: expected {self.n} positive numbers (N m)")
        self.rls = RecursiveLS(self.p, self.n, forgetting=forgetting, weights=1.0 / sigma, p0=p0, trace_max=trace_max)
        self.min_speed = float(min_speed)
        self.converge_tol, self.converge_reports = float(converge_tol), int(converge_reports)
        self.frozen = False
        self.max_fill = int(max_fill)
        self.counters = Counters()
        self._hist_q = np.empty((0, self.n))
        self._hist_tau = np.empty((0, self.n))
        self._hist_measured = np.empty(0, dtype=bool)
        self._last: tuple[int, np.ndarray, np.ndarray] | None = None
        self._sq_err = np.zeros(self.n)
        self._err_rows = 0
        self._theta_prev: np.ndarray | None = None
        self._steady = 0

    # -- feeding -------------------------------------------------------------------------------------
    def push(self, seq, q, tau) -> int:
        """Feed B samples: seq (B,) device sample indices, q and tau (B, n). Returns the number of samples
        whose rows were used.

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
        if seq.shape[0] == 0:
            return 0
        later = np.r_[True, seq[1:] > np.maximum.accumulate(seq)[:-1]]
        c.repeated += int((~later).sum())
        seq, q, tau = seq[later], q[later], tau[later]
        anchored = self._last is not None
        step = np.diff(seq)
        cuts = np.flatnonzero(step > self.max_fill + 1) + 1
        used = 0
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
                used += self._run(s_q, s_tau, measured)
        self._last = (int(seq[-1]), q[-1].copy(), tau[-1].copy())
        return used

    def _restart(self) -> None:
        self._hist_q = self._hist_q[:0]
        self._hist_tau = self._hist_tau[:0]
        self._hist_measured = self._hist_measured[:0]

    def _run(self, q, tau, measured) -> int:
        Q = np.concatenate([self._hist_q, q])
        T = np.concatenate([self._hist_tau, tau])
        M = np.concatenate([self._hist_measured, measured])
        L = self.window
        keep = L - 1
        self._hist_q, self._hist_tau, self._hist_measured = Q[-keep:].copy(), T[-keep:].copy(), M[-keep:].copy()
        if Q.shape[0] < L:
            return 0
        wq = np.lib.stride_tricks.sliding_window_view(Q, L, axis=0)      # (K, n, L)
        qc, qd, qdd = (wq @ self._c[d] for d in range(3))                   # (K, n) each, at the centres
        centre = slice(self.delay, self.delay + qc.shape[0])
        real = M[centre]                                                    # rows only at measured samples
        if not real.any():
            return 0
        Yb = self.base.regressor(dynamics.regressor(self.model, qc[real], qd[real], qdd[real]))   # (K', n, b)
        return self._feed(Yb, T[centre][real], qd[real])

    def _feed(self, Yb: np.ndarray, y: np.ndarray, qd: np.ndarray) -> int:
        slow = np.abs(qd) < self.min_speed
        if self.frozen:
            err = y - Yb @ self.rls.theta
        else:
            err = self.rls.update(Yb, y, use=~slow).copy()
        fine = np.isfinite(err).all(axis=1)
        self._sq_err += np.sum(err[fine] ** 2, axis=0)
        self._err_rows += int(fine.sum())
        self.counters.rows += y.shape[0]
        return y.shape[0]

    # -- reporting -----------------------------------------------------------------------------------
    def report(self) -> Report:
        """The current estimate; resets the prediction-error accumulator."""
        theta = self.rls.theta.copy()
        rms = np.sqrt(self._sq_err / self._err_rows) if self._err_rows else np.full(self.n, np.nan)
        self._sq_err[:] = 0.0
        self._err_rows = 0
        if self._theta_prev is not None and self.rls.rows > 0:
            change = np.linalg.norm(theta - self._theta_prev) / max(np.linalg.norm(theta), 1e-12)
            self._steady = self._steady + 1 if change < self.converge_tol else 0
        self._theta_prev = theta
        converged = self._steady >= self.converge_reports and self.counters.rows >= 20 * self.p // self.n
        return Report(self.base.names, theta, self.rls.sigma_percent(), rms, self.counters.rows, bool(converged),
                      self.frozen, Counters(**vars(self.counters)))

    def reset(self) -> None:
        """Forget the estimate and the window (counters too)."""
        self.rls.reset()
        self._restart()
        self._last = None
        self.counters = Counters()
        self._theta_prev, self._steady = None, 0
        self._sq_err[:] = 0.0
        self._err_rows = 0

    # -- persistence ---------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write the estimate (theta, covariance, names, model) as JSON; written atomically."""
        path = Path(path)
        doc = {"format": "armid-online-estimate", "version": 1, "model": self.model.name,
               "names": self.base.names, "theta": self.rls.theta.tolist(), "P": self.rls.P.tolist(),
               "stats": self.rls.stats.tolist(), "counters": vars(self.counters)}
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
        if theta.shape != (self.p,) or P.shape != (self.p, self.p) or stats.shape != (3,):
            raise EstimateFileError(f"{src}: theta/P: expected shapes ({self.p},) and ({self.p}, {self.p})")
        if not (np.isfinite(theta).all() and np.isfinite(P).all()):
            raise EstimateFileError(f"{src}: theta/P: non-finite values")
        self.rls.reset(theta, P)
        self.rls.stats[:] = stats
        self._restart()
        self._last = None
        self._theta_prev, self._steady = None, 0
