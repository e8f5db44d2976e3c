"""CAN: device side throughput (simulated cycles per wall second over python-can's virtual bus), the host's
own CPU per cycle, and what python-can's interfaces cost per frame.

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
    (RPDOs latched into one set_commands, simulator step, 12 TPDOs packed with PdoCodec and sent through the
    fault injection and python-can, EMCY check), against the 1 ms period: the rate the device side could
    sustain with a core to itself.
  * host PDO path per cycle: the driver's own frame work per cycle for 6 drives without any interface (frames
    handed to CanArm._on_frame as its reading of the bus does, sends to a bus that drops them): 13 TPDOs decoded
    into a sample, then write(): the targets from SI into wire units (range-checked), 12 RPDOs packed and sent
    with SYNC. Reference: the same frames through python-canopen's PdoMaps (callbacks, transmit), the path the
    driver used before, given the wire values already converted (so the reference does less).
  * interface cost per frame: python-can's send and receive of one 8-byte frame on the `virtual` bus (one
    process) and on `udp_multicast` (what a second process needs here: no SocketCAN in this kernel), each
    with the other as reference. udp_multicast packs every frame with msgpack into its own datagram, and
    every member of the group, the sender included, receives and unpacks every frame.
  * host CPU per 1 kHz cycle over udp_multicast, computed from the two lines above: the PDO path, 13 frames
    sent and 13 received (TPDO1 and TPDO2 of each drive, the first drive's TPDO4: the host switches the others
    off; its own 13 frames, which udp_multicast loops back, are dropped by its socket filter in the kernel: 26
    received where that filter cannot be attached), against the 1 ms period.
  * udp_multicast frames kept over a stall: a receiver that does not read for 200 ms while the chain's traffic
    at 250 Hz arrives (31 frames a cycle, every member hears all), with the socket as driver and simulator tune
    it (firmware_bridge.can_socket.tune_udp_multicast: own group only, 4 MiB asked) against python-can's socket as
    it comes (net.core.rmem_default: 256 datagrams).
  * bus load (computed, not measured): the highest SYNC rate at which the default maps of 6 drives fit a
    1 Mbit/s classic CAN bus (worst-case bit stuffing), against 1 kHz; and with TPDO4 from the first drive only (the
    driver switches the others' off), against every drive's.
"""
from __future__ import annotations

import math
import os
import sys
import time

import can
import canopen
import numpy as np

from firmware_bridge import canopen_map as cm
from firmware_bridge.cia402 import CW_ENABLE_OPERATION, CW_SHUTDOWN, Mode
from driver.hal import ArmCommand
from driver.transports.can import EDS_PATH, CanArm, frames_per_cycle
from ident.model import load_model
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
                                          data=cm.RPDO2.pack([0, 0])))
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


class _DroppingBus:
    """Where the host's sends go when only its own CPU is measured: nowhere."""

    def send(self, msg: can.Message, timeout: float | None = None) -> None:
        pass


def _tpdo_frames(nodes: list[int]) -> list[can.Message]:
    """One cycle of TPDO1 and TPDO2 from every node and TPDO4 from the first (the driver switches the others' off):
    operation enabled, CSP, some motion, a time stamp."""
    out = []
    for k, nid in enumerate(nodes):
        out.append(can.Message(arbitration_id=cm.TPDO1.cob_id(nid), is_extended_id=False, timestamp=time.time(),
                               data=cm.TPDO1.pack([0x1237, 1000 * k - 2500, int(Mode.CSP)])))
        out.append(can.Message(arbitration_id=cm.TPDO2.cob_id(nid), is_extended_id=False, timestamp=time.time(),
                               data=cm.TPDO2.pack([-300 * k, 150_000 + k])))
        if k == 0:
            out.append(can.Message(arbitration_id=cm.TPDO4.cob_id(nid), is_extended_id=False, timestamp=time.time(),
                                   data=cm.TPDO4.pack([4000])))
    return out


def host_pdo_path(model_name: str, cycles: int, rounds: int = 5) -> tuple[float, float]:
    """(ours, canopen's) thread CPU per cycle in seconds, medians of `rounds` alternating rounds."""
    model = load_model(model_name)
    arm = CanArm(model, interface="virtual", channel="unused")
    arm.network = canopen.Network()
    arm.network.bus = _DroppingBus()
    frames = _tpdo_frames(arm.node_ids)
    command = ArmCommand(model.n)
    command.controlword[:] = CW_ENABLE_OPERATION
    command.mode[:] = int(Mode.CSP)
    command.target_position[:] = np.linspace(-0.5, 0.5, model.n)
    command.target_torque[:] = np.linspace(-3.0, 3.0, model.n)

    counts = arm.scaling.position_to_counts(command.target_position).tolist()
    torque = arm.scaling.torque_to_raw(command.target_torque).tolist()
    cw, mode = command.controlword.tolist(), command.mode.tolist()

    def ours() -> None:
        """CanArm's frame work of one cycle: 13 TPDOs decoded, then write() (SI to wire units, the RPDOs packed,
        sent with SYNC)."""
        seq = arm._ready_seq
        on_frame = arm._on_frame
        for f in frames:
            on_frame(f)
        if arm._ready_seq != seq + 1:
            raise RuntimeError("bench_can: the host completed no sample from a full cycle of TPDOs")
        arm.write(command)

    net = canopen.Network()
    net.bus = _DroppingBus()
    rpdos, got = [], []
    for nid in arm.node_ids:
        node = canopen.RemoteNode(nid, canopen.objectdictionary.import_od(str(EDS_PATH), nid))
        net.add_node(node)
        for maps in (node.tpdo, node.rpdo):
            maps.read(from_od=True)
        for p in (cm.TPDO1, cm.TPDO2, cm.TPDO4):
            node.tpdo[p.number].add_callback(lambda m, p=p: got.append(p.unpack(m.data)))
        rpdos.append((node.rpdo[1], node.rpdo[2]))

    def canopens() -> None:
        net.sync.transmit()
        for f in frames:
            for listener in net.listeners:
                listener(f)
        for j, (r1, r2) in enumerate(rpdos):
            r1.data = bytearray(cm.RPDO1.pack((cw[j], counts[j], mode[j])))
            r2.data = bytearray(cm.RPDO2.pack((torque[j], 0)))        # target torque, torque offset
            r1.transmit()
            r2.transmit()
        if len(got) != len(frames):
            raise RuntimeError("bench_can: canopen's PdoMaps did not deliver every TPDO")
        got.clear()

    times: list[list[float]] = [[], []]
    for _ in range(rounds):
        for fn, out in ((ours, times[0]), (canopens, times[1])):
            t0 = time.thread_time()
            for _ in range(cycles):
                fn()
            out.append((time.thread_time() - t0) / cycles)
    return float(np.median(times[0])), float(np.median(times[1]))


def interface_cost(interface: str, channel: str, frames: int = 2000, burst: int = 50) -> tuple[float, float]:
    """(send, receive) thread CPU per 8-byte frame on a python-can interface, in bursts that its receive
    buffers hold (udp_multicast drops datagrams beyond the socket's buffer)."""
    tx, rx = can.Bus(interface=interface, channel=channel), can.Bus(interface=interface, channel=channel)
    msg = can.Message(arbitration_id=0x181, is_extended_id=False, data=bytes(8))
    send_cpu = recv_cpu = 0.0
    received = 0
    try:
        for _ in range(frames // burst):
            t0 = time.thread_time()
            for _ in range(burst):
                tx.send(msg)
            send_cpu += time.thread_time() - t0
            t0 = time.thread_time()
            for _ in range(burst):
                if rx.recv(1.0) is None:
                    break
                received += 1
            recv_cpu += time.thread_time() - t0
            while tx.recv(0) is not None:        # udp_multicast: the sender's own frames, looped back
                pass
    finally:
        tx.shutdown()
        rx.shutdown()
    if received < frames // 2:
        raise RuntimeError(f"bench_can: {interface}: only {received} of {frames} frames received")
    return send_cpu / (frames // burst * burst), recv_cpu / received


def own_frames_dropped_by_the_kernel(group: str, port: int = 43113 + 7) -> bool:
    """Whether driver.transports.can's socket filter works here: a udp_multicast bus tuned with a SYNC as its
    own id gets a TPDO sent on its group but not the SYNC, while an untuned bus gets both."""
    from firmware_bridge.can_socket import tune_udp_multicast

    rx, plain = (can.Bus(interface="udp_multicast", channel=group, port=port) for _ in range(2))
    try:
        if not tune_udp_multicast(rx, own_ids=[cm.SYNC_COB_ID]).get("own_frames_filtered"):
            return False
        for cob in (cm.SYNC_COB_ID, cm.TPDO1.cob_id(1)):
            plain.send(can.Message(arbitration_id=cob, data=b"" if cob == cm.SYNC_COB_ID else bytes(7),
                                   is_extended_id=False))
        got = []
        while (msg := rx.recv(0.2)) is not None:
            got.append(msg.arbitration_id)
        return got == [cm.TPDO1.cob_id(1)]
    finally:
        rx.shutdown()
        plain.shutdown()


def frames_kept_over_a_stall(tuned: bool, stall_s: float = 0.2, rate_hz: float = 250.0,
                             frames_per_cycle: int = 31) -> tuple[int, int]:
    """udp_multicast between two buses: the receiver does not read for stall_s while the chain's traffic
    (frames_per_cycle a cycle at rate_hz: 6 drives' SYNC, 12 RPDOs, 18 TPDOs, all heard by every member)
    arrives, then reads what its socket kept. tuned: firmware_bridge.can_socket.tune_udp_multicast (own group,
    4 MiB asked); untuned: python-can's socket as it comes (net.core.rmem_default). (kept, sent)."""
    from firmware_bridge.can_socket import tune_udp_multicast

    group, port = f"239.74.164.{1 + os.getpid() % 200}", 43700 + os.getpid() % 200
    rx = can.Bus(interface="udp_multicast", channel=group, port=port)
    tx = can.Bus(interface="udp_multicast", channel=group, port=port)
    try:
        if tuned:
            tune_udp_multicast(rx)
        msg = can.Message(arbitration_id=0x181, data=bytes(8), is_extended_id=False)
        sent = round(stall_s * rate_hz) * frames_per_cycle
        for _ in range(sent):
            tx.send(msg)
        time.sleep(0.05)                       # loopback delivery is immediate; a margin all the same
        kept = 0
        while rx.recv(0) is not None:
            kept += 1
        return kept, sent
    finally:
        rx.shutdown()
        tx.shutdown()


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
    ours, canopens = host_pdo_path(model, max(cycles // 5, 100))
    report("can host PDO path per cycle, 6 drives (targets converted, 12 RPDOs packed and sent with SYNC, 13 TPDOs decoded, no interface)",
           1e6 * ours, "us", "the same frames through python-canopen's PdoMaps", 1e6 * canopens)
    v_send, v_recv = interface_cost("virtual", CHANNEL + "-cost")
    u_send, u_recv = interface_cost("udp_multicast", "239.74.163.9")
    report("can interface cost per frame sent, udp_multicast", 1e6 * u_send, "us", "virtual", 1e6 * v_send)
    report("can interface cost per frame received, udp_multicast", 1e6 * u_recv, "us", "virtual", 1e6 * v_recv)
    sent, received = frames_per_cycle(6)
    received += 0 if own_frames_dropped_by_the_kernel("239.74.163.10") else sent
    report(f"can host CPU per cycle over udp_multicast, computed (PDO path + {sent} sent + {received} received)",
           1e6 * (ours + sent * u_send + received * u_recv), "us", "1 kHz period", 1000.0)
    report("bus load: max SYNC rate of 6 drives at 1 Mbit/s, computed", cm.max_cycle_rate(6, 1e6), "Hz",
           "target", 1000.0)
    driver_bits = cm.cycle_bits(6, pdos=[cm.TPDO1, cm.TPDO2, cm.RPDO1, cm.RPDO2]) + cm.frame_bits(cm.TPDO4.dlc)
    report("bus load: max SYNC rate of 6 drives at 1 Mbit/s as the driver configures them (TPDO4 from the first "
           "drive only), computed", 1e6 / driver_bits, "Hz", "every drive's TPDO4", cm.max_cycle_rate(6, 1e6))
    kept, sent = frames_kept_over_a_stall(True)
    kept_default, _ = frames_kept_over_a_stall(False)
    report(f"can udp_multicast frames kept by a receiver stalled 200 ms at 250 Hz ({sent} sent), tuned socket",
           kept, "frames", "python-can's socket as it comes", kept_default)
    if bad:
        print(f"warning: the device counted {bad} malformed frames")


if __name__ == "__main__":
    main()
