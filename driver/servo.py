"""Servo mode: a client streams joint position (CSP) or torque (CST) setpoints, one per cycle at most, on the
driver's servo socket (a ZeroMQ PULL; the message: firmware_bridge.servo_wire), and the cycle sends each one
to the drives after checking it.

Each cycle (`ServoSession.next`, in the cycle thread) reads every setpoint that has arrived into a setpoint
buffer (firmware_bridge.runtime.setpoint_buffer, `buffer_cycles` deep, default 2) and takes the oldest: one setpoint per
cycle, in order, so that a client whose setpoints cross the machine with jitter gets each one carried out, not
the newest of a burst and then a repeat (0: no buffer, the newest each cycle). Before it is used it is checked
against the model's limits. The motion a client commands is judged
on the client's own clock (each setpoint's sent_ns), so that jitter in when setpoints arrive is not taken for
the client's velocity or acceleration; and what the drives get is bounded on the cycle's clock:
  position  finite, within the position limits; |q - q_last| / (sent - sent_last) within the velocity
            limits and the change of that velocity (between the intervals' midpoints) within the acceleration
            limits (sent_ns must increase);
            and |q - q_last| at most JUMP_FACTOR times what the velocity limit allows over the k cycles since
            the last accepted setpoint (a client whose clock lies cannot make the drives jump);
  torque    finite, within the torque limits; and the arm's measured velocity within its limits and its
            position within its limits (a torque loop runs away otherwise).
A setpoint that fails ends servo mode: the drives hold the last accepted position (torque: the measured one),
and the reason is an event. A cycle without a new setpoint holds the last one; after `timeout_cycles` in a
row the drives quick-stop, as a drive's own setpoint timeout does. Undecodable messages are counted and never
used.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import zmq

from firmware_bridge import servo_wire
from firmware_bridge.servo_wire import MODE_POSITION, MODE_TORQUE, ServoDecodeError
from firmware_bridge.runtime.log_throttle import Throttle
from firmware_bridge.runtime.setpoint_buffer import MAX_DEPTH, TargetBuffer

LATENCY_WINDOW = 4096
DEFAULT_TIMEOUT_CYCLES = 50
DEFAULT_BUFFER_CYCLES = 2
MAX_BUFFER_EXTRA = 3            # cycles the buffer's latency may grow beyond its depth (a burst): beyond, the
                                # oldest setpoints go (a client stream paced in Python grew it to 13 ms)
MAX_TIMEOUT_CYCLES = 10_000
JUMP_FACTOR = 3.0                   # a setpoint may move at most this times the velocity limit per cycle
MAX_DRAIN = 1000                    # messages read per cycle at most (a flooding client cannot stall the cycle)

TRACK, HOLD, END, STOP = "track", "hold", "end", "stop"
MALFORMED_LOG_INTERVAL_S = 5.0      # undecodable setpoints: the first logged, then one line per interval
_log = logging.getLogger(__name__)


@dataclass
class ServoStep:
    """What the cycle does this cycle: TRACK a new setpoint, HOLD the last one, END servo mode (hold, the
    reason says why) or STOP (quick stop: the setpoints stopped coming)."""

    kind: str
    values: np.ndarray | None = None
    reason: str = ""


@dataclass(frozen=True)
class ServoLimits:
    q_min: np.ndarray
    q_max: np.ndarray
    qd_max: np.ndarray
    qdd_max: np.ndarray
    tau_max: np.ndarray
    joint_names: tuple[str, ...]


class ServoSession:
    """One servo session, from the `servo` command to its end. Used by the cycle thread only."""

    def __init__(self, mode: int, sock: zmq.Socket, limits: ServoLimits, dt: float, q_start: np.ndarray,
                 timeout_cycles: int = DEFAULT_TIMEOUT_CYCLES, buffer_cycles: int = DEFAULT_BUFFER_CYCLES):
        self.mode, self.sock, self.limits, self.dt = mode, sock, limits, dt
        self.timeout_cycles = int(timeout_cycles)
        n = q_start.shape[0]
        self.n = n
        self.last = np.array(q_start, dtype=float) if mode == MODE_POSITION else np.zeros(n)
        self.velocity = np.zeros(n)
        self.since = 0                   # cycles since the last accepted setpoint
        self.last_sent_ns: int | None = None      # the client's clock at the last accepted setpoint
        self.last_span = dt                       # s between the last two accepted setpoints (client's clock)
        self.received = self.accepted = self.malformed = self.missed_cycles = 0
        self.last_error = ""
        self._malformed_log = Throttle(_log, logging.WARNING, MALFORMED_LOG_INTERVAL_S)
        self.latency_ns = np.zeros(LATENCY_WINDOW, dtype=np.int64)
        self.buffer = (TargetBuffer(buffer_cycles, max_queued=buffer_cycles + MAX_BUFFER_EXTRA)
                       if buffer_cycles else None)
        self._drain_old()

    @property
    def mode_name(self) -> str:
        return "position" if self.mode == MODE_POSITION else "torque"

    def _drain_old(self) -> None:
        """Setpoints sent before this session began are not this session's."""
        for _ in range(100_000):
            try:
                self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def _next_setpoint(self) -> tuple[int, int, np.ndarray] | None:
        """The setpoint of this cycle: the buffer's oldest (every arrival queued), or the newest that arrived."""
        newest = None
        for _ in range(MAX_DRAIN):
            try:
                raw = self.sock.recv(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            self.received += 1
            try:
                mode, seq, sent_ns, values = servo_wire.decode(raw, self.n)
            except ServoDecodeError as exc:
                self.malformed += 1
                self.last_error = str(exc)
                self._malformed_log.hit("servo: setpoint dropped: %s", exc)
                continue
            if mode != self.mode:
                self.malformed += 1
                self.last_error = (f"servo setpoint seq {seq}: mode {mode}, this session streams "
                                   f"{self.mode} ({self.mode_name})")
                self._malformed_log.hit("servo: setpoint dropped: %s", self.last_error)
                continue
            newest = (seq, sent_ns, values)
            if self.buffer is not None:
                self.buffer.push(np.int64(seq), np.int64(sent_ns), values)
        if self.buffer is None:
            return newest
        got = self.buffer.take()
        return None if got is None else (int(got[0]), int(got[1]), got[2])

    def next(self, measured_q: np.ndarray, measured_qd: np.ndarray) -> ServoStep:
        """This cycle's step (see the module docstring)."""
        lim = self.limits
        if self.mode == MODE_TORQUE:
            fast = np.abs(measured_qd) > lim.qd_max
            outside = (measured_q < lim.q_min) | (measured_q > lim.q_max)
            if fast.any() or outside.any():
                j = int(np.argmax(fast | outside))
                what = (f"velocity {measured_qd[j]:.4g} rad/s beyond its limit {lim.qd_max[j]:.4g}" if fast[j] else
                        f"position {measured_q[j]:.4g} outside [{lim.q_min[j]:.4g}, {lim.q_max[j]:.4g}]")
                return ServoStep(STOP, reason=f"servo: joint {lim.joint_names[j]}: {what} under torque control")
        got = self._next_setpoint()
        self.since += 1
        if got is None:
            self.missed_cycles += 1
            if self.since > self.timeout_cycles:
                return ServoStep(STOP, reason=f"servo: no setpoint for {self.since - 1} cycles (timeout "
                                              f"{self.timeout_cycles})")
            return ServoStep(HOLD, self.last)
        seq, sent_ns, values = got
        span = self.since * self.dt if self.last_sent_ns is None else (sent_ns - self.last_sent_ns) * 1e-9
        refusal = self._check(values, span)
        if refusal:
            return ServoStep(END, reason=f"servo setpoint seq {seq} refused: {refusal}; holding")
        if self.mode == MODE_POSITION:
            self.velocity = (values - self.last) / span
            self.last_span = span
        self.last_sent_ns = sent_ns
        self.last = values.copy()
        self.since = 0
        self.latency_ns[self.accepted % LATENCY_WINDOW] = time.time_ns() - sent_ns
        self.accepted += 1
        return ServoStep(TRACK, self.last)

    def _check(self, values: np.ndarray, span: float) -> str:
        lim, names = self.limits, self.limits.joint_names
        if self.mode == MODE_TORQUE:
            over = np.abs(values) > lim.tau_max
            if over.any():
                j = int(np.argmax(over))
                return f"joint {names[j]}: torque {values[j]:.4g} N m beyond its limit {lim.tau_max[j]:.4g}"
            return ""
        outside = (values < lim.q_min) | (values > lim.q_max)
        if outside.any():
            j = int(np.argmax(outside))
            return f"joint {names[j]}: position {values[j]:.4g} outside [{lim.q_min[j]:.4g}, {lim.q_max[j]:.4g}]"
        if not span > 0:
            return f"its sent_ns does not increase ({span * 1e9:.0f} ns after the last accepted one)"
        step = np.abs(values - self.last)
        jump = step > JUMP_FACTOR * lim.qd_max * self.since * self.dt
        if jump.any():
            j = int(np.argmax(jump))
            return (f"joint {names[j]}: moves {step[j]:.4g} rad in {self.since} cycle(s), more than {JUMP_FACTOR:g} "
                    f"times its velocity limit {lim.qd_max[j]:.4g} rad/s allows")
        velocity = (values - self.last) / span
        fast = np.abs(velocity) > lim.qd_max
        if fast.any():
            j = int(np.argmax(fast))
            return f"joint {names[j]}: velocity {velocity[j]:.4g} rad/s beyond its limit {lim.qd_max[j]:.4g}"
        acceleration = (velocity - self.velocity) / (0.5 * (span + self.last_span))   # mid-interval to mid-interval
        hard = np.abs(acceleration) > lim.qdd_max
        if hard.any():
            j = int(np.argmax(hard))
            return (f"joint {names[j]}: acceleration {acceleration[j]:.4g} rad/s^2 beyond its limit "
                    f"{lim.qdd_max[j]:.4g}")
        return ""

    def stats(self) -> dict:
        """Counters and the setpoint-to-cycle latency (client send to the cycle that used it), us."""
        k = min(self.accepted, LATENCY_WINDOW)
        lat = self.latency_ns[:k] / 1e3
        buffered = None if self.buffer is None else {"depth": self.buffer.depth, **self.buffer.counts.as_dict()}
        return {"mode": self.mode_name, "received": self.received, "accepted": self.accepted, "buffer": buffered,
                "malformed": self.malformed, "missed_cycles": self.missed_cycles,
                "timeout_cycles": self.timeout_cycles, "last_error": self.last_error,
                "latency_us": None if k == 0 else {"p50": float(np.percentile(lat, 50)),
                                                    "p99": float(np.percentile(lat, 99)), "max": float(lat.max())}}
