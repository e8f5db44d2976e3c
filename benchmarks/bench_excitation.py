"""Excitation design and preprocessing figures, each beside a reference measured in the same run.

Prints `name: value unit (reference: value unit, ratio x)`; run with `python benchmarks/bench_excitation.py`
(add `--quick` for fewer iterations). Ratio = reference / ours (above 1: ours is better).
- design: cond of the optimum for generic6 (6 harmonics of 0.1 Hz) against seed 000's Table 1 preset;
  time of the design with exact (chain-rule) gradients against SLSQP's own finite differences.
- preprocessing: prepare() on 30 000 samples x 6 joints against scipy.signal.sosfiltfilt column by column;
  decimate_parallel() on the (N, 6, 58) base regressor against scipy.signal.decimate (FIR) of each column.
"""
from __future__ import annotations

import sys
import time

import numpy as np
import scipy.signal

from ident.model import dynamics
from ident.fit import excitation, preprocess
from ident.model.base_params import base_parameters
from ident.model import load_model


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def line(name: str, value: float, unit: str, ref_name: str, ref: float) -> None:
    u = f" {unit}" if unit else ""
    print(f"{name}: {value:.4g}{u} (reference: {ref_name} {ref:.4g}{u}, ratio {ref / value:.2f}x)")


def bench_design(quick: bool) -> None:
    model = load_model("generic6")
    base = base_parameters(model)
    iters = 5 if quick else 20
    opts = dict(harmonics=6, base_frequency=0.1, seed=1, max_iter=iters, base=base)
    exact, t_exact = timed(lambda: excitation.design(model, **opts))
    numeric, t_numeric = timed(lambda: excitation.design(model, exact_gradients=False, **opts))
    preset = excitation.criteria(excitation.stacked_base_regressor(model, base, excitation.preset("seed000")))
    line("excitation cond, generic6, 6 harmonics of 0.1 Hz, at rest at both ends", exact.info["cond"], "",
         "seed 000 Table 1 preset (not at rest)", preset["cond"])
    line(f"excitation design time, {iters} SLSQP iterations, exact gradients", t_exact, "s",
         f"finite-difference gradients (reaching cond {numeric.info['cond']:.1f})", t_numeric)
    print(f"excitation design: cond {exact.info['cond']:.1f} with exact gradients, "
          f"{numeric.info['cond']:.1f} with finite differences, {exact.info['start_cond']:.1f} at the random start")


def bench_preprocess() -> None:
    N, n, rate = 30_000, 6, 1000.0
    traj = excitation.preset("seed000")
    t, q, qd, qdd = traj.sample(rate, periods=(N - 1) / (rate * traj.period))
    model = load_model("generic6")
    rng = np.random.default_rng(0)
    tau = dynamics.rnea(model, q, qd, qdd) + rng.normal(0, 0.1, q.shape)
    rec = preprocess.Recording(t, q + rng.normal(0, 1e-5, q.shape), tau, None, None, "bench")
    cutoff = preprocess.cutoff_for_bandwidth(excitation.excitation_bandwidth(traj), rate)

    def reference_filter():
        sos = scipy.signal.butter(4, cutoff, fs=rate, output="sos")
        cols = [scipy.signal.sosfiltfilt(sos, x) for x in np.concatenate([rec.q, rec.y], axis=1).T]
        return np.gradient(np.gradient(np.array(cols[:n]).T, t, axis=0), t, axis=0)

    prepare_s = min(timed(lambda: preprocess.prepare(rec, cutoff_hz=cutoff))[1] for _ in range(3))
    reference_s = min(timed(reference_filter)[1] for _ in range(3))
    line(f"prepare (filter q and tau, differentiate), {N} samples x {n} joints", 1e3 * prepare_s, "ms",
         "scipy.signal.sosfiltfilt per column + numpy.gradient", 1e3 * reference_s)

    s = preprocess.prepare(rec, cutoff_hz=cutoff)
    base = base_parameters(model)
    W = base.regressor(dynamics.regressor(model, s.q, s.qd, s.qdd))
    factor = 10
    ours = min(timed(lambda: preprocess.decimate_parallel(W, s.y, factor))[1] for _ in range(3))

    def reference_decimate():
        flat = W.reshape(W.shape[0], -1)
        return [scipy.signal.decimate(flat[:, c], factor, ftype="fir", zero_phase=True) for c in range(flat.shape[1])]

    reference = min(timed(reference_decimate)[1] for _ in range(2))
    line(f"decimate_parallel by {factor}, W {W.shape} and y", 1e3 * ours, "ms",
         "scipy.signal.decimate (FIR) column by column", 1e3 * reference)


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    bench_preprocess()
    bench_design(quick)
