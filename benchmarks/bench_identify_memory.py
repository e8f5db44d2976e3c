"""Peak memory and time of `armid identify` on long recordings, beside a reference identify run in the same script.

Prints `name: value unit (reference: value unit, ratio x)`; run with
`python benchmarks/bench_identify_memory.py [--samples 100000 1000000] [--reference /path/to/armid]`.

The recording: generic6 (58 base parameters) running seed 000's excitation at 1 kHz, its exact torques plus
noise, as NPZ. Each run is a child process `armid identify DATA --model generic6 --trajectory seed000 --slow 0.2
-o DIR --quiet` (this checkout's with `--no-report`; every option that sets the rows is given, so that both fit
the same rows); its peak resident memory is the child's own ru_maxrss (os.wait4), its time the wall clock of the
whole command. The reference is another installation's `armid` (default: the main checkout's,
/work/main/.venv/bin/armid), which builds the full standard regressor and a copy of its base columns and always
writes the report: beside the commands' times, the sums of their result.json's step times (reading to
validation, no report) are compared. A run whose estimated peak would not fit in the memory available now is
skipped, and the script says so: the machine has 24 GiB, shared.

A third figure: reading a 294 000-row CSV recording (load_recording: pyarrow's reader) against numpy's loadtxt
on the same file, CPU seconds of this process.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ident.model import dynamics
from ident.fit import excitation, preprocess
from ident.model import load_model

RATE = 1000.0
NOISE = 0.05
HERE_ARMID = Path(sys.executable).with_name("armid")
MAIN_ARMID = Path("/work/main/.venv/bin/armid")


def line(name: str, value: float, unit: str, ref: float, ref_label: str = "") -> None:
    ratio = ref / value if value > 0 else float("nan")
    label = f", {ref_label}" if ref_label else ""
    print(f"{name}: {value:.3g} {unit} (reference: {ref:.3g} {unit}{label}, ratio {ratio:.2f}x)", flush=True)


def recording(folder: Path, N: int) -> Path:
    """N samples of seed000 at RATE with exact torques plus noise, as NPZ."""
    model = load_model("generic6")
    traj = excitation.preset("seed000")
    t = np.arange(N) / RATE
    q, qd, qdd = traj.evaluate(t)
    tau = dynamics.rnea(model, q, qd, qdd) + np.random.default_rng(0).normal(0, NOISE, q.shape)
    path = folder / f"run_{N}.npz"
    np.savez(path, t=t, q=q, tau=tau)
    return path


def available_bytes() -> int:
    for row in Path("/proc/meminfo").read_text().splitlines():
        if row.startswith("MemAvailable:"):
            return int(row.split()[1]) * 1024
    return 0


def full_regressor_bytes(N: int, n: int = 6, b: int = 58) -> int:
    """What building the full standard regressor and its base columns at once holds: (14 n + b) n doubles per
    sample, plus the decimation's output and the recording."""
    return int(N * n * (14 * n + b) * 8 * 1.3)


def run(armid: Path, data: Path, out: Path, extra: list[str]) -> tuple[float, float, dict]:
    """(wall seconds, peak RSS in MiB, result.json) of one `armid identify` child process."""
    argv = [str(armid), "identify", str(data), "--model", "generic6", "--trajectory", "seed000", "--slow", "0.2",
            "-o", str(out), "--quiet", *extra]
    env = dict(os.environ, OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"))
    started = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    err = child.stderr.read().decode(errors="replace")
    child.stderr.close()
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {child.returncode}: {err.strip()[-400:]}")
    return wall, usage.ru_maxrss / 1024.0, json.loads((out / "result.json").read_text())


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def csv_figure(folder: Path, rows: int = 294_000) -> None:
    rng = np.random.default_rng(1)
    n = 6
    data = np.column_stack([np.arange(rows) / RATE, rng.normal(size=(rows, 2 * n))])
    header = ",".join(["t"] + [f"q{j + 1}" for j in range(n)] + [f"tau{j + 1}" for j in range(n)])
    path = folder / "long.csv"
    np.savetxt(path, data, delimiter=",", header=header, comments="", fmt="%.17g")
    started = cpu()
    rec = preprocess.load_recording(path)
    ours = cpu() - started
    started = cpu()
    ref = np.loadtxt(path, delimiter=",", comments="#", skiprows=1, ndmin=2)
    theirs = cpu() - started
    assert np.array_equal(rec.q, ref[:, 1:n + 1])
    line(f"read a {rows}-row CSV recording (load_recording)", ours, "s CPU", theirs, "numpy loadtxt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--reference", type=Path, default=MAIN_ARMID, help="the reference installation's armid")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench_identify_memory_"))
    print(f"armid identify, generic6, seed000 at {RATE:g} Hz; this checkout: {HERE_ARMID}; reference: "
          f"{args.reference}", flush=True)
    for N in args.samples:
        data = recording(folder, N)
        ours = run(HERE_ARMID, data, folder / f"ours_{N}", ["--no-report"])
        reference = None
        need = full_regressor_bytes(N)
        if not args.reference.exists():
            print(f"N = {N}: no reference run ({args.reference} does not exist)")
        elif need > 0.8 * available_bytes():
            print(f"N = {N}: reference run skipped: it needs about {need / 2**30:.1f} GiB, "
                  f"{available_bytes() / 2**30:.1f} GiB are available now")
        else:
            reference = run(args.reference, data, folder / f"ref_{N}", [])
        steps = ", ".join(f"{k} {v:.2f}" for k, v in ours[2]["seconds"].items())
        print(f"N = {N}: steps (s): {steps}", flush=True)
        if reference is None:
            print(f"identify N = {N} peak memory: {ours[1]:.0f} MiB; time {ours[0]:.2f} s")
            continue
        line(f"identify N = {N} peak memory", ours[1], "MiB", reference[1], "full regressor")
        line(f"identify N = {N} time", ours[0], "s", reference[0], "full regressor, with its report")
        line(f"identify N = {N} steps", sum(ours[2]["seconds"].values()), "s",
             sum(v for k, v in reference[2]["seconds"].items() if k != "report"), "full regressor")
        ours_rows, ref_rows = ours[2]["base_parameters"], reference[2]["base_parameters"]
        apart = max(abs(p["value"] - r["value"]) / p["std"] for p, r in zip(ours_rows, ref_rows) if p["std"])
        print(f"N = {N}: base parameters apart from the reference's by at most {apart:.3g} of their sigma", flush=True)
    csv_figure(folder)


if __name__ == "__main__":
    main()
