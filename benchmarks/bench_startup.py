"""Start-up cost of a fresh install: numba compiling its kernels (cold cache) against loading them (warm).

Prints `name: value unit (reference: value unit, ratio x)`; run with `python benchmarks/bench_startup.py`.

- `armid identify` on data like the demo's (seed 000's excitation, a quarter period plus the 2 s blends in and
  out, and its time-reversed validation run, simulated at 1 kHz), with the demo's options (--consistent,
  --compare); as its own process, in a fresh NUMBA_CACHE_DIR (cold), then again in the same one (warm).
- `armid driver` on serial at 1 kHz (`armid sim --transport serial` in a process of its own, with its own,
  warm cache), from its start until its first state message on the stream, cold and warm in the same way.
The cold overhead (cold - warm) of the demo's identify step has a target of 10 s.
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

TARGET_OVERHEAD_S = 10.0
TIMEOUT_S = 900.0


def line(name: str, value: float, unit: str, ref_name: str, ref: float) -> str:
    return f"{name}: {value:.2f} {unit} (reference: {ref_name} {ref:.2f} {unit}, ratio {value / ref:.2f} x)"


def make_data(folder: Path) -> tuple[Path, Path]:
    """excitation.npz and validation.npz as the demo writes them (simulated in this process)."""
    from armid.commands.demo import LEAD_IN, time_reversed
    from ident.fit import excitation
    from ident.model import load_model
    from sim.recording import simulate

    model = load_model("generic6")
    traj = excitation.preset("seed000")
    seconds = 0.25 * traj.period + 2 * LEAD_IN
    paths = []
    for name, motion, seed in (("excitation", traj, 0), ("validation", time_reversed(traj), 1)):
        rec = simulate(model, motion, seconds, seed=seed)
        path = folder / f"{name}.npz"
        np.savez(path, t=rec.t, q=rec.q, tau=rec.tau, effort_delay=rec.effort_delay)
        paths.append(path)
    return paths[0], paths[1]


def armid(args: list[str], cache: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    return subprocess.Popen([sys.executable, "-m", "armid.cli", *args], env=env, stdin=subprocess.DEVNULL, **kw)


def compiled(stderr: str) -> str:
    """The kernels a run compiled, from armid.jit's lines: "name 12.3 s, ..." (or "none")."""
    found = re.findall(r"armid: compiled (\S+) in ([\d.]+) s", stderr)
    return ", ".join(f"{name} {seconds} s" for name, seconds in found) or "none"


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that have ended."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def time_identify(data: tuple[Path, Path], out: Path, cache: Path) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds and the kernels compiled of one `armid identify` with the demo's options."""
    excitation, validation = data
    cpu = children_cpu()
    started = time.perf_counter()
    proc = armid(["identify", str(excitation), "--validate", str(validation), "--model", "generic6", "-o", str(out),
                  "--trajectory", "seed000", "--consistent", "--slow", "0.2", "--compare", "generic6", "--quiet"],
                 cache, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    if proc.returncode != 0:
        raise SystemExit(f"armid identify failed ({proc.returncode}): {err[-2000:]}")
    return time.perf_counter() - started, children_cpu() - cpu, compiled(err)


def start_sim(folder: Path) -> tuple[subprocess.Popen, dict]:
    """`armid sim --transport serial` as the demo's chain runs it (its own numba cache: the default one, not
    measured), and the driver's transport options from its ready line."""
    from armid import chain

    plan = chain.PLANS["serial"]
    log = open(folder / "sim.err", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "armid.cli", "sim", "--transport", "serial", "--realtime",
                             "--rate", f"{plan.sim_rate_hz:g}", *plan.sim_args], stdout=subprocess.PIPE, stderr=log,
                            stdin=subprocess.DEVNULL, text=True)
    deadline = time.perf_counter() + TIMEOUT_S
    for text in proc.stdout:
        if " ready: " in text:
            return proc, {**chain.transport_options("serial", text), **dict(plan.driver_options)}
        if time.perf_counter() > deadline:
            break
    stop(proc)
    raise SystemExit(f"armid sim did not start: {(folder / 'sim.err').read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def time_driver(folder: Path, cache: Path) -> tuple[float, str]:
    """Seconds from starting `armid driver` (serial, 1 kHz, the simulator in a process of its own) to its
    first state message, and the kernels it compiled."""
    from armid import chain
    from firmware_bridge import stream

    sim, options = start_sim(folder)
    state, commands = f"ipc://{folder}/state", f"ipc://{folder}/commands"
    config = folder / "driver.toml"
    plan = chain.PLANS["serial"]
    config.write_text(chain.driver_config("serial", options, rate_hz=plan.rate_hz, watchdog_ms=plan.watchdog_ms,
                                          state=state, commands=commands, clock=plan.clock))
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(state)
    log = open(folder / "driver.err", "wb")
    started = time.perf_counter()
    proc = armid(["driver", "--config", str(config)], cache, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = started + TIMEOUT_S
        while time.perf_counter() < deadline:
            if sub.poll(50):
                parts = sub.recv_multipart()
                if parts[0] == stream.TOPIC_STATE:
                    stream.decode_state(parts[1])
                    seconds = time.perf_counter() - started
                    time.sleep(1.0)        # the kernels of the first commands compile right after
                    return seconds, compiled((folder / "driver.err").read_text(errors="replace"))
            if proc.poll() is not None:
                break
        raise SystemExit(f"armid driver sent no state message: {(folder / 'driver.err').read_text()[-2000:]}")
    finally:
        stop(proc)
        stop(sim)
        log.close()
        sub.close(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-driver", action="store_true", help="only the identify figures")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench_startup_"))
    try:
        data = make_data(folder)
        cache = folder / "numba-cache"
        print(f"# load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
        cold, cold_cpu, kernels = time_identify(data, folder / "cold", cache)
        warm, warm_cpu, again = time_identify(data, folder / "warm", cache)
        print(f"# identify compiled (cold): {kernels}; (warm): {again}", flush=True)
        print(line("armid identify (demo data), cold numba cache", cold, "s", "warm cache", warm), flush=True)
        print(line("armid identify (demo data) CPU time, cold numba cache", cold_cpu, "s", "warm cache", warm_cpu),
              flush=True)
        print(line("armid identify cold overhead", cold - warm, "s", "target", TARGET_OVERHEAD_S), flush=True)
        print(line("armid identify cold overhead in CPU time (what an idle core takes)", cold_cpu - warm_cpu, "s",
                   "target", TARGET_OVERHEAD_S), flush=True)
        if not args.skip_driver:
            cache = folder / "numba-cache-driver"
            runs = []
            for name in ("cold", "warm"):
                (folder / name / "driver").mkdir(parents=True)
                runs.append(time_driver(folder / name / "driver", cache))
            print(f"# driver compiled (cold): {runs[0][1]}; (warm): {runs[1][1]}", flush=True)
            print(line("armid driver start to first state message, cold numba cache", runs[0][0], "s", "warm cache",
                       runs[1][0]), flush=True)
        print(f"# load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
