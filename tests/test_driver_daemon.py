"""The daemon end to end on loopback: the documented stream read by a client that knows only the doc, the
JSON command socket, the CurveZMQ rule, and a safe stop on SIGTERM. The simulator runs in real time."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.auth

from firmware_bridge import stream
from driver.daemon import Curve, Driver, EndpointError, Endpoints
from sim.local_transport import LocalSimArm
from firmware_bridge.cia402 import State, state_of
from sim import Simulator
from local_driver import local_driver  # noqa: E402
from waiting import wait_until  # noqa: E402  (tests/ is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
LOCAL = Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")


@pytest.fixture
def driver(model):
    with local_driver(model) as (d, _):
        yield d


def _client(endpoint, **curve):
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, 5000)
    for key, value in curve.items():
        setattr(sock, key, value)
    sock.connect(endpoint)
    return sock


def _call(sock, timeout_ms=5000, **request):
    """The reply, or None when none comes: also when the request cannot even be sent (SNDTIMEO), as for a
    client whose CURVE handshake the server refused and so holds no connection to queue it on."""
    try:
        sock.send(json.dumps(request).encode())
    except zmq.Again:
        return None
    if not sock.poll(timeout_ms):
        return None
    return json.loads(sock.recv())


def _wait(predicate, timeout=10.0) -> bool:
    return wait_until(predicate, timeout, 0.01)


def _newest(sub, timeout=5.0):
    """The newest state message: wait for one, then drain what queued up behind it."""
    assert sub.poll(int(timeout * 1000))
    last = None
    while sub.poll(0):
        last = stream.decode_state(sub.recv_multipart()[1])
    return last


def test_the_documented_example_client_decodes_the_stream(driver):
    out = subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / "stream_client.py"), driver.bound["state"], "20"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [line.split() for line in out.stdout.splitlines()]
    assert len(lines) == 20
    seqs = [int(f[0]) for f in lines]
    assert seqs == list(range(seqs[0], seqs[0] + 20))
    assert [int(f[2]) for f in lines] == [0] * 20                           # no device sample lost
    q = np.array([[float(x) for x in f[4:10]] for f in lines])
    np.testing.assert_allclose(q[-1], driver.cycle.state.q, atol=1e-4)     # the arm rests on its brakes
    assert all(state_of(int(w, 16)) is State.READY_TO_SWITCH_ON for w in lines[-1][16:22])


def test_commands_move_the_arm_and_the_stream_shows_it(driver):
    cmd = _client(driver.bound["commands"])
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(driver.bound["state"])
    sub.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_STATE)
    try:
        assert _call(cmd, cmd="enable") == {"ok": True}
        assert _wait(lambda: driver.cycle.enabled())
        goal = [0.25, -0.15, 0.2, 0.1, -0.2, 0.3]
        reply = _call(cmd, cmd="move_to", q=goal, speed=0.8)
        assert reply["ok"] and reply["duration"] > 0
        assert _wait(lambda: driver.cycle.motion is None and np.abs(driver.cycle.state.q - goal).max() < 1e-3)
        last = _newest(sub)
        np.testing.assert_allclose(last["q"], goal, atol=1e-3)
        assert last["flags"] & stream.FLAG_ENABLED
        refused = _call(cmd, cmd="move_to", q=[0, 0, 9.0, 0, 0, 0])
        assert refused == {"ok": False, "error": refused["error"]} and "joint j3: goal 9" in refused["error"]
        status = _call(cmd, cmd="status")
        assert status["ok"] and status["fault"] is None and np.allclose(status["q"], goal, atol=1e-3)
    finally:
        cmd.close(0)
        sub.close(0)


@pytest.mark.parametrize("raw, error", [
    (b"\xff\xfe not json", "request is not UTF-8 text"),
    (b"{not json}", "request is not JSON"),
    (b"[1, 2]", 'expected a JSON object with a "cmd" string'),
    (b'{"cmd": "fly"}', "unknown command 'fly'"),
    (b'{"cmd": "move_to", "q": [0, 0, "x", 0, 0, 0]}', "move_to: q: expected a list of numbers"),
    (b'{"cmd": "move_to", "q": [0, 0, 0]}', "move_to: q: expected 6 numbers, got 3"),
    (b'{"cmd": "set_payload", "mass": -2}', "payload: mass: expected a number of kg >= 0"),
    (b'{"cmd": "run_trajectory", "file": "/nonexistent/traj.toml"}', "no trajectory folder is configured"),
])
def test_bad_requests_get_an_error_reply_and_the_daemon_keeps_serving(driver, raw, error):
    cmd = _client(driver.bound["commands"])
    try:
        cmd.send(raw)
        assert cmd.poll(5000)
        reply = json.loads(cmd.recv())
        assert reply["ok"] is False and error in reply["error"]
        assert _call(cmd, cmd="status")["ok"]
    finally:
        cmd.close(0)


def test_commands_beyond_loopback_require_curve_keys(model):
    arm = LocalSimArm(model, simulator=Simulator(model))
    with pytest.raises(EndpointError, match="requires CurveZMQ keys"):
        Driver(model, arm, endpoints=Endpoints("tcp://127.0.0.1:*", "tcp://0.0.0.0:*"))


def test_a_start_that_fails_after_binding_stops_the_planner_the_link_and_the_sockets(model, monkeypatch):
    """A failure late in start (here the cycle's warm-up) leaves nothing behind: the planner process has
    ended, the sockets are closed (their endpoints bind again) and the link is closed."""
    sim = Simulator(model)
    d = Driver(model, LocalSimArm(model, simulator=sim), endpoints=LOCAL)

    def broken() -> None:
        raise RuntimeError("a kernel that does not compile")

    monkeypatch.setattr(d.cycle, "warm_up", broken)
    planner = d.planner
    with pytest.raises(RuntimeError, match="does not compile"):
        d.start()
    try:
        assert planner._proc is None and not d.cycle.running
        assert d._pub is None and d._rep is None and d._servo is None
        again = zmq.Context.instance().socket(zmq.PUB)

        def binds() -> bool:
            try:
                again.bind(d.bound["state"])
            except zmq.ZMQError:
                return False
            return True

        try:        # the endpoint is free again: libzmq releases a closed socket's port in its I/O thread, soon after
            assert wait_until(binds, 5.0, 0.01)
        finally:
            again.close(0)
    finally:
        sim.stop()


def test_missing_curve_keys_stop_the_driver_with_one_line_and_no_traceback(tmp_path):
    cfg = tmp_path / "driver.toml"
    cfg.write_text('[driver]\nmodel = "generic6"\n[transport]\nname = "sim"\n[zmq]\nstate = "tcp://127.0.0.1:*"\n'
                   'commands = "tcp://0.0.0.0:*"\nservo = "tcp://0.0.0.0:*"\n[zmq.curve]\n'
                   'server_secret_file = "keys/server.key_secret"\nauthorized_clients_dir = "keys/clients"\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "armid.cli", "driver", "--config", str(cfg)], capture_output=True,
                         text=True, timeout=120, env=env)
    assert run.returncode == 2
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert lines == [f"armid: zmq.curve.server_secret_file: {tmp_path / 'keys/server.key_secret'} does not exist"]


def test_a_planner_whose_daemon_is_gone_ends_quietly(tmp_path):
    read, write = os.pipe()
    os.close(read)                              # the daemon closed its end before the planner said "ready"
    run = subprocess.run([sys.executable, "-m", "driver.planner", str(tmp_path)], stdin=subprocess.DEVNULL,
                         stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(write)
    assert "Traceback" not in run.stderr and run.returncode == 0, run.stderr


def test_with_curve_only_authorised_clients_get_answers(model, tmp_path):
    keys, clients = tmp_path / "keys", tmp_path / "clients"
    keys.mkdir()
    clients.mkdir()
    server_public, server_secret_file = zmq.auth.create_certificates(keys, "server")
    client_public_file, client_secret_file = zmq.auth.create_certificates(keys, "client")
    os.replace(client_public_file, clients / "client.key")
    zmq.auth.create_certificates(keys, "stranger")
    sim = Simulator(model, seed=4, realtime=True)
    d = Driver(model, LocalSimArm(model, simulator=sim), watchdog_s=0.5,
               endpoints=Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", Curve(server_secret_file, str(clients))))
    d.start()
    socks = []
    try:
        server_key = zmq.auth.load_certificate(server_public)[0]
        pub, sec = zmq.auth.load_certificate(client_secret_file)
        good = _client(d.bound["commands"], curve_publickey=pub, curve_secretkey=sec, curve_serverkey=server_key)
        plain = _client(d.bound["commands"])
        spub, ssec = zmq.auth.load_certificate(keys / "stranger.key_secret")
        stranger = _client(d.bound["commands"], curve_publickey=spub, curve_secretkey=ssec, curve_serverkey=server_key)
        socks = [good, plain, stranger]
        assert _call(good, cmd="status")["ok"]
        assert _call(plain, timeout_ms=1000, cmd="status") is None
        assert _call(stranger, timeout_ms=1000, cmd="status") is None
        assert _call(good, cmd="status")["ok"]
    finally:
        for s in socks:
            s.close(0)
        d.stop()
        sim.stop()


def test_sigterm_disables_the_drives_before_the_daemon_exits(tmp_path):
    state, commands = f"ipc://{tmp_path}/state", f"ipc://{tmp_path}/commands"
    cfg = tmp_path / "driver.toml"
    cfg.write_text(f'[driver]\nmodel = "generic6"\nwatchdog_ms = 500\n[transport]\nname = "sim"\nrealtime = true\n'
                   f'[zmq]\nstate = "{state}"\ncommands = "{commands}"\n')
    proc = subprocess.Popen([sys.executable, "-m", "armid.cli", "driver", "--config", str(cfg)], cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(state)
    sub.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_STATE)
    cmd = _client(commands)
    try:
        reply = _call(cmd, timeout_ms=60000, cmd="enable")
        assert reply == {"ok": True}
        assert _wait(lambda: _newest(sub)["flags"] & stream.FLAG_ENABLED, 20)   # not the backlog of the start
        proc.send_signal(signal.SIGTERM)
        last = None
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            if sub.poll(50):
                last = stream.decode_state(sub.recv_multipart()[1])
        assert proc.wait(timeout=20) == 0
        assert all(state_of(int(w)) is State.READY_TO_SWITCH_ON for w in last["statusword"])
        assert "stopped" in proc.stderr.read()
    finally:
        cmd.close(0)
        sub.close(0)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.parametrize("transport, options, named", [
    ("serial", lambda tmp: {"port": str(tmp / "no-such-tty")}, "no-such-tty"),
    ("gateway", lambda tmp: {"host": "127.0.0.1", "port": _closed_port()}, "cannot connect to 127.0.0.1:"),
    ("can", lambda tmp: {"interface": "socketcan", "channel": "armid-nocan9"}, "cannot open the CAN bus.*armid-nocan9"),
])
def test_a_link_that_is_not_there_fails_start_before_any_kernel_is_loaded(model, tmp_path, monkeypatch, transport,
                                                                         options, named):
    """The link opens last (a device's watchdog counts from its handshake), but a wrong port or host still fails
    at once: the driver checks that the far end is there before it loads its kernels (seconds on a cold cache)."""
    from driver import daemon
    from driver.hal import LinkError
    from driver.transports import open_arm

    def loaded(*args, **kwargs):
        raise AssertionError("a kernel was loaded before the link was checked")

    monkeypatch.setattr(daemon.motion, "warm_up", loaded)
    arm = open_arm(transport, model, **options(tmp_path))
    driver = Driver(model, arm, endpoints=Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
    with pytest.raises(LinkError, match=named):
        driver.start()
    driver.stop()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:          # bound, never listening: a connection to it is refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
