"""Simulator timing: real-time lateness at 1 kHz, and fast-mode speed.

Prints `name: value unit (reference: value unit, ratio x)`; run with `python benchmarks/bench_sim.py [seconds]`.
  * realtime lateness p50/p99/max: the Simulator's own cycle thread at 1 kHz for `seconds` (default 5), the six
    drives enabled in CSP and following a moving target; reference: the same clock loop with an empty step
    body. ratio = ours / reference (1.0 means the simulation adds nothing to the lateness).
  * fast mode: simulated seconds per wall second of the free-running cycle thread (whole simulator: drives,
    plant with RK4 substeps, sensors, publication); reference: a plain Python loop of
    ident.model.dynamics.forward_dynamics on one sample, counted as one 1 ms step per call. ratio = ours / reference.
  * the plant alone (one 1 ms period, RK4 with the default substeps), per cycle.
"""
from __future__ import annotations

import sys
import threading
import time

import numpy as np

from firmware_bridge import cia402
from firmware_bridge.cia402 import Mode
from ident.model import dynamics
from ident.model import load_model
from sim import Simulator
from sim.clock import RealtimeClock

Q0 = [0.0, 0.3, -0.5, 0.2, 0.4, 0.1]


def report(name: str, value: float, unit: str, ref_name: str, ref: float) -> None:
    ratio = value / ref if ref else float("inf")
    print(f"{name}: {value:.3f} {unit} (reference: {ref_name} {ref:.3f} {unit}, ratio {ratio:.2f}x)")


def enable_csp(sim: Simulator) -> None:
    n = sim.n
    sim.set_commands(mode=np.full(n, int(Mode.CSP)), target_position=sim.read_state().position,
                     controlword=np.full(n, cia402.CW_SHUTDOWN))
    sim.wait_cycles(3, timeout=10)
    sim.set_commands(controlword=np.full(n, cia402.CW_ENABLE_OPERATION))
    sim.wait_cycles(3, timeout=10)


def move_while(sim: Simulator, seconds: float) -> None:
    """A host stand-in: a 0.5 Hz sine target on every joint, written every millisecond or so."""
    q0 = np.array(Q0)
    t0 = time.perf_counter()
    while (t := time.perf_counter() - t0) < seconds:
        sim.set_commands(target_position=q0 + 0.2 * np.sin(2 * np.pi * 0.5 * t))
        time.sleep(0.001)


def realtime_lateness(model, seconds: float):
    sim = Simulator(model, realtime=True, q0=Q0)
    sim.start()
    try:
        enable_csp(sim)
        move_while(sim, seconds)
    finally:
        sim.stop()
    return sim.lateness(), sim.read_state()


def empty_loop_lateness(seconds: float):
    clock = RealtimeClock(1000.0)
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    clock.start()
    while not stop.is_set():
        clock.wait()
    return clock.stats()


def fast_mode_speed(model, seconds: float) -> float:
    sim = Simulator(model, q0=Q0)
    sim.start()
    try:
        enable_csp(sim)
        c0, t0 = sim.read_state().cycle, time.perf_counter()
        move_while(sim, seconds)
        c1, t1 = sim.read_state().cycle, time.perf_counter()
    finally:
        sim.stop()
    return (c1 - c0) * sim.dt / (t1 - t0)


def forward_dynamics_loop_speed(model, seconds: float) -> float:
    q, qd, tau = np.array(Q0), np.zeros(model.n), np.zeros(model.n)
    dynamics.forward_dynamics(model, q, qd, tau)
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(100):
            dynamics.forward_dynamics(model, q, qd, tau)
        calls += 100
    return calls * 1e-3 / (time.perf_counter() - t0)


def plant_cycle_us(model, cycles: int = 5000) -> tuple[float, int]:
    sim = Simulator(model, q0=Q0)
    plant = sim.plant
    plant.brake[:] = False
    tau = np.zeros(model.n)
    plant.advance(tau)
    t0 = time.perf_counter()
    for _ in range(cycles):
        plant.advance(tau)
    return (time.perf_counter() - t0) / cycles * 1e6, plant.substeps


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    model = load_model("generic6")
    Simulator(model).step(10)  # compile / load the numba caches before timing
    ours, final = realtime_lateness(model, seconds)
    ref = empty_loop_lateness(seconds)
    states = {s.name for s in final.states() if s is not None}
    print(f"# realtime: {ours.count} cycles in {seconds:g} s, drives {', '.join(sorted(states))}, "
          f"caught up {ours.caught_up} ticks, rebased {ours.rebased} ({ours.skipped} ticks skipped); "
          f"reference {ref.count} ticks")
    report("realtime lateness p50 at 1 kHz", ours.p50 * 1e6, "us", "empty loop", ref.p50 * 1e6)
    report("realtime lateness p99 at 1 kHz", ours.p99 * 1e6, "us", "empty loop", ref.p99 * 1e6)
    report("realtime lateness max at 1 kHz", ours.max * 1e6, "us", "empty loop", ref.max * 1e6)
    fast = fast_mode_speed(model, min(seconds, 3.0))
    fd = forward_dynamics_loop_speed(model, min(seconds, 2.0))
    report("fast mode", fast, "sim s/wall s", "forward_dynamics loop, 1 call per 1 ms step", fd)
    us, substeps = plant_cycle_us(model)
    print(f"plant advance, RK4 x {substeps} substeps: {us:.1f} us/cycle "
          f"(reference: forward_dynamics call {1e3 / fd:.1f} us, ratio {us / (1e3 / fd):.2f}x)")


if __name__ == "__main__":
    main()
