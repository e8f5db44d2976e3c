"""Servo mode: a client streams joint position (CSP) or torque (CST) setpoints, one per cycle at most, on the
driver's servo socket (a ZeroMQ PULL; the message: firmware_bridge.servo_wire), and the cycle sends each one
to the drives after checking it.

Only the session that started servo mode streams: each setpoint carries the session token of the `servo`
command's reply; others (a wrong token, the token-less version 1) are counted and never used.

Each cycle (`ServoSession.next`, in the cycle thread) reads the setpoints that have arrived (for at most
`intake_share` of the period, INTAKE_SHARE by default, the driver's `[driver] intake_share`: a flood waits in
the socket, and the cycles that stopped reading at that bound are counted, `intake_deferred_cycles`) into a setpoint
buffer (firmware_bridge.runtime.setpoint_buffer, `buffer_cycles` deep, default 2) and takes the oldest: one setpoint per
cycle, in order, so that a client whose setpoints cross the machine with jitter gets each one carried out, not
the newest of a burst and then a repeat (0: no buffer, the newest each cycle). Before it is used it is checked
against the model's limits:
  position  finite, within the position limits; the first setpoint within FIRST_STEP_MAX of where the drives
            hold. The motion between setpoints is judged on the client's clock (each setpoint's sent_ns, which
            must increase), so that jitter in when setpoints arrive is not taken for motion, and over WINDOW_S
            of it, so that noise in the values (or a stamp a little off the time its value is for) is not
            taken for a huge acceleration: the velocity from the setpoint WINDOW_S before to this one within the
            velocity limits, and its change from the WINDOW_S before that (between the windows' midpoints)
            within the acceleration limits (a window not yet filled counts as WINDOW_S; before the first
            setpoint the arm is at rest). A sudden change of velocity of up to qdd_max * WINDOW_S can pass; a
            longer one cannot. That clock is held to the driver's own: since the session's first setpoint,
            sent_ns may run ahead of the setpoints' arrival on the driver's clock by CLOCK_LEAD_S plus
            CLOCK_RATE of the time at most, so a client whose clock lies cannot make a fast motion look slow.
            What the drives get is bounded on the driver's clock whatever the client sends: each cycle their
            target moves towards the newest setpoint within the position, velocity and acceleration limits
            (driver.servo_shaping: a stream within them is written unchanged; jerks, gaps and held cycles are
            followed at the limits); if the drives trail the newest setpoint by more than the velocity limit
            covers in LAG_S, the setpoints outrun the limits and servo ends.
  torque    finite, within the torque limits; and the arm's measured velocity within its limits and its
            position within its limits (a torque loop runs away otherwise).
A setpoint that fails ends servo mode: the drives' target comes to rest within the limits (`stop_ramp`, run by
the cycle as the motion "servo stop"; torque: the measured position is held), and the reason is an event. A
cycle without a new setpoint holds the last one (or goes on to it, or comes to rest); after `timeout_cycles`
in a row the drives quick-stop, as a drive's own setpoint timeout does. Undecodable messages are counted and
never used; so are setpoints that reached the driver but were never used (`dropped`: the buffer's bound on its
latency, or the newest-only mode) and setpoints that never reached it (`lost`: gaps in seq).
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import zmq

from firmware_bridge import servo_wire
from firmware_bridge.servo_wire import MODE_POSITION, MODE_TORQUE, ServoDecodeError, ServoVersionError
from firmware_bridge.runtime.log_throttle import Throttle
from firmware_bridge.runtime.setpoint_buffer import MAX_DEPTH, TargetBuffer
from driver.servo_shaping import stop_ramp, track

LATENCY_WINDOW = 4096
DEFAULT_TIMEOUT_CYCLES = 50
DEFAULT_BUFFER_CYCLES = 2
MAX_BUFFER_EXTRA = 3            # cycles the buffer's latency may grow beyond its depth (a burst): beyond, the
                                # oldest setpoints go (a client stream paced in Python grew it to 13 ms)
MAX_TIMEOUT_CYCLES = 10_000
INTAKE_SHARE = 0.1              # of the cycle's period, the most a cycle spends reading setpoints: a client
                                # flooding the socket cannot stall the cycle (1000 messages a cycle took 4.45 ms);
                                # what it leaves waits in the socket (bounded by its high-water mark)
MIN_INTAKE = 8                  # messages a cycle reads whatever the clock says (~40 us): a burst of a few
                                # setpoints is taken in one cycle even when the budget was spent elsewhere
CLOCK_LEAD_S = 0.05             # s: how far a client's sent_ns may run ahead of the driver's clock in a session
CLOCK_RATE = 1e-3               # and this fraction of the session's time more (clocks drift, NTP slews <= 500 ppm)
WINDOW_S = 0.01                 # s of the client's clock over which velocity and acceleration are judged
LAG_S = 0.05                    # s: the drives may trail the newest setpoint by what the velocity limit covers in it
FIRST_STEP_MAX = 2e-3           # rad: the first setpoint starts where the drives hold, within this

TRACK, HOLD, END, STOP = "track", "hold", "end", "stop"
# the session counters the driver also totals over its life (health's servo_totals, the metrics)
TOTALLED = ("received", "accepted", "malformed", "refused_token", "refused_version", "dropped", "lost")
MALFORMED_LOG_INTERVAL_S = 5.0      # undecodable setpoints: the first logged, then one line per interval
_log = logging.getLogger(__name__)


@dataclass
class ServoStep:
    """What the cycle does this cycle: TRACK a new drive target, HOLD the last one, END servo mode (hold, the
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
    """One servo session, from the `servo` command to its end. Used by the cycle thread only. `token` is the
    session token its setpoints must carry (the reply to the servo command gives it to the client)."""

    def __init__(self, mode: int, sock: zmq.Socket, limits: ServoLimits, dt: float, q_start: np.ndarray,
                 timeout_cycles: int = DEFAULT_TIMEOUT_CYCLES, buffer_cycles: int = DEFAULT_BUFFER_CYCLES,
                 token: int = 0, compensate: tuple[str, ...] = (), intake_share: float = INTAKE_SHARE):
        self.mode, self.sock, self.limits, self.dt = mode, sock, limits, dt
        self.compensate = tuple(compensate) if mode != MODE_POSITION else ()   # torque: the model's terms added
        self.token = int(token)
        self.timeout_cycles = int(timeout_cycles)
        self.intake_ns = int(intake_share * dt * 1e9)     # the cycle's time for reading setpoints
        self.intake_deferred = 0                 # cycles that stopped reading at that time (setpoints left waiting)
        n = q_start.shape[0]
        self.n = n
        self.last = np.array(q_start, dtype=float) if mode == MODE_POSITION else np.zeros(n)   # the drives' target
        self.target = self.last.copy()           # position: the newest accepted setpoint (the drives move to it)
        self._target_before = self.target.copy()     # ... as it was the cycle before (its velocity on our clock)
        self.velocity = np.zeros(n)              # the drives' target's velocity on the cycle clock, rad/s
        self.history: deque[tuple[int, np.ndarray]] = deque()   # (sent_ns, values) of the last accepted ones
        self._history_from_start = True          # history[0] is the session's first setpoint
        self.since = 0                   # cycles since the last accepted setpoint
        self.last_sent_ns: int | None = None      # the client's clock at the last accepted setpoint
        self._first: tuple[int, int, int, np.ndarray] | None = None   # the first setpoint that arrived: (seq,
        # sent_ns, arrival ns on the driver's clock, values); the session's clock and motion start from it
        self._last_seq: int | None = None         # seq of the last setpoint of this session that arrived
        self.received = self.accepted = self.malformed = self.missed_cycles = 0
        self.refused_version = self.refused_token = 0   # refused: a version-1 client; another client's setpoints
        self.lost = self.superseded = self.bridged_cycles = 0
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

    def _refuse(self, text: str) -> None:
        self.last_error = text
        self._malformed_log.hit("servo: setpoint dropped: %s", text)

    def _next_setpoint(self) -> tuple[int, int, int, np.ndarray] | None:
        """The setpoint of this cycle, (seq, sent_ns, arrival_ns, values): the buffer's oldest (every arrival
        queued), or the newest that arrived."""
        newest = None
        stop_ns = time.perf_counter_ns() + self.intake_ns
        read = 0
        while True:                         # until the socket is empty or the budget spent (MIN_INTAKE at least)
            if read >= MIN_INTAKE and time.perf_counter_ns() > stop_ns:
                self.intake_deferred += 1
                break
            read += 1
            try:
                raw = self.sock.recv(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            arrival = time.perf_counter_ns()
            self.received += 1
            try:
                sp = servo_wire.decode(raw, self.n)
            except ServoVersionError as exc:
                self.refused_version += 1
                self._refuse(str(exc))
                continue
            except ServoDecodeError as exc:
                self.malformed += 1
                self._refuse(str(exc))
                continue
            if sp.token != self.token:
                self.refused_token += 1
                self._refuse(f"servo setpoint seq {sp.seq}: not this session's token (the session that started "
                             f"servo mode streams; another client's setpoints are never used)")
                continue
            if sp.mode != self.mode:
                self.malformed += 1
                self._refuse(f"servo setpoint seq {sp.seq}: mode {sp.mode}, this session streams "
                             f"{self.mode} ({self.mode_name})")
                continue
            if self._last_seq is not None and sp.seq > self._last_seq + 1:
                self.lost += sp.seq - self._last_seq - 1
            self._last_seq = sp.seq
            if self._first is None:
                self._first = (sp.seq, sp.sent_ns, arrival, sp.values.copy())
            if self.buffer is not None:
                self.buffer.push(np.int64(sp.seq), np.int64(sp.sent_ns), np.int64(arrival), sp.values)
            elif newest is not None:
                self.superseded += 1            # newest only: the one before it in this cycle is never used
            newest = (sp.seq, sp.sent_ns, arrival, sp.values)
        if self.buffer is None:
            return newest
        got = self.buffer.take()
        return None if got is None else (int(got[0]), int(got[1]), int(got[2]), got[3])

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
            if self.mode == MODE_POSITION and (self.velocity.any() or not np.array_equal(self.last, self.target)):
                before = self.last.copy()
                values = self._toward_target()                         # still on its way, or coming to rest
                return ServoStep(HOLD if np.array_equal(values, before) else TRACK, values)
            return ServoStep(HOLD, self.last)
        seq, sent_ns, arrival_ns, values = got
        refusal = self._start(seq) if self.mode == MODE_POSITION and self.last_sent_ns is None else ""
        refusal = refusal or self._check(values, sent_ns, arrival_ns)
        if refusal:
            return ServoStep(END, reason=f"servo setpoint seq {seq} refused: {refusal}; holding")
        if self.mode == MODE_POSITION:
            self.target = values.copy()
            self._remember(sent_ns, self.target)
        else:
            self.last = values.copy()
        self.last_sent_ns = sent_ns
        self.since = 0
        self.latency_ns[self.accepted % LATENCY_WINDOW] = time.time_ns() - sent_ns
        self.accepted += 1
        return ServoStep(TRACK, self._toward_target() if self.mode == MODE_POSITION else self.last)

    def _toward_target(self) -> np.ndarray:
        """This cycle's drive target: towards the newest setpoint within the position, velocity and acceleration
        limits on the cycle clock (driver.servo_shaping)."""
        lim = self.limits
        if track(self.last, self.velocity, self.target, self._target_before, self.dt, lim.qd_max, lim.qdd_max,
                 lim.q_min, lim.q_max):
            self.bridged_cycles += 1
        self._target_before[:] = self.target
        return self.last.copy()

    def stop_ramp(self, at_setpoint: bool) -> np.ndarray | None:
        """Position mode: the drive targets (K, n) of the cycles that bring the target to rest within the limits
        when the session ends: at the newest accepted setpoint (at_setpoint: a client's orderly stop), else as
        soon as the acceleration limits let it (a refusal). None: nothing to do (torque mode, or at rest)."""
        if self.mode != MODE_POSITION:
            return None
        lim = self.limits
        return stop_ramp(self.last, self.velocity, self.dt, lim.qd_max, lim.qdd_max, lim.q_min, lim.q_max,
                         self.target if at_setpoint else None)

    def _start(self, used_seq: int) -> str:
        """Before the session's first setpoint is used: the first that arrived (this one, or one the buffer
        dropped before it) must start where the drives hold; the session's motion starts from it, at rest."""
        seq, sent_ns, _, values = self._first
        off = np.abs(values - self.last)
        if off.max() > FIRST_STEP_MAX:
            j = int(np.argmax(off))
            return (f"joint {self.limits.joint_names[j]}: the first setpoint (seq {seq}) is {off[j]:.4g} rad from "
                    f"where the drives hold, more than {FIRST_STEP_MAX:g} rad (start the stream where the arm is)")
        if used_seq != seq:                 # judge the one used against it
            self.history.append((sent_ns, values))
            self.last_sent_ns = sent_ns
        return ""

    def _check(self, values: np.ndarray, sent_ns: int, arrival_ns: int) -> str:
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
        if self.last_sent_ns is None:
            return ""                       # the session's first setpoint, checked by _start
        if not sent_ns > self.last_sent_ns:
            return f"its sent_ns does not increase ({sent_ns - self.last_sent_ns} ns after the last accepted one)"
        _, first_sent, first_arrival, _ = self._first
        elapsed = arrival_ns - first_arrival
        lead = (sent_ns - first_sent) - elapsed
        allowed = CLOCK_LEAD_S * 1e9 + CLOCK_RATE * elapsed
        if lead > allowed:
            return (f"its sent_ns runs {lead * 1e-6:.4g} ms ahead of the driver's clock since the session's first "
                    f"setpoint, more than {allowed * 1e-6:.4g} ms (stamp each setpoint with the time it is for)")
        velocity, span, velocity_before, span_before = self._window_velocities(sent_ns, values)
        fast = np.abs(velocity) > lim.qd_max
        if fast.any():
            j = int(np.argmax(fast))
            return (f"joint {names[j]}: velocity {velocity[j]:.4g} rad/s beyond its limit {lim.qd_max[j]:.4g} "
                    f"(over {span * 1e3:.3g} ms of sent_ns)")
        acceleration = (velocity - velocity_before) / (0.5 * (span + span_before))   # window mid to window mid
        hard = np.abs(acceleration) > lim.qdd_max
        if hard.any():
            j = int(np.argmax(hard))
            return (f"joint {names[j]}: acceleration {acceleration[j]:.4g} rad/s^2 beyond its limit "
                    f"{lim.qdd_max[j]:.4g} (over {(span + span_before) * 1e3:.3g} ms of sent_ns)")
        trail = np.abs(values - self.last) - lim.qd_max * LAG_S
        if (trail > 0).any():
            j = int(np.argmax(trail))
            return (f"joint {names[j]}: the drives trail the setpoints by {abs(values[j] - self.last[j]):.4g} rad, "
                    f"more than its velocity limit {lim.qd_max[j]:.4g} rad/s covers in {LAG_S * 1e3:g} ms "
                    f"(the setpoints outrun the limits on the driver's clock)")
        return ""

    def _before(self, t_ns: int) -> tuple[int, np.ndarray]:
        """The newest accepted setpoint stamped at or before t_ns, else the oldest remembered."""
        for sent, values in reversed(self.history):
            if sent <= t_ns:
                return sent, values
        return self.history[0]

    def _window_velocities(self, sent_ns: int, values: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, float]:
        """(velocity, its span s) from the setpoint WINDOW_S before this one, and the same for the window
        before that. Only a window that reaches back to the session's first setpoint counts as WINDOW_S long (the
        arm was at rest before it; none before it: velocity zero); any other spans the stamps it has, so that
        setpoints the buffer dropped never shorten a window the estimate divides by."""
        window = int(WINDOW_S * 1e9)
        floor = window if self._history_from_start else 0
        t1, q1 = self._before(sent_ns - window)
        span = max(sent_ns - t1, floor) * 1e-9
        t0, q0 = self._before(t1 - window)
        if t0 < t1:
            span_before = max(t1 - t0, floor) * 1e-9
            velocity_before = (q1 - q0) / span_before
        else:
            span_before = window * 1e-9
            velocity_before = np.zeros(self.n) if self._history_from_start else (values - q1) / span
        return (values - q1) / span, span, velocity_before, span_before

    def _remember(self, sent_ns: int, values: np.ndarray) -> None:
        """Keep the accepted setpoints of the last three windows (and the one before them)."""
        history = self.history
        history.append((sent_ns, values))
        horizon = sent_ns - int(3 * WINDOW_S * 1e9)
        while len(history) > 2 and history[1][0] <= horizon:
            history.popleft()
            self._history_from_start = False

    def totals(self, before: dict[str, int]) -> dict[str, int]:
        """The TOTALLED counters of this session added to `before` (the totals of the sessions before it)."""
        stats = self.stats()
        return {key: before.get(key, 0) + stats[key] for key in TOTALLED}

    def stats(self) -> dict:
        """Counters and the setpoint-to-cycle latency (client send to the cycle that used it), us."""
        k = min(self.accepted, LATENCY_WINDOW)
        lat = self.latency_ns[:k] / 1e3
        buffered = None if self.buffer is None else {"depth": self.buffer.depth, **self.buffer.counts.as_dict()}
        skipped = 0 if self.buffer is None else self.buffer.counts.skipped
        return {"mode": self.mode_name, "compensate": list(self.compensate), "received": self.received, "accepted": self.accepted, "buffer": buffered,
                "malformed": self.malformed, "refused_version": self.refused_version,
                "refused_token": self.refused_token,
                "dropped": skipped + self.superseded, "lost": self.lost, "bridged_cycles": self.bridged_cycles,
                "missed_cycles": self.missed_cycles, "intake_deferred_cycles": self.intake_deferred,
                "timeout_cycles": self.timeout_cycles, "last_error": self.last_error,
                "latency_us": None if k == 0 else {"p50": float(np.percentile(lat, 50)),
                                                    "p99": float(np.percentile(lat, 99)), "max": float(lat.max())}}
