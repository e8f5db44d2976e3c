"""A host that is late, in process: the free-running serial board's drives (sim.drive_targets.DeviceTargets with
the setpoint buffer of a free-running device) along a target stream of one target per cycle, except that the host
sends nothing for a while and then every target it owes at once, as a host that was not scheduled does.

The drives absorb a late host for their setpoint buffer (FREE_RUNNING_DEPTH cycles) plus their extrapolation
(DriveConfig.extrapolated_targets cycles): `drive_slack`. A host later than that leaves them holding a stale
target in mid-motion; the targets that then arrive together move the arm back and forth within a few tens of
milliseconds. The recording marks the samples whose targets came that late (Recording.late) exactly as the driver
marks them in the stream (the LATE flag: every sample of a catch-up burst longer than the slack), so that
identification can leave them out (ident.fit.preprocess.cut_windows).
"""
from __future__ import annotations

import numpy as np

from firmware_bridge import cia402
from firmware_bridge.cia402 import Mode
from ident.fit.preprocess import Recording
from sim.drive_targets import FREE_RUNNING_DEPTH, DeviceTargets, setpoints_for_device
from sim.plant import NoiseConfig
from sim.simulator import Simulator, effort_delay


def drive_slack(sim: Simulator) -> int:
    """Cycles a host may be late before free-running drives hold a stale target: setpoint buffer + extrapolation."""
    return FREE_RUNNING_DEPTH + int(sim.drives.config.extrapolated_targets)


def late_host_recording(model, q_ref: np.ndarray, *, rate_hz: float = 1000.0, stall_at: int = 0, stall: int = 0,
                        current_std: float = 0.0, seed: int = 1, mark: bool = True) -> Recording:
    """The recording (positions, joint torques in N m, effort_delay set) of the drives following q_ref (K, n), one
    target per cycle at rate_hz, with a host that sends nothing for `stall` cycles from cycle `stall_at` and then
    every target it owes at once. When mark and the stall is longer than drive_slack, the samples of the
    stalled cycles and the one that ends it are marked late (Recording.late), as the driver flags them."""
    q_ref = np.asarray(q_ref, dtype=float)
    if q_ref.ndim != 2 or q_ref.shape[1] != model.n:
        raise ValueError(f"q_ref: expected (K, {model.n}) targets, got shape {q_ref.shape}")
    if stall < 0 or not 0 <= stall_at <= len(q_ref):
        raise ValueError(f"stall: expected cycles >= 0 starting inside the {len(q_ref)} targets, got {stall} at "
                         f"{stall_at}")
    sim = Simulator(model, noise=NoiseConfig(current_std=current_std), seed=seed, q0=q_ref[0], rate_hz=rate_hz)
    n, zero, csp = model.n, np.zeros(model.n), np.full(model.n, int(Mode.CSP))
    device = DeviceTargets(sim, setpoints_for_device(None, False, "late host"))
    for cw in (cia402.CW_SHUTDOWN,) + (cia402.CW_ENABLE_OPERATION,) * 5:
        device.arrived(np.full(n, cw), csp, q_ref[0], zero, zero)
        sim.step(1)
        device.after_cycle()
    stop = stall_at + stall
    q, tau, owed = np.empty(q_ref.shape), np.empty(q_ref.shape), []
    enable = np.full(n, cia402.CW_ENABLE_OPERATION)
    for k in range(len(q_ref)):
        owed.append(k)
        if not stall_at <= k < stop:
            for m in owed:
                device.arrived(enable, csp, q_ref[m], zero, zero)
            owed = []
        s = sim.step(1)
        q[k], tau[k] = s.position, s.torque
        device.after_cycle()
    late = np.zeros(len(q_ref), dtype=bool)
    if mark and stall > drive_slack(sim):
        late[stall_at:min(stop + 1, len(q_ref))] = True
    return Recording(np.arange(len(q_ref)) / rate_hz, q, tau, None, None,
                     f"late host ({stall / rate_hz * 1e3:g} ms)", effort_delay(rate_hz), late=late)
