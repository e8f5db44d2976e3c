"""Payload identification: every method on the seeds' scenarios, beside the seeds' published numbers.

Rows: the methods (seed 000's parameter difference, torque and global methods; seed 001's torque balance;
our static method). Columns: the scenarios (seed 000's 1.5 kg and 3 kg payloads; seed 001's simulation
and its experiment as a scenario). Each cell: mass error, CoM error, identification time, and the seed's
figure for that cell. The reference measured in the same run: one ordinary least-squares solve
(numpy.linalg.lstsq) of the same size as the global method's, so the time column reads as a ratio.

usage: python benchmarks/bench_payload.py
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import payload_seed000  # noqa: E402
import payload_seed001  # noqa: E402


def reference_seconds(rows: int = 60000, cols: int = 70, repeats: int = 5) -> float:
    """Best time of a dense least-squares solve of rows x cols (about the global method's stacked system)."""
    rng = np.random.default_rng(0)
    A, b = rng.standard_normal((rows, cols)), rng.standard_normal(rows)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.linalg.lstsq(A, b, rcond=None)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    rows = payload_seed000.rows() + payload_seed001.rows()
    ref = reference_seconds()
    for r in rows:
        print(r.line() + f" (reference: numpy lstsq 60000x70 {ref * 1e3:.1f} ms, ratio {r.seconds / ref:.2f}x)")
    scenarios = list(dict.fromkeys(r.scenario for r in rows))
    methods = list(dict.fromkeys(r.method for r in rows))
    cell = {(r.method, r.scenario): r for r in rows}
    width = 34
    print("\n" + f"{'method':>15} | " + " | ".join(f"{s:^{width}}" for s in scenarios))
    for m in methods:
        parts = []
        for s in scenarios:
            r = cell.get((m, s))
            parts.append(f"{'':^{width}}" if r is None else
                         f"{r.mass_error_kg:.4f} kg {r.com_error_mm:7.3f} mm {r.seconds * 1e3:6.0f} ms".center(width))
        print(f"{m:>15} | " + " | ".join(parts))
        pub = [cell[(m, s)].published if (m, s) in cell else "" for s in scenarios]
        if any(pub):
            print(f"{'(published)':>15} | " + " | ".join(f"{p:^{width}}" for p in pub))


if __name__ == "__main__":
    main()
