"""What the drives get in servo mode obeys every joint limit on the driver's own clock, acceleration included,
whatever a client streams: a hostile client speaking the wire format on its own PUSH socket (the session's
token from the servo command's reply, so every setpoint is the session's) sends setpoints that pass the checks
on its own stamps but jerk on the driver's clock, loses a stretch of them, stops servo or gets refused while the
arm moves fast. Every target the driver writes to the drives is recorded; their first and second differences
over the cycle period stay within the velocity and acceleration limits, and an honest smooth stream is still
followed closely, never refused."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zmq

from armid.client import ArmClient
from firmware_bridge import servo_wire
from local_driver import local_driver
from waiting import wait_until


class WrittenTargets:
    """Every position target the driver writes to the drives, in order, with the servo session's reference
    (its newest accepted setpoint; NaN outside a session) at that cycle."""

    def __init__(self, cycle):
        self.cycle, self.arm, self.write = cycle, cycle.arm, cycle.arm.write
        self.lock = threading.Lock()
        self.targets: list[np.ndarray] = []
        self.references: list[np.ndarray] = []
        self.arm.write = self._record

    def _record(self, command) -> None:
        session = self.cycle.servo
        with self.lock:
            self.targets.append(np.array(command.target_position, dtype=float))
            self.references.append(session.target.copy() if session is not None else
                                   np.full(len(command.target_position), np.nan))
        self.write(command)

    def close(self) -> tuple[np.ndarray, np.ndarray]:
        self.arm.write = self.write
        with self.lock:
            return np.array(self.targets), np.array(self.references)


def assert_within_limits(targets: np.ndarray, model, dt: float) -> None:
    """First and second differences of the written targets over dt and dt^2 within the velocity and
    acceleration limits, positions within the position limits; the slack is the rounding of the positions the
    differences are taken of (a few units in their last place), nothing more."""
    rounding = 4 * np.spacing(np.abs(targets).max())
    velocity = np.abs(np.diff(targets, axis=0))
    kick = np.abs(np.diff(targets, 2, axis=0))
    over_v = velocity - (model.qd_max * dt + rounding)
    over_a = kick - (model.qdd_max * dt * dt + rounding)
    k, j = np.unravel_index(np.argmax(over_a), over_a.shape)
    assert over_a.max() <= 0, (f"joint {j + 1}: the written target accelerates at {kick[k, j] / dt ** 2:.4g} rad/s^2 "
                               f"at write {k + 1}, limit {model.qdd_max[j]:.4g}")
    assert over_v.max() <= 0, np.unravel_index(np.argmax(over_v), over_v.shape)
    assert (targets >= model.q_min).all() and (targets <= model.q_max).all()


class Hostile:
    """A client that started servo itself and streams on its own PUSH socket, setpoint by setpoint, paced on
    its own schedule: `send(q, stamp_s)` stamps each with its session clock (s from the session's start)."""

    def __init__(self, arm: ArmClient, rate: float):
        reply = arm.request("servo", mode="position", timeout_cycles=int(rate))
        self.arm, self.rate, self.token = arm, rate, reply["token"]
        self.push = zmq.Context.instance().socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        self.push.connect(reply["endpoint"])
        self.seq, self.t0_ns, self.start = 0, time.time_ns(), time.perf_counter()
        self.sent = 0

    def send(self, q: np.ndarray, stamp_s: float, skip: int = 0) -> None:
        """Send q stamped t0 + stamp_s, `skip` sequence numbers after the last (setpoints lost on the way), then
        wait for the next period of the pacing."""
        self.seq += 1 + skip
        self.push.send(servo_wire.encode(servo_wire.MODE_POSITION, self.token, self.seq,
                                         self.t0_ns + int(stamp_s * 1e9), q))
        self.sent += 1
        time.sleep(max(0.0, self.start + self.sent / self.rate - time.perf_counter()))

    def close(self) -> None:
        self.push.close(0)


def _accelerate(h: Hostile, q0: np.ndarray, joint: int, a: float, v_top: float) -> tuple[np.ndarray, float, float]:
    """Honest stamps: from rest at q0, accelerate joint at a to v_top; (the last setpoint, its stamp, velocity)."""
    dt, t, q = 1.0 / h.rate, 0.0, q0.copy()
    for k in range(int(round(v_top / a * h.rate)) + 1):
        t = k * dt
        q = q0.copy()
        q[joint] += 0.5 * a * t * t
        h.send(q, t)
    return q, t, a * t


def velocity_steps(h: Hostile, q0, model):
    """Velocity steps of 0.14 rad/s on joint 1 every 10 ms, stamps honest: on the client's clock over its 10 ms
    windows the acceleration is 14 rad/s^2 (within 15); on the driver's clock each step is one cycle, 140."""
    dt, q = 1.0 / h.rate, q0.copy()
    for k in range(600):
        v = 0.14 * ((k // 10) % 2)
        q = q.copy()
        q[0] += v * dt
        h.send(q, k * dt)


def lying_stamps(h: Hostile, q0, model):
    """A steady 0.2 rad/s on joint 2 on the client's clock, but its stamps run 0.5 ms apart for 20 setpoints and
    1.5 ms apart for the next 20 while it sends one per cycle: never more than 10 ms ahead of the driver's clock,
    smooth on its own, and on the driver's clock the velocity jumps between 0.1 and 0.3 rad/s in one cycle."""
    t, q = 0.0, q0.copy()
    for k in range(800):
        step = 0.5e-3 if (k // 20) % 2 == 0 else 1.5e-3
        t += step
        q = q0.copy()
        q[1] += 0.2 * t
        h.send(q, t)


def lost_stretch(h: Hostile, q0, model):
    """A steady 0.03 rad/s on every joint, stamped honestly, and 299 setpoints lost on the way (a seq gap): the
    next one that arrives is 9 mrad away from the last."""
    dt = 1.0 / h.rate
    for k in range(600):
        if 100 <= k < 399:
            h.sent += 1                          # sent, never arrived: the pacing goes on
            continue
        h.send(q0 + 0.03 * k * dt, k * dt, skip=299 if k == 399 else 0)


def stop_while_fast(h: Hostile, q0, model):
    """Accelerate joint 1 at 10 rad/s^2 to 1 rad/s, then servo_stop with the arm moving at 1 rad/s."""
    _accelerate(h, q0, 0, 10.0, 1.0)
    h.arm.request("servo_stop")


def refused_while_fast(h: Hostile, q0, model):
    """Accelerate joint 3 at 10 rad/s^2 to 1.2 rad/s, then a setpoint whose stamp repeats the last: refused, and
    servo ends with the arm moving fast."""
    q, t, _ = _accelerate(h, q0, 2, 10.0, 1.2)
    h.send(q, t)
    assert wait_until(lambda: h.arm.status()["servo"].get("ended"), 5)


@pytest.mark.parametrize("pattern", [velocity_steps, lying_stamps, lost_stretch, stop_while_fast, refused_while_fast])
def test_the_targets_written_to_the_drives_obey_the_acceleration_limit_whatever_a_client_sends(model, pattern):
    with local_driver(model) as (d, _), ArmClient(d.bound["state"], d.bound["commands"]) as arm:
        arm.enable()
        q0 = np.array(arm.status()["q"])
        dt = 1.0 / d.cycle.rate_hz
        written = WrittenTargets(d.cycle)
        try:
            h = Hostile(arm, d.cycle.rate_hz)
            try:
                pattern(h, q0, model)
            finally:
                h.close()
            if d.cycle.servo is not None:
                arm.request("servo_stop")
            assert wait_until(lambda: not arm.status()["moving"], 5)
            time.sleep(0.05)
        finally:
            targets, _ = written.close()
        status = arm.status()
    assert status["enabled"] and status["fault"] is None, status
    assert_within_limits(targets, model, dt)
    if pattern is refused_while_fast:
        assert "sent_ns does not increase" in status["servo"]["ended"]


def test_an_honest_smooth_stream_is_followed_closely_and_never_refused(model):
    """A sine on every joint at an eighth of the velocity and acceleration limits of the slowest joint (the
    margin is for a loaded test machine, whose cycles come late: the limits hold per cycle, so fewer cycles a
    second follow less), stamped with the time each setpoint is for and sent one per cycle: servo is never
    refused, the written targets obey the limits, and they follow the newest setpoint within a few cycles of
    its own motion (the arrival jitter the driver's buffer does not absorb is smoothed at the acceleration
    limit, no more)."""
    with local_driver(model) as (d, _), ArmClient(d.bound["state"], d.bound["commands"]) as arm:
        arm.enable()
        q0 = np.array(arm.status()["q"])
        rate = d.cycle.rate_hz
        dt = 1.0 / rate
        # amplitude A, angular frequency w: A w = qd_max / 8 and A w^2 = qdd_max / 8 on the slowest joint
        w = float(np.min(model.qdd_max / model.qd_max))
        amplitude = float(np.min(model.qd_max)) / 8 / w
        written = WrittenTargets(d.cycle)
        try:
            h = Hostile(arm, rate)
            try:
                for k in range(int(2 * np.pi / w * rate)):
                    t = k * dt
                    h.send(q0 + amplitude * (1 - np.cos(w * t)), t)
            finally:
                h.close()
            assert wait_until(lambda: arm.status()["servo"]["received"] >= h.sent, 5), arm.status()["servo"]
            stats = arm.status()["servo"]
            arm.request("servo_stop")
            assert wait_until(lambda: not arm.status()["moving"], 5)
        finally:
            targets, references = written.close()
    assert "ended" not in stats, stats["ended"]
    assert_within_limits(targets, model, dt)
    inside = ~np.isnan(references[:, 0])
    r, x = references[inside], targets[inside]
    error = np.abs(x - r).max(axis=0)
    # the reference jumps when the buffer drops setpoints (a late cycle on a loaded machine); the target closes
    # its largest jump S at the acceleration limit within 2 sqrt(S / qdd_max): it trails the reference by no
    # more than the reference moves in that time (and a cycle)
    jump = np.abs(np.diff(r, axis=0)).max(axis=0)
    cycles = int(np.ceil(np.max(2 * np.sqrt(jump / model.qdd_max)) / dt)) + 1
    reach = np.abs(r[cycles:] - r[:-cycles]).max(axis=0)
    assert (error <= reach).all(), (error, reach, cycles)
    np.testing.assert_array_equal(targets[-1], r[-1])                   # at rest on the last setpoint


def test_a_stream_within_the_limits_on_the_cycle_clock_is_written_unchanged(model):
    """The session on its own (a real PUSH/PULL pair), one setpoint per cycle of a sine at half the limits:
    every target written is the setpoint itself, bit for bit. A cycle without a setpoint then two at once costs
    at most one setpoint's step of the sine, and the target is back on the setpoints two cycles later."""
    from driver.servo import ServoLimits, ServoSession

    limits = ServoLimits(model.q_min, model.q_max, model.qd_max, model.qdd_max, model.tau_max,
                         tuple(model.joint_names))
    ctx = zmq.Context.instance()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind("inproc://servo-shaping")
    push.connect("inproc://servo-shaping")
    dt, n, token = 1e-3, model.n, 77
    w = float(np.min(model.qdd_max / model.qd_max))
    amplitude = float(np.min(model.qd_max)) / 2 / w
    try:
        s = ServoSession(servo_wire.MODE_POSITION, pull, limits, dt, np.zeros(n), buffer_cycles=0, token=token)
        t0 = time.time_ns()
        sine = [np.full(n, amplitude * (1 - np.cos(w * k * dt))) for k in range(400)]
        arrivals = [1] * 300 + [0, 2] + [1] * 98
        k, error, start = 0, [], time.perf_counter()
        for cycle, count in enumerate(arrivals):
            time.sleep(max(0.0, start + cycle * dt - time.perf_counter()))      # stamps never ahead of real time
            for _ in range(count):
                push.send(servo_wire.encode(servo_wire.MODE_POSITION, token, k + 1, t0 + k * 1_000_000, sine[k]))
                k += 1
            assert wait_until(lambda: pull.poll(0) or not count, 1)
            step = s.next(np.zeros(n), np.zeros(n))
            assert step.kind in ("track", "hold"), step.reason
            error.append(np.abs(step.values - sine[k - 1]).max())
    finally:
        push.close(0)
        pull.close(0)
    assert max(error[:300]) == 0.0
    one_step = np.abs(sine[300] - sine[299]).max()
    assert 0 < max(error[300:]) <= one_step * (1 + 1e-9) and max(error[303:]) == 0.0
