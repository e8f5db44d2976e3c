"""Record an excitation on the simulated arm, as a driver would log it (used by `armid demo`, the payload
tests and benchmarks).

    rec = simulate(model, traj, seconds, currents=True, payload=(1.5, (0, 0, 0.06), (0.01, 0, 0, 0.01, 0, 0.001)))

sim.Simulator runs synchronously (fast mode, 1 kHz): its CiA 402 drives follow the trajectory in CSP, its
encoders quantise the positions and its current sensors add noise. The recorded effort is the drives'
torque reading (current times the drive gain, N m) or the motor currents (A). A smooth lead-in of LEAD_IN
seconds brings the arm from rest at the trajectory's mean pose into the periodic motion; only t >= 0 is
recorded.
"""
from __future__ import annotations

import sys

import numpy as np

LEAD_IN = 2.0                  # s of smooth ramp from rest into the periodic motion (not recorded)
DEFAULT_CURRENT_NOISE = 0.01   # A, standard deviation of the simulated current sensors
RATE_HZ = 1000.0


def reference(traj, t: np.ndarray, *, end: float | None = None) -> np.ndarray:
    """Position set-points (N, n) rad at times t (s): the trajectory for t >= 0, and for -LEAD_IN <= t < 0 a
    smooth blend from rest at its mean pose q0 into the motion (velocity and acceleration continuous).
    With end (s): for end < t <= end + LEAD_IN the same blend back to rest at q0 (FourierTrajectory.blended)."""
    return traj.blended(t, lead=LEAD_IN, end=end)[0]


def simulate(model, traj, seconds: float, *, seed: int = 0, current_noise: float = DEFAULT_CURRENT_NOISE,
             currents: bool = False, payload: tuple | None = None, noise=None, progress: bool = False,
             rate_hz: float = RATE_HZ, target_times=None):
    """Run the excitation `traj` for `seconds` on sim.Simulator (CSP, rate_hz, default 1 kHz) and return the
    Recording of t >= 0: t (s), q (rad, encoder), and tau (N m, the drives' torque reading) or, with currents, the
    motor currents (A), with the simulator's effort delay (half a period). payload: (mass kg, com (3,) m flange
    frame, inertia [XX XY XZ YY YZ ZZ] kg m^2 about the centre of mass) fixed to the flange, or None. noise: a
    sim.NoiseConfig (default: the simulator's encoders with current noise `current_noise` A). target_times: a
    function of the cycles' times (s, from -LEAD_IN) giving the time whose set-point each cycle latches (a host on
    its own clock: a set-point held or skipped; default each cycle's own). Raises RuntimeError if the drives do
    not enable or one of them faults."""
    from firmware_bridge import cia402
    from firmware_bridge.cia402 import Mode, State
    from ident.fit.preprocess import Recording
    from sim import NoiseConfig, Simulator
    from sim.simulator import effort_delay

    n = model.n
    lead = int(round(LEAD_IN * rate_hz))
    count = int(round(seconds * rate_hz))
    t_all = (np.arange(-lead, count) + 1) / rate_hz                 # the set-point for the sample at the cycle's end
    q_ref = reference(traj, t_all if target_times is None else np.clip(target_times(t_all), t_all[0], None))
    noise = NoiseConfig(current_std=current_noise) if noise is None else noise
    sim = Simulator(model, noise=noise, seed=seed, q0=q_ref[0], rate_hz=rate_hz)
    if payload is not None:
        sim.attach_payload(*payload)
    sim.set_commands(mode=np.full(n, int(Mode.CSP)), target_position=q_ref[0],
                     controlword=np.full(n, cia402.CW_SHUTDOWN))
    sim.step(1)
    sim.set_commands(controlword=np.full(n, cia402.CW_ENABLE_OPERATION))
    sim.step(2)
    if any(s != State.OPERATION_ENABLED for s in sim.read_state().states()):
        raise RuntimeError(f"drives did not enable: {sim.read_state().states()}")
    t = np.empty(count)
    q = np.empty((count, n))
    y = np.empty((count, n))
    bar = _bar(len(t_all), progress, f"simulate {rate_hz:g} Hz")
    for k in range(len(t_all)):
        sim.set_commands(target_position=q_ref[k])
        s = sim.step(1)
        if k >= lead:
            i = k - lead
            t[i], q[i], y[i] = i / rate_hz, s.position, (s.current if currents else s.torque)
        if k % 1000 == 999:
            bar.update(1000)
            if np.any(s.error_code):
                j = int(np.flatnonzero(s.error_code)[0])
                raise RuntimeError(f"joint {j + 1}: drive fault 0x{int(s.error_code[j]):04X} at t = {t_all[k]:.3f} s")
    bar.close()
    delay = effort_delay(rate_hz)
    if currents:
        return Recording(t, q, None, y, None, "simulated run", delay)
    return Recording(t, q, y, None, None, "simulated run", delay)


def _bar(total: int, enabled: bool, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=f"  {desc}", disable=not enabled, unit="cycle", unit_scale=True, leave=False,
                file=sys.stderr)
