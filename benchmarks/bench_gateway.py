"""Modbus TCP gateway: process-image round trips per second, and the cost of the image update per cycle.

Prints `name: value unit (reference: value unit, ratio x)`; run with `python benchmarks/bench_gateway.py [seconds]`.
  * round trip: a pymodbus sync client on 127.0.0.1 reads the whole input image (80 registers, function 4)
    and writes the whole output image (38 registers, function 16) of the 6-drive arm, as a host does each
    cycle, for `seconds` (default 5) per set-up, in turns (5 rounds; medians). Ours: the simulated gateway in front of the real-time simulator
    (1 kHz, six drives enabled in CSP, every write checked and applied, inputs refreshed every cycle);
    reference: a bare pymodbus server with a plain register store of the same size (no checks, no
    simulator). ratio = ours / reference. A second line compares with the bare server running beside the same
    real-time simulator (drives enabled too) in the process, sharing the GIL with its cycle thread: the
    gateway's own cost.
  * per-cycle cost: one simulator cycle with the gateway's cycle callback (a scaled copy of the sample, the
    watchdog; the 80 registers are encoded at the first read after a cycle, which the round trip includes)
    against the same simulator without a transport, stepped synchronously. ratio = ours / reference.
"""
from __future__ import annotations

import sys
import time

import numpy as np
from pymodbus.client import ModbusTcpClient

from firmware_bridge import cia402
from firmware_bridge import gateway as gw
from firmware_bridge.units import JointScaling
from ident.model import load_model
from sim import Simulator
from sim.gateway_device import GatewayDevice, ModbusServerThread, register_device

N = 6


def report(name: str, value: float, unit: str, ref_name: str, ref: float) -> None:
    ratio = value / ref if ref else float("inf")
    print(f"{name}: {value:.1f} {unit} (reference: {ref_name} {ref:.1f} {unit}, ratio {ratio:.2f}x)")


def round_trips(port: int, outputs: gw.OutputImage, seconds: float) -> float:
    """Read all inputs + write all outputs (watchdog counting) for `seconds`; round trips per second."""
    client = ModbusTcpClient("127.0.0.1", port=port, timeout=2.0, retries=0)
    if not client.connect():
        raise SystemExit(f"bench_gateway: cannot connect to 127.0.0.1:{port}")
    try:
        count, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            r = client.read_input_registers(gw.INPUT_BASE, count=gw.input_count(N))
            gw.decode_inputs(r.registers, N)
            outputs.watchdog = (outputs.watchdog + 1) & 0xFFFF
            w = client.write_registers(gw.HOLDING_BASE, gw.encode_outputs(outputs).tolist())
            if r.isError() or w.isError():
                raise SystemExit(f"bench_gateway: refused: {r} {w}")
            count += 1
        return count / (time.perf_counter() - t0)
    finally:
        client.close()


def enabled_csp(sim: Simulator) -> gw.OutputImage:
    """Enable the drives in CSP at their positions through the simulator; the matching output image."""
    scaling = JointScaling.from_gear(sim.model.gear_ratio, sim.plant.noise.encoder_counts)
    pos = sim.read_state().position
    sim.set_commands(mode=np.full(N, int(cia402.Mode.CSP)), target_position=pos,
                     controlword=np.full(N, cia402.CW_SHUTDOWN))
    sim.wait_cycles(3, timeout=10)
    sim.set_commands(controlword=np.full(N, cia402.CW_ENABLE_OPERATION))
    sim.wait_cycles(3, timeout=10)
    return gw.OutputImage(0, 1000, np.full(N, cia402.CW_ENABLE_OPERATION), np.full(N, int(cia402.Mode.CSP)),
                          scaling.position_to_counts(pos), np.zeros(N, np.int64))


def bench_round_trip(model, seconds: float, rounds: int = 5) -> None:
    """The three set-ups take turns, `rounds` times, seconds / rounds each: the machine's load drifts alike
    over all of them. Each figure is the median of its rounds."""
    zeros = gw.OutputImage(0, 1000, *(np.zeros(N, np.int64) for _ in range(4)))
    inputs = gw.encode_inputs(gw.InputImage(1, 0, 0, 0, *(np.zeros(N, np.int64) for _ in range(7)))).tolist()
    bare = ModbusServerThread(register_device(gw.encode_outputs(zeros).tolist(), inputs), "127.0.0.1", 0)
    port = bare.start()
    plain = Simulator(model, realtime=True)
    ours, alone, beside = [], [], []
    try:
        for _ in range(rounds):
            sim = Simulator(model, transport=GatewayDevice(port=0, watchdog_s=1.0), realtime=True)
            with sim:
                outputs = enabled_csp(sim)
                ours.append(round_trips(sim.transport.port, outputs, seconds / rounds))
                states = sim.read_state().states()
            if any(s is not cia402.State.OPERATION_ENABLED for s in states):
                raise SystemExit(f"bench_gateway: the drives did not stay enabled: {states}")
            alone.append(round_trips(port, outputs, seconds / rounds))
            with plain:                                  # the same simulator, beside the bare server
                enabled_csp(plain)
                beside.append(round_trips(port, outputs, seconds / rounds))
    finally:
        bare.stop()
    name = "gateway round trip (read 80 + write 38 registers)"
    report(name, float(np.median(ours)), "/s", "bare pymodbus server, plain register store", float(np.median(alone)))
    report(name, float(np.median(ours)), "/s", "the same bare server beside the same real-time simulator",
           float(np.median(beside)))


def bench_image_update(model, cycles: int = 600, rounds: int = 6) -> None:
    """Synchronous steps of the two simulators in turns (rounds of `cycles`); per-cycle medians."""
    sims = [Simulator(model, transport=GatewayDevice(port=0)), Simulator(model)]
    times: list[list[float]] = [[], []]
    for sim in sims:
        sim.step(200)  # warm up
    for _ in range(rounds):
        for sim, out in zip(sims, times):
            t0 = time.perf_counter()
            sim.step(cycles)
            out.append((time.perf_counter() - t0) / cycles * 1e6)
    report("simulator cycle with the gateway's cycle callback", float(np.median(times[0])), "us",
           "the same cycle without a transport", float(np.median(times[1])))


def main(argv: list[str]) -> None:
    seconds = float(argv[1]) if len(argv) > 1 else 5.0
    model = load_model("generic6")
    bench_round_trip(model, seconds)
    bench_image_update(model)


if __name__ == "__main__":
    main(sys.argv)
