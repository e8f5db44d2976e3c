"""The MCAP recorder and its converter: messages that mcap-ros2-support decodes to the stream's values, a
live driver+simulator recorded without loss, a SIGKILLed recorder that loses at most its last chunk, clean
stops that write a complete file, conversions that round-trip exactly, and bad input that gets one error.
Everything runs on 127.0.0.1 or ipc://, every wait is bounded, every thread and process is stopped."""
import io
import math
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from mcap.reader import NonSeekingReader, make_reader
from mcap.records import Channel, Chunk, Message
from mcap.stream_reader import StreamReader, breakup_chunk
from mcap_ros2.decoder import DecoderFactory
from mcap_ros2.writer import Writer as Ros2Writer

from firmware_bridge import mcap_schema as schema
from firmware_bridge import stream
from driver.daemon import Driver, Endpoints
from driver.recorder import McapStateWriter, RecorderError, query_status, record
from firmware_bridge.recording import RecordingError, convert, identification_arrays, read_recording
from sim.local_transport import LocalSimArm
from ident.model import load_model
from sim import Simulator
from test_driver_daemon import _call, _client
from waiting import wait_until  # noqa: E402  (tests/ is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
LOCAL = Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
NAMES7 = ["base", "shoulder_pitch", "elbow", "w1", "wrist_2_long_name", "w3", "tool"]


# -- helpers -----------------------------------------------------------------------------------------
def payload(n, seq, *, rng=None, flags=0, device_ns=None, host_ns=None):
    """A state message with random values (docs/reference/stream.md), built with firmware_bridge.stream."""
    rng = rng or np.random.default_rng(seq)
    m = stream.StateMessage(n)
    m.q[:], m.qd[:], m.current[:], m.torque[:] = rng.normal(size=(4, n))
    m.statusword[:] = rng.integers(0, 1 << 16, n)
    m.error_code[:] = rng.integers(0, 1 << 16, n)
    m.mode[:] = rng.integers(-128, 128, n)
    m.tau_ext[:] = rng.normal(size=n)
    m.set_header(seq, flags, 1_000_000 * seq + 17 if device_ns is None else device_ns,
                 1_700_000_000_000_000_000 + 1_000_003 * seq if host_ns is None else host_ns)
    return bytes(m.buffer)


def write_synthetic(path, payloads, names=None, chunk_seconds=0.25, rate_hz=1000.0, metadata=None):
    writer = McapStateWriter(path, joint_names=names, chunk_seconds=chunk_seconds, rate_hz=rate_hz, metadata=metadata)
    for p in payloads:
        rec = stream.decode_state(p)
        writer.write_state(p, int(rec["n"]), int(rec["seq"]), int(rec["host_time_ns"]))
    writer.close({"messages": str(len(payloads))})
    return writer


def decoded_by_mcap_ros2(path, reader=make_reader):
    """{topic: [(message record, decoded ROS 2 message), ...]} through mcap-ros2-support's decoder."""
    out = {}
    with open(path, "rb") as f:
        for _, channel, message, ros in reader(f, decoder_factories=[DecoderFactory()]).iter_decoded_messages(
                log_time_order=False):
            out.setdefault(channel.topic, []).append((message, ros))
    return out


def wait_for(predicate, timeout) -> bool:
    return wait_until(predicate, timeout, 0.02)


def drain(sub, until_seq, timeout=30.0):
    """The state messages queued on a SUB socket, by seq, up to seq `until_seq` (the stream goes on)."""
    got = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and sub.poll(1000):
        topic, data = sub.recv_multipart()
        if topic == stream.TOPIC_STATE:
            state = stream.decode_state(data)
            got[int(state["seq"])] = state
            if state["seq"] >= until_seq:
                break
    return got


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


@pytest.fixture(scope="module")
def live(model):
    """A driver with the simulator in real time, on loopback, for the whole module."""
    sim = Simulator(model, seed=5, realtime=True)
    # a generous watchdog: on a loaded machine the simulator may fall behind; the watchdog is not tested here
    d = Driver(model, LocalSimArm(model, simulator=sim), endpoints=LOCAL, watchdog_s=10.0)
    d.start()
    yield d
    d.stop()
    sim.stop()


def _command(driver, **request):
    sock = _client(driver.bound["commands"])
    try:
        reply = _call(sock, timeout_ms=30000, **request)
        assert reply is not None, f"no reply to {request}"
        return reply
    finally:
        sock.close(0)


# -- what is written ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 6, 7])
def test_each_message_is_byte_identical_to_mcap_ros2_encoding_of_the_same_values(tmp_path, n):
    names = NAMES7[:n]
    payloads = [payload(n, seq) for seq in range(5)]
    write_synthetic(tmp_path / "r.mcap", payloads, names)
    ours = {}
    with open(tmp_path / "r.mcap", "rb") as f:
        for _, channel, message in make_reader(f).iter_messages(log_time_order=False):
            ours.setdefault(channel.topic, []).append(message.data)
    # the same values through mcap-ros2-support's own (generic) encoder
    buf = io.BytesIO()
    ref = Ros2Writer(buf)
    js, arm = ref.register_msgdef(*schema.JOINT_STATE), ref.register_msgdef(*schema.ARM_STATE)
    for p in payloads:
        s = stream.decode_state(p)
        sec, nsec = divmod(int(s["host_time_ns"]), 10**9)
        header = {"stamp": {"sec": sec, "nanosec": nsec}, "frame_id": ""}
        ref.write_message(schema.TOPIC_JOINT_STATES, js, {"header": header, "name": names, "position": s["q"].tolist(),
                                                          "velocity": s["qd"].tolist(), "effort": s["torque"].tolist()})
        ref.write_message(schema.TOPIC_MOTOR_CURRENTS, js, {"header": header, "name": names, "position": [],
                                                            "velocity": [], "effort": s["current"].tolist()})
        ref.write_message(schema.TOPIC_EXTERNAL_TORQUE, js, {"header": header, "name": names, "position": [],
                                                             "velocity": [], "effort": s["tau_ext"].tolist()})
        ref.write_message(schema.TOPIC_STATE, arm, {"header": header, **{k: s[k].tolist() for k in (
            "version", "flags", "seq", "device_time_ns", "host_time_ns", "q", "qd", "current", "torque", "statusword",
            "error_code", "mode")}})
    ref.finish()
    buf.seek(0)
    theirs = {}
    for _, channel, message in make_reader(buf).iter_messages(log_time_order=False):
        theirs.setdefault(channel.topic, []).append(message.data)
    assert set(ours) == {schema.TOPIC_JOINT_STATES, schema.TOPIC_MOTOR_CURRENTS, schema.TOPIC_EXTERNAL_TORQUE,
                         schema.TOPIC_STATE}
    for topic in ours:
        assert ours[topic] == theirs[topic], topic


def test_mcap_ros2_decodes_every_topic_to_the_values_of_the_stream(tmp_path):
    rng = np.random.default_rng(1)
    payloads = [payload(7, seq, rng=rng) for seq in range(40)]
    write_synthetic(tmp_path / "r.mcap", payloads, NAMES7, chunk_seconds=0.01)
    got = decoded_by_mcap_ros2(tmp_path / "r.mcap")
    states = [stream.decode_state(p) for p in payloads]
    assert [len(got[t]) for t in (schema.TOPIC_JOINT_STATES, schema.TOPIC_MOTOR_CURRENTS, schema.TOPIC_STATE)] == [40] * 3
    for s, (mj, js), (mc, cur), (ma, arm) in zip(states, got[schema.TOPIC_JOINT_STATES],
                                                 got[schema.TOPIC_MOTOR_CURRENTS], got[schema.TOPIC_STATE]):
        host = int(s["host_time_ns"])
        for m in (mj, mc, ma):
            assert m.log_time == m.publish_time == host and m.sequence == int(s["seq"])
        assert js.header.stamp.sec * 10**9 + js.header.stamp.nanosec == host and js.name == NAMES7
        assert js.position == s["q"].tolist() and js.velocity == s["qd"].tolist() and js.effort == s["torque"].tolist()
        assert cur.position == [] and cur.velocity == [] and cur.effort == s["current"].tolist() and cur.name == NAMES7
        for key in ("version", "flags", "seq", "device_time_ns", "host_time_ns"):
            assert getattr(arm, key) == int(s[key]), key
        for key in ("q", "qd", "current", "torque", "statusword", "error_code", "mode"):
            assert list(getattr(arm, key)) == s[key].tolist(), key
    assert [m.effort for _, m in got[schema.TOPIC_EXTERNAL_TORQUE]] == [s["tau_ext"].tolist() for s in states]
    with open(tmp_path / "r.mcap", "rb") as f:
        summary = make_reader(f).get_summary()
    assert summary.statistics.message_count == 160 and summary.statistics.chunk_count >= 4


# -- recording a live driver -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live_recording(live, tmp_path_factory):
    """A recording of the live driver while it moves, and what a plain SUB received meanwhile."""
    path = tmp_path_factory.mktemp("live") / "run.mcap"
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, 100000)
    sub.connect(live.bound["state"])
    sub.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_STATE)
    try:
        status = query_status(live.bound["commands"])
        # on a loaded machine the cycle may take longer than the driver's 2 s to take a request: ask again
        assert wait_for(lambda: live.cycle.enabled() or (_command(live, cmd="fault_reset" if live.cycle.fault else "enable")
                                                         and live.cycle.enabled()), 90)
        assert wait_for(lambda: live.cycle.motion is not None or _command(
            live, cmd="move_to", q=[0.4, -0.3, 0.3, 0.2, -0.3, 0.5], speed=0.3)["ok"], 90)
        stats = record(path, live.bound["state"], joint_names=status["joints"], max_messages=800, duration_s=60,
                       chunk_seconds=0.1)
        seen = drain(sub, stats.last_seq)
    finally:
        sub.close(0)
    return path, stats, seen, status


def test_a_live_recording_holds_every_message_received_in_seq_order_with_the_streams_values(live_recording, model):
    path, stats, seen, status = live_recording
    log = read_recording(path)
    seqs = log.states["seq"].astype(np.int64)
    assert stats.messages == 800 == len(seqs) and log.complete and log.skipped == 0
    assert seqs[0] == stats.first_seq and seqs[-1] == stats.last_seq
    assert np.all(np.diff(seqs) >= 1)
    assert stats.last_seq - stats.first_seq + 1 - stats.dropped == stats.messages
    assert log.seq_gaps() == (stats.dropped, stats.gaps)
    assert log.joint_names == tuple(model.joint_names) == tuple(status["joints"])
    common = [k for k, s in enumerate(seqs) if int(s) in seen]
    assert len(common) >= 700
    for k in common:
        ref = seen[int(seqs[k])]
        for key in ("q", "qd", "current", "torque", "statusword", "flags", "device_time_ns"):
            assert np.array_equal(log.states[key][k], ref[key]), key
    assert np.ptp(log.states["q"], axis=0).max() > 1e-3    # the arm moved while recorded
    assert (log.states["flags"] & stream.FLAG_ENABLED).all()


def test_conversion_to_csv_and_npz_round_trips_the_recorded_values_exactly(live_recording, tmp_path):
    path = live_recording[0]
    ros = [m for _, m in decoded_by_mcap_ros2(path)[schema.TOPIC_STATE]]   # the generic decoder as oracle
    fresh = [m for m in ros if not m.flags & stream.FLAG_STALE]
    dev = np.array([m.device_time_ns for m in fresh])
    assert np.all(np.diff(dev) > 0)
    for effort, column, array in (("torque", "tau", "tau"), ("current", "i", "current")):
        for suffix in (".csv", ".npz"):
            out = tmp_path / f"run-{effort}{suffix}"
            arrays, notes = convert(path, out, effort)
            if suffix == ".csv":
                lines = out.read_text().splitlines()
                assert lines[0] == "# lost_samples = 0"                # the header's comment, then the columns
                header = lines[1].split(",")
                assert header == (["t"] + [f"q{j}" for j in range(1, 7)] + [f"{column}{j}" for j in range(1, 7)]
                                  + [f"qd{j}" for j in range(1, 7)])
                table = np.loadtxt(out, delimiter=",", skiprows=2)
                t, q, y, qd = table[:, 0], table[:, 1:7], table[:, 7:13], table[:, 13:19]
            else:
                with np.load(out) as z:
                    assert sorted(z.files) == sorted(["t", "q", array, "qd", "effort_delay", "lost_samples"])
                    assert z["effort_delay"].shape == () and float(z["effort_delay"]) == 0.0   # not configured
                    t, q, y, qd = z["t"], z["q"], z[array], z["qd"]
            assert len(t) == len(fresh)
            np.testing.assert_array_equal(t, (dev - dev[0]) / 1e9)
            np.testing.assert_array_equal(q, [m.q for m in fresh])
            np.testing.assert_array_equal(qd, [m.qd for m in fresh])
            np.testing.assert_array_equal(y, [getattr(m, effort) for m in fresh])
            stale = len(ros) - len(fresh)
            assert any(f"{stale} STALE" in note for note in notes) == (stale > 0)


# -- crash safety and clean stops --------------------------------------------------------------------
def _chunks_on_disk(path):
    """Complete chunks in a file being written, read as a stream (no footer needed)."""
    count = 0
    try:
        with open(path, "rb") as f:
            for record in StreamReader(f, emit_chunks=True).records:
                count += type(record).__name__ == "Chunk"
    except Exception:   # noqa: BLE001 - the file ends inside a record while it is being written
        pass
    return count


class _Lines:
    """Collects a process's stderr lines in a thread (joined when the pipe closes)."""

    def __init__(self, pipe):
        self.lines = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe):
        for line in pipe:
            self.lines.append(line.rstrip("\n"))

    def join(self):
        self._thread.join(30)
        return self.lines


def _recorder(state, out, *extra):
    proc = subprocess.Popen([sys.executable, "-m", "armid.cli", "record", "--state", state, "-o", str(out), *extra],
                            cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    return proc, _Lines(proc.stderr)


def _count(line):
    """The message count of a progress line: 'armid record: <file>: 1234 messages (seq ...'."""
    return int(re.search(r": (\d+) messages \(seq", line).group(1))


def test_a_sigkilled_recorder_loses_at_most_its_last_chunk_and_its_file_stays_readable(live, tmp_path):
    out = tmp_path / "killed.mcap"
    chunk_seconds, rate = 0.05, 1000.0
    proc, err = _recorder(live.bound["state"], out, "--chunk-seconds", str(chunk_seconds), "--rate", str(rate),
                          "--progress-interval", "0.05")
    try:
        assert wait_for(lambda: proc.poll() is None and _chunks_on_disk(out) >= 4, 90), err.lines
        assert wait_for(lambda: sum("messages (seq" in line for line in err.lines) >= 2, 30)
        reported = max(_count(line) for line in err.lines if "messages (seq" in line)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    err.join()
    # the mcap library's non-seeking reader reads it up to where it was cut
    seqs = []
    with pytest.raises(Exception):   # noqa: PT011 - the file ends without a footer: the reader must stop
        with open(out, "rb") as f:
            for _, channel, message in NonSeekingReader(f).iter_messages(log_time_order=False):
                if channel.topic == schema.TOPIC_STATE:
                    seqs.append(message.sequence)
    log = read_recording(out)
    assert not log.complete and "cut short" in log.cut_note
    got = log.states["seq"].astype(np.int64)
    assert (got & 0xFFFFFFFF).tolist() == seqs
    assert np.array_equal(got, np.arange(got[0], got[0] + len(got)))      # consecutive from the start
    per_chunk = math.ceil(chunk_seconds * rate) + 1
    assert reported - per_chunk <= len(got)
    assert len(got) >= 3 * (per_chunk - 1)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_sigint_and_sigterm_finish_a_complete_mcap_with_summary_and_footer(live, tmp_path, sig):
    out = tmp_path / "clean.mcap"
    proc, err = _recorder(live.bound["state"], out, "--commands", live.bound["commands"], "--progress-interval", "0.1")
    try:
        assert wait_for(lambda: any("messages (seq" in line and _count(line) > 50 for line in err.lines), 90), err.lines
        proc.send_signal(sig)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    lines = err.join()
    assert "is complete" in lines[-1]
    with open(out, "rb") as f:
        reader = make_reader(f)   # the seeking reader: needs the footer and the summary
        summary = reader.get_summary()
        meta = {m.name: m.metadata for m in reader.iter_metadata()}
    log = read_recording(out)
    counts = summary.statistics.channel_message_counts
    by_topic = {summary.channels[c].topic: k for c, k in counts.items()}
    assert log.complete and by_topic[schema.TOPIC_STATE] == len(log.states) == int(meta["armid.summary"]["messages"])
    assert by_topic[schema.TOPIC_JOINT_STATES] == by_topic[schema.TOPIC_MOTOR_CURRENTS] == len(log.states)
    assert meta["armid"]["model"] == "generic6" and meta["armid"]["joints"] == ",".join(live.model.joint_names)
    assert by_topic[schema.TOPIC_ROBOT_DESCRIPTION] == 1 and by_topic[schema.TOPIC_TF] >= len(log.states) // 40


def test_a_model_whose_joints_are_not_the_drivers_is_refused_before_recording(live, tmp_path):
    done = subprocess.run([sys.executable, "-m", "armid.cli", "record", "--state", live.bound["state"], "--commands",
                           live.bound["commands"], "--model", "puma560", "-o", str(tmp_path / "x.mcap"),
                           "--duration", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--model puma560: joints waist" in done.stderr and "(j1, j2" in done.stderr


def test_duration_stops_the_recording_with_a_complete_file(live, tmp_path):
    stop = threading.Event()
    t0 = time.monotonic()
    stats = record(tmp_path / "d.mcap", live.bound["state"], duration_s=0.5, stop=stop)
    assert time.monotonic() - t0 >= 0.5
    log = read_recording(tmp_path / "d.mcap")
    assert log.complete and len(log.states) == stats.messages > 0


# -- what is not data --------------------------------------------------------------------------------
def test_seq_gaps_are_counted_and_malformed_messages_are_skipped_and_named(tmp_path):
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/state"
    pub.bind(endpoint)
    good = [payload(3, s) for s in (0, 1, 2, 5, 6, 0, 1)]          # 3, 4 missing; then the driver restarts
    nan = bytearray(payload(3, 8))
    nan[36 + 8 * 2: 36 + 8 * 3] = np.float64(np.nan).tobytes()      # q of joint 3
    wrong_magic = b"XRMS" + payload(3, 9)[4:]
    other_n = payload(4, 10)
    messages = [[stream.TOPIC_STATE, good[0]], [stream.TOPIC_STATE, good[1]], [stream.TOPIC_STATE, good[2][:-1]],
                [stream.TOPIC_STATE, bytes(nan)], [stream.TOPIC_STATE, wrong_magic], [stream.TOPIC_STATE, good[2]],
                [stream.TOPIC_STATE, other_n], [stream.TOPIC_STATE, good[3], b"extra"], [stream.TOPIC_STATE, good[3]],
                [stream.TOPIC_HEALTH, b"\xff not json"], [stream.TOPIC_HEALTH, b'{"cycles": 1}'],
                [stream.TOPIC_STATE, good[4]], [stream.TOPIC_STATE, good[5]], [stream.TOPIC_STATE, good[6]]]
    result, logged = {}, []
    thread = threading.Thread(target=lambda: result.update(stats=record(
        tmp_path / "r.mcap", endpoint, max_messages=7, duration_s=60, log=logged.append)))
    thread.start()
    try:
        subscribed = set()
        deadline = time.monotonic() + 30
        while subscribed != {stream.TOPIC_STATE, stream.TOPIC_HEALTH} and time.monotonic() < deadline:
            if pub.poll(100):
                event = pub.recv()
                if event[0] == 1:
                    subscribed.add(event[1:])
        assert subscribed == {stream.TOPIC_STATE, stream.TOPIC_HEALTH}
        for m in messages:
            pub.send_multipart(m)
    finally:
        thread.join(60)
        pub.close(0)
    assert not thread.is_alive()
    stats = result["stats"]
    assert (stats.messages, stats.dropped, stats.gaps, stats.restarts, stats.malformed, stats.health) == (7, 2, 1, 1, 6, 1)
    reasons = "\n".join(logged)
    for text in ("170 bytes for n = 3 (version 3), expected 171", "q of joint 3 is nan", "magic b'XRMS'", "n = 4 joints, this recording has 3",
                 "3 frames", "health message: not UTF-8 JSON", "went back from 6 to 0"):
        assert text in reasons, text
    log = read_recording(tmp_path / "r.mcap")
    assert log.states["seq"].tolist() == [0, 1, 2, 5, 6, 0, 1]
    for k, p in enumerate(good):
        assert np.array_equal(log.states["q"][k], stream.decode_state(p)["q"])
    assert len(decoded_by_mcap_ros2(tmp_path / "r.mcap")[schema.TOPIC_DIAGNOSTICS]) == 1


def test_the_converter_leaves_out_stale_samples_and_reports_seq_gaps(tmp_path):
    n = 2
    payloads = []
    for seq in range(40):
        stale = seq in (5, 6)
        payloads.append(payload(n, seq, flags=stream.FLAG_STALE if stale else 0,
                                device_ns=(4 if stale else seq) * 1_000_000 + 5))
    del payloads[20:23]                                                # three dropped messages
    write_synthetic(tmp_path / "g.mcap", payloads)
    arrays, notes = identification_arrays(read_recording(tmp_path / "g.mcap"), "current")
    kept = [p for p in payloads if not stream.decode_state(p)["flags"] & stream.FLAG_STALE]
    np.testing.assert_array_equal(arrays["t"], [(int(stream.decode_state(p)["device_time_ns"]) - 5) / 1e9 for p in kept])
    np.testing.assert_array_equal(arrays["current"], [stream.decode_state(p)["current"] for p in kept])
    assert set(arrays) == {"t", "q", "current", "qd", "effort_delay", "lost_samples"}
    assert int(arrays["lost_samples"]) == 0                          # seq gaps are no device samples lost
    assert any("3 messages missing in 1 seq gaps" in note for note in notes)
    assert any("2 STALE samples" in note for note in notes)
    assert not any("device samples lost" in note for note in notes)


def test_the_converter_reports_device_samples_the_driver_lost(tmp_path):
    payloads = [payload(2, seq, flags=stream.lost_flags(3 if seq == 10 else 2 if seq == 30 else 0),
                        device_ns=seq * 1_000_000) for seq in range(40)]
    write_synthetic(tmp_path / "l.mcap", payloads)
    arrays, notes = identification_arrays(read_recording(tmp_path / "l.mcap"), "current")
    assert len(arrays["t"]) == 40                                      # nothing is filled in or left out
    assert any(note.startswith("5 device samples lost by the driver") for note in notes)
    assert int(arrays["lost_samples"]) == 5


def test_a_file_cut_at_any_byte_reads_as_a_prefix_of_the_recording_or_as_one_error(tmp_path):
    payloads = [payload(2, seq) for seq in range(60)]
    full = tmp_path / "full.mcap"
    write_synthetic(full, payloads, chunk_seconds=0.01)                # about 11 samples a chunk
    data = full.read_bytes()
    per_chunk, topics = [], {}
    with open(full, "rb") as f:                                        # the /armid/state messages of each chunk
        for chunk in StreamReader(f, emit_chunks=True).records:
            if isinstance(chunk, Chunk):
                records = breakup_chunk(chunk)
                topics.update({r.id: r.topic for r in records if isinstance(r, Channel)})
                per_chunk.append(sum(isinstance(r, Message) and topics[r.channel_id] == schema.TOPIC_STATE
                                     for r in records))
    boundaries = set(np.cumsum(per_chunk).tolist()) | {0}
    assert len(per_chunk) >= 5 and sum(per_chunk) == 60
    cut = tmp_path / "cut.mcap"
    previous = 0
    for size in range(0, len(data), len(data) // 150 + 1):
        cut.write_bytes(data[:size])
        try:
            log = read_recording(cut)
        except RecordingError as exc:
            assert str(exc).startswith(f"{cut}: ") and previous == 0
            continue
        seqs = log.states["seq"].tolist()
        assert seqs == list(range(len(seqs))) and len(seqs) >= previous and not log.complete
        assert len(seqs) in boundaries                                 # whole chunks only
        previous = len(seqs)
    assert previous >= 44


def test_bad_recordings_get_one_error_naming_the_file(tmp_path):
    text = tmp_path / "notes.mcap"
    text.write_text("t,q1\n0,1\n")
    empty = tmp_path / "empty.mcap"
    empty.write_bytes(b"")
    other = tmp_path / "other.mcap"
    with open(other, "wb") as f:
        w = Ros2Writer(f)
        w.write_message("/chatter", w.register_msgdef(*schema.STRING), {"data": "hi"})
        w.finish()
    good = tmp_path / "good.mcap"
    write_synthetic(good, [payload(2, s) for s in range(30)], chunk_seconds=0.01)
    data = bytearray(good.read_bytes())
    head = tmp_path / "head.mcap"
    head.write_bytes(bytes(data[:60]))
    corrupt = tmp_path / "corrupt.mcap"
    with open(good, "rb") as f:
        chunk = make_reader(f).get_summary().chunk_indexes[1]
    data[chunk.chunk_start_offset + chunk.chunk_length // 2] ^= 0xFF  # a flipped byte inside a chunk
    corrupt.write_bytes(bytes(data))
    cases = [(tmp_path / "missing.mcap", "no such file"), (text, "not an MCAP file"), (empty, "empty file"),
             (other, "no /armid/state messages (armid_msgs/msg/ArmState); topics found: /chatter (1)"),
             (head, "cut short"), (corrupt, "corrupt MCAP")]
    for path, expected in cases:
        with pytest.raises(RecordingError) as info:
            convert(path, tmp_path / "out.csv")
        assert str(info.value).startswith(f"{path}: ") and expected in str(info.value), str(info.value)
    with pytest.raises(RecordingError, match="unknown output format '.txt'"):
        convert(good, tmp_path / "out.txt")
    assert not (tmp_path / "out.csv").exists()


def test_the_cli_prints_one_line_and_exits_2_for_a_bad_recording(tmp_path):
    bad = tmp_path / "bad.mcap"
    bad.write_text("hello")
    out = subprocess.run([sys.executable, "-m", "armid.cli", "record", "convert", str(bad), "-o", str(tmp_path / "x.npz")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [f"armid: {bad}: not an MCAP file (it does not start with the MCAP magic bytes)"]


def test_a_silent_endpoint_gives_an_empty_complete_recording_and_a_status_timeout(tmp_path):
    stats = record(tmp_path / "none.mcap", f"ipc://{tmp_path}/nobody", duration_s=0.3)
    assert stats.messages == 0
    with open(tmp_path / "none.mcap", "rb") as f:
        assert make_reader(f).get_summary().statistics.message_count == 0
    with pytest.raises(RecorderError, match="no reply to status within 0.3 s"):
        query_status(f"ipc://{tmp_path}/nobody-commands", timeout_s=0.3)
    with pytest.raises(RecorderError, match="exists"):
        record(tmp_path / "none.mcap", f"ipc://{tmp_path}/nobody", duration_s=0.1)


def test_the_identification_loader_reads_the_converted_files(tmp_path):
    preprocess = pytest.importorskip("ident.fit.preprocess")
    if not hasattr(preprocess, "load_recording"):
        pytest.skip("ident.fit.preprocess.load_recording is not on this branch")
    payloads = [payload(6, seq) for seq in range(64)]
    write_synthetic(tmp_path / "u.mcap", payloads)
    for effort, suffix in (("torque", ".csv"), ("current", ".npz")):
        arrays, _ = convert(tmp_path / "u.mcap", tmp_path / f"u{suffix}", effort)
        rec = preprocess.load_recording(tmp_path / f"u{suffix}", n=6)
        np.testing.assert_array_equal(rec.t, arrays["t"])
        np.testing.assert_array_equal(rec.q, arrays["q"])
        np.testing.assert_array_equal(rec.y, arrays["tau" if effort == "torque" else "current"])


def test_record_info_says_whether_a_file_is_complete_and_counts_gaps_and_flags(tmp_path, capsys):
    from armid.cli import main

    payloads = [payload(2, seq, flags=stream.FLAG_ENABLED | (stream.FLAG_STALE if seq % 4 == 0 else 0))
                for seq in range(50) if seq not in (30, 31)]
    write_synthetic(tmp_path / "a.mcap", payloads, names=["shoulder", "elbow"], chunk_seconds=0.01)
    data = (tmp_path / "a.mcap").read_bytes()
    (tmp_path / "cut.mcap").write_bytes(data[:len(data) // 2])
    assert main(["record", "info", str(tmp_path / "a.mcap")]) == 0
    out = capsys.readouterr().out
    assert "complete; 48 state messages of 2 joints (shoulder, elbow), seq 0..49" in out
    assert "2 messages missing in 1 seq gaps" in out
    assert re.search(r"ENABLED +48 samples", out) and re.search(r"STALE +13 samples", out)   # seq 0, 4, .., 48
    assert main(["record", "info", str(tmp_path / "cut.mcap")]) == 0
    assert "cut short (no footer)" in capsys.readouterr().out


def test_the_drivers_effort_delay_travels_from_the_recording_to_identification(tmp_path):
    """The driver's configured effort delay (status -> recorder metadata) reaches the NPZ that identify reads,
    and a recording whose metadata says something else than seconds is refused by name."""
    from ident.fit.preprocess import load_recording

    payloads = [payload(2, seq, device_ns=seq * 1_000_000) for seq in range(40)]
    write_synthetic(tmp_path / "d.mcap", payloads, metadata={"effort_delay_s": repr(0.5e-3)})
    arrays, _ = convert(tmp_path / "d.mcap", tmp_path / "d.npz", "current")
    assert float(arrays["effort_delay"]) == 0.5e-3
    assert load_recording(tmp_path / "d.npz").effort_delay == 0.5e-3
    write_synthetic(tmp_path / "bad.mcap", payloads, metadata={"effort_delay_s": "half a period"})
    with pytest.raises(RecordingError, match="effort_delay_s: expected seconds, got 'half a period'"):
        identification_arrays(read_recording(tmp_path / "bad.mcap"))


def _top_records(data: bytes) -> list[tuple[int, int]]:
    """(opcode, offset) of the top-level records after the magic."""
    out, at = [], 8
    while at + 9 <= len(data) - 8:
        out.append((data[at], at))
        at += 9 + struct.unpack_from("<Q", data, at + 1)[0]
    return out


def _damage_length(data: bytearray, opcode: int, offset: int, fmt: str, value: int) -> None:
    at = next(a for op, a in _top_records(data) if op == opcode)
    struct.pack_into(fmt, data, at + offset, value)


@pytest.mark.parametrize("opcode, offset, fmt, value, expected", [
    (0x01, 1, "<Q", 2 ** 64 - 1, "corrupt MCAP"),                              # the header record's length
    (0x01, 9, "<I", 2 ** 32 - 1, "a length of 4294967295 bytes"),              # its profile string's length
    (0x06, 25, "<Q", 2 ** 62, "a chunk of 4611686018427387904 bytes uncompressed"),   # a chunk's uncompressed size
    (0x06, 45, "<Q", 2 ** 63, "corrupt MCAP"),                                 # the length of a chunk's records
    (0x06, 1, "<Q", 2 ** 40, "corrupt MCAP"),                                  # a chunk record's length
])
def test_a_damaged_length_is_one_recording_error_never_an_allocation(tmp_path, opcode, offset, fmt, value, expected):
    path = tmp_path / "d.mcap"
    write_synthetic(path, [payload(3, s) for s in range(300)], chunk_seconds=0.05)
    data = bytearray(path.read_bytes())
    _damage_length(data, opcode, offset, fmt, value)
    path.write_bytes(bytes(data))
    t0 = time.monotonic()
    with pytest.raises(RecordingError, match=re.escape(expected)) as err:
        read_recording(path)
    assert str(path) in str(err.value) and time.monotonic() - t0 < 10


def _without_topic(src, dst, topic):
    """A copy of the MCAP file src at dst without the messages of `topic` (a recording made before it existed)."""
    from mcap.writer import Writer

    with open(src, "rb") as f, open(dst, "wb") as out:
        reader = make_reader(f)
        w = Writer(out)
        w.start(profile=schema.PROFILE, library="test")
        schemas, channels = {}, {}
        for sch, channel, message in reader.iter_messages(log_time_order=False):
            if channel.topic == topic:
                continue
            if sch.id not in schemas:
                schemas[sch.id] = w.register_schema(sch.name, sch.encoding, sch.data)
            if channel.id not in channels:
                channels[channel.id] = w.register_channel(channel.topic, channel.message_encoding, schemas[sch.id])
            w.add_message(channels[channel.id], log_time=message.log_time, publish_time=message.publish_time,
                          data=message.data, sequence=message.sequence)
        w.finish()


def test_the_external_torque_is_read_back_and_recordings_without_it_still_load(tmp_path):
    rng = np.random.default_rng(3)
    payloads = [payload(7, seq, rng=rng) for seq in range(60)]
    write_synthetic(tmp_path / "r.mcap", payloads, NAMES7, chunk_seconds=0.01)
    states = [stream.decode_state(p) for p in payloads]
    log = read_recording(tmp_path / "r.mcap")
    assert log.external_torque == 60
    np.testing.assert_array_equal(log.states["tau_ext"], np.array([s["tau_ext"] for s in states]))
    assert np.abs(log.states["tau_ext"]).min() > 0
    _without_topic(tmp_path / "r.mcap", tmp_path / "old.mcap", schema.TOPIC_EXTERNAL_TORQUE)
    old = read_recording(tmp_path / "old.mcap")
    assert old.external_torque == 0 and not old.states["tau_ext"].any()
    np.testing.assert_array_equal(old.states["q"], log.states["q"])
