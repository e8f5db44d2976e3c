"""The control law of the simulated drives, all joints in one numba call per cycle (SI, joint side).

Per joint, the drive runs one of four laws (the state machine in sim.drive picks it):
  OFF   no torque (drive disabled, brake on).
  CST   tau = target torque, saturated at the torque limit. Leaving the software position limits is a fault.
  CSP   cascaded position / velocity loop with feed-forward:
          ref  = target position clamped to the software limits, approached no faster than QSD can stop
          vff  = (ref_k - ref_k-1) / dt,  aff = (vff_k - vff_k-1) / dt   (clamped to qd_max, qdd_max)
          ev   = vff + KP (ref - p) - v
          tau  = J (aff + KV ev) + I + fc tanh(vff / VS) + fv vff + target torque (torque feed-forward)
          I'   = J KV KI ev   (PI velocity loop; the integrator is frozen while the torque saturates)
        KV is the velocity-loop bandwidth (rad/s) for a joint of inertia J, KI the PI corner (rad/s), KP the
        position gain (1/s). The target torque acts as the torque offset (CiA 402 0x60B2): a host with a
        model sends its inverse dynamics there.
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
KP, KV, KI, J, FC, FV, VS, QLO, QHI, TMAX, VMAX, AMAX, FEW, FET, QSD, VSTOP = range(16)
NPARAM = 16
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
def control(kind, target_pos, target_tau, p, dt, prm, st, tau, ferr, vel, flags):
    """One control cycle for every joint: torque (N m), following error (rad), velocity (rad/s), flags."""
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
            t = target_tau[j]
            if p[j] < prm[j, QLO] or p[j] > prm[j, QHI]:
                fl |= F_LIMIT_FAULT
        else:
            if k == CSP:
                ref = target_pos[j]
                if ref < prm[j, QLO] or ref > prm[j, QHI]:
                    ref = _clamp(ref, prm[j, QLO], prm[j, QHI])
                    fl |= F_LIMIT_ACTIVE
                prev = st[j, PREV_REF]
                vff = (ref - prev) / dt
                # approach a software limit no faster than the quick-stop deceleration can stop at it
                v_hi = np.sqrt(2.0 * prm[j, QSD] * max(prm[j, QHI] - prev, 0.0))
                v_lo = -np.sqrt(2.0 * prm[j, QSD] * max(prev - prm[j, QLO], 0.0))
                if vff > v_hi or vff < v_lo:
                    vff = _clamp(vff, v_lo, v_hi)
                    ref = prev + vff * dt
                    fl |= F_LIMIT_ACTIVE
                if abs(vff) > prm[j, VMAX]:
                    vff = _clamp(vff, -prm[j, VMAX], prm[j, VMAX])
                    fl |= F_LIMIT_ACTIVE
                aff = (vff - st[j, PREV_VFF]) / dt
                if abs(aff) > prm[j, AMAX]:
                    aff = _clamp(aff, -prm[j, AMAX], prm[j, AMAX])
                    fl |= F_LIMIT_ACTIVE
                tff = target_tau[j]
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
