"""Numba kernels of the simulated arm: forward dynamics with locked joints and the sim's own friction, and
the integrator of one control period (zero-order-hold torque, RK4 or semi-implicit Euler substeps).

They reuse ident.model.kernels' per-sample passes (forward_pass, the RNEA backward pass, CRBA, Cholesky) on a
workspace allocated once per call of `advance`, never per substep. All of them release the GIL.

Arguments shared by the kernels:
  jtype, Rpl, ppl, axis, grav   the Model's chain arrays (see ident.model.kernels)
  P (n, 14)   standard parameters with fc = fv = offset = 0: the rigid body plus the rotor inertia Ia
  fr (n, 6)   friction per joint: fc, fs, vs, veps, fv, offset (see friction_torques)
  locked (n,) bool: joints held by a brake or stalled (qd = qdd = 0)
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ident.model import kernels as K

FC, FS, VS, VEPS, FV, OFFSET = range(6)
RK4, SEMI_IMPLICIT = 0, 1


@njit(cache=True, nogil=True, inline="always")
def _friction_one(fr, j, v):
    return ((fr[j, FC] + fr[j, FS] * np.exp(-(v / fr[j, VS]) ** 2)) * np.tanh(v / fr[j, VEPS])
            + fr[j, FV] * v + fr[j, OFFSET])


@njit(cache=True, nogil=True)
def friction_torques(fr, qd, out):
    """Joint friction (N m) into out (n,):
    (fc + fs exp(-(qd/vs)^2)) tanh(qd/veps) + fv qd + offset."""
    for j in range(qd.shape[0]):
        out[j] = _friction_one(fr, j, qd[j])


@njit(cache=True, nogil=True)
def workspace(n):
    """Scratch arrays of one acceleration evaluation (allocated once per advance call)."""
    return (np.empty((n, 3, 3)), np.empty((n, 3)), np.empty((n, 3)), np.empty((n, 3)), np.empty((n, 3)),
            np.empty((n, 3)), np.empty((3, 3)), np.empty((3, 3)), np.empty((n, 3)), np.empty((n, 3)),
            np.empty((n, 3, 3)), np.empty((n, 3)), np.empty(n), np.empty((n, n)), np.zeros((n, n)),
            np.empty(n), np.empty(n), np.zeros(n))


@njit(cache=True, nogil=True)
def acceleration(jtype, Rpl, ppl, axis, grav, P, fr, q, qd, tau, locked, out, ws):
    """qdd (n,) into out: (M(q) + diag Ia) qdd = tau - C(q, qd) qd - G(q) - friction(qd), with
    qdd = 0 on locked joints (their rows and columns drop out of the solve). False if M is not SPD."""
    R0, o, u, w, wd, a, Rq, Ms, F, Nm, Jc, hc, mc, M, L, bias, rhs, z = ws
    n = q.shape[0]
    K.forward_pass(jtype, Rpl, ppl, axis, grav, q, qd, z, R0, o, u, w, wd, a, Rq, Ms)
    K._rnea_one(jtype, R0, o, u, w, wd, a, P, qd, z, True, bias, F, Nm)
    K._crba_one(jtype, R0, o, u, P, True, M, Jc, hc, mc)
    for j in range(n):
        rhs[j] = tau[j] - bias[j] - _friction_one(fr, j, qd[j])
    for j in range(n):
        if locked[j]:
            for k in range(n):
                M[j, k] = 0.0
                M[k, j] = 0.0
            M[j, j] = 1.0
            rhs[j] = 0.0
    return K._cholesky_solve(M, rhs, L, out)


@njit(cache=True, nogil=True)
def advance(jtype, Rpl, ppl, axis, grav, P, fr, tau, locked, dt, nsub, method, q, qd, qdd0):
    """Integrate (q, qd) in place over dt with the torque tau held constant, in nsub substeps.

    method RK4 (classic 4th order on x = (q, qd), x' = (qd, qdd(q, qd))) or SEMI_IMPLICIT
    (qd += h qdd(q, qd); q += h qd). qdd0 receives the acceleration at the start of the period.
    Returns False if the mass matrix lost positive definiteness.
    """
    n = q.shape[0]
    ws = workspace(n)
    h = dt / nsub
    acc = np.empty((4, n))   # stage accelerations
    vel = np.empty((4, n))   # stage velocities (the q-slopes)
    qs = np.empty(n)
    for j in range(n):
        if locked[j]:
            qd[j] = 0.0
    for s in range(nsub):
        for j in range(n):
            vel[0, j] = qd[j]
        if not acceleration(jtype, Rpl, ppl, axis, grav, P, fr, q, qd, tau, locked, acc[0], ws):
            return False
        if s == 0:
            for j in range(n):
                qdd0[j] = acc[0, j]
        if method == SEMI_IMPLICIT:
            for j in range(n):
                qd[j] += h * acc[0, j]
                q[j] += h * qd[j]
            continue
        for k in range(1, 4):
            c = 1.0 if k == 3 else 0.5
            for j in range(n):
                qs[j] = q[j] + c * h * vel[k - 1, j]
                vel[k, j] = qd[j] + c * h * acc[k - 1, j]
            if not acceleration(jtype, Rpl, ppl, axis, grav, P, fr, qs, vel[k], tau, locked, acc[k], ws):
                return False
        for j in range(n):
            q[j] += h / 6.0 * (vel[0, j] + 2.0 * vel[1, j] + 2.0 * vel[2, j] + vel[3, j])
            qd[j] += h / 6.0 * (acc[0, j] + 2.0 * acc[1, j] + 2.0 * acc[2, j] + acc[3, j])
    return True
