"""Does the chain of processes bias identification? The demo's chain (`armid demo --transport T --clocking
lockstep`, fast mode as tests/test_e2e.py runs it: --periods 0.25) with seeds 1..K, beside the same motion in
process with the same seeds: the demo's run_trajectory samples through the driver's clamped cubic
(driver.waypoints.curve), one target per cycle into sim.Simulator at the transport's rate, the samples through
the transport's codec (sim.transport_recording.through_wire), identified as `armid identify` does.

Printed per drive term of each joint (Ia, fc, fv) and over all well-identified base parameters:
- z = (estimate - truth) / reported std, mean and spread over the chain's runs beside the in-process runs';
- the chain's own bias: each chain run with the simulator's current noise subtracted sample by sample
  (sim.noise_split: the noise of each sample is known from the seed and the sample's device time), identified
  again, in the noisy run's sigmas. A chain that adds nothing gives what the in-process noise-free run gives.

    python benchmarks/bench_chain_bias.py [--runs 4] [--transports serial,gateway] [--clocking free] [--keep DIR]

With --late-host MS: the mechanism behind the free-running chains' own bias under load, in process and without
noise: the free-running serial board's drives (sim.drive_targets, setpoint buffer of 3 cycles) along the same
excitation with a host that sends nothing for MS and then every target it owes at once (sim.late_host), each
identified with its late samples kept (as before the LATE flag) and with them marked as the driver flags them and
cut (ident.fit.preprocess.cut_windows).

    python benchmarks/bench_chain_bias.py --late-host 0,10,29
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

PERIODS = 0.25
REST_S = 0.3     # s at rest before and after the motion in the in-process run (the chain's window starts moving)
TERMS = [f"{p}{j}" for j in range(1, 7) for p in ("Ia", "fc", "fv")]


def _setup():
    from ident.fit import excitation
    from ident.model import load_model
    from ident.model.base_params import base_parameters

    model = load_model("generic6")
    base = base_parameters(model)
    return model, base, base.from_standard(model.standard_parameters()), excitation.preset("seed000")


def _fit(model, base, traj, rec):
    from ident.fit.batch import identify

    f = identify(model, rec, trajectory=traj, base=base).fit
    return f.beta, f.std, f.relative_std_pct


def in_process(transport: str, seed: int, current_std: float, clocking: str = "lockstep"):
    """The demo's excitation motion on sim.Simulator in this process, as the chain runs it (see the docstring)."""
    from armid import chain
    from armid.commands import demo
    from firmware_bridge import cia402
    from firmware_bridge.cia402 import Mode
    from ident.fit.preprocess import Recording
    from sim import NoiseConfig, Simulator
    from sim.simulator import effort_delay
    from sim.transport_recording import through_wire, wire_scaling

    model, _, _, traj = _setup()
    rate = chain.plan_for(transport, clocking=clocking).sim_rate_hz
    q_ref = demo.excitation_targets(traj, PERIODS, rate, REST_S)
    t = np.arange(len(q_ref)) / rate
    sim = Simulator(model, noise=NoiseConfig(current_std=current_std), seed=seed, q0=q_ref[0], rate_hz=rate)
    n = model.n
    sim.set_commands(mode=np.full(n, int(Mode.CSP)), target_position=q_ref[0],
                     controlword=np.full(n, cia402.CW_SHUTDOWN))
    sim.step(1)
    sim.set_commands(controlword=np.full(n, cia402.CW_ENABLE_OPERATION))
    sim.step(2)
    q, current = np.empty((len(t), n)), np.empty((len(t), n))
    for k in range(len(t)):
        sim.set_commands(target_position=q_ref[k])
        s = sim.step(1)
        q[k], current[k] = s.position, s.current
    q, current = through_wire(transport, q, current, wire_scaling(model))
    return Recording(np.arange(len(t)) / rate, q, current * model.joint_torque_per_amp(), None, None,
                     f"in process ({transport}, seed {seed})", effort_delay(rate))


def late_host(seed: int, current_std: float, stall_ms: float, at_s: float = 3.0, mark: bool = True):
    """The demo's excitation on a free-running serial board's drives in process (sim.late_host): one target per
    cycle, except that the host sends nothing for stall_ms from at_s into the motion and then every target it owes
    at once, as a host that was not scheduled does. Recording of positions and torques (N m), effort_delay set,
    the late samples marked when mark (as the driver flags them), else not."""
    from armid.commands import demo
    from sim.late_host import late_host_recording

    model, _, _, traj = _setup()
    rate = 1000.0
    q_ref = demo.excitation_targets(traj, PERIODS, rate, REST_S)
    return late_host_recording(model, q_ref, rate_hz=rate, stall_at=int(REST_S * rate) + int(at_s * rate),
                               stall=int(round(stall_ms * rate / 1000.0)), current_std=current_std, seed=seed,
                               mark=mark)


def late_host_bias(stalls_ms: list[float]) -> None:
    """Print the in-process late-host replica's bias, noise off, in the sigmas of the undisturbed noisy run."""
    from sim import NoiseConfig

    model, base, truth, traj = _setup()
    _, s, pct = _fit(model, base, traj, late_host(1, NoiseConfig().current_std, 0.0))
    ok = pct <= 10
    names = list(base.names)
    ref = None
    for stall in dict.fromkeys([0.0, *stalls_ms]):
        for mark, how in ((False, "kept (before)"), (True, "late windows cut")):
            if stall == 0.0 and mark:
                continue
            rec = late_host(1, 0.0, stall, mark=mark)
            z = (_fit(model, base, traj, rec)[0] - truth) / s
            worst = np.argsort(-np.abs(np.where(ok, z, 0.0)))[:4]
            top = np.abs(z[ok]).max()
            ref = top if ref is None else ref
            cut = int(rec.late.sum()) if mark else 0
            print(f"late host {stall:g} ms at 3 s, {how}, {cut} samples marked, noise off, max |z|: {top:.2f} sigma "
                  f"(reference: host on time {ref:.2f} sigma, ratio {top / ref:.2f} x); worst "
                  + ", ".join(f"{names[k]} {z[k]:+.2f}" for k in worst), flush=True)


def chain_run(transport: str, seed: int, out: Path, clocking: str = "lockstep"):
    """`armid demo` on the chain; (z-ready result document, excitation Recording, its noise-free twin) or None."""
    from armid import chain, cli
    from firmware_bridge.recording import read_recording
    from ident.fit.preprocess import load_recording
    from sim import NoiseConfig
    from sim.noise_split import noise_torques, window

    model = _setup()[0]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(["demo", "-o", str(out), "--transport", transport, "--clocking", clocking, "--periods", str(PERIODS), "--quiet",
                         "--seed", str(seed)])
    if code != 0 or not (out / "result.json").is_file():
        return None
    doc = json.loads((out / "result.json").read_text())
    rec = load_recording(out / "excitation.npz")
    samples = window(read_recording(out / "run.mcap").states, rec.q)
    noise = noise_torques(samples, seed=seed, current_std=NoiseConfig().current_std,
                          rate_hz=chain.plan_for(transport, clocking=clocking).sim_rate_hz, torque_per_amp=model.joint_torque_per_amp())
    return doc, rec, dataclasses.replace(rec, tau=rec.tau - noise)


def _stats(z: np.ndarray) -> str:
    return f"{z.mean():+.2f} +- {z.std():.2f}" if len(z) else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4, help="chain runs (seeds 1..RUNS) per transport")
    ap.add_argument("--transports", default="serial,gateway")
    ap.add_argument("--clocking", default="lockstep", choices=("lockstep", "free"),
                    help="the simulator in lockstep with the driver, or free-running on its own clock")
    ap.add_argument("--late-host", default=None, metavar="MS[,MS]",
                    help="instead of the chain: the in-process free-running drives with a host silent this long")
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep the chain runs' folders here")
    args = ap.parse_args()
    from sim import NoiseConfig

    if args.late_host:
        late_host_bias([float(x) for x in args.late_host.split(",")])
        return
    model, base, truth, traj = _setup()
    names = list(base.names)
    cols = [names.index(n) for n in TERMS if n in names]
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-chain-bias-"))
    print(f"chain: armid demo --clocking {args.clocking} --periods {PERIODS:g} --seed 1..{args.runs}; reference: the same "
          f"motion and seeds in process; z = (estimate - truth) / reported std")
    for transport in args.transports.split(","):
        zc, zc_clean, zi, zi_clean, secs = [], [], [], [], []
        for seed in range(1, args.runs + 1):
            started = time.perf_counter()
            got = chain_run(transport, seed, root / f"{transport}-{seed}", args.clocking)
            secs.append(time.perf_counter() - started)
            if got is None:
                print(f"{transport} seed {seed}: the demo failed (folder {root / f'{transport}-{seed}'})")
                continue
            doc, rec, clean = got
            std = np.array([r["std"] for r in doc["base_parameters"]])
            ok = np.array([r["relative_std_pct"] is not None and r["relative_std_pct"] <= 10
                           for r in doc["base_parameters"]])
            value = np.array([r["value"] for r in doc["base_parameters"]])
            zc.append(np.where(ok, (value - truth) / std, np.nan))
            zc_clean.append(np.where(ok, (_fit(model, base, traj, clean)[0] - truth) / std, np.nan))
            noisy = in_process(transport, seed, NoiseConfig().current_std, args.clocking)
            b, s, pct = _fit(model, base, traj, noisy)
            ok_i = pct <= 10
            zi.append(np.where(ok_i, (b - truth) / s, np.nan))
            quiet = in_process(transport, seed, 0.0, args.clocking)
            zi_clean.append(np.where(ok_i, (_fit(model, base, traj, quiet)[0] - truth) / s, np.nan))
            print(f"{transport} seed {seed}: chain max |z| {np.nanmax(np.abs(zc[-1])):.2f}, noise removed "
                  f"{np.nanmax(np.abs(zc_clean[-1])):.2f}; in process {np.nanmax(np.abs(zi[-1])):.2f}, noise off "
                  f"{np.nanmax(np.abs(zi_clean[-1])):.2f} ({secs[-1]:.0f} s)", flush=True)
        if not zc:
            continue
        zc, zc_clean, zi, zi_clean = (np.array(x) for x in (zc, zc_clean, zi, zi_clean))
        print(f"\n{transport} {args.clocking}, {len(zc)} runs: z mean +- spread over the runs")
        print(f"  {'term':8s} {'chain':>14s} {'in process':>14s}   {'chain, noise removed':>22s} {'in process, noise off':>22s}")
        for c in cols:
            print(f"  {names[c]:8s} {_stats(zc[:, c][np.isfinite(zc[:, c])]):>14s} "
                  f"{_stats(zi[:, c][np.isfinite(zi[:, c])]):>14s}   "
                  f"{_stats(zc_clean[:, c][np.isfinite(zc_clean[:, c])]):>22s} "
                  f"{_stats(zi_clean[:, c][np.isfinite(zi_clean[:, c])]):>22s}")
        a, b = np.abs(zc_clean[np.isfinite(zc_clean)]), np.abs(zi_clean[np.isfinite(zi_clean)])
        s_chain, s_ref = np.nanstd(zc), np.nanstd(zi)
        print(f"{transport} chain z spread, all well-identified: {s_chain:.2f} (reference: in process {s_ref:.2f}, "
              f"ratio {s_chain / s_ref:.2f} x)")
        print(f"{transport} chain's own bias, max |z| noise removed: {a.max():.2f} sigma (reference: in process, "
              f"noise off {b.max():.2f} sigma, ratio {a.max() / b.max():.2f} x)")
    if not args.keep:
        print(f"(chain runs in {root})")


if __name__ == "__main__":
    main()
