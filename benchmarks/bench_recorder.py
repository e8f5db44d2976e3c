"""Recorder cost: CPU time per state message written, and the time to read a recording back.

Prints `name: value unit (reference: value unit, ratio x)`; run from the checkout with `python -m benchmarks.bench_recorder [N]`.
  * write: the recorder's work per state message of six joints (check the payload, encode /joint_states,
    /motor_currents and /armid/state from fixed CDR layouts, add them to zstd chunks of 0.25 s, write
    through to the file), N messages (default 20000); reference: the same three messages encoded by
    mcap-ros2-support's generic encoder (mcap_ros2.writer.Writer.write_message) into the same container.
    Also the CPU share of one core that the recorder needs at 1 kHz, and the same with the model given
    (/robot_description once and /tf at 50 Hz added), against the same run without.
  * read: read_recording of that file (every /armid/state message decoded at once with numpy);
    reference: mcap-ros2-support's decoder on the same messages (iter_decoded_messages). Per message.
Both sides run in this process, one after the other, on the same payloads.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np
from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory
from mcap_ros2.writer import Writer as Ros2Writer

from firmware_bridge import mcap_schema as schema
from firmware_bridge import stream
from driver.recorder import MCAP_RECORD_OVERHEAD, McapStateWriter, _StateCheck
from firmware_bridge.recording import read_recording

N_JOINTS = 6
NAMES = [f"j{k + 1}" for k in range(N_JOINTS)]


def report(name: str, value: float, unit: str, ref_name: str, ref: float) -> None:
    ratio = value / ref if ref else float("inf")
    print(f"{name}: {value:.3f} {unit} (reference: {ref_name} {ref:.3f} {unit}, ratio {ratio:.3f}x)")


def payloads(count: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    m = stream.StateMessage(N_JOINTS)
    out = []
    for seq in range(count):
        m.q[:], m.qd[:], m.current[:], m.torque[:] = rng.normal(size=(4, N_JOINTS))
        m.statusword[:] = 0x1237
        m.mode[:] = 8
        m.set_header(seq, stream.FLAG_ENABLED, seq * 1_000_000, 1_700_000_000_000_000_000 + seq * 1_000_000)
        out.append(bytes(m.buffer))
    return out


def write_ours(path: str, data: list[bytes], model=None) -> float:
    t0 = time.process_time()
    writer = McapStateWriter(path, joint_names=NAMES, overwrite=True, model=model)
    check = _StateCheck()
    for p in data:
        assert check.check(p) is None
        seq, host = int.from_bytes(p[12:20], "little"), int.from_bytes(p[28:36], "little", signed=True)
        writer.write_state(p, check.n, seq, host)
    writer.close()
    return time.process_time() - t0


def write_generic(path: str, data: list[bytes]) -> float:
    t0 = time.process_time()
    with open(path, "wb") as f:
        # the same chunk size as ours: 0.25 s at 1 kHz
        w = Ros2Writer(f, chunk_size=int(0.25 * 1000 * sum(MCAP_RECORD_OVERHEAD + s for s in _sizes())))
        js, arm = w.register_msgdef(*schema.JOINT_STATE), w.register_msgdef(*schema.ARM_STATE)
        for p in data:
            s = stream.decode_state(p)
            host = int(s["host_time_ns"])
            header = {"stamp": {"sec": host // 10**9, "nanosec": host % 10**9}, "frame_id": ""}
            w.write_message(schema.TOPIC_JOINT_STATES, js, {"header": header, "name": NAMES, "position": s["q"].tolist(),
                                                            "velocity": s["qd"].tolist(), "effort": s["torque"].tolist()},
                            log_time=host, sequence=int(s["seq"]))
            w.write_message(schema.TOPIC_MOTOR_CURRENTS, js, {"header": header, "name": NAMES, "position": [],
                                                              "velocity": [], "effort": s["current"].tolist()},
                            log_time=host, sequence=int(s["seq"]))
            w.write_message(schema.TOPIC_STATE, arm, {"header": header, **{k: s[k].tolist() for k in (
                "version", "flags", "seq", "device_time_ns", "host_time_ns", "q", "qd", "current", "torque",
                "statusword", "error_code", "mode")}}, log_time=host, sequence=int(s["seq"]))
        w.finish()
    return time.process_time() - t0


def _sizes() -> list[int]:
    return [schema.joint_state_layout(NAMES).size, schema.joint_state_layout(NAMES, position=False, velocity=False).size,
            schema.arm_state_layout(N_JOINTS).size]


def read_generic(path: str) -> tuple[float, int]:
    t0 = time.process_time()
    count = 0
    with open(path, "rb") as f:
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        for *_, msg in reader.iter_decoded_messages(topics=[schema.TOPIC_STATE], log_time_order=False):
            count += len(msg.q) > 0
    return time.process_time() - t0, count


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    data = payloads(n)
    n_ref = max(n // 10, 500)     # the generic encoder is slow: a tenth of the messages, per message below
    with tempfile.TemporaryDirectory() as tmp:
        ours_path, ref_path = os.path.join(tmp, "ours.mcap"), os.path.join(tmp, "generic.mcap")
        ours = write_ours(ours_path, data) / n
        ref = write_generic(ref_path, data[:n_ref]) / n_ref
        report("record cost per state message (6 joints, 3 topics)", ours * 1e6, "us",
               "mcap-ros2-support generic encoder", ref * 1e6)
        report("recorder CPU at 1 kHz", ours * 1000 * 100, "% of a core",
               "with the generic encoder", ref * 1000 * 100)
        import ident.model.frames  # noqa: F401  (imported once per process, as the daemon does before recording)
        import ident.model.urdf_export  # noqa: F401
        from ident.model import load_model

        framed = write_ours(os.path.join(tmp, "framed.mcap"), data, model=load_model("generic6")) / n
        report("record cost per state message with /tf at 50 Hz", framed * 1e6, "us", "without /tf", ours * 1e6)
        size = os.path.getsize(ours_path)
        print(f"file size: {size / n:.1f} bytes per state message (3 topics, zstd), {n} messages")
        t0 = time.process_time()
        log = read_recording(ours_path)
        read = (time.process_time() - t0) / len(log.states)
        # the generic decoder on the file it wrote itself (same messages, same container)
        ref_read, count = read_generic(ref_path)
        report("read back per state message", read * 1e6, "us", "mcap-ros2-support decoder", ref_read / count * 1e6)


if __name__ == "__main__":
    main()
