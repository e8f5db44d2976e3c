"""What other threads ask of the cycle, under a flood, counted in the cycle's own messages (no clock):

  * a quick stop or a disable overtakes everything: requested while requests flood the queue and a burst of
    device samples waits, it is in the first state message published after it was asked for, and its reply
    names that message;
  * the cycle's time for queued requests is bounded per cycle: a flood of requests each longer than that time
    runs one request per cycle, the rest deferred and counted, none lost.

The arm is the test's (LockstepArm): the cycle runs when the test hands it samples, so each case is an order of
events, not a race.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from driver import motion
from driver.cycle import INTAKE_SHARE, Cycle
from driver.hal import Arm, ArmState
from firmware_bridge import cia402, stream
from firmware_bridge.cia402 import State
from ident.model import load_model
from waiting import wait_until

RATE_HZ = 100.0              # the request time per cycle is INTAKE_SHARE of 10 ms
GATE_S = 30.0                # the longest the arm holds the cycle while the test sets up an order of events


class LockstepArm(Arm):
    """Six drives in OPERATION ENABLED whose samples the test hands over (push), in bursts if it likes, kept
    until read (as the serial transport keeps them). While the gate is shut the cycle waits for it whatever its
    own timeout: the device's clock is the test's."""

    n = 6
    streams_on_own_clock = True
    keeps_every_sample = True

    def __init__(self):
        self.cond = threading.Condition()
        self.pushed = self.taken = 0
        self.gate = True
        self.waiting = False

    def push(self, k: int = 1) -> None:
        with self.cond:
            self.pushed += k
            self.cond.notify_all()

    def shut(self) -> None:
        with self.cond:
            self.gate = False

    def open_gate(self) -> None:
        with self.cond:
            self.gate = True
            self.cond.notify_all()

    def wait_new(self, timeout_s: float) -> bool:
        with self.cond:
            if not self.gate:
                self.waiting = True
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.gate, GATE_S)
                self.waiting = False
            return self.cond.wait_for(lambda: self.pushed != self.taken, timeout_s)

    def backlog(self) -> int:
        with self.cond:
            return self.pushed - self.taken

    def read(self, out: ArmState) -> bool:
        with self.cond:
            fresh = self.pushed != self.taken
            if fresh:
                self.taken += 1
            out.device_time_ns, out.host_time_ns = self.taken * 10_000_000, time.time_ns()
            out.statusword[:] = cia402.statusword_for(State.OPERATION_ENABLED)
        return fresh

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def begin_cycle(self) -> None:
        pass

    def write(self, command) -> None:
        pass

    def link_stats(self) -> dict:
        return {}


class Rig:
    def __init__(self):
        self.arm = LockstepArm()
        self.sent: list[dict] = []
        self.lock = threading.Lock()
        self.cycle = Cycle(self.arm, rate_hz=RATE_HZ, watchdog_s=60.0, clock="device", publish=self._publish)

    def _publish(self, topic, payload) -> None:
        if topic == stream.TOPIC_STATE:
            with self.lock:
                self.sent.append(stream.decode_state(bytes(payload)))

    def count(self) -> int:
        with self.lock:
            return len(self.sent)

    def step(self, k: int = 1) -> None:
        """Hand the cycle k samples one at a time, each published before the next."""
        for _ in range(k):
            target = self.count() + 1
            self.arm.push()
            assert wait_until(lambda: self.count() >= target, 30), "the cycle did not publish the sample"

    def shut_and_wait(self) -> None:
        """The cycle waits at the shut gate (nothing runs until it opens)."""
        self.arm.shut()
        with self.arm.cond:
            assert self.arm.cond.wait_for(lambda: self.arm.waiting, 30), "the cycle did not come to the gate"


@pytest.fixture
def rig():
    r = Rig()
    r.cycle.start()
    try:
        r.step(1)
        r.cycle.submit(r.cycle.enable, timeout=30)
        r.step(2)
        yield r
    finally:
        r.arm.open_gate()
        r.cycle.stop()


def _flood(cycle: Cycle, count: int, each_s: float) -> tuple[list[threading.Thread], list, list]:
    """`count` requests from threads of their own, each taking each_s in the cycle; ran: each request as the
    cycle ran it (in the cycle thread, so complete when the cycle's message is out); done: their results as the
    requesters got them."""
    ran: list = []
    done: list = []

    def request(k):
        time.sleep(each_s)
        ran.append(k)
        return k

    def ask(k):
        done.append(cycle.submit(lambda: request(k), timeout=GATE_S))
    threads = [threading.Thread(target=ask, args=(k,), daemon=True) for k in range(count)]
    for t in threads:
        t.start()
    return threads, ran, done


@pytest.mark.parametrize("urgent", ["request_quick_stop", "disable"])
def test_a_quick_stop_under_a_flood_is_in_the_first_message_after_it_was_asked_for(rig, urgent):
    cycle, arm = rig.cycle, rig.arm
    plan = motion.plan_move(motion.rigid_body_model(load_model("generic6")), cycle.hold.copy(),
                            np.full(6, 0.3), RATE_HZ, speed=0.2)
    cycle.submit(lambda: cycle.start_motion(plan), timeout=30)
    rig.step(3)
    assert rig.sent[-1]["flags"] & stream.FLAG_MOVING
    rig.shut_and_wait()
    # while the cycle waits: a flood of requests queued, a burst of samples arrived, and then the quick stop
    each_s = 2 * INTAKE_SHARE / RATE_HZ
    threads, _, _ = _flood(cycle, 20, each_s)
    assert wait_until(lambda: len(cycle._requests) == 20, 30)
    burst = 8
    arm.push(burst)
    first = rig.count()                   # the first message published after the quick stop was asked for
    reply: list = []
    asker = threading.Thread(target=lambda: reply.append(cycle.urgent(getattr(cycle, urgent), timeout=GATE_S)))
    asker.start()
    assert wait_until(lambda: len(cycle._urgent) == 1, 30)
    arm.open_gate()
    asker.join(GATE_S)
    assert reply == [first]               # its reply names that message
    assert wait_until(lambda: rig.count() >= first + burst, 30)
    after = rig.sent[first:]
    assert [m["seq"] for m in after[:burst]] == list(range(first, first + burst))
    # the burst's samples, published after it, all carry it: no motion, and the drives no longer powered
    assert not any(m["flags"] & stream.FLAG_MOVING for m in after)
    assert cycle.motion is None and not cycle.want_power
    assert cycle.quick_stop == (urgent == "request_quick_stop")
    assert cycle.urgent_taken == 1
    rig.step(25)                          # the flood is still served afterwards
    for t in threads:
        t.join(GATE_S)
    assert not any(t.is_alive() for t in threads)


def test_requests_longer_than_the_cycles_request_time_run_one_per_cycle_the_rest_deferred_and_counted(rig):
    cycle = rig.cycle
    count = 12
    rig.shut_and_wait()
    each_s = 1.5 * INTAKE_SHARE / RATE_HZ         # each request outlasts a cycle's request time alone
    threads, ran, done = _flood(cycle, count, each_s)
    assert wait_until(lambda: len(cycle._requests) == count, 30)
    deferred0 = cycle.requests_deferred
    arm = rig.arm
    arm.open_gate()
    for k in range(1, count + 1):
        rig.step(1)
        # one request per cycle: the first always runs, the budget is then spent, the rest wait
        assert len(ran) == k and len(cycle._requests) == count - k
        assert cycle.requests_deferred - deferred0 == min(k, count - 1)
    for t in threads:
        t.join(GATE_S)
    assert sorted(done) == list(range(count))       # none lost


def test_the_intake_share_comes_from_the_config_and_a_bad_one_is_refused_naming_the_key(tmp_path):
    from driver.config import ConfigError, load_config

    path = tmp_path / "driver.toml"
    path.write_text('[driver]\nintake_share = 0.25\n[transport]\nname = "sim"\n')
    cfg = load_config(path)
    assert cfg.intake_share == 0.25
    cycle = Cycle(LockstepArm(), rate_hz=RATE_HZ, clock="device", intake_share=cfg.intake_share)
    assert cycle._request_ns == int(0.25 * 1e9 / RATE_HZ)
    assert load_config(_written(path, "")).intake_share == INTAKE_SHARE
    for bad in ("0.9", "0", "true", '"much"'):
        with pytest.raises(ConfigError, match=r"driver\.intake_share: expected a number 0\.01\.\.0\.5"):
            load_config(_written(path, f"intake_share = {bad}\n"))
    with pytest.raises(ValueError, match="intake_share"):
        Cycle(LockstepArm(), clock="device", intake_share=2.0)


def _written(path, driver_keys: str):
    path.write_text(f'[driver]\n{driver_keys}[transport]\nname = "sim"\n')
    return path


def test_a_flood_of_servo_setpoints_is_read_for_the_intake_time_only_the_rest_waits_counted():
    """With no time for setpoints (intake_share 0) a cycle reads MIN_INTAKE of a flood, counts the cycle as
    deferred, and leaves the rest in the socket for the next cycles: the bound is the time, not a count."""
    import zmq

    from driver.servo import MIN_INTAKE, ServoLimits, ServoSession
    from firmware_bridge import servo_wire

    model = load_model("generic6")
    limits = ServoLimits(model.q_min, model.q_max, model.qd_max, model.qdd_max, model.tau_max,
                         tuple(model.joint_names))
    ctx = zmq.Context.instance()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    for s in (pull, push):
        s.setsockopt(zmq.LINGER, 0)
    pull.bind("inproc://intake-flood")
    push.connect("inproc://intake-flood")
    try:
        token, q = 7, np.zeros(6)
        session = ServoSession(servo_wire.MODE_POSITION, pull, limits, 1e-3, q, token=token, intake_share=0.0)
        flood = 5 * MIN_INTAKE
        for k in range(flood):
            push.send(servo_wire.encode(servo_wire.MODE_POSITION, token, k + 1, 1_000_000 * (k + 1), q))
        assert pull.poll(5000)
        for cycle in range(1, 4):
            session.next(q, np.zeros(6))
            assert session.received == cycle * MIN_INTAKE and session.intake_deferred == cycle
        assert session.stats()["intake_deferred_cycles"] == 3
    finally:
        pull.close()
        push.close()
