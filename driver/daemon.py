"""The driver daemon: an Arm, the 1 kHz cycle, the ZeroMQ state stream, health topic and command socket.

    Driver(model, arm, endpoints=Endpoints(...), rate_hz=1000, watchdog_s=0.01)
    driver.start() ... driver.stop()      (stop() brings the drives to rest and disables them first)

Threads: the cycle (the only user of the PUB socket), the command server (the only user of the ROUTER
command socket, driver/command_server.py; motions are planned in a separate planner process,
driver/planner.py, then handed to the cycle), the health reporter (builds the health JSON
once per second and lets the cycle publish it), and with `record` the recorder (driver.recorder.record on an
inproc SUB of the PUB socket: the cycle only publishes and never waits for the file; the recorder shares the
interpreter, so its encoding can hold the cycle off for up to the switch interval, sys.getswitchinterval()).

Real time ([realtime], driver/realtime.py): once the cycle runs, start() gives the cycle thread and libzmq's
I/O threads (and the serial link thread when asked) SCHED_FIFO and their CPU affinity, and locks the memory;
stop() gives them back what they had. A refused setting is one warning in the log (or, with required, an
error and no start). status() and the health topic report what the kernel says is in effect.

Clock: "auto" (default) runs the cycle on the device's clock when the transport streams on its own
(Arm.streams_on_own_clock: serial), else on the host's (driver/cycle.py).

Security: endpoints bind to loopback or ipc by default. A command endpoint on any other address is
refused unless CurveZMQ keys are configured (Curve): the server's secret key and a folder of the
authorised clients' public keys (zmq.auth certificate files). The state stream carries no commands and
may be bound anywhere.
"""
from __future__ import annotations

import gc
import json
import logging
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import zmq

from firmware_bridge import stream
from driver import authenticator, motion, servo_shaping
from driver.back_off import BackOff
from driver.allocator import return_freed_memory
from driver.collision import CollisionMonitor, Thresholds, Watch, check_change, make_thresholds
from driver.compensation import Compensation
from driver.command_server import RECEIVE_QUEUE, REPLY_QUEUE, CommandServer
from driver.commands import Commands
from driver.cycle import INTAKE_SHARE, LATE_AFTER_CYCLES, Cycle, DriverFault
from driver.motion import MAX_MOTION_S
from driver.planner import PlanBounds, Planner
from driver.requests import MAX_REQUEST_BYTES
from driver.systemd import Supervision
from driver.hal import Arm
from driver import realtime as rt
from driver.realtime import Applied, Realtime
from firmware_bridge.runtime.rt_timing import name_os_thread
from ident.model import dynamics
from firmware_bridge.runtime.errors import InputError
from ident.model import Model
from ident.payload import payload_parameters

HEALTH_PERIOD_S = 1.0
_log = logging.getLogger(__name__)
PLANNER_START_S = 60.0        # the longest start() waits for the planner process to load its kernels
THREAD_STACK_BYTES = 4 << 20  # the driver's own threads' stacks while lock_memory is set (8 MiB each by default,
                              # all of it resident once locked)
SWITCH_INTERVAL_S = 0.0005    # the longest another Python thread holds the interpreter while the cycle waits
_SEND = int(zmq.NOBLOCK)                    # plain ints: no enum arithmetic per message
_SEND_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)


class EndpointError(InputError):
    """An endpoint that may not be bound as configured."""


@dataclass(frozen=True)
class Curve:
    """CurveZMQ for the command socket: the server's secret-key certificate file and a folder of the
    authorised clients' public-key certificates (as written by zmq.auth.create_certificates)."""

    server_secret_file: str
    authorized_clients_dir: str


@dataclass(frozen=True)
class Record:
    """Record the driver's own stream into an MCAP file while it runs (driver.recorder: the topics of
    `armid record`; `armid record convert` reads it). path: the .mcap file (refused if it exists, unless
    overwrite); chunk_seconds: data per chunk, the most a killed driver loses."""

    path: str
    chunk_seconds: float = 0.25
    overwrite: bool = False


@dataclass(frozen=True)
class Metrics:
    """Serve the health as Prometheus metrics at address ("host:port"; beyond loopback only with allow_remote)."""

    address: str = "127.0.0.1:9464"
    allow_remote: bool = False


@dataclass(frozen=True)
class Endpoints:
    state: str = "tcp://127.0.0.1:5555"      # PUB: topics "state" and "health"
    commands: str = "tcp://127.0.0.1:5556"   # ROUTER (REQ clients): JSON requests
    curve: Curve | None = None
    servo: str | None = None                 # PULL (PUSH clients): streamed setpoints in servo mode;
                                             # None: beside commands (servo_endpoint)

    @property
    def servo_endpoint(self) -> str:
        """The servo endpoint: as given, or beside the command endpoint (tcp: the next port, or any port when
        the commands take any; ipc and inproc: the command endpoint's name + "-servo")."""
        if self.servo is not None:
            return self.servo
        if self.commands.startswith("tcp://"):
            host, _, port = self.commands.rpartition(":")
            return f"{host}:{int(port) + 1}" if port.isdigit() else f"{host}:*"
        return self.commands + "-servo"


def is_local(endpoint: str) -> bool:
    """True for ipc://, inproc:// and tcp:// on a loopback address."""
    url = urlparse(endpoint)
    if url.scheme in ("ipc", "inproc"):
        return True
    if url.scheme != "tcp":
        return False
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


class Driver:
    """The daemon's parts wired together (see the module docstring)."""

    def __init__(self, model: Model, arm: Arm, *, endpoints: Endpoints = Endpoints(), rate_hz: float = 1000.0,
                 watchdog_s: float = 0.01, context: zmq.Context | None = None, clock: str = "auto",
                 record: Record | None = None, effort_delay_s: float = 0.0, realtime: Realtime | None = None,
                 trajectory_dir: str | None = None, max_motion_s: float = MAX_MOTION_S,
                 metrics: Metrics | None = None, watch: Watch = Watch(), intake_share: float = INTAKE_SHARE,
                 late_after_cycles: int = LATE_AFTER_CYCLES):
        """effort_delay_s: how late the drives' current and torque are against their positions (s), from the
        config; reported in status and recorded with the data so that identification aligns them.
        realtime: the [realtime] settings applied at start (None: the threads keep what they inherit).
        trajectory_dir: the only folder `run_trajectory {"file": ...}` reads from (None: files refused);
        max_motion_s: the longest motion a command may plan (s); metrics: serve the health as Prometheus
        metrics (driver.metrics) at its address; watch: [model] and [collision] (driver.collision.Watch): the
        observer's model (default: `model`), its gains, the feed-forward's model, collision detection.
        intake_share: the most of each period the cycle spends on queued requests, and again on servo setpoints
        (the rest wait for the next cycles, counted). late_after_cycles: the cycles the drives ride through
        without a new target (their setpoint buffer and extrapolation); a longer backlog marks its samples LATE."""
        if arm.n != model.n:
            raise InputError(f"the transport reports {arm.n} joints, the model {model.name} has {model.n}")
        for label, endpoint in (("commands", endpoints.commands), ("servo", endpoints.servo_endpoint)):
            if not is_local(endpoint) and endpoints.curve is None:
                raise EndpointError(f"{label} endpoint {endpoint}: binding beyond loopback/ipc requires "
                                    f"CurveZMQ keys ([zmq.curve] server_secret_file and authorized_clients_dir)")
        # read the keys now: a missing file stops the driver before it starts anything (the planner process)
        self._curve_keys = None if endpoints.curve is None else load_curve_keys(endpoints.curve)
        self.model = model
        self.payload = np.zeros(10)
        self.watch = watch
        self.watch_model, self.model_provenance, thresholds = self._watch_model(model, watch, rate_hz)
        self.ff_model = self.watch_model if watch.feed_forward else model   # plans and their feed-forward
        self.planning_model = self.ff_model
        self.arm = arm
        self.endpoints = endpoints
        self._ctx = context or zmq.Context.instance()
        self._pub: zmq.Socket | None = None
        self._rep: zmq.Socket | None = None       # the command socket (ROUTER)
        self._servo: zmq.Socket | None = None     # the servo setpoints (PULL), read by the cycle in servo mode
        self._auth = None
        if record is not None:
            _check_record(record)
        self.record = record
        self.effort_delay_s = float(effort_delay_s)
        self.realtime = realtime
        self._rt_applied: Applied | None = None
        self._rt_threads: dict[str, int | list[int]] = {}   # the threads found at start, by [realtime] label
        self._gc_frozen = 0
        self.recording = None            # driver.recorder.RecordingStats of the running recording
        self.recording_error: str | None = None
        if clock == "auto":
            clock = "device" if arm.streams_on_own_clock else "host"
        self.cycle = Cycle(arm, rate_hz=rate_hz, watchdog_s=watchdog_s, publish=self._publish, clock=clock,
                           gravity=self._gravity,
                           torque_limit=model.tau_max, intake_share=intake_share, late_after=late_after_cycles)
        self.cycle.monitor = CollisionMonitor(self._observer(self.watch_model), thresholds,
                                              self.watch_model.joint_torque_per_amp())
        self.cycle.monitor.back_off = self._back_off
        self.cycle.monitor.back_off_setting = BackOff(watch.back_off_distance, watch.back_off_speed)
        self.cycle.compensation = Compensation(self.planning_model, watch.compensate, watch.friction_smoothing)
        self.commands = Commands(self, PlanBounds(float(max_motion_s), trajectory_dir, watch.feed_forward_friction))
        self.planner = Planner(spare=True)     # the process keep_spare() started ahead, when there is one
        self.command_server: CommandServer | None = None
        self._switch_interval = sys.getswitchinterval()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.supervision: Supervision | None = None
        self.metrics = metrics
        self.last_health: dict | None = None
        self._metrics_server = None
        self._lateness = None            # driver.metrics.LatenessHistogram while metrics are served
        self.started_at = 0.0
        self.bound: dict[str, str] = {}
        self._recorder: threading.Thread | None = None
        self._recorder_stop = threading.Event()

    @staticmethod
    def _watch_model(model: Model, watch: Watch, rate_hz: float) -> tuple[Model, dict, Thresholds]:
        """The observer's model, its provenance and the collision thresholds (InputError naming the field)."""
        from driver.model_source import load_watch_model, model_provenance, near_rest_friction, residual_rms
        from driver.observer import gains_array

        if watch.model is None:
            used, provenance = model, model_provenance(model.source, model)
        else:
            used, provenance = load_watch_model(watch.model, model)
        where = f"{watch.source}: "
        try:
            gains_array(list(watch.gains) if isinstance(watch.gains, tuple) else watch.gains, used.n, rate_hz,
                        "model.observer_gains")
            rms = residual_rms(provenance["result"], used)
            rest = near_rest_friction(provenance["result"], used)
            provenance["near_rest_friction"] = None if rest is None else {
                "excess": rest[0].tolist(), "velocity": rest[1].tolist()}
            thresholds = make_thresholds(used.n, used.tau_max, contact=_listed(watch.contact),
                                         collision=_listed(watch.collision), reaction=watch.reaction,
                                         enabled=watch.detect, residual_rms=rms)
        except InputError as exc:
            raise InputError(f"{where}{exc}") from None
        return used, provenance, thresholds

    def _back_off(self, q: np.ndarray, tau_ext: np.ndarray):
        """The back-off reaction's motion from q along tau_ext, planned with the planning model (payload included)
        and checked (driver.motion.MotionError when a limit refuses it)."""
        from driver.back_off import plan_back_off
        from driver.motion import with_feed_forward

        setting, model = self.cycle.monitor.back_off_setting, self.planning_model
        plan = plan_back_off(model, q, tau_ext, setting, self.cycle.rate_hz)
        return with_feed_forward(plan, model, self.watch.feed_forward_friction)

    def _observer(self, model: Model):
        from driver.observer import MomentumObserver

        w = self.watch
        rest = self.model_provenance.get("near_rest_friction")
        return MomentumObserver(model, self.cycle.rate_hz, _listed(w.gains), w.friction_smoothing,
                                None if rest is None else (rest["excess"], rest["velocity"]))

    def set_collision(self, contact=None, collision=None, reaction=None, enabled=None, back_off_distance=None,
                      back_off_speed=None) -> dict:
        """Replace the collision thresholds, reaction or back-off distance and speed (the rest kept); refused
        (InputError) while the arm moves if it would make detection less strict (driver.collision.check_change) or
        the back-off longer or faster. Returns the new settings."""
        mon, n = self.cycle.monitor, self.model.n
        was = mon.back_off_setting
        back = BackOff(was.distance if back_off_distance is None else back_off_distance,
                       was.speed if back_off_speed is None else back_off_speed)
        old = mon.thresholds
        new = make_thresholds(n, self.watch_model.tau_max,
                              contact=old.contact if contact is None else contact,
                              collision=old.collision if collision is None else collision,
                              reaction=old.reaction if reaction is None else reaction,
                              enabled=old.enabled if enabled is None else enabled, where="set_collision")
        if contact is None and collision is None:
            new = Thresholds(new.contact, new.collision, new.reaction, new.enabled, old.source)

        def apply():
            moving = self.cycle.motion is not None or self.cycle.servo is not None
            check_change(mon.thresholds, new, moving)
            current = mon.back_off_setting
            for key in ("distance", "speed"):
                if moving and getattr(back, key) > getattr(current, key):
                    raise InputError(f"set_collision: a longer or faster back-off (back_off_{key} "
                                     f"{getattr(current, key):g} -> {getattr(back, key):g}) is refused while the arm moves")
            mon.thresholds, mon.back_off_setting = new, back
            _log.warning("collision settings changed: %s", mon.status(), extra={"collision": new.as_dict()})

        self.cycle.submit(apply)
        return mon.status()

    # -- life cycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the planner process, bind the sockets, load every kernel, open the link, start the cycle, wait
        (at most PLANNER_START_S) until the planner has loaded its kernels, start the command server. The link opens
        last, right before the cycle writes to it: a drive or gateway whose host watchdog counts from the first
        exchange never waits on the driver's own start-up. With lock_memory the driver's threads start with
        THREAD_STACK_BYTES stacks."""
        locking = self.realtime is not None and self.realtime.lock_memory
        stack = threading.stack_size(THREAD_STACK_BYTES) if locking else None
        try:
            self._start()
        finally:
            if stack is not None:
                threading.stack_size(stack)

    def _start(self) -> None:
        return_freed_memory()       # a flood of large requests must not leave the process larger for good
        self.arm.check_reachable()  # a wrong address fails now, not after the kernels below are loaded
        self.planner.start()        # it loads its kernels meanwhile, at a lower priority than the cycle's
        try:
            self._bind()
            self._prepare()
        except BaseException:
            self._close_sockets()
            self.planner.close()
            self._restore_realtime()
            raise
        try:
            self.arm.open()
        except BaseException:
            self._close_sockets()
            self.planner.close()
            self._restore_realtime()
            raise
        _log.info("transport opened: %s", type(self.arm).__name__)
        try:    # from here on a failure (a refused [realtime] setting, the metrics port taken) stops what was
                # started: nothing is powered yet
            if self.record is not None:
                inproc = f"inproc://armid-record-{id(self)}"
                self._pub.bind(inproc)
                self._recorder_stop = threading.Event()
                self._recorder = threading.Thread(target=self._record, args=(inproc,), name="armid-recorder",
                                                  daemon=True)
                self._recorder.start()
            self.started_at = time.time()
            self._stop.clear()
            self._switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_INTERVAL_S)
            self.cycle.start()
            warn = _log.warning
            self._rt_threads = self._realtime_threads()
            if self.realtime is not None:
                chosen = {k: v for k, v in self._rt_threads.items() if k in self.realtime.threads}
                self._rt_applied = rt.apply(replace(self.realtime, lock_memory=False), chosen, warn, self._rt_applied)
            if not self.planner.wait_ready(PLANNER_START_S):
                _log.warning("the planner process was not ready within %g s; the first motion command waits for it",
                             PLANNER_START_S)
            self.command_server = CommandServer(self._rep, self.commands, self.planner, self._stop)
            for name, target in (("armid-commands", self._serve_commands), ("armid-health", self._report_health)):
                t = threading.Thread(target=target, name=name, daemon=True)
                t.start()
                self._threads.append(t)
            p, th = self.model_provenance, self.cycle.monitor.thresholds
            _log.info("model: %s from %s (%s, sha256 %s); observer gains %s 1/s; collision detection %s (%s)",
                      p["name"], p["source"], "identified by armid" if p["identified"] else "not identified by armid",
                      (p["sha256"] or "-")[:12], self.cycle.monitor.observer.gains.tolist(),
                      f"on, reaction {th.reaction}" if th.enabled else "off", th.source,
                      extra={"model": p, "collision": th.as_dict()})
            _log.info("driver: %s, %d joints, %g Hz; state on %s, commands on %s, servo on %s", self.model.name,
                      self.model.n, self.cycle.rate_hz, self.bound["state"], self.bound["commands"], self.bound["servo"],
                      extra={"endpoints": dict(self.bound)})
            if self.metrics is not None:
                from driver import metrics as prometheus

                self._lateness = prometheus.LatenessHistogram()
                self._metrics_server = prometheus.serve(self.metrics.address, lambda: self.last_health,
                                                        tuple(self.model.joint_names), self.metrics.allow_remote,
                                                        self._lateness)
                _log.info("metrics: http://%s/metrics", self.metrics.address, extra={"endpoint": self.metrics.address})
            self.supervision = Supervision(lambda: self.cycle.cycles)
            self.supervision.ready(f"{self.model.name}, {self.cycle.rate_hz:g} Hz, state on {self.bound['state']}")
        except BaseException:
            self.stop()
            raise

    def _bind(self) -> None:
        """The state PUB, the commands ROUTER and the servo PULL, bound (CURVE-secured when configured)."""
        try:
            self._pub = self._ctx.socket(zmq.PUB)
            self._pub.setsockopt(zmq.LINGER, 0)
            self._pub.setsockopt(zmq.SNDHWM, 10000)
            self._pub.bind(self.endpoints.state)
            self._rep = self._ctx.socket(zmq.ROUTER)
            self._rep.setsockopt(zmq.LINGER, 0)
            self._rep.setsockopt(zmq.MAXMSGSIZE, 2 * MAX_REQUEST_BYTES)   # beyond: ZeroMQ drops the client
            self._rep.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)    # what a flooding client can queue in us
            self._rep.setsockopt(zmq.SNDHWM, REPLY_QUEUE)      # replies to a client that never reads them
            self._rep.setsockopt(zmq.ROUTER_MANDATORY, 1)      # a reply that cannot go is counted, not lost unseen
            if self.endpoints.curve is not None:
                self._secure(self._rep, self.endpoints.curve)
            self._rep.bind(self.endpoints.commands)
            self._servo = self._ctx.socket(zmq.PULL)
            self._servo.setsockopt(zmq.LINGER, 0)
            self._servo.setsockopt(zmq.RCVHWM, 1000)
            self._servo.setsockopt(zmq.MAXMSGSIZE, 4096)        # a setpoint is 32 + 8 n bytes
            if self.endpoints.curve is not None:
                self._secure(self._servo, self.endpoints.curve)
            self._servo.bind(self.endpoints.servo_endpoint)
        except (zmq.ZMQError, authenticator.AuthenticatorError) as exc:
            raise EndpointError(f"cannot bind: {exc}" if isinstance(exc, zmq.ZMQError) else str(exc)) from None
        self.bound = {"state": self._pub.getsockopt_string(zmq.LAST_ENDPOINT),
                      "commands": self._rep.getsockopt_string(zmq.LAST_ENDPOINT),
                      "servo": self._servo.getsockopt_string(zmq.LAST_ENDPOINT)}

    def warm_up(self) -> None:
        """Compile (or load from numba's disk cache) every kernel the cycle, servo and the planning in this process
        call, on scratch arrays, without starting anything: what start() does first (a compile inside the running
        cycle would stall it for seconds)."""
        self._gravity(np.zeros(self.model.n))   # the compiled kernel, not inside the first enable
        self.cycle.warm_up()                    # every kernel of the cycle, before it runs (and before READY)
        servo_shaping.warm_up(self._servo_limits(), self.cycle.hold)      # servo's, on the limits' arrays
        motion.warm_up(self.planning_model, self.cycle.rate_hz)   # stops, blends, back-offs planned here

    def _prepare(self) -> None:
        """Everything slow that the cycle needs, done before the link opens: every kernel the cycle, servo and the
        planning in this process call, compiled or loaded from numba's cache; the garbage collector's long-lived
        objects frozen; with lock_memory, the process's memory locked (it stalls every thread that faults
        meanwhile, for tens of ms)."""
        self.warm_up()
        gc.collect()
        gc.freeze()   # long-lived objects leave the collector's sight: shorter pauses in the cycle
        self._gc_frozen = gc.get_freeze_count()     # once: it walks every frozen object
        if self.realtime is not None and self.realtime.lock_memory:
            self._rt_applied = rt.apply(replace(self.realtime, priority=None, cpus=None), {}, _log.warning)

    def _restore_realtime(self) -> None:
        if self._rt_applied is not None:
            self._rt_applied.restore()
            self._rt_applied = None
        gc.unfreeze()

    def stop(self, timeout: float = 3.0) -> None:
        """Bring the drives to rest and disable them, then stop the threads and close everything."""
        if self.supervision is not None:
            self.supervision.stopping()
        if self._metrics_server is not None:
            self._metrics_server.close()
            self._metrics_server = None
        if self.cycle.running:
            try:
                self.cycle.submit(self.cycle.request_quick_stop if self.cycle.motion is not None else self.cycle.disable)
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline and self._any_powered():
                    time.sleep(0.005)
                self.cycle.submit(self.cycle.disable)
                time.sleep(5 / self.cycle.rate_hz)
            except Exception as exc:  # noqa: BLE001 - stopping must go on
                _log.error("while disabling the drives: %s", exc)
        self._stop.set()
        self.cycle.stop()
        for t in self._threads:
            t.join(timeout)
        self._threads.clear()
        if self._recorder is not None:          # after the cycle: the last messages are in the file
            self._recorder_stop.set()
            self._recorder.join(timeout + 10.0)
            self._recorder = None
        self._close_sockets()
        self.planner.close()
        sys.setswitchinterval(self._switch_interval)
        self.arm.close()
        self._restore_realtime()

    def _realtime_threads(self) -> dict[str, int | list[int]]:
        """Native thread ids by [realtime] label, of the threads that exist: the cycle, libzmq's I/O threads
        (by their kernel name), the transport's link thread (Arm.link_thread_id, when it has one)."""
        found: dict[str, int | list[int]] = {}
        if self.cycle.native_id is not None:
            found["cycle"] = self.cycle.native_id
        if io := rt.threads_named(rt.ZMQ_IO_PREFIX):
            found["zmq-io"] = io
        link = self.arm.link_thread_id
        if link is not None:
            found["serial-link"] = link
        return found

    def realtime_status(self) -> dict:
        """What is in effect for the driver's real-time threads (driver.realtime.in_effect): policy, priority
        and CPUs per thread, locked memory, the garbage collector, refused settings."""
        report = rt.in_effect(self._rt_threads, self._rt_applied, self._gc_frozen)
        report["requested"] = None if self.realtime is None else {
            "priority": self.realtime.priority, "threads": list(self.realtime.threads),
            "cpus": None if self.realtime.cpus is None else list(self.realtime.cpus),
            "lock_memory": self.realtime.lock_memory, "required": self.realtime.required}
        return report

    def _any_powered(self) -> bool:
        sw = self.cycle.state.statusword
        return bool(np.any(((sw & 0x6F) == 0x27) | ((sw & 0x6F) == 0x07)))

    def _close_sockets(self) -> None:
        for sock in (self._pub, self._rep, self._servo):
            if sock is not None:
                sock.close(0)
        self._pub = self._rep = self._servo = None
        if self._auth is not None:
            authenticator.stop(self._auth)
            self._auth = None

    def _secure(self, sock: zmq.Socket, curve: Curve) -> None:
        public, secret = self._curve_keys
        if self._auth is None:          # one authenticator for every secured socket of this context; it
            self._auth = authenticator.start(self._ctx, curve.authorized_clients_dir, public)   # serves before bind
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True

    # -- used by the cycle and the commands ----------------------------------------------------------
    def _publish(self, topic: bytes, payload) -> None:
        # two plain sends: send_multipart's per-call checks cost more than the 258-byte copy
        pub = self._pub
        try:
            pub.send(topic, _SEND_MORE)
            pub.send(payload, _SEND)
        except zmq.Again:
            pass   # PUB never blocks the cycle; slow subscribers lose messages (seq gaps show it)

    def _gravity(self, q: np.ndarray) -> np.ndarray:
        return dynamics.gravity_torques(self.planning_model, q[None, :])[0]

    def set_payload(self, mass: float, com, inertia) -> None:
        """Plan and feed forward with a payload (mass 0 clears it). Refused (InputError) unless it is a physical
        body within the model's rated payload and reach, whose holding torque at the current pose keeps
        every joint within its torque limit."""
        check_payload(self.model, mass, com)       # first: a CoM of 1e300 m never reaches the arithmetic
        chi = payload_parameters(mass, com, inertia)
        model = dynamics.merge_payload(self.ff_model, chi) if mass > 0 else self.ff_model
        observer = self._observer(dynamics.merge_payload(self.watch_model, chi) if mass > 0 else self.watch_model)

        def apply():
            if self.cycle.motion is not None:
                raise InputError("set_payload: a motion is running; wait for it to end")
            before = self.planning_model
            self.planning_model = model
            try:
                self.cycle.set_hold_torque()        # the torque limits hold with it, or nothing changes
            except DriverFault as exc:
                self.planning_model = before
                raise InputError(f"set_payload refused: {exc}") from None
            self.payload = chi
            self.cycle.compensation.use(model)           # torque servo's gravity with the payload
            self.cycle.flags_extra = stream.FLAG_PAYLOAD if mass > 0 else 0
            self.cycle.monitor.observer = observer       # starts afresh with the payload in its model

        self.cycle.submit(apply)

    def status(self, realtime: dict | None = None) -> dict:
        """The status command's answer; realtime: the realtime_status() the caller has already read."""
        from firmware_bridge.cia402 import state_of

        c, st = self.cycle, self.cycle.state
        states = [state_of(int(w)) for w in st.statusword]
        return {"model": self.model.name, "joints": list(self.model.joint_names), "rate_hz": c.rate_hz,
                "fault": c.fault, "enabled": c.enabled(), "moving": c.motion is not None,
                "motion": None if c.motion is None else c.motion.name,
                "progress": c.motion_progress(),
                "q": st.q.tolist(), "drive_states": [s.value if s else "UNKNOWN" for s in states],
                "error_codes": [int(e) for e in st.error_code], "payload": self.payload.tolist(),
                "cycles": c.cycles, "seq": c.seq, "effort_delay_s": self.effort_delay_s,
                "servo": self.servo_status(),
                "realtime": self.realtime_status() if realtime is None else realtime}

    def collision_status(self) -> dict:
        """The collision settings and counters, with the peak |tau_ext| per joint since the last call (N m)."""
        mon = self.cycle.monitor
        return {**mon.status(), "peak_tau_ext": mon.peaks()}

    def servo_status(self) -> dict | None:
        """The running servo session's counters, or the last one's with why it ended, or None."""
        session = self.cycle.servo
        return {**session.stats(), "endpoint": self.bound["servo"]} if session is not None else self.cycle.servo_ended

    def servo_totals(self) -> dict[str, int]:
        """The servo sessions' counters summed over the driver's life (setpoints received, accepted, refused,
        dropped, lost), the running session's included."""
        session = self.cycle.servo
        return session.totals(self.cycle.servo_totals) if session is not None else dict(self.cycle.servo_totals)

    def _servo_limits(self):
        from driver.servo import ServoLimits

        m = self.model
        return ServoLimits(m.q_min, m.q_max, m.qd_max, m.qdd_max, self.cycle.torque_limit, tuple(m.joint_names))

    def start_servo(self, mode: str, timeout_cycles: int, buffer_cycles: int = 2, compensate=None) -> dict:
        """Begin servo mode in `mode` ("position" or "torque"); setpoints come on the servo socket and carry the
        session token of the reply (only this reply names it). compensate (torque mode): the model's terms added to
        the client's torque (driver.compensation.KINDS; None: [model] compensate)."""
        from driver.compensation import kinds_of

        import secrets

        from driver.servo import ServoSession
        from firmware_bridge.servo_wire import MODES

        limits = self._servo_limits()
        token = secrets.randbits(64) or 1
        kinds = self.cycle.compensation.kinds if compensate is None else kinds_of(compensate, "servo: compensate")
        if mode != "torque":
            kinds = ()
        session = ServoSession(MODES[mode], self._servo, limits, 1.0 / self.cycle.rate_hz, self.cycle.hold.copy(),
                               timeout_cycles, buffer_cycles, token=token, compensate=kinds,
                               intake_share=self.cycle.intake_share)
        self.cycle.submit(lambda: self.cycle.start_servo(session))
        return {"endpoint": self.bound["servo"], "mode": mode, "timeout_cycles": timeout_cycles,
                "buffer_cycles": buffer_cycles, "token": token, "compensate": list(kinds)}

    # -- threads -------------------------------------------------------------------------------------
    def _serve_commands(self) -> None:
        name_os_thread()
        self.command_server.run()

    def health(self, period_s: float, last: dict) -> dict:
        """The health message (docs/reference/stream.md): rates over the last period, drops, lateness, drive states."""
        c = self.cycle
        now = time.monotonic()
        dt = max(now - last.get("t", now - period_s), 1e-9)
        cycles, fresh = c.cycles, c.fresh
        realtime = self.realtime_status()
        msg = {"time": time.time(), "uptime_s": time.time() - self.started_at,
               "cycle_rate_hz": (cycles - last.get("cycles", cycles)) / dt,
               "sample_rate_hz": (fresh - last.get("fresh", fresh)) / dt,
               "cycles": cycles, "fresh_samples": fresh, "stale_cycles": c.stale, "overruns": c.overruns, "caught_up": c.caught_up,
               "late_samples": c.late_samples, "late_after_cycles": c.late_after,
               "requests_deferred": c.requests_deferred, "urgent": c.urgent_taken,
               "lateness": c.lateness_percentiles(), "fault": c.fault, "enabled": c.enabled(),
               "moving": c.motion is not None, "link": self.arm.link_stats(),
               "drive_states": self.status(realtime)["drive_states"], "recording": self._recording_health(),
               "realtime": realtime, "effort_delay_s": self.effort_delay_s, "samples_lost": c.samples_lost,
               "commands": None if self.command_server is None else self.command_server.stats(),
               "servo": self.servo_status(), "servo_totals": self.servo_totals(),
               "model": self.model_provenance, "collision": self.collision_status(),
               "events": [{"time": t, "text": text} for t, text in list(c.events)[-10:]]}
        last.update(t=now, cycles=cycles, fresh=fresh)
        if self._lateness is not None:
            self._lateness.update(c.lateness_ns, cycles)
        return msg

    def _record(self, endpoint: str) -> None:
        name_os_thread()
        from driver.recorder import record

        def progress(stats) -> None:
            self.recording = stats

        rec = self.record
        _log.info("record: writing %s", rec.path, extra={"path": rec.path})
        try:
            self.recording = record(rec.path, endpoint, joint_names=list(self.model.joint_names),
                                    rate_hz=self.cycle.rate_hz, chunk_seconds=rec.chunk_seconds,
                                    stop=self._recorder_stop, progress=progress, progress_interval_s=1.0,
                                    log=lambda text: _log.warning("record: %s", text), overwrite=rec.overwrite,
                                    metadata={"model": self.model.name, "source": "armid driver",
                                              "effort_delay_s": repr(self.effort_delay_s)},
                                    context=self._ctx, model=self.model)
            _log.info("record: %s closed: %s", rec.path, self.recording.line(), extra={"path": rec.path})
        except Exception as exc:  # noqa: BLE001 - a failed recording is reported, the driver goes on
            self.recording_error = f"{type(exc).__name__}: {exc}"
            _log.error("record: %s: stopped: %s", rec.path, exc, extra={"path": rec.path})

    def _recording_health(self) -> dict | None:
        if self.record is None:
            return None
        st = self.recording
        return {"path": self.record.path, "messages": 0 if st is None else st.messages,
                "dropped": 0 if st is None else st.dropped, "malformed": 0 if st is None else st.malformed,
                "bytes": 0 if st is None else st.bytes_written, "error": self.recording_error}

    def _report_health(self) -> None:
        name_os_thread()
        last: dict = {}
        while not self._stop.wait(HEALTH_PERIOD_S):
            try:
                self.last_health = self.health(HEALTH_PERIOD_S, last)
                self.cycle.set_health_payload(json.dumps(self.last_health, default=str).encode())
            except Exception as exc:  # noqa: BLE001 - health must not kill the daemon
                _log.error("health: %s: %s", type(exc).__name__, exc)


def _listed(value):
    """A config's tuple as a list (numbers stay as they are)."""
    return list(value) if isinstance(value, tuple) else value


def load_curve_keys(curve: Curve) -> tuple[bytes, bytes]:
    """The server's (public, secret) CurveZMQ keys; EndpointError naming the file or folder that is missing or
    holds no secret key."""
    import zmq.auth

    for label, path in (("server_secret_file", curve.server_secret_file),
                        ("authorized_clients_dir", curve.authorized_clients_dir)):
        if not os.path.exists(path):
            raise EndpointError(f"zmq.curve.{label}: {path} does not exist")
    try:
        public, secret = zmq.auth.load_certificate(curve.server_secret_file)
    except (OSError, ValueError) as exc:
        raise EndpointError(f"zmq.curve.server_secret_file: {curve.server_secret_file}: {exc}") from None
    if secret is None:
        raise EndpointError(f"zmq.curve.server_secret_file: {curve.server_secret_file} holds no secret key")
    return public, secret


def check_payload(model: Model, mass: float, com) -> None:
    """Refuse a payload heavier than the model's rated payload, or whose centre of mass lies farther from the
    flange than the arm reaches (InputError naming the field and the bound)."""
    if mass > model.rated_payload:
        raise InputError(f"set_payload refused: mass {mass:.4g} kg is over the rated payload of {model.name} "
                         f"({model.rated_payload:g} kg)")
    reach = model_reach(model)
    with np.errstate(over="ignore"):
        distance = float(np.linalg.norm(com))
    if mass > 0 and distance > reach:
        raise InputError(f"set_payload refused: com is {distance:.4g} m from the flange, farther than the arm's "
                         f"reach ({reach:.3g} m)")


def model_reach(model: Model) -> float:
    """The arm's reach (m): the sum of its links' offsets and the flange's (every link stretched out)."""
    return float(np.linalg.norm(model.placement_p, axis=1).sum() + np.linalg.norm(model.flange_p))


def _check_record(record: Record) -> None:
    """Refuse at once what the recorder thread would refuse later: an existing file, a missing folder."""
    path = Path(record.path)
    if not path.parent.is_dir():
        raise InputError(f"record: {record.path}: the folder {path.parent} does not exist")
    if path.exists() and not record.overwrite:
        raise InputError(f"record: {record.path}: exists; choose another name or set overwrite")
    if not record.chunk_seconds > 0:
        raise InputError(f"record: chunk_seconds: expected a positive number, got {record.chunk_seconds!r}")
