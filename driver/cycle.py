"""The driver's fixed-rate cycle: read the drives, supervise, command, publish.

One thread runs `Cycle` at rate_hz (1 kHz by default). Each cycle:
  1. begin_cycle() on the arm (CAN: SYNC), then read the newest sample;
  2. supervise: the watchdog (no new device data for longer than watchdog_s while the link is up),
     drive faults (a drive in FAULT or FAULT REACTION ACTIVE) -> the driver's fault state: the motion is
     aborted, the other drives get a quick stop, a health event is recorded;
  3. run the requests queued by other threads (enable, move, fault reset, ...), at a cycle boundary, for at
     most `intake_share` of the period (the rest wait for the next cycles, counted in `requests_deferred`);
     a quick stop or a disable (`urgent`) does not queue behind them: the cycle takes it first thing, before
     the samples of a burst are published (so the first message after it carries it), and reports the seq of
     that message;
  4. write the command: per drive the controlword that walks the CiA 402 state machine towards what is
     wanted, CSP with the current setpoint (the planned motion's, or the hold position) and its torque
     feed-forward as the drives' torque offset (0x60B2); in torque servo mode CST with the client's target
     torque and, on request, the model's gravity and friction compensation as the offset (driver/compensation.py);
     nothing non-finite, and no target torque + offset beyond a joint's torque limit, is ever written;
  5. hand the STATE message to `publish`: the arm reads straight into it (ArmState.inside), the cycle
     packs the header.
The hot path allocates no array per cycle (numpy with out=, one numba call for the per-joint drive logic,
struct.pack_into for the header); planning happens in the requesting thread (driver/motion.py), never here.

Two clocks (`clock`):
  "host"    the cycle keeps its own schedule at rate_hz: an absolute clock_nanosleep to each deadline, no spin
            (firmware_bridge/runtime/rt_timing.py; the thread's timer slack is reduced to 1 ns so the wake-up is precise).
            With an arm that answers (driver.hal.Arm's streams_on_own_clock or cycle_reads_link: serial joint
            boards stepping on each COMMAND, CAN drives on each SYNC), each
            deadline sends the command the previous cycle computed, then the cycle waits (at most
            ANSWER_WINDOW of a period) for the device's answer and runs its work as soon as it arrives: the
            command leaves on the host's schedule as before, and the sample is published at once instead of
            waiting for the next deadline (which alone costs the stream a period minus the round trip). An
            arm whose link the cycle reads (cycle_reads_link: serial, can) is read by the cycle thread itself
            during both waits (pump_for, pump_new).
  "device"  for an arm that streams on its own clock (streams_on_own_clock, `wait_new(timeout_s)`: the serial
            joint boards): each cycle starts as soon as a new sample arrives, so a sample waits for no timer
            (latency from the device to the stream is the cycle's own work, not up to a period); when no
            sample comes for 2 periods a stale cycle runs anyway, so the watchdog and the command stream
            keep going while the device is silent (not sooner: a sample late by a fraction of a period, common
            on a loaded host, would get a stale cycle just before it, which costs a cycle's CPU and delays
            it). The cycle rate is then the device's. An arm with cycle_reads_link (serial) is read by the cycle
            thread itself while it waits (select on the port): one wake-up per burst of the line instead of
            the link thread's and then the cycle's. One target goes out per device sample, in order, so a
            drive that consumes one target per cycle from a setpoint buffer gets exactly its own: a motion
            advances one planned sample per device sample (caught-up ones included), and a stale cycle sends
            nothing new (only a stop or a disable goes out then).
An arm that keeps every sample (keeps_every_sample, `backlog()`: serial, can, gateway) gets each one published
once and in order: the samples that came in one burst before the newest are published first (`caught_up`), then
the cycle's work runs on the newest.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable

import numpy as np

from driver import cycle_kernels as ck
from driver.hal import Arm, ArmCommand, ArmState, LinkError
from driver.servo import END, HOLD, STOP, TRACK, ServoSession
from firmware_bridge.servo_wire import MODE_POSITION, MODE_TORQUE
from driver.motion import PlannedMotion
from driver.servo_shaping import stop_motion
from firmware_bridge.runtime.rt_timing import DEFAULT_SPIN_S, name_os_thread, reduce_timer_slack, sleep_until
from firmware_bridge import cia402, stream
from firmware_bridge.cia402 import Mode, State
from firmware_bridge.runtime.log_throttle import Throttle

_S = State
_log = logging.getLogger(__name__)
TROUBLE_LOG_INTERVAL_S = 10.0   # stale cycles, overruns, held servo setpoints: one line per interval, with a count
CLOCKS = ("host", "device")
DEVICE_GRACE = 1.0            # clock "device": a stale cycle runs when no sample came for (1 + this) periods
ANSWER_WINDOW = 0.75          # clock "host" with an answering arm: the longest wait for the answer, in periods
START_TOLERANCE = 0.01        # rad: a motion starts only where the arm is (within this)
_FRESH = 1 << 30                # cycle-side bit beside drive_logic's: this cycle's sample is new
LATENESS_WINDOW = 4096        # cycles kept for the lateness percentiles
LATE_AFTER_CYCLES = 7         # samples behind (a backlog) beyond which the drives have held a stale target: a
                              # free-running device's setpoint buffer (3) plus the drives' extrapolation (4)
LATE_AFTER_RANGE = (1, 1000)  # [driver] late_after_cycles: what a real drive's buffer and extrapolation may span
INTAKE_SHARE = 0.1            # of the period, the most a cycle spends running queued requests (one at least): a
                              # flood of commands waits for the next cycles instead of stretching this one
INTAKE_SHARE_RANGE = (0.01, 0.5)   # [driver] intake_share: at least ~10 us at 1 kHz, at most half the period
RESET_PHASE_S = 0.005         # each phase (0, then bit 7) of the fault-reset pulse: several device cycles,
                              # since devices latch only their newest command per cycle


def _state_codes(statusword: np.ndarray) -> list[State | None]:
    return [cia402.state_of(int(w)) for w in statusword]


class DriverFault(RuntimeError):
    """A request that the driver's current state forbids (e.g. moving while faulted or disabled)."""


class Cycle:
    """The 1 kHz loop over one Arm. publish(topic, payload) sends one message: stream.TOPIC_STATE with the
    STATE payload (a memoryview of the reused buffer) every cycle, stream.TOPIC_HEALTH with the JSON that
    set_health_payload queued."""

    def __init__(self, arm: Arm, *, rate_hz: float = 1000.0, watchdog_s: float = 0.01,
                 publish: Callable[[bytes, memoryview | bytes], None] | None = None,
                 spin_s: float = DEFAULT_SPIN_S, on_event: Callable[[str], None] | None = None,
                 gravity: Callable[[np.ndarray], np.ndarray] | None = None, clock: str = "host",
                 torque_limit: np.ndarray | None = None, intake_share: float = INTAKE_SHARE,
                 late_after: int = LATE_AFTER_CYCLES):
        if not (rate_hz > 0):
            raise ValueError(f"rate_hz: expected a positive number, got {rate_hz!r}")
        lo, hi = INTAKE_SHARE_RANGE
        if isinstance(intake_share, bool) or not isinstance(intake_share, (int, float)) or not lo <= intake_share <= hi:
            raise ValueError(f"intake_share: expected a fraction of the period {lo:g}..{hi:g}, got {intake_share!r}")
        lo, hi = LATE_AFTER_RANGE
        if isinstance(late_after, bool) or not isinstance(late_after, int) or not lo <= late_after <= hi:
            raise ValueError(f"late_after: expected a whole number of cycles {lo}..{hi}, got {late_after!r}")
        if clock not in CLOCKS:
            raise ValueError(f"clock: expected one of {', '.join(CLOCKS)}, got {clock!r}")
        if not isinstance(arm, Arm):
            raise TypeError(f"arm: expected a transport (a subclass of driver.hal.Arm), got {type(arm).__name__}")
        if clock == "device" and not arm.streams_on_own_clock:
            raise ValueError(f"clock: 'device' needs a transport that streams on its own clock; "
                             f"{type(arm).__name__} does not (use 'host')")
        self.clock = clock
        self.arm, self.n = arm, arm.n
        self.rate_hz, self.period_ns = float(rate_hz), int(round(1e9 / rate_hz))
        self.watchdog_ns = int(watchdog_s * 1e9)
        self.intake_share = float(intake_share)        # of the period: requests here, servo setpoints (driver.servo)
        self._request_ns = int(self.intake_share * self.period_ns)    # a cycle's time for other threads' requests
        self.spin_ns = int(spin_s * 1e9)
        self.publish = publish or (lambda topic, payload: None)
        self.on_event = on_event or (lambda text: None)
        self.gravity = gravity          # q (n,) -> holding torque (n,) N m; None: no feed-forward at rest
        self.torque_limit = np.full(self.n, np.inf) if torque_limit is None else np.asarray(torque_limit, float)
        self.message = stream.StateMessage(self.n)
        self.state = ArmState.inside(self.message)   # the arm reads straight into the published message
        self.command = ArmCommand(self.n)
        self.command.mode[:] = int(Mode.CSP)
        self._bits = 0                               # drive_logic's result for this cycle's statuswords
        self._zeros = np.zeros(self.n)               # a plan's target torque in CSP (its torque goes in the offset)
        ck.drive_logic(self.state.statusword, ck.OFF, self.state.q, self.state.q, self.state.q, self.torque_limit,
                       self.command.controlword)   # compile / load the kernels now, not in the first cycle
        # what is wanted
        self.want_power = False
        self.quick_stop = False
        self._reset_pulse = 0           # cycles left in the fault-reset sequence
        self._reset_high = 0            # the last cycles of it carry bit 7
        self._reset_grace = 0           # new samples during which drives may still report the fault being reset
        self.fault: str | None = None   # the driver's fault, None when healthy
        self.hold = np.zeros(self.n)    # setpoint when no motion runs
        self.hold_torque = np.zeros(self.n)  # its feed-forward (gravity at the hold pose)
        ck.command(self.state.statusword, ck.OFF, self.hold, self._zeros, self.hold_torque, self.state.q, ck.FOLLOW,
                   self.hold, self.torque_limit, self.command.target_position, self.command.target_torque,
                   self.command.torque_offset, self.command.controlword)
        self.motion: PlannedMotion | None = None
        self._k = 0
        self._handover = None           # a stopping.HandOver from the running motion, taken at its setpoint k1
        self.servo: ServoSession | None = None     # a client's streamed setpoints (driver.servo)
        self.servo_ended: dict | None = None       # the last session's counters and why it ended
        self.servo_totals: dict[str, int] = {}     # the ended sessions' counters, summed (ServoSession.totals)
        self.flags_extra = 0            # e.g. stream.FLAG_PAYLOAD, set by the daemon
        self.monitor = None             # driver.collision.CollisionMonitor: external torques, collisions (_watch)
        self._back_off_job: int | None = None   # the collision whose back-off is being planned beside the cycle
        self._back_off_done: tuple | None = None  # (collision, plan or None, error or None), set by that planning
        self.compensation = None        # driver.compensation.Compensation: gravity and friction in torque servo
        # bookkeeping
        self.seq = 0
        self.cycles = 0
        self.fresh = 0
        self.stale = 0
        self.overruns = 0
        self.caught_up = 0              # samples published without their own cycle (they came in a burst)
        self.late_after = late_after    # a backlog longer than this: the burst's samples are flagged LATE
        self.late_samples = 0           # samples published with FLAG_LATE
        self._late_flag = 0             # FLAG_LATE while a burst answered too late is being published
        self._lost_source: Callable[[], int] | None = arm.lost_samples
        self._lost_seen = 0             # the source's count when the last message was published
        self.samples_lost = 0           # device samples lost, as the messages reported them
        self._backlog: Callable[[], int] | None = arm.backlog if arm.keeps_every_sample else None
        self.events: deque[tuple[float, str]] = deque(maxlen=100)
        self._stale_log = Throttle(_log, logging.WARNING, TROUBLE_LOG_INTERVAL_S)
        self._hold_log = Throttle(_log, logging.DEBUG, TROUBLE_LOG_INTERVAL_S)   # a slower client is allowed
        self._late_log = Throttle(_log, logging.WARNING, TROUBLE_LOG_INTERVAL_S)
        self.lateness_ns = np.zeros(LATENESS_WINDOW, np.int64)
        self._requests: deque[tuple[Callable[[], object], Future]] = deque()
        self._urgent: deque[tuple[Callable[[], object], Future]] = deque()   # quick stop, disable: first thing
        self.requests_deferred = 0      # cycles whose request time ran out with requests left (run in later cycles)
        self.urgent_taken = 0           # quick stops and disables taken ahead of everything
        self._last_fresh_ns = 0
        self._have_sample = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._health_payload: bytes | None = None

    def warm_up(self) -> None:
        """Compile (or load from numba's cache) every kernel the cycle calls, for each argument type it passes,
        before the cycle thread runs (a compile in a running cycle stalls it for seconds: the watchdog trips):
        the drive logic on this cycle's message layout, with the hold pose, a planned motion's rows (read-only
        maps of the planner's file), a servo setpoint (read-only, as decoded from its message) and the measured
        pose as the plan; a sample copied into the message. On scratch arrays: nothing of this cycle changes."""
        from driver.hal import copy_sample
        from firmware_bridge import servo_wire

        n = self.n
        message = stream.StateMessage(n)
        st = ArmState.inside(message)
        cmd = ArmCommand(n)
        hold, hold_torque = np.zeros(n), np.zeros(n)
        rows = np.zeros((2, n))
        rows.setflags(write=False)                       # a plan: np.load(mmap_mode="r") rows
        servo = servo_wire.decode(servo_wire.encode(servo_wire.MODE_POSITION, 0, 0, 0, np.zeros(n)), n).values
        zeros, limit = self._zeros, self.torque_limit
        for plan_q, plan_tau, plan_off in ((hold, zeros, hold_torque), (rows[0], zeros, rows[1]),
                                           (servo, zeros, hold_torque), (st.q, servo, zeros), (st.q, servo, hold_torque),
                                           (st.q, zeros, hold_torque)):
            ck.command(st.statusword, ck.OFF, plan_q, plan_tau, plan_off, st.q, ck.FOLLOW, hold, limit,
                       cmd.target_position, cmd.target_torque, cmd.torque_offset, cmd.controlword)
        ck.drive_logic(st.statusword, ck.OFF, cmd.target_position, cmd.target_torque, cmd.torque_offset, limit,
                       cmd.controlword)
        if self.compensation is not None:                # torque servo's gravity and friction, on a setpoint
            self.compensation.warm_up(st.q, st.qd, servo, limit)
        copy_sample(ArmState(n), st)                     # a link's sample ring into the message
        copy_sample(st, ArmState(n))
        if self.monitor is not None:                     # the model's watch: observer and levels
            self.monitor.warm_up(st.q, st.qd, st.current, message.tau_ext)

    # -- thread --------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="armid-cycle", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._fail_requests(DriverFault("the driver stopped"))
        for throttle in (self._stale_log, self._hold_log, self._late_log):
            throttle.flush()

    @property
    def native_id(self) -> int | None:
        """The cycle thread's native (kernel) thread id while it runs (for its scheduling: driver/realtime.py)."""
        t = self._thread
        return None if t is None or not t.is_alive() else t.native_id

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        name_os_thread()
        reduce_timer_slack()
        try:
            if self.clock == "device":
                self._run_device_clock()
            else:
                self._run_host_clock()
        except BaseException as exc:  # noqa: BLE001 - reported, never silent
            self.error = exc
            self._event(f"cycle stopped: {type(exc).__name__}: {exc}", logging.CRITICAL)
            self._fail_requests(DriverFault(f"the cycle stopped: {exc}"))

    def _run_host_clock(self) -> None:
        """Cycles on an absolute schedule at rate_hz; lateness = wake-up time - deadline. With an arm that has
        wait_new: send at the deadline, then the cycle's work when the answer arrives (module docstring)."""
        period, stop, lateness = self.period_ns, self._stop, self.lateness_ns
        arm = self.arm
        wait_new = arm.wait_new if arm.streams_on_own_clock else None
        pump_for = None
        if arm.cycle_reads_link:        # serial, can: this thread reads the link while it waits (one wake-up)
            pump_for, wait_new = arm.pump_for, arm.pump_new
        window = int(period * ANSWER_WINDOW)
        next_ns = time.perf_counter_ns() + period
        while not stop.is_set():
            now = time.perf_counter_ns()
            if now < next_ns:
                if pump_for is not None:
                    pump_for((next_ns - now) * 1e-9)     # returns early only when it cannot read the port
                sleep_until(next_ns, self.spin_ns)
                now = time.perf_counter_ns()
            late = now - next_ns
            lateness[self.cycles % LATENESS_WINDOW] = late
            if late > period:
                self.overruns += 1
                self._late_log.hit("overrun: a cycle woke %.2f ms late (period %.2f ms)", late / 1e6, period / 1e6,
                                   overruns=self.overruns)
                if late > 10 * period:   # far behind: resynchronise instead of bursting
                    next_ns = now
            if wait_new is None:
                self.step()
            else:
                if self._backlog is not None:
                    self._catch_up(keep=0)   # answers that came after the last window: the wait is for the next
                self._send()
                remaining = next_ns + window - time.perf_counter_ns()
                if remaining > 0:
                    wait_new(remaining * 1e-9)
                self._work()
            next_ns += period

    def _run_device_clock(self) -> None:
        """A cycle per new device sample, or a stale one after (1 + DEVICE_GRACE) periods without one;
        lateness = cycle start - the sample's arrival (host_time_ns)."""
        period, stop, lateness, st = self.period_ns, self._stop, self.lateness_ns, self.state
        arm = self.arm                  # cycle_reads_link: pump_new reads the link in this thread, one wake-up per sample
        wait_new = arm.pump_new if arm.cycle_reads_link else arm.wait_new
        limit = int(period * (1 + DEVICE_GRACE))
        last = time.perf_counter_ns()
        while not stop.is_set():
            remaining = last + limit - time.perf_counter_ns()
            if remaining > 0:
                wait_new(remaining * 1e-9)
            last = time.perf_counter_ns()
            self.step()
            late = time.time_ns() - st.host_time_ns if self._bits & _FRESH else 0
            lateness[self.cycles % LATENESS_WINDOW] = late
            took = time.perf_counter_ns() - last
            if took > period:
                self.overruns += 1
                self._late_log.hit("overrun: a cycle took %.2f ms (period %.2f ms)", took / 1e6, period / 1e6,
                                   overruns=self.overruns)

    # -- requests from other threads -----------------------------------------------------------------
    def submit(self, fn: Callable[[], object], timeout: float = 2.0) -> object:
        """Run fn in the cycle thread at the next cycle boundary and return its result (or raise its
        exception). Runs at once when the cycle thread is not running (synchronous use in tests)."""
        if fn == self.request_quick_stop or fn == self.disable:    # ahead of anything queued (a flood)
            self.urgent(fn, timeout)
            return None
        if not self.running:
            return fn()
        fut: Future = Future()
        self._requests.append((fn, fut))
        return self._wait(fut, timeout)

    def urgent(self, fn: Callable[[], object], timeout: float = 2.0) -> int:
        """Run fn (a quick stop or a disable) ahead of everything: first thing in the cycle's next work, before
        the queued requests and before the samples of a burst are published. Returns the seq of the first
        state message that carries its effect (runs at once when the cycle thread is not running)."""
        if not self.running:
            fn()
            return self.seq
        fut: Future = Future()
        self._urgent.append((fn, fut))
        return self._wait(fut, timeout)

    def _wait(self, fut: Future, timeout: float) -> object:
        try:
            return fut.result(timeout)
        except FutureTimeout:
            if not fut.cancel():        # the cycle started it just now: it will finish, wait for it
                return fut.result()
            raise DriverFault(f"the cycle did not take the request within {timeout:g} s "
                              f"(cycles run: {self.cycles}; is the machine overloaded?)") from None

    def _fail_requests(self, exc: BaseException) -> None:
        for queue in (self._urgent, self._requests):
            while queue:
                _, fut = queue.popleft()
                if not fut.done():
                    fut.set_exception(exc)

    def _take_urgent(self) -> None:
        """Run the urgent requests (quick stop, disable) now; each one's result is the seq of the next message."""
        while self._urgent:
            fn, fut = self._urgent.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            self.urgent_taken += 1
            try:
                fn()
                fut.set_result(self.seq)
            except BaseException as exc:  # noqa: BLE001 - handed to the requester
                fut.set_exception(exc)

    def _event(self, text: str, level: int = logging.INFO, **fields) -> None:
        """A health event (the last ones go with the health message), logged at `level` with `fields` as the
        record's extra fields."""
        self.events.append((time.time(), text))
        self.on_event(text)
        if _log.isEnabledFor(level):
            _log.log(level, "%s", text, extra=fields)

    def set_health_payload(self, payload: bytes) -> None:
        """Queue a health message (JSON bytes) that the cycle thread publishes with the next cycle."""
        self._health_payload = payload

    # -- what the requests do (called in the cycle thread) -------------------------------------------
    def enable(self) -> None:
        if self.fault is not None:
            raise DriverFault(f"fault: {self.fault}; send fault_reset first")
        if not self._have_sample:
            raise DriverFault("no data from the drives yet")
        self.hold[:] = self.state.q
        self.set_hold_torque()          # refuses (DriverFault) a pose whose holding torque breaks a limit
        self.quick_stop = False
        self.want_power = True
        _log.info("enable: powering the drives")

    def set_hold_torque(self) -> None:
        """Feed-forward for holding still at self.hold: gravity there (runs once per change, not per cycle).
        DriverFault, and nothing changed, when it is not finite or breaks a joint's torque limit."""
        if self.gravity is not None:
            tau = np.asarray(self.gravity(self.hold.copy()), dtype=float)
            over = ~np.isfinite(tau) | (np.abs(tau) > self.torque_limit)
            if over.any():
                j = int(np.argmax(over))
                raise DriverFault(f"holding joint {j + 1} at this pose needs {tau[j]:.4g} N m, outside its torque "
                                  f"limit {self.torque_limit[j]:.4g} N m")
            self.hold_torque[:] = tau

    def disable(self) -> None:
        if self.want_power:
            _log.info("disable: switching the drives off")
        self.motion = None
        self.end_servo("disable", ramp=None)
        self.want_power = False
        self.quick_stop = False

    def request_quick_stop(self, reason: str = "quick_stop requested") -> None:
        if self.motion is not None or self.want_power:
            self._event(f"quick stop: {reason}", logging.ERROR)
        self.motion = None
        self.end_servo(f"quick stop: {reason}", ramp=None)
        self.want_power = False
        self.quick_stop = True

    def _check_free_to_move(self) -> None:
        """DriverFault unless a motion or a servo session may start now: no fault, every drive enabled, no
        motion running, servo mode off."""
        if self.fault is not None:
            raise DriverFault(f"fault: {self.fault}; send fault_reset first")
        if not self.enabled():
            raise DriverFault("the drives are not enabled; send enable first")
        if self.motion is not None:
            raise DriverFault(f"a motion ({self.motion.name}) is running; wait or quick_stop")
        if self.servo is not None:
            raise DriverFault("servo mode is on; send servo_stop first")

    def start_servo(self, session: ServoSession) -> None:
        """Take setpoints from a servo session from the next cycle on (DriverFault when the drives are not
        enabled, the driver is faulted, or a motion or another session runs)."""
        self._check_free_to_move()
        self.servo = session
        self._event(f"servo: {session.mode_name} setpoints taken (timeout {session.timeout_cycles} cycles)")

    def end_servo(self, reason: str, level: int = logging.INFO, ramp: str | None = "setpoint") -> None:
        """End servo mode: the drives hold in CSP (torque: the measured pose; position: where their target comes
        to rest within the limits, as the motion "servo stop": at the newest accepted setpoint with ramp
        "setpoint", as soon as it can with "brake"; None: where it is). The event is logged at `level`."""
        session = self.servo
        if session is None:
            return
        self.servo_ended = {**session.stats(), "ended": reason}    # first: a status from another thread between
        self.servo = None                                         # the two sees the ended session, never none
        self.servo_totals = session.totals(self.servo_totals)
        self.hold[:] = session.last if session.mode == MODE_POSITION else self.state.q
        stopping = session.stop_ramp(ramp == "setpoint") if ramp else None
        if stopping is not None:
            self.motion, self._k = stop_motion(stopping, self.rate_hz, self.hold_torque, self.gravity), 0
            self.hold[:] = stopping[-1]
        self.command.mode[:] = int(Mode.CSP)
        try:
            self.set_hold_torque()
        except DriverFault as exc:          # cannot hold there actively: stop the drives instead
            self.quick_stop, self.want_power, self.motion = True, False, None
            reason, level = f"{reason}; {exc}", max(level, logging.ERROR)
        self._event(f"servo ended: {reason}", level)

    def fault_reset(self) -> None:
        if self.fault is not None:
            _log.info("fault reset: clearing %r", self.fault)
        self.fault = None
        self.quick_stop = False
        self.want_power = False
        k = max(1, int(round(RESET_PHASE_S * self.rate_hz)))
        self._reset_pulse, self._reset_high = 2 * k, k      # k cycles of 0, then k cycles of bit 7 (rising edge)
        self._last_fresh_ns = time.perf_counter_ns()        # the watchdog counts from the reset, not from an outage before it
        self._reset_grace = max(20, int(0.5 * self.rate_hz))   # new samples the drives get to leave FAULT

    def start_motion(self, motion: PlannedMotion) -> None:
        self._check_free_to_move()
        if abs(motion.rate_hz - self.rate_hz) > 1e-9:
            raise DriverFault(f"motion planned at {motion.rate_hz} Hz, the cycle runs at {self.rate_hz} Hz")
        off = np.abs(motion.q[0] - self.hold)
        if off.max() > START_TOLERANCE:
            j = int(np.argmax(off))
            raise DriverFault(f"motion starts {off[j]:.4g} rad away from joint {j + 1}'s position; plan it again")
        self.motion, self._k, self._handover = motion, 0, None
        _log.info("%s: started (%.3f s)", motion.name, motion.duration)

    def enabled(self) -> bool:
        return bool(np.all((self.state.statusword & 0x6F) == 0x27))

    def replace_motion(self, old: PlannedMotion, at_k: int, stop: PlannedMotion) -> bool:
        """Hand over from the running motion `old` to `stop` (a stop, driver.stopping, or a blend into a new
        motion, driver.blending), planned from old's setpoint at_k: the setpoints up to at_k run first. False when
        `old` has ended meanwhile; DriverFault when the cycle has passed at_k already (plan again further ahead)."""
        from driver.stopping import HandOver

        if self.motion is not old:
            return False
        if self._k > at_k:
            raise DriverFault(f"the stop was planned from setpoint {at_k}, the motion is at {self._k}")
        if self._k == at_k:
            self.motion, self._k, self._handover = stop, 0, None
        else:                           # taken when the motion reaches at_k (_command): nothing copied here
            self._handover = HandOver(old, self._k, at_k, stop)
        return True

    def motion_progress(self) -> dict | None:
        """The running motion's progress (PlannedMotion.progress), or None; safe from another thread."""
        m, k, h = self.motion, self._k, self._handover
        if m is None:
            return None
        return h.progress(k) if h is not None and h.old is m else m.progress(k)

    # -- one cycle -----------------------------------------------------------------------------------
    def step(self) -> None:
        """One cycle (public for synchronous tests): the work and its message, then the command it computed."""
        self._work(send=True)

    def _send(self) -> None:
        """Write the current command (once a sample has come: the hold position comes from it)."""
        if self._have_sample:
            try:
                self.arm.write(self.command)
            except LinkError as exc:
                if self.fault is None:
                    self._trip(f"link: {exc}")

    def _work(self, send: bool = False) -> None:
        """Read, supervise, run the requests, compute the command, publish (then send the command when send)."""
        arm, st = self.arm, self.state
        now_mono = time.perf_counter_ns()
        if self._urgent:
            self._take_urgent()
        try:
            arm.begin_cycle()
            if self._backlog is not None and self._backlog() > 1:
                self._catch_up()
            fresh = arm.read(st)
        except LinkError as exc:
            fresh = False
            if self.fault is None:
                self._trip(f"link: {exc}")
        if fresh:
            self._took_sample(now_mono)
        else:
            self.stale += 1
            self._stale_log.hit("stale cycle: no new sample from the drives", stale_cycles=self.stale)
        self._supervise(fresh, now_mono)
        if self.monitor is not None:
            self._watch(fresh)
        if self._urgent:                # came while the cycle read the drives
            self._take_urgent()
        stop_ns = time.perf_counter_ns() + self._request_ns
        while self._requests:           # one at least, then for at most the request time: the rest next cycle
            fn, fut = self._requests.popleft()
            if fut.set_running_or_notify_cancel():      # else the requester gave up waiting: never act on it late
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the requester
                    fut.set_exception(exc)
            if self._requests and time.perf_counter_ns() > stop_ns:
                self.requests_deferred += 1
                break
        # on the device's clock one target goes out per device sample: a stale cycle (the device's sample is
        # late, not necessarily missing) neither advances a motion nor queues a second copy of a target in the
        # device's setpoint buffer, unless the drives are being stopped or reset
        per_sample = self.clock == "device"
        self._command(advance=fresh or not per_sample)
        self._publish(fresh)
        self._late_flag = 0                 # a late burst ends with the newest sample, flagged with it
        if send and (fresh or not per_sample or self.quick_stop or self._reset_pulse):
            self._send()    # after publishing: the write wakes the device side (a simulator, a pty's worker),
                            # which may preempt this thread; the sample is then already on its way
        self.cycles += 1

    def _catch_up(self, keep: int = 1) -> None:
        """Publish, each once and in order, the samples not read yet but the newest `keep` (an arm that keeps
        every sample, with backlog(): two STATEs in one burst of the serial line, an answer later than the
        host clock's window). The cycle's work then runs on the newest; nothing is lost between two cycles."""
        st, backlog = self.state, self._backlog
        if backlog() > self.late_after:     # the drives ran out of targets: ident leaves these samples out
            self._late_flag = stream.FLAG_LATE
        try:
            while backlog() > keep and self.arm.read(st):
                self._took_sample(time.perf_counter_ns())
                self.caught_up += 1
                if self._urgent:            # a quick stop does not wait for the burst's end
                    self._take_urgent()
                self._publish(True)
                if self.clock == "device":      # each device cycle gets its own target, in order
                    self._command()
                    self._send()
        except LinkError as exc:
            if self.fault is None:
                self._trip(f"link: {exc}")

    def _took_sample(self, now_mono: int) -> None:
        """Bookkeeping of a new sample in self.state: counted, the watchdog fed, the first one is the hold pose."""
        self.fresh += 1
        self._last_fresh_ns = now_mono
        if not self._have_sample:
            self._have_sample = True
            self.hold[:] = self.state.q

    def _intent(self) -> int:
        if self._reset_pulse:
            return ck.RESET
        if self.quick_stop:
            return ck.QUICK_STOP
        return ck.POWER if self.want_power else ck.OFF

    def _supervise(self, fresh: bool, now_mono: int) -> None:
        st, cmd = self.state, self.command
        bits = ck.drive_logic(st.statusword, self._intent(), cmd.target_position, cmd.target_torque,
                              cmd.torque_offset, self.torque_limit, cmd.controlword)
        self._bits = bits | _FRESH if fresh else bits & ~_FRESH
        if self._have_sample and self.fault is None:
            age = now_mono - self._last_fresh_ns
            if age > self.watchdog_ns:
                self._trip(f"watchdog: no new data from the drives for {age / 1e6:.1f} ms "
                           f"(bound {self.watchdog_ns / 1e6:.1f} ms)")
            elif self._reset_grace:
                if fresh:                  # counted in new samples: a slow link gets as many answers
                    self._reset_grace -= 1
                if self._reset_grace == 0:
                    for j, s in enumerate(_state_codes(st.statusword)):
                        if s in (_S.FAULT, _S.FAULT_REACTION_ACTIVE):
                            self._trip(f"fault reset failed: drive {j + 1} still in {s.value} "
                                       f"(error code 0x{int(st.error_code[j]):04X})", joint=j + 1,
                                       error_code=f"0x{int(st.error_code[j]):04X}")
                            return
            elif fresh and bits >> ck.FAULTED_SHIFT:
                j = (bits >> ck.FAULTED_SHIFT) - 1
                self._trip(f"drive {j + 1} faulted (error code 0x{int(st.error_code[j]):04X})", joint=j + 1,
                           error_code=f"0x{int(st.error_code[j]):04X}")

    def _watch(self, fresh: bool) -> None:
        """The model's watch over the arm (driver/collision.py): the external-torque estimate into the message
        while the drives hold the arm, and the configured reaction to a collision."""
        st, mon = self.state, self.monitor
        if self._back_off_done is not None:
            self._take_back_off()
        active = bool(self._bits & ck.ALL_ENABLED) and self.want_power and not self.quick_stop and self.fault is None
        j = mon.watch(st.q, st.qd, st.current, self.message.tau_ext, fresh, active, st.device_time_ns)
        if j < 0:
            return
        text, fields = mon.describe(j, self.message.tau_ext, time.time())
        reaction = mon.thresholds.reaction
        if reaction in ("stop_and_hold", "back_off"):
            self.motion = None
            self.end_servo(text, logging.WARNING, ramp=None if reaction == "back_off" else "setpoint")
            self.hold[:] = st.q
            try:
                self.set_hold_torque()
            except DriverFault as exc:
                self._trip(f"{text}; cannot hold there: {exc}", **fields)
                return
            self._event(text, logging.ERROR, **fields)
            if reaction == "back_off":
                self._plan_back_off(mon)
        else:
            self._trip(text, **fields)

    def _plan_back_off(self, mon) -> None:
        """Plan the back-off (mon.back_off: from the hold pose along the estimate, checked against the limits) in a
        thread of its own: planning takes longer than a cycle. Meanwhile the arm holds; the cycle starts the motion
        when it is ready (_take_back_off)."""
        if mon.back_off is None:
            self._event("back_off: no planner; holding", logging.WARNING)
            return
        job = self._back_off_job = mon.collisions
        q, tau = self.hold.copy(), self.message.tau_ext.copy()

        def plan() -> None:
            try:
                self._back_off_done = (job, mon.back_off(q, tau), None)
            except Exception as exc:  # noqa: BLE001 - handed to the cycle, which says why it holds
                self._back_off_done = (job, None, exc)

        threading.Thread(target=plan, name="back-off planning", daemon=True).start()

    def _take_back_off(self) -> None:
        """Start the planned back-off if the arm still holds where it collided; else drop it, saying why."""
        job, plan, exc = self._back_off_done
        self._back_off_done = None
        if job != self._back_off_job:
            return
        self._back_off_job = None
        if exc is not None:
            self._event(f"back_off refused, holding: {exc}", logging.WARNING)
        elif (self.motion is not None or self.servo is not None or self.fault is not None or self.quick_stop
              or not self.want_power or np.abs(plan.q[0] - self.hold).max() > START_TOLERANCE):
            self._event("back_off dropped: the arm no longer holds where it collided", logging.WARNING)
        else:
            self.motion, self._k, self._handover = plan, 0, None
            self._event(f"back_off: {float(np.max(np.abs(plan.q[-1] - plan.q[0]))):.3g} rad over "
                        f"{plan.duration:.3f} s", logging.WARNING)

    def _trip(self, reason: str, **fields) -> None:
        self.fault = reason
        self.request_quick_stop(reason)
        self._event(f"fault: {reason}", logging.ERROR, **fields)

    def _command(self, advance: bool = True) -> None:
        """The command of this cycle: the motion's next setpoint (the same one again when not advance), or
        the hold pose, through the drive logic."""
        st, cmd = self.state, self.command
        how = 0
        plan_tau = self._zeros                      # CSP: the plan's torque goes in the offset
        servo_plan = self._servo_step(st) if self.servo is not None and advance else None
        if self.motion is not None:                 # a motion, or the stop of a servo session that just ended
            m, k = self.motion, self._k
            plan_q, plan_off, how = m.q[k], m.tau_ff[k], ck.HOLD_PLAN
            if not advance:
                pass
            elif k + 1 >= m.samples:
                self.motion = None
                self.hold_torque[:] = m.tau_ff[k]     # at rest: gravity at the goal
                self._event(f"{m.name}: done ({m.duration:.3f} s)")
            else:
                self._k = k + 1
                h = self._handover
                if h is not None and h.old is m and self._k >= h.k1:
                    self.motion, self._k, self._handover = h.successor, 0, None
        elif servo_plan is not None:
            plan_q, plan_tau, plan_off, how = servo_plan
        else:
            plan_q, plan_off = self.hold, self.hold_torque
        if not self.want_power or self.quick_stop:
            # not holding actively: keep the reference on the measured position so enabling never jumps
            how |= ck.FOLLOW if self.quick_stop else ck.FOLLOW | ck.HOLD_FOLLOWS
        bits = ck.command(st.statusword, self._intent(), plan_q, plan_tau, plan_off, st.q, how, self.hold,
                          self.torque_limit, cmd.target_position, cmd.target_torque, cmd.torque_offset,
                          cmd.controlword)
        self._bits = bits | (self._bits & _FRESH)
        if self._reset_pulse:
            self._reset_pulse -= 1
            if self._reset_pulse < self._reset_high:
                cmd.controlword[:] = cia402.CW_FAULT_RESET
        if bits & (ck.NON_FINITE | ck.OVER_TORQUE):
            # cannot happen with checked plans, setpoints and compensation; never send it if it does
            what = "non-finite setpoint refused" if bits & ck.NON_FINITE else self._over_torque_text()
            cmd.target_position[:] = np.where(np.isfinite(st.q), st.q, 0.0)
            cmd.target_torque[:] = 0.0
            cmd.torque_offset[:] = 0.0
            cmd.controlword[:] = cia402.CW_QUICK_STOP
            if self.fault is None:
                self._trip(what)

    def _over_torque_text(self) -> str:
        cmd = self.command
        total = cmd.target_torque + cmd.torque_offset
        j = int(np.argmax(np.abs(total) - self.torque_limit))
        return (f"torque refused: joint {j + 1}'s target torque {cmd.target_torque[j]:.4g} + offset "
                f"{cmd.torque_offset[j]:.4g} N m is beyond its limit {self.torque_limit[j]:.4g} N m")

    def _servo_step(self, st) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
        """This cycle's plan from the servo session (position, target torque, torque offset, how): a checked
        setpoint, the last one held; None when the session ended (hold there, or its stop ramp as the motion),
        quick-stopped (the setpoints stopped) or its compensation would break a torque limit (held in CSP)."""
        step = self.servo.next(st.q, st.qd)
        if step.kind == STOP:
            self.request_quick_stop(step.reason)
            return None
        if step.kind == END:
            self.end_servo(step.reason, logging.WARNING, ramp="brake")
            return None
        if step.kind == HOLD:
            self._hold_log.hit("servo: no new setpoint this cycle; holding the last one",
                               missed_cycles=self.servo.missed_cycles)
        if self.servo.mode == MODE_TORQUE:
            offset = self._zeros
            kinds = self.servo.compensate
            if kinds:
                comp = self.compensation
                j = comp.compute(st.q, st.qd, step.values, self.torque_limit, kinds)
                if j >= 0:
                    self.end_servo(f"compensation refused: joint {j + 1}'s setpoint {step.values[j]:.4g} + "
                                   f"{' and '.join(kinds)} {comp.torque[j]:.4g} N m is beyond its torque limit "
                                   f"{self.torque_limit[j]:.4g} N m", logging.WARNING, ramp=None)
                    return None
                offset = comp.torque
            self.command.mode[:] = int(Mode.CST)
            return st.q, step.values, offset, ck.FOLLOW | ck.HOLD_FOLLOWS
        if step.kind == TRACK and self.gravity is not None:    # a held setpoint keeps its feed-forward
            self.hold_torque[:] = self.gravity(step.values.copy())
        return step.values, self._zeros, self.hold_torque, ck.HOLD_PLAN

    def _publish(self, fresh: bool) -> None:
        """The STATE message of this cycle (stale ones repeat the last sample; none before the first sample:
        there is nothing to repeat, and zeros are no state), then a queued health message."""
        if self._have_sample:
            self._publish_state(fresh)
        health = self._health_payload
        if health is not None:
            self._health_payload = None
            self.publish(stream.TOPIC_HEALTH, health)

    def _publish_state(self, fresh: bool) -> None:
        st, bits = self.state, self._bits
        flags = self.flags_extra if self.monitor is None else self.flags_extra | self.monitor.flags
        if bits & ck.ALL_ENABLED:
            flags |= stream.FLAG_ENABLED
        if self.motion is not None:
            flags |= stream.FLAG_MOVING
        if self.fault is not None:
            flags |= stream.FLAG_FAULT
        if not fresh:
            flags |= stream.FLAG_STALE
        elif self._late_flag:
            flags |= self._late_flag
            self.late_samples += 1
        elif self._lost_source is not None:
            lost = self._lost_source() - self._lost_seen
            if lost > 0:                 # shown on the first new sample after the loss
                self._lost_seen += lost
                self.samples_lost += lost
                flags |= stream.lost_flags(lost)
        self.message.set_header(self.seq, flags, st.device_time_ns, st.host_time_ns)
        self.seq += 1
        self.publish(stream.TOPIC_STATE, self.message.buffer)

    # -- statistics ----------------------------------------------------------------------------------
    def lateness_percentiles(self) -> dict[str, float]:
        """Wake-up lateness over the last LATENESS_WINDOW cycles, in microseconds: p50, p99, max."""
        k = min(self.cycles, LATENESS_WINDOW)
        if k == 0:
            return {"p50_us": 0.0, "p99_us": 0.0, "max_us": 0.0}
        w = self.lateness_ns[:k] / 1e3
        return {"p50_us": float(np.percentile(w, 50)), "p99_us": float(np.percentile(w, 99)), "max_us": float(w.max())}
