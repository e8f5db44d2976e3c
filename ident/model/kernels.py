"""Numba kernels of the serial-chain dynamics, batched over samples.

All quantities are in the base frame unless named `_loc` (frame of the link). Per sample, one forward
pass computes each joint frame's orientation R0, origin o, axis u and the link's velocity ω,
acceleration ω̇ and origin acceleration a (gravity enters as a base acceleration -g). Everything else
(RNEA, CRBA, Jacobian, payload regressor) reads that pass. Samples are split into chunks; each chunk owns
its scratch arrays, so the hot loops allocate nothing per sample.

The full regressor, the heaviest kernel (504 outputs a sample for n = 6), has a lane-parallel twin of that
pass and of link_columns (_forward_lane, _columns_lane): blocks of LANES samples in structure-of-arrays
form so that LLVM vectorises across samples, with a vectorisable sin/cos and streaming stores of the
output. tests/test_regressor_fast_path.py holds the two paths to each other through RNEA. _block_forward and
_block_columns are called, not inlined into the parallel loop (LLVM still optimises each as a whole): the
parallel pass over one function holding both lane twins took 2.5 times the CPU time to compile (29-32 s against
11-12 s here), for the same speed.

Arguments shared by the kernels (arrays of the Model):
  jtype (n,) int64 0 revolute / 1 prismatic; Rpl (n,3,3), ppl (n,3) fixed placements; axis (n,3).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

CHUNK = 128


@intrinsic
def _stream_pair(typingctx, flat, index, v0, v1):
    """Store (v0, v1) at flat[index], flat[index + 1] with a non-temporal (cache-bypassing) store.

    flat is a 1-d float64 array and flat[index] must be 16-byte aligned. Streaming stores skip the read
    of each destination cache line that an ordinary store of a large output pays (memory traffic / 2).
    """
    sig = types.void(flat, index, v0, v1)

    def codegen(context, builder, signature, args):
        arr, idx, x0, x1 = args
        data = context.make_array(signature.args[0])(context, builder, arr).data
        vty = ir.VectorType(ir.DoubleType(), 2)
        vec = ir.Constant(vty, ir.Undefined)
        vec = builder.insert_element(vec, x0, ir.Constant(ir.IntType(32), 0))
        vec = builder.insert_element(vec, x1, ir.Constant(ir.IntType(32), 1))
        store = builder.store(vec, builder.bitcast(builder.gep(data, [idx]), vty.as_pointer()), align=16)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _store_fence(typingctx):
    """A full memory fence: orders the streaming stores before anything that follows (end of a chunk).
    LLVM's portable seq_cst fence (mfence on x86-64, dmb on ARM), once per chunk."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return sig, codegen


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


# --- The batch regressor, SIMD across samples --------------------------------------------------------
# Samples are processed in blocks of LANES. Every per-sample value is held LANES wide (structure of
# arrays) and the innermost loop runs over the lanes, so that LLVM vectorises it (4 doubles per AVX2
# instruction). LANES >= 16: below that LLVM treats the loop as tiny and refuses its run-time alias checks.
LANES = 16
# per-joint lane state, in units of LANES: R (9, row-major), o, u, ω, ω̇, a (base frame), then ω, ω̇, a in
# the joint's own frame
_R, _O, _U, _W, _WD, _A, _WL, _DL, _AL = 0, 9, 12, 15, 18, 21, 24, 27, 30
_NS = 33
# forward workspace: parent state (R..a, 24 values), joint inputs (q, qd, qdd, cos q, sin q), child state.
# One array with compile-time offsets lets LLVM prove that the lanes do not depend on each other.
_IN = 24 * LANES
_CUR = 29 * LANES
_IO = _CUR + _NS * LANES


@njit(cache=True, inline="always")
def _get3(x, base, off):
    return x[base + off * LANES], x[base + (off + 1) * LANES], x[base + (off + 2) * LANES]


@njit(cache=True, inline="always")
def _set3(x, base, off, v0, v1, v2):
    x[base + off * LANES] = v0
    x[base + (off + 1) * LANES] = v1
    x[base + (off + 2) * LANES] = v2


# sin and cos that LLVM can vectorise (libm's cannot be, and 12 libm calls a sample cost as much as the
# rest of the forward pass): Cody-Waite reduction by pi/2 in three parts (exact for |x| < SINCOS_RANGE),
# then fdlibm's __kernel_sin / __kernel_cos minimax polynomials on |r| <= pi/4. Error ~1 ulp.
SINCOS_RANGE = 8.0e5  # beyond it (k >= 2^19) the reduction loses bits: libm takes over
_TWO_OVER_PI = 6.36619772367581382433e-01
_PIO2_1 = 1.57079632673412561417e+00    # first 33 bits of pi/2
_PIO2_2 = 6.07710050630396597660e-11    # next 33 bits
_PIO2_2T = 2.02226624879595063154e-21   # pi/2 - _PIO2_1 - _PIO2_2
_S1, _S2, _S3 = -1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04
_S4, _S5, _S6 = 2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10
_C1, _C2, _C3 = 4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05
_C4, _C5, _C6 = -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11


@njit(cache=True, inline="always")
def _sincos(x):
    """(sin x, cos x) for |x| < SINCOS_RANGE, branch-free."""
    k = np.floor(x * _TWO_OVER_PI + 0.5)
    r = ((x - k * _PIO2_1) - k * _PIO2_2) - k * _PIO2_2T
    z = r * r
    sr = r + r * z * (_S1 + z * (_S2 + z * (_S3 + z * (_S4 + z * (_S5 + z * _S6)))))
    cr = (1.0 - 0.5 * z) + z * z * (_C1 + z * (_C2 + z * (_C3 + z * (_C4 + z * (_C5 + z * _C6)))))
    quadrant = k - 4.0 * np.floor(0.25 * k)  # 0, 1, 2 or 3
    odd = quadrant == 1.0 or quadrant == 3.0
    s = cr if odd else sr
    c = sr if odd else cr
    s = -s if quadrant >= 2.0 else s
    c = -c if quadrant == 1.0 or quadrant == 2.0 else c
    return s, c


@njit(cache=True)
def sincos(x, s, c):
    """s[k], c[k] = sin x[k], cos x[k] (rad) as the regressor computes them: vectorised polynomial, libm
    beyond SINCOS_RANGE."""
    for k in range(x.size):
        s[k], c[k] = _sincos(x[k])
    for k in range(x.size):
        if not abs(x[k]) < SINCOS_RANGE:
            s[k], c[k] = np.sin(x[k]), np.cos(x[k])


@njit(cache=True, inline="always")
def _forward_lane(io, b, prismatic, K, lp, pax, ax):
    """One lane of forward_pass for one joint: parent state and inputs from io, child state into io."""
    p00, p01, p02 = _get3(io, b, 0)
    p10, p11, p12 = _get3(io, b, 3)
    p20, p21, p22 = _get3(io, b, 6)
    q, qd, qdd = io[_IN + b], io[_IN + LANES + b], io[_IN + 2 * LANES + b]
    k00, k01, k02, k10, k11, k12, k20, k21, k22 = K
    # M = R_parent @ Rpl
    m00 = p00 * k00 + p01 * k10 + p02 * k20
    m01 = p00 * k01 + p01 * k11 + p02 * k21
    m02 = p00 * k02 + p01 * k12 + p02 * k22
    m10 = p10 * k00 + p11 * k10 + p12 * k20
    m11 = p10 * k01 + p11 * k11 + p12 * k21
    m12 = p10 * k02 + p11 * k12 + p12 * k22
    m20 = p20 * k00 + p21 * k10 + p22 * k20
    m21 = p20 * k01 + p21 * k11 + p22 * k21
    m22 = p20 * k02 + p21 * k12 + p22 * k22
    l0, l1, l2 = lp
    if prismatic:
        l0 += q * pax[0]
        l1 += q * pax[1]
        l2 += q * pax[2]
    r0 = p00 * l0 + p01 * l1 + p02 * l2
    r1 = p10 * l0 + p11 * l1 + p12 * l2
    r2 = p20 * l0 + p21 * l1 + p22 * l2
    o0, o1, o2 = _get3(io, b, _O)
    _set3(io, _CUR + b, _O, o0 + r0, o1 + r1, o2 + r2)
    x, y, z = ax
    u0 = m00 * x + m01 * y + m02 * z  # R @ axis = M @ axis: the joint rotation leaves its axis fixed
    u1 = m10 * x + m11 * y + m12 * z
    u2 = m20 * x + m21 * y + m22 * z
    _set3(io, _CUR + b, _U, u0, u1, u2)
    if prismatic:
        R00, R01, R02, R10, R11, R12, R20, R21, R22 = m00, m01, m02, m10, m11, m12, m20, m21, m22
    else:
        c, s = io[_IN + 3 * LANES + b], io[_IN + 4 * LANES + b]
        t = 1.0 - c
        xs, ys, zs = x * s, y * s, z * s
        xt, yt, zt = x * t, y * t, z * t
        q00, q01, q02 = c + x * xt, x * yt - zs, x * zt + ys
        q10, q11, q12 = y * xt + zs, c + y * yt, y * zt - xs
        q20, q21, q22 = z * xt - ys, z * yt + xs, c + z * zt
        R00 = m00 * q00 + m01 * q10 + m02 * q20
        R01 = m00 * q01 + m01 * q11 + m02 * q21
        R02 = m00 * q02 + m01 * q12 + m02 * q22
        R10 = m10 * q00 + m11 * q10 + m12 * q20
        R11 = m10 * q01 + m11 * q11 + m12 * q21
        R12 = m10 * q02 + m11 * q12 + m12 * q22
        R20 = m20 * q00 + m21 * q10 + m22 * q20
        R21 = m20 * q01 + m21 * q11 + m22 * q21
        R22 = m20 * q02 + m21 * q12 + m22 * q22
    _set3(io, _CUR + b, 0, R00, R01, R02)
    _set3(io, _CUR + b, 3, R10, R11, R12)
    _set3(io, _CUR + b, 6, R20, R21, R22)
    pw0, pw1, pw2 = _get3(io, b, _W)
    pd0, pd1, pd2 = _get3(io, b, _WD)
    pa0, pa1, pa2 = _get3(io, b, _A)
    c0, c1, c2 = _cross(pw0, pw1, pw2, r0, r1, r2)
    cc0, cc1, cc2 = _cross(pw0, pw1, pw2, c0, c1, c2)
    e0, e1, e2 = _cross(pd0, pd1, pd2, r0, r1, r2)
    na0, na1, na2 = pa0 + e0 + cc0, pa1 + e1 + cc1, pa2 + e2 + cc2
    k0, k1, k2 = _cross(pw0, pw1, pw2, u0 * qd, u1 * qd, u2 * qd)
    if prismatic:
        na0 += 2.0 * k0 + u0 * qdd
        na1 += 2.0 * k1 + u1 * qdd
        na2 += 2.0 * k2 + u2 * qdd
        nd0, nd1, nd2 = pd0, pd1, pd2
        nw0, nw1, nw2 = pw0, pw1, pw2
    else:
        nd0, nd1, nd2 = pd0 + u0 * qdd + k0, pd1 + u1 * qdd + k1, pd2 + u2 * qdd + k2
        nw0, nw1, nw2 = pw0 + u0 * qd, pw1 + u1 * qd, pw2 + u2 * qd
    _set3(io, _CUR + b, _W, nw0, nw1, nw2)
    _set3(io, _CUR + b, _WD, nd0, nd1, nd2)
    _set3(io, _CUR + b, _A, na0, na1, na2)
    v0, v1, v2 = _rt(R00, R01, R02, R10, R11, R12, R20, R21, R22, nw0, nw1, nw2)
    _set3(io, _CUR + b, _WL, v0, v1, v2)
    v0, v1, v2 = _rt(R00, R01, R02, R10, R11, R12, R20, R21, R22, nd0, nd1, nd2)
    _set3(io, _CUR + b, _DL, v0, v1, v2)
    v0, v1, v2 = _rt(R00, R01, R02, R10, R11, R12, R20, R21, R22, na0, na1, na2)
    _set3(io, _CUR + b, _AL, v0, v1, v2)


@njit(cache=True, inline="always")
def _columns_lane(st, J, I, prismatic_i, cb, base):
    """One lane of link_columns: link j's 10 inertial columns on the row of joint i (state offsets J, I)."""
    r00, r01, r02 = _get3(st, J, 0)
    r10, r11, r12 = _get3(st, J, 3)
    r20, r21, r22 = _get3(st, J, 6)
    w0, w1, w2 = _get3(st, J, _WL)
    d0, d1, d2 = _get3(st, J, _DL)
    a0, a1, a2 = _get3(st, J, _AL)
    ui0, ui1, ui2 = _get3(st, I, _U)
    x0, x1, x2 = _rt(r00, r01, r02, r10, r11, r12, r20, r21, r22, ui0, ui1, ui2)  # joint i axis, frame j
    ww = w0 * w0 + w1 * w1 + w2 * w2
    if prismatic_i:
        q0, q1, q2 = _cross(x0, x1, x2, d0, d1, d2)
        xw = x0 * w0 + x1 * w1 + x2 * w2
        for k in range(6):
            cb[base + k * LANES] = 0.0
        cb[base + 6 * LANES] = q0 + xw * w0 - ww * x0
        cb[base + 7 * LANES] = q1 + xw * w1 - ww * x1
        cb[base + 8 * LANES] = q2 + xw * w2 - ww * x2
        cb[base + 9 * LANES] = x0 * a0 + x1 * a1 + x2 * a2
    else:
        oj0, oj1, oj2 = _get3(st, J, _O)
        oi0, oi1, oi2 = _get3(st, I, _O)
        b0, b1, b2 = _cross(ui0, ui1, ui2, oj0 - oi0, oj1 - oi1, oj2 - oi2)
        v0, v1, v2 = _rt(r00, r01, r02, r10, r11, r12, r20, r21, r22, b0, b1, b2)  # u_i x (o_j - o_i)
        t0, t1, t2 = _cross(x0, x1, x2, w0, w1, w2)
        p0, p1, p2 = _cross(a0, a1, a2, x0, x1, x2)
        q0, q1, q2 = _cross(v0, v1, v2, d0, d1, d2)
        vw = v0 * w0 + v1 * w1 + v2 * w2
        cb[base] = x0 * d0 + t0 * w0
        cb[base + LANES] = x0 * d1 + x1 * d0 + t0 * w1 + t1 * w0
        cb[base + 2 * LANES] = x0 * d2 + x2 * d0 + t0 * w2 + t2 * w0
        cb[base + 3 * LANES] = x1 * d1 + t1 * w1
        cb[base + 4 * LANES] = x1 * d2 + x2 * d1 + t1 * w2 + t2 * w1
        cb[base + 5 * LANES] = x2 * d2 + t2 * w2
        cb[base + 6 * LANES] = p0 + q0 + vw * w0 - ww * v0
        cb[base + 7 * LANES] = p1 + q1 + vw * w1 - ww * v1
        cb[base + 8 * LANES] = p2 + q2 + vw * w2 - ww * v2
        cb[base + 9 * LANES] = v0 * a0 + v1 * a1 + v2 * a2


@njit(cache=True)
def _block_forward(jtype, Rpl, ppl, pax, axis, Q, QD, QDD, s0, m, io, st):
    """Forward pass of samples s0..s0+m-1 (m <= LANES; idle lanes get zeros) into the lane state st.

    st[0:_NS*LANES] is the base (identity, at rest, accelerating by -g); joint j is at slot j + 1.
    """
    n = Q.shape[1]
    for k in range(24 * LANES):
        io[k] = st[k]
    for j in range(n):
        for b in range(m):
            io[_IN + b] = Q[s0 + b, j]
            io[_IN + LANES + b] = QD[s0 + b, j]
            io[_IN + 2 * LANES + b] = QDD[s0 + b, j]
        for b in range(m, LANES):
            for k in range(3):
                io[_IN + k * LANES + b] = 0.0
        for b in range(LANES):
            io[_IN + 4 * LANES + b], io[_IN + 3 * LANES + b] = _sincos(io[_IN + b])
        for b in range(LANES):
            x = io[_IN + b]
            if not abs(x) < SINCOS_RANGE:
                io[_IN + 4 * LANES + b], io[_IN + 3 * LANES + b] = np.sin(x), np.cos(x)
        K = (Rpl[j, 0, 0], Rpl[j, 0, 1], Rpl[j, 0, 2], Rpl[j, 1, 0], Rpl[j, 1, 1], Rpl[j, 1, 2],
             Rpl[j, 2, 0], Rpl[j, 2, 1], Rpl[j, 2, 2])
        lp = (ppl[j, 0], ppl[j, 1], ppl[j, 2])
        pa = (pax[j, 0], pax[j, 1], pax[j, 2])
        ax = (axis[j, 0], axis[j, 1], axis[j, 2])
        if jtype[j] == 1:
            for b in range(LANES):
                _forward_lane(io, b, True, K, lp, pa, ax)
        else:
            for b in range(LANES):
                _forward_lane(io, b, False, K, lp, pa, ax)
        slot = (j + 1) * _NS * LANES
        for k in range(_NS * LANES):
            st[slot + k] = io[_CUR + k]
        for k in range(24 * LANES):
            io[k] = io[_CUR + k]


@njit(cache=True)
def _block_columns(jtype, n, st, cb):
    """Inertial columns of every link j on every row i <= j, lanes innermost: cb[((j (j+1)/2 + i) 10 + k) LANES + b].

    Only the pairs i <= j are stored, so that cb (n(n+1)/2 x 10 x LANES doubles) stays in L1 for n = 6."""
    for j in range(n):
        J = (j + 1) * _NS * LANES
        for i in range(j + 1):
            I = (i + 1) * _NS * LANES
            base = ((j * (j + 1)) // 2 + i) * 10 * LANES
            if jtype[i] == 1:
                for b in range(LANES):
                    _columns_lane(st, J + b, I + b, True, cb, base + b)
            else:
                for b in range(LANES):
                    _columns_lane(st, J + b, I + b, False, cb, base + b)


@njit(cache=True, inline="always")
def _put_pair(flat, index, v0, v1, stream):
    if stream:
        _stream_pair(flat, index, v0, v1)
    else:
        flat[index] = v0
        flat[index + 1] = v1


@njit(cache=True, inline="always")
def _block_write(QD, QDD, s0, m, cb, flat, stream):
    """Rows of samples s0..s0+m-1 into flat (the (N, n, 14n) output), in memory order, two values a store."""
    n = QD.shape[1]
    width = 14 * n
    for b in range(m):
        s = s0 + b
        for i in range(n):
            row = (s * n + i) * width
            for j in range(n):
                o = row + 14 * j
                if i <= j:
                    src = ((j * (j + 1)) // 2 + i) * 10 * LANES + b
                    for k in range(0, 10, 2):
                        _put_pair(flat, o + k, cb[src + k * LANES], cb[src + (k + 1) * LANES], stream)
                else:
                    for k in range(0, 10, 2):
                        _put_pair(flat, o + k, 0.0, 0.0, stream)
                if i == j:
                    _put_pair(flat, o + 10, QDD[s, j], np.sign(QD[s, j]), stream)
                    _put_pair(flat, o + 12, QD[s, j], 1.0, stream)
                else:
                    _put_pair(flat, o + 10, 0.0, 0.0, stream)
                    _put_pair(flat, o + 12, 0.0, 0.0, stream)


@njit(cache=True, parallel=True)
def regressor(jtype, Rpl, ppl, axis, grav, Q, QD, QDD, out):
    """Standard regressor into out (N, n, 14n): 10 inertial + Ia, fc, fv, offset per joint.

    Blocks of LANES samples: forward pass and inertial columns lane-parallel, then each sample's rows are
    written in memory order with streaming stores (when out is 16-byte aligned), every entry once.
    """
    N, n = Q.shape
    flat = out.reshape(out.size)
    stream = out.ctypes.data % 16 == 0
    pax = np.empty((n, 3))  # prismatic axis in the parent frame: Rpl @ axis
    for j in range(n):
        for r in range(3):
            pax[j, r] = Rpl[j, r, 0] * axis[j, 0] + Rpl[j, r, 1] * axis[j, 1] + Rpl[j, r, 2] * axis[j, 2]
    nblocks = (N + LANES - 1) // LANES
    per = CHUNK // LANES
    for c in prange((nblocks + per - 1) // per):
        io = np.empty(_IO)
        st = np.empty((n + 1) * _NS * LANES)
        cb = np.empty(((n * (n + 1)) // 2) * 10 * LANES)
        for k in range(_NS * LANES):
            st[k] = 0.0
        for b in range(LANES):
            st[_R * LANES + b] = st[(_R + 4) * LANES + b] = st[(_R + 8) * LANES + b] = 1.0
            for k in range(3):
                st[(_A + k) * LANES + b] = -grav[k]
        for blk in range(c * per, min(nblocks, (c + 1) * per)):
            s0 = blk * LANES
            m = min(LANES, N - s0)
            _block_forward(jtype, Rpl, ppl, pax, axis, Q, QD, QDD, s0, m, io, st)
            _block_columns(jtype, n, st, cb)
            _block_write(QD, QDD, s0, m, cb, flat, stream)
        if stream:
            _store_fence()


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


@njit(cache=True)
def _rnea_chunk(jtype, Rpl, ppl, axis, grav, P, Q, QD, QDD, drive, out, first, last):
    """rnea of samples first..last-1, with its own scratch arrays."""
    n = Q.shape[1]
    R0, o, u, w, wd, a, Rq, Ms = _scratch(n)
    F = np.empty((n, 3))
    Nm = np.empty((n, 3))
    for s in range(first, last):
        forward_pass(jtype, Rpl, ppl, axis, grav, Q[s], QD[s], QDD[s], R0, o, u, w, wd, a, Rq, Ms)
        _rnea_one(jtype, R0, o, u, w, wd, a, P, QD[s], QDD[s], drive, out[s], F, Nm)


@njit(cache=True, parallel=True)
def rnea(jtype, Rpl, ppl, axis, grav, P, Q, QD, QDD, drive, out):
    """Inverse dynamics into out (N, n). drive=True adds Ia qdd + fc sign(qd) + fv qd + offset.

    Each chunk is a call to _rnea_chunk, not inlined into the parallel loop: the same speed, and about 60 %
    of the compile time (the parallel pass over the inlined forward and backward passes was the rest)."""
    N, n = Q.shape
    nchunks = (N + CHUNK - 1) // CHUNK
    for c in prange(nchunks):
        _rnea_chunk(jtype, Rpl, ppl, axis, grav, P, Q, QD, QDD, drive, out, c * CHUNK, min(N, (c + 1) * CHUNK))


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


@njit(cache=True, nogil=True)
def wrench_torques(jtype, Rpl, ppl, axis, Q, link, point, wrench, out):
    """Joint torques tau = J(q)^T w (N, n) into out of a wrench w = [force; moment] (6,) (N, N m, base axes)
    acting at `point` (3,) (m, in the frame of link `link`, 0-based: the link joint `link` moves). J is the
    geometric Jacobian of that point, rows [v; w]; joints beyond `link` feel nothing."""
    N, n = Q.shape
    R0, o, u, w, wd, a, Rq, Ms = _scratch(n)
    z = np.zeros(n)
    zero = np.zeros(3)
    f0, f1, f2, m0, m1, m2 = wrench[0], wrench[1], wrench[2], wrench[3], wrench[4], wrench[5]
    for s in range(N):
        forward_pass(jtype, Rpl, ppl, axis, zero, Q[s], z, z, R0, o, u, w, wd, a, Rq, Ms)
        R = R0[link]
        p0 = o[link, 0] + R[0, 0] * point[0] + R[0, 1] * point[1] + R[0, 2] * point[2]
        p1 = o[link, 1] + R[1, 0] * point[0] + R[1, 1] * point[1] + R[1, 2] * point[2]
        p2 = o[link, 2] + R[2, 0] * point[0] + R[2, 1] * point[1] + R[2, 2] * point[2]
        for i in range(n):
            if i > link:
                out[s, i] = 0.0
            elif jtype[i] == 0:
                # u . ((p - o_i) x f + m)
                c0, c1, c2 = _cross(p0 - o[i, 0], p1 - o[i, 1], p2 - o[i, 2], f0, f1, f2)
                out[s, i] = u[i, 0] * (c0 + m0) + u[i, 1] * (c1 + m1) + u[i, 2] * (c2 + m2)
            else:
                out[s, i] = u[i, 0] * f0 + u[i, 1] * f1 + u[i, 2] * f2
