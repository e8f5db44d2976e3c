"""The identification service on a live driver + simulator stream (loopback): estimates published while
the arm moves, commands, a stopped and resumed stream, malformed messages dropped."""
import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from firmware_bridge import stream
from ident.model import dynamics
from ident.fit import excitation
from ident.fit.excitation import FourierTrajectory
from ident.model import load_model
from ident.online.service import IdentService
from ident.outputs.fleet_drift import family_wise_sigma
from waiting import wait_until  # noqa: E402  (tests/ is on sys.path)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def _wait(pred, timeout=20.0) -> bool:
    return wait_until(pred, timeout, 0.02)


def _req(endpoint, timeout_s: float = 10.0, **request):
    s = zmq.Context.instance().socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        s.send(json.dumps(request).encode())
        assert s.poll(int(timeout_s * 1000)), f"no reply to {request} within {timeout_s:g} s"
        return json.loads(s.recv())
    finally:
        s.close(0)


class Listener:
    def __init__(self, endpoint):
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.got = []

    def drain(self):
        while self.sock.poll(0):
            topic, payload = self.sock.recv_multipart()
            self.got.append((topic, json.loads(payload)))
        return self.got

    def latest(self, topic):
        msgs = [m for t, m in self.drain() if t == topic]
        return msgs[-1] if msgs else None


def test_service_identifies_while_the_arm_moves_and_answers_commands(model, tmp_path):
    """The driver and the simulator run as `armid driver` (transport sim) in their own process, as in
    production; the service runs here."""
    state, commands = f"ipc://{tmp_path}/state", f"ipc://{tmp_path}/commands"
    cfg = tmp_path / "driver.toml"
    # the in-process simulator publishes each period's mean current: half a period (0.5 ms) late
    cfg.write_text(f'[driver]\nmodel = "generic6"\nwatchdog_ms = 500\neffort_delay_ms = 0.5\ntrajectory_dir = "."\n[transport]\nname = "sim"\n'
                   f'realtime = true\n[zmq]\nstate = "{state}"\ncommands = "{commands}"\n')
    drv = subprocess.Popen([sys.executable, "-m", "armid.cli", "driver", "--config", str(cfg)], cwd=ROOT,
                           stderr=subprocess.DEVNULL)
    svc = IdentService(model, state_endpoint=state, publish_endpoint="tcp://127.0.0.1:*",
                       command_endpoint="tcp://127.0.0.1:*", publish_hz=10, stale_s=0.3, p0=1e6, effort_delay="driver")
    svc.start()
    out = Listener(svc.bound["publish"])
    try:
        # rad/s: every joint well above the identification's slow-row threshold (0.2 rad/s) most of the time,
        # so that each gets the first pass's rows of its own within the run
        a = np.tile([0.5, -0.5], (6, 1)) * np.linspace(0.5, 1.0, 6)[:, None]
        b = np.tile([0.6, -0.3], (6, 1)) * np.linspace(0.5, 1.0, 6)[:, None]
        path = tmp_path / "traj.toml"
        excitation.save(FourierTrajectory(0.5, np.zeros(6), a, b), path)
        assert _wait(lambda: svc.identifier.counters.samples > 100, 60)      # the driver is up and streaming
        # the delay comes with the driver's health (on a loaded machine perhaps after the service's wait ran out)
        assert _wait(lambda: _req(svc.bound["commands"], cmd="status")["effort_delay_s"] == 0.0005, 60)
        status = _req(svc.bound["commands"], cmd="status")
        assert (status["effort_delay_s"], status["effort_delay_source"]) == (0.0005, "driver")
        enabled = _req(commands, cmd="enable")
        assert enabled["ok"], enabled
        assert _wait(lambda: _req(commands, cmd="status")["enabled"])
        reply = _req(commands, cmd="run_trajectory", file=path.name, periods=2)
        assert reply["ok"], reply
        assert _wait(lambda: not _req(commands, cmd="status")["moving"], 30)
        rows_after_motion = svc.identifier.counters.rows
        assert rows_after_motion > 3000
        est = None
        assert _wait(lambda: (est := out.latest(b"estimate")) is not None and est["samples"] >= rows_after_motion, 5)
        est = [m for t, m in out.got if t == b"estimate"][-1]
        assert est["names"] == svc.identifier.base.names and len(est["theta"]) == svc.identifier.p
        # batch WLS over the buffered window (the same samples, the same low-pass) agrees with the online
        # estimate on the well-excited parameters (those the batch identifies to better than 1 %, relative
        # standard deviation): the two are estimates of the same arm, so their difference stays within the
        # sum of their standard deviations (whatever their correlation) times the family-wise threshold
        # at which one run in a thousand would fail by chance
        assert svc.identifier.fit.joint_sigma is not None          # the first pass set Gautier's weights
        # the batch fit runs in the service's worker process: its first fit in a fresh checkout compiles the
        # regressor's kernels there (tens of seconds on a loaded machine)
        batch = _req(svc.bound["commands"], timeout_s=240.0, cmd="identify_now")
        assert batch["ok"], batch
        rows = batch["result"]["base_parameters"]
        assert [r["name"] for r in rows] == svc.identifier.base.names
        online = svc.identifier.rls.theta
        well = [k for k, r in enumerate(rows) if r["relative_std_pct"] is not None and r["relative_std_pct"] < 1.0]
        assert len(well) >= 10
        online_std = np.sqrt(np.diag(svc.identifier.rls.covariance()))
        z = family_wise_sigma(1e-3, len(well))
        for k in well:
            value, std = rows[k]["value"], rows[k]["std"]
            bound = z * (std + online_std[k])
            assert abs(online[k] - value) < bound, (rows[k]["name"], online[k], value, std, online_std[k])
        status = _req(svc.bound["commands"], cmd="status")
        assert status["ok"] and status["counters"]["rows"] >= rows_after_motion and status["malformed"] == 0
        assert status["counters"]["gaps"] == 0
        # freeze: rows keep coming but the estimate stays
        assert _req(svc.bound["commands"], cmd="freeze")["frozen"] is True
        theta = svc.identifier.rls.theta.copy()
        time.sleep(0.3)
        np.testing.assert_array_equal(svc.identifier.rls.theta, theta)
        assert _req(svc.bound["commands"], cmd="unfreeze")["frozen"] is False
        saved = _req(svc.bound["commands"], cmd="save", path=str(tmp_path / "est.json"))
        assert saved["ok"] and (tmp_path / "est.json").exists()
        theta = svc.identifier.rls.theta.copy()
        assert _req(svc.bound["commands"], cmd="reset")["ok"]
        assert svc.identifier.rls.rows == 0
        assert _req(svc.bound["commands"], cmd="load", path=str(tmp_path / "est.json"))["ok"]
        np.testing.assert_array_equal(svc.identifier.rls.theta, theta)
        bad = _req(svc.bound["commands"], cmd="load", path=str(tmp_path / "missing.json"))
        assert not bad["ok"] and "no such file" in bad["error"]
        assert "unknown command" in _req(svc.bound["commands"], cmd="fly")["error"]
        # the stream stops: the service says so
        drv.terminate()
        assert drv.wait(20) == 0
        assert _wait(lambda: any(t == b"health" and m["stream"] == "stopped" for t, m in out.drain()), 5)
    finally:
        svc.stop()
        if drv.poll() is None:
            drv.kill()
            drv.wait(10)


def _publisher():
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    return pub, pub.bind_to_random_port("tcp://127.0.0.1")


def _send_samples(pub, first, count):
    msg = stream.StateMessage(6)
    for k in range(first, first + count):
        msg.set_header(k, 0, k * 1_000_000, time.time_ns())
        msg.q[:] = 0.001 * k
        pub.send_multipart((stream.TOPIC_STATE, bytes(msg.buffer)))


def test_the_effort_delay_comes_from_the_drivers_health_and_samples_wait_for_it(model):
    """"driver": samples before the first health message are buffered, not fed; the delay of the health
    message is adopted (and again when it changes); a health message without a valid delay changes nothing."""
    pub, port = _publisher()
    svc = IdentService(model, state_endpoint=f"tcp://127.0.0.1:{port}", publish_endpoint="tcp://127.0.0.1:*",
                       command_endpoint="tcp://127.0.0.1:*", block=10, effort_delay="driver")
    svc.start()
    try:
        time.sleep(0.3)                                  # let the subscription reach the publisher
        _send_samples(pub, 0, 40)
        assert _wait(lambda: _req(svc.bound["commands"], cmd="status")["waiting"] == 40, 5)
        assert svc.identifier.counters.samples == 0 and svc._ring_count == 40
        assert _req(svc.bound["commands"], cmd="status")["effort_delay_s"] is None
        pub.send_multipart((stream.TOPIC_HEALTH, json.dumps({"effort_delay_s": "soon"}).encode()))
        pub.send_multipart((stream.TOPIC_HEALTH, json.dumps({"effort_delay_s": 0.002}).encode()))
        _send_samples(pub, 40, 30)
        assert _wait(lambda: svc.identifier.counters.samples == 30, 5)
        status = _req(svc.bound["commands"], cmd="status")
        assert (status["effort_delay_s"], status["waiting"], status["malformed"]) == (0.002, 40, 0)
        pub.send_multipart((stream.TOPIC_HEALTH, json.dumps({"effort_delay_s": 0.001}).encode()))
        assert _wait(lambda: svc.identifier.effort_delay == 0.001, 5)
        assert svc.identifier.counters.samples == 30    # the window restarted, the counters went on
    finally:
        svc.stop()
        pub.close(0)


def test_without_the_drivers_health_the_effort_delay_is_taken_as_zero_after_a_wait(model, monkeypatch, caplog):
    from ident.online import service

    monkeypatch.setattr(service, "DELAY_WAIT_S", 0.2)
    pub, port = _publisher()
    caplog.set_level(logging.WARNING, logger="ident.online.service")
    svc = IdentService(model, state_endpoint=f"tcp://127.0.0.1:{port}", publish_endpoint="tcp://127.0.0.1:*",
                       command_endpoint="tcp://127.0.0.1:*", block=10, effort_delay="driver")
    svc.start()
    try:
        time.sleep(0.3)
        _send_samples(pub, 0, 20)
        assert _wait(lambda: svc.waiting == 20, 5)
        time.sleep(0.3)
        _send_samples(pub, 20, 20)
        assert _wait(lambda: svc.identifier.counters.samples == 20, 5)
        assert svc.identifier.effort_delay == 0.0 and any(
            "taken as simultaneous" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
        status = _req(svc.bound["commands"], cmd="status")
        assert (status["effort_delay_s"], status["effort_delay_source"]) == (0.0, "none")   # not claimed as the driver's
        pub.send_multipart((stream.TOPIC_HEALTH, json.dumps({"effort_delay_s": 0.0005}).encode()))   # late: adopted
        assert _wait(lambda: _req(svc.bound["commands"], cmd="status")["effort_delay_source"] == "driver", 5)
        assert svc.identifier.effort_delay == 0.0005
    finally:
        svc.stop()
        pub.close(0)


def test_malformed_stream_messages_are_counted_and_never_become_data(model):
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    svc = IdentService(model, state_endpoint=f"tcp://127.0.0.1:{port}", publish_endpoint="tcp://127.0.0.1:*",
                       command_endpoint="tcp://127.0.0.1:*", stale_s=0.3)
    svc.start()
    try:
        good = stream.StateMessage(6)
        time.sleep(0.3)                                  # let the subscription reach the publisher
        other = stream.StateMessage(3)                   # another arm's message
        for k in range(50):
            good.set_header(k, 0, k * 1_000_000, time.time_ns())
            good.q[:] = 0.01 * k
            pub.send_multipart((stream.TOPIC_STATE, bytes(good.buffer)))
        pub.send_multipart((stream.TOPIC_STATE, b"ARMS garbage"))
        pub.send_multipart((stream.TOPIC_STATE, bytes(other.buffer)))
        pub.send_multipart((stream.TOPIC_STATE, b"x", b"y", b"z"))
        assert _wait(lambda: svc.malformed == 3 and svc.identifier.counters.samples == 50, 5)
        assert _wait(lambda: svc.stream_state == "stopped", 5)
    finally:
        svc.stop()
        pub.close(0)


def test_messages_are_decoded_in_blocks_with_repeats_dropped_and_the_newest_sample_time_published(model):
    """The stream is drained in blocks (one numpy view per block): a message repeating the previous device
    sample is dropped wherever it falls (inside a block or across two), the samples reach the identifier in
    order, and each estimate names the driver's time stamp of the newest sample it saw."""
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    svc = IdentService(model, state_endpoint=f"tcp://127.0.0.1:{port}", publish_endpoint="tcp://127.0.0.1:*",
                       command_endpoint="tcp://127.0.0.1:*", publish_hz=20, block=16, drain_s=0.02)
    svc.start()
    out = Listener(svc.bound["publish"])
    try:
        msg = stream.StateMessage(6)
        time.sleep(0.3)                                  # let the subscription reach the publisher
        sent, stamps = [], []
        for k in range(300):
            device = k if k % 7 else max(k - 1, 0)       # every 7th message repeats the previous sample
            stamp = 1.7e9 + k * 1e-3
            msg.set_header(k, 0, device * 1_000_000, int(stamp * 1e9))
            msg.q[:] = 0.001 * device
            pub.send_multipart((stream.TOPIC_STATE, bytes(msg.buffer)))
            sent.append(device)
            stamps.append(stamp)
            if k % 50 == 49:
                time.sleep(0.05)                         # a few drains, some repeats at block edges
        unique = np.unique(sent).size
        assert _wait(lambda: svc.messages == 300 and svc.identifier.counters.samples == unique, 10)
        assert svc.repeated == 300 - unique and svc.malformed == 0
        assert svc.identifier.counters.repeated == 0 and svc.identifier.counters.gaps == 0
        np.testing.assert_array_equal(svc._ring_seq[:unique], np.unique(sent))
        last = max(i for i, d in enumerate(sent) if d == sent[-1] and (i == 0 or sent[i - 1] != d))
        assert _wait(lambda: (e := out.latest(b"estimate")) is not None and e["newest_sample_time"] is not None
                     and abs(e["newest_sample_time"] - stamps[last]) < 1e-6, 5)
        timing = _req(svc.bound["commands"], cmd="status")["timing"]
        assert timing["flushed_samples"] == unique and 1 <= timing["flushes"] <= unique // 4   # blocks, not samples
    finally:
        svc.stop()
        pub.close(0)


def test_identify_now_runs_in_a_worker_while_the_stream_and_the_commands_go_on(model):
    """identify_now runs off the service's loop: the stream keeps being read (health never says "stopped"
    while the stream flows), a status request sent after it is answered before it, and its answer is the
    batch fit of the buffered samples."""
    rng = np.random.default_rng(5)
    traj = FourierTrajectory(0.25, rng.uniform(-0.3, 0.3, 6), rng.uniform(-0.6, 0.6, (6, 4)),
                             rng.uniform(-0.6, 0.6, (6, 4)))
    t = np.arange(40_000) / 1000.0
    q, qd, qdd = traj.evaluate(t)
    tau = dynamics.rnea(model, q, qd, qdd) + rng.normal(size=q.shape) * 0.02
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.SNDHWM, 0)                        # the first 6 s go out at once: queue, never drop
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    svc = IdentService(model, state_endpoint=f"tcp://127.0.0.1:{port}", publish_endpoint="tcp://127.0.0.1:*",
                       command_endpoint="tcp://127.0.0.1:*", stale_s=0.5, buffer_s=12.0)
    svc.start()
    out = Listener(svc.bound["publish"])
    msg = stream.StateMessage(6)
    sent = [0]
    flowing = threading.Event()

    def send(upto):
        for k in range(sent[0], upto):
            msg.set_header(k, 0, k * 1_000_000, time.time_ns())
            msg.q[:], msg.torque[:] = q[k], tau[k]
            pub.send_multipart((stream.TOPIC_STATE, bytes(msg.buffer)))
        sent[0] = upto

    def stream_on():              # 10 samples every 50 ms: a steady stream that a loaded machine keeps up with
        while flowing.is_set() and sent[0] < t.size:
            send(min(sent[0] + 10, t.size))
            time.sleep(0.05)

    ctx = zmq.Context.instance()
    batch_req, status_req = ctx.socket(zmq.REQ), ctx.socket(zmq.REQ)
    streamer = threading.Thread(target=stream_on, daemon=True)
    try:
        time.sleep(0.3)                                  # let the subscription reach the publisher
        send(6_000)
        assert _wait(lambda: svc.identifier.counters.samples == 6_000, 120), (svc.messages, svc.identifier.counters, svc.error)
        flowing.set()
        streamer.start()
        assert _wait(lambda: svc.stream_state == "ok", 5)
        time.sleep(0.6)                                  # the stream has flowed longer than stale_s
        for s in (batch_req, status_req):
            s.setsockopt(zmq.LINGER, 0)
            s.connect(svc.bound["commands"])
        before = svc.identifier.counters.samples
        seen = len(out.drain())                          # (the pause after the first 6 s said "stopped")
        batch_req.send(json.dumps({"cmd": "identify_now"}).encode())
        time.sleep(0.05)
        status_req.send(json.dumps({"cmd": "status"}).encode())
        assert status_req.poll(10_000), "status was not answered while identify_now ran"
        status = json.loads(status_req.recv())
        assert status["ok"] and not batch_req.poll(0)    # answered while the batch fit was still running
        busy_req = ctx.socket(zmq.REQ)                   # a second identify_now meanwhile is refused, not queued
        busy_req.setsockopt(zmq.LINGER, 0)
        busy_req.connect(svc.bound["commands"])
        busy_req.send(json.dumps({"cmd": "identify_now"}).encode())
        assert busy_req.poll(10_000)
        busy = json.loads(busy_req.recv())
        busy_req.close(0)
        assert not busy["ok"] and "running" in busy["error"]
        assert batch_req.poll(180_000), "identify_now did not answer"
        batch = json.loads(batch_req.recv())
        assert batch["ok"], batch
        rows = batch["result"]["base_parameters"]
        assert [r["name"] for r in rows] == svc.identifier.base.names
        truth = svc.identifier.base.from_standard(model.standard_parameters())   # the stream's own arm
        well = [k for k, r in enumerate(rows) if r["relative_std_pct"] is not None and r["relative_std_pct"] < 1.0]
        assert len(well) >= 10
        z = family_wise_sigma(1e-3, len(well))           # one run in a thousand fails by chance
        for k in well:                                   # the fit of the buffered samples: the arm's values
            value, std = rows[k]["value"], rows[k]["std"]
            assert abs(value - truth[k]) < z * std, (rows[k]["name"], value, truth[k], std)
        assert svc.identifier.counters.samples > before          # the stream was read meanwhile
        flowing.clear()
        streamer.join(5)
        health = [m["stream"] for topic, m in out.drain()[seen:] if topic == b"health"]
        assert "stopped" not in health and "resumed" not in health, health
        assert _wait(lambda: svc.identifier.counters.samples == sent[0], 120)    # nothing lost
    finally:
        flowing.clear()
        for s in (batch_req, status_req):
            s.close(0)
        svc.stop()
        pub.close(0)
