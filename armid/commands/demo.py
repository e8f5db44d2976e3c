"""`armid demo`: simulate an excitation on the generic6 arm, record it, identify it, write the report, and
print the identified base parameters beside the true ones.

The recording is made by the real simulator (sim.Simulator, synchronous fast mode, 1 kHz): its CiA 402
drives follow the trajectory in CSP, its encoders quantise the positions and its current sensors add
noise; the recorded joint torque is the drives' torque reading (current times the drive gain), as a
driver would log it. A later issue routes the same demo through the transports and the driver.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

DEFAULT_CURRENT_NOISE = 0.01   # A, standard deviation of the simulated current sensors
PAYLOAD_MASS = 2.0             # kg, the known payload of the --currents demo's second run
PAYLOAD_COM = (0.0, 0.02, 0.05)                       # m, flange frame (not told to the identification)
PAYLOAD_INERTIA = (0.004, 0.0, 0.0, 0.004, 0.0, 0.003)   # kg m^2 about the centre of mass


def register(sub) -> None:
    p = sub.add_parser("demo", help="simulate, record and identify the generic6 arm; print identified vs true")
    p.add_argument("-o", "--out", default="armid-demo", metavar="DIR", help="output directory (default: armid-demo)")
    p.add_argument("--trajectory", default="seed000", metavar="T",
                   help="excitation: a trajectory file (armid excite design) or a preset (default: seed000)")
    p.add_argument("--periods", type=float, default=1.0, help="periods of the excitation to record (default 1)")
    p.add_argument("--current-noise", type=float, default=DEFAULT_CURRENT_NOISE,
                   help=f"current sensor noise, A (default {DEFAULT_CURRENT_NOISE})")
    p.add_argument("--seed", type=int, default=0, help="random seed of the sensors")
    p.add_argument("--currents", action="store_true",
                   help=f"record motor currents instead of torques, add a run with a {PAYLOAD_MASS:g} kg payload and "
                        "identify the drive gains too")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(run=run)


# ---------------------------------------------------------------------------------------------------
# the simulated recording (sim.recording, imported when needed: it loads the simulator)

def reference(traj, t: np.ndarray) -> np.ndarray:
    """sim.recording.reference: the set-points (N, n) rad at t (s), with the smooth lead-in from rest."""
    from sim import recording

    return recording.reference(traj, t)


def simulate(model, traj, seconds: float, *, seed: int = 0, current_noise: float = DEFAULT_CURRENT_NOISE,
             currents: bool = False, payload_mass: float | None = None, progress: bool = False):
    """sim.recording.simulate with the demo's payload: payload_mass (kg) fixed to the flange with its centre
    of mass at PAYLOAD_COM and inertia PAYLOAD_INERTIA, or None."""
    from sim import recording

    payload = None if payload_mass is None else (payload_mass, PAYLOAD_COM, PAYLOAD_INERTIA)
    return recording.simulate(model, traj, seconds, seed=seed, current_noise=current_noise, currents=currents,
                              payload=payload, progress=progress)


def time_reversed(traj):
    """The same motion played backwards, q(-t): a -> -a, b -> b. Same positions, speeds and accelerations
    in magnitude (so the same kinematic limits), different torques: the validation run."""
    from ident.excitation import FourierTrajectory

    return FourierTrajectory(traj.base_frequency, traj.q0.copy(), -traj.a, traj.b.copy(), traj.joint_names,
                             {"made_from": "time-reversed excitation"})


def run(args: argparse.Namespace) -> int:
    from armid.commands.identify import load_trajectory, print_summary, write_outputs
    from ident import batch
    from ident.errors import InputError
    from ident.model import load_model

    class StepFailed(InputError):
        """One step of the demo failed (the message names it)."""

    if not (args.periods > 0 and np.isfinite(args.periods)):
        raise InputError(f"--periods: expected a positive number, got {args.periods}")
    if not (args.current_noise >= 0 and np.isfinite(args.current_noise)):
        raise InputError(f"--current-noise: expected a number >= 0 A, got {args.current_noise}")
    verbose = not args.quiet
    out = Path(args.out)
    total = 6 if args.currents else 5
    started = time.perf_counter()
    counter = iter(range(1, total + 1))

    def step(name: str, fn):
        k = next(counter)
        if verbose:
            print(f"[{k}/{total}] {name}", file=sys.stderr, flush=True)
        try:
            return fn()
        except (InputError, RuntimeError, ValueError, ArithmeticError, OSError) as exc:
            raise StepFailed(f"demo step {k} ({name}) failed: {exc}") from exc

    model = load_model("generic6")
    traj = step("check the excitation against the limits", lambda: _checked(model, load_trajectory(args.trajectory)))
    seconds = args.periods * traj.period
    what = "motor currents" if args.currents else "drive torques"
    sim = dict(current_noise=args.current_noise, currents=args.currents, progress=verbose)
    runs = {"excitation": step(f"simulate the excitation ({seconds:g} s at 1 kHz, CSP, encoder quantisation, "
                               f"current noise {args.current_noise:g} A; recording {what})",
                               lambda: simulate(model, traj, seconds, seed=args.seed, **sim)),
            "validation": step("simulate the validation run (the excitation time-reversed)",
                               lambda: simulate(model, time_reversed(traj), seconds, seed=args.seed + 1, **sim))}
    if args.currents:
        runs["payload"] = step(f"simulate the excitation with a {PAYLOAD_MASS:g} kg payload (its mass fixes the "
                               "scale of the drive gains)",
                               lambda: simulate(model, traj, seconds, seed=args.seed + 2, payload_mass=PAYLOAD_MASS,
                                                **sim))

    def identify():
        out.mkdir(parents=True, exist_ok=True)
        paths = {name: out / f"{name}.npz" for name in runs}
        for name, r in runs.items():
            np.savez(paths[name], t=r.t, q=r.q, **({"current": r.current} if args.currents else {"tau": r.tau}))
        payload = dict(payload_run=paths["payload"], payload_mass=PAYLOAD_MASS) if args.currents else {}
        return batch.identify(model, paths["excitation"], validate=paths["validation"], trajectory=traj,
                              consistent=True, verbose=verbose, **payload)

    ident = step("identify (filter, regressor, parallel decimation, WLS, physically consistent fit"
                 + (", drive gains" if args.currents else "") + ")", identify)
    written = step("write result.json, model.toml and the report",
                   lambda: write_outputs(ident, out, str(out / "excitation.npz")))
    truth = ident.base.from_standard(model.standard_parameters())
    print(f"armid demo: {model.name}, excitation {args.trajectory} ({seconds:g} s of {what} recorded at 1 kHz), "
          f"validation on the time-reversed motion")
    print_summary(ident, truth)
    within = np.abs(ident.fit.beta - truth) <= 3 * ident.fit.std
    print(f"{int(within.sum())} of {len(truth)} base parameters within 3 sigma of the truth")
    if args.currents:
        true_gains = model.joint_torque_per_amp()
        print("drive gains (N m/A): identified " + " ".join(f"{g:.4f}" for g in ident.gains)
              + "; true " + " ".join(f"{g:.4f}" for g in true_gains)
              + "; error " + " ".join(f"{100 * (g / g0 - 1):+.2f}%" for g, g0 in zip(ident.gains, true_gains)))
    for name, path in written.items():
        print(f"{name}: {path}")
    print(f"done in {time.perf_counter() - started:.1f} s; open {written['report']}")
    return 0


def _checked(model, traj):
    from ident import excitation

    excitation.check(model, traj)
    excitation.check(model, time_reversed(traj))
    return traj
