"""Are the reported standard deviations of the base parameters right? Over many short simulated recordings
(sim.ensemble: seeds, three noise levels, with and without a payload, lockstep and free-running logging),
each base parameter's z = (estimate - truth) / std, per class (inertial: rigid body and rotor inertia;
friction: Coulomb and viscous; offsets), with the covariance armid reports (rows' noise correlated by the
filters, ident.fit.hac) beside the textbook s^2 (W'W)^-1. A right covariance gives mean 0 and spread 1.

Then the fleet's drift flag on unchanged arms (recordings k and k + sim.ensemble.CONFIGS: the same arm and
configuration, new noise) at 3 sigma against the nominal 0.27 %, and the time of `armid identify` at
N = 100 000 samples with each covariance.

    python benchmarks/bench_uncertainty.py [--count 200] [--seconds 6] [--workers 2] [--cache DIR]

With --cache, each recording's outcome is kept in DIR as it arrives, and a second run reuses them (a run cut
short on a loaded machine goes on where it stopped).
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import multiprocessing as mp  # noqa: E402
import pickle  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from sim import ensemble  # noqa: E402

CLASSES = ("inertial", "friction", "offset")


def parameter_class(name: str) -> str:
    return "friction" if name.startswith(("fc", "fv")) else "offset" if name.startswith("offset") else "inertial"


def _run(args):
    k, seconds = args
    return k, ensemble.run(k, seconds)


def outcomes_of(count: int, seconds: float, workers: int, cache: Path | None) -> list:
    found = {}
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        for k in range(count):
            f = cache / f"{k}-{seconds:g}s.pkl"
            if f.is_file():
                found[k] = pickle.loads(f.read_bytes())
    todo = [(k, seconds) for k in range(count) if k not in found]
    with mp.get_context("spawn").Pool(workers) as pool:
        for k, o in pool.imap_unordered(_run, todo):
            found[k] = o
            if cache is not None:
                (cache / f"{k}-{seconds:g}s.pkl").write_bytes(pickle.dumps(o))
    return [found[k] for k in range(count)]


def calibration(outcomes, names) -> None:
    cls = np.array([parameter_class(n) for n in names])
    well = np.median([o.relative_std_pct for o in outcomes], axis=0) <= 10.0
    for label, textbook in (("reported", False), ("textbook", True)):
        z = np.array([o.z(textbook) for o in outcomes])
        for c in CLASSES:
            for which, sel in (("all", cls == c), ("well identified", (cls == c) & well)):
                v = z[:, sel].ravel()
                print(f"z {c} ({which}, {sel.sum()} x {len(z)}) {label}: mean {v.mean():+.3f}, spread {v.std():.3f} "
                      f"(reference: mean 0, spread 1)")
    for label, textbook in (("reported", False), ("textbook", True)):
        z2 = float(np.mean([np.mean(o.z(textbook) ** 2) for o in outcomes]))
        print(f"mean z^2 over every parameter, {label}: {z2:.3f} (reference: 1 +- {ensemble.spread_band(outcomes, 1):.3f}, "
              f"ratio {z2:.2f} x)")
    for clock in ensemble.CLOCKINGS:
        for payload in (False, True):
            sub = [o for o in outcomes if o.config.clocking == clock and o.config.payload == payload]
            z = np.array([o.z() for o in sub])
            print(f"z spread, {clock}, {'payload' if payload else 'no payload'} ({len(sub)} recordings): "
                  f"{z.std():.3f} (reference: textbook {np.array([o.z(True) for o in sub]).std():.3f})")


def fleet_rate(outcomes) -> None:
    from ident.outputs.fleet_drift import family_wise_sigma

    pairs = [(outcomes[k], outcomes[k + ensemble.CONFIGS]) for k in range(len(outcomes) - ensemble.CONFIGS)
             if (k // ensemble.CONFIGS) % 2 == 0]
    for label, textbook in (("reported", False), ("textbook", True)):
        d = np.concatenate([np.abs(a.beta - b.beta) / np.hypot(*(
            (a.std_textbook, b.std_textbook) if textbook else (a.std, b.std))) for a, b in pairs])
        rate = 100.0 * np.mean(d > 3.0)
        print(f"fleet false flags at 3 sigma, {label} covariance: {rate:.2f} % of {d.size} comparisons "
              f"(reference: 0.27 %, ratio {rate / 0.27:.2f} x)")
        k = family_wise_sigma(0.01, comparisons=58)
        arms = 100.0 * np.mean([np.any(np.abs(a.beta - b.beta) / np.hypot(
            *((a.std_textbook, b.std_textbook) if textbook else (a.std, b.std))) > k) for a, b in pairs])
        print(f"fleet arms flagged at the family-wise {k:.2f} sigma (1 % per arm of 58), {label}: {arms:.2f} % "
              f"of {len(pairs)} (reference: 1 %)")


def identify_time(samples: int = 100_000, repeats: int = 3) -> None:
    from ident.fit import excitation
    from ident.fit.batch import identify
    from ident.fit.preprocess import Recording
    from ident.model import dynamics, load_model
    from ident.model.base_params import base_parameters

    model = load_model("generic6")
    base = base_parameters(model)
    traj = excitation.preset("seed000")
    t = np.arange(samples) / 1000.0
    q, qd, qdd = traj.evaluate(t)
    tau = dynamics.rnea(model, q, qd, qdd) + np.random.default_rng(0).normal(0, 0.02, q.shape)
    rec = Recording(t, q, tau, None, None, "bench")
    best = {}
    for kind in ("textbook", "correlated", "textbook", "correlated") * repeats:
        started = time.perf_counter()
        identify(model, rec, trajectory=traj, base=base, covariance=kind)
        best[kind] = min(best.get(kind, np.inf), time.perf_counter() - started)
    print(f"armid identify at N = {samples}, reported covariance: {best['correlated']:.3f} s (reference: textbook "
          f"{best['textbook']:.3f} s, ratio {best['correlated'] / best['textbook']:.2f} x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=None)
    a = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    started = time.perf_counter()
    outcomes = outcomes_of(a.count, a.seconds, a.workers, a.cache)
    print(f"{a.count} recordings of {a.seconds:g} s simulated and identified in {time.perf_counter() - started:.0f} s")
    names = ensemble._setup("generic6")[1].names
    calibration(outcomes, names)
    fleet_rate(outcomes)
    identify_time()
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
