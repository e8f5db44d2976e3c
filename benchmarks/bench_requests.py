"""Request decoding and driver start-up benchmark, in one process:
  - decoding the test suite's hostile request corpus (tests/hostile_requests.py) with decode_request, beside
    the same with the nesting measured by the regular expression alone (the reference: how it was measured
    before the vectorised path), as CPU time;
  - Driver start and stop on the in-process simulator, with a planner process started ahead
    (driver.planner.keep_spare) beside without one (the reference), as wall time.

usage: python benchmarks/bench_requests.py [--requests 20000] [--starts 4]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from firmware_bridge.runtime import json_requests  # noqa: E402


def _regex_depth(raw: bytes) -> int:
    skeleton = json_requests._STRINGS.sub(b'""', raw)
    if not skeleton:
        return 0
    return int(np.cumsum(json_requests._OPEN[np.frombuffer(skeleton, np.uint8)], dtype=np.int64).max(initial=0))


def _decode_cpu(corpus, repeats: int = 2) -> float:
    from driver.requests import RequestError, decode_request

    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for raw in corpus:
            try:
                decode_request(raw)
            except RequestError:
                pass
        best = min(best, time.process_time() - started)
    return best


def _starts(count: int, spare: bool) -> float:
    from driver.planner import keep_spare
    from ident.model import load_model
    from local_driver import local_driver

    model = load_model("generic6")
    keep_spare(spare)
    try:
        if spare:
            time.sleep(3.0)             # the first spare loads as a test run's first tests would run meanwhile
        started = time.perf_counter()
        for _ in range(count):
            with local_driver(model):
                time.sleep(0.5)         # a short test's own work
        return (time.perf_counter() - started) / count
    finally:
        keep_spare(False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--starts", type=int, default=4)
    args = ap.parse_args()
    from hostile_requests import hostile_requests

    corpus = list(hostile_requests(6, args.requests, seed=11))
    fast = _decode_cpu(corpus)
    vectorised = json_requests.nesting_depth
    json_requests.nesting_depth = _regex_depth
    try:
        slow = _decode_cpu(corpus)
    finally:
        json_requests.nesting_depth = vectorised
    print(f"decode {args.requests} hostile requests: {fast:.2f} s CPU (reference: regex nesting {slow:.2f} s CPU, "
          f"ratio {slow / fast:.1f} x)")
    with_spare = _starts(args.starts, True)
    without = _starts(args.starts, False)
    print(f"driver start + 0.5 s + stop, planner started ahead: {with_spare:.2f} s (reference: without "
          f"{without:.2f} s, ratio {without / with_spare:.1f} x)")


if __name__ == "__main__":
    main()
