"""The control law of the simulated drives, all joints in one numba call per cycle (SI, joint side).

Per joint, the drive runs one of four laws (the state machine in sim.drive picks it):
  OFF   no torque (drive disabled, brake on).
  CST   tau = target torque + torque offset, saturated at the torque limit. Leaving the software position limits
        is a fault.
  CSP   cascaded position / velocity loop with feed-forward:
          ref  = target position clamped to the software limits, approached no faster than QSD can stop
          vff  = (ref_k - ref_k-1) / dt,  aff = (vff_k - vff_k-1) / dt   (clamped to qd_max, qdd_max)
          ev   = vff + KP (ref - p) - v
          tau  = J (KA aff + KV ev) + I + fc tanh(vff / VS) + fv vff + torque offset + target torque
          I'   = J KV KI ev   (PI velocity loop; the integrator is frozen while the torque saturates)
        KV is the velocity-loop bandwidth (rad/s) for a joint of inertia J, KI the PI corner (rad/s), KP the
        position gain (1/s), KA 1 or 0: the drive's own acceleration feed-forward on or off (off when the host
        sends the model's torque, which holds the inertia's share). Where a bus cycle spans several loop ticks, ref, vff and aff come from the
        interpolant of the cycles' targets (interpolant, tick_references: vff, aff its mean velocity and
        acceleration over each tick), the differences above only where a limit clamps the reference. The torque
        offset (CiA 402 0x60B2) is where a host with a model sends its inverse dynamics; the target torque
        (0x2002) still adds in CSP, as the torque feed-forward field of hosts older than the offset.
  RAMP  quick stop / hold: a velocity reference ramps from the current velocity to zero at the quick-stop
        deceleration QSD, its integral is the position reference, and the CSP cascade follows it.
The velocity the drive uses (and reports) is the backward difference of the measured positions.
A following error |ref - p| above the window for longer than the timeout raises the FOLLOWING flag.
"""
from __future__ import annotations


import numpy as np
from numba import njit

from firmware_bridge.cia402 import CW_FAULT_RESET, SW_FOLLOWING_ERROR, SW_INTERNAL_LIMIT, SW_TARGET_REACHED

OFF, CSP, CST, RAMP = 0, 1, 2, 3

# parameter table columns (n, NPARAM)
KP, KV, KI, J, FC, FV, VS, QLO, QHI, TMAX, VMAX, AMAX, FEW, FET, QSD, VSTOP, KA = range(17)
NPARAM = 17
# state table columns (n, NSTATE)
PREV_REF, PREV_VFF, INTEG, RAMP_P, RAMP_V, FE_TIME, P_PREV, KIND_PREV, STILL_TIME, LAST_TAU = range(10)
NSTATE = 10

# flags per joint
F_FOLLOWING = 1       # following error beyond window for longer than the timeout
F_LIMIT_ACTIVE = 2    # a target, feed-forward or torque was clamped at a limit this cycle
F_STOPPED = 4         # RAMP: the joint is at rest
F_LIMIT_FAULT = 8     # CST: the joint left its software position limits
F_FE_WARNING = 16     # following error beyond the window (not yet for the timeout)

STILL_SECONDS = 0.01  # RAMP: at rest for this long counts as stopped


@njit(cache=True, nogil=True, inline="always")
def _clamp(x, lo, hi):
    return lo if x < lo else (hi if x > hi else x)


@njit(cache=True, nogil=True)
def control(kind, target_pos, target_tau, offset, p, dt, prm, st, tau, ferr, vel, flags, vff_in, aff_in, ff_given):
    """One control cycle for every joint: torque (N m), following error (rad), velocity (rad/s), flags.
    offset (n,) N m: the torque offset, added in CSP and CST (not while ramping to a stop).
    ff_given: the CSP velocity and acceleration feed-forward are vff_in (rad/s), aff_in (rad/s^2) (the
    interpolant's, see interpolate) wherever no limit clamps the reference; otherwise backward differences
    of the references."""
    for j in range(p.shape[0]):
        v = (p[j] - st[j, P_PREV]) / dt
        st[j, P_PREV] = p[j]
        vel[j] = v
        k = kind[j]
        fl = 0
        if k != st[j, KIND_PREV]:
            prev = st[j, KIND_PREV]
            if k == RAMP and prev == CSP:  # continue from the reference the joint was following
                st[j, RAMP_P] = st[j, PREV_REF]
                st[j, RAMP_V] = st[j, PREV_VFF]
            else:
                st[j, PREV_REF] = p[j]
                st[j, PREV_VFF] = 0.0
                st[j, RAMP_P] = p[j]
                st[j, RAMP_V] = _clamp(v, -prm[j, VMAX], prm[j, VMAX])
            st[j, FE_TIME] = 0.0
            st[j, STILL_TIME] = 0.0
            if prev == OFF:
                st[j, INTEG] = 0.0
            elif prev == CST:
                st[j, INTEG] = st[j, LAST_TAU]  # bumpless: the position loop starts from the held torque
            st[j, KIND_PREV] = k
        t = 0.0
        e = 0.0
        if k == OFF:
            st[j, INTEG] = 0.0
        elif k == CST:
            t = target_tau[j] + offset[j]
            if p[j] < prm[j, QLO] or p[j] > prm[j, QHI]:
                fl |= F_LIMIT_FAULT
        else:
            if k == CSP:
                ref = target_pos[j]
                given = ff_given
                if ref < prm[j, QLO] or ref > prm[j, QHI]:
                    ref = _clamp(ref, prm[j, QLO], prm[j, QHI])
                    fl |= F_LIMIT_ACTIVE
                    given = False
                prev = st[j, PREV_REF]
                vff = vff_in[j] if given else (ref - prev) / dt
                # approach a software limit no faster than the quick-stop deceleration can stop at it
                v_hi = np.sqrt(2.0 * prm[j, QSD] * max(prm[j, QHI] - prev, 0.0))
                v_lo = -np.sqrt(2.0 * prm[j, QSD] * max(prev - prm[j, QLO], 0.0))
                if vff > v_hi or vff < v_lo:
                    vff = _clamp(vff, v_lo, v_hi)
                    ref = prev + vff * dt
                    fl |= F_LIMIT_ACTIVE
                    given = False
                if abs(vff) > prm[j, VMAX]:
                    vff = _clamp(vff, -prm[j, VMAX], prm[j, VMAX])
                    fl |= F_LIMIT_ACTIVE
                    given = False
                aff = aff_in[j] if given else (vff - st[j, PREV_VFF]) / dt
                if abs(aff) > prm[j, AMAX]:
                    aff = _clamp(aff, -prm[j, AMAX], prm[j, AMAX])
                    fl |= F_LIMIT_ACTIVE
                tff = target_tau[j] + offset[j]
                aff *= prm[j, KA]
            else:
                rv = st[j, RAMP_V]
                dv = prm[j, QSD] * dt
                if rv > dv:
                    aff = -prm[j, QSD]
                    rv -= dv
                elif rv < -dv:
                    aff = prm[j, QSD]
                    rv += dv
                else:
                    aff = -rv / dt
                    rv = 0.0
                ref = _clamp(st[j, RAMP_P] + rv * dt, prm[j, QLO], prm[j, QHI])
                st[j, RAMP_P] = ref
                st[j, RAMP_V] = rv
                vff = rv
                tff = 0.0
                if rv == 0.0 and abs(v) < prm[j, VSTOP]:
                    st[j, STILL_TIME] += dt
                    if st[j, STILL_TIME] >= STILL_SECONDS:
                        fl |= F_STOPPED
                else:
                    st[j, STILL_TIME] = 0.0
            st[j, PREV_REF] = ref
            st[j, PREV_VFF] = vff
            e = ref - p[j]
            ev = vff + prm[j, KP] * e - v
            d_integ = prm[j, J] * prm[j, KV] * prm[j, KI] * ev * dt
            t = (prm[j, J] * (aff + prm[j, KV] * ev) + st[j, INTEG] + d_integ
                 + prm[j, FC] * np.tanh(vff / prm[j, VS]) + prm[j, FV] * vff + tff)
            if abs(t) <= prm[j, TMAX]:
                st[j, INTEG] += d_integ
            if abs(e) > prm[j, FEW]:
                fl |= F_FE_WARNING
                st[j, FE_TIME] += dt
                if st[j, FE_TIME] > prm[j, FET]:
                    fl |= F_FOLLOWING
            else:
                st[j, FE_TIME] = 0.0
        if abs(t) > prm[j, TMAX]:
            t = _clamp(t, -prm[j, TMAX], prm[j, TMAX])
            fl |= F_LIMIT_ACTIVE
        tau[j] = t
        st[j, LAST_TAU] = t
        ferr[j] = e
        flags[j] = fl


@njit(cache=True, nogil=True)
def status_words(code, flags, fe_fault, base, powered_table, qs_code, out):
    """Statuswords (n,) from the state codes: base[code] (state bits, remote, quick-stop bit), plus
    internal limit, following error and, in QUICK STOP ACTIVE at rest, target reached."""
    for j in range(code.shape[0]):
        c = code[j]
        w = base[c]
        f = flags[j] if powered_table[c] else 0
        if f & F_LIMIT_ACTIVE:
            w |= SW_INTERNAL_LIMIT
        if f & F_FE_WARNING or fe_fault[j]:
            w |= SW_FOLLOWING_ERROR
        if c == qs_code and f & F_STOPPED:
            w |= SW_TARGET_REACHED
        out[j] = w


@njit(cache=True, nogil=True)
def commands_pending(controlword, mode, cw_seen, mode_display, dirty, reset_bit, todo, edge):
    """Which drives' state machines must run this cycle: controlword or mode changed, a state changed, or
    the fault-reset bit rose (edge). Updates reset_bit; returns whether any drive needs attention."""
    anything = False
    for j in range(controlword.shape[0]):
        r = (controlword[j] & CW_FAULT_RESET) != 0
        edge[j] = r and not reset_bit[j]
        reset_bit[j] = r
        todo[j] = controlword[j] != cw_seen[j] or dirty[j] or edge[j]
        if todo[j] or mode[j] != mode_display[j]:
            anything = True
    return anything



# -- CSP interpolation between bus-cycle targets (a cycle of several loop ticks, sim.simulator) ---------------
TARGETS_KEPT = 5        # the targets the interpolation keeps per joint, oldest first: p[k-4] .. p[k]
EXACT_DEGREE = 3        # target sequences sampled from a polynomial of at most this degree are reproduced exactly


@njit(cache=True, nogil=True, inline="always")
def _knot(pm2, pm1, pm, pp1, T):
    """Velocity (rad/s) and acceleration (rad/s^2) at the target pm of the cubic through pm2, pm1, pm, pp1
    (consecutive targets T s apart)."""
    return (2.0 * pp1 + 3.0 * pm - 6.0 * pm1 + pm2) / (6.0 * T), (pp1 - 2.0 * pm + pm1) / (T * T)


@njit(cache=True, nogil=True, inline="always")
def _segment(p, j, T):
    """Coefficients c0..c5 (rad) of joint j's quintic x(s) = sum c_i s^i, s in [0, 1] over one cycle, from
    p[j, 2] to p[j, 3] with the knots' velocities and accelerations of _knot (quintic Hermite)."""
    v0, a0 = _knot(p[j, 0], p[j, 1], p[j, 2], p[j, 3], T)
    v1, a1 = _knot(p[j, 1], p[j, 2], p[j, 3], p[j, 4], T)
    d = p[j, 3] - p[j, 2]
    m0, m1 = v0 * T, v1 * T
    b0, b1 = a0 * T * T, a1 * T * T
    return (p[j, 2], m0, 0.5 * b0, 10.0 * d - 6.0 * m0 - 4.0 * m1 - 1.5 * b0 + 0.5 * b1,
            -15.0 * d + 8.0 * m0 + 7.0 * m1 + 1.5 * b0 - b1, 6.0 * d - 3.0 * m0 - 3.0 * m1 - 0.5 * b0 + 0.5 * b1)


@njit(cache=True, nogil=True, inline="always")
def _at(c, u, T):
    """Position (rad), velocity (rad/s) and acceleration (rad/s^2) of the segment c at the fraction u."""
    c0, c1, c2, c3, c4, c5 = c
    return (c0 + u * (c1 + u * (c2 + u * (c3 + u * (c4 + u * c5)))),
            (c1 + u * (2.0 * c2 + u * (3.0 * c3 + u * (4.0 * c4 + u * 5.0 * c5)))) / T,
            (2.0 * c2 + u * (6.0 * c3 + u * (12.0 * c4 + u * 20.0 * c5))) / (T * T))


@njit(cache=True, nogil=True)
def interpolant(targets, T, s, x, dx, ddx):
    """The CSP reference over one cycle of T s from the targets (n, TARGETS_KEPT) (rad, oldest first,
    p[k-4] .. p[k], T s apart): at the fractions s (m,) of the cycle, position x (m, n) rad, velocity dx
    rad/s, acceleration ddx rad/s^2. The cycle runs from p[k-2] (s = 0) to p[k-1] (s = 1), one cycle behind
    the newest target, which gives the velocity and acceleration at p[k-1]: at every target the derivatives
    of the cubic through it, the two before it and the one after it, joined by a quintic (C2, and exact for
    cubic target sequences)."""
    for j in range(targets.shape[0]):
        c = _segment(targets, j, T)
        for i in range(s.shape[0]):
            x[i, j], dx[i, j], ddx[i, j] = _at(c, s[i], T)


@njit(cache=True, nogil=True)
def tick_references(targets, T, ref, vff, aff):
    """The references of the k = ref.shape[0] loop ticks of one cycle (interpolant): ref (k, n) rad, the
    interpolant at the end of each tick; vff (k, n) rad/s and aff rad/s^2 its mean velocity and mean
    acceleration over the tick (the feed-forward that a torque held over the tick needs)."""
    k = ref.shape[0]
    h = T / k
    for j in range(targets.shape[0]):
        c = _segment(targets, j, T)
        x_prev, dx_prev, _ = _at(c, 0.0, T)
        for i in range(1, k + 1):
            x, dx, _ = _at(c, i / k, T)
            ref[i - 1, j] = x
            vff[i - 1, j] = (x - x_prev) / h
            aff[i - 1, j] = (dx - dx_prev) / h
            x_prev, dx_prev = x, dx


def extrapolate(stamps: list[int], values: list[float], at: int) -> float:
    """The polynomial through the points (stamps[i], values[i]) (distinct cycle numbers, 1..EXACT_DEGREE + 1
    of them, so of degree at most EXACT_DEGREE) at the cycle `at`: a drive's continuation of the targets it
    received at those cycles (Lagrange form). On consecutive cycles, at the next one, with four points: the
    cubic 4 p[k] - 6 p[k-1] + 4 p[k-2] - p[k-3], whose derivatives the interpolant takes at the newest target
    (so one lost target leaves the interpolated reference as it was)."""
    m = len(stamps)
    if not 1 <= m <= EXACT_DEGREE + 1 or len(values) != m:
        raise ValueError(f"extrapolate: expected 1..{EXACT_DEGREE + 1} stamps and as many values, got {m}, {len(values)}")
    x = float(at - stamps[-1])
    ts = [float(s - stamps[-1]) for s in stamps]
    total = 0.0
    for i in range(m):
        w = 1.0
        for k in range(m):
            if k != i:
                w *= (x - ts[k]) / (ts[i] - ts[k])
        total += w * values[i]
    return total
