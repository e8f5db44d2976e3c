"""The simulated arm as one object: plant + n CiA 402 drives + fault injection + time, with the thread-safe
command / state interface that the device side of each transport calls every cycle.

Three ways to clock it:
  * synchronous: nobody calls start(); the caller calls step(n) (tests);
  * internal clock: start() runs a background thread, real time at rate_hz (realtime=True) or as fast as
    possible (realtime=False); step() is then refused;
  * external clock: a device side whose clocks_simulator() is True (CAN: the SYNC frame) calls step()
    itself; start() starts only the device side.

One cycle (dt = 1 / rate_hz): latch the commands -> apply queued calls (payload, drive parameters) and
injected faults -> state machines -> control law on the last measurement -> plant integrates dt with the
torque held -> sensors sample at t + dt -> faults from the control flags -> publish the sample -> call the
cycle callbacks. Commands set during a cycle act at the next one (as an RPDO latched on SYNC).

The drives' control loops run at least at DRIVE_LOOP_MIN_HZ, as a real drive's do whatever its bus cycle:
below that rate each cycle runs `loop_ticks` loop ticks of dt / loop_ticks, and the published current is
the mean of the ticks' torques over the cycle (a drive's current reading averaged over its sampling period).
The CSP reference between the cycles' targets is a drive's cubic interpolation with one cycle of delay
(sim.drive_control.interpolant: C2, exact for cubic target sequences), the velocity and acceleration
feed-forward are the interpolant's own, so the motion is `interpolation_delay(rate_hz)` = one cycle behind
the targets. At 1 kHz and above a cycle is one tick, exactly as before, without delay. (Loops tuned for
1 kHz and run at the bus cycle left joint 3 in a ~10 mrad limit cycle at 333 Hz and tripped a following
error at 250 Hz; targets interpolated linearly biased identification at 250 Hz, docs/reference/simulator.md.)

The current (and torque) of a sample is the one held over the period that ends at the sample's time: the
mean effort of that period, which belongs to the motion half a period earlier than the sample's positions.
`effort_delay(rate_hz)` (s) says so; a driver config on the simulator sets `effort_delay_ms` to it, and
identification aligns the effort with the motion by it (ident.fit.preprocess.Recording.effort_delay). The
interpolation delay moves positions and effort alike, so it does not enter effort_delay.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, fields
from typing import Callable

import numpy as np

from firmware_bridge.cia402 import State, state_of
from firmware_bridge.runtime.errors import InputError
from ident.model import Model, load_model
from sim.device_contract import DeviceSide, device_class, registered
from sim.clock import FastClock, LatenessStats, RealtimeClock
from sim import drive_control as dc
from sim.drive import SUPPORTED_MODES, DriveConfig, Drives, joint_index
from sim.faults import FaultInjection
from ident.payload import payload_parameters
from sim.plant import FrictionConfig, NoiseConfig, Plant, mismatched_model

def effort_delay(rate_hz: float) -> float:
    """How late (s) the simulator's current and torque are against its positions at rate_hz: half a period
    (the held effort of the period that ends at the sample)."""
    return 0.5 / float(rate_hz)


def _seed_sequences(seed: int | None) -> list:
    """The generators' seeds of a Simulator(seed=seed): the plant's sensors, fault injection, the clock."""
    return np.random.SeedSequence(seed).spawn(3)


def current_noise(seed: int, count: int, n: int, current_std: float) -> np.ndarray:
    """The current sensors' noise (count, n) A of a Simulator(seed=seed) whose sensors add current_std A of noise
    and no position noise (NoiseConfig's default): row k is the noise in the sample of cycle k (row 0 the sample
    taken at start), as long as nothing restarted its sensors (a teleport). With it, a recording of the simulator
    splits into its noise and the rest, sample by sample, whatever carried it (benchmarks/bench_chain_bias.py)."""
    rng = np.random.default_rng(_seed_sequences(seed)[0])      # the plant's generator, as Simulator seeds it
    return current_std * rng.standard_normal((int(count), int(n)))


DRIVE_LOOP_MIN_HZ = 1000.0   # the drives' control loops never run slower than this (see the module docstring)


def loop_ticks(rate_hz: float) -> int:
    """Drive-loop ticks per cycle at rate_hz: the fewest that run the loops at DRIVE_LOOP_MIN_HZ or faster."""
    return max(1, math.ceil(DRIVE_LOOP_MIN_HZ / float(rate_hz) - 1e-9))


def interpolation_delay(rate_hz: float) -> float:
    """How late (s) the simulated drives' CSP reference follows the targets at rate_hz: one cycle where a
    cycle is several loop ticks (the cubic interpolation needs the next target), 0 at one tick per cycle.
    Positions and effort lag alike (effort_delay is their difference); only a comparison of positions with
    the commanded targets must shift the targets by it."""
    return 1.0 / float(rate_hz) if loop_ticks(rate_hz) > 1 else 0.0


# the registered device sides by name (entry points "armid.sim_devices"): name -> "module:class"
TRANSPORTS: dict[str, str] = registered()
SimTransport = DeviceSide     # the device sides' base, by its former name

_MODE_VALUES = np.array([int(m) for m in SUPPORTED_MODES])
# A real-time simulator woken late (its process was not scheduled) runs the ticks it missed back to back, each a
# whole drive cycle with the targets the drives held then (the setpoint buffer's, then the drives' own
# continuation and hold, as after a late host): the physics loses no time and jumps nowhere. Woken later than
# this many periods, it gives the missed ticks up instead (sim.clock: counted as skipped, and logged), so that a
# process whose ticks cost more than a period cannot spiral into an ever longer burst.
CATCH_UP_PERIODS = 100
_QUEUED_CALL_TIMEOUT = 5.0  # s a caller waits for the running cycle thread to apply a queued call


@dataclass
class SimState:
    """One sample of the arm as its drives report it; arrays (n,), SI units, joint side.

    time (s): simulated time of the sample; cycle: cycles run so far. position (rad) is the encoder
    reading, position_counts the motor encoder counts (0 without quantisation); velocity (rad/s) the
    drive's estimate (difference of the last two positions); current (A) the motor current; torque (N m)
    the joint torque that current makes (current * gear_ratio * torque_constant); following_error (rad)
    position reference minus position (0 outside CSP and quick stop).
    """

    time: float
    cycle: int
    statusword: np.ndarray       # uint16
    mode_display: np.ndarray     # int8 (0x6061)
    error_code: np.ndarray       # uint16 (0x603F)
    position: np.ndarray
    position_counts: np.ndarray  # int64
    velocity: np.ndarray
    current: np.ndarray
    torque: np.ndarray
    following_error: np.ndarray

    @classmethod
    def empty(cls, n: int) -> "SimState":
        """A zeroed sample for n joints (allocate once, then read_state(out=...))."""
        return cls(0.0, 0, np.zeros(n, np.uint16), np.zeros(n, np.int8), np.zeros(n, np.uint16), np.zeros(n),
                   np.zeros(n, np.int64), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n))

    def copy_into(self, out: "SimState") -> "SimState":
        """Copy every field into out (no allocation); returns out."""
        out.time, out.cycle = self.time, self.cycle
        for f in _ARRAY_FIELDS:
            getattr(out, f)[:] = getattr(self, f)
        return out

    def states(self) -> list[State | None]:
        """The CiA 402 state of each drive, decoded from its statusword."""
        return [state_of(int(w)) for w in self.statusword]


_ARRAY_FIELDS = tuple(f.name for f in fields(SimState) if f.name not in ("time", "cycle"))


@dataclass
class TrueState:
    """Ground truth of the plant (for tests and the demo, not for the transports): q (rad), qd (rad/s),
    qdd (rad/s^2) at the start of the last period, tau (N m) the motor torque held over it, payload (10,),
    tau_ext (N m) the joint torques an external wrench made over it (apply_wrench; zeros without one)."""

    q: np.ndarray
    qd: np.ndarray
    qdd: np.ndarray
    tau: np.ndarray
    payload: np.ndarray
    tau_ext: np.ndarray


class Simulator:
    """A simulated arm: `Simulator(model, transport=None, *, realtime=False, rate_hz=1000, ...)`.

    model: a Model or a model name/path (load_model). transport: None, a sim.device_contract.DeviceSide, or
    the name of one registered in the entry points "armid.sim_devices" (built with **transport_options). substeps: integrator substeps per cycle (None: the
    fewest that keep the friction model stable). noise, friction, drive: NoiseConfig, FrictionConfig,
    DriveConfig. seed: the sensors' and fault injection's random generators. q0: initial position (rad).
    brakes: a drive that is not powered holds its joint (False: the joint is free and falls).
    external_clock: overrides the device side's own clocks_simulator().
    mismatch: the simulated mechanics' dynamics off the model's by this fraction (sim.plant.mismatched_model:
    every link's inertial parameters, rotor inertia and friction coefficient times 1 +- mismatch, signs drawn
    from seed); the drives, the sensors' scaling and `model` stay the model's. For tests of what a driver does
    with a model that is not the arm's.
    clock_drift_ppm, clock_jitter_us: the internal real-time clock's drift against the host's (ppm, positive:
    slow) and the standard deviation of each tick's wake-up jitter (us), as a device's own crystal and
    interrupt latency (sim.clock.RealtimeClock); they apply to the free-running simulator only. clock_timer: the
    free-running simulator's time source in place of the host's (sim.clock.RealtimeClock's `timer`: a test's
    own clock, a stall included).
    """

    def __init__(self, model: Model | str = "generic6", transport: "DeviceSide | str | None" = None, *,
                 realtime: bool = False, rate_hz: float = 1000.0, substeps: int | None = None,
                 noise: NoiseConfig | None = None, friction: FrictionConfig | None = None,
                 drive: DriveConfig | None = None, integrator: str = "rk4", seed: int | None = 0, q0=None,
                 brakes: bool = True, external_clock: bool | None = None, clock_drift_ppm: float = 0.0,
                 clock_jitter_us: float = 0.0, mismatch: float = 0.0, clock_timer=None, **transport_options):
        self.model = model if isinstance(model, Model) else load_model(model)
        n = self.n = self.model.n
        if isinstance(rate_hz, bool) or not (isinstance(rate_hz, (int, float)) and 1.0 <= rate_hz <= 10_000.0):
            raise InputError(f"rate_hz: expected a number 1..10000 Hz (the driver's range), got {rate_hz!r}")
        self.rate_hz = float(rate_hz)
        self.dt = 1.0 / self.rate_hz
        self.loop_ticks = loop_ticks(self.rate_hz)
        self.loop_dt = self.dt / self.loop_ticks
        self.realtime = bool(realtime)
        self.brakes = bool(brakes)
        seeds = _seed_sequences(seed)
        mechanics = mismatched_model(self.model, mismatch, None if seed is None else seed + 7919)
        self.mismatch = float(mismatch)
        self.plant = Plant(mechanics, dt=self.loop_dt, substeps=substeps, integrator=integrator, friction=friction,
                           noise=noise, seed=seeds[0], q0=q0)
        self.drives = Drives(self.model, self.loop_dt, drive, mass_samples=self.plant.mass_samples)
        self.faults = FaultInjection(n, seed=seeds[1])
        if isinstance(clock_jitter_us, bool) or not isinstance(clock_jitter_us, (int, float)):
            raise InputError(f"clock jitter: expected a number of us, got {clock_jitter_us!r}")
        self.clock = (RealtimeClock(self.rate_hz, drift_ppm=clock_drift_ppm, jitter_s=clock_jitter_us * 1e-6,
                                    seed=seeds[2], max_behind=CATCH_UP_PERIODS / self.rate_hz,
                                    timer=clock_timer)
                      if self.realtime else FastClock())
        # commands (written by any thread under _io_lock, latched by the cycle)
        self._cmd_cw = np.zeros(n, np.uint16)
        self._cmd_mode = np.zeros(n, np.int8)
        self._cmd_pos = self.plant.q.copy()
        self._cmd_tau = np.zeros(n)
        self._cmd_off = np.zeros(n)
        self._cw, self._mode = self._cmd_cw.copy(), self._cmd_mode.copy()
        self._tpos, self._ttau, self._toff = self._cmd_pos.copy(), self._cmd_tau.copy(), self._cmd_off.copy()
        # the cycle's working sample and the published copy
        self._sample = SimState.empty(n)
        self._published = SimState.empty(n)
        self._truth = TrueState(np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(10), np.zeros(n))
        self._wrench_until = 0          # the cycle at which the external wrench ends (-1: when cleared)
        self._pos_prev = np.zeros(n)
        self._powered = np.zeros(n, dtype=bool)
        # loop ticks (loop_ticks > 1): the last targets (oldest first), whether each drive was in CSP, the
        # ticks' references and feed-forward, the tick's reading, the cycle's torque sum
        self._targets = np.repeat(self.plant.q[:, None], dc.TARGETS_KEPT, axis=1)
        self._csp = np.zeros(n, dtype=bool)
        self._was_csp = np.zeros(n, dtype=bool)
        self._tick_ref = np.zeros((self.loop_ticks, n))
        self._tick_vff = np.zeros((self.loop_ticks, n))
        self._tick_aff = np.zeros((self.loop_ticks, n))
        self._tick_pos = np.zeros(n)
        self._tick_counts = np.zeros(n, np.int64)
        self._tau_sum = np.zeros(n)
        self._flags_any = np.zeros(n, np.int64)
        self._stalled = np.zeros(n, dtype=bool)
        self._torque_per_amp = self.model.joint_torque_per_amp()
        # threading
        self._io_lock = threading.Lock()
        self._cycle_done = threading.Condition(self._io_lock)
        self._step_lock = threading.RLock()
        self._restart_sensors()
        self._calls: list[tuple[Callable[[], object], list, threading.Event]] = []
        self._callbacks: list[Callable[[SimState], None]] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._running = False
        self.error: BaseException | None = None
        # transport
        if isinstance(transport, str):
            transport = device_class(transport)(**transport_options)
        elif transport_options:
            raise InputError(f"transport options {sorted(transport_options)} given without a transport name")
        elif transport is not None and not isinstance(transport, DeviceSide):
            raise InputError(f"transport: expected a name or a sim.device_contract.DeviceSide, got {transport!r}")
        self.transport = transport
        if external_clock is None:
            external_clock = transport is not None and transport.clocks_simulator()
        self.external_clock = bool(external_clock)
        if transport is not None:
            transport.attach(self)

    # -- life cycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the transport, then (internal clock) the cycle thread. Idempotent."""
        if self._running:
            return
        self._running = True
        self._stop.clear()
        if self.transport is not None:
            self.transport.start()
        if not self.external_clock:
            self._thread = threading.Thread(target=self._run, name="armid-sim", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the cycle thread (joined), then the transport. Idempotent."""
        if not self._running:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        self._fail_queued_calls(RuntimeError("simulator stopped"))
        if self.transport is not None:
            self.transport.stop()
        self._running = False

    def __enter__(self) -> "Simulator":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True between start() and stop()."""
        return self._running

    def _run(self) -> None:
        self.clock.start()
        try:
            while not self._stop.is_set():
                self.clock.wait()
                with self._step_lock:
                    self._cycle()
        except BaseException as exc:  # the plant or a callback failed: record, wake waiters, stop stepping
            self.error = exc
            self._fail_queued_calls(exc)
            with self._io_lock:
                self._cycle_done.notify_all()

    def step(self, n: int = 1) -> SimState:
        """Run n cycles now, in the calling thread (synchronous or external-clock use). Returns the
        internal sample (valid until the next cycle; copy it, or use read_state, to keep it)."""
        if self._thread is not None:
            raise RuntimeError("step(): the simulator runs its own clock (start() with an internal clock)")
        with self._step_lock:
            for _ in range(n):
                self._cycle()
        return self._sample

    def warm_up(self) -> None:
        """Load (or compile) every kernel a cycle uses, without touching this simulator's state: a scratch
        simulator of the same model and rate steps once. For a caller that steps this one from a real-time
        loop: the first cycle then costs a cycle, not a cache load (tens of ms)."""
        Simulator(self.model, rate_hz=self.rate_hz, seed=None).step(1)

    def wait_cycles(self, k: int, timeout: float) -> None:
        """Block until k more cycles have run (any clock); TimeoutError after timeout seconds."""
        with self._io_lock:
            target = self._published.cycle + k
        self.wait_until(target, timeout)

    def wait_until(self, cycle: int, timeout: float) -> None:
        """Block until the published sample's cycle count reaches `cycle`; TimeoutError after timeout s.
        RuntimeError (from the cause) if the cycle thread failed."""
        with self._cycle_done:
            ok = self._cycle_done.wait_for(lambda: self._published.cycle >= cycle or self.error is not None,
                                           timeout=timeout)
        if self.error is not None:
            raise RuntimeError("simulator: the cycle thread failed") from self.error
        if not ok:
            raise TimeoutError(f"simulator: cycle {cycle} not reached within {timeout} s")

    # -- the interface the transports call every cycle ---------------------------------------------
    def set_commands(self, *, controlword=None, mode=None, target_position=None, target_torque=None,
                     torque_offset=None, joint: int | None = None) -> None:
        """Write the drives' command inputs; they act at the next cycle. Thread-safe.

        controlword (0x6040, 0..0xFFFF), mode (modes of operation 0x6060: 0, Mode.CSP or Mode.CST),
        target_position (rad, 0x607A), target_torque (N m, 0x6071; in CSP the torque feed-forward of hosts
        older than the offset), torque_offset (N m, 0x60B2: added to the position loop's torque in CSP, to the
        target torque in CST).
        With joint=None each given argument is an (n,) array; with joint=j (0-based) a scalar for drive j.
        Arguments left None keep their value. A non-finite target or an unknown mode raises InputError
        naming the joint, and nothing is written.
        """
        sel = slice(None) if joint is None else joint_index(joint, self.n, "set_commands")
        j = None if joint is None else sel
        cw = None if controlword is None else self._checked("controlword", controlword, j, integer=True)
        md = None if mode is None else self._checked("mode", mode, j, integer=True)
        pos = None if target_position is None else self._checked("target_position", target_position, j)
        tq = None if target_torque is None else self._checked("target_torque", target_torque, j)
        to = None if torque_offset is None else self._checked("torque_offset", torque_offset, j)
        if cw is not None and ((cw < 0) | (cw > 0xFFFF)).any():
            raise InputError(f"controlword: {self._at(cw, (cw < 0) | (cw > 0xFFFF), j)}: expected 0..0xFFFF")
        if md is not None:
            bad = md != _MODE_VALUES[0]
            for value in _MODE_VALUES[1:]:         # a few comparisons: np.isin costs tens of us per call
                bad &= md != value
            if bad.any():
                raise InputError(f"mode: {self._at(md, bad, j)}: expected one of "
                                 + ", ".join(f"{int(m)} ({m.name})" for m in SUPPORTED_MODES))
        with self._io_lock:
            if cw is not None:
                self._cmd_cw[sel] = cw
            if md is not None:
                self._cmd_mode[sel] = md
            if pos is not None:
                self._cmd_pos[sel] = pos
            if tq is not None:
                self._cmd_tau[sel] = tq
            if to is not None:
                self._cmd_off[sel] = to

    def commanded(self) -> dict[str, np.ndarray]:
        """Copies of the drives' command inputs as last written (set_commands' names and units: controlword,
        mode, target_position rad, target_torque and torque_offset N m). Thread-safe."""
        with self._io_lock:
            return {"controlword": self._cmd_cw.copy(), "mode": self._cmd_mode.copy(),
                    "target_position": self._cmd_pos.copy(), "target_torque": self._cmd_tau.copy(),
                    "torque_offset": self._cmd_off.copy()}

    def read_state(self, out: SimState | None = None) -> SimState:
        """A consistent copy of the latest sample (into out when given: no allocation). Thread-safe."""
        if out is None:
            out = SimState.empty(self.n)
        with self._io_lock:
            return self._published.copy_into(out)

    def read_truth(self) -> TrueState:
        """A copy of the plant's true state at the latest sample (no sensors involved). Thread-safe."""
        with self._io_lock:
            t = self._truth
            return TrueState(t.q.copy(), t.qd.copy(), t.qdd.copy(), t.tau.copy(), t.payload.copy(), t.tau_ext.copy())

    def add_cycle_callback(self, fn: Callable[[SimState], None]) -> None:
        """Call fn(sample) in the stepping thread after every cycle. The sample is the simulator's own
        buffer, valid until the next cycle: read it, don't keep it. fn must be quick (it is in the loop);
        an exception from it stops the cycle thread (see .error)."""
        with self._io_lock:
            self._callbacks = self._callbacks + [fn]

    def remove_cycle_callback(self, fn: Callable[[SimState], None]) -> None:
        """Stop calling fn."""
        with self._io_lock:
            self._callbacks = [f for f in self._callbacks if f is not fn]

    # -- calls applied between cycles --------------------------------------------------------------
    def attach_payload(self, mass: float, com=(0.0, 0.0, 0.0), inertia=(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)) -> None:
        """Fix a payload to the flange (replacing any): mass (kg), com (m, flange frame), inertia
        [XX XY XZ YY YZ ZZ] about the centre of mass, flange axes (kg m^2). Applied between two cycles;
        returns once applied. InputError for a body that cannot exist."""
        chi = payload_parameters(mass, com, inertia)
        self._between_cycles(lambda: self.plant.attach_payload(chi))

    def detach_payload(self) -> None:
        """Remove the payload (between two cycles)."""
        self._between_cycles(self.plant.detach_payload)

    def apply_wrench(self, link: int, force, point=(0.0, 0.0, 0.0), moment=(0.0, 0.0, 0.0),
                     duration: float | None = None) -> None:
        """Push the arm: a force (N) and moment (N m) in base axes at `point` (m, in the frame of link `link`,
        1..n: the link joint `link` moves) from the next cycle on, for `duration` s (None: until
        clear_wrench), replacing any wrench acting. The joints feel J(q)^T [force; moment] on top of the
        motors' torque (ident.model.dynamics.wrench_torques); read_truth().tau_ext says how much. Applied
        between two cycles; InputError naming the argument that is wrong."""
        if duration is not None and (isinstance(duration, bool) or not isinstance(duration, (int, float))
                                     or not 0.0 < duration < math.inf):
            raise InputError(f"wrench: duration: expected a positive number of s or None, got {duration!r}")
        cycles = -1 if duration is None else max(1, int(round(duration * self.rate_hz)))

        def push():
            self.plant.set_wrench(link, point, force, moment)
            self._wrench_until = -1 if cycles < 0 else self._sample.cycle + cycles
        self._between_cycles(push)

    def clear_wrench(self) -> None:
        """Stop pushing the arm (between two cycles)."""
        self._between_cycles(self.plant.clear_wrench)

    def configure_drive(self, joint: int, **params) -> None:
        """Set drive `joint`'s protection parameters (Drives.configure: following_error_window (rad),
        following_error_timeout (s), position_limits (rad, rad), max_torque (N m),
        quick_stop_deceleration (rad/s^2), quick_stop_option). Applied between two cycles."""
        self._between_cycles(lambda: self.drives.configure(joint, **params))

    def drive_parameters(self, joint: int) -> dict:
        """Drive `joint`'s protection parameters, as configure_drive() takes them (for SDO reads)."""
        return self._between_cycles(lambda: self.drives.parameters(joint))

    def set_position(self, q, qd=None) -> None:
        """Teleport the arm to q (rad) at rest or moving at qd (between two cycles; for tests and demos)."""
        def place():
            self.plant.set_state(q, qd)
            self._restart_sensors()
        self._between_cycles(place)

    def lateness(self) -> LatenessStats:
        """The real-time clock's lateness statistics (zeros in fast or external-clock mode)."""
        return self.clock.stats()

    def _between_cycles(self, fn: Callable[[], object]) -> object:
        thread = self._thread
        if thread is None or threading.current_thread() is thread:
            return self._apply_now(fn)
        done, box = threading.Event(), []
        with self._io_lock:
            if self.error is not None:
                raise RuntimeError("simulator: the cycle thread failed") from self.error
            queued = not self._stop.is_set()
            if queued:
                self._calls.append((fn, box, done))
        if not queued:  # stopping: the thread runs at most one more cycle, then the call runs here
            return self._apply_now(fn)
        if not done.wait(_QUEUED_CALL_TIMEOUT):
            raise RuntimeError("simulator: the cycle thread did not apply the call in time")
        if box and isinstance(box[0], BaseException):
            raise box[0]
        return box[0] if box else None

    def _apply_now(self, fn: Callable[[], object]) -> object:
        with self._step_lock:  # re-entrant: a cycle callback may call in from the stepping thread
            result = fn()
            self._publish()
            return result

    def _fail_queued_calls(self, exc: BaseException) -> None:
        with self._io_lock:
            calls, self._calls = self._calls, []
        for _, box, done in calls:
            box.append(exc)
            done.set()

    # -- the cycle ---------------------------------------------------------------------------------
    def _cycle(self) -> None:
        with self._io_lock:
            self._cw[:] = self._cmd_cw
            self._mode[:] = self._cmd_mode
            self._tpos[:] = self._cmd_pos
            self._ttau[:] = self._cmd_tau
            self._toff[:] = self._cmd_off
            calls, self._calls = (self._calls, []) if self._calls else ((), self._calls)
        for fn, box, _ in calls:
            try:
                box.append(fn())
            except Exception as exc:  # reported to the caller, the cycle goes on
                box.append(exc)
        drives, plant = self.drives, self.plant
        drives.update(self._cw, self._mode)
        pending, cleared = self.faults.take_drive_events(self._stalled)
        for j in cleared:
            drives.clear_sticky_fault(j)
        for j, code, sticky in pending:
            drives.fault(j, code, sticky=sticky)
        drives.powered(self._powered)
        if self.brakes:
            np.logical_not(self._powered, out=plant.brake)
        plant.stalled[:] = self._stalled
        if plant.wrench_link >= 0 and 0 <= self._wrench_until <= self._sample.cycle:
            plant.clear_wrench()
        if self.loop_ticks == 1:
            plant.advance(drives.control(self._tpos, self._ttau, self._sample.position, torque_offset=self._toff))
        else:
            self._ticks()
        self._pos_prev[:] = self._sample.position
        self._sample.cycle += 1
        self._sample.time = self._sample.cycle * self.dt
        self._measure()
        drives.after_control()
        self._publish()
        for _, _, done in calls:  # the callers see their change in this cycle's sample
            done.set()
        for fn in self._callbacks:
            fn(self._sample)

    def _ticks(self) -> None:
        """One cycle as loop_ticks drive-loop ticks: the CSP references and feed-forward from the interpolant
        of the last targets (sim.drive_control.interpolant; a drive entering CSP starts at rest at its new
        target), the drives' encoders read every tick, the flags of every tick kept, and the cycle's mean
        torque left in the plant for the current reading."""
        drives, plant, k = self.drives, self.plant, self.loop_ticks
        targets = self._targets
        targets[:, :-1] = targets[:, 1:]
        targets[:, -1] = self._tpos
        np.equal(drives.kind, dc.CSP, out=self._csp)
        if not self._was_csp.all():
            entering = ~self._was_csp
            targets[entering] = self._tpos[entering, None]
        self._was_csp[:] = self._csp
        dc.tick_references(targets, self.dt, self._tick_ref, self._tick_vff, self._tick_aff)
        self._tau_sum[:] = 0.0
        self._flags_any[:] = 0
        position = self._sample.position
        for i in range(k):
            tau = drives.control(self._tick_ref[i], self._ttau, position, self._tick_vff[i], self._tick_aff[i],
                                 self._toff)
            plant.advance(tau)
            self._tau_sum += plant.tau
            self._flags_any |= drives.flags
            if i < k - 1:
                plant.measure_position(self._tick_pos, self._tick_counts)
                position = self._tick_pos
        drives.flags[:] = self._flags_any
        np.divide(self._tau_sum, k, out=plant.tau)

    def _restart_sensors(self) -> None:
        """Sample the sensors afresh (start, teleport): the velocity estimate restarts from rest."""
        self._measure()
        self._pos_prev[:] = self._sample.position
        self._sample.velocity[:] = 0.0
        self.drives.start_from(self._sample.position)
        self._publish()

    def _measure(self) -> None:
        s = self._sample
        self.plant.measure_position(s.position, s.position_counts)
        self.plant.measure_current(s.current)
        np.multiply(s.current, self._torque_per_amp, out=s.torque)
        np.subtract(s.position, self._pos_prev, out=s.velocity)
        s.velocity /= self.dt

    def _publish(self) -> None:
        s, d = self._sample, self.drives
        d.statusword(s.statusword)
        s.mode_display[:] = d.mode_display
        s.error_code[:] = d.error_code
        s.following_error[:] = d.ferr
        t, p = self._truth, self.plant
        with self._io_lock:
            s.copy_into(self._published)
            t.q[:], t.qd[:], t.qdd[:], t.tau[:] = p.q, p.qd, p.qdd, p.tau
            t.payload[:] = p.payload
            t.tau_ext[:] = p.tau_ext
            self._cycle_done.notify_all()

    # -- helpers -----------------------------------------------------------------------------------
    def _checked(self, name: str, value, joint: int | None, integer: bool = False) -> np.ndarray:
        shape = (self.n,) if joint is None else ()
        if type(value) is np.ndarray and value.shape == shape:   # the per-cycle case, checked cheaply
            kind = value.dtype.kind
            if integer and kind in "iu":
                return value.astype(np.int64)        # integers are finite and whole
            if not integer and kind == "f" and math.isfinite(value.sum()):   # False for any NaN or inf
                return value.astype(np.float64, copy=False)
        try:
            arr = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError(f"{name}: expected numbers, got {value!r}") from None
        if arr.shape != shape:
            raise InputError(f"{name}: expected shape {shape}, got {arr.shape}")
        bad = ~np.isfinite(arr)
        if integer:
            bad |= arr != np.round(arr)
        if bad.any():
            raise InputError(f"{name}: {self._at(arr, bad, joint)}: expected a finite "
                             f"{'integer' if integer else 'number'}")
        return arr.astype(np.int64) if integer else arr

    def _at(self, arr: np.ndarray, bad: np.ndarray, joint: int | None) -> str:
        """'joint k (name) value v' for the first bad entry (arr scalar when joint is given)."""
        j = joint if joint is not None else int(np.flatnonzero(bad)[0])
        v = arr.item() if joint is not None else arr[j].item()
        return f"joint {j + 1} ({self.model.joint_names[j]}) value {v!r}"
