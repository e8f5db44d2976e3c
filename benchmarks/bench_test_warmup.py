"""The test session's kernel warm-up (tests/warm_kernels.py), beside a reference measured in the same run.

Ours: the simulator's and the driver's kernels in one process while a second process compiles the planning's and
identification's, as tests/conftest.py does before the first test. Reference: the same two halves one after the
other in one process. Each on a cold numba cache of its own (a fresh NUMBA_CACHE_DIR: a fresh checkout's first
run), then again on that now warm cache (every later run). Only the machine's free cores make ours faster: on a
loaded machine the ratio shrinks towards 1.

Prints `name: value unit (reference: value unit, ratio x)`; run with `python benchmarks/bench_test_warmup.py`.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEQUENTIAL = "import warm_kernels as w; w.warm_here(); w.warm_helper_half()"
SHARED = ("import warm_kernels as w; h = w.start_helper(); w.warm_here(); done, said = w.finish_helper(h); "
          "assert done, said")


def timed(code: str, cache: str) -> float:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH")))))
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, timeout=3600)
    return time.perf_counter() - started


def main() -> None:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-warmup-") as folder:
        reference, ours = Path(folder, "sequential"), Path(folder, "shared")
        figures = {}
        for state in ("cold cache", "warm cache"):
            ref = timed(SEQUENTIAL, str(reference))
            got = timed(SHARED, str(ours))
            figures[state] = (got, ref)
        print(f"cpus: {os.cpu_count()}, load average before: {load:.2f}")
        for state, (got, ref) in figures.items():
            print(f"test warm-up, {state}: {got:.1f} s (reference: {ref:.1f} s one process, ratio {ref / got:.2f}x)")


if __name__ == "__main__":
    main()
