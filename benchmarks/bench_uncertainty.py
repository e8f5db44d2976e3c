"""Are the reported standard deviations of the base parameters right? Over many short simulated recordings
(sim.ensemble: seeds, three noise levels, with and without a payload, the three transports' rates, wire
encodings and clocking, lockstep and free-running: sim.transport_recording), each base parameter's
z = (estimate - truth) / std, per class (inertial: rigid body and rotor inertia; friction: Coulomb and viscous;
offsets), with the covariance armid reports (rows' noise correlated by the filters, a variance per joint,
ident.fit.hac) beside the textbook s^2 (W'W)^-1. A right covariance gives mean 0 and spread 1. The same for the
physically consistent fit's base projection (--consistent N recordings) and the global payload method's
identified payload parameters (pairs of recordings k, k + 6: the same transport, clocking and noise, without and
with the payload).

Then the fleet's drift flag on unchanged arms (recordings k and k + sim.ensemble.CONFIGS: the same arm and
configuration, new noise) at 3 sigma against the nominal 0.27 %, and the time of `armid identify` at
N = 100 000 samples with each covariance.

    python benchmarks/bench_uncertainty.py [--count 200] [--seconds 6] [--workers 2] [--cache DIR] [--consistent 36]
    python benchmarks/bench_uncertainty.py --online 72

With --online N, only the online estimate (sim.ensemble.run_online: the recording streamed through
ident.online's estimator, its final estimate and reported std) over the first N recordings, per class, beside the
batch fit's z on the same recordings and the online std without the filter's row correlation.

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
from sim.transport_recording import CLOCKINGS, TRANSPORTS, rate_of  # noqa: E402

CLASSES = ("inertial", "friction", "offset")


def parameter_class(name: str) -> str:
    return "friction" if name.startswith(("fc", "fv")) else "offset" if name.startswith("offset") else "inertial"


PAIR_STEP = 6     # recordings k and k + 6: the same transport, clocking and noise, the payload toggled


def _run(args):
    k, seconds, consistent = args
    from ident.fit.batch import identify
    from ident.fit.consistent import consistent_fit

    model, base, traj = ensemble._setup("generic6")
    rec, truth = ensemble.recording(k, seconds)
    ident = identify(model, rec, trajectory=traj, base=base)
    fit = ident.fit
    sd = fit.std
    out = {"outcome": ensemble.Outcome(ensemble.config(k), fit.beta, sd, np.sqrt(np.diag(fit.covariance_textbook)),
                                       truth, fit.relative_std_pct, fit.covariance / np.outer(sd, sd))}
    if consistent:
        out["consistent"] = (consistent_fit(model, base, fit).beta - truth) / sd
    cfg = ensemble.config(k)
    if consistent and not cfg.payload:        # the payload run of the same configuration: the global method
        from ident.payload import payload_parameters
        from ident.payload.dynamic import identify as payload_identify

        from ident.fit.resample import mend_sampling

        loaded, _ = ensemble.recording(k + PAIR_STEP, seconds)
        # the payload methods take uniformly sampled runs: a logger's scattered stamps mended first, as the
        # batch pipeline mends them
        est = payload_identify(model, mend_sampling(loaded)[0], mend_sampling(rec)[0], "global", trajectory=traj)
        out["payload"] = (est.chi - payload_parameters(*ensemble.PAYLOAD)) / est.sigma
    return k, out


def outcomes_of(count: int, seconds: float, workers: int, cache: Path | None, consistent: int = 0) -> dict:
    found = {}
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        for k in range(count):
            f = cache / f"{k}-{seconds:g}s.pkl"
            if f.is_file():
                found[k] = pickle.loads(f.read_bytes())
    todo = [(k, seconds, k < consistent) for k in range(count) if k not in found]
    with mp.get_context("spawn").Pool(workers) as pool:
        for k, o in pool.imap_unordered(_run, todo):
            found[k] = o
            if cache is not None:
                (cache / f"{k}-{seconds:g}s.pkl").write_bytes(pickle.dumps(o))
    return {name: [found[k][name] for k in range(count) if name in found[k]]
            for name in ("outcome", "consistent", "payload")}


def calibration(outcomes, names) -> None:
    names = list(names)
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
    for transport in TRANSPORTS:
        for clock in CLOCKINGS:
            sub = [o for o in outcomes if o.config.clocking == clock and o.config.transport == transport]
            if not sub:
                continue
            z = np.array([o.z() for o in sub])
            print(f"z {transport}, {clock} ({len(sub)} recordings, {rate_of(transport, clock):g} Hz): mean "
                  f"{z.mean():+.3f}, spread {z.std():.3f} (reference: textbook spread "
                  f"{np.array([o.z(True) for o in sub]).std():.3f})")
    for payload in (False, True):
        sub = [o for o in outcomes if o.config.payload == payload]
        if not sub:
            continue
        z = np.array([o.z() for o in sub])
        print(f"z {'payload' if payload else 'no payload'} ({len(sub)} recordings): mean {z.mean():+.3f}, spread "
              f"{z.std():.3f} (reference: textbook spread {np.array([o.z(True) for o in sub]).std():.3f})")
    drive6 = [list(names).index(n) for n in ("Ia6", "fc6", "fv6", "offset6")]
    for transport in TRANSPORTS:
        z = np.array([o.z()[drive6] for o in outcomes if o.config.transport == transport])
        if not len(z):
            continue
        print(f"z joint 6 drive terms Ia6 fc6 fv6 offset6, {transport} ({len(z)}): mean "
              + " ".join(f"{m:+.2f}" for m in z.mean(axis=0)) + ", spread "
              + " ".join(f"{v:.2f}" for v in z.std(axis=0))
              + f" (reference: mean 0 +- {2 / np.sqrt(len(z)):.2f}, spread 1)")


def others(consistent: list, payload: list, names) -> None:
    """z of the consistent fit's base projection (the WLS std) and of the payload's identified parameters."""
    cls = np.array([parameter_class(n) for n in names])
    if consistent:
        z = np.array(consistent)
        for c in CLASSES:
            v = z[:, cls == c].ravel()
            print(f"z {c}, physically consistent fit ({(cls == c).sum()} x {len(z)}): mean {v.mean():+.3f}, spread "
                  f"{v.std():.3f} (reference: mean 0, spread 1)")
    if payload:
        z = np.concatenate([v[np.isfinite(v)] for v in payload])
        print(f"z payload parameters identified on their own, global method ({z.size} over {len(payload)} pairs): "
              f"mean {z.mean():+.3f}, spread {z.std():.3f} (reference: mean 0, spread 1)")


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
    # the covariance's own cost, timed apart over many repeats (the whole identification's time wanders by more
    # than the covariance adds on a loaded machine): the WLS step with each covariance on the same rows
    from ident.fit import estimate
    from ident.fit.batch import recording_rows

    rows = recording_rows(model, base, rec, bandwidth_hz=excitation.excitation_bandwidth(traj))
    K = rows.noise_correlation()
    step = {}
    for kind in ("textbook", "correlated") * 30:
        started = time.perf_counter()
        estimate.wls(rows.W, rows.y, rows.mask, names=base.names, segments=rows.segment_id, row_correlation=K,
                     covariance=kind)
        step[kind] = min(step.get(kind, np.inf), time.perf_counter() - started)
    added = step["correlated"] - step["textbook"]
    print(f"WLS step at N = {samples} ({len(rows.t)} rows), reported covariance: {step['correlated']:.3f} s "
          f"(reference: textbook {step['textbook']:.3f} s); the covariance adds {added:.3f} s to identify's "
          f"{best['textbook']:.3f} s: ratio {(best['textbook'] + added) / best['textbook']:.2f} x")


def _both(k: int):
    return ensemble.run_online(k), ensemble.run(k)


def online_calibration(count: int, workers: int) -> None:
    with mp.get_context("spawn").Pool(workers) as pool:
        pairs = pool.map(_both, range(count))
    online, batch = [p[0] for p in pairs], [p[1] for p in pairs]
    names = ensemble._setup("generic6")[1].names
    cls = np.array([parameter_class(n) for n in names])
    well = np.median([o.relative_std_pct for o in batch], axis=0) <= 10.0      # as the batch benchmark's
    zo, zb = np.array([o.z() for o in online]), np.array([o.z() for o in batch])
    zi = np.array([o.z(True) for o in online])
    for c in CLASSES:
        for which, sel in (("all", cls == c), ("well identified", (cls == c) & well)):
            v, b, i = zo[:, sel].ravel(), zb[:, sel].ravel(), zi[:, sel].ravel()
            print(f"z {c} ({which}, {sel.sum()} x {len(zo)}) online: mean {v.mean():+.3f}, spread {v.std():.3f} "
                  f"(reference: batch mean {b.mean():+.3f}, spread {b.std():.3f}; online with independent rows "
                  f"spread {i.std():.3f})")
    z2 = float(np.mean([np.mean(o.z() ** 2) for o in online]))
    print(f"mean z^2 over every parameter, online: {z2:.3f} (reference: 1 +- {ensemble.spread_band(online, 1):.3f}, "
          f"ratio {z2:.2f} x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--consistent", type=int, default=36,
                    help="the first N recordings also get the consistent fit, and the payload pairs among them")
    ap.add_argument("--online", type=int, default=0,
                    help="only the online estimate's z over the first N recordings, beside the batch fit's")
    a = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    if a.online:
        started = time.perf_counter()
        online_calibration(a.online, a.workers)
        print(f"{a.online} recordings of 6 s streamed online and identified in {time.perf_counter() - started:.0f} s")
        print(f"load average at end: {os.getloadavg()[0]:.2f}")
        return
    started = time.perf_counter()
    found = outcomes_of(a.count, a.seconds, a.workers, a.cache, a.consistent)
    outcomes = found["outcome"]
    print(f"{a.count} recordings of {a.seconds:g} s simulated and identified in {time.perf_counter() - started:.0f} s")
    names = ensemble._setup("generic6")[1].names
    calibration(outcomes, names)
    others(found["consistent"], found["payload"], names)
    fleet_rate(outcomes)
    identify_time()
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
