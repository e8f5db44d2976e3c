"""Every armid.client call ends: without a driver, against a driver that refuses the client's CURVE keys or
whose authenticator admits it late, and when the driver dies in the middle of a request.

The driver stand-in here (`CurveServer`) is a ZeroMQ ROUTER with CurveZMQ, in a context of its own, whose ZAP
handler (RFC 27) refuses or admits the client's key as the test says; a real driver refuses keys in
`test_every_command_to_a_driver_that_refuses_the_clients_keys_raises_noreply`."""
from __future__ import annotations

import json
import os
import socket
import threading

import numpy as np
import pytest
import zmq
import zmq.auth
from zmq.utils import z85

from armid.client import ArmClient, ClientError, NoReply, ServoStream
from driver.daemon import Curve, Endpoints
from ident.model import load_model
from local_driver import local_driver
from waiting import wait_until

ZAP = "inproc://zeromq.zap.01"

# every command the client sends, by the method that sends it
COMMANDS = {
    "status": lambda arm: arm.status(),
    "enable": lambda arm: arm.enable(wait=False),
    "disable": lambda arm: arm.disable(),
    "quick_stop": lambda arm: arm.quick_stop(),
    "fault_reset": lambda arm: arm.fault_reset(),
    "move_to": lambda arm: arm.move_to(np.zeros(6)),
    "run_trajectory": lambda arm: arm.run_trajectory(preset="seed000"),
    "set_payload": lambda arm: arm.set_payload(1.0),
    "servo": lambda arm: arm.servo("position"),
}


@pytest.fixture
def keys(tmp_path):
    """Certificate files: the server's pair, a client's pair (its public file alone in `authorised`)."""
    made = tmp_path / "keys"
    authorised, nobody = tmp_path / "authorised", tmp_path / "nobody"
    for d in (made, authorised, nobody):
        d.mkdir()
    server_public, server_secret = zmq.auth.create_certificates(made, "server")
    client_public, client_secret = zmq.auth.create_certificates(made, "client")
    os.replace(client_public, authorised / "client.key")
    return {"server_public": server_public, "server_secret": server_secret, "client_secret": client_secret,
            "client_key": zmq.auth.load_certificate(client_secret)[0], "authorised": str(authorised),
            "nobody": str(nobody)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CurveServer:
    """A command socket with CurveZMQ on 127.0.0.1:`port` and a ZAP handler that admits `key` once `admit` is
    set; every request read is appended to `seen` and answered {"ok": true} unless `answer` is clear."""

    def __init__(self, server_secret: str, key: bytes, port: int, *, admit: bool = True):
        self.key, self.port, self.seen = key, port, []
        self.admit, self.answer, self.refused = threading.Event(), threading.Event(), threading.Event()
        # a servo reply names its endpoint and the session's token
        self.reply = {"ok": True, "endpoint": f"tcp://127.0.0.1:{_free_port()}", "token": 12345}
        if admit:
            self.admit.set()
        self.answer.set()
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._zap = self._ctx.socket(zmq.REP)
        self._zap.bind(ZAP)
        public, secret = zmq.auth.load_certificate(server_secret)
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.linger = 0
        self._router.curve_secretkey, self._router.curve_publickey, self._router.curve_server = secret, public, True
        self._router.bind(f"tcp://127.0.0.1:{port}")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self._thread = threading.Thread(target=self._serve, name="curve-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._zap, zmq.POLLIN)
        poller.register(self._router, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(20))
            if self._zap in ready:
                version, request_id, _domain, _address, _identity, mechanism, *credentials = \
                    self._zap.recv_multipart()
                ok = mechanism == b"CURVE" and self.admit.is_set() and z85.encode(credentials[0]) == self.key
                if not ok:
                    self.refused.set()
                self._zap.send_multipart([version, request_id, b"200" if ok else b"400",
                                          b"OK" if ok else b"not admitted", b"", b""])
            if self._router in ready:
                frames = self._router.recv_multipart()
                self.seen.append(json.loads(frames[-1])["cmd"])
                if self.answer.is_set():
                    self._router.send_multipart([*frames[:-1], json.dumps(self.reply).encode()])

    @property
    def closed(self) -> bool:
        return self._ctx.closed

    def close(self) -> None:
        """Stop serving and close the sockets at once, as a killed process does (idempotent)."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(5.0)
            assert not self._thread.is_alive(), "the server thread did not end within 5 s"
        if not self._ctx.closed:
            self._ctx.destroy(linger=0)


def _client(endpoint: str, keys: dict, **options) -> ArmClient:
    return ArmClient(f"tcp://127.0.0.1:{_free_port()}", endpoint, curve_server_public=keys["server_public"],
                     curve_client_secret=keys["client_secret"], **options)


@pytest.mark.parametrize("endpoint", ["tcp", "ipc"])
def test_every_command_without_a_driver_raises_noreply_naming_the_endpoint_and_the_handshake(endpoint, tmp_path):
    commands = f"tcp://127.0.0.1:{_free_port()}" if endpoint == "tcp" else f"ipc://{tmp_path}/nobody"
    with ArmClient(f"tcp://127.0.0.1:{_free_port()}", commands, timeout_s=0.3, plan_timeout_s=0.3) as arm:
        for cmd, call in COMMANDS.items():
            with pytest.raises(NoReply, match=rf"^{commands}: {cmd} not sent: no connection to a driver completed "
                                              rf"its handshake within 0.3 s"):
                call(arm)
        with pytest.raises(NoReply, match="no state message within 0.3 s"):
            arm.latest()
        with pytest.raises(NoReply, match="no health message within 0.3 s"):
            arm.health(timeout_s=0.3)


def test_an_endpoint_zeromq_cannot_connect_to_is_a_client_error_naming_it():
    with ArmClient("tcp://127.0.0.1:5555", "tcp://127.0.0.1:not-a-port", timeout_s=0.3) as arm:
        with pytest.raises(ClientError, match=r"^tcp://127.0.0.1:not-a-port: cannot connect"):
            arm.status()


def test_timeouts_and_retries_out_of_range_are_refused_by_name():
    for options, name in (({"plan_timeout_s": -1.0}, "plan_timeout_s"), ({"plan_timeout_s": 0}, "plan_timeout_s"),
                          ({"retries": -1}, "retries"), ({"timeout_s": float("nan")}, "timeout_s")):
        with pytest.raises(ClientError, match=rf"^{name}: expected"):
            ArmClient(**options)


def test_every_command_to_a_driver_that_refuses_the_clients_keys_raises_noreply(keys):
    model = load_model("generic6")
    refusing = Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", Curve(keys["server_secret"], keys["nobody"]))
    with local_driver(model, seed=5, endpoints=refusing) as (d, _):
        with ArmClient(d.bound["state"], d.bound["commands"], timeout_s=0.3, plan_timeout_s=0.3,
                       curve_server_public=keys["server_public"], curve_client_secret=keys["client_secret"]) as arm:
            for cmd, call in COMMANDS.items():
                with pytest.raises(NoReply, match=rf"{cmd} not sent: .* does it accept this client's CURVE keys"):
                    call(arm)
        with ArmClient(d.bound["state"], d.bound["commands"], timeout_s=0.3) as keyless:
            with pytest.raises(NoReply, match="does it accept a client without CURVE keys"):
                keyless.status()
        assert d.command_server.received == 0                  # nothing reached the driver


def test_a_request_after_the_driver_came_back_refusing_the_keys_ends_in_noreply(keys):
    """The client's socket, answered before, reconnects to a driver that refuses its keys: a refused handshake
    ends that connection for good, so a send on it would wait forever."""
    port = _free_port()
    server = CurveServer(keys["server_secret"], keys["client_key"], port)
    arm = _client(server.endpoint, keys, timeout_s=0.5)
    try:
        assert arm.status()["ok"]
        server.close()
        server = CurveServer(keys["server_secret"], keys["client_key"], port, admit=False)
        assert wait_until(server.refused.is_set, timeout=30.0)     # the old socket's reconnection was refused
        with pytest.raises(NoReply, match=rf"^{server.endpoint}: status not sent: no connection to a driver "
                                          rf"completed its handshake within 0.5 s"):
            arm.status()
        assert server.seen == []
    finally:
        arm.close()
        server.close()


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_a_command_is_sent_once_an_authenticator_that_refused_at_first_admits_the_client(keys, cmd):
    """An authenticator that refuses at first (not yet serving the keys) and admits later: the command goes
    out once, on the first connection that completed its handshake, and is answered."""
    server = CurveServer(keys["server_secret"], keys["client_key"], _free_port(), admit=False)
    arm = _client(server.endpoint, keys, timeout_s=10.0, plan_timeout_s=10.0)
    admitter = threading.Thread(target=lambda: server.refused.wait(10.0) and server.admit.set(), daemon=True)
    try:
        admitter.start()
        result = COMMANDS[cmd](arm)
        assert server.refused.is_set() and server.seen == [cmd]
        if isinstance(result, ServoStream):
            assert result.stop()["ok"] and server.seen == [cmd, "servo_stop"]
    finally:
        admitter.join(15.0)
        arm.close()
        server.close()


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_a_driver_that_dies_in_the_middle_of_a_request_ends_it_in_noreply(keys, cmd):
    """The driver reads the request and dies before it answers: NoReply after the reply's time limit. A
    command that may move the arm is not sent again: its successor sees it once, from the next call."""
    port = _free_port()
    server = CurveServer(keys["server_secret"], keys["client_key"], port)
    server.answer.clear()
    arm = _client(server.endpoint, keys, timeout_s=1.0, plan_timeout_s=1.0, retries=1)
    killer = threading.Thread(target=lambda: wait_until(lambda: server.seen, timeout=10.0) and server.close(),
                              daemon=True)
    successor = None
    try:
        killer.start()
        with pytest.raises(NoReply, match=rf"^{server.endpoint}: (no reply to {cmd} within 1 s|{cmd} not sent)"):
            COMMANDS[cmd](arm)
        killer.join(10.0)
        assert server.seen == [cmd] and server.closed
        successor = CurveServer(keys["server_secret"], keys["client_key"], port)
        successor.answer.clear()
        if cmd != "status":
            with pytest.raises(NoReply, match=rf"no reply to {cmd} within 1 s \({cmd} is not sent twice"):
                COMMANDS[cmd](arm)
            assert successor.seen == [cmd]
    finally:
        killer.join(10.0)
        arm.close()
        server.close()
        if successor is not None:
            successor.close()


def test_a_servo_stream_to_no_driver_never_blocks_and_its_stop_ends_in_noreply(tmp_path):
    arm = ArmClient(f"tcp://127.0.0.1:{_free_port()}", f"tcp://127.0.0.1:{_free_port()}", timeout_s=0.3)
    stream = ServoStream(arm, f"tcp://127.0.0.1:{_free_port()}", "position", token=12345)
    try:
        sent = [stream.send(np.zeros(6)) for _ in range(100)]
        assert stream.sent + stream.dropped == 100 and stream.dropped > 0 and not sent[-1]
        with pytest.raises(NoReply, match="servo_stop not sent"):
            stream.stop()
        assert stream._push.closed
    finally:
        arm.close()


def test_a_servo_stream_whose_driver_stopped_never_blocks_and_its_stop_ends_in_noreply():
    model = load_model("generic6")
    with local_driver(model, seed=6) as (d, _):
        arm = ArmClient(d.bound["state"], d.bound["commands"], timeout_s=0.5)
        try:
            arm.enable()
            stream = arm.servo("position")
            q = arm.latest().q
            assert stream.send(q)
            d.stop()
            sent = [stream.send(q) for _ in range(200)]
            assert stream.sent + stream.dropped == 201 and not sent[-1]
            with pytest.raises(NoReply, match="servo_stop"):
                stream.stop()
        finally:
            arm.close()
