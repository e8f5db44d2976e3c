"""The `serial` transport: the joint boards' microcontroller on a serial line (firmware_bridge.serial_protocol,
pyserial).

    arm = SerialArm(model, port="/dev/ttyACM0", baudrate=3_000_000)
    arm.open()            # HELLO -> HELLO_ACK: joints, encoder counts per rev and gear ratios checked against
                          # the model; then a reader thread decodes the device's frames
    ... the cycle: read(state) -> the newest STATE in SI; write(command) -> one COMMAND frame ...

Threads: the link thread reads and decodes the port (pyserial), converts each STATE to SI into a preallocated
buffer (counts -> rad with the gear ratios and encoder resolution of HELLO_ACK, uA -> A, A -> N m with the
model's gear ratio * torque constant), sends a HEARTBEAT when the cycle has sent no COMMAND for heartbeat_s,
and, when the port vanishes (the device unplugged, its process killed, the pty closed), reopens `port` every
reconnect_s and handshakes again. The cycle thread writes the COMMAND frame itself (a non-blocking write of
~100 bytes; each frame starts with a 0x00 so a partial write never spoils the next one).

While the link is down, read() and write() raise driver.hal.LinkError (the cycle trips: quick stop, fault,
health event); once a device answers again at `port`, fault_reset + enable recover without a restart.
Bad frames are dropped and counted by reason (link_stats); FAULT frames are counted and the last one is kept.
"""
from __future__ import annotations

import logging
import math
import os
import select
import struct
import threading
import time

import numpy as np
import serial

from driver.hal import Arm, ArmCommand, ArmState, LinkError, bad_drive_text, first_bad_drive, raw_to_si
from firmware_bridge.runtime.rt_timing import name_os_thread
from driver.transports.link_pump import LinkPump
from driver.transports.sample_ring import StateRing
from driver.transports.serial_frames import STATE, CommandEncoder, FrameSplitter
from firmware_bridge import serial_protocol as sp
from firmware_bridge.units import CURRENT_LSB, ENCODER_COUNTS_PER_REV, JointScaling, WireValueError
from firmware_bridge.runtime.errors import InputError
from firmware_bridge.runtime.options import Option, OptionSet, plain
from firmware_bridge.runtime.log_throttle import Throttle

_READ_POLL_S = 0.05          # the link thread's longest block in read (it then looks at its stop flag)
_JOIN_S = 2.0
_GEAR_RTOL = 1e-9            # HELLO_ACK's gear ratios (float64 on the wire) must be the model's
_STATE_FIXED = struct.Struct("<QI")   # STATE's timestamp_us, cycle, after the header (serial_protocol's record)
_STATE_FIXED_AT = sp.HEADER.size
_WRAP_HIGH, _WRAP_LOW = 0xF0000000, 0x10000000   # a cycle counter from above the first to below the second wrapped
SAMPLE_RING = 32             # STATEs kept for the cycle: it reads each once, in order (32 ms at 1 kHz)
_PUMP_HOLD_S = 0.1           # the link thread leaves the port to a cycle that pumped it this recently
_log = logging.getLogger(__name__)
TROUBLE_LOG_INTERVAL_S = 10.0   # bad frames, FAULT frames, failed handshakes: one line per interval, with a count
_STANDBY_S = 0.01            # the link thread's wake-up period meanwhile (heartbeats, a device restart)


class SerialOptionError(InputError):
    """A [transport] option of the serial transport that cannot be used."""


SERIAL_OPTIONS = OptionSet(
    "serial",
    Option("port", "text", required=True, what="a device path or pyserial URL",
           doc="device path or pyserial URL, e.g. /dev/ttyACM0; a udev symlink survives re-plugging"),
    Option("baudrate", "integer", 3_000_000, low=50, high=100_000_000, unit="bit/s",
           doc="line rate (ignored by USB CDC and ptys); a 6-joint STATE is 127 bytes, 1.27 Mbit/s at 1 kHz"),
    Option("counts_per_rev", "integer", ENCODER_COUNTS_PER_REV, low=1, high=2 ** 32 - 1,
           doc="motor encoder counts per motor revolution; HELLO_ACK must report the same"),
    Option("device_watchdog_ms", "number", sp.DEFAULT_WATCHDOG_US / 1000, low=1, high=10_000, unit="ms",
           doc="asked for in HELLO: host silence after which the board quick-stops the drives"),
    Option("heartbeat_ms", "number", None, low=0.1, high=5_000, unit="ms", nullable=True,
           doc="a HEARTBEAT goes out when no COMMAND did for this long (left out: device_watchdog_ms / 4; at most "
               "half of it)"),
    Option("handshake_timeout_s", "number", 1.0, low=0.01, high=60, unit="s",
           doc="how long opening (and each reconnection) waits for HELLO_ACK"),
    Option("reconnect_s", "number", 0.2, low=0.01, high=60, unit="s",
           doc="while the port is gone, reopen it this often"),
    error=SerialOptionError)


def _reasons(counters: sp.DecoderCounters) -> str:
    """The drop counters that are not zero, e.g. "crc 12, cobs 1" (for a log line)."""
    return ", ".join(f"{r} {getattr(counters, r)}" for r in sp.DROP_REASONS if getattr(counters, r))


class _Session:
    """One open, handshaken connection: the pyserial port, its decoder and frame numbering, the device's
    settings from HELLO_ACK and the scaling built from them; the per-cycle frames' preallocated codecs
    (driver/transports/serial_frames.py)."""

    def __init__(self, port: serial.Serial, ack: sp.HelloAck, scaling: JointScaling, decoder: sp.StreamDecoder,
                 encoder: sp.FrameEncoder):
        self.port, self.ack, self.scaling, self.decoder, self.encoder = port, ack, scaling, decoder, encoder
        n = scaling.n
        self.splitter = FrameSplitter(n, decoder)
        self.commands = CommandEncoder(n, scaling.counts_per_rad)
        joints = self.splitter.joints
        self.columns = tuple(joints[name] for name in ("statusword", "mode_display", "error_code", "position",
                                                        "velocity", "current"))
        self.last_cycle: int | None = None      # the device's cycle counter in the newest STATE
        self.pending = b""                      # bytes that came with HELLO_ACK, after it (a first STATE)
        self.backwards = decoder.counters.backwards
        self.dropped = decoder.counters.dropped  # frames dropped, as last logged
        self.restart: str | None = None         # why the device is seen to have restarted
        try:
            self._fd: int | None = port.fileno()
        except (AttributeError, OSError, ValueError, serial.SerialException):
            self._fd = None          # a URL port (socket://, rfc2217://): pyserial's own write

    def read(self, timeout_s: float = _READ_POLL_S) -> bytes:
        """What arrived, waiting at most timeout_s: one select and one read per burst (pyserial's read asks
        for a byte count first; this halves the system calls per frame). OSError / SerialException when the
        port is gone."""
        if self._fd is None:
            return self.port.read(max(1, self.port.in_waiting))
        ready, _, _ = select.select((self._fd,), (), (), timeout_s)
        if not ready:
            return b""
        try:
            data = os.read(self._fd, 4096)
        except (BlockingIOError, InterruptedError):
            return b""
        if not data:    # readable but empty: the other end is gone (as pyserial reports it)
            raise serial.SerialException("device reports readiness to read but returned no data (disconnected)")
        return data

    def write(self, data: bytes) -> int:
        """Write what the line takes now, never waiting (pyserial's write_timeout=0 spins while the line is
        full): the bytes written; a partial frame is cut off by the 0x00 that starts the next one."""
        if self._fd is None:
            return self.port.write(data)
        try:
            return os.write(self._fd, data)
        except (BlockingIOError, InterruptedError):
            return 0


class SerialArm(Arm):
    """Arm over the serial joint-board link: the device streams STATEs on its own clock (wait_new), the cycle may
    read the port itself while it waits (pump_new, pump_for), and every STATE is kept until read (backlog).

    SerialArm(model, port, **options): the options are SERIAL_OPTIONS (docs/reference/driver-config.md).
    """

    streams_on_own_clock = True
    cycle_reads_link = True
    keeps_every_sample = True
    OPTION_SPEC = SERIAL_OPTIONS

    def __init__(self, model, port: str | None = None, **options):
        if port is not None:
            options["port"] = port
        opts = SERIAL_OPTIONS.parse(options)
        self.model, self.n, self.port = model, model.n, opts.port
        first_bad_drive(np.zeros(model.n, np.uint16), np.zeros(model.n, np.int8))   # compile or load it now
        self.baudrate, self.counts_per_rev = opts.baudrate, opts.counts_per_rev
        self.device_watchdog_s = opts.device_watchdog_ms / 1000
        hb = self.device_watchdog_s * 250 if opts.heartbeat_ms is None else opts.heartbeat_ms
        if not 0.1 <= hb <= opts.device_watchdog_ms / 2:
            raise SERIAL_OPTIONS.fail("heartbeat_ms", f"a number of ms in 0.1..{plain(opts.device_watchdog_ms / 2)} "
                                                   f"(half of device_watchdog_ms)", hb)
        self.heartbeat_s = hb / 1000
        self.handshake_timeout_s = float(opts.handshake_timeout_s)
        self.reconnect_s = float(opts.reconnect_s)
        self._torque_per_amp = np.asarray(model.joint_torque_per_amp(), dtype=float)
        n = self.n
        # the samples, written by the link thread into a ring, each copied out once by read() (under _lock)
        self._lock = threading.Lock()
        self._ring = StateRing(n, SAMPLE_RING)
        self._pending: str | None = None    # an error read() reports once (a device restart handled meanwhile)
        self._tx_lock = threading.Lock()   # the port's writers: the cycle (COMMAND) and the link thread
        # the port's reader: the cycle while it pumps, else the link thread (driver/transports/link_pump.py)
        self._link = LinkPump(self._ring.has_unread, _PUMP_HOLD_S)
        self._session: _Session | None = None
        self._down: str | None = "not open"   # why the link is down; None while up
        self._last_tx = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._past = sp.DecoderCounters()      # decoder counters of the sessions that ended
        self.stats = {"states": 0, "commands": 0, "heartbeats_sent": 0, "heartbeats_received": 0,
                      "fault_frames": 0, "unexpected": 0, "wrong_joints": 0, "tx_incomplete": 0,
                      "link_losses": 0, "reconnects": 0, "handshake_failures": 0, "device_restarts": 0,
                      "bad_states": 0}
        self.last_fault: dict | None = None
        self.last_error: str | None = None
        self._bad_frames = Throttle(_log, logging.WARNING, TROUBLE_LOG_INTERVAL_S)
        self._bad_states = Throttle(_log, logging.WARNING, TROUBLE_LOG_INTERVAL_S)
        self._fault_frames = Throttle(_log, logging.ERROR, TROUBLE_LOG_INTERVAL_S)
        self._handshakes = Throttle(_log, logging.WARNING, TROUBLE_LOG_INTERVAL_S)

    # -- Arm -----------------------------------------------------------------------------------------
    def open(self) -> None:
        """Open the port, handshake, start the link thread. LinkError naming the port when it fails."""
        if self._thread is not None:
            return
        self._install(self._connect())
        _log.info("serial port %s opened: %d joints, device cycle %d us", self.port, self.n,
                  self._session.ack.cycle_period_us, extra={"port": self.port})
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="armid-serial-link", daemon=True)
        self._thread.start()

    def check_reachable(self) -> None:
        """A port given as a path must exist (a URL such as socket:// is left to open())."""
        if "://" not in self.port and not os.path.exists(self.port):
            raise LinkError(f"serial port {self.port}: cannot open: no such file or device")

    def close(self) -> None:
        """Stop the link thread (bounded) and close the port. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(_JOIN_S)
            self._thread = None
        self._drop_session("closed")
        for throttle in (self._bad_frames, self._bad_states, self._fault_frames, self._handshakes):
            throttle.flush()

    @property
    def link_thread_id(self) -> int | None:
        """The link thread's native (kernel) thread id while it runs ([realtime] threads = ["serial-link"])."""
        t = self._thread
        return None if t is None or not t.is_alive() else t.native_id

    def begin_cycle(self) -> None:
        pass

    def read(self, out: ArmState) -> bool:
        """Copy the oldest STATE (SI) not read yet into out and return True; when every STATE has been read,
        copy the newest again and return False. Every STATE is read once and in order unless more than
        SAMPLE_RING of them wait (the oldest are then overwritten and counted: samples_overwritten). LinkError
        while the port is gone."""
        down = self._down
        if down is not None:
            self._pending = None           # reported now
            raise LinkError(down)
        pending = self._pending
        if pending is not None:
            self._pending = None
            raise LinkError(pending)
        with self._lock:
            return self._ring.take(out)

    def lost_samples(self) -> int:
        """Device samples lost so far (overwritten unread in the ring)."""
        return self._ring.overwritten

    def backlog(self) -> int:
        """STATEs that arrived and have not been read (at most SAMPLE_RING are kept)."""
        return self._ring.unread()

    def write(self, command: ArmCommand) -> None:
        """Send one COMMAND frame (targets converted to counts and mN m). LinkError while the port is gone or
        when a target cannot be sent (never clipped, never NaN)."""
        s = self._session
        if self._down is not None or s is None:
            raise LinkError(self._down or "not open")
        self._send(s, command, "commands")

    def link_stats(self) -> dict:
        """Frames and drops by reason (all sessions), handshakes, reconnections, the last FAULT frame."""
        s = self._session
        total = sp.DecoderCounters()
        total.add(self._past)
        if s is not None:
            total.add(s.decoder.counters)
        dec = total.as_dict()
        return {"transport": "serial", "port": self.port, "connected": self._down is None,
                "down_reason": self._down, **self.stats,
                "samples_overwritten": self._ring.overwritten, "rx": dec,
                "rx_dropped": sum(dec[r] for r in sp.DROP_REASONS),
                "last_fault": self.last_fault, "last_error": self.last_error,
                "device_cycle_us": None if s is None else s.ack.cycle_period_us,
                "device_watchdog_us": None if s is None else s.ack.watchdog_us}

    # -- connection ----------------------------------------------------------------------------------
    def _connect(self) -> _Session:
        """Open the port and handshake (bounded by handshake_timeout_s); LinkError naming what failed."""
        try:
            port = serial.serial_for_url(self.port, baudrate=self.baudrate, timeout=_READ_POLL_S, write_timeout=0,
                                         exclusive=True)
        except (serial.SerialException, OSError, ValueError) as exc:
            raise LinkError(f"serial port {self.port}: cannot open: {exc}") from None
        try:
            return self._handshake(port)
        except LinkError:
            port.close()
            raise

    def _handshake(self, port: serial.Serial) -> _Session:
        """HELLO -> HELLO_ACK on an open port (at open, at a reconnection, after a device restart), with a
        new decoder and frame numbering; LinkError naming what failed (the port stays open)."""
        try:
            port.reset_input_buffer()
            decoder, encoder = sp.StreamDecoder(), sp.FrameEncoder()
            port.write(b"\0" + encoder.encode(sp.Hello(watchdog_us=int(round(self.device_watchdog_s * 1e6)))))
            deadline = time.monotonic() + self.handshake_timeout_s
            while time.monotonic() < deadline:
                data = port.read(max(1, port.in_waiting))
                start = 0
                while start < len(data):           # frame by frame: what follows HELLO_ACK belongs to the session
                    end = data.find(b"\0", start)
                    end = len(data) if end < 0 else end + 1
                    for msg in decoder.feed(data[start:end]):
                        if isinstance(msg, sp.HelloAck):
                            session = _Session(port, msg, self._check_ack(msg), decoder, encoder)
                            session.pending = data[end:]
                            return session
                    start = end
            version = "" if decoder.other_version is None else \
                f" (it speaks protocol version {decoder.other_version}, this host {sp.VERSION})"
            raise LinkError(f"serial port {self.port}: no HELLO_ACK within {self.handshake_timeout_s:g} s{version}; "
                            f"{decoder.counters.frames} frames received, {decoder.counters.dropped} dropped")
        except (serial.SerialException, OSError) as exc:
            raise LinkError(f"serial port {self.port}: handshake failed: {exc}") from None

    def _check_ack(self, ack: sp.HelloAck) -> JointScaling:
        """The scaling of the device's HELLO_ACK, after checking it against the model and the options."""
        where = f"serial port {self.port}: HELLO_ACK"
        n = ack.counts_per_rev.shape[0]
        if n != self.n:
            raise LinkError(f"{where}: the device has {n} joints, the model {self.model.name} has {self.n}")
        for j in range(n):
            if int(ack.counts_per_rev[j]) != self.counts_per_rev:
                raise LinkError(f"{where}: joint {j + 1}: encoder has {int(ack.counts_per_rev[j])} counts per rev, "
                                f"the transport option counts_per_rev is {self.counts_per_rev}")
            g, m = float(ack.gear_ratio[j]), float(self.model.gear_ratio[j])
            if not math.isclose(g, m, rel_tol=_GEAR_RTOL):
                raise LinkError(f"{where}: joint {j + 1}: gear ratio {g!r} on the device, {m!r} in the model "
                                f"{self.model.name}")
        return JointScaling.from_gear(ack.gear_ratio, self.counts_per_rev)

    def _install(self, session: _Session) -> None:
        with self._lock:                  # samples of an earlier session are not new data for this one
            self._ring.skip_unread()
        if session.pending:               # a device that answers HELLO with HELLO_ACK and its first STATE at once:
            self._ingest(session, session.pending)   # that STATE is new data (no one else sees the session yet)
            session.pending = b""
        with self._tx_lock:
            self._session = session
            self._last_tx = time.monotonic()
        self._down = None

    def _drop_session(self, reason: str, close: bool = True) -> _Session | None:
        """Mark the link down (reason: what read/write report) and close the port (unless close is False);
        the session that was up, if any."""
        with self._tx_lock:
            s, self._session = self._session, None
            self._down = reason
        if s is not None:
            self._past.add(s.decoder.counters)
        if s is not None and close:
            try:
                s.port.close()
            except (serial.SerialException, OSError):
                pass
        return s

    def _lost(self, session: _Session, exc: BaseException) -> None:
        if self._session is not session:
            return
        self.stats["link_losses"] += 1
        self.last_error = f"serial port {self.port} lost: {exc}"
        _log.error("%s; reconnecting every %g s", self.last_error, self.reconnect_s, extra={"port": self.port})
        self._drop_session(f"{self.last_error}; reconnecting every {self.reconnect_s:g} s")

    def _send(self, s: _Session, msg: sp.Message | ArmCommand, counter: str) -> None:
        """Write one frame (0x00 first, then the frame) without blocking; LinkError if the port is gone or
        the command cannot be sent. An ArmCommand goes through the session's preallocated COMMAND encoder."""
        with self._tx_lock:
            if self._session is not s:
                raise LinkError(self._down or "not open")
            if isinstance(msg, ArmCommand):
                try:
                    data = s.commands.encode(s.encoder.seq, msg)
                except WireValueError as exc:
                    raise LinkError(f"serial port {self.port}: command not sent: {exc}") from None
                s.encoder.seq = (s.encoder.seq + 1) & 0xFFFF
            else:
                data = b"\0" + s.encoder.encode(msg)
            error = None
            try:
                sent = s.write(data)
            except (serial.SerialException, OSError) as exc:
                error = exc
            else:
                self._last_tx = time.monotonic()
                self.stats[counter] += 1
                if sent != len(data):
                    self.stats["tx_incomplete"] += 1
        if error is not None:
            self._lost(s, error)
            raise LinkError(self.last_error)

    def pump_new(self, timeout_s: float) -> bool:
        """Read and decode the port in the calling thread until a STATE not read yet is there (True) or
        timeout_s (s) passes (False): the device clock's wait with one wake-up per burst of the line, where
        wait_new takes two (the link thread's, then the cycle's) and a hand-over of the interpreter. The link
        thread leaves the port alone while the cycle pumps (it still sends heartbeats, handles a device restart
        and reconnects); while the link is down or the link thread is reading, this is wait_new."""
        return self._link.pump_new(self._read_port if self._pumpable() else None, timeout_s)

    def pump_for(self, timeout_s: float) -> bool:
        """Read and decode the port in the calling thread for timeout_s (s), whatever arrives: the host clock's
        wait for its deadline, so that a late answer is taken (and stamped) when it arrives. False at once when
        it cannot (the link down, the link thread reading): the caller then sleeps instead."""
        return self._link.pump_for(self._read_port if self._pumpable() else None, timeout_s)

    def _pumpable(self) -> bool:
        """The cycle may read the port: a session is up on a file descriptor (a URL port, which pyserial reads
        itself, is left to the link thread)."""
        s = self._session
        return s is not None and s._fd is not None

    def _read_port(self, timeout_s: float, until_new: bool) -> None:
        """The pump's reading loop (the caller holds the reader lock): decode what arrives for timeout_s (s), or
        until a STATE not read yet is there (until_new); the port failing is the link lost."""
        s = self._session
        if s is None:
            return
        try:
            end = time.perf_counter() + timeout_s
            while self._session is s and s.restart is None:
                self._ingest(s, s.read(max(0.0, end - time.perf_counter())))
                if (until_new and self._ring.has_unread()) or time.perf_counter() >= end:
                    break
        except (serial.SerialException, OSError, TypeError) as exc:   # TypeError: pyserial on a closed fd
            self._lost(s, exc)

    def _ingest(self, s: _Session, data: bytes) -> None:
        """Decode what the port gave: STATEs into the ring, the other frames counted; a device restart noted."""
        host_ns = time.time_ns()
        for kind, value in s.splitter.feed(data):
            if kind is STATE:
                self._store(s, host_ns)
            else:
                self._handle(s, value, host_ns)
        dropped = s.decoder.counters.dropped
        if dropped != s.dropped:
            self._bad_frames.hit("serial port %s: bad frames dropped (this connection, by reason: %s)", self.port,
                                 _reasons(s.decoder.counters),
                                 count=dropped - s.dropped, port=self.port)
            s.dropped = dropped
        if s.decoder.counters.backwards != s.backwards and s.restart is None:
            s.restart = "its frame sequence numbers went backwards"

    # -- the link thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        name_os_thread()
        while not self._stop.is_set():
            s = self._session
            if s is None:
                self._reconnect()
                continue
            if self._link.cycle_reads():        # the cycle reads the port (pump_new, pump_for)
                if s.restart is None:
                    self._stop.wait(_STANDBY_S)
            else:
                with self._link.reader:
                    try:
                        self._ingest(s, s.read())
                    except (serial.SerialException, OSError, TypeError) as exc:   # TypeError: pyserial, closed fd
                        self._lost(s, exc)
                        continue
            if s.restart is not None:
                with self._link.reader:
                    self._device_restarted(s)
                continue
            if time.monotonic() - self._last_tx >= self.heartbeat_s:
                try:
                    self._send(s, sp.Heartbeat(time_us=time.monotonic_ns() // 1000), "heartbeats_sent")
                except LinkError:
                    pass

    def _device_restarted(self, s: _Session) -> None:
        """The device rebooted behind a port that stayed open: report it once to the cycle (read raises
        LinkError: quick stop, fault, health event), handshake again on the same port (a reboot forgets the
        host watchdog of HELLO; the new HELLO_ACK is checked against the model again)."""
        self.stats["device_restarts"] += 1
        self.last_error = f"serial port {self.port}: the device restarted ({s.restart})"
        _log.warning("%s; handshaking again", self.last_error, extra={"port": self.port})
        self._pending = f"{self.last_error}; handshaking again"
        self._drop_session(self._pending, close=False)
        try:
            session = self._handshake(s.port)
        except LinkError as exc:          # no answer: close the port; the reconnection loop takes over
            self.stats["handshake_failures"] += 1
            self.last_error = str(exc)
            self._down = f"{exc}; reconnecting every {self.reconnect_s:g} s"
            try:
                s.port.close()
            except (serial.SerialException, OSError):
                pass
            return
        self._install(session)

    def _reconnect(self) -> None:
        if self._stop.wait(self.reconnect_s):
            return
        try:
            session = self._connect()
        except LinkError as exc:
            self.stats["handshake_failures"] += 1
            self.last_error = str(exc)
            self._handshakes.hit("serial port %s: reconnecting: %s", self.port, exc, port=self.port)
            return
        self.stats["reconnects"] += 1
        self._install(session)
        _log.info("serial port %s: reconnected", self.port, extra={"port": self.port})

    def _handle(self, s: _Session, msg: sp.Message, host_ns: int) -> None:
        if isinstance(msg, sp.State):      # a well-formed STATE for n joints takes the splitter's fast path
            self.stats["wrong_joints"] += 1
        elif isinstance(msg, sp.Heartbeat):
            self.stats["heartbeats_received"] += 1
        elif isinstance(msg, sp.Fault):
            self.stats["fault_frames"] += 1
            self.last_fault = {"joint": msg.joint + 1, "error_code": f"0x{msg.error_code:04X}",
                               "statusword": f"0x{msg.statusword:04X}", "time": time.time()}
            self._fault_frames.hit("serial port %s: FAULT frame: joint %d, error code %s", self.port, msg.joint + 1,
                                   self.last_fault["error_code"], joint=msg.joint + 1,
                                   error_code=self.last_fault["error_code"], port=self.port)
        elif isinstance(msg, sp.Hello):          # a device announcing itself after a reboot
            s.restart = "it sent HELLO"
        elif not isinstance(msg, sp.HelloAck):   # a late answer to our HELLO is harmless
            self.stats["unexpected"] += 1

    def _store(self, s: _Session, host_ns: int) -> None:
        """The splitter's STATE record (wire units) -> the next slot of the sample ring (SI); a device cycle counter
        that goes backwards (not a wrap of its 32 bits) is a device restart."""
        timestamp_us, cycle = _STATE_FIXED.unpack_from(s.splitter.raw, _STATE_FIXED_AT)
        last = s.last_cycle
        if last is not None and cycle < last and not (last > _WRAP_HIGH and cycle < _WRAP_LOW):
            s.restart = f"its cycle counter went back from {last} to {cycle}"
        s.last_cycle = cycle
        sw, mode, err, pos, vel, cur = s.columns
        bad = first_bad_drive(sw, mode)
        if bad >= 0:          # counted and dropped, never turned into numbers (as CAN and the gateway do)
            self.stats["bad_states"] += 1
            self.last_error = f"STATE dropped: {bad_drive_text(bad, sw, mode)}"
            self._bad_states.hit("serial port %s: %s", self.port, self.last_error, port=self.port)
            return
        with self._lock:
            new = self._ring.next_slot()
            new.device_time_ns = timestamp_us * 1000
            new.host_time_ns = host_ns
            raw_to_si(pos, vel, cur, sw, err, mode, s.scaling.counts_per_rad, CURRENT_LSB, self._torque_per_amp,
                      new.floats, new.words, new.mode)
            self._ring.commit()
        self._link.notify()
        self.stats["states"] += 1

    def wait_new(self, timeout_s: float) -> bool:
        """Block until a STATE not read yet is there (True) or timeout_s (s) passes (False): the cycle's
        "device" clock, and the host clock's wait for the answer to its COMMAND."""
        return self._link.wait(timeout_s)
