"""Serial link timing: the codec per STATE frame, and what the serial device side costs the simulator.

Prints `name: value unit (reference: value unit, ratio x)`; run with `python benchmarks/bench_serial.py [seconds]`.
  * STATE frame encode / decode (6 joints, through FrameEncoder and StreamDecoder, COBS and CRC included);
    reference: the same bytes made and read by one hand-written struct format with zlib.crc32 and cobs, no
    checks and no arrays. ratio = ours / reference (the price of the field tables, range checks and counters).
  * fast mode with the serial device: simulated seconds per wall second of Simulator(transport=SerialDevice())
    with a pyserial host (another process, as the driver) reading and decoding every frame on the pty;
    reference: the same simulator without a transport. ratio = with / without.
  * real-time lateness p99 at 1 kHz with the serial device and host; reference: without a transport.
  * the driver's per-cycle frames (driver/transports/serial_frames.py): STATE into SI through FrameSplitter's
    fast path, COMMAND from SI through CommandEncoder; reference: the same through StreamDecoder / FrameEncoder
    and JointScaling, as the transport did before. ratio = fast / reference.
"""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
import zlib

import numpy as np
from cobs import cobs

from firmware_bridge import serial_protocol as sp
from sim import Simulator
from sim.serial_device import SerialDevice


def report(name: str, value: float, unit: str, ref: float) -> None:
    ratio = value / ref if ref else float("inf")
    print(f"{name}: {value:.3f} {unit} (reference: {ref:.3f} {unit}, ratio {ratio:.2f}x)")


def state(k: int) -> sp.State:
    n = 6
    return sp.State(timestamp_us=k * 1000, cycle=k, statusword=np.full(n, 0x0237), mode_display=np.full(n, 8),
                    error_code=np.zeros(n, np.int64), position=np.arange(n) * 1000 + k,
                    velocity=np.full(n, -k), current=np.full(n, 1_500_000))


def codec_us(frames: int) -> tuple[float, float, float, float]:
    """(encode us, decode us) per frame, ours and the hand-written reference."""
    msgs = [state(k) for k in range(frames)]
    enc = sp.FrameEncoder()
    t0 = time.perf_counter()
    wire = [enc.encode(m) for m in msgs]
    t1 = time.perf_counter()
    dec = sp.StreamDecoder()
    got = sum(len(dec.feed(w)) for w in wire)
    t2 = time.perf_counter()
    assert got == frames and dec.counters.dropped == 0
    head, fixed, joint = struct.Struct("<BBHH"), struct.Struct("<QIB"), struct.Struct("<HbHiii")
    fmt = struct.Struct("<BBHHQIB" + "HbHiii" * 6)
    rows = [[(int(m.statusword[j]), int(m.mode_display[j]), int(m.error_code[j]), int(m.position[j]),
              int(m.velocity[j]), int(m.current[j])) for j in range(6)] for m in msgs]
    size = fixed.size + 6 * joint.size
    t3 = time.perf_counter()
    ref_wire = []
    for k, (m, r) in enumerate(zip(msgs, rows)):
        body = fmt.pack(1, 4, k & 0xFFFF, size, m.timestamp_us, m.cycle, 6, *[v for row in r for v in row])
        ref_wire.append(cobs.encode(body + struct.pack("<I", zlib.crc32(body))) + b"\0")
    t4 = time.perf_counter()
    for w in ref_wire:
        frame = cobs.decode(w[:-1])
        zlib.crc32(frame[:-4]) == struct.unpack_from("<I", frame, len(frame) - 4)[0]
        fmt.unpack_from(frame)
    t5 = time.perf_counter()
    assert ref_wire == wire and head.size == sp.HEADER.size
    us = 1e6 / frames
    return (t1 - t0) * us, (t2 - t1) * us, (t4 - t3) * us, (t5 - t4) * us


def driver_frames_us(frames: int) -> tuple[float, float, float, float]:
    """(STATE -> SI us, its reference, COMMAND from SI us, its reference): CPU time per frame (thread time, which
    a loaded machine disturbs less than the wall clock)."""
    from driver.hal import ArmCommand
    from driver.transports.serial_frames import CommandEncoder, FrameSplitter
    from firmware_bridge.units import CURRENT_LSB, JointScaling

    n = 6
    sc = JointScaling.from_gear(np.full(n, 100.0))
    wire = [sp.encode(state(k), k & 0xFFFF) for k in range(frames)]
    q, current = np.zeros(n), np.zeros(n)
    splitter = FrameSplitter(n)
    t0 = time.thread_time()
    for w in wire:
        for _ in splitter.feed(w):
            np.divide(splitter.joints["position"], sc.counts_per_rad, out=q)
            np.multiply(splitter.joints["current"], CURRENT_LSB, out=current)
    t1 = time.thread_time()
    dec = sp.StreamDecoder()
    for w in wire:
        for m in dec.feed(w):
            np.divide(m.position, sc.counts_per_rad, out=q)
            np.multiply(m.current, CURRENT_LSB, out=current)
    t2 = time.thread_time()
    cmd = ArmCommand(n)
    cmd.controlword[:], cmd.mode[:], cmd.target_position[:], cmd.target_torque[:] = 0x0F, 8, 0.3, 2.5
    enc, fenc = CommandEncoder(n, sc.counts_per_rad), sp.FrameEncoder()
    enc.encode(0, cmd)                  # numba's compile or cache load, outside the timing
    t3 = time.thread_time()
    for k in range(frames):
        enc.encode(k, cmd)
    t4 = time.thread_time()
    for _ in range(frames):
        b"\0" + fenc.encode(sp.Command(controlword=cmd.controlword, mode=cmd.mode,
                                       target_position=sc.position_to_counts(cmd.target_position),
                                       target_torque=JointScaling.torque_to_raw(cmd.target_torque)))
    t5 = time.thread_time()
    us = 1e6 / frames
    return (t1 - t0) * us, (t2 - t1) * us, (t4 - t3) * us, (t5 - t4) * us


_HOST = """
import sys, time
import serial
from firmware_bridge.serial_protocol import StreamDecoder
port, seconds = serial.Serial(sys.argv[1], timeout=0.05), float(sys.argv[2])
dec, end = StreamDecoder(), time.monotonic() + seconds
while time.monotonic() < end:
    dec.feed(port.read(max(1, port.in_waiting)))
print(dec.counters.frames, dec.counters.dropped)
"""


def sim_run(seconds: float, realtime: bool, with_serial: bool) -> tuple[float, object, int]:
    """(simulated s per wall s, lateness stats, STATE frames the host decoded). The host is another process
    (as the driver would be), reading and decoding every frame."""
    dev = SerialDevice(watchdog_s=10.0) if with_serial else None
    sim = Simulator("generic6", transport=dev, realtime=realtime)
    sim.start()
    host = None
    try:
        if with_serial:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
            host = subprocess.Popen([sys.executable, "-c", _HOST, dev.path, str(seconds + 1.0)],
                                    stdout=subprocess.PIPE, text=True, env=env)
            time.sleep(0.5)
        c0, t0 = sim.read_state().cycle, time.perf_counter()
        time.sleep(seconds)
        c1, t1 = sim.read_state().cycle, time.perf_counter()
        frames = int(host.communicate(timeout=seconds + 30)[0].split()[0]) if host else 0
    finally:
        if host and host.poll() is None:
            host.kill()
            host.wait(5)
        sim.stop()
    return (c1 - c0) * sim.dt / (t1 - t0), sim.lateness(), frames


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    enc, dec, ref_enc, ref_dec = codec_us(20_000)
    report("serial STATE encode (6 joints)", enc, "us/frame", ref_enc)
    report("serial STATE decode (6 joints)", dec, "us/frame", ref_dec)
    fast_state, ref_state, fast_cmd, ref_cmd = driver_frames_us(20_000)
    report("driver serial STATE -> SI (fast path)", fast_state, "us/frame", ref_state)
    report("driver serial COMMAND from SI (preallocated)", fast_cmd, "us/frame", ref_cmd)
    fast_s, _, frames = sim_run(seconds, realtime=False, with_serial=True)
    fast_ref, _, _ = sim_run(seconds, realtime=False, with_serial=False)
    report("fast mode with serial device + host", fast_s, "sim s/wall s", fast_ref)
    print(f"  (the host decoded {frames} frames in about {seconds:.1f} s)")
    _, late, _ = sim_run(seconds, realtime=True, with_serial=True)
    _, late_ref, _ = sim_run(seconds, realtime=True, with_serial=False)
    report("realtime 1 kHz lateness p99 with serial device + host", late.p99 * 1e6, "us", late_ref.p99 * 1e6)


if __name__ == "__main__":
    main()
