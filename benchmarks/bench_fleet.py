"""Many recordings on Dask against a plain loop, in one run.

Prints `name: value unit (reference: value unit, ratio x)`; run with `python benchmarks/bench_fleet.py
[--count 50] [--seconds 30] [--workers N]`. The recordings: generic6 on seed 000's excitation at 1 kHz, torques
from the model's inverse dynamics with noise, written as NPZ; --count recordings of --seconds each, as arms x 5
nightly runs. Both paths run ident.outputs.fleet.identify_many (result.json per recording and the fleet table; the fleet
report, the same work after either path, is timed apart): the reference is its plain loop (scheduler "serial") in this process, the figure a
dask.distributed LocalCluster with one single-threaded worker process per core. The cluster's start-up (worker
processes importing armid and loading the numba kernels) is printed apart. Peak memory: the largest peak RSS of
the workers, against this process's peak after the plain loop.
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from ident.model import dynamics  # noqa: E402
from ident.fit import excitation
from ident.outputs import fleet
from ident.outputs.fleet_report import write_fleet_report  # noqa: E402
from ident.model import load_model  # noqa: E402

RATE = 1000.0
NOISE = 0.02
RUNS_PER_ARM = 5


def write_recordings(folder: Path, count: int, seconds: float) -> list[fleet.Job]:
    model = load_model("generic6")
    traj = excitation.preset("seed000")
    t = np.arange(int(seconds * RATE)) / RATE
    q, qd, qdd = traj.evaluate(t)
    clean = dynamics.rnea(model, q, qd, qdd)
    jobs = []
    for k in range(count):
        arm, run = divmod(k, RUNS_PER_ARM)
        path = folder / f"arm{arm}" / f"night{run}.npz"
        path.parent.mkdir(exist_ok=True)
        np.savez(path, t=t, q=q, tau=clean + np.random.default_rng(k).normal(0, NOISE, clean.shape))
        jobs.append(fleet.Job(f"arm{arm}", "generic6", str(path), date=f"2026-03-{run + 1:02d}"))
    return jobs


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=50)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    load = os.getloadavg()[0]
    from distributed import Client

    options = {"trajectory": excitation.preset("seed000")}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        jobs = write_recordings(folder, args.count, args.seconds)
        fleet.identify_job(jobs[0], folder / "warm", options)         # the kernels loaded before the timing
        started, cpu0 = time.perf_counter(), cpu_s()
        serial = fleet.identify_many(jobs, folder / "serial", options, scheduler="serial", progress=False,
                                     report=False)
        loop_s = time.perf_counter() - started
        loop_cpu = cpu_s() - cpu0
        loop_mb = peak_rss_mb()
        started = time.perf_counter()
        with fleet.local_cluster(args.workers) as cluster, \
                Client(cluster) as client:
            client.run(lambda: load_model("generic6") and None)
            client.run(fleet.identify_job, jobs[0], str(folder / "warm"), options)   # each worker warm
            startup_s = time.perf_counter() - started
            workers_cpu0 = sum(client.run(cpu_s).values())
            started, cpu0 = time.perf_counter(), cpu_s()
            dask = fleet.identify_many(jobs, folder / "dask", options, client=client, progress=False, report=False)
            dask_s = time.perf_counter() - started
            dask_cpu = sum(client.run(cpu_s).values()) - workers_cpu0 + cpu_s() - cpu0
            worker_mb = max(client.run(peak_rss_mb).values())
        started = time.perf_counter()
        write_fleet_report(serial.rows, folder / "serial")
        report_s = time.perf_counter() - started
        same = all(a.get("ZZR1") == b.get("ZZR1") and a.get("fc2") == b.get("fc2")
                   for a, b in zip(serial.rows, dask.rows))
    n = args.count
    per_min = lambda s: 60.0 * n / s      # noqa: E731
    print(f"# {n} recordings of {args.seconds:g} s at {RATE:g} Hz (generic6, 58 base parameters); "
          f"{args.workers} workers, {os.cpu_count()} cores; failures {len(serial.failures)} / {len(dask.failures)}; "
          f"same results: {same}", file=sys.stderr)
    print(f"fleet recordings per minute, local cluster: {per_min(dask_s):.1f} rec/min "
          f"(reference: plain loop {per_min(loop_s):.1f} rec/min, ratio {loop_s / dask_s:.2f}x)")
    print(f"fleet recordings per minute, local cluster with its start-up: {per_min(dask_s + startup_s):.1f} rec/min "
          f"(reference: plain loop {per_min(loop_s):.1f} rec/min, ratio {loop_s / (dask_s + startup_s):.2f}x)")
    print(f"fleet cluster start-up ({args.workers} workers, kernels loaded): {startup_s:.2f} s "
          f"(reference: one recording in the loop {loop_s / n:.2f} s, ratio {startup_s / (loop_s / n):.2f}x)")
    print(f"fleet CPU time per recording, local cluster (workers + scheduler and client): {dask_cpu / n:.3f} s "
          f"(reference: plain loop {loop_cpu / n:.3f} s, ratio {dask_cpu / loop_cpu:.2f}x)")
    print(f"# load average before the run: {load:.2f} on {os.cpu_count()} cores", file=sys.stderr)
    print(f"fleet report (58 parameter plots, {n} runs): {report_s:.2f} s (reference: the plain loop's "
          f"identifications {loop_s:.2f} s, ratio {report_s / loop_s:.2f}x)")
    print(f"fleet peak memory per worker: {worker_mb:.0f} MB (reference: the plain loop's process {loop_mb:.0f} MB, "
          f"ratio {worker_mb / loop_mb:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
