"""The simulator's serial device side: the joint boards' microcontroller, speaking firmware_bridge.serial_protocol.

    dev = SerialDevice()                       # a pseudo-terminal it opens itself; dev.path is the host's port
    dev = SerialDevice(port="/dev/ttyUSB0")    # or any port pyserial opens by name or URL
    sim = Simulator("generic6", transport=dev, realtime=True); sim.start(); ...; sim.stop()

The simulator runs on its own clock. After every cycle the device queues one STATE frame (position, velocity
and current converted to counts, counts/s and uA with units.JointScaling from the model's gear ratios and the
simulator's encoder resolution), a HEARTBEAT every heartbeat_s, and a FAULT when a drive enters FAULT. A
writer thread sends them, honouring sim.faults per frame (drop, corrupt: one bit flipped before the CRC is
checked, bad CRC, silent, latency). A reader thread decodes the host's frames: HELLO -> HELLO_ACK, COMMAND ->
sim.set_commands, HEARTBEAT. A COMMAND with a target outside a joint's limits is refused whole (counted in
counters.out_of_limits). Each cycle, a drive in CSP that got no new target follows what sim.drive_targets
makes of the targets it received (target_counts). Host watchdog: no COMMAND or HEARTBEAT for watchdog_s while a drive is in
OPERATION ENABLED -> quick stop on every drive. Drops are counted: rx_counters (frames from the host, by
reason), counters (frames not sent, commands refused, watchdog trips).
"""
from __future__ import annotations

import logging
import os
import select
import threading
import time
import tty
from collections import deque
from dataclasses import dataclass

import numpy as np

from firmware_bridge.runtime.rt_timing import name_os_thread
from firmware_bridge import cia402
from firmware_bridge import serial_protocol as sp
from firmware_bridge.units import CURRENT_LSB, ENCODER_COUNTS_PER_REV, INT32_MAX, JointScaling, WireValueError
from firmware_bridge.runtime.errors import InputError
from firmware_bridge.runtime.log_throttle import Throttle
from firmware_bridge.runtime.counters import Counters
from firmware_bridge.runtime.options import Option, OptionSet
from firmware_bridge.runtime.setpoint_buffer import MAX_DEPTH
from sim.device_contract import StepOrFreeRun
from sim.drive_targets import DeviceTargets, setpoints_for_device, target_limits, target_refusal
from sim.faults import Fate

log = logging.getLogger(__name__)
TROUBLE_LOG_INTERVAL_S = 10.0   # refused commands, failed reads/writes: the first logged, then one line per interval

_POLL_S = 0.05             # how long a thread blocks before it looks at the stop flag
_JOIN_S = 2.0
_MAX_QUEUED = 256          # frames waiting for the writer, all kinds
_WATCHDOG_RANGE_S = (0.001, 10.0)
_FAULT_MASK, _FAULT_VALUE = cia402.STATE_PATTERNS[cia402.State.FAULT]
_FRA_VALUE = cia402.STATE_PATTERNS[cia402.State.FAULT_REACTION_ACTIVE][1]   # same mask as FAULT
_OE_MASK, _OE_VALUE = cia402.STATE_PATTERNS[cia402.State.OPERATION_ENABLED]


@dataclass
class DeviceCounters(Counters):
    """What the device side did. frames_sent: frames written (after fault injection); tx_skipped: frames
    not queued because the line was busy (states in fast mode) ; unencodable: states a value of which did not
    fit the wire; rejected: COMMANDs the drives refused (wrong n_joints, bad mode, a target outside the limits);
    out_of_limits: of those, the ones with a target position or torque outside a joint's limits; unexpected:
    device-to-host messages received from the host; hellos; watchdog_trips; write_errors."""
    frames_sent: int = 0
    tx_skipped: int = 0
    unencodable: int = 0
    rejected: int = 0
    out_of_limits: int = 0
    unexpected: int = 0
    hellos: int = 0
    watchdog_trips: int = 0
    write_errors: int = 0


class _PtyLink:
    """The master side of a pseudo-terminal pair opened here; the slave (path) is for the host. The slave
    stays open here too, so the host may open and close it at will."""

    def __init__(self) -> None:
        self.fd, self._slave = os.openpty()
        tty.setraw(self._slave)                  # no echo, no line editing: bytes pass unchanged
        os.set_blocking(self.fd, False)
        self.path = os.ttyname(self._slave)

    def read(self) -> bytes:
        ready, _, _ = select.select([self.fd], [], [], _POLL_S)
        if not ready:
            return b""
        try:
            return os.read(self.fd, 4096)
        except (BlockingIOError, InterruptedError):
            return b""

    def write(self, data: bytes, stop: threading.Event) -> bool:
        view = memoryview(data)
        while view and not stop.is_set():
            try:
                view = view[os.write(self.fd, view):]
            except (BlockingIOError, InterruptedError):
                select.select([], [self.fd], [], _POLL_S)
        return not view

    def close(self) -> None:
        for fd in (self.fd, self._slave):
            try:
                os.close(fd)
            except OSError:
                pass


class _PortLink:
    """Any port pyserial opens by name or URL (serial.serial_for_url)."""

    def __init__(self, port: str, baudrate: int) -> None:
        import serial
        try:
            self._port = serial.serial_for_url(port, baudrate=baudrate, timeout=_POLL_S, write_timeout=1.0)
        except (serial.SerialException, ValueError) as exc:
            raise InputError(f"serial device: cannot open port {port!r}: {exc}") from None
        self.path = port

    def read(self) -> bytes:
        return self._port.read(max(1, self._port.in_waiting))

    def write(self, data: bytes, stop: threading.Event) -> bool:
        import serial
        try:
            return self._port.write(data) == len(data)
        except serial.SerialTimeoutException:
            return False

    def close(self) -> None:
        self._port.close()


SERIAL_DEVICE_OPTIONS = OptionSet(
    "serial device",
    Option("port", "text", None, nullable=True, what="a port name or URL",
           doc="a pyserial port name or URL to serve on (none: a pseudo-terminal, whose path the host opens)"),
    Option("baudrate", "integer", 3_000_000, low=50, high=100_000_000, unit="bit/s", doc="for a real port"),
    Option("watchdog_s", "number", sp.DEFAULT_WATCHDOG_US * 1e-6, low=0, above=True, unit="s",
           doc="host silence that quick-stops enabled drives (a HELLO may change it within 1 ms .. 10 s)"),
    Option("heartbeat_s", "number", 0.1, low=0, above=True, unit="s", doc="period of the device's HEARTBEAT"),
    Option("state_queue", "integer", 8, low=1, high=_MAX_QUEUED,
           doc="STATE frames that may wait for the line before new ones are skipped (counted: tx_skipped); "
               "free-running only: a host-clocked device sends the STATE of every cycle"),
    Option("step_on_command", "flag", False,
           doc="host-clocked: each COMMAND runs one simulator cycle (false: the simulator's own clock)"),
    Option("target_buffer", "integer", None, low=0, high=MAX_DEPTH, unit="cycles", nullable=True,
           doc="depth of the drives' setpoint buffer (none: 3 when free-running, 0 when host-clocked)"))


class SerialDevice(StepOrFreeRun):
    """The device side of the serial link for a Simulator: SerialDevice(**options) (SERIAL_DEVICE_OPTIONS). It
    runs on the simulator's clock, or, with step_on_command, steps it once per COMMAND."""

    OPTION_SPEC = SERIAL_DEVICE_OPTIONS

    def __init__(self, **options):
        opts = SERIAL_DEVICE_OPTIONS.parse(options)
        self.step_on_command = self.host_clocked = opts.step_on_command
        self.setpoints = setpoints_for_device(opts.target_buffer, self.step_on_command, "serial device")
        self.port, self.baudrate = opts.port, opts.baudrate
        self.watchdog_s, self.heartbeat_s = float(opts.watchdog_s), float(opts.heartbeat_s)
        self.state_queue = opts.state_queue
        self.default_watchdog_s = self.watchdog_s
        self.sim = None
        self.scaling: JointScaling | None = None
        self.counts_per_rev = ENCODER_COUNTS_PER_REV
        self.path: str | None = None
        self.counters = DeviceCounters()
        self._refused_log = Throttle(log, logging.WARNING, TROUBLE_LOG_INTERVAL_S)
        self._io_log = Throttle(log, logging.WARNING, TROUBLE_LOG_INTERVAL_S)
        self._unsent_log = Throttle(log, logging.WARNING, TROUBLE_LOG_INTERVAL_S)
        self._decoder = sp.StreamDecoder()
        self._link: _PtyLink | _PortLink | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._tx: deque = deque()
        self._tx_cond = threading.Condition()
        self._seq = 0
        self._last_host = 0.0
        self._tripped = False
        self._faulted = np.zeros(0, dtype=bool)   # (n,) drives in FAULT at the last statusword change
        self._last_sw = b""
        self._conv = np.zeros((3, 0))               # position, velocity, current in wire units
        self._next_heartbeat = 0.0
        self._cycle_base = 0                        # the simulator's cycle and time at the last restart():
        self._time_base = 0.0                       # the device's cycle counter and clock start there
        self.restarts = 0

    # -- DeviceSide -------------------------------------------------------------------------------------------
    def attach(self, sim) -> None:
        """Called by Simulator.__init__: the scaling from the model's gears and the simulated encoder."""
        self.sim = sim
        self.counts_per_rev = sim.plant.noise.encoder_counts or ENCODER_COUNTS_PER_REV
        self.scaling = JointScaling.from_gear(sim.model.gear_ratio, self.counts_per_rev)
        self._faulted = np.zeros(sim.n, dtype=bool)
        self._conv = np.zeros((3, sim.n))
        self._last_sw = b""
        self._limits = target_limits(sim.model, self.scaling.counts_per_rad)
        self.drive_targets = DeviceTargets(sim, self.setpoints)
        self.targets = self.drive_targets.streams
        self._target_lock = threading.Lock()            # a COMMAND's targets against the cycle's continuation
        self.last_refusal = ""

    def start(self) -> None:
        """Open the link, start the reader and writer threads, send STATE after every cycle."""
        if self.sim is None:
            raise RuntimeError("serial device: attach(sim) first (pass it to Simulator(transport=...))")
        if self._threads:
            return
        self._link = _PtyLink() if self.port is None else _PortLink(self.port, self.baudrate)
        self.path = self._link.path
        log.info("serial device: the host opens %s", self.path)
        self._stop.clear()
        self._last_host = time.monotonic()
        self._next_heartbeat = 0.0
        self._threads = [threading.Thread(target=self._reader, name="armid-serial-rx", daemon=True),
                         threading.Thread(target=self._writer, name="armid-serial-tx", daemon=True)]
        for t in self._threads:
            t.start()
        self.sim.add_cycle_callback(self._on_cycle)

    def stop(self) -> None:
        """Stop sending, join the threads (bounded), close the link. Idempotent."""
        if self.sim is not None:
            self.sim.remove_cycle_callback(self._on_cycle)
        self._stop.set()
        with self._tx_cond:
            self._tx_cond.notify_all()
        for t in self._threads:
            t.join(_JOIN_S)
        self._threads = []
        if self._link is not None:
            self._link.close()
            self._link = None
        with self._tx_cond:
            self._tx.clear()
        for throttle in (self._refused_log, self._io_log, self._unsent_log):
            throttle.flush()

    def restart(self, announce: bool = False) -> None:
        """Simulate the board rebooting behind a port that stays open: its frame numbering, cycle counter and
        clock start again from 0, the host watchdog goes back to its default (a HELLO sets it again), what
        was queued is lost and the drives lose power (SWITCH ON DISABLED). announce: it also sends a HELLO,
        as firmware announcing itself at boot may. Call it from any thread while the device runs."""
        with self._tx_cond:
            self._tx.clear()
            self._seq = 0
            s = self.sim.read_state()
            self._cycle_base, self._time_base = s.cycle + 1, s.time + self.sim.dt
            self.watchdog_s = self.default_watchdog_s
            self.restarts += 1
        self.sim.set_commands(controlword=np.full(self.sim.n, cia402.CW_DISABLE_VOLTAGE))
        if announce:
            self._queue(sp.Hello(watchdog_us=0))

    def connection(self) -> dict:
        """How a host reaches this device once started, as the driver's [transport] options: the port it
        opens (the pty's slave path, or the port given) and the baud rate."""
        return {"port": self.path, "baudrate": self.baudrate}

    @property
    def rx_counters(self) -> sp.DecoderCounters:
        """Frames received from the host: good ones and drops by reason."""
        return self._decoder.counters

    @property
    def target_counts(self) -> dict[str, int]:
        """Cycles in which a drive streaming CSP targets got no new one, and what it did (sim.drive_targets)."""
        return self.targets.counts.as_dict()

    @property
    def alive(self) -> bool:
        """True while both threads run."""
        return bool(self._threads) and all(t.is_alive() for t in self._threads)

    # -- the cycle (the simulator's stepping thread) --------------------------------------------------------
    def _on_cycle(self, s) -> None:
        self._follow_targets()
        sc = self.scaling
        with self._tx_cond:    # a busy line: skip this cycle's state before paying for its conversion
            line_busy = len(self._tx) >= self._state_bound()
            if line_busy:
                self.counters.tx_skipped += 1
        if not line_busy:
            self._send_state(s, sc)
        sw = s.statusword
        sw_bytes = sw.tobytes()
        if sw_bytes != self._last_sw:        # a drive changed state: did one enter FAULT?
            self._last_sw = sw_bytes
            low = sw & _FAULT_MASK
            faulted = (low == _FAULT_VALUE) | (low == _FRA_VALUE)
            for j in np.flatnonzero(faulted & ~self._faulted):
                self._queue(sp.Fault(joint=int(j), error_code=int(s.error_code[j]), statusword=int(sw[j])))
            self._faulted[:] = faulted
        now = time.monotonic()
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.heartbeat_s
            self._queue(sp.Heartbeat(time_us=int(round(s.time * 1e6))))
        if not self._tripped and now - self._last_host > self.watchdog_s and ((sw & _OE_MASK) == _OE_VALUE).any():
            self._tripped = True
            self.counters.watchdog_trips += 1
            log.error("serial device: watchdog: no frame from the host for %.3f s: quick stop", now - self._last_host)
            self.sim.set_commands(controlword=np.full(self.sim.n, cia402.CW_QUICK_STOP))

    def _follow_targets(self) -> None:
        """After a cycle, for the next: the setpoint buffer's next target, then each drive in CSP follows its
        targets (sim.drive_targets.DeviceTargets)."""
        with self._target_lock:
            self.drive_targets.after_cycle()

    def _send_state(self, s, sc: JointScaling) -> None:
        """Queue the STATE of sample s: positions and velocities in counts, currents in uA (as JointScaling
        converts them, in one pass over a preallocated buffer; JointScaling itself names what does not fit)."""
        buf = self._conv
        np.multiply(s.position, sc.counts_per_rad, out=buf[0])
        np.multiply(s.velocity, sc.counts_per_rad, out=buf[1])
        np.multiply(s.current, 1.0 / CURRENT_LSB, out=buf[2])
        np.rint(buf, out=buf)
        if np.abs(buf).max() <= INT32_MAX:      # False for NaN as well
            pos, vel, cur = buf.astype(np.int64)
        else:
            try:
                pos, vel, cur = (sc.position_to_counts(s.position), sc.velocity_to_counts(s.velocity),
                                 sc.current_to_raw(s.current))
            except WireValueError as exc:
                self.counters.unencodable += 1
                self._unsent_log.hit("serial device: state of cycle %d not sent: %s", s.cycle, exc)
                return
        self._queue(sp.State(timestamp_us=max(0, int(round((s.time - self._time_base) * 1e6))),
                             cycle=max(0, s.cycle - self._cycle_base) & 0xFFFFFFFF,
                             statusword=s.statusword.copy(), mode_display=s.mode_display.copy(),
                             error_code=s.error_code.copy(),   # the sample is reused by the next cycle
                             position=pos, velocity=vel, current=cur), skippable=True)

    def _state_bound(self) -> int:
        """STATE frames that may wait for the line. Free-running, state_queue: a busy line skips the newest, as a
        board that samples on its own clock does. Host-clocked, every cycle was asked for by a COMMAND and its STATE
        goes out (up to _MAX_QUEUED): after the process was not scheduled for a while, the COMMANDs that waited
        run their cycles back to back, and a skipped STATE would be a sample lost to identification (bridged, or a
        gap that cuts the recording) that the chain made, not the arm."""
        return _MAX_QUEUED if self.step_on_command else self.state_queue

    def _queue(self, msg: sp.Message, skippable: bool = False) -> None:
        with self._tx_cond:
            if len(self._tx) >= (self._state_bound() if skippable else _MAX_QUEUED):
                self.counters.tx_skipped += 1
                return
            self._tx.append(msg)
            self._tx_cond.notify()

    # -- threads --------------------------------------------------------------------------------------------
    def _writer(self) -> None:
        name_os_thread()
        faults, stop = self.sim.faults, self._stop
        while not stop.is_set():
            with self._tx_cond:
                if not self._tx:
                    self._tx_cond.wait(_POLL_S)
                    continue
                msg = self._tx.popleft()
            seq, self._seq = self._seq, (self._seq + 1) & 0xFFFF
            delay = faults.latency()
            if delay:
                stop.wait(delay)
            fate = faults.frame_fate()
            if fate is Fate.DROP:
                continue
            frame = sp.encode_frame(msg, seq)
            if fate is Fate.CORRUPT:
                frame = faults.corrupt(frame)
            elif fate is Fate.BAD_CRC:
                frame = frame[:-sp.CRC_SIZE] + bytes(b ^ 0xFF for b in frame[-sp.CRC_SIZE:])
            try:
                ok = self._link.write(sp.cobs_encode(frame) + b"\0", stop)
            except OSError as exc:
                ok = False
                self._io_log.hit("serial device: write failed: %s", exc)
            if ok:
                self.counters.frames_sent += 1
            elif not stop.is_set():
                self.counters.write_errors += 1

    def _reader(self) -> None:
        name_os_thread()
        while not self._stop.is_set():
            try:
                data = self._link.read()
            except OSError as exc:   # e.g. a USB adapter unplugged: keep trying, bounded by the poll period
                self._io_log.hit("serial device: read failed: %s", exc)
                self._stop.wait(_POLL_S)
                continue
            for msg in self._decoder.feed(data):
                self._handle(msg)

    def _handle(self, msg: sp.Message) -> None:
        if isinstance(msg, (sp.Command, sp.Heartbeat, sp.Hello)):
            self._last_host = time.monotonic()
            self._tripped = False
        if isinstance(msg, sp.Command):
            self._command(msg)
        elif isinstance(msg, sp.Hello):
            self.counters.hellos += 1
            lo, hi = _WATCHDOG_RANGE_S
            self.watchdog_s = self.default_watchdog_s if msg.watchdog_us == 0 else \
                min(max(msg.watchdog_us * 1e-6, lo), hi)
            n = self.sim.n
            self._queue(sp.HelloAck(cycle_period_us=int(round(self.sim.dt * 1e6)),
                                    watchdog_us=int(round(self.watchdog_s * 1e6)),
                                    counts_per_rev=np.full(n, self.counts_per_rev),
                                    gear_ratio=np.asarray(self.sim.model.gear_ratio, dtype=float)))
            if self.step_on_command:      # host-clocked: one cycle, so the host has a first STATE to start from
                self.sim.step(1)
        elif not isinstance(msg, sp.Heartbeat):
            self.counters.unexpected += 1

    def _command(self, msg: sp.Command) -> None:
        n = msg.controlword.shape[0]
        if n != self.sim.n:
            self.counters.rejected += 1
            self._refused_log.hit("serial device: COMMAND for %d joints refused (the arm has %d)", n, self.sim.n)
            return
        sc = self.scaling
        target, torque = sc.counts_to_position(msg.target_position), sc.raw_to_torque(msg.target_torque)
        offset = sc.raw_to_torque(msg.torque_offset)
        refusal = target_refusal(target, torque, *self._limits, self.sim.model.joint_names, offset=offset)
        if refusal is not None:
            self.counters.rejected += 1
            self.counters.out_of_limits += 1
            self.last_refusal = refusal
            self._refused_log.hit("serial device: COMMAND refused: %s", refusal)
            return
        with self._target_lock:
            try:
                self.drive_targets.arrived(msg.controlword, msg.mode, target, torque, offset)
            except InputError as exc:
                self.counters.rejected += 1
                self.last_refusal = str(exc)
                self._refused_log.hit("serial device: COMMAND refused: %s", exc)
                return
        if self.step_on_command:
            self.sim.step(1)
