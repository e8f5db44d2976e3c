"""Gravity and friction compensation in cyclic synchronous torque (the torque servo mode), from the loaded model.

A torque-servo client that asks for it gets the model's torque added to its own as the drives' torque offset
(CiA 402 0x60B2; in CST the drives add it to the target torque):

    gravity   g(q): RNEA at the measured q with zero velocity and acceleration (payload included when one is set)
    friction  fc tanh(qd / v_eps) + fv qd + offset: the identified Coulomb, viscous and offset terms at the measured
              velocity, the sign of the Coulomb term smoothed over v_eps rad/s (the observer's friction_smoothing)

so that a client sending zero holds the arm where it is, and a client sending a torque gets that torque beyond
what the arm's own weight and friction take. Each cycle one numba call (GIL released) computes the offset and
checks the sum against the torque limits: a joint whose target torque + offset would exceed its limit refuses the
setpoint (the cycle ends the session and holds the arm in CSP) instead of sending it.

    comp = Compensation(model, ("gravity", "friction"), friction_smoothing=0.01)
    j = comp.compute(q, qd, target, limit)     # comp.torque (n,) N m; j: -1, or the first joint over its limit
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from firmware_bridge.runtime.errors import InputError
from ident.model import Model
from ident.model import kernels as K

KINDS = ("gravity", "friction")
FC, FV, OFFSET, V_EPS = range(4)         # columns of the friction table


@njit(cache=True, nogil=True)
def compensation_step(jtype, Rpl, ppl, axis, grav, P, friction, gravity_on, friction_on, q, qd, target, limit,
                      out) -> int:
    """The compensation torque (n,) N m at the measured q (rad), qd (rad/s) into out: g(q) when gravity_on, the
    friction (n, 4: fc, fv, offset, v_eps) at qd when friction_on; then -1, or the first joint whose
    |target + out| is beyond limit (n,) N m or not finite."""
    n = q.shape[0]
    for j in range(n):
        out[j] = 0.0
    if gravity_on:        # scratch of RNEA's two passes (allocated in the call: cheaper than passing it in)
        R0, Rq, Ms, z = np.empty((n, 3, 3)), np.empty((3, 3)), np.empty((3, 3)), np.zeros(n)
        o, u, w, wd, a, F, Nm = (np.empty((n, 3)), np.empty((n, 3)), np.empty((n, 3)), np.empty((n, 3)),
                                 np.empty((n, 3)), np.empty((n, 3)), np.empty((n, 3)))
        K.forward_pass(jtype, Rpl, ppl, axis, grav, q, z, z, R0, o, u, w, wd, a, Rq, Ms)
        K._rnea_one(jtype, R0, o, u, w, wd, a, P, z, z, False, out, F, Nm)
    if friction_on:
        for j in range(n):
            v = qd[j]
            out[j] += friction[j, FC] * np.tanh(v / friction[j, V_EPS]) + friction[j, FV] * v + friction[j, OFFSET]
    for j in range(n):
        total = target[j] + out[j]
        if not (abs(total) <= limit[j]):          # NaN too
            return j
    return -1


def kinds_of(value, where: str) -> tuple[str, ...]:
    """A compensation request (a list of names from KINDS, or one name) as a tuple in KINDS' order; InputError
    naming `where` otherwise."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(k, str) and k in KINDS for k in items):
        raise InputError(f"{where}: expected a list of {', '.join(repr(k) for k in KINDS)} (or []), "
                         f"got {str(value)[:80]!r}")
    return tuple(k for k in KINDS if k in items)


class Compensation:
    """The compensation of `model` (immutable numbers read once): compute() each cycle, warm_up() before the cycle
    runs. kinds: which terms (KINDS) a session gets by default."""

    def __init__(self, model: Model, kinds=(), friction_smoothing: float = 0.01):
        if not (isinstance(friction_smoothing, (int, float)) and math.isfinite(friction_smoothing)
                and friction_smoothing > 0):
            raise InputError(f"friction_smoothing: expected a positive number of rad/s, got {friction_smoothing!r}")
        self.kinds = kinds_of(list(kinds), "model.compensate")
        self.friction_smoothing = float(friction_smoothing)
        self.n = model.n
        self.torque = np.zeros(self.n)
        self.use(model)

    def use(self, model: Model) -> None:
        """Compensate with `model` from the next compute() on (e.g. with a payload merged in)."""
        if model.n != self.n:
            raise InputError(f"compensation: a model of {model.n} joints for an arm of {self.n}")
        friction = np.empty((self.n, 4))
        friction[:, :3] = model.drive[:, 1:4]               # fc, fv, offset
        friction[:, V_EPS] = self.friction_smoothing
        self._head = (model.joint_type, model.placement_R, model.placement_p, model.axis,
                      np.ascontiguousarray(model.gravity), model.params_matrix(), friction)

    def compute(self, q: np.ndarray, qd: np.ndarray, target: np.ndarray, limit: np.ndarray,
                kinds: tuple[str, ...] | None = None) -> int:
        """self.torque (n,) N m for the measured q, qd with `kinds` (default self.kinds); -1, or the first joint
        whose target + compensation is beyond limit (n,) N m."""
        kinds = self.kinds if kinds is None else kinds
        return compensation_step(*self._head, "gravity" in kinds, "friction" in kinds, q, qd, target, limit,
                                 self.torque)

    def warm_up(self, q: np.ndarray, qd: np.ndarray, target: np.ndarray, limit: np.ndarray) -> None:
        """Compile (or load) the kernel for these arrays' types, on scratch output (self.torque untouched); the
        setpoint both read-only (as decoded from its message) and writable (as a setpoint buffer keeps it): numba
        types the two apart."""
        frozen = np.array(target, dtype=float)
        frozen.setflags(write=False)
        for t in (np.array(target, dtype=float), frozen):
            compensation_step(*self._head, True, True, q, qd, t, limit, np.zeros(self.n))
