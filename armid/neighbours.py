"""Other real-time work beside a chain under test, started and stopped by its user (a test, a benchmark), as
../shared/tools/busy-neighbours does by hand: other free-running serial chains (a simulator and a driver each,
moving back and forth) and processes that wake every millisecond and compute for 0.6 ms."""
from __future__ import annotations

import functools
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from armid import chain

TICKER = """
import time
end = time.monotonic() + float(__import__('sys').argv[1])
while time.monotonic() < end:               # wake every millisecond, compute 0.6 ms (../shared/tools/busy-neighbours)
    t = time.perf_counter() + 0.0006
    while time.perf_counter() < t:
        pass
    time.sleep(0.0004)
"""


class Neighbours:
    """Other real-time work for a test, started and stopped by it: `chains` other free-running serial chains (a
    simulator and a driver each, moving back and forth) and `tickers` processes that wake every millisecond and
    compute for 0.6 ms (at the default priority, as other control software on the machine)."""

    def __init__(self, workdir, chains: int = 1, tickers: int = 2, seconds: float = 600.0, goal=None,
                 realtime: bool = True):
        self.goal = np.full(6, 0.2) if goal is None else np.asarray(goal, dtype=float)
        self.runs, self.tickers, self._stop = [], [], threading.Event()
        self._threads = []
        try:
            for k in range(chains):
                run = chain.Chain(Path(workdir) / f"neighbour-{k}", chain.plan_for("serial", clocking="free"),
                                  realtime=realtime, relay_compiles=False).__enter__()
                self.runs.append(run)
                run.start_sim(seed=10 + k)
                run.start_driver()
                run.enable()
                t = threading.Thread(target=self._move, args=(run,), daemon=True)
                t.start()
                self._threads.append(t)
            for _ in range(tickers):
                self.tickers.append(subprocess.Popen([sys.executable, "-c", TICKER, str(seconds)],
                                                     preexec_fn=functools.partial(chain._child_setup, 0, False)))
        except BaseException:
            self.stop()
            raise

    def _move(self, run) -> None:
        k = 0
        while not self._stop.is_set():
            try:
                reply = chain.request(run.commands, 30.0, cmd="move_to", q=list(self.goal * (0.5 if k % 2 else -0.5)), speed=0.8)
                k += 1
                self._stop.wait(float(reply.get("duration", 1.0)) + 0.2)
            except chain.ChainError:
                self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(40)
        for p in self.tickers:
            p.terminate()
        for p in self.tickers:
            try:
                p.wait(5)
            except Exception:  # noqa: BLE001 - it goes either way
                p.kill()
                p.wait(5)
        for run in reversed(self.runs):
            run.stop()


