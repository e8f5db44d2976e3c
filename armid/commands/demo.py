"""`armid demo`: the whole chain on a simulated arm (generic6, or `--model`), then identification, report and
the identified base parameters beside the true ones.

By default the parts run as separate processes on loopback (armid.chain): `armid sim` behind a transport
(serial over a pty; `--transport can` on python-can's udp_multicast, `--transport gateway` Modbus TCP),
`armid driver` connected to it, and `armid record` on the driver's ZeroMQ stream. The demo sends the
driver enable, move_to the start and two run_trajectory commands (the excitation blended in from rest
and out to rest, then the same motion time-reversed for validation), converts the recording's two
motions into identification data and identifies them with `armid identify` as a process of its own.
`--in-process` instead steps sim.Simulator in
this process (synchronous, 1 kHz; `simulate` below), which is what `--currents` needs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from ident.errors import InputError

LEAD_IN = 2.0              # s of smooth ramp from rest into the motion and out of it (sim.recording.LEAD_IN)
SAMPLE_RATE_HZ = 100.0     # Hz of the samples sent with run_trajectory (the driver splines them to its rate)
DEFAULT_CURRENT_NOISE = 0.01   # A, standard deviation of the simulated current sensors (--in-process)
PAYLOAD_MASS = 2.0             # kg, the known payload of the --currents demo's second run
PAYLOAD_COM = (0.0, 0.02, 0.05)                       # m, flange frame (not told to the identification)
PAYLOAD_INERTIA = (0.004, 0.0, 0.0, 0.004, 0.0, 0.003)   # kg m^2 about the centre of mass
TRANSPORTS = ("serial", "can", "gateway")
IDENTIFY_TIMEOUT_S = 300.0   # the demo's `armid identify` takes ~5 s; a loaded machine, a cold numba cache: more
MOVE_SPEED = 0.2          # move_to the start at this fraction of the fastest the limits allow


def register(sub) -> None:
    p = sub.add_parser("demo", help="the simulated arm, the driver and the recorder as processes; run an excitation, "
                                    "identify it; print identified vs true",
                       description="Start `armid sim`, `armid driver` and `armid record` on loopback, run the "
                                   "excitation through the driver's commands, identify the recording and print the "
                                   "identified base parameters beside the simulator's true ones.")
    p.add_argument("-o", "--output", "--out", dest="output", default="armid-demo", metavar="DIR",
                   help="output directory (default: armid-demo)")
    p.add_argument("--transport", default="serial", choices=TRANSPORTS,
                   help="how the driver reaches the simulator (default: serial over a pty)")
    p.add_argument("--rate", type=float, default=None, metavar="HZ",
                   help="the driver's cycle rate, and the simulator's (it steps once per driver cycle); default: "
                        "serial 1000, can 250, gateway 1000 Hz (docs/guides/demo.md)")
    p.add_argument("--clocking", default="lockstep", choices=("lockstep", "free"),
                   help="lockstep: the simulator steps once per driver cycle (default); free: it runs on its own "
                        "drifting, jittering clock, as real drives do (docs/guides/demo.md)")
    p.add_argument("--in-process", action="store_true",
                   help="no processes: step the simulator in this process (synchronous, 1 kHz)")
    p.add_argument("--model", default="generic6", metavar="MODEL",
                   help="the arm: a .toml or .urdf model file, or a shipped model (default: generic6); the simulator "
                        "runs it, the identification fits it and compares with it")
    p.add_argument("--trajectory", default="seed000", metavar="T",
                   help="excitation: a trajectory file (armid excite design) or a preset (default: seed000)")
    p.add_argument("--periods", type=float, default=1.0, help="periods of the excitation to record (default 1)")
    p.add_argument("--slowdown", type=float, default=None, metavar="K",
                   help="play the excitation K times slower (default 1, the designed speed; see docs/guides/demo.md)")
    p.add_argument("--current-noise", type=float, default=DEFAULT_CURRENT_NOISE,
                   help=f"--in-process: current sensor noise, A (default {DEFAULT_CURRENT_NOISE})")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the simulated sensors' noise (the simulator's --seed; --in-process: of its runs)")
    p.add_argument("--currents", action="store_true",
                   help=f"--in-process: record motor currents instead of torques, add a run with a {PAYLOAD_MASS:g} kg "
                        "payload and identify the drive gains too")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(run=run)


# ---------------------------------------------------------------------------------------------------
# the simulated recording (sim.recording, imported when needed: it loads the simulator)

def reference(traj, t: np.ndarray, *, end: float | None = None) -> np.ndarray:
    """sim.recording.reference: the set-points (N, n) rad at t (s), blended in from rest over LEAD_IN s and,
    with end (s), back out to rest after it."""
    from sim import recording

    return recording.reference(traj, t, end=end)


def simulate(model, traj, seconds: float, *, seed: int = 0, current_noise: float = DEFAULT_CURRENT_NOISE,
             currents: bool = False, payload_mass: float | None = None, progress: bool = False):
    """sim.recording.simulate with the demo's payload: payload_mass (kg) fixed to the flange with its centre
    of mass at PAYLOAD_COM and inertia PAYLOAD_INERTIA, or None."""
    from sim import recording

    payload = None if payload_mass is None else (payload_mass, PAYLOAD_COM, PAYLOAD_INERTIA)
    return recording.simulate(model, traj, seconds, seed=seed, current_noise=current_noise, currents=currents,
                              payload=payload, progress=progress)


def _bar(total: int, enabled: bool, desc: str, unit: str = "cycle"):
    from tqdm import tqdm

    return tqdm(total=total, desc=f"  {desc}", disable=not enabled, unit=unit, unit_scale=unit == "cycle",
                leave=False, file=sys.stderr)


def time_scaled(traj, factor: float):
    """The same path played `factor` times slower, q(t / factor): base frequency / factor and the Fourier
    coefficients / factor, so the positions are the same, speeds / factor, accelerations / factor^2."""
    from ident.fit.excitation import FourierTrajectory

    if factor == 1.0:
        return traj
    return FourierTrajectory(traj.base_frequency / factor, traj.q0.copy(), traj.a / factor, traj.b / factor,
                             traj.joint_names, {"made_from": f"excitation {factor:g} times slower"})


def time_reversed(traj):
    """The same motion played backwards, q(-t): a -> -a, b -> b. Same positions, speeds and accelerations
    in magnitude (so the same kinematic limits), different torques: the validation run."""
    from ident.fit.excitation import FourierTrajectory

    return FourierTrajectory(traj.base_frequency, traj.q0.copy(), -traj.a, traj.b.copy(), traj.joint_names,
                             {"made_from": "time-reversed excitation"})


# ---------------------------------------------------------------------------------------------------
# the demo

class _Steps:
    """Numbered steps: announces each on stderr and turns its failure into one InputError that names the
    step, the cause and (for the chain) what to check."""

    def __init__(self, total: int, verbose: bool):
        self.total, self.verbose, self.k = total, verbose, 0

    def __call__(self, name: str, fn):
        self.k += 1
        if self.verbose:
            print(f"[{self.k}/{self.total}] {name}", file=sys.stderr, flush=True)
        try:
            return fn()
        except (InputError, RuntimeError, ValueError, ArithmeticError, OSError) as exc:
            raise StepFailed(f"demo step {self.k} ({name}) failed: {exc}") from exc


class StepFailed(InputError):
    """One step of the demo failed (the message names it)."""


def run(args: argparse.Namespace) -> int:
    if not (args.periods > 0 and np.isfinite(args.periods)):
        raise InputError(f"--periods: expected a positive number, got {args.periods}")
    if not (args.current_noise >= 0 and np.isfinite(args.current_noise)):
        raise InputError(f"--current-noise: expected a number >= 0 A, got {args.current_noise}")
    if args.slowdown is not None and not (args.slowdown >= 1 and np.isfinite(args.slowdown)):
        raise InputError(f"--slowdown: expected a factor >= 1, got {args.slowdown}")
    if args.currents and not args.in_process:
        raise InputError("--currents needs --in-process (the payload run is simulated in this process)")
    from ident.extras import require

    require("matplotlib.figure", "the demo's report")     # before the chain starts, not after it ran
    require("cvxpy", "the demo's physically consistent fit")
    if args.in_process:
        return _run_in_process(args)
    return _run_chain(args)


def excitation_samples(traj, periods: float, rate_hz: float = SAMPLE_RATE_HZ) -> tuple[np.ndarray, np.ndarray]:
    """The excitation as run_trajectory samples: t (N,) s from 0, q (N, n) rad; `periods` periods of traj
    blended in from rest at its mean pose over LEAD_IN s and out to rest over LEAD_IN s (reference)."""
    end = periods * traj.period
    t = np.arange(int(np.ceil((end + 2 * LEAD_IN) * rate_hz)) + 1) / rate_hz - LEAD_IN
    t[-1] = end + LEAD_IN
    return t + LEAD_IN, reference(traj, t, end=end)


def excitation_targets(traj, periods: float, rate_hz: float, rest_s: float = 0.0) -> np.ndarray:
    """The demo's excitation as the driver's run_trajectory gives it to the drives: one target per cycle at
    rate_hz (q (K, n) rad) on the driver's clamped cubic through excitation_samples (driver.waypoints.curve),
    with rest_s at rest before and after the motion (the first target is one cycle after the rest)."""
    from driver.waypoints import curve

    t_s, q_s = excitation_samples(traj, periods)
    rest = int(rest_s * rate_hz)
    t = (np.arange(int(t_s[-1] * rate_hz) + 2 * rest) - rest + 1) / rate_hz
    return curve(t_s, q_s)(np.clip(t, 0.0, t_s[-1]))


def _run_chain(args: argparse.Namespace) -> int:
    from armid import chain
    from armid.commands.identify import load_trajectory
    from firmware_bridge.recording import identification_arrays, write_identification
    from ident.fit import excitation
    from ident.model import load_model

    verbose = not args.quiet
    out = Path(args.output).resolve()
    started = time.perf_counter()
    plan = chain.plan_for(args.transport, args.rate, args.clocking)
    steps = _Steps(10, verbose)
    model = load_model(args.model)
    model_arg = _model_argument(args.model)
    slowdown = plan.slowdown if args.slowdown is None else args.slowdown
    traj = steps("check the excitation against the limits",
                 lambda: time_scaled(_checked(model, load_trajectory(args.trajectory)), slowdown))
    motions = {"excitation": traj, "validation": time_reversed(traj)}
    seconds = args.periods * traj.period
    out.mkdir(parents=True, exist_ok=True)
    recording = out / "run.mcap"
    windows = {}
    background = _compile_ahead(out / "processes", verbose)
    try:
        with chain.Chain(out / "processes", plan, model=model_arg) as c:
            where = steps(f"start the simulator (armid sim --transport {plan.name}, real time)",
                          lambda: c.start_sim(seed=args.seed))
            if verbose:
                print("      " + " ".join(f"{k}={v}" for k, v in where.items()), file=sys.stderr)
            steps(f"start the driver (armid driver, {plan.rate_hz:g} Hz, transport {plan.name})", c.start_driver)
            steps("start the recorder (armid record)", lambda: c.start_recorder(recording))

            def to_start():
                c.enable()
                c.run_motion("move to the start", {"cmd": "move_to", "q": traj.q0.tolist(), "speed": MOVE_SPEED})

            steps("enable the drives and move to the start pose", to_start)
            for name, what in (("excitation", f"{args.periods:g} period(s) of {args.trajectory}"
                                              + (f" {slowdown:g} times slower" if slowdown != 1 else "")
                                              + f", {seconds:g} s + {2 * LEAD_IN:g} s blend in/out"),
                               ("validation", "the excitation time-reversed")):
                t, q = excitation_samples(motions[name], args.periods)
                windows[name] = steps(f"run the {name} ({what}) through run_trajectory",
                                      lambda: _run_with_bar(c, name, t, q, verbose))
            log = steps("stop the recorder once it has written both motions, then the driver and the simulator",
                        lambda: _finish(c, recording, windows["validation"][1]))

        def convert():
            paths = {}
            for name, (first, last) in windows.items():
                arrays, _ = identification_arrays(chain.motion_window(log, first, last))
                paths[name] = out / f"{name}.npz"
                write_identification(arrays, paths[name])
            return paths

        paths = steps("convert the two motions (their fresh samples, at the drives' own times) to excitation.npz and "
                      "validation.npz", convert)
        excitation.save(traj, out / "excitation.toml")
        _await_compile(background, verbose)
    finally:
        _stop(background)
    step = ("identify: `armid identify` as its own process (filter, regressor, parallel decimation, WLS, "
            "physically consistent fit, result.json, model.toml, report)")
    table = steps(step, lambda: chain.run_tool(
        "identify", ["identify", str(paths["excitation"]), "--validate", str(paths["validation"]), "--model", model_arg,
                     "-o", str(out), "--trajectory", str(out / "excitation.toml"), "--consistent",
                     "--compare", model_arg, *([] if verbose else ["--quiet"])],
        out / "processes", step, timeout_s=IDENTIFY_TIMEOUT_S, echo_stderr=verbose))
    data = json.loads((out / "result.json").read_text())["data"]
    figures = chain.stream_figures(log)
    print(f"armid demo: {model.name} on `armid sim --transport {plan.name}` -> `armid driver` ({plan.rate_hz:g} Hz) "
          f"-> `armid record`; excitation {args.trajectory}" + (f" {slowdown:g}x slower" if slowdown != 1 else "")
          + f" ({seconds:g} s + blends), validation on the "
          f"time-reversed motion")
    print(figures.line())
    gaps = [f"{data['bridged_samples']} lost samples bridged across short gaps"] if data["bridged_samples"] else []
    if data["late_cut_samples"]:
        gaps.append(f"{data['late_cut_samples']} samples in {len(data['late_windows_s'])} window(s) cut where the "
                    f"drives got their targets late")
    if data["segments"] > 1:
        gaps.append(f"cut into {data['segments']} uniformly sampled segments at longer ones, each filtered apart")
    gaps = ", ".join(gaps) or "no sample lost"
    print(f"identification data: {data['samples']} fresh samples at {data['rate_hz']:g} Hz ({gaps}; the effort "
          f"aligned with the motion by the simulator's {1e3 * data['effort_delay_s']:g} ms)")
    print(table.rstrip())
    print(f"({model.name} is the model the simulator runs: its values are the truth)")
    print(f"done in {time.perf_counter() - started:.1f} s; open {out / 'report.html'}")
    return 0


COMPILE_AHEAD_TIMEOUT_S = 600.0   # s, bound on waiting for the identification kernels compiled in the background


def _compile_ahead(folder: Path, verbose: bool):
    """On a cold numba cache (the first run after an install), `armid warmup --part identify` as a background
    process at the lowest CPU priority (nice 19: the chain's processes run first), so that the identify step
    finds the regressor compiled instead of compiling it at the end. Returns the process, or None when the
    cache is warm (or cannot be inspected)."""
    import os
    import subprocess

    from armid import chain
    from armid.jit import cached_signatures
    from ident.model import kernels

    if cached_signatures(kernels.regressor) != 0:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    if verbose:
        print("      (first run after an install: the identification kernels compile in the background, at low "
              "priority, while the arm moves)", file=sys.stderr, flush=True)
    with open(folder / "warmup.out", "wb") as fo, open(folder / "warmup.err", "wb") as fe:
        return subprocess.Popen([*chain.child_command(), "warmup", "--part", "identify"], env=chain.child_environment(),
                                stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=lambda: os.nice(19))


def _stop(proc) -> None:
    """Stop _compile_ahead's process if it still runs (the demo failed or was interrupted)."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(10)


def _await_compile(proc, verbose: bool) -> None:
    """Wait (bounded) for _compile_ahead's process; if it failed or outlasts the bound, stop it: the identify
    step then compiles what it needs itself."""
    if proc is None:
        return
    import subprocess

    started = time.perf_counter()
    try:
        if proc.poll() is None and verbose:
            print("      waiting for the identification kernels' compile to finish", file=sys.stderr, flush=True)
        proc.wait(COMPILE_AHEAD_TIMEOUT_S)
        if verbose and time.perf_counter() - started > 0.5:
            print(f"      ... compiled (waited {time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _run_with_bar(c, name: str, t: np.ndarray, q: np.ndarray, verbose: bool) -> tuple[int, int]:
    bar = _bar(1000, verbose, name, unit="‰")

    def progress(fraction: float) -> None:
        bar.update(int(1000 * fraction) - bar.n)

    try:
        return c.run_motion(f"run the {name}", {"cmd": "run_trajectory", "samples": {"t": t.tolist(), "q": q.tolist()}},
                            progress)
    finally:
        bar.close()


def _finish(c, recording: Path, last_seq: int):
    from firmware_bridge.recording import read_recording

    c.finish_recording(until_seq=last_seq)
    c.stop()
    return read_recording(recording)


def _model_argument(spec: str) -> str:
    """The model as the demo's processes get it: a file as an absolute path (they run in other folders), a
    shipped model by name."""
    return str(Path(spec).resolve()) if Path(spec).is_file() else spec


def _summary(model, ident, written: dict, started: float, label: str | None = None) -> None:
    from armid.commands.identify import print_comparison

    print_comparison(ident, model, label)
    print(f"({model.name} is the model the simulator runs: its values are the truth)")
    for name, path in written.items():
        print(f"{name}: {path}")
    print(f"done in {time.perf_counter() - started:.1f} s; open {written['report']}")


def _run_in_process(args: argparse.Namespace) -> int:
    from armid.commands.identify import load_trajectory, write_outputs
    from ident.fit import batch
    from ident.model import load_model

    verbose = not args.quiet
    out = Path(args.output).resolve()
    started = time.perf_counter()
    steps = _Steps(6 if args.currents else 5, verbose)
    model = load_model(args.model)
    traj = steps("check the excitation against the limits",
                 lambda: time_scaled(_checked(model, load_trajectory(args.trajectory)), args.slowdown or 1.0))
    seconds = args.periods * traj.period
    what = "motor currents" if args.currents else "drive torques"
    sim = dict(current_noise=args.current_noise, currents=args.currents, progress=verbose)
    runs = {"excitation": steps(f"simulate the excitation ({seconds:g} s at 1 kHz, CSP, encoder quantisation, "
                                f"current noise {args.current_noise:g} A; recording {what})",
                                lambda: simulate(model, traj, seconds, seed=args.seed, **sim)),
            "validation": steps("simulate the validation run (the excitation time-reversed)",
                                lambda: simulate(model, time_reversed(traj), seconds, seed=args.seed + 1, **sim))}
    if args.currents:
        runs["payload"] = steps(f"simulate the excitation with a {PAYLOAD_MASS:g} kg payload (its mass fixes the "
                                "scale of the drive gains)",
                                lambda: simulate(model, traj, seconds, seed=args.seed + 2, payload_mass=PAYLOAD_MASS,
                                                 **sim))

    def identify():
        out.mkdir(parents=True, exist_ok=True)
        paths = {name: out / f"{name}.npz" for name in runs}
        for name, r in runs.items():
            np.savez(paths[name], t=r.t, q=r.q, effort_delay=r.effort_delay,
                     **({"current": r.current} if args.currents else {"tau": r.tau}))
        payload = dict(payload_run=paths["payload"], payload_mass=PAYLOAD_MASS) if args.currents else {}
        return batch.identify(model, paths["excitation"], validate=paths["validation"], trajectory=traj,
                              consistent=True, verbose=verbose, **payload)

    ident = steps("identify (filter, regressor, parallel decimation, WLS, physically consistent fit"
                  + (", drive gains" if args.currents else "") + ")", identify)
    written = steps("write result.json, model.toml and the report",
                    lambda: write_outputs(ident, out, str(out / "excitation.npz")))
    print(f"armid demo: {model.name} in process, excitation {args.trajectory} ({seconds:g} s of {what} recorded at "
          f"1 kHz), validation on the time-reversed motion")
    if args.currents:
        true_gains = model.joint_torque_per_amp()
        print("drive gains (N m/A): identified " + " ".join(f"{g:.4f}" for g in ident.gains)
              + "; true " + " ".join(f"{g:.4f}" for g in true_gains)
              + "; error " + " ".join(f"{100 * (g / g0 - 1):+.2f}%" for g, g0 in zip(ident.gains, true_gains)))
    _summary(model, ident, written, started, Path(args.model).name)
    return 0


def _checked(model, traj):
    from ident.fit import excitation

    excitation.check(model, traj)
    excitation.check(model, time_reversed(traj))
    return traj
