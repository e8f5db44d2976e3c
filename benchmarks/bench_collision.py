"""Collision detection benchmark: the identified model, the catalogue (nominal) model and no model (a plain
current threshold) side by side, on a simulated arm whose dynamics are off the catalogue by --mismatch (20 %).

The arm: sim.Simulator(generic6, mismatch=0.2), its sensors' default noise and its Stribeck friction (which the
catalogue model does not have; the identification finds it on the samples its fit leaves out, ident.fit.near_rest).
The identified model: `armid identify --consistent`'s pipeline (ident.fit.batch.identify) on
--ident-seconds of seed000 recorded from that arm, written as model.toml and result.json. The motion: seed000 at
full speed in CSP, its positions as targets. Each detector's signal per joint:
  identified, nominal   the generalized-momentum observer's estimate (driver/observer.py, gains 100 1/s) over
                        the model, from the measured q, qd and current, as the driver computes it; the identified
                        model's observer with the friction near rest its identification found (result.json's
                        fit.near_rest_friction, as the driver reads it)
  current               the measured joint torque (current x gear x torque constant): a plain threshold on it

It prints:
  - floors: the largest |signal| per joint over --minutes of excitation without contact, i.e. the smallest
    threshold (N m) with no false positive in that time; an observer detects any external torque above it, the
    plain threshold only where motion and contact torque together pass it;
  - the collision thresholds of the rule (20 times the residual RMS; 20 % of the torque limit for the nominal
    model) side by side;
  - false positives per hour of excitation at the operating thresholds (the identified model's from the rule over
    its result.json, driver/collision.py; the nominal model's from the rule over its torque limits; the current
    threshold at 1.25 times its floor over the first tenth of the run, as one would set it on a commissioning
    run);
  - detection latency (ms) from contact onset to the drives' quick stop, for pushes on links 2-6 making 5 and
    10 N m at their most loaded joint at onset, during the excitation, with each detector at 1.5 times its own
    floor (the lowest it can run without false positives, with a margin; the rule's thresholds of the nominal
    model, 10 and 20 % of the torque limits, detect none of these pushes): the first
    sample over a collision threshold, plus one cycle for the quick stop to reach the drives (the driver reacts
    in the cycle that reads the sample: tests/test_collision.py); "-" when not detected within 200 ms;
  - following error RMS over seed000 through the driver's own cycle (lockstep, armid.lockstep): with the planned
    torque (rigid body and identified friction) as the drives' torque offset, the drives' own inertia and friction
    feed-forward off as for such a host; against no feed-forward with the drives' own on (their default), and with
    none at all; and the first pair again on an arm without the plant's Stribeck friction (the part no Coulomb +
    viscous model holds);
  - microseconds per cycle: the observer's update (one numba call) beside the driver's whole cycle without it in
    the same run, each the best of REPEATS batches; the feed-forward is planned beside the cycle and indexed in it (no per-cycle cost).

usage: python benchmarks/bench_collision.py [--minutes 10] [--mismatch 0.2] [--ident-seconds 20]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from armid.lockstep import Rig, following_error, push_making  # noqa: E402
from driver.collision import make_thresholds  # noqa: E402
from driver.model_source import near_rest_friction, residual_rms  # noqa: E402
from driver.observer import MomentumObserver  # noqa: E402
from firmware_bridge import cia402  # noqa: E402
from ident.fit import excitation  # noqa: E402
from ident.fit.batch import identify  # noqa: E402
from ident.model import load_model  # noqa: E402
from ident.outputs.output_folder import write_identification  # noqa: E402
from sim import DriveConfig, Simulator  # noqa: E402
from sim.plant import FrictionConfig, mismatched_model  # noqa: E402
from sim.recording import LEAD_IN, reference, simulate  # noqa: E402

RATE = 1000.0
SEED = 1
DETECTORS = ("identified", "nominal", "current")
LINKS = (2, 3, 4, 5, 6)
TORQUES = (5.0, 10.0)
REPEATS = 5          # timing batches; the best one counts


def run(nominal, models, cycles, mismatch, push=None, push_at=0, rest=None):
    """seed000 on the mismatched arm for `cycles` after the lead-in; the signals (cycles, n) of each detector, the
    true external torque. push: apply_wrench arguments at cycle push_at; rest: {detector: (fs, vs)} the friction
    near rest its observer adds (the identification's, as the driver reads it from result.json)."""
    traj = excitation.preset("seed000")
    lead = int(round(LEAD_IN * RATE))
    sim = Simulator(nominal, seed=SEED, q0=reference(traj, np.array([-LEAD_IN + 1 / RATE]))[0], rate_hz=RATE,
                    mismatch=mismatch)
    q0 = sim.read_state().position
    sim.set_commands(mode=np.full(6, int(cia402.Mode.CSP)), target_position=q0,
                     controlword=np.full(6, cia402.CW_SHUTDOWN))
    sim.step(1)
    sim.set_commands(controlword=np.full(6, cia402.CW_ENABLE_OPERATION))
    sim.step(2)
    rest = rest or {}
    observers = {k: MomentumObserver(m, RATE, near_rest=rest.get(k)) for k, m in models.items()}
    per_amp = {k: m.joint_torque_per_amp() for k, m in models.items()}
    out = {k: np.zeros((cycles, 6)) for k in (*models, "current")}
    truth = np.zeros((cycles, 6))
    tau_m, est = np.zeros(6), np.zeros(6)
    block = 10_000
    for first in range(-lead, cycles, block):
        idx = np.arange(first, min(first + block, cycles))
        targets = reference(traj, (idx + 1) / RATE)
        for k, target in zip(idx, targets):
            if push is not None and k == push_at:
                sim.apply_wrench(**push)
            sim.set_commands(target_position=target)
            s = sim.step(1)
            for name, obs in observers.items():
                np.multiply(s.current, per_amp[name], out=tau_m)
                obs.update(s.position, s.velocity, tau_m, est)
                if k >= 0:
                    out[name][k] = est
            if k >= 0:
                out["current"][k] = s.torque
                truth[k] = sim.read_truth().tau_ext
    return out, truth, sim


def crossings(signal, threshold):
    """Rising edges of any joint's |signal| over its threshold, re-armed when all are back under 0.5 x it."""
    over = np.abs(signal) > threshold
    under = np.all(np.abs(signal) < 0.5 * threshold, axis=1)
    count, armed = 0, True
    for k in range(len(signal)):
        if armed and over[k].any():
            count, armed = count + 1, False
        elif not armed and under[k]:
            armed = True
    return count


def identified_model(nominal, mismatch, seconds, folder):
    arm = mismatched_model(nominal, mismatch, SEED + 7919)        # the mechanics Simulator(mismatch=...) runs
    traj = excitation.preset("seed000")
    rec = simulate(arm, traj, seconds, seed=SEED + 1)
    result = identify(nominal, rec, trajectory=traj, consistent=True)
    written = write_identification(result, folder, "bench_collision (simulated)", with_report=False)
    model = load_model(written["model"])
    return model, residual_rms(str(written["result"]), nominal), near_rest_friction(str(written["result"]), model)


def following_errors(nominal):
    """RMS (rad) over seed000 of: the driver's feed-forward on drives set up for it (their own off), no feed-forward on
    those drives, no feed-forward on drives with their own (inertia J and catalogue friction), and the first and
    second without the plant's Stribeck friction."""
    rms = lambda per_joint: float(np.sqrt(np.mean(np.square(per_joint))))        # noqa: E731
    no_stribeck = FrictionConfig(stribeck_ratio=0.0)
    return {"with": rms(following_error(nominal)),
            "alone": rms(following_error(nominal, feed_forward=False)),
            "own": rms(following_error(nominal, feed_forward=False, drive=DriveConfig())),
            "with, no Stribeck": rms(following_error(nominal, friction=no_stribeck)),
            "own, no Stribeck": rms(following_error(nominal, feed_forward=False, drive=DriveConfig(),
                                                    friction=no_stribeck))}


def cycle_cost(nominal, model, rest):
    obs = MomentumObserver(model, RATE, near_rest=rest)
    q, qd, tau, out = np.full(6, 0.3), np.full(6, 0.5), np.ones(6), np.zeros(6)
    for _ in range(1000):
        obs.update(q, qd, tau, out)
    # the best of REPEATS batches (as timeit advises: the slower ones measure the neighbours' load, not the code)
    k = 4000
    batches = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        for _ in range(k):
            obs.update(q, qd, tau, out)
        batches.append((time.perf_counter() - t) / k * 1e6)
    rig = Rig(nominal)
    rig.enable()
    rig.cycle.monitor = None            # the cycle as it was without the observer
    rig.step(500)
    cycles = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        rig.step(1000)
        cycles.append((time.perf_counter() - t) / 1000 * 1e6)
    return min(batches), min(cycles)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="excitation without contact (default 10)")
    p.add_argument("--mismatch", type=float, default=0.2)
    p.add_argument("--ident-seconds", type=float, default=20.0)
    args = p.parse_args()
    nominal = load_model("generic6")
    with tempfile.TemporaryDirectory(prefix="bench-collision-") as tmp:
        ident, rms, rest = identified_model(nominal, args.mismatch, args.ident_seconds, tmp)
    models = {"identified": ident, "nominal": nominal}
    print(f"arm: generic6 with its dynamics {args.mismatch:.0%} off (sim mismatch); identified from "
          f"{args.ident_seconds:g} s of seed000; residual RMS (measured) {np.round(rms, 3).tolist()} N m")
    print(f"friction near rest (identified on the rows the fit left out): excess {np.round(rest[0], 3).tolist()} N m, "
          f"velocity {np.round(rest[1], 3).tolist()} rad/s (the simulated arm's: 0.25 fc, 0.05 rad/s)")
    rests = {"identified": rest}

    cycles = int(round(args.minutes * 60 * RATE))
    t0 = time.perf_counter()
    quiet, truth, _ = run(nominal, models, cycles, args.mismatch, rest=rests)
    print(f"(no-contact run: {args.minutes:g} min of excitation simulated in {time.perf_counter() - t0:.0f} s)")
    assert not truth.any()
    floors = {d: np.abs(quiet[d]).max(axis=0) for d in DETECTORS}
    ident_th = make_thresholds(6, ident.tau_max, residual_rms=rms)
    nominal_th = make_thresholds(6, nominal.tau_max)
    tenth = max(1, cycles // 10)
    current_th = 1.25 * np.abs(quiet["current"][:tenth]).max(axis=0)
    operating = {"identified": ident_th.collision, "nominal": nominal_th.collision, "current": current_th}
    for d in DETECTORS:
        print(f"floor {d}: {np.round(floors[d], 3).tolist()} N m (smallest threshold without a false positive in "
              f"{args.minutes:g} min)")
    for j in range(6):
        print(f"smallest external torque detected, joint {j + 1}, identified: {floors['identified'][j]:.3f} N m "
              f"(reference: nominal {floors['nominal'][j]:.3f} N m, ratio "
              f"{floors['nominal'][j] / floors['identified'][j]:.1f} x)")
    for j in range(6):
        print(f"collision threshold by the rule, joint {j + 1}, identified: {ident_th.collision[j]:.3f} N m (reference: "
              f"nominal {nominal_th.collision[j]:.3f} N m, ratio {nominal_th.collision[j] / ident_th.collision[j]:.1f} x)")
    hours = args.minutes / 60.0
    for d in DETECTORS:
        fp = crossings(quiet[d], operating[d]) / hours
        print(f"false positives {d}: {fp:.1f} per hour at thresholds {np.round(operating[d], 2).tolist()} N m")

    traj = excitation.preset("seed000")
    for link in LINKS:
        for torque in TORQUES:
            at = 1500 + 257 * LINKS.index(link) + 1000 * TORQUES.index(torque)
            q_at = reference(traj, np.array([(at + 1) / RATE]))[0]
            push = push_making(nominal, q_at, link, torque)
            sig, truth, _ = run(nominal, models, at + 250, args.mismatch, push=push, push_at=at, rest=rests)
            cells = []
            for d in DETECTORS:
                over = np.flatnonzero(np.any(np.abs(sig[d][at:at + 200]) > 1.5 * floors[d], axis=1))
                cells.append("-" if not len(over) else f"{over[0] + 1 + 1:d}")
            print(f"detection latency link {link}, {torque:g} N m (true peak {np.abs(truth).max():.1f} N m): "
                  f"identified {cells[0]} ms (reference: nominal {cells[1]} ms, current threshold {cells[2]} ms)")

    fe = following_errors(nominal)
    print(f"following error RMS with feed-forward: {fe['with'] * 1e6:.2f} urad (reference: without, the drives' own "
          f"inertia and friction feed-forward on, {fe['own'] * 1e6:.2f} urad, ratio {fe['with'] / fe['own']:.2f} x)")
    print(f"following error RMS with feed-forward: {fe['with'] * 1e6:.2f} urad (reference: without any, the drives' "
          f"loops alone, {fe['alone'] * 1e6:.2f} urad, ratio {fe['with'] / fe['alone']:.2f} x)")
    print(f"following error RMS with feed-forward, the arm without Stribeck friction: {fe['with, no Stribeck'] * 1e6:.2f} "
          f"urad (reference: without, the drives' own on, {fe['own, no Stribeck'] * 1e6:.2f} urad, ratio "
          f"{fe['with, no Stribeck'] / fe['own, no Stribeck']:.2f} x)")
    obs_us, cycle_us = cycle_cost(nominal, ident, rest)
    print(f"observer per cycle: {obs_us:.1f} us (reference: the driver's lockstep cycle without it, simulator "
          f"included, {cycle_us:.1f} us, ratio {obs_us / cycle_us:.2f} x); feed-forward per cycle: 0 us (planned "
          f"beside the cycle, indexed in it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
