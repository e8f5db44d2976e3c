"""CAN device side throughput: simulated cycles per wall second over python-can's virtual bus.

Prints `name: value unit (reference: value unit, ratio x)`; run from the checkout root with
`python -m benchmarks.bench_can [cycles]`.
  * can lockstep: a host (raw python-can, so the figure is the device's) sends RPDO1 + RPDO2 to each of the
    6 drives (enabled in CSP, following a sine), then SYNC, and waits for the 12 TPDOs of that cycle before
    the next one: one full SYNC -> TPDOs -> RPDOs round trip per simulated cycle. The 6 canopen LocalNodes,
    the fault-injection path and the simulator step all run in the device's notifier thread.
    Reference: the same simulator stepped directly (`sim.step(1)` in a loop, no CAN). ratio = ours / reference.
  * can per cycle: the same lockstep as wall time per cycle, against the 1 ms period of a 1 kHz SYNC. Host and
    device share one process here (the virtual bus is in-process): every cycle needs at least two thread
    wake-ups, which on a loaded machine cost milliseconds of scheduling; a host in another process on socketcan
    does not share the device's GIL.
  * periodic SYNC: a cyclic 1 kHz SYNC sender (no waiting for TPDOs, as a CANopen master runs) for 3 s, drives
    OPERATIONAL: the cycles the device completed per second against the SYNCs really sent.
  * device CPU per SYNC: the CPU time (time.thread_time) the device's notifier thread spends handling one SYNC
    (simulator step, 12 TPDOs through canopen, fault injection, EMCY check), against the 1 ms period: the
    rate the device side could sustain with a core to itself.
  * bus load (computed, not measured): the highest SYNC rate at which the default maps of 6 drives fit a
    1 Mbit/s classic CAN bus (worst-case bit stuffing), against 1 kHz.
"""
from __future__ import annotations

import math
import sys
import time

import can

from firmware_bridge import canopen_map as cm
from firmware_bridge.cia402 import CW_ENABLE_OPERATION, CW_SHUTDOWN, Mode
from sim import Simulator
from sim.can_device import CanDevice

Q0 = [0.0, 0.3, -0.5, 0.2, 0.4, 0.1]
CHANNEL = "armid-bench-can"


def report(name: str, value: float, unit: str, ref_name: str, ref: float) -> None:
    ratio = value / ref if ref else float("inf")
    print(f"{name}: {value:.3f} {unit} (reference: {ref_name} {ref:.3f} {unit}, ratio {ratio:.2f}x)")


class LockstepHost:
    """Sends RPDOs + SYNC and waits for every TPDO of the cycle."""

    def __init__(self, bus: can.BusABC, nodes: list[int]):
        self.bus, self.nodes = bus, nodes
        self.expect = {p.cob_id(n) for p in cm.TPDOS if p.enabled for n in nodes}
        self.sync_msg = can.Message(arbitration_id=cm.SYNC_COB_ID, data=b"", is_extended_id=False)

    def cycle(self, controlword: int, targets: list[int] | None) -> dict[int, int]:
        """One cycle; returns {node: position counts} from the TPDO1s."""
        if targets is not None:
            for node, target in zip(self.nodes, targets):
                self.bus.send(can.Message(arbitration_id=cm.RPDO1.cob_id(node), is_extended_id=False,
                                          data=cm.RPDO1.pack([controlword, target, int(Mode.CSP)])))
                self.bus.send(can.Message(arbitration_id=cm.RPDO2.cob_id(node), is_extended_id=False,
                                          data=cm.RPDO2.pack([0])))
        self.bus.send(self.sync_msg)
        pending, positions = set(self.expect), {}
        while pending:
            msg = self.bus.recv(2.0)
            if msg is None:
                raise RuntimeError(f"TPDOs {sorted(hex(c) for c in pending)} not received within 2 s")
            if msg.arbitration_id in pending:
                pending.discard(msg.arbitration_id)
                if msg.arbitration_id - 0x180 in self.nodes:
                    positions[msg.arbitration_id - 0x180] = cm.TPDO1.unpack(msg.data)[1]
        return positions


class TimedCanDevice(CanDevice):
    """CanDevice that adds up the CPU time of its SYNC handler (in the handler's own thread)."""

    cpu = 0.0
    syncs = 0

    def _on_sync(self, can_id, data, timestamp):
        t = time.thread_time()
        super()._on_sync(can_id, data, timestamp)
        self.cpu += time.thread_time() - t
        self.syncs += 1


def can_lockstep(model: str, cycles: int) -> tuple[float, float, int]:
    dev_bus = can.Bus(interface="virtual", channel=CHANNEL)
    host_bus = can.Bus(interface="virtual", channel=CHANNEL)
    device = TimedCanDevice(bus=dev_bus, heartbeat_ms=0, start_operational=True)
    sim = Simulator(model, transport=device, q0=Q0)
    sim.start()
    try:
        host = LockstepHost(host_bus, device.node_ids())
        pos = host.cycle(0, None)
        start = [pos[n] for n in host.nodes]
        host.cycle(CW_SHUTDOWN, start)
        host.cycle(CW_ENABLE_OPERATION, start)
        host.cycle(CW_ENABLE_OPERATION, start)
        cpr = device.scaling.counts_per_rad
        device.cpu, device.syncs = 0.0, 0
        t0 = time.perf_counter()
        for k in range(cycles):
            s = 0.05 * math.sin(2 * math.pi * 0.5 * k * sim.dt)
            host.cycle(CW_ENABLE_OPERATION, [p + round(s * c) for p, c in zip(start, cpr)])
        elapsed = time.perf_counter() - t0
        bad = device.malformed
    finally:
        sim.stop()
        host_bus.shutdown()
        dev_bus.shutdown()
    states = sim.read_state().states()
    if any(st is None or st.name != "OPERATION_ENABLED" for st in states):
        raise RuntimeError(f"drives left OPERATION ENABLED during the benchmark: {states}")
    return cycles / elapsed, device.cpu / device.syncs, bad


def periodic_sync_rate(model: str, seconds: float, period: float = 1e-3) -> tuple[float, float]:
    """A 1 kHz SYNC producer (python-can's cyclic sender, as a CANopen master would run it) for `seconds`:
    (SYNCs sent per second, cycles the device completed per second). The drives are OPERATIONAL (12 TPDOs
    per SYNC, nobody reads them); SYNCs the device cannot keep up with queue up, so the second figure is its
    sustained rate."""
    dev_bus = can.Bus(interface="virtual", channel=CHANNEL + "-periodic")
    host_bus = can.Bus(interface="virtual", channel=CHANNEL + "-periodic")
    device = CanDevice(bus=dev_bus, heartbeat_ms=0, start_operational=True)
    sim = Simulator(model, transport=device, q0=Q0)
    sim.start()
    observer = can.Bus(interface="virtual", channel=CHANNEL + "-periodic")     # counts the SYNCs really sent
    try:
        sync = can.Message(arbitration_id=cm.SYNC_COB_ID, data=b"", is_extended_id=False)
        c0 = sim.read_state().cycle
        t0 = time.perf_counter()
        task = host_bus.send_periodic(sync, period, duration=seconds)
        time.sleep(seconds)
        elapsed = time.perf_counter() - t0
        t_end = time.time()
        done = sim.read_state().cycle - c0
        task.stop()
        sent = 0
        while (msg := observer.recv(0)) is not None:
            sent += msg.arbitration_id == cm.SYNC_COB_ID and msg.timestamp <= t_end
    finally:
        observer.shutdown()
        sim.stop()
        host_bus.shutdown()
        dev_bus.shutdown()
    return sent / elapsed, done / elapsed


def bare_step_rate(model: str, cycles: int) -> float:
    sim = Simulator(model, q0=Q0)
    sim.step(10)
    t0 = time.perf_counter()
    for _ in range(cycles):
        sim.step(1)
    return cycles / (time.perf_counter() - t0)


def main() -> None:
    cycles = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    model = "generic6"
    ref = bare_step_rate(model, cycles)
    rate, cpu, bad = can_lockstep(model, cycles)
    report("can lockstep cycle rate, 6 drives (virtual bus)", rate, "cycles/s", "bare simulator step", ref)
    report("can lockstep wall time per cycle", 1e3 / rate, "ms", "1 kHz SYNC period", 1.0)
    sent, done = periodic_sync_rate(model, 3.0)
    report("can cycles completed under a periodic 1 kHz SYNC, 6 drives", done, "cycles/s", "SYNCs sent", sent)
    report("can device CPU time per SYNC, 6 drives", 1e3 * cpu, "ms", "1 kHz SYNC period", 1.0)
    report("bus load: max SYNC rate of 6 drives at 1 Mbit/s, computed", cm.max_cycle_rate(6, 1e6), "Hz",
           "target", 1000.0)
    if bad:
        print(f"warning: the device counted {bad} malformed frames")


if __name__ == "__main__":
    main()
