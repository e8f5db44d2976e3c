"""Record the driver's ZeroMQ state stream into an MCAP file that Foxglove and PlotJuggler open.

    stats = record("run.mcap", "tcp://127.0.0.1:5555", joint_names=status["joints"], stop=event)

A SUB socket receives topic `state` (docs/reference/stream.md) and topic `health`; every valid state message
becomes three ROS 2 messages (firmware_bridge.mcap_schema: /joint_states, /motor_currents, /armid/state), every
health message one /diagnostics (driver.diagnostics). Given the model, the recording also carries its URDF on
/robot_description (once, at the start) and the links' transforms on /tf (`tf_rate_hz` of the samples), so that
Foxglove's 3D panel replays the arm. Timestamps: log_time, publish_time and header.stamp are the message's
host_time_ns (the driver's UNIX time at which it read the sample); the device timestamp is kept in
/armid/state. The MCAP `sequence` of a message is the low 32 bits of the driver's seq.

Gaps in seq are counted (never filled in); malformed messages (wrong size, magic, version or joint count,
non-finite numbers) are counted, named once on the log, and skipped.

Crash safety: the file is written through to the operating system without a user-space buffer, and a
chunk holds about `chunk_seconds` of data at the nominal rate, so a SIGKILLed recorder loses at most the
chunk it was filling, and the file it leaves is a valid MCAP prefix (no summary, no footer) that a
streaming reader reads up to its last complete chunk (firmware_bridge.recording does). A clean stop (the stop
event, the duration, the message limit) writes the summary and the footer.
"""
from __future__ import annotations

import json
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import zmq
from mcap.writer import CompressionType, Writer

from firmware_bridge import mcap_schema as schema
from firmware_bridge import stream
from firmware_bridge.runtime.errors import InputError

TF_RATE_HZ = 50.0          # /tf messages per second of stream (every rate/TF_RATE_HZ-th sample)
TF_BATCH = 25              # /tf samples computed together (numpy's cost per call, not per sample): 0.5 s at 50 Hz
RCVHWM = 200_000          # messages the SUB may queue while the recorder compresses a chunk (200 s at 1 kHz)
MCAP_RECORD_OVERHEAD = 31  # bytes of a Message record around its data (opcode, length, channel, seq, 2 times)
MIN_CHUNK_BYTES = 4096
MAX_REASONS = 20           # kinds of malformed messages named one by one; the rest are counted together


class RecorderError(InputError):
    """The recording cannot go on or start: the message says what and where."""


# -- the driver's command socket --------------------------------------------------------------------
def query_status(endpoint: str, timeout_s: float = 5.0, context: zmq.Context | None = None) -> dict:
    """The driver's `status` reply (docs/reference/stream.md) over its command socket; RecorderError if there is no
    answer within timeout_s (s) or the answer is not a status."""
    ctx = context or zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(json.dumps({"cmd": "status"}).encode())
        if not sock.poll(int(timeout_s * 1000)):
            raise RecorderError(f"commands endpoint {endpoint}: no reply to status within {timeout_s:g} s "
                                f"(is the driver running there?)")
        raw = sock.recv()
    except zmq.ZMQError as exc:
        raise RecorderError(f"commands endpoint {endpoint}: {exc}") from None
    finally:
        sock.close(0)
    try:
        reply = json.loads(raw)
    except ValueError:
        raise RecorderError(f"commands endpoint {endpoint}: the status reply is not JSON") from None
    joints = reply.get("joints") if isinstance(reply, dict) else None
    if not (isinstance(reply, dict) and reply.get("ok") and isinstance(joints, list)
            and all(isinstance(j, str) and j for j in joints)):
        raise RecorderError(f"commands endpoint {endpoint}: not a status reply with joint names: {raw[:200]!r}")
    return reply


# -- writing ------------------------------------------------------------------------------------------
RATE_RANGE_HZ = (0.1, 100_000.0)      # the stream's nominal rate, which sizes the chunks
CHUNK_RANGE_S = (0.001, 60.0)         # seconds of data per chunk: held in memory, the most a kill loses


def check_sizing(rate_hz: float, chunk_seconds: float) -> None:
    """Refuse a rate (Hz) or chunk length (s) outside the ranges above (NaN, inf, 1e300: a chunk size that
    cannot be computed, or a chunk that never ends); RecorderError names the option."""
    for name, value, (lo, hi), unit in (("rate", rate_hz, RATE_RANGE_HZ, "Hz"),
                                         ("chunk-seconds", chunk_seconds, CHUNK_RANGE_S, "s")):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
            raise RecorderError(f"--{name}: expected a number {lo:g}..{hi:g} {unit}, got {value!r}")


def check_output(path: str | Path, *, overwrite: bool = False) -> None:
    """Refuse, before anything starts, an output path that cannot become the recording: a directory, an
    existing file (unless overwrite), a missing folder. RecorderError names the path."""
    path = Path(path)
    if path.is_dir():    # else "exists" (or, overwriting, EISDIR): a directory is never the file
        raise RecorderError(f"{path}: is a directory; expected the MCAP file to write (e.g. {path / 'run.mcap'})")
    if path.exists() and not overwrite:
        raise RecorderError(f"{path}: exists; choose another name or overwrite it (--force)")
    if not path.parent.is_dir():
        raise RecorderError(f"{path}: the folder {path.parent} does not exist")


class WriteThrough:
    """A binary file whose every write goes straight to the operating system (no user-space buffer): what
    was written survives a SIGKILL of this process. `tell()` is the number of bytes written."""

    def __init__(self, path: str | Path, *, overwrite: bool = False):
        check_output(path, overwrite=overwrite)
        try:
            self._file = open(path, "wb" if overwrite else "xb", buffering=0)
        except FileExistsError:
            raise RecorderError(f"{path}: exists; choose another name or overwrite it (--force)") from None
        except OSError as exc:
            raise RecorderError(f"{path}: cannot create: {exc.strerror}") from None
        self.path = str(path)
        self._written = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        while view:
            k = self._file.write(view)
            view = view[k:]
        self._written += len(data)
        return len(data)

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if not self._file.closed:
            os.fsync(self._file.fileno())
            self._file.close()


class _SliceEncoder:
    """One fixed CDR layout filled from a state payload by copying byte slices (the payload's fields have
    the CDR's types and byte order); the header stamp is packed separately."""

    def __init__(self, layout: schema.CdrLayout, n: int, fields: dict[str, str]):
        src = stream.state_dtype(n)
        self._buf = bytearray(layout.template)
        copies = []
        for dst_name, src_name in fields.items():
            dst_offset, size = layout.span(dst_name)
            src_dt, src_offset = src.fields[src_name][:2]
            if src_dt.itemsize != size or src_dt.base != layout.dtype.fields[dst_name][0].base:
                raise ValueError(f"{dst_name} <- {src_name}: the types differ")
            copies.append((dst_offset, src_offset, size))
        copies.sort()
        merged: list[list[int]] = []
        for d, s, k in copies:   # adjacent in both: one copy
            if merged and merged[-1][0] + merged[-1][2] == d and merged[-1][1] + merged[-1][2] == s:
                merged[-1][2] += k
            else:
                merged.append([d, s, k])
        self._copies = [(d, d + k, s, s + k) for d, s, k in merged]
        self._stamp_offset = layout.span("sec")[0]

    def encode(self, payload: memoryview, sec: int, nanosec: int) -> bytes:
        buf = self._buf
        for d0, d1, s0, s1 in self._copies:
            buf[d0:d1] = payload[s0:s1]
        struct.pack_into("<iI", buf, self._stamp_offset, sec, nanosec)
        return bytes(buf)


class McapStateWriter:
    """Writes one n-joint state stream into an MCAP file (topics and schemas: firmware_bridge.mcap_schema).

    The file is created at once; the MCAP writer starts with the first state message (when n is known,
    which sizes the chunks: `chunk_seconds` of messages at `rate_hz`). `close()` writes the summary and the
    footer; without it (a killed process) the file is still readable up to its last complete chunk."""

    def __init__(self, path: str | Path, *, joint_names: list[str] | None = None, rate_hz: float = 1000.0,
                 chunk_seconds: float = 0.25, metadata: dict[str, str] | None = None, overwrite: bool = False,
                 model=None, tf_rate_hz: float = TF_RATE_HZ):
        check_sizing(rate_hz, chunk_seconds)
        if model is not None and joint_names is None:
            joint_names = list(model.joint_names)
        self.model = model
        self.tf_every = max(1, round(rate_hz / tf_rate_hz))
        self._tf = None
        self._tf_pending: list[tuple[int, int, np.ndarray]] = []   # (seq, time ns, q) waiting for their /tf
        self.file = WriteThrough(path, overwrite=overwrite)
        self.path = self.file.path
        self.joint_names = list(joint_names) if joint_names else None
        self.rate_hz = float(rate_hz)
        self.chunk_seconds = float(chunk_seconds)
        self.metadata = dict(metadata or {})
        self.n: int | None = None
        self.samples_per_chunk = 0
        self._mcap: Writer | None = None
        self._channels: dict[str, int] = {}
        self._encoders: list[tuple[int, _SliceEncoder]] = []

    def _start(self, n: int | None) -> None:
        names = self.joint_names if self.joint_names and len(self.joint_names) == (n or 0) else \
            [f"j{k + 1}" for k in range(n or 0)]
        per_sample = 0
        layouts = []
        if n is not None:
            layouts = [(schema.TOPIC_JOINT_STATES, schema.JOINT_STATE, schema.joint_state_layout(names),
                        {"position": "q", "velocity": "qd", "effort": "torque"}),
                       (schema.TOPIC_MOTOR_CURRENTS, schema.JOINT_STATE,
                        schema.joint_state_layout(names, position=False, velocity=False), {"effort": "current"}),
                       (schema.TOPIC_EXTERNAL_TORQUE, schema.JOINT_STATE,
                        schema.joint_state_layout(names, position=False, velocity=False), {"effort": "tau_ext"}),
                       (schema.TOPIC_STATE, schema.ARM_STATE, schema.arm_state_layout(n),
                        {f: f for f in ("version", "flags", "seq", "device_time_ns", "host_time_ns", "q", "qd",
                                        "current", "torque", "statusword", "error_code", "mode")})]
            per_sample = sum(MCAP_RECORD_OVERHEAD + layout.size for _, _, layout, _ in layouts)
        chunk_bytes = max(MIN_CHUNK_BYTES, int(self.chunk_seconds * self.rate_hz * per_sample))
        self.samples_per_chunk = chunk_bytes // per_sample + 1 if per_sample else 0
        # chunk CRCs (mcap's default) cover the messages; the data section's CRC covers the rest, metadata included
        self._mcap = Writer(self.file, chunk_size=chunk_bytes, compression=CompressionType.ZSTD, enable_data_crcs=True)
        self._mcap.start(profile=schema.PROFILE, library="armid record (mcap-python)")
        self.n = n
        self.joint_names = names
        self._mcap.add_metadata("armid", {**self.metadata, "joints": ",".join(names), "n": str(n or 0),
                                          "rate_hz": f"{self.rate_hz:g}", "stream_version": str(stream.STREAM_VERSION),
                                          "chunk_seconds": f"{self.chunk_seconds:g}", "stamp": "host_time_ns"})
        schema_ids: dict[str, int] = {}
        for topic, (name, text), layout, fields in layouts:
            if name not in schema_ids:
                schema_ids[name] = self._mcap.register_schema(name, schema.SCHEMA_ENCODING, text.encode())
            channel = self._mcap.register_channel(topic, schema.MESSAGE_ENCODING, schema_ids[name])
            self._encoders.append((channel, _SliceEncoder(layout, n, fields)))
        if n is not None and self.model is not None and self.model.n == n:
            self._start_frames()

    def _register(self, topic: str, message: tuple[str, str]) -> int:
        sid = self._mcap.register_schema(message[0], schema.SCHEMA_ENCODING, message[1].encode())
        channel = self._channels[topic] = self._mcap.register_channel(topic, schema.MESSAGE_ENCODING, sid)
        return channel

    def _start_frames(self) -> None:
        """The robot description now and a /tf channel for the samples to come."""
        from ident.model import frames

        self._frames = frames
        self._description = (self._register(schema.TOPIC_ROBOT_DESCRIPTION, schema.STRING),
                             schema.encode_string(frames.robot_description(self.model)))
        self._tf = (self._register(schema.TOPIC_TF, schema.TF_MESSAGE), schema.tf_layout(frames.frame_tree(self.model)))

    @property
    def started(self) -> bool:
        return self._mcap is not None

    def write_state(self, payload: bytes, n: int, seq: int, host_time_ns: int) -> None:
        """One state payload already checked (docs/reference/stream.md, n joints, as the first one written)."""
        if self._mcap is None:
            self._start(n)
        sec, nanosec = schema.split_stamp(host_time_ns)
        view = memoryview(payload)
        sequence = seq & 0xFFFFFFFF
        for channel, encoder in self._encoders:
            self._mcap.add_message(channel, log_time=host_time_ns, publish_time=host_time_ns,
                                   data=encoder.encode(view, sec, nanosec), sequence=sequence)
        if self._tf is not None:
            self._write_frames(view, n, seq, host_time_ns)

    def _write_frames(self, payload: memoryview, n: int, seq: int, time_ns: int) -> None:
        """The description with the first sample; every tf_every-th sample's q kept for /tf, written TF_BATCH at a
        time (a killed recorder loses at most those, as it loses its last chunk)."""
        if self._description is not None:
            channel, data = self._description
            self._mcap.add_message(channel, log_time=time_ns, publish_time=time_ns, data=data)
            self._description = None
        if seq % self.tf_every:
            return
        q = np.frombuffer(payload, dtype="<f8", count=n, offset=stream.HEADER_SIZE).copy()
        self._tf_pending.append((seq, time_ns, q))
        if len(self._tf_pending) >= TF_BATCH:
            self._flush_frames()

    def _flush_frames(self) -> None:
        if not self._tf_pending:
            return
        channel, layout = self._tf
        t, r = self._frames.frame_transforms(self.model, np.array([q for _, _, q in self._tf_pending]))
        for k, (seq, time_ns, _) in enumerate(self._tf_pending):
            self._mcap.add_message(channel, log_time=time_ns, publish_time=time_ns,
                                   data=schema.encode_tf(layout, time_ns, t[k], r[k]), sequence=seq & 0xFFFFFFFF)
        self._tf_pending.clear()

    def write_health(self, health: dict, time_ns: int) -> None:
        """One health message (a dict, as the driver publishes it) as diagnostics, once the state messages have
        started the file."""
        from driver.diagnostics import statuses

        if self._mcap is None:
            return
        channel = self._channels.get(schema.TOPIC_DIAGNOSTICS)
        if channel is None:
            channel = self._register(schema.TOPIC_DIAGNOSTICS, schema.DIAGNOSTIC_ARRAY)
        data = schema.encode_diagnostics(statuses(health, self.joint_names or []), time_ns)
        self._mcap.add_message(channel, log_time=time_ns, publish_time=time_ns, data=data)

    def close(self, summary: dict[str, str] | None = None) -> None:
        """Write the summary and the footer (a complete MCAP), then close the file."""
        try:
            if self._mcap is None:
                self._start(None)
            if self._tf is not None:
                self._flush_frames()
            if summary:
                self._mcap.add_metadata("armid.summary", summary)
            self._mcap.finish()
        finally:
            self.file.close()


# -- the recording loop -------------------------------------------------------------------------------
@dataclass
class RecordingStats:
    """What a recording holds and what it lost."""

    path: str
    messages: int = 0              # state messages written
    first_seq: int | None = None
    last_seq: int | None = None
    dropped: int = 0               # seq numbers missing between consecutive messages (not invented)
    gaps: int = 0                  # places where seq jumped
    restarts: int = 0              # seq went backwards (the driver restarted)
    malformed: int = 0             # state/health messages skipped as malformed
    health: int = 0                # health messages written
    elapsed_s: float = 0.0
    bytes_written: int = 0
    samples_per_chunk: int = 0
    reasons: dict[str, int] = field(default_factory=dict)   # malformed: reason -> count

    recent_rate_hz: float = 0.0    # state messages per second since the previous progress report

    @property
    def rate_hz(self) -> float:
        """Mean state messages per second since the start."""
        return self.messages / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def line(self) -> str:
        """One progress line."""
        return (f"{self.path}: {self.messages} messages (seq {self.first_seq}..{self.last_seq}) in {self.elapsed_s:.1f} s, "
                f"{self.recent_rate_hz:.0f} msg/s; dropped {self.dropped} in {self.gaps} gaps; malformed {self.malformed}; "
                f"{self.bytes_written / 1e6:.2f} MB")

    def summary(self) -> dict[str, str]:
        keys = ("messages", "first_seq", "last_seq", "dropped", "gaps", "restarts", "malformed", "health", "elapsed_s")
        return {k: str(getattr(self, k)) for k in keys}


class _StateCheck:
    """Checks state payloads against the first good one (same n), naming what is wrong."""

    def __init__(self):
        self.n: int | None = None
        self._prefix = b""
        self._size = 0

    def check(self, payload: bytes) -> str | None:
        """None for a good payload, else the reason."""
        if self.n is None or len(payload) != self._size or payload[:8] != self._prefix:
            try:
                rec = stream.decode_state(payload)
            except stream.StreamDecodeError as exc:
                return str(exc)
            n = int(rec["n"])
            if self.n is None:
                if n == 0:
                    return "state message: n = 0 joints"
                self.n, self._size, self._prefix = n, len(payload), bytes(payload[:8])
            elif n != self.n:
                return f"state message: n = {n} joints, this recording has {self.n}"
        n = self.n
        values = np.frombuffer(payload, dtype="<f8", count=4 * n, offset=stream.HEADER_SIZE)
        if not np.isfinite(values).all():
            k = int(np.flatnonzero(~np.isfinite(values))[0])
            name = ("q", "qd", "current", "torque")[k // n]
            return f"state message: {name} of joint {k % n + 1} is {values[k]} (not finite)"
        if struct.unpack_from("<q", payload, 28)[0] < 0:
            return "state message: negative host_time_ns"
        return None


def record(path: str | Path, state_endpoint: str, *, joint_names: list[str] | None = None,
           rate_hz: float = 1000.0, chunk_seconds: float = 0.25, stop: threading.Event | None = None,
           duration_s: float | None = None, max_messages: int | None = None,
           progress: Callable[[RecordingStats], None] | None = None, progress_interval_s: float = 2.0,
           log: Callable[[str], None] | None = None, metadata: dict[str, str] | None = None,
           overwrite: bool = False, context: zmq.Context | None = None, model=None) -> RecordingStats:
    """Record the state stream at `state_endpoint` into the MCAP file `path` until `stop` is set,
    `duration_s` (s, from the call) has passed or `max_messages` state messages are written; then finish
    the file (summary and footer) and return what was recorded. `progress(stats)` is called every
    `progress_interval_s` (s) and at the end; `log(text)` names each kind of malformed message once. Given the
    model (ident.model.Model) of the arm, the recording carries /robot_description and /tf too."""
    log = log or (lambda text: None)
    writer = McapStateWriter(path, joint_names=joint_names, rate_hz=rate_hz, chunk_seconds=chunk_seconds,
                             metadata={"state_endpoint": state_endpoint, **(metadata or {})}, overwrite=overwrite,
                             model=model)
    stats = RecordingStats(path=writer.path)
    checker = _StateCheck()
    ctx = context or zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, RCVHWM)
    t0 = time.monotonic()
    deadline = None if duration_s is None else t0 + duration_s
    next_progress = t0 + progress_interval_s

    def bad(reason: str) -> None:
        stats.malformed += 1
        if reason not in stats.reasons and len(stats.reasons) >= MAX_REASONS:
            reason = "other malformed messages"
        if reason not in stats.reasons:
            log(f"skipping malformed message: {reason}")
            stats.reasons[reason] = 0
        stats.reasons[reason] += 1

    def handle(frames: list[bytes]) -> None:
        if len(frames) != 2:
            return bad(f"a message of {len(frames)} frames, expected [topic, payload]")
        topic, payload = frames
        if topic == stream.TOPIC_STATE:
            reason = checker.check(payload)
            if reason is not None:
                return bad(reason)
            seq, = struct.unpack_from("<Q", payload, 12)
            if stats.last_seq is not None:
                if seq > stats.last_seq + 1:
                    stats.dropped += seq - stats.last_seq - 1
                    stats.gaps += 1
                elif seq <= stats.last_seq:
                    stats.restarts += 1
                    log(f"seq went back from {stats.last_seq} to {seq}: the driver restarted")
            else:
                stats.first_seq = seq
            host_ns, = struct.unpack_from("<q", payload, 28)
            if not writer.started and joint_names and len(joint_names) != checker.n:
                log(f"{len(joint_names)} joint names for a stream of {checker.n} joints: naming them j1..j{checker.n}")
            writer.write_state(payload, checker.n, seq, host_ns)
            stats.last_seq = seq
            stats.messages += 1
        elif topic == stream.TOPIC_HEALTH:
            try:
                health = json.loads(payload.decode())
            except ValueError:
                return bad("health message: not UTF-8 JSON")
            if not isinstance(health, dict):
                return bad("health message: not a JSON object")
            if writer.started:
                try:
                    writer.write_health(health, time.time_ns())
                except (TypeError, ValueError) as exc:     # a field of an unexpected type: not data
                    return bad(f"health message: {exc}")
                stats.health += 1

    last = [t0, 0]   # time and message count of the previous report

    def report() -> None:
        now = time.monotonic()
        stats.elapsed_s = now - t0
        if now > last[0]:
            stats.recent_rate_hz = (stats.messages - last[1]) / (now - last[0])
        last[:] = [now, stats.messages]
        stats.bytes_written = writer.file.tell()
        stats.samples_per_chunk = writer.samples_per_chunk
        if progress is not None:
            progress(stats)

    failed: list[RecorderError] = []
    try:
        try:
            sub.connect(state_endpoint)
        except zmq.ZMQError as exc:
            raise RecorderError(f"state endpoint {state_endpoint}: {exc}") from None
        sub.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_STATE)
        sub.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_HEALTH)
        while not (stop is not None and stop.is_set()):
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if max_messages is not None and stats.messages >= max_messages:
                break
            if now >= next_progress:
                next_progress = now + progress_interval_s
                report()
            if not sub.poll(100):
                continue
            for _ in range(1000):   # drain what is queued, then look at the clock and the stop event again
                if max_messages is not None and stats.messages >= max_messages:
                    break
                try:
                    frames = sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                handle(frames)
    except OSError as exc:   # the disk, not the stream: say which file
        failed.append(RecorderError(f"{writer.path}: cannot write: {exc.strerror or exc}"))
    finally:
        sub.close(0)
        stats.elapsed_s = time.monotonic() - t0
        try:
            writer.close(stats.summary())
        except OSError as exc:
            failed.append(RecorderError(f"{writer.path}: cannot finish the file: {exc.strerror or exc}"))
        report()
    if failed:
        raise failed[0]
    return stats
