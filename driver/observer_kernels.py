"""The external-torque observer's per-cycle step in one numba call that releases the GIL (driver/observer.py
wraps it): the generalized-momentum observer of De Luca and Mattone, first order, with per-joint gains.

With p = M(q) qd the generalized momentum, the arm obeys

    dp/dt = tau_m - f(qd) - beta(q, qd) + tau_ext,      beta = g(q) - C(q, qd)^T qd = n(q, qd) - dM/dt qd

where n = C qd + g is RNEA at zero acceleration, tau_m the motors' torque and f the friction. The residual

    r = K (p - p(0) - integral(tau_m - f - beta + r) dt)

obeys dr/dt = K (tau_ext - r): each joint's estimate follows its external torque with the time constant 1/K_j,
and needs no acceleration. dM/dt qd is M's derivative along qd by a central difference of CRBA
(M(q + h qd) - M(q - h qd)) / 2h, h = DERIVATIVE_STEP_S (exact to rounding for a smooth M). Discretely, with the
integral stepped by the previous residual (forward Euler), r_k = tau_ext (1 - (1 - K dt)^k) for a step in tau_ext
on an exact model: the response the gains predict.

f(v) = (fc + fs exp(-(v / vs)^2)) tanh(v / v_eps) + fv v + offset (the identified Coulomb, viscous and offset
terms, and the friction near rest identified on the samples the fit leaves out, ident.fit.near_rest: fs = 0 when
there is none; tanh of width v_eps in place of sign(v), so that a joint at rest does not switch between +fc and
-fc on the encoder's noise).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ident.model import kernels as K

DERIVATIVE_STEP_S = 1e-6
# state rows: the integral (p(0) + the integral above), the previous residual, the previous friction + beta
INTEGRAL, RESIDUAL, BIAS = range(3)


@njit(cache=True, nogil=True)
def workspace(n):
    """Scratch of one step: allocated inside the kernel call (a few small arrays cost less than handing a tuple
    of arrays through numba's dispatcher, ~60 us)."""
    return (np.empty((n, 3, 3)), np.empty((n, 3)), np.empty((n, 3)), np.empty((n, 3)), np.empty((n, 3)),
            np.empty((n, 3)), np.empty((3, 3)), np.empty((3, 3)), np.empty((n, 3)), np.empty((n, 3)),
            np.empty((n, 3, 3)), np.empty((n, 3)), np.empty(n), np.empty((n, n)), np.empty((n, n)),
            np.empty((n, n)), np.empty(n), np.empty(n), np.zeros(n))


@njit(cache=True, nogil=True)
def momentum_terms(jtype, Rpl, ppl, axis, grav, P, q, qd, h, p_out, beta_out):
    """p = M(q) qd and beta = n(q, qd) - dM/dt qd (n,) at one sample. P (n, 14): the rigid body and Ia (the
    friction columns are not read)."""
    R0, o, u, w, wd, a, Rq, Ms, F, Nm, Jc, hc, mc, M, Mp, Mm, qs, bias, z = workspace(q.shape[0])
    n = q.shape[0]
    K.forward_pass(jtype, Rpl, ppl, axis, grav, q, qd, z, R0, o, u, w, wd, a, Rq, Ms)
    K._rnea_one(jtype, R0, o, u, w, wd, a, P, qd, z, False, bias, F, Nm)
    K._crba_one(jtype, R0, o, u, P, True, M, Jc, hc, mc)
    for j in range(n):
        qs[j] = q[j] + h * qd[j]
    K.forward_pass(jtype, Rpl, ppl, axis, grav, qs, z, z, R0, o, u, w, wd, a, Rq, Ms)
    K._crba_one(jtype, R0, o, u, P, True, Mp, Jc, hc, mc)
    for j in range(n):
        qs[j] = q[j] - h * qd[j]
    K.forward_pass(jtype, Rpl, ppl, axis, grav, qs, z, z, R0, o, u, w, wd, a, Rq, Ms)
    K._crba_one(jtype, R0, o, u, P, True, Mm, Jc, hc, mc)
    inv = 0.5 / h
    for i in range(n):
        pi = 0.0
        md = 0.0
        for j in range(n):
            pi += M[i, j] * qd[j]
            md += (Mp[i, j] - Mm[i, j]) * inv * qd[j]
        p_out[i] = pi
        beta_out[i] = bias[i] - md


@njit(cache=True, nogil=True)
def observer_step(jtype, Rpl, ppl, axis, grav, P, friction, gains, dt, q, qd, tau_m, started, state, p, beta,
                  out):
    """One step of the observer at a new sample: q (rad), qd (rad/s), tau_m (N m) the motors' torque; friction
    (n, 6): fc, fv, offset, v_eps, fs, vs; gains (n,) 1/s; state (3, n) kept between steps (INTEGRAL, RESIDUAL, BIAS);
    p, beta (n,) scratch. started False: the observer starts here (residual 0). The estimate goes into out (n,)
    and the residual row of state."""
    n = q.shape[0]
    momentum_terms(jtype, Rpl, ppl, axis, grav, P, q, qd, DERIVATIVE_STEP_S, p, beta)
    for j in range(n):
        v = qd[j]
        x = v / friction[j, 5]
        b = (beta[j] + (friction[j, 0] + friction[j, 4] * np.exp(-x * x)) * np.tanh(v / friction[j, 3])
             + friction[j, 1] * v + friction[j, 2])
        if not started:
            state[INTEGRAL, j] = p[j]
            state[RESIDUAL, j] = 0.0
        else:
            # the friction and beta over the period: the mean of its two ends (the torque is the period's mean)
            state[INTEGRAL, j] += dt * (tau_m[j] - 0.5 * (b + state[BIAS, j]) + state[RESIDUAL, j])
            state[RESIDUAL, j] = gains[j] * (p[j] - state[INTEGRAL, j])
        state[BIAS, j] = b
        out[j] = state[RESIDUAL, j]


@njit(cache=True, nogil=True)
def contact_levels(tau_ext, contact, collision):
    """The joints over their thresholds: bit j set where |tau_ext[j]| > contact[j]; (the first joint over its
    collision threshold + 1) << 16, 0 when none; -1 when an estimate is not finite."""
    bits = 0
    first = 0
    for j in range(tau_ext.shape[0]):
        a = abs(tau_ext[j])
        if not np.isfinite(a):
            return -1
        if a > contact[j]:
            bits |= 1 << j
        if first == 0 and a > collision[j]:
            first = j + 1
    return bits | (first << 16)
