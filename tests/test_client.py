"""armid.client against a running driver (the simulator in-process, loopback TCP) and against hand-made
publishers and servers for what a driver does not do on request: seq gaps, lost samples, garbage, silence,
a restart, CurveZMQ."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq
import zmq.auth

from armid.client import ArmClient, ClientError, CommandRefused, MotionFailed, NoReply, Sample
from driver.daemon import Curve, Endpoints
from firmware_bridge import stream
from local_driver import local_driver
from waiting import wait_until

def _client(d, **kw) -> ArmClient:
    return ArmClient(d.bound["state"], d.bound["commands"], **kw)


def test_the_newest_sample_is_the_drivers_own_state_in_si_units(driver):
    d, sim = driver
    with _client(d) as arm:
        s = arm.latest()
        assert isinstance(s, Sample) and s.q.shape == (6,) and s.statusword.dtype == np.uint16
        truth = sim.read_state().position
        np.testing.assert_allclose(s.q, truth, atol=0.01)               # the arm at rest: the same pose
        later = arm.latest()
        assert later.seq > s.seq and not later.stale and arm.seq_gaps == 0


def test_a_move_runs_through_the_client_and_the_iterator_sees_it_in_order(driver):
    d, sim = driver
    goal = [0.2, -0.1, 0.15, 0.05, -0.1, 0.2]
    with _client(d) as arm:
        arm.enable()
        assert arm.status()["enabled"]
        reply = arm.move_to(goal, speed=0.8)
        seqs, moving = [], False
        for s in arm.samples(count=200):
            seqs.append(s.seq)
            moving |= s.moving
        assert moving and seqs == list(range(seqs[0], seqs[0] + 200))
        arm.wait_motion(reply["duration"] + 20)
        np.testing.assert_allclose(arm.latest().q, goal, atol=2e-3)
        with pytest.raises(CommandRefused, match="joint j3: goal 9"):
            arm.move_to([0, 0, 9.0, 0, 0, 0])
        with pytest.raises(CommandRefused, match="preset 'nope'"):
            arm.run_trajectory(preset="nope")


def test_a_refusal_names_its_command_once_through_the_client_and_on_the_wire(driver):
    d, _ = driver
    with _client(d) as arm:
        with pytest.raises(CommandRefused) as refused:
            arm.move_to([9.0, 0, 0, 0, 0, 0])
        assert str(refused.value).startswith("move_to refused: joint j1: goal 9 outside the position limits")
        with pytest.raises(CommandRefused) as refused:
            arm.set_payload(1e9)
        assert str(refused.value).startswith("set_payload refused: mass 1e+09 kg is over the rated payload")
        with pytest.raises(CommandRefused) as refused:
            arm.request("enable", speed=1)
        assert str(refused.value) == "enable: unknown field 'speed' (known: )"
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(d.bound["commands"])
    try:
        for raw, text in ((b'{"cmd": "move_to", "q": [NaN, 0, 0, 0, 0, 0]}', "request: NaN is not a number JSON allows"),
                          (b'{"cmd": "move_to", "q": [1e400, 0, 0, 0, 0, 0]}', "request: number 1e400 is not finite")):
            sock.send(raw)
            assert sock.poll(10_000)
            assert json.loads(sock.recv()) == {"ok": False, "error": text}
    finally:
        sock.close()


def test_a_callback_gets_every_sample_in_its_own_thread_until_close(driver):
    d, _ = driver
    got = []
    arm = _client(d)
    thread = arm.on_sample(lambda s: got.append(s.seq))
    assert wait_until(lambda: len(got) > 100, 10)
    arm.close()
    assert not thread.is_alive() and thread.error is None
    assert got == list(range(got[0], got[0] + len(got)))


def test_waiting_for_a_motion_that_faults_raises_naming_the_fault(driver):
    d, sim = driver
    with _client(d) as arm:
        arm.enable()
        reply = arm.move_to([0.6, -0.4, 0.5, 0.3, -0.5, 0.6], speed=0.3)
        sim.faults.drive_fault(2, 0x8611)
        with pytest.raises(MotionFailed, match="faulted"):
            arm.wait_motion(reply["duration"] + 20)


# -- hand-made peers ------------------------------------------------------------------------------------------
def _publisher():
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    return pub, f"tcp://127.0.0.1:{port}"


def _message(seq: int, lost: int = 0, q=None) -> bytes:
    m = stream.StateMessage(6)
    m.q[:] = np.arange(6) * 0.1 if q is None else q
    m.set_header(seq, stream.lost_flags(lost), 1000 * seq, 2000 * seq)
    return bytes(m.buffer)


def test_gaps_lost_samples_and_garbage_are_counted_and_never_returned():
    pub, endpoint = _publisher()
    arm = ArmClient(endpoint, "tcp://127.0.0.1:9", timeout_s=2.0)
    try:
        got = []
        box = []

        def feed():
            while not box:
                for seq, lost in ((1, 0), (2, 0), (5, 0), (6, 3)):
                    pub.send_multipart([stream.TOPIC_STATE, _message(seq, lost)])
                pub.send_multipart([stream.TOPIC_STATE, b"ARMS garbage"])
                bad = bytearray(_message(7))
                bad[36:44] = np.array([np.nan]).tobytes()
                pub.send_multipart([stream.TOPIC_STATE, bytes(bad)])
                pub.send_multipart([stream.TOPIC_STATE, _message(8)])
                time.sleep(0.05)
        t = threading.Thread(target=feed, daemon=True)
        t.start()
        try:
            deadline = time.monotonic() + 10
            for s in arm.samples(timeout_s=5):
                got.append(s)
                if s.seq == 8 and len(got) > 5 and got[0].seq == 1 or time.monotonic() > deadline:
                    break
        finally:
            box.append(1)
            t.join(5)
        seqs = [s.seq for s in got]
        start = seqs.index(1)
        assert seqs[start:start + 5] == [1, 2, 5, 6, 8]
        assert all(np.isfinite(s.q).all() for s in got)
        assert arm.bad_messages >= 2 and arm.seq_gaps >= 2 + 1 and arm.lost_samples >= 3
        assert got[start + 3].lost == 3
    finally:
        arm.close()
        pub.close(0)


def test_silence_is_a_clear_error_and_a_restarted_server_is_reached_by_a_new_socket():
    """Lazy pirate: status gets no reply from a server that reads and drops it; the client rebuilds its
    socket and sends again. A command that may move the arm is never sent twice."""
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    seen = []
    answer = threading.Event()
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            if router.poll(50):
                frames = router.recv_multipart()
                seen.append(json.loads(frames[-1])["cmd"])
                if answer.is_set():
                    router.send_multipart([*frames[:-1], json.dumps({"ok": True, "enabled": True}).encode()])
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    arm = ArmClient("tcp://127.0.0.1:9", f"tcp://127.0.0.1:{port}", timeout_s=0.3, retries=2, plan_timeout_s=0.3)
    try:
        with pytest.raises(NoReply, match=r"no reply to status within 0.3 s x 3"):
            arm.status()
        assert seen.count("status") == 3                    # one socket per try
        with pytest.raises(NoReply, match="move_to is not sent twice"):
            arm.move_to(np.zeros(6))
        assert seen.count("move_to") == 1
        answer.set()
        assert arm.status()["ok"]                           # the next request works on a new socket
    finally:
        stop.set()
        t.join(5)
        arm.close()
        router.close(0)


def test_last_sample_is_what_the_callback_thread_read_last_and_health_comes_on_its_own_socket(driver):
    d, _ = driver
    got = []
    arm = _client(d)
    try:
        assert arm.last_sample is None
        thread = arm.on_sample(lambda s: got.append(s.seq))
        assert wait_until(lambda: len(got) > 50, 10)
        first = arm.health()                                # the stream thread keeps every state message
        second = arm.health()                               # waits for the next one (once per second)
        assert second["cycles"] > first["cycles"] and second["samples_lost"] == 0
    finally:
        arm.close()
    assert not thread.is_alive() and arm.last_sample.seq == got[-1]
    assert got == list(range(got[0], got[0] + len(got)))


def test_health_skips_what_is_not_a_json_object_and_raises_noreply_on_silence():
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def publish():
        while not stop.wait(0.02):
            for payload in (b"\xff not json", b"[1, 2]", b'{"cycles": 7}'):
                pub.send_multipart([stream.TOPIC_HEALTH, payload])
    t = threading.Thread(target=publish, daemon=True)
    t.start()
    arm = ArmClient(f"tcp://127.0.0.1:{port}", timeout_s=0.5)
    try:
        assert arm.health(timeout_s=5.0) == {"cycles": 7}
        assert arm.bad_messages >= 2
    finally:
        stop.set()
        t.join(5)
        pub.close(0)
    try:
        arm.health(timeout_s=0.3)                           # what was published before the publisher stopped
    except NoReply:
        pass
    with pytest.raises(NoReply, match="no health message within 0.3 s"):
        arm.health(timeout_s=0.3)
    arm.close()


def test_a_client_with_the_right_curve_keys_is_answered_and_one_without_keys_is_not(model, tmp_path):
    keys, clients = tmp_path / "keys", tmp_path / "clients"
    keys.mkdir()
    clients.mkdir()
    server_public, server_secret = zmq.auth.create_certificates(keys, "server")
    client_public, client_secret = zmq.auth.create_certificates(keys, "client")
    os.replace(client_public, clients / "client.key")
    curve = Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", Curve(server_secret, str(clients)))
    with local_driver(model, seed=4, endpoints=curve) as (d, _):
        with ArmClient(d.bound["state"], d.bound["commands"], curve_server_public=server_public,
                       curve_client_secret=client_secret) as good:
            assert good.status()["ok"]
        with ArmClient(d.bound["state"], d.bound["commands"], timeout_s=0.5, retries=0) as plain:
            with pytest.raises(NoReply):
                plain.status()
        with pytest.raises(ClientError, match="holds no secret key"):
            ArmClient(d.bound["state"], d.bound["commands"], curve_server_public=server_public,
                      curve_client_secret=clients / "client.key")
        with pytest.raises(ClientError, match="both"):
            ArmClient(curve_server_public=server_public)


def test_the_client_works_from_another_processes_thread_through_the_cli(driver):
    """`armid command` is a client in another process: a refusal is exit status 1 with the driver's words."""
    d, _ = driver
    run = lambda *a: subprocess.run([sys.executable, "-m", "armid.cli", "command", *a, "--commands",  # noqa: E731
                                     d.bound["commands"]], capture_output=True, text=True, timeout=120)
    ok = run("status")
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"]
    refused = run("move_to", "q=[0,0,9,0,0,0]")
    assert refused.returncode == 1 and "joint j3: goal 9" in refused.stderr
    bad = run("move_to", "speed")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr
