"""The external-torque estimate of the driver: a first-order generalized-momentum observer over an (identified)
model, one numba call per new sample (driver/observer_kernels.py: the mathematics, GIL released).

    obs = MomentumObserver(model, rate_hz, gains=100.0)
    obs.update(q, qd, tau_m, out)     # out (n,) N m: the estimate of the torques from outside the arm
    obs.reset()                       # the next update starts afresh (estimate 0)

Each joint's estimate follows its external torque as a first-order lag of time constant 1 / gains[j] s: a step of
tau_ext reaches 1 - 1/e of it after 1 / gains[j] s (10 ms at 100 1/s), and noise in the measured torque is low-
passed at gains[j] / 2 pi Hz. tau_m is the motors' torque at the joints (current * gear ratio * torque constant).
The model's friction (fc, fv, offset) is taken as identified, the sign of the Coulomb term smoothed over
friction_smoothing rad/s; near_rest (fs, vs), when given, adds the friction near rest that the identification
found on the samples its fit leaves out (ident.fit.near_rest; result.json's fit.near_rest_friction): the
excess fs exp(-(qd/vs)^2) over fc, in N m and rad/s per joint. Without it the observer passes that excess as a
burst at each velocity reversal.
"""
from __future__ import annotations

import math

import numpy as np

from driver import observer_kernels as ok
from firmware_bridge.runtime.errors import InputError
from ident.model import Model

DEFAULT_GAIN = 100.0              # 1/s: 10 ms time constant
MAX_GAIN_PERIODS = 0.5            # gains * dt at most this: the discrete observer stays a smooth first-order lag
DEFAULT_FRICTION_SMOOTHING = 0.01  # rad/s: the width of the tanh that replaces sign(qd) in the Coulomb term


def gains_array(gains, n: int, rate_hz: float, what: str = "observer gains") -> np.ndarray:
    """(n,) gains (1/s) from one number or n; InputError unless each is positive and at most
    MAX_GAIN_PERIODS * rate_hz (beyond that the discrete observer overshoots or oscillates)."""
    arr = np.full(n, gains, dtype=float) if np.ndim(gains) == 0 else np.asarray(gains, dtype=float)
    top = MAX_GAIN_PERIODS * rate_hz
    if arr.shape != (n,) or not np.all(np.isfinite(arr)) or not np.all((arr > 0) & (arr <= top)):
        raise InputError(f"{what}: expected one number or {n} numbers, each more than 0 and at most {top:g} 1/s "
                         f"(half the cycle rate), got {np.asarray(gains).tolist()!r}")
    return arr


def near_rest_table(near_rest, n: int) -> np.ndarray:
    """(n, 2) columns fs (N m), vs (rad/s) of the friction near rest (None: fs 0); InputError unless fs holds n
    finite numbers >= 0 and vs n positive ones."""
    if near_rest is None:
        return np.column_stack([np.zeros(n), np.ones(n)])
    try:
        fs, vs = (np.asarray(x, dtype=float) for x in near_rest)
    except (TypeError, ValueError):
        fs = vs = np.zeros(0)
    if (fs.shape != (n,) or vs.shape != (n,) or not np.all(np.isfinite(fs) & (fs >= 0))
            or not np.all(np.isfinite(vs) & (vs > 0))):
        raise InputError(f"near_rest friction: expected (excess, velocity) of {n} numbers each, excess >= 0 N m and "
                         f"velocity > 0 rad/s, got {near_rest!r}")
    return np.column_stack([fs, vs])


class MomentumObserver:
    """The observer over `model` at rate_hz (its parameter table and friction are read once)."""

    def __init__(self, model: Model, rate_hz: float, gains=DEFAULT_GAIN,
                 friction_smoothing: float = DEFAULT_FRICTION_SMOOTHING, near_rest=None):
        n = self.n = model.n
        if not (isinstance(friction_smoothing, (int, float)) and math.isfinite(friction_smoothing)
                and friction_smoothing > 0):
            raise InputError(f"friction_smoothing: expected a positive number of rad/s, got {friction_smoothing!r}")
        self.model = model
        self.dt = 1.0 / float(rate_hz)
        self.gains = gains_array(gains, n, rate_hz)
        self._chain = (model.joint_type, model.placement_R, model.placement_p, model.axis,
                       np.ascontiguousarray(model.gravity))
        self._P = model.params_matrix()
        self.friction = np.empty((n, 6))
        self.friction[:, :3] = model.drive[:, 1:4]          # fc, fv, offset
        self.friction[:, 3] = friction_smoothing
        self.friction[:, 4:] = near_rest_table(near_rest, n)
        self._state = np.zeros((3, n))
        self._p, self._beta = np.zeros(n), np.zeros(n)
        self.started = False
        self._bind()

    def _bind(self) -> None:
        # the kernel's fixed arguments, gathered once: per update only the sample's arrays are added
        self._head = (*self._chain, self._P, self.friction, self.gains)
        self._tail = (self._state, self._p, self._beta)

    def set_gains(self, gains) -> None:
        """New gains (1/s) from the next update on (checked as at construction)."""
        self.gains = gains_array(gains, self.n, 1.0 / self.dt)
        self._bind()

    def reset(self) -> None:
        """Start afresh at the next update (its estimate is 0)."""
        self.started = False

    def update(self, q: np.ndarray, qd: np.ndarray, tau_m: np.ndarray, out: np.ndarray, dt: float = 0.0) -> None:
        """One new sample: q (rad), qd (rad/s), tau_m (N m) the motors' torque, dt (s) since the last sample (0: one
        period); the estimate into out (n,)."""
        ok.observer_step(*self._head, dt or self.dt, q, qd, tau_m, self.started, *self._tail, out)
        self.started = True

    def momentum(self, q: np.ndarray, qd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """p = M(q) qd and beta = g - C^T qd (n,) at one sample (for tests and tools)."""
        p, beta = np.zeros(self.n), np.zeros(self.n)
        ok.momentum_terms(*self._chain, self._P, np.ascontiguousarray(q, dtype=float),
                          np.ascontiguousarray(qd, dtype=float), ok.DERIVATIVE_STEP_S, p, beta)
        return p, beta
