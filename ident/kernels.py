"""Numba kernels of the serial-chain dynamics, batched over samples.

All quantities are in the base frame unless named `_loc` (frame of the link). Per sample, one forward
pass computes each joint frame's orientation R0, origin o, axis u and the link's velocity ω,
acceleration ω̇ and origin acceleration a (gravity enters as a base acceleration -g). Everything else
(RNEA, regressor, CRBA, Jacobian) reads that pass. Samples are split into chunks; each chunk owns its
scratch arrays, so the hot loops allocate nothing per sample.

Arguments shared by the kernels (arrays of the Model):
  jtype (n,) int64 0 revolute / 1 prismatic; Rpl (n,3,3), ppl (n,3) fixed placements; axis (n,3).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

CHUNK = 128


@njit(cache=True, inline="always")
def _cross(a0, a1, a2, b0, b1, b2):
    return a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0


@njit(cache=True)
def _joint_rotation(axis, j, angle, out):
    """Rodrigues rotation about the unit axis[j]."""
    x, y, z = axis[j, 0], axis[j, 1], axis[j, 2]
    c, s = np.cos(angle), np.sin(angle)
    t = 1.0 - c
    out[0, 0] = c + x * x * t
    out[0, 1] = x * y * t - z * s
    out[0, 2] = x * z * t + y * s
    out[1, 0] = y * x * t + z * s
    out[1, 1] = c + y * y * t
    out[1, 2] = y * z * t - x * s
    out[2, 0] = z * x * t - y * s
    out[2, 1] = z * y * t + x * s
    out[2, 2] = c + z * z * t


@njit(cache=True, inline="always")
def forward_pass(jtype, Rpl, ppl, axis, grav, q, qd, qdd, R0, o, u, w, wd, a, Rq, M):
    """Kinematics and link motion of one sample, into the scratch arrays R0 (n,3,3), o, u, w, wd, a (n,3).

    Rq and M are (3,3) scratch. grav is the gravity vector; a holds the acceleration of each frame origin
    minus gravity, so gravity needs no other term.
    """
    n = q.shape[0]
    pw0 = pw1 = pw2 = 0.0          # parent's ω
    pd0 = pd1 = pd2 = 0.0          # parent's ω̇
    pa0, pa1, pa2 = -grav[0], -grav[1], -grav[2]
    po0 = po1 = po2 = 0.0
    for j in range(n):
        # M = R0[j-1] @ Rpl[j] (the base orientation is the identity)
        if j == 0:
            for r in range(3):
                for c in range(3):
                    M[r, c] = Rpl[0, r, c]
        else:
            for r in range(3):
                for c in range(3):
                    M[r, c] = R0[j - 1, r, 0] * Rpl[j, 0, c] + R0[j - 1, r, 1] * Rpl[j, 1, c] + R0[j - 1, r, 2] * Rpl[j, 2, c]
        # origin offset in the base frame: Rparent @ (ppl + [prismatic] Rpl axis q)
        lp0, lp1, lp2 = ppl[j, 0], ppl[j, 1], ppl[j, 2]
        if jtype[j] == 1:
            for r in range(3):
                s = q[j] * (Rpl[j, r, 0] * axis[j, 0] + Rpl[j, r, 1] * axis[j, 1] + Rpl[j, r, 2] * axis[j, 2])
                if r == 0:
                    lp0 += s
                elif r == 1:
                    lp1 += s
                else:
                    lp2 += s
        if j == 0:
            r0, r1, r2 = lp0, lp1, lp2
        else:
            r0 = R0[j - 1, 0, 0] * lp0 + R0[j - 1, 0, 1] * lp1 + R0[j - 1, 0, 2] * lp2
            r1 = R0[j - 1, 1, 0] * lp0 + R0[j - 1, 1, 1] * lp1 + R0[j - 1, 1, 2] * lp2
            r2 = R0[j - 1, 2, 0] * lp0 + R0[j - 1, 2, 1] * lp1 + R0[j - 1, 2, 2] * lp2
        o[j, 0], o[j, 1], o[j, 2] = po0 + r0, po1 + r1, po2 + r2
        # orientation of frame j
        if jtype[j] == 0:
            _joint_rotation(axis, j, q[j], Rq)
            for rr in range(3):
                for c in range(3):
                    R0[j, rr, c] = M[rr, 0] * Rq[0, c] + M[rr, 1] * Rq[1, c] + M[rr, 2] * Rq[2, c]
        else:
            for rr in range(3):
                for c in range(3):
                    R0[j, rr, c] = M[rr, c]
        u0 = R0[j, 0, 0] * axis[j, 0] + R0[j, 0, 1] * axis[j, 1] + R0[j, 0, 2] * axis[j, 2]
        u1 = R0[j, 1, 0] * axis[j, 0] + R0[j, 1, 1] * axis[j, 1] + R0[j, 1, 2] * axis[j, 2]
        u2 = R0[j, 2, 0] * axis[j, 0] + R0[j, 2, 1] * axis[j, 1] + R0[j, 2, 2] * axis[j, 2]
        u[j, 0], u[j, 1], u[j, 2] = u0, u1, u2
        # origin acceleration: parent's + ω̇ x r + ω x (ω x r)
        c0, c1, c2 = _cross(pw0, pw1, pw2, r0, r1, r2)
        cc0, cc1, cc2 = _cross(pw0, pw1, pw2, c0, c1, c2)
        e0, e1, e2 = _cross(pd0, pd1, pd2, r0, r1, r2)
        na0, na1, na2 = pa0 + e0 + cc0, pa1 + e1 + cc1, pa2 + e2 + cc2
        x = qd[j]
        y = qdd[j]
        if jtype[j] == 0:
            k0, k1, k2 = _cross(pw0, pw1, pw2, u0 * x, u1 * x, u2 * x)
            nd0, nd1, nd2 = pd0 + u0 * y + k0, pd1 + u1 * y + k1, pd2 + u2 * y + k2
            nw0, nw1, nw2 = pw0 + u0 * x, pw1 + u1 * x, pw2 + u2 * x
        else:
            k0, k1, k2 = _cross(pw0, pw1, pw2, u0 * x, u1 * x, u2 * x)
            na0 += 2.0 * k0 + u0 * y
            na1 += 2.0 * k1 + u1 * y
            na2 += 2.0 * k2 + u2 * y
            nd0, nd1, nd2 = pd0, pd1, pd2
            nw0, nw1, nw2 = pw0, pw1, pw2
        w[j, 0], w[j, 1], w[j, 2] = nw0, nw1, nw2
        wd[j, 0], wd[j, 1], wd[j, 2] = nd0, nd1, nd2
        a[j, 0], a[j, 1], a[j, 2] = na0, na1, na2
        pw0, pw1, pw2 = nw0, nw1, nw2
        pd0, pd1, pd2 = nd0, nd1, nd2
        pa0, pa1, pa2 = na0, na1, na2
        po0, po1, po2 = o[j, 0], o[j, 1], o[j, 2]


@njit(cache=True, inline="always")
def _rt(r00, r01, r02, r10, r11, r12, r20, r21, r22, v0, v1, v2):
    """R^T v for R given by its entries."""
    return (r00 * v0 + r10 * v1 + r20 * v2, r01 * v0 + r11 * v1 + r21 * v2, r02 * v0 + r12 * v1 + r22 * v2)


@njit(cache=True, inline="always")
def link_columns(jtype, j, R0, o, u, w, wd, a, out, s, col0, rows_to):
    """Torque coefficients of link j's 10 inertial parameters (frame-j values) on joints 0..rows_to-1.

    Writes out[s, i, col0:col0+10] for i <= j (and zeros for j < i < rows_to). Uses
      revolute i:  tau_i = u_i . n + (u_i x (o_j - o_i)) . f,  prismatic i: tau_i = u_i . f,
    with the link wrench f = m a + ω̇ x h + ω x (ω x h), n = I ω̇ + ω x I ω + h x a, all in frame j.
    Everything read more than once is held in locals (the stores to out could alias the inputs), and no
    array view is made: views cost reference counting on every call.
    """
    r00, r01, r02 = R0[j, 0, 0], R0[j, 0, 1], R0[j, 0, 2]
    r10, r11, r12 = R0[j, 1, 0], R0[j, 1, 1], R0[j, 1, 2]
    r20, r21, r22 = R0[j, 2, 0], R0[j, 2, 1], R0[j, 2, 2]
    oj0, oj1, oj2 = o[j, 0], o[j, 1], o[j, 2]
    w0, w1, w2 = _rt(r00, r01, r02, r10, r11, r12, r20, r21, r22, w[j, 0], w[j, 1], w[j, 2])
    d0, d1, d2 = _rt(r00, r01, r02, r10, r11, r12, r20, r21, r22, wd[j, 0], wd[j, 1], wd[j, 2])
    a0, a1, a2 = _rt(r00, r01, r02, r10, r11, r12, r20, r21, r22, a[j, 0], a[j, 1], a[j, 2])
    ww = w0 * w0 + w1 * w1 + w2 * w2
    for i in range(rows_to):
        if i > j:
            for k in range(10):
                out[s, i, col0 + k] = 0.0
            continue
        ui0, ui1, ui2 = u[i, 0], u[i, 1], u[i, 2]
        x0, x1, x2 = _rt(r00, r01, r02, r10, r11, r12, r20, r21, r22, ui0, ui1, ui2)  # joint i axis, frame j
        if jtype[i] == 0:
            b0, b1, b2 = _cross(ui0, ui1, ui2, oj0 - o[i, 0], oj1 - o[i, 1], oj2 - o[i, 2])
            v0, v1, v2 = _rt(r00, r01, r02, r10, r11, r12, r20, r21, r22, b0, b1, b2)  # u_i x (o_j - o_i)
            t0, t1, t2 = _cross(x0, x1, x2, w0, w1, w2)
            p0, p1, p2 = _cross(a0, a1, a2, x0, x1, x2)
            q0, q1, q2 = _cross(v0, v1, v2, d0, d1, d2)
            vw = v0 * w0 + v1 * w1 + v2 * w2
            c0 = x0 * d0 + t0 * w0  # x^T L(ω̇) + t^T L(ω): [XX XY XZ YY YZ ZZ]
            c1 = x0 * d1 + x1 * d0 + t0 * w1 + t1 * w0
            c2 = x0 * d2 + x2 * d0 + t0 * w2 + t2 * w0
            c3 = x1 * d1 + t1 * w1
            c4 = x1 * d2 + x2 * d1 + t1 * w2 + t2 * w1
            c5 = x2 * d2 + t2 * w2
            c6 = p0 + q0 + vw * w0 - ww * v0  # first moments: a x u + w x ω̇ + (w.ω) ω - |ω|^2 w
            c7 = p1 + q1 + vw * w1 - ww * v1
            c8 = p2 + q2 + vw * w2 - ww * v2
            c9 = v0 * a0 + v1 * a1 + v2 * a2
        else:
            q0, q1, q2 = _cross(x0, x1, x2, d0, d1, d2)
            xw = x0 * w0 + x1 * w1 + x2 * w2
            c0 = c1 = c2 = c3 = c4 = c5 = 0.0
            c6 = q0 + xw * w0 - ww * x0
            c7 = q1 + xw * w1 - ww * x1
            c8 = q2 + xw * w2 - ww * x2
            c9 = x0 * a0 + x1 * a1 + x2 * a2
        out[s, i, col0 + 0] = c0
        out[s, i, col0 + 1] = c1
        out[s, i, col0 + 2] = c2
        out[s, i, col0 + 3] = c3
        out[s, i, col0 + 4] = c4
        out[s, i, col0 + 5] = c5
        out[s, i, col0 + 6] = c6
        out[s, i, col0 + 7] = c7
        out[s, i, col0 + 8] = c8
        out[s, i, col0 + 9] = c9


@njit(cache=True)
def _scratch(n):
    return (np.empty((n, 3, 3)), np.empty((n, 3)), np.empty((n, 3)), np.empty((n, 3)),
            np.empty((n, 3)), np.empty((n, 3)), np.empty((3, 3)), np.empty((3, 3)))


@njit(cache=True, parallel=True)
def regressor(jtype, Rpl, ppl, axis, grav, Q, QD, QDD, out):
    """Standard regressor into out (N, n, 14n): 10 inertial + Ia, fc, fv, offset per joint."""
    N, n = Q.shape
    nchunks = (N + CHUNK - 1) // CHUNK
    for c in prange(nchunks):
        R0, o, u, w, wd, a, Rq, Ms = _scratch(n)
        q, qd, qdd = np.empty(n), np.empty(n), np.empty(n)
        for s in range(c * CHUNK, min(N, (c + 1) * CHUNK)):
            for j in range(n):
                q[j], qd[j], qdd[j] = Q[s, j], QD[s, j], QDD[s, j]
            forward_pass(jtype, Rpl, ppl, axis, grav, q, qd, qdd, R0, o, u, w, wd, a, Rq, Ms)
            for j in range(n):
                link_columns(jtype, j, R0, o, u, w, wd, a, out, s, 14 * j, n)
                col = 14 * j + 10
                for i in range(n):
                    if i == j:
                        out[s, i, col] = qdd[j]
                        out[s, i, col + 1] = np.sign(qd[j])
                        out[s, i, col + 2] = qd[j]
                        out[s, i, col + 3] = 1.0
                    else:
                        out[s, i, col] = 0.0
                        out[s, i, col + 1] = 0.0
                        out[s, i, col + 2] = 0.0
                        out[s, i, col + 3] = 0.0


@njit(cache=True, parallel=True)
def load_regressor(jtype, Rpl, ppl, axis, grav, T, Q, QD, QDD, out):
    """Payload regressor into out (N, n, 10): link n's columns times T (flange -> link-n parameter map)."""
    N, n = Q.shape
    nchunks = (N + CHUNK - 1) // CHUNK
    for c in prange(nchunks):
        R0, o, u, w, wd, a, Rq, Ms = _scratch(n)
        cols = np.empty((1, n, 10))
        for s in range(c * CHUNK, min(N, (c + 1) * CHUNK)):
            forward_pass(jtype, Rpl, ppl, axis, grav, Q[s], QD[s], QDD[s], R0, o, u, w, wd, a, Rq, Ms)
            link_columns(jtype, n - 1, R0, o, u, w, wd, a, cols, 0, 0, n)
            for i in range(n):
                for k in range(10):
                    acc = 0.0
                    for m in range(10):
                        acc += cols[0, i, m] * T[m, k]
                    out[s, i, k] = acc


@njit(cache=True, inline="always")
def _rnea_one(jtype, R0, o, u, w, wd, a, P, qd, qdd, drive, tau, F, Nm):
    """Backward pass of RNEA for one sample (after forward_pass). P is (n, 14) parameters."""
    n = qd.shape[0]
    for j in range(n - 1, -1, -1):
        # link parameters to the base frame: h = R mc, J = R I R^T (applied to vectors)
        R = R0[j]
        m = P[j, 9]
        h0 = R[0, 0] * P[j, 6] + R[0, 1] * P[j, 7] + R[0, 2] * P[j, 8]
        h1 = R[1, 0] * P[j, 6] + R[1, 1] * P[j, 7] + R[1, 2] * P[j, 8]
        h2 = R[2, 0] * P[j, 6] + R[2, 1] * P[j, 7] + R[2, 2] * P[j, 8]
        wl0, wl1, wl2 = _rt(R[0, 0], R[0, 1], R[0, 2], R[1, 0], R[1, 1], R[1, 2], R[2, 0], R[2, 1], R[2, 2],
                            w[j, 0], w[j, 1], w[j, 2])
        dl0, dl1, dl2 = _rt(R[0, 0], R[0, 1], R[0, 2], R[1, 0], R[1, 1], R[1, 2], R[2, 0], R[2, 1], R[2, 2],
                            wd[j, 0], wd[j, 1], wd[j, 2])
        XX, XY, XZ, YY, YZ, ZZ = P[j, 0], P[j, 1], P[j, 2], P[j, 3], P[j, 4], P[j, 5]
        Iw0 = XX * wl0 + XY * wl1 + XZ * wl2
        Iw1 = XY * wl0 + YY * wl1 + YZ * wl2
        Iw2 = XZ * wl0 + YZ * wl1 + ZZ * wl2
        c0, c1, c2 = _cross(wl0, wl1, wl2, Iw0, Iw1, Iw2)
        nl0 = XX * dl0 + XY * dl1 + XZ * dl2 + c0
        nl1 = XY * dl0 + YY * dl1 + YZ * dl2 + c1
        nl2 = XZ * dl0 + YZ * dl1 + ZZ * dl2 + c2
        n0 = R[0, 0] * nl0 + R[0, 1] * nl1 + R[0, 2] * nl2
        n1 = R[1, 0] * nl0 + R[1, 1] * nl1 + R[1, 2] * nl2
        n2 = R[2, 0] * nl0 + R[2, 1] * nl1 + R[2, 2] * nl2
        e0, e1, e2 = _cross(h0, h1, h2, a[j, 0], a[j, 1], a[j, 2])
        n0 += e0
        n1 += e1
        n2 += e2
        g0, g1, g2 = _cross(wd[j, 0], wd[j, 1], wd[j, 2], h0, h1, h2)
        k0, k1, k2 = _cross(w[j, 0], w[j, 1], w[j, 2], h0, h1, h2)
        l0, l1, l2 = _cross(w[j, 0], w[j, 1], w[j, 2], k0, k1, k2)
        f0 = m * a[j, 0] + g0 + l0
        f1 = m * a[j, 1] + g1 + l1
        f2 = m * a[j, 2] + g2 + l2
        if j < n - 1:
            f0 += F[j + 1, 0]
            f1 += F[j + 1, 1]
            f2 += F[j + 1, 2]
            r0, r1, r2 = o[j + 1, 0] - o[j, 0], o[j + 1, 1] - o[j, 1], o[j + 1, 2] - o[j, 2]
            t0, t1, t2 = _cross(r0, r1, r2, F[j + 1, 0], F[j + 1, 1], F[j + 1, 2])
            n0 += Nm[j + 1, 0] + t0
            n1 += Nm[j + 1, 1] + t1
            n2 += Nm[j + 1, 2] + t2
        F[j, 0], F[j, 1], F[j, 2] = f0, f1, f2
        Nm[j, 0], Nm[j, 1], Nm[j, 2] = n0, n1, n2
        if jtype[j] == 0:
            t = u[j, 0] * n0 + u[j, 1] * n1 + u[j, 2] * n2
        else:
            t = u[j, 0] * f0 + u[j, 1] * f1 + u[j, 2] * f2
        if drive:
            t += P[j, 10] * qdd[j] + P[j, 11] * np.sign(qd[j]) + P[j, 12] * qd[j] + P[j, 13]
        tau[j] = t


@njit(cache=True, parallel=True)
def rnea(jtype, Rpl, ppl, axis, grav, P, Q, QD, QDD, drive, out):
    """Inverse dynamics into out (N, n). drive=True adds Ia qdd + fc sign(qd) + fv qd + offset."""
    N, n = Q.shape
    nchunks = (N + CHUNK - 1) // CHUNK
    for c in prange(nchunks):
        R0, o, u, w, wd, a, Rq, Ms = _scratch(n)
        F = np.empty((n, 3))
        Nm = np.empty((n, 3))
        for s in range(c * CHUNK, min(N, (c + 1) * CHUNK)):
            forward_pass(jtype, Rpl, ppl, axis, grav, Q[s], QD[s], QDD[s], R0, o, u, w, wd, a, Rq, Ms)
            _rnea_one(jtype, R0, o, u, w, wd, a, P, QD[s], QDD[s], drive, out[s], F, Nm)


@njit(cache=True, inline="always")
def _crba_one(jtype, R0, o, u, P, drive, M, Jc, hc, mc):
    """Composite-rigid-body mass matrix for one sample (after forward_pass), into M (n, n).

    Composite bodies are summed about the base origin in base axes: Jc (n,3,3), hc (n,3), mc (n,).
    """
    n = u.shape[0]
    for j in range(n - 1, -1, -1):
        R = R0[j]
        I = np.empty((3, 3))
        I[0, 0], I[0, 1], I[0, 2] = P[j, 0], P[j, 1], P[j, 2]
        I[1, 0], I[1, 1], I[1, 2] = P[j, 1], P[j, 3], P[j, 4]
        I[2, 0], I[2, 1], I[2, 2] = P[j, 2], P[j, 4], P[j, 5]
        m = P[j, 9]
        h = np.empty(3)
        for r in range(3):
            h[r] = R[r, 0] * P[j, 6] + R[r, 1] * P[j, 7] + R[r, 2] * P[j, 8]
        # J about o_j in base axes, then shifted to the base origin: J + m[p]^T[p] + [p]^T[h] + [h]^T[p]
        RI = np.empty((3, 3))
        for r in range(3):
            for c in range(3):
                RI[r, c] = R[r, 0] * I[0, c] + R[r, 1] * I[1, c] + R[r, 2] * I[2, c]
        p0, p1, p2 = o[j, 0], o[j, 1], o[j, 2]
        ph = p0 * h[0] + p1 * h[1] + p2 * h[2]
        pp = p0 * p0 + p1 * p1 + p2 * p2
        pv = (p0, p1, p2)
        for r in range(3):
            for c in range(3):
                val = RI[r, 0] * R[c, 0] + RI[r, 1] * R[c, 1] + RI[r, 2] * R[c, 2]
                # [p]^T[p] = |p|^2 1 - p p^T ; [p]^T[h] + [h]^T[p] = 2 (p.h) 1 - p h^T - h p^T
                val += m * ((pp if r == c else 0.0) - pv[r] * pv[c])
                val += (2.0 * ph if r == c else 0.0) - pv[r] * h[c] - h[r] * pv[c]
                Jc[j, r, c] = val + (Jc[j + 1, r, c] if j < n - 1 else 0.0)
        for r in range(3):
            hc[j, r] = h[r] + m * pv[r] + (hc[j + 1, r] if j < n - 1 else 0.0)
        mc[j] = m + (mc[j + 1] if j < n - 1 else 0.0)
    for j in range(n):
        # motion of joint j about the base origin: revolute (ω=u, v=o x u); prismatic (ω=0, v=u)
        if jtype[j] == 0:
            sw0, sw1, sw2 = u[j, 0], u[j, 1], u[j, 2]
            sv0, sv1, sv2 = _cross(o[j, 0], o[j, 1], o[j, 2], sw0, sw1, sw2)
        else:
            sw0 = sw1 = sw2 = 0.0
            sv0, sv1, sv2 = u[j, 0], u[j, 1], u[j, 2]
        # momentum of composite body j moving with s_j: p = m v + ω x h ; L = J ω + h x v
        c0, c1, c2 = _cross(sw0, sw1, sw2, hc[j, 0], hc[j, 1], hc[j, 2])
        lp0, lp1, lp2 = mc[j] * sv0 + c0, mc[j] * sv1 + c1, mc[j] * sv2 + c2
        e0, e1, e2 = _cross(hc[j, 0], hc[j, 1], hc[j, 2], sv0, sv1, sv2)
        L0 = Jc[j, 0, 0] * sw0 + Jc[j, 0, 1] * sw1 + Jc[j, 0, 2] * sw2 + e0
        L1 = Jc[j, 1, 0] * sw0 + Jc[j, 1, 1] * sw1 + Jc[j, 1, 2] * sw2 + e1
        L2 = Jc[j, 2, 0] * sw0 + Jc[j, 2, 1] * sw1 + Jc[j, 2, 2] * sw2 + e2
        for i in range(j + 1):
            if jtype[i] == 0:
                iw0, iw1, iw2 = u[i, 0], u[i, 1], u[i, 2]
                iv0, iv1, iv2 = _cross(o[i, 0], o[i, 1], o[i, 2], iw0, iw1, iw2)
            else:
                iw0 = iw1 = iw2 = 0.0
                iv0, iv1, iv2 = u[i, 0], u[i, 1], u[i, 2]
            val = iw0 * L0 + iw1 * L1 + iw2 * L2 + iv0 * lp0 + iv1 * lp1 + iv2 * lp2
            M[i, j] = val
            M[j, i] = val
        if drive:
            M[j, j] += P[j, 10]


@njit(cache=True, parallel=True)
def mass_matrix(jtype, Rpl, ppl, axis, P, Q, drive, out):
    """Joint-space inertia M(q) into out (N, n, n); drive=True adds the rotor inertias Ia."""
    N, n = Q.shape
    nchunks = (N + CHUNK - 1) // CHUNK
    zero = np.zeros(3)
    for c in prange(nchunks):
        R0, o, u, w, wd, a, Rq, Ms = _scratch(n)
        Jc = np.empty((n, 3, 3))
        hc = np.empty((n, 3))
        mc = np.empty(n)
        z = np.zeros(n)
        for s in range(c * CHUNK, min(N, (c + 1) * CHUNK)):
            forward_pass(jtype, Rpl, ppl, axis, zero, Q[s], z, z, R0, o, u, w, wd, a, Rq, Ms)
            _crba_one(jtype, R0, o, u, P, drive, out[s], Jc, hc, mc)


@njit(cache=True)
def _cholesky_solve(M, b, L, x):
    """Solve M x = b for symmetric positive definite M (n x n); returns False if M is not SPD."""
    n = b.shape[0]
    for i in range(n):
        for j in range(i + 1):
            s = M[i, j]
            for k in range(j):
                s -= L[i, k] * L[j, k]
            if i == j:
                if s <= 0.0:
                    return False
                L[i, i] = np.sqrt(s)
            else:
                L[i, j] = s / L[j, j]
    for i in range(n):
        s = b[i]
        for k in range(i):
            s -= L[i, k] * x[k]
        x[i] = s / L[i, i]
    for i in range(n - 1, -1, -1):
        s = x[i]
        for k in range(i + 1, n):
            s -= L[k, i] * x[k]
        x[i] = s / L[i, i]
    return True


@njit(cache=True, parallel=True)
def forward_dynamics(jtype, Rpl, ppl, axis, grav, P, Q, QD, TAU, drive, out, ok):
    """qdd = M(q)^-1 (tau - rnea(q, qd, 0)) into out (N, n); ok[s] False where M is not positive definite.

    drive=True includes Ia in M and friction + offset in the bias.
    """
    N, n = Q.shape
    nchunks = (N + CHUNK - 1) // CHUNK
    for c in prange(nchunks):
        R0, o, u, w, wd, a, Rq, Ms = _scratch(n)
        F = np.empty((n, 3))
        Nm = np.empty((n, 3))
        Jc = np.empty((n, 3, 3))
        hc = np.empty((n, 3))
        mc = np.empty(n)
        M = np.empty((n, n))
        L = np.zeros((n, n))
        bias = np.empty(n)
        rhs = np.empty(n)
        z = np.zeros(n)
        for s in range(c * CHUNK, min(N, (c + 1) * CHUNK)):
            forward_pass(jtype, Rpl, ppl, axis, grav, Q[s], QD[s], z, R0, o, u, w, wd, a, Rq, Ms)
            _rnea_one(jtype, R0, o, u, w, wd, a, P, QD[s], z, drive, bias, F, Nm)
            _crba_one(jtype, R0, o, u, P, drive, M, Jc, hc, mc)
            for i in range(n):
                rhs[i] = TAU[s, i] - bias[i]
            ok[s] = _cholesky_solve(M, rhs, L, out[s])


@njit(cache=True, parallel=True)
def flange_kinematics(jtype, Rpl, ppl, axis, Rf, pf, Q, pose, jac):
    """Flange pose (N, 4, 4) and geometric Jacobian (N, 6, n) at the flange origin, base axes,
    rows [linear velocity; angular velocity]."""
    N, n = Q.shape
    nchunks = (N + CHUNK - 1) // CHUNK
    zero = np.zeros(3)
    for c in prange(nchunks):
        R0, o, u, w, wd, a, Rq, Ms = _scratch(n)
        z = np.zeros(n)
        for s in range(c * CHUNK, min(N, (c + 1) * CHUNK)):
            forward_pass(jtype, Rpl, ppl, axis, zero, Q[s], z, z, R0, o, u, w, wd, a, Rq, Ms)
            T = pose[s]
            for r in range(3):
                for cc in range(3):
                    T[r, cc] = R0[n - 1, r, 0] * Rf[0, cc] + R0[n - 1, r, 1] * Rf[1, cc] + R0[n - 1, r, 2] * Rf[2, cc]
                T[r, 3] = o[n - 1, r] + R0[n - 1, r, 0] * pf[0] + R0[n - 1, r, 1] * pf[1] + R0[n - 1, r, 2] * pf[2]
                T[3, r] = 0.0
            T[3, 3] = 1.0
            for i in range(n):
                if jtype[i] == 0:
                    v0, v1, v2 = _cross(u[i, 0], u[i, 1], u[i, 2], T[0, 3] - o[i, 0], T[1, 3] - o[i, 1], T[2, 3] - o[i, 2])
                    jac[s, 0, i], jac[s, 1, i], jac[s, 2, i] = v0, v1, v2
                    jac[s, 3, i], jac[s, 4, i], jac[s, 5, i] = u[i, 0], u[i, 1], u[i, 2]
                else:
                    jac[s, 0, i], jac[s, 1, i], jac[s, 2, i] = u[i, 0], u[i, 1], u[i, 2]
                    jac[s, 3, i] = jac[s, 4, i] = jac[s, 5, i] = 0.0
