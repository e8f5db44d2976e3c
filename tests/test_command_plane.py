"""The command plane against hostile and careless clients: nothing a client sends silences the command
socket, pauses the stream or bypasses the limits.

A live driver (simulated arm, real ZeroMQ on loopback) takes the corpus of tests/hostile_requests.py in
batches, pipelined from a DEALER client as a flood; after each batch `status` and `quick_stop` answer, the
stream's seq has no gap, and the driver has not faulted. Hypothesis adds random bytes and random JSON.
"""
from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from importlib import resources

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driver.daemon import Driver, Endpoints
from driver.requests import MAX_DEPTH, RequestError, decode_request, nesting_depth
from sim.local_transport import LocalSimArm
from firmware_bridge import stream
from hostile_requests import CASES, hostile_requests
from ident.fit import excitation
from ident.model import load_model
from sim import Simulator

LOCAL = Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
CORPUS_SIZE = 100_000
BATCH = 5_000
WINDOW = 48               # requests in flight (under the server's 64 per client: every one is read and answered)


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trajectories")
    traj = excitation.FourierTrajectory(0.5, np.zeros(6), np.tile([0.05, -0.05], (6, 1)), np.zeros((6, 2)))
    assert excitation.at_rest(traj)
    excitation.save(traj, folder / "t.toml")
    (folder / "sub").mkdir()
    os.mkfifo(folder / "fifo.toml")
    (folder / "big.toml").write_bytes(b"#" * (2 * 1024 * 1024))
    return folder


class StreamWatch:
    """Collects every state message's seq and flags in a thread (the test's own process never drops them:
    unbounded receive queue)."""

    def __init__(self, endpoint: str):
        self.sub = zmq.Context.instance().socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, 0)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(endpoint)
        self.sub.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_STATE)
        self.seqs: list[int] = []
        self.faults = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.sub.poll(50):
                rec = stream.decode_state(self.sub.recv_multipart()[1])
                self.seqs.append(int(rec["seq"]))
                self.faults += bool(rec["flags"] & stream.FLAG_FAULT)

    def gaps(self) -> list[tuple[int, int]]:
        s = np.array(self.seqs)
        k = np.flatnonzero(np.diff(s) != 1)
        return [(int(s[i]), int(s[i + 1])) for i in k]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sub.close(0)


@pytest.fixture(scope="module")
def driver(model, trajectories):
    sim = Simulator(model, seed=5, realtime=True)
    d = Driver(model, LocalSimArm(model, simulator=sim), endpoints=LOCAL, watchdog_s=0.5,
               trajectory_dir=str(trajectories), max_motion_s=120.0)
    d.start()
    yield d
    d.stop()
    sim.stop()


def _req(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def _call(sock: zmq.Socket, timeout_ms: int = 10000, **request) -> dict:
    sock.send(json.dumps(request).encode())
    assert sock.poll(timeout_ms), f"no reply to {request} within {timeout_ms} ms"
    return json.loads(sock.recv())


def _raw(sock: zmq.Socket, raw: bytes, timeout_ms: int = 10000) -> dict:
    sock.send(raw)
    assert sock.poll(timeout_ms), f"no reply to {raw[:80]!r} within {timeout_ms} ms"
    return json.loads(sock.recv())


# -- decoding, in-process ------------------------------------------------------------------------------
@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=400))
def test_decode_request_raises_only_request_errors_for_any_bytes(raw):
    try:
        req = decode_request(raw)
    except RequestError:
        return
    assert isinstance(req, dict) and isinstance(req["cmd"], str)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=30)


@settings(max_examples=2000, deadline=None)
@given(_json)
def test_decode_request_bounds_any_json(value):
    raw = json.dumps(value).encode()          # NaN and Infinity included: json.dumps writes them
    try:
        decode_request(raw)
    except RequestError as exc:
        assert str(exc).startswith("request")


def test_nesting_is_measured_outside_strings_and_without_recursion():
    assert nesting_depth(b'{"cmd": "[[[[[[[[[[["}') == 1
    assert nesting_depth(b'{"a": "\\"[[[[[[[[[[", "b": [1]}') == 2
    assert nesting_depth(b"[" * 100_000) == 100_000
    with pytest.raises(RequestError, match=f"at most {MAX_DEPTH}"):
        decode_request(b"[" * 100_000 + b"]" * 100_000)


def _depth_by_scanning(raw: bytes) -> int:
    """The nesting depth by a byte-by-byte scan: a string opens at a quote that a later unescaped quote closes
    (an unclosed one is an ordinary byte), a backslash in it escapes the next byte."""
    depth = deepest = k = 0
    while k < len(raw):
        c = raw[k:k + 1]
        if c == b'"':
            j = k + 1
            while j < len(raw) and raw[j:j + 1] != b'"':
                j += 2 if raw[j:j + 1] == b"\\" else 1
            if j < len(raw):
                k = j + 1
                continue
        depth += (c in b"[{") - (c in b"]}")
        deepest = max(deepest, depth)
        k += 1
    return deepest


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=40).map(lambda b: bytes(b'"\\[]{}a '[x % 8] for x in b)))
def test_nesting_depth_skips_exactly_the_strings_a_scan_finds(raw):
    """Quotes, escapes and brackets in any order, unclosed strings and stray backslashes included."""
    assert nesting_depth(raw) == _depth_by_scanning(raw)


# -- the live socket -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name, raw, expected", CASES, ids=[c[0] for c in CASES])
def test_each_named_hostile_request_gets_an_error_naming_the_fault(driver, name, raw, expected):
    sock = _req(driver.bound["commands"])
    try:
        reply = _raw(sock, raw)
        assert reply["ok"] is False
        assert expected in reply["error"], reply["error"]
        assert _call(sock, cmd="status")["ok"]
    finally:
        sock.close(0)


def test_a_hundred_thousand_hostile_requests_leave_the_command_plane_answering(driver):
    """The corpus as a pipelined flood (WINDOW requests in flight), in batches; after each, status and quick_stop
    answer, the driver has not faulted; at the end the stream has no seq gap and nothing raised inside."""
    watch = StreamWatch(driver.bound["state"])
    flood = zmq.Context.instance().socket(zmq.DEALER)
    flood.setsockopt(zmq.LINGER, 0)
    flood.setsockopt(zmq.SNDTIMEO, 10_000)     # a driver that stopped reading fails the test (zmq.Again), no hang
    flood.connect(driver.bound["commands"])
    control = _req(driver.bound["commands"])
    before = dict(driver.command_server.stats())
    sent = replies = ok = 0
    started = time.monotonic()

    def take_reply(timeout_ms: int) -> bool:
        nonlocal replies, ok
        if not flood.poll(timeout_ms):
            return False
        reply = json.loads(flood.recv_multipart()[-1])
        replies += 1
        ok += bool(reply["ok"])
        assert reply["ok"] or reply["error"]
        return True

    try:
        assert _call(control, cmd="enable")["ok"]
        requests = hostile_requests(driver.model.n, CORPUS_SIZE, seed=11)
        for batch in range(CORPUS_SIZE // BATCH):
            for _ in range(BATCH):
                while sent - replies >= WINDOW:
                    assert take_reply(60_000), f"batch {batch}: no reply within 60 s"
                flood.send_multipart([b"", next(requests)])
                sent += 1
            while replies < sent:
                assert take_reply(60_000), f"batch {batch}: {sent - replies} requests unanswered after 60 s"
            assert _call(control, cmd="status")["ok"]
            assert _call(control, cmd="quick_stop")["ok"]
            assert driver.cycle.fault is None
            assert _call(control, cmd="enable")["ok"]
        stats = driver.command_server.stats()
        assert stats["internal_errors"] == before["internal_errors"], stats["last_internal_error"]
        assert stats["received"] - before["received"] >= CORPUS_SIZE
        assert stats["unsent_replies"] == before["unsent_replies"]
        assert stats["refused_busy"] == before["refused_busy"]            # every request was decoded and handled
    finally:
        _call(control, cmd="disable")
        flood.close(0)
        control.close(0)
        time.sleep(0.2)
        watch.close()
    print(f"{CORPUS_SIZE} hostile requests in {time.monotonic() - started:.1f} s, {ok} accepted, "
          f"planner jobs {stats['planner']['jobs'] - before['planner']['jobs']}")
    assert len(watch.seqs) > 1000
    assert watch.gaps() == []
    assert watch.faults == 0
    assert ok < replies          # most were refused; those accepted were checked motions or harmless


def test_quick_stop_is_answered_while_a_flood_and_a_plan_are_in_flight(driver):
    flood = zmq.Context.instance().socket(zmq.DEALER)
    flood.setsockopt(zmq.LINGER, 0)
    flood.setsockopt(zmq.SNDHWM, 0)
    flood.connect(driver.bound["commands"])
    control = _req(driver.bound["commands"])
    try:
        assert _call(control, cmd="enable")["ok"]
        assert _call(control, cmd="move_to", q=[0.3, -0.2, 0.3, 0.2, 0.2, 0.3], speed=0.2)["ok"]
        assert driver.cycle.motion is not None
        t = np.linspace(0.0, 100.0, 2001)
        q = 0.05 * np.sin(2 * np.pi * 0.1 * t)[:, None] * np.ones(driver.model.n)
        big = json.dumps({"cmd": "run_trajectory", "samples": {"t": t.tolist(), "q": q.tolist()}}).encode()
        flood.send_multipart([b"", big])                     # a plan for the planner process
        for raw in hostile_requests(driver.model.n, 3000, seed=3):
            flood.send_multipart([b"", raw])
        reply = _call(control, timeout_ms=2000, cmd="quick_stop")
        assert reply["ok"]
        assert driver.cycle.motion is None and driver.cycle.quick_stop
    finally:
        flood.close(0)
        _call(control, cmd="disable")
        control.close(0)
        deadline = time.monotonic() + 60              # the large plan finishes (the next tests need the planner)
        while driver.command_server.stats()["planner"]["busy"] and time.monotonic() < deadline:
            time.sleep(0.1)


def test_trajectory_files_come_only_from_the_trajectory_folder(driver, trajectories, tmp_path):
    outside = tmp_path / "outside.toml"
    excitation.save(excitation.preset("seed000"), outside)
    (trajectories / "link.toml").unlink(missing_ok=True)
    (trajectories / "link.toml").symlink_to(outside)
    sock = _req(driver.bound["commands"])
    try:
        errors = {name: _call(sock, cmd="run_trajectory", file=name)["error"]
                  for name in (str(outside), "../" + outside.name, "link.toml", "/nonexistent/x.toml", "missing.toml",
                               "fifo.toml", "big.toml", "sub")}
        # a path outside the folder gets the same answer whether or not it exists
        assert errors[str(outside)].endswith("not a file inside the trajectory folder")
        assert errors["/nonexistent/x.toml"].endswith("not a file inside the trajectory folder")
        assert errors["../" + outside.name].endswith("not a file inside the trajectory folder")
        assert errors["link.toml"].endswith("not a file inside the trajectory folder")
        assert "no such file in the trajectory folder" in errors["missing.toml"]
        assert "not a regular file" in errors["fifo.toml"]            # and the command thread did not block
        assert "over the bound" in errors["big.toml"]
        assert "not a regular file" in errors["sub"]
        assert str(trajectories) not in " ".join(errors.values())     # the server's own paths stay unsaid
        # a file inside is planned (the drives are disabled, so the cycle refuses to start it)
        reply = _call(sock, cmd="run_trajectory", file="t.toml")
        assert not reply["ok"] and "not enabled" in reply["error"]
    finally:
        sock.close(0)


def test_a_payload_that_would_break_a_torque_limit_is_refused_and_the_arm_does_not_move(model, tmp_path):
    # a model whose rated payload allows 2.9 kg, but whose wrist cannot hold it far out: the torque check decides
    text = (resources.files("ident") / "models" / "generic6.toml").read_text()
    assert "rated_payload = 3.0" in text
    text = text.replace("rated_payload = 3.0", "rated_payload = 60.0")
    path = tmp_path / "arm.toml"
    path.write_text(text)
    arm_model = load_model(path)
    sim = Simulator(arm_model, seed=2, realtime=True)
    d = Driver(arm_model, LocalSimArm(arm_model, simulator=sim), endpoints=LOCAL, watchdog_s=0.5)
    d.start()
    sock = _req(d.bound["commands"])
    try:
        assert _call(sock, cmd="enable")["ok"]
        assert _call(sock, cmd="move_to", q=[0.0, 0.0, 0.0, 0.0, 1.2, 0.0])["ok"]
        deadline = time.monotonic() + 20
        while d.cycle.motion is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        q_before = d.cycle.state.q.copy()
        hold_before = d.cycle.hold_torque.copy()
        reply = _call(sock, cmd="set_payload", mass=50.0, com=[0.0, 0.0, 0.1])
        assert not reply["ok"]
        assert "set_payload refused" in reply["error"] and "torque limit" in reply["error"]
        np.testing.assert_array_equal(d.cycle.hold_torque, hold_before)       # the feed-forward is unchanged
        assert not d.cycle.flags_extra & stream.FLAG_PAYLOAD
        assert np.all(d.payload == 0)
        time.sleep(0.3)
        assert np.abs(d.cycle.state.q - q_before).max() < 2e-3                # the arm held still
        # a light payload is accepted and fed forward
        assert _call(sock, cmd="set_payload", mass=1.0, com=[0.0, 0.0, 0.05])["ok"]
        assert np.abs(d.cycle.hold_torque - hold_before).max() > 0.1
    finally:
        _call(sock, cmd="disable")
        sock.close(0)
        d.stop()
        sim.stop()


def test_enable_is_refused_where_holding_the_pose_would_break_a_torque_limit(model):
    weak = dataclasses.replace(model, tau_max=np.full(model.n, 0.5))         # cannot even hold its own weight
    sim = Simulator(model, seed=4, realtime=True)
    d = Driver(weak, LocalSimArm(model, simulator=sim), endpoints=LOCAL, watchdog_s=0.5)
    d.start()
    sock = _req(d.bound["commands"])
    try:
        reply = _call(sock, cmd="enable")
        assert not reply["ok"] and "outside its torque limit" in reply["error"]
        time.sleep(0.2)
        assert not d.cycle.want_power and not d.cycle.enabled()
    finally:
        sock.close(0)
        d.stop()
        sim.stop()


def test_lost_device_samples_show_in_the_stream(model):
    """A free-running simulator that steps faster than the driver reads: the skipped samples are counted in the
    messages' flags, and their sum is the health topic's samples_lost."""
    sim = Simulator(model, seed=6, realtime=True, rate_hz=1000.0)
    sim.start()                                   # on its own clock
    d = Driver(model, LocalSimArm(model, simulator=sim), endpoints=LOCAL, rate_hz=250.0, watchdog_s=0.5)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    d.start()
    try:
        sub.connect(d.bound["state"])
        sub.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_STATE)
        lost = []
        deadline = time.monotonic() + 10
        while len(lost) < 200 and time.monotonic() < deadline:
            if sub.poll(100):
                flags = int(stream.decode_state(sub.recv_multipart()[1])["flags"])
                if not flags & stream.FLAG_STALE:
                    lost.append(stream.lost_samples(flags))
                    assert bool(flags & stream.FLAG_LOST) == (lost[-1] > 0)
        assert len(lost) >= 200
        assert np.median(lost[1:]) >= 2          # the simulator made about 4 samples per driver cycle
    finally:
        sub.close(0)
        d.stop()
        sim.stop()
    assert d.cycle.samples_lost >= sum(lost[1:])


def test_a_request_whose_handling_fails_inside_is_answered_counted_and_the_server_goes_on(driver, monkeypatch):
    import driver.command_server as server_module

    real = server_module.decode_request

    def broken(raw):
        if b"trigger" in raw:
            raise ZeroDivisionError("a bug in the handling")
        return real(raw)

    monkeypatch.setattr(server_module, "decode_request", broken)
    before = driver.command_server.stats()["internal_errors"]
    sock = _req(driver.bound["commands"])
    try:
        reply = _raw(sock, b'{"cmd": "status", "trigger": 1}')
        assert not reply["ok"] and "internal error" in reply["error"] and "ZeroDivisionError" in reply["error"]
        stats = driver.command_server.stats()
        assert stats["internal_errors"] == before + 1
        assert "a bug in the handling" in stats["last_internal_error"]
        assert _call(sock, cmd="status")["ok"]
        assert _call(sock, cmd="quick_stop")["ok"]
    finally:
        sock.close(0)


def test_another_clients_status_goes_ahead_of_a_flooders_waiting_requests(driver):
    """A client that floods the socket delays only itself: with its PER_CLIENT requests waiting, another client's
    status is answered next (round robin over clients), not after all of them. Counted, not timed: when the
    other client has its reply, most of the flooder's requests are still waiting."""
    from driver.command_server import PER_CLIENT

    server = driver.command_server
    flood = zmq.Context.instance().socket(zmq.DEALER)
    flood.setsockopt(zmq.LINGER, 0)
    flood.connect(driver.bound["commands"])
    other = _req(driver.bound["commands"])
    try:
        assert _call(other, cmd="status")["ok"]              # connected, and the server idle
        received = server.received
        for _ in range(PER_CLIENT):     # a request that waits its turn (a plain status is answered as it is read)
            flood.send_multipart([b"", b'{"cmd": "set_payload", "mass": 0}'])
        deadline = time.monotonic() + 30
        while server.received < received + PER_CLIENT and time.monotonic() < deadline:
            time.sleep(0.0005)                              # until the server has read (queued) all of them
        assert server.received >= received + PER_CLIENT
        assert _call(other, cmd="status")["ok"]
        still_waiting = server.stats()["waiting"]
        assert still_waiting >= PER_CLIENT // 4, f"{still_waiting} of the flooder's {PER_CLIENT} left"
        replies = 0
        while replies < PER_CLIENT and flood.poll(30_000):   # the flooder gets every answer in the end
            replies += json.loads(flood.recv_multipart()[-1])["ok"]
        assert replies == PER_CLIENT
    finally:
        flood.close(0)
        other.close(0)
