"""Logging's cost in a loop that sees a flood of bad events (a bad frame or a stale cycle every call).

It prints, per event, in one run:
  - Throttle.hit between two lines (the flood's usual case: counted, no record), beside a bare counter
    increment (reference);
  - one logged line per event through armid.logs' set-up (the queue to the writer thread, JSON, stderr
    sent to /dev/null), what an unthrottled flood would cost, beside Throttle.hit (reference).

usage: python benchmarks/bench_logging.py [--events 200000]
"""
from __future__ import annotations

import argparse
import logging
import os
import time

from armid import logs
from firmware_bridge.runtime.log_throttle import Throttle


def _per_event_ns(fn, n: int) -> float:
    t0 = time.perf_counter()
    fn(n)
    return (time.perf_counter() - t0) / n * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    n = ap.parse_args().events
    log = logging.getLogger("bench.logging")
    with open(os.devnull, "w") as sink:
        logs.configure("INFO", "json", stream=sink, environ={})
        try:
            throttle = Throttle(log, logging.WARNING, interval_s=3600.0)
            throttle.hit("frame dropped (%s)", "crc")       # the first line goes out; the rest are counted

            def counted(k):
                c = 0
                for _ in range(k):
                    c += 1

            def throttled(k):
                hit = throttle.hit
                for _ in range(k):
                    hit("frame dropped (%s)", "crc")

            def logged(k):
                warn = log.warning
                for _ in range(k):
                    warn("frame dropped (%s)", "crc")

            ref = _per_event_ns(counted, n)
            hit = _per_event_ns(throttled, n)
            line = _per_event_ns(logged, max(1, n // 10))
        finally:
            logs.shutdown()
    print(f"throttled event: {hit:.0f} ns (reference: counter increment {ref:.0f} ns, ratio {hit / ref:.1f}x)")
    print(f"logged line per event: {line:.0f} ns (reference: throttled event {hit:.0f} ns, ratio {line / hit:.1f}x)")


if __name__ == "__main__":
    main()
