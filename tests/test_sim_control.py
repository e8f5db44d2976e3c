"""The simulator's control socket (sim/control.py): payloads attached, swapped and detached from outside a
running `armid sim`; malformed or impossible requests get an error naming the field and change nothing."""
from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from driver.daemon import Driver, Endpoints
from driver.transports.serial_link import SerialArm
from firmware_bridge import stream
from ident.model import dynamics
from ident.model import load_model
from ident.payload import payload_parameters
from sim import Simulator
from sim.control import MAX_REQUEST_BYTES, ControlServer
from waiting import wait_until  # noqa: E402  (tests/ is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
LOAD = {"mass": 2.0, "com": [0.0, 0.03, 0.1], "inertia": [0.004, 0.0, 0.0, 0.005, 0.0, 0.003]}
OTHER = {"mass": 0.5, "com": [0.02, 0.0, 0.05]}


@pytest.fixture(scope="module")
def model():
    m = load_model("generic6")
    dynamics.gravity_torques(m, np.zeros((1, m.n)))   # numba's cache loaded here, not in a bounded wait
    return m


def _chi(load: dict) -> np.ndarray:
    return payload_parameters(load["mass"], load.get("com", [0.0] * 3), load.get("inertia", [0.0] * 6))


BAD = [
    (b"\xff\xfe", "not UTF-8"),
    (b"attach 2 kg", "not JSON"),
    (b"[1, 2]", '"cmd" string'),
    (b'{"cmd": "attach", "mass": NaN}', "NaN is not a number"),
    (b'{"cmd": "attach", "mass": 1e400}', "not finite"),
    (b'{"cmd": "fly"}', "cmd: unknown 'fly'"),
    (b'{"cmd": "attach", "mass": 1, "colour": "red"}', "unknown field(s) 'colour'"),
    (b'{"cmd": "attach"}', "mass: expected a number of kg"),
    (b'{"cmd": "attach", "mass": true}', "mass: expected a number of kg"),
    (b'{"cmd": "attach", "mass": -1.5}', "mass: expected more than 0"),
    (b'{"cmd": "attach", "mass": 5000}', "at most 30 kg"),                         # 10 x the rated 3 kg
    (b'{"cmd": "attach", "mass": 1, "com": [0, 0]}', "com: expected a list of 3 numbers"),
    (b'{"cmd": "attach", "mass": 1, "com": [0, 0, 3]}', "com: 3 m from the flange"),
    (b'{"cmd": "attach", "mass": 1, "inertia": [1, 0, 0, 1, 0, 5]}', "not a physical body"),  # XX + YY < ZZ
    (b'{"cmd": "swap", "mass": 1}', "swap: no payload is attached"),
    (b'{"cmd": "detach"}', "detach: no payload is attached"),
    (b'{"cmd": "status", "x": ' + b"[" * 3000 + b"]" * 3000 + b"}", "over the 4096-byte bound"),
    (b"[" * 2000 + b"]" * 2000, "request"),                                     # deep, within the bound
]


@pytest.mark.parametrize("raw,why", BAD, ids=[w for _, w in BAD])
def test_a_malformed_or_impossible_request_is_refused_by_name_and_changes_nothing(model, raw, why):
    sim = Simulator(model, seed=0)
    control = ControlServer(sim)
    reply = control.handle(raw)
    assert reply["ok"] is False and why in reply["error"], reply
    sim.step(1)
    assert not sim.read_truth().payload.any() and control.payload is None


def test_attach_swap_and_detach_put_exactly_that_body_on_the_flange_in_that_order(model):
    sim = Simulator(model, seed=0)
    control = ControlServer(sim)
    assert control.handle(json.dumps({"cmd": "attach", **LOAD}).encode())["ok"]
    np.testing.assert_array_equal(sim.read_truth().payload, _chi(LOAD))
    twice = control.handle(json.dumps({"cmd": "attach", **OTHER}).encode())
    assert not twice["ok"] and "swap replaces it" in twice["error"]
    np.testing.assert_array_equal(sim.read_truth().payload, _chi(LOAD))
    swapped = control.handle(json.dumps({"cmd": "swap", **OTHER}).encode())
    assert swapped["ok"] and swapped["payload"]["mass"] == 0.5
    np.testing.assert_array_equal(sim.read_truth().payload, _chi(OTHER))
    assert control.handle(b'{"cmd": "status"}')["payload"]["com"] == OTHER["com"]
    assert control.handle(b'{"cmd": "detach"}') == {"ok": True, "payload": None}
    assert not sim.read_truth().payload.any()


# -- `armid sim` as its own process, the driver here on its serial link ------------------------------------
def _start_sim(link: Path) -> tuple[subprocess.Popen, str]:
    """`armid sim --transport serial`: link points at its pty; returns the process and its control endpoint."""
    proc = subprocess.Popen([sys.executable, "-m", "armid.cli", "sim", "--transport", "serial", "--realtime",
                             "--option", "watchdog_s=0.5", "--seed", "2"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    out = b""                      # read unbuffered: both lines may come in one read
    deadline = time.monotonic() + 180
    while out.count(b"\n") < 2 and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(deadline - time.monotonic(), 0))
        chunk = os.read(proc.stdout.fileno(), 4096) if ready else b""
        if not chunk:
            break
        out += chunk
    text = out.decode(errors="replace")
    port = re.search(r"port=(\S+)", text)
    control = re.search(r"control ready: endpoint=(\S+)", text)
    if not (port and control):
        _kill(proc)
        pytest.fail(f"armid sim did not name its port and control endpoint: {text!r}")
    link.symlink_to(port.group(1))
    return proc, control.group(1)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait(10)


def _socket(kind, endpoint, topic=None):
    s = zmq.Context.instance().socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    if topic is not None:
        s.setsockopt(zmq.SUBSCRIBE, topic)
    return s


def _call(sock, raw: bytes) -> dict:
    sock.send(raw)
    assert sock.poll(10_000), f"no reply to {raw[:60]!r}"
    return json.loads(sock.recv())


def _mean_state(sub, count=300, settle=1000, timeout=20.0) -> tuple[np.ndarray, np.ndarray]:
    """Mean q and torque of `count` state messages after the next `settle` (the servo's transient)."""
    while sub.poll(0):
        sub.recv_multipart()
    q, tau = [], []
    deadline = time.monotonic() + timeout
    while len(q) < settle + count and time.monotonic() < deadline:
        if sub.poll(100):
            m = stream.decode_state(sub.recv_multipart()[1])
            q.append(m["q"])
            tau.append(m["torque"])
    assert len(q) == settle + count, "the stream stopped"
    return np.mean(q[settle:], axis=0), np.mean(tau[settle:], axis=0)


def test_a_payload_attached_from_outside_changes_the_running_simulators_torques_and_bad_input_does_not(
        model, tmp_path):
    """The arm holds its pose (enabled); a payload attached over the control socket of the running `armid
    sim` changes the joint torques the driver streams by the payload's gravity torque at that pose (the
    model's own gravity with and without the payload: an independent computation), malformed requests get
    errors while the simulator keeps running, and a detach brings the torques back."""
    link = tmp_path / "armid-arm"
    proc, endpoint = _start_sim(link)
    drv = Driver(model, SerialArm(model, str(link), reconnect_s=0.1, device_watchdog_ms=500),
                 endpoints=Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"), watchdog_s=2.0)
    drv.start()
    commands, sub = _socket(zmq.REQ, drv.bound["commands"]), _socket(zmq.SUB, drv.bound["state"], stream.TOPIC_STATE)
    control = _socket(zmq.REQ, endpoint)
    try:
        assert wait_until(lambda: drv.cycle.fresh > 0, 20, 0.01)
        assert _call(commands, b'{"cmd": "enable"}') == {"ok": True}
        assert wait_until(drv.cycle.enabled, 10, 0.01)
        q, free = _mean_state(sub)
        reply = _call(control, json.dumps({"cmd": "attach", **LOAD}).encode())
        assert reply["ok"] and reply["payload"]["mass"] == LOAD["mass"], reply
        q_loaded, loaded = _mean_state(sub)
        assert np.max(np.abs(q_loaded - q)) < 1e-3                       # rad: the arm held its pose
        want = (dynamics.gravity_torques(dynamics.merge_payload(model, _chi(LOAD)), q[None])
                - dynamics.gravity_torques(model, q[None]))[0]
        assert np.max(np.abs(want)) > 1.0                                  # N m: a change worth seeing
        np.testing.assert_allclose(loaded - free, want, atol=0.02 * np.max(np.abs(want)))
        for raw, why in BAD[:3] + BAD[9:11]:                              # errors, and the arm runs on
            refused = _call(control, raw)
            assert refused["ok"] is False and why in refused["error"], refused
        assert proc.poll() is None and drv.cycle.fault is None
        _, still = _mean_state(sub)
        np.testing.assert_allclose(still - free, want, atol=0.02 * np.max(np.abs(want)))
        assert _call(control, b'{"cmd": "status"}')["payload"]["mass"] == LOAD["mass"]
        assert _call(control, b'{"cmd": "detach"}')["ok"]
        _, back = _mean_state(sub)
        np.testing.assert_allclose(back, free, atol=0.02 * np.max(np.abs(want)))
    finally:
        for s in (commands, sub, control):
            s.close(0)
        drv.stop()
        _kill(proc)
