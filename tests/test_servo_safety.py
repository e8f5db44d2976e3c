"""Servo safety against a driver on the in-process simulator, driven by real ZeroMQ clients on loopback: a
client whose clock runs fast cannot drive a joint past its velocity limit, a client that did not start servo
mode cannot steer it, a smooth stream whose old setpoints are dropped after a client pause goes on (the
drives cross the gap within the limits, and the drops are counted on both sides), and the documented servo
example runs as written."""
from __future__ import annotations

import re
import secrets
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from armid.client import ArmClient
from firmware_bridge import servo_wire
from local_driver import local_driver
from waiting import wait_until

DOC = Path(__file__).resolve().parents[1] / "docs" / "reference" / "stream.md"


class DriveReference:
    """The drives' own record, every simulated cycle: the position reference they were commanded (position +
    following error) and their velocity estimate, joint by joint, as the largest magnitude seen."""

    def __init__(self, sim, n: int):
        self.sim, self.lock = sim, threading.Lock()
        self.step = np.zeros(n)            # largest |change of the reference| between two drive cycles, rad
        self.velocity = np.zeros(n)        # largest |velocity estimate|, rad/s
        self._last: np.ndarray | None = None
        self._last_time = 0.0
        self.dt = 0.0
        sim.add_cycle_callback(self._record)

    def _record(self, s) -> None:
        reference = s.position + s.following_error
        with self.lock:
            if self._last is not None:
                self.step = np.maximum(self.step, np.abs(reference - self._last))
                self.dt = max(self.dt, s.time - self._last_time)
            self._last, self._last_time = reference.copy(), s.time
            self.velocity = np.maximum(self.velocity, np.abs(s.velocity))

    def close(self) -> None:
        self.sim.remove_cycle_callback(self._record)


class CommandedSteps:
    """The driver's own record: the largest change of the position target it writes to the drives from one of
    its cycles to the next, joint by joint (rad), while installed."""

    def __init__(self, cycle):
        self.arm, self.write = cycle.arm, cycle.arm.write
        self.step, self._last = None, None
        self.arm.write = self._record

    def _record(self, command) -> None:
        target = np.array(command.target_position, dtype=float)
        if self._last is not None:
            change = np.abs(target - self._last)
            self.step = change if self.step is None else np.maximum(self.step, change)
        self._last = target
        self.write(command)

    def close(self) -> None:
        self.arm.write = self.write


def test_a_client_stamping_2_4_ms_per_1_ms_setpoint_cannot_drive_joint_1_past_its_velocity_limit(driver, model):
    """On its own clock the client accelerates joint 1 at 90 % of its limit towards 90 % of its velocity limit;
    it stamps each setpoint 2.4 ms after the last while sending one per millisecond, so on the driver's clock
    the motion runs 2.4 times faster. Neither the target the driver writes cycle to cycle nor the drives'
    velocity passes the limit, and servo ends naming the clock."""
    d, sim = driver
    with ArmClient(d.bound["state"], d.bound["commands"]) as arm:
        arm.enable()
        q0 = np.array(arm.status()["q"])
        record, commanded = DriveReference(sim, model.n), CommandedSteps(d.cycle)
        try:
            servo = arm.servo("position", timeout_cycles=1000)
            a, v_top, stamp = 0.9 * model.qdd_max[0], 0.9 * model.qd_max[0], 2.4e-3
            t_ns, start = time.time_ns(), time.perf_counter()
            k = 0
            while time.perf_counter() - start < 1.0 and not arm.status()["servo"].get("ended"):
                for _ in range(20):
                    t = max(0.0, (k - 50) * stamp)            # the client's clock: 50 setpoints at rest, then go
                    t_top = v_top / a
                    x = 0.5 * a * t * t if t < t_top else 0.5 * a * t_top ** 2 + v_top * (t - t_top)
                    q = q0.copy()
                    q[0] += x
                    servo.send(q, t_ns + int(k * stamp * 1e9))
                    k += 1
                    time.sleep(max(0.0, start + k * 1e-3 - time.perf_counter()))
            ended = arm.status()["servo"].get("ended") or ""
            servo.stop()
        finally:
            commanded.close()
            record.close()
        assert commanded.step[0] <= model.qd_max[0] / d.cycle.rate_hz * (1 + 1e-9), (commanded.step, ended)
        assert record.velocity[0] <= model.qd_max[0], (record.velocity, ended)
        assert re.search(r"ahead of the driver's clock|trail the setpoints", ended), ended


def _version_1(seq: int, sent_ns: int, values) -> bytes:
    return struct.pack("<4sHHB7xqQ", b"ARSP", 1, len(values), servo_wire.MODE_POSITION, sent_ns, seq) + \
        np.asarray(values, "<f8").tobytes()


def test_a_second_client_that_did_not_start_servo_cannot_steer_it(driver, model):
    """While the owner streams its hold pose, a second PUSH client sends setpoints 5 mrad away on joint 6 with
    a guessed token and in the token-less version 1: none is used (joint 6 stays), each is counted, the owner's
    session goes on."""
    d, sim = driver
    ctx = zmq.Context.instance()
    with ArmClient(d.bound["state"], d.bound["commands"]) as arm:
        arm.enable()
        q0 = np.array(arm.status()["q"])
        foreign = ctx.socket(zmq.PUSH)
        foreign.setsockopt(zmq.LINGER, 0)
        try:
            with arm.servo("position", timeout_cycles=500) as servo:
                foreign.connect(servo.endpoint)
                other = q0.copy()
                other[5] += 0.005
                guess = secrets.randbits(64)
                for k in range(1, 401):
                    now = time.time_ns()
                    servo.send(q0, now)
                    if k % 2:
                        foreign.send(servo_wire.encode(servo_wire.MODE_POSITION, guess, k, now, other))
                    else:
                        foreign.send(_version_1(k, now, other))
                    time.sleep(0.001)
                assert wait_until(lambda: arm.status()["servo"]["received"] >= 800, 5)
                stats = arm.status()["servo"]
                moved = abs(sim.read_truth().q[5] - q0[5])
        finally:
            foreign.close(0)
        assert "ended" not in stats and stats["accepted"] > 100
        assert (stats["refused_token"], stats["refused_version"]) == (200, 200), stats
        assert moved < 2e-4, moved
        assert "token" not in stats and "token" not in arm.health()["servo"]


def _sine(q0: np.ndarray, t: float) -> np.ndarray:
    """A 0.05 rad sine of period 2 s on joint 1, from rest: at most 0.157 rad/s."""
    q = q0.copy()
    q[0] += 0.05 * (1 - np.cos(np.pi * t))
    return q


def test_a_smooth_stream_goes_on_when_its_old_setpoints_are_dropped(armid_hil, model):
    """A 0.157 rad/s sine streamed at the cycle rate by a client speaking the wire format (the token from the
    servo command's reply) to a driver in a process of its own, each setpoint stamped with the time it is for.
    At the sine's fastest the client stalls for 100 ms and then sends the 100 setpoints it missed at once: the
    driver reads them over a few cycles (its intake is bounded by time), keeps a few cycles of them and drops
    the older ones, 15 mrad of motion. The drives cross that gap within the velocity limit (the arm's measured
    velocity stays within it; tests/test_servo.py checks the crossing cycle by cycle) and servo goes on."""
    rig = armid_hil("serial")
    arm, rate = rig.client, rig.chain.plan.rate_hz
    arm.enable()
    q0 = np.array(arm.status()["q"])
    fastest = [0.0]
    watch = arm.on_sample(lambda s: fastest.__setitem__(0, max(fastest[0], abs(float(s.qd[0])))))
    reply = arm.request("servo", mode="position", timeout_cycles=int(rate))
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(reply["endpoint"])
    try:
        t0 = time.time_ns() + 5_000_000
        messages = [servo_wire.encode(servo_wire.MODE_POSITION, reply["token"], k + 1, t0 + int(k * 1e9 / rate),
                                      _sine(q0, k / rate)) for k in range(int(1.5 * rate))]
        start = time.perf_counter() + 0.005
        stall = int(0.5 * rate)
        for k, raw in enumerate(messages):
            if k == stall:
                time.sleep(0.1)                           # the client stalls, then sends its backlog at once
            wait = start + k / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            push.send(raw)
        time.sleep(0.1)
        stats = arm.status()["servo"]
        arm.request("servo_stop")
    finally:
        push.close(0)
    assert "ended" not in stats, stats["ended"]
    assert stats["dropped"] > 0.06 * rate and stats["lost"] == 0, stats
    assert fastest[0] < model.qd_max[0] and watch.is_alive()


@pytest.mark.parametrize("catch_up", [True, False])
def test_after_a_22_ms_pause_every_setpoint_is_accounted_for_on_both_sides(driver, model, catch_up):
    """ServoStream after a 22 ms pause: sending every missed setpoint at once (catch_up) or only the one for
    now, as the docs advise. Either way servo goes on, the client's `dropped` are the driver's `lost`, every
    setpoint sent arrives, and the driver counts what it dropped; skipping the missed ones sends no backlog."""
    d, _ = driver
    with ArmClient(d.bound["state"], d.bound["commands"]) as arm:
        arm.enable()
        q0 = np.array(arm.status()["q"])
        servo = arm.servo("position", timeout_cycles=500)
        t0 = time.time_ns()
        start = time.perf_counter()
        k = 0
        while k < 1200:
            if k == 500:
                time.sleep(0.022)
                if not catch_up:
                    k = int((time.perf_counter() - start) * 1e3)       # the setpoint for now
            servo.send(_sine(q0, k * 1e-3), t0 + k * 1_000_000)
            k += 1
            time.sleep(max(0.0, start + k * 1e-3 - time.perf_counter()))
        assert wait_until(lambda: arm.status()["servo"]["received"] >= servo.sent, 5)
        stats = arm.status()["servo"]
        servo.stop()
    assert "ended" not in stats, stats["ended"]
    assert stats["lost"] == servo.dropped and servo.sent + servo.dropped == servo.seq
    assert stats["received"] == servo.sent and stats["accepted"] + stats["dropped"] <= servo.sent
    if not catch_up:
        assert servo.seq < 1200 - 15


def _servo_snippet() -> str:
    text = DOC.read_text().split("\n## Servo: streaming setpoints\n")[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1
    return blocks[0]


def test_the_documented_servo_example_runs_as_written(armid_hil, capsys):
    """The servo section's example, with a driver's endpoints (its own process, on the serial transport) for the
    documented ones: its two-second move ends by its own servo_stop, back where it started."""
    rig = armid_hil("serial")
    code = _servo_snippet()
    for documented, bound in (("tcp://127.0.0.1:5555", rig.chain.state), ("tcp://127.0.0.1:5556", rig.chain.commands)):
        assert documented in code
        code = code.replace(documented, bound)
    assert "servo.send(q, now)" in code
    start = rig.client.latest().q
    capsys.readouterr()
    exec(compile(code, str(DOC), "exec"), {})
    assert capsys.readouterr().out == "servo_stop requested\n", rig.client.status()["servo"]
    # the drives follow their buffered targets a few cycles behind, more on a busy machine: wait (bounded) for
    # the arm to come back, then hold it to where it started
    wait_until(lambda: np.allclose(rig.client.latest().q, start, rtol=0.0, atol=2e-3), 5.0)
    np.testing.assert_allclose(rig.client.latest().q, start, atol=2e-3)


def test_a_dangerous_stream_is_still_refused_by_the_documented_example_shape(driver, model):
    """The same loop as the example, but each setpoint 2 mrad further on joint 2 than the last (2 rad/s from
    rest in one step, far past the acceleration limit): servo ends naming the joint and acceleration, and the
    arm holds."""
    d, _ = driver
    with ArmClient(d.bound["state"], d.bound["commands"]) as arm:
        arm.enable()
        with arm.servo("position", timeout_cycles=500) as servo:
            q = arm.latest().q
            for _ in range(200):
                servo.send(q)
                q = q.copy()
                q[1] += 0.002
                arm.latest()
                if arm.status()["servo"].get("ended"):
                    break
            ended = arm.status()["servo"].get("ended") or ""
    assert re.search(r"joint j2: acceleration [\d.]+ rad/s\^2 beyond its limit 15", ended), ended
    assert arm.status()["enabled"]


def test_refused_setpoints_are_totalled_over_sessions_in_health_and_the_metrics(model):
    """Two servo sessions, each sent three setpoints with a wrong token and two of version 1 by another
    client: health's servo_totals and the scraped counters hold all ten, the running session's included."""
    import socket
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from driver.daemon import Metrics

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"

    def scrape() -> dict[str, float]:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        return {f.name: f.samples[0].value for f in text_string_to_metric_families(text) if f.samples}

    ctx = zmq.Context.instance()
    with local_driver(model, seed=4, metrics=Metrics(address)) as (d, _), \
            ArmClient(d.bound["state"], d.bound["commands"]) as arm:
        arm.enable()
        q0 = arm.latest().q
        foreign = ctx.socket(zmq.PUSH)
        foreign.setsockopt(zmq.LINGER, 0)
        try:
            for session in range(2):
                servo = arm.servo("position", timeout_cycles=2000)
                foreign.connect(servo.endpoint)
                for k in range(3):
                    foreign.send(servo_wire.encode(servo_wire.MODE_POSITION, servo.token ^ 1, k + 1, time.time_ns(),
                                                   q0))
                for k in range(2):
                    foreign.send(_version_1(k + 1, time.time_ns(), q0))
                servo.send(q0)
                assert wait_until(lambda: arm.status()["servo"]["received"] == 6, 5)
                if session == 0:
                    servo.stop()
            assert wait_until(lambda: d.last_health is not None and d.last_health["servo_totals"]["received"] == 12, 5)
            totals = d.last_health["servo_totals"]
            metrics = scrape()
            servo.stop()
        finally:
            foreign.close(0)
    assert (totals["refused_token"], totals["refused_version"], totals["malformed"]) == (6, 4, 0), totals
    assert (metrics["armid_servo_refused_token"], metrics["armid_servo_refused_version"]) == (6.0, 4.0), metrics


def test_a_driver_reply_without_a_session_token_is_refused_clearly_and_servo_stopped(model, monkeypatch):
    """A driver older than the client (its servo reply, as such a driver made it, has no token): ArmClient.servo
    says so in one line and sends servo_stop, instead of streaming setpoints the driver cannot read."""
    from armid.client import ClientError
    from driver.daemon import Driver

    start = Driver.start_servo

    def old_reply(self, *args, **kw):
        reply = start(self, *args, **kw)
        reply.pop("token")
        return reply

    monkeypatch.setattr(Driver, "start_servo", old_reply)
    with local_driver(model, seed=5) as (d, _), ArmClient(d.bound["state"], d.bound["commands"]) as arm:
        arm.enable()
        with pytest.raises(ClientError, match=r"servo: the driver's reply has no session token \('None'\): it is "
                                              r"older than this client"):
            arm.servo("position")
        assert arm.status()["servo"]["ended"] == "servo_stop requested"
