"""Helpers shared by the simulator tests: a Pinocchio twin of a Model (the independent oracle for energies),
the CiA 402 power-up sequence, and a smooth Fourier trajectory written out by hand."""
from __future__ import annotations

import numpy as np
import pinocchio as pin

from firmware_bridge import cia402
from ident.model import Model

# our [XX XY XZ YY YZ ZZ mX mY mZ m] -> pinocchio's dynamic parameters [m mX mY mZ XX XY YY XZ YZ ZZ]
PIN_FROM_OURS = [9, 6, 7, 8, 0, 1, 3, 2, 4, 5]


def pinocchio_twin(model: Model, inertial: np.ndarray | None = None) -> tuple[pin.Model, pin.Data]:
    """The same chain built joint by joint in Pinocchio (no rotor inertia, no friction)."""
    inertial = model.inertial if inertial is None else inertial
    pm = pin.Model()
    parent = 0
    for j in range(model.n):
        axis = model.axis[j]
        jm = pin.JointModelRevoluteUnaligned(axis) if model.joint_type[j] == 0 else pin.JointModelPrismaticUnaligned(axis)
        parent = pm.addJoint(parent, jm, pin.SE3(model.placement_R[j], model.placement_p[j]), model.joint_names[j])
        pm.appendBodyToJoint(parent, pin.Inertia.FromDynamicParameters(inertial[j][PIN_FROM_OURS]), pin.SE3.Identity())
    pm.gravity = pin.Motion(np.r_[model.gravity, 0.0, 0.0, 0.0])
    return pm, pm.createData()


def total_energy(model: Model, twin, q, qd) -> float:
    """Kinetic (links by Pinocchio, rotors 0.5 Ia qd^2) plus potential energy (Pinocchio), J."""
    pm, pd = twin
    rotor = 0.5 * float(np.sum(model.drive[:, 0] * qd ** 2))
    return pin.computeKineticEnergy(pm, pd, q, qd) + rotor + pin.computePotentialEnergy(pm, pd, q)


def enable(sim, mode, joints=None) -> None:
    """Shutdown, then enable operation (3 + 4) in `mode`, holding the current position."""
    pos = sim.read_state().position
    sim.set_commands(mode=np.full(sim.n, int(mode)), target_position=pos, target_torque=np.zeros(sim.n),
                     controlword=np.full(sim.n, cia402.CW_SHUTDOWN))
    sim.step(1)
    sim.set_commands(controlword=np.full(sim.n, cia402.CW_ENABLE_OPERATION))
    sim.step(1)


def fourier_at_rest(rng: np.random.Generator, n: int, harmonics: int, amplitude: float) -> tuple[np.ndarray, np.ndarray]:
    """Random coefficients a, b (n, harmonics) of a trajectory that starts at rest: sum a_l = 0 (qd(0) = 0)
    and sum l b_l = 0 (qdd(0) = 0)."""
    a, b = rng.uniform(-amplitude, amplitude, (2, n, harmonics))
    a[:, -1] = -a[:, :-1].sum(axis=1)
    b[:, -1] = -(b[:, :-1] * np.arange(1, harmonics)).sum(axis=1) / harmonics
    return a, b


def fourier(q0: np.ndarray, a: np.ndarray, b: np.ndarray, wf: float, t: float):
    """q, qd, qdd at time t of q0 + sum_l a_l/(wf l) sin(wf l t) - b_l/(wf l) (cos(wf l t) - 1)
    (starts at q0 with qd(0) = sum a_l)."""
    q, qd, qdd = q0.copy(), np.zeros_like(q0), np.zeros_like(q0)
    for i in range(a.shape[1]):
        w = wf * (i + 1)
        s, c = np.sin(w * t), np.cos(w * t)
        q += a[:, i] / w * s - b[:, i] / w * (c - 1.0)
        qd += a[:, i] * c + b[:, i] * s
        qdd += -a[:, i] * w * s + b[:, i] * w * c
    return q, qd, qdd


def noise_free_seed000(model, rate: float, seconds: float, name: str = "sim"):
    """seed000's excitation run by the simulator in CSP at `rate` with perfect sensors, after sim.recording's
    lead-in (not recorded): a Recording of `seconds` (positions, joint torques, the simulator's effort delay)."""
    from ident.fit import excitation
    from ident.fit.preprocess import Recording
    from sim import Simulator
    from sim.plant import NoiseConfig
    from sim.recording import LEAD_IN, reference
    from sim.simulator import effort_delay

    traj = excitation.preset("seed000")
    lead = int(round(LEAD_IN * rate))
    q_ref = reference(traj, (np.arange(-lead, int(round(seconds * rate))) + 1) / rate)
    sim = Simulator(model, noise=NoiseConfig.off(), seed=0, q0=q_ref[0], rate_hz=rate)
    enable(sim, cia402.Mode.CSP)
    q, tau = [], []
    for k, target in enumerate(q_ref):
        sim.set_commands(target_position=target)
        s = sim.step(1)
        if k >= lead:
            q.append(s.position.copy())
            tau.append(s.torque.copy())
    return Recording(np.arange(len(q)) / rate, np.array(q), np.array(tau), None, None, name, effort_delay(rate))
