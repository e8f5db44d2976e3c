"""The `gateway` transport: EtherCAT drives behind a Modbus TCP gateway (docs/reference/wire-gateway.md), spoken with
pymodbus's sync client.

    arm = GatewayArm(model, host="192.168.10.20", port=502, watchdog_ms=100)

One persistent connection (TCP_NODELAY) carries the exchanges. With function 23 (below) the cycle thread runs
them itself, pipelined: write() sends this cycle's command in one request without waiting, and the next cycle's
begin_cycle() takes its answer, which a period later is normally already there. So a cycle wakes one thread, not
two, with no hand-over of the interpreter, and the command still leaves the moment the cycle computed it. An
answer that is late is waited for up to ANSWER_WAIT_S (so the cycle follows a link slightly slower than itself
instead of dropping targets); beyond that the cycle hands the exchanges to the link thread (counted: handovers)
and goes on, stale, and the link thread waits for the answer up to timeout_ms, sends the commands queued
meanwhile, each waited for, and gives the exchanges back. The link thread ("armid-gateway-link") also opens and
reopens the connection, and does the exchanges when the cycle does not (functions 16 + 4, before the cycle
starts, or after IDLE_EXCHANGE_S without a cycle). There, round_trip_ms is a
request's true round trip; in the pipelined exchanges it is the time from the request to the next cycle's
start, at least the time the answer took. One
exchange is one write of the whole holding image (function 16, which also re-arms the gateway's host
watchdog) and one read of the whole input image (function 4). Every command is sent once and in order, one
per exchange, as serial sends every COMMAND and CAN every cycle's RPDOs: write() queues it and wakes the link
(begin_cycle wakes it only until the first command, so that samples come in before there is anything to
write). With the gateway in step with the exchanges (the simulated gateway's step_on_exchange, a real gateway's
cycle following the master's process data) a target skipped would be a torque kick, so a link that falls
behind (a slow round trip, a stalled thread) catches up by sending the queued commands back to back; only
beyond COMMAND_QUEUE queued does it drop the oldest (counted: superseded_commands), and after a reconnection
only the newest goes out. An exchange without a new command (the cycle late by more than IDLE_EXCHANGE_S) only
reads (idle_reads): re-sending the last command would re-arm the gateway's watchdog without the cycle, and give
such a gateway a cycle on a stale target. A gateway that mirrors its input image in holding registers
(gw.INPUT_MIRROR_BASE; checked at connect) gets both in one request, function 23 (read/write multiple
registers: the write is applied first), which halves the requests and the round trips; pymodbus's sync client
costs less CPU per request than its asyncio client (benchmarks/bench_gateway.py measures both). The function-23
request and response are pymodbus PDU subclasses that pack and unpack the words in one call each
(_ExchangeRequest, _ExchangeResponse, registered with the client's decoder), and the images go through the
codec's numba kernels into preallocated buffers (gw.encode_outputs_into, gw.decode_inputs_into): docs/design/decisions.md,
"The gateway: a pipelined exchange through pymodbus".

The cycle waits for the network at most ANSWER_WAIT_S. Each new image (a cycle counter not seen before) is converted into the
next slot of a ring (SAMPLE_RING); read() returns the oldest not read yet, and backlog() says how many wait, so
that two images between two cycles are both published, in order (driver.cycle's catch-up, as for serial and
CAN). A Modbus round trip costs a large part of a 1 kHz period, so some cycles see no new image: read() returns
False for them (the cycle flags them stale), nothing is invented.

Commands that must not be lost: a controlword with the fault-reset bit (7) in a command dropped unsent is
latched into the next command sent, so that the drives still see its rising edge.

Faults: a refused or dropped TCP connection marks the link down, read() raises LinkError naming the
gateway and the cause, and the link thread reconnects every reconnect_ms; a response that does not come
within timeout_ms is counted, the connection is reopened (stale responses never pair with a later
request) and the sample goes stale (a gateway that answers nothing at all leaves every cycle stale, and the
cycle's watchdog trips); an image that fails decoding (wrong layout version, drive count,
impossible field, a statusword that is no CiA 402 state, a mode display that is no mode) is counted and
dropped; the gateway's host-watchdog bit (it has quick-stopped the drives)
raises LinkError once. link_stats() reports every counter and the exchange round trips.
"""
from __future__ import annotations

import asyncio
import logging
import math
import select
import socket
import struct
import threading
import time

import numba
import numpy as np
from pymodbus.client import ModbusTcpClient
from pymodbus.exceptions import ConnectionException, ModbusException, ModbusIOException
from pymodbus.pdu.register_message import ReadWriteMultipleRegistersRequest, ReadWriteMultipleRegistersResponse

from driver.hal import (OFFSET_MNM, Arm, ArmCommand, ArmState, LinkError, bad_drive_text, command_to_wire,
                        first_bad_drive, raw_to_si, unsendable)
from firmware_bridge.runtime.rt_timing import name_os_thread
from driver.transports.sample_ring import StateRing
from firmware_bridge import cia402
from firmware_bridge import gateway as gw
from firmware_bridge.units import CURRENT_LSB, ENCODER_COUNTS_PER_REV, JointScaling
from firmware_bridge.runtime.errors import InputError
from firmware_bridge.runtime.options import Option, OptionSet, Values
from firmware_bridge.runtime.log_throttle import Throttle

ROUND_TRIP_WINDOW = 1024        # exchanges kept for the round-trip percentiles
IDLE_EXCHANGE_S = 0.02          # without cycles (before the cycle starts), exchange at least this often
ANSWER_WAIT_S = 0.01            # the longest the cycle waits for a late answer; then the link thread takes over
COMMAND_QUEUE = 8               # commands kept for the link, sent in order (a link further behind drops the oldest)
SAMPLE_RING = 64                # decoded images kept for the cycle, read in order (64 ms at 1 kHz)
_FAULT_RESET_BIT = 0x0080
# pymodbus logs every lost response and refused connection at ERROR; our counters, the health topic and this
# module's rate-limited lines report them, so without a logging configuration of the application they do not go
# to stderr (armid.logs keeps pymodbus's records out unless the level is DEBUG)
logging.getLogger("pymodbus").addHandler(logging.NullHandler())
_log = logging.getLogger(__name__)
TROUBLE_LOG_INTERVAL_S = 10.0   # bad images, lost connections, timeouts: one line per interval, with a count
_U32 = 1 << 32


GATEWAY_OPTIONS = OptionSet(
    "gateway",
    Option("host", "text", required=True, what="the gateway's IP address or host name",
           doc="the gateway's address"),
    Option("port", "integer", 502, low=1, high=65535, doc="its Modbus TCP port"),
    Option("device_id", "integer", 1, low=0, high=255, doc="the Modbus unit id (gateways of this layout ignore it)"),
    Option("timeout_ms", "number", 100.0, low=1, high=10_000, unit="ms",
           doc="how long one request waits for its response"),
    Option("watchdog_ms", "integer", 100, low=1, high=65535, unit="ms",
           doc="the host-watchdog time written to the gateway at connect: it quick-stops the drives when no write "
               "came for this long"),
    Option("reconnect_ms", "number", 500.0, low=1, high=60_000, unit="ms",
           doc="the pause between reconnection attempts"),
    Option("handshake_timeout_ms", "number", 2000.0, low=1, high=600_000, unit="ms",
           doc="how long open() keeps asking a gateway that accepted the connection but did not answer (one that "
               "is still booting, a loaded host), each attempt waiting timeout_ms"),
    Option("counts_per_rev", "integer", ENCODER_COUNTS_PER_REV, low=1, high=2 ** 31 - 1,
           doc="the motor encoders' resolution (counts per motor revolution)"))


def gateway_options(**options) -> Values:
    """The transport's options from the config's keywords (GATEWAY_OPTIONS), as attributes (.host, .port, ...);
    InputError naming the option otherwise."""
    opts = GATEWAY_OPTIONS.parse(options)
    for key in ("timeout_ms", "reconnect_ms", "handshake_timeout_ms"):
        opts[key] = float(opts[key])
    return opts


class _NoAnswer(Exception):
    """The gateway accepted the connection but did not answer within timeout_ms."""


@numba.njit(cache=True, nogil=True)
def _keep_command(controlword, mode, target_position, target_torque, torque_offset, cw_out, mode_out, position_out,
                  torque_out, offset_out):
    """write()'s copy of a command into the queue (one call instead of five numpy calls per cycle)."""
    for j in range(controlword.shape[0]):
        cw_out[j] = controlword[j]
        mode_out[j] = mode[j]
        position_out[j] = target_position[j]
        torque_out[j] = target_torque[j]
        offset_out[j] = torque_offset[j]


_CW_FAULT_RESET = int(cia402.CW_FAULT_RESET)
# the rows of the holding image's drive values (gw.encode_outputs_into), as _command_fields fills them
assert tuple(f.name for f in gw.HOLDING_DRIVE) == ("controlword", "mode", "target_position", "target_torque",
                                                  "torque_offset")
_OFFSET_MAX = gw.HOLDING_DRIVE[4].bounds[1]


@numba.njit(cache=True, nogil=True)
def _command_fields(controlword, mode, target_position, target_torque, torque_offset, counts_per_rad, offset_per_nm,
                    reset_latch, latched, fields):
    """The kept command in wire units into fields (5, n) int64 (controlword, mode, target position in counts,
    target torque and torque offset in mN m: driver.hal.command_to_wire), a latched fault reset (reset_latch, cleared once a command
    carries it) standing in for a controlword without the reset bit (latched (n,): the controlwords sent). -1, or
    the first joint whose target is not finite or does not fit int32 (nothing of it is to be sent, and the latch
    waits for the next command)."""
    for j in range(controlword.shape[0]):
        cw = controlword[j]
        latched[j] = _CW_FAULT_RESET if reset_latch[j] and not cw & _FAULT_RESET_BIT else cw
    bad = command_to_wire(latched, mode, target_position, target_torque, torque_offset, counts_per_rad, offset_per_nm,
                          _OFFSET_MAX, fields[0], fields[1], fields[2], fields[3], fields[4])
    if bad < 0:
        reset_latch[:] = False
    return bad


class _Tick:
    """A wake-up for the link thread that collapses (set() any number of times, one wait() returns and consumes
    it), made of one C lock (held while nothing is pending): threading.Event's wait and set are Python code
    (a Condition, a new lock per wait), a few us on both threads at every exchange."""

    def __init__(self):
        self._pending = threading.Lock()
        self._pending.acquire()

    def set(self) -> None:
        """Make the next wait() return at once (or wake the one waiting); nothing more when already pending."""
        if self._pending.locked():
            try:
                self._pending.release()
            except RuntimeError:  # another set() came first
                pass

    def wait(self, timeout: float) -> bool:
        """Wait at most timeout s for a set(); True (and consumed) if there was one."""
        return self._pending.acquire(timeout=timeout)


class _ExchangeRequest(ReadWriteMultipleRegistersRequest):
    """pymodbus's function-23 request, its words packed in one struct call (pymodbus packs them one at a time and
    joins the bytes: 17 us for 38 words in a loop, against 2)."""

    def encode(self) -> bytes:
        self.verifyAddress(address=self.read_address)
        self.verifyAddress(address=self.write_address)
        self.verifyCount(self.MAX_READ_COUNT, count=self.read_count)
        self.verifyCount(self.MAX_WRITE_COUNT, count=self.write_count)
        return struct.pack(f">HHHHB{self.write_count}H", self.read_address, self.read_count, self.write_address,
                           self.write_count, self.write_byte_count, *self.write_registers)


class _ExchangeResponse(ReadWriteMultipleRegistersResponse):
    """pymodbus's function-23 response (registered with the client's decoder: pymodbus's own extension point),
    its registers unpacked in one numpy call into a uint16 array, which gw.decode_inputs_into takes as it is.
    pymodbus unpacks them one struct call at a time and its decoder formats the whole PDU (str, every register)
    for a debug log line at every response: 53 us per 80-register response in a loop, against 6."""

    def decode(self, data: bytes) -> None:
        count = data[0]
        if count >= len(data) or count % 2:
            raise ModbusIOException(f"byte_count {count} does not fit the packet of {len(data)} bytes",
                                    function_code=self.function_code)
        self.registers = np.frombuffer(data, dtype=">u2", count=count // 2, offset=1).astype(np.uint16)

    def __str__(self) -> str:
        return (f"{type(self).__name__}(dev_id={self.dev_id}, transaction_id={self.transaction_id}, "
                f"{len(self.registers)} registers)")


class _Refused(Exception):
    """The gateway answered a request with a Modbus exception (the request was not carried out)."""


class GatewayArm(Arm):
    """Arm over a Modbus TCP gateway: GatewayArm(model, host=..., **options) (see GATEWAY_OPTIONS). Every new image
    is kept until read (backlog); the cycle's clock is the host's."""

    keeps_every_sample = True
    OPTION_SPEC = GATEWAY_OPTIONS

    def __init__(self, model, **options):
        self.options = opts = gateway_options(**options)
        self.model, self.n = model, model.n
        if not 1 <= self.n <= gw.DRIVES_PER_READ:
            raise InputError(f"gateway: the model {model.name} has {self.n} joints; this transport reads "
                             f"the whole image in one request, which holds 1..{gw.DRIVES_PER_READ} drives")
        self.where = f"gateway {opts.host}:{opts.port}"
        self.scaling = JointScaling.from_gear(model.gear_ratio, opts.counts_per_rev)
        self._torque_per_amp = np.asarray(model.joint_torque_per_amp(), dtype=float)
        self._input_count = gw.input_count(self.n)
        self._client: ModbusTcpClient | None = None
        # the samples: the link thread converts each new image into the next slot of the ring, read() takes each
        # once and in order (both under the lock)
        self._lock = threading.Lock()
        self._ring = StateRing(self.n, SAMPLE_RING)
        # the commands: write() queues each under the lock, the link thread converts the oldest not sent into wire
        # units in _fields
        # (one numba call) and the holding image's words in _words (another)
        self._cmds = [ArmCommand(self.n) for _ in range(COMMAND_QUEUE)]
        self._written = 0              # commands write() queued (the newest is _cmds[(_written - 1) % COMMAND_QUEUE])
        self._sent = 0                 # commands an exchange took (or that were dropped unsent)
        self._counts_per_rad = np.ascontiguousarray(self.scaling.counts_per_rad, dtype=np.float64)
        self._out_header = np.array([0, opts.watchdog_ms], dtype=np.int64)      # watchdog, watchdog_timeout_ms
        self._fields = np.zeros((len(gw.HOLDING_DRIVE), self.n), dtype=np.int64)
        self._offset_per_nm = np.full(self.n, OFFSET_MNM)
        self._latched_cw = np.zeros(self.n, dtype=np.uint16)     # the controlwords sent (fault reset latched)
        self._words = np.zeros(gw.holding_count(self.n), dtype=np.uint16)
        # an image: decoded into _in_header / _in_drives (gw.decode_inputs_into), then into SI by raw_to_si
        self._in_header = np.zeros(len(gw.INPUT_HEADER), dtype=np.int64)
        self._in_drives = np.zeros((len(gw.INPUT_DRIVE), self.n), dtype=np.int64)
        self._in_rows = tuple(self._in_drives[gw.field_row(gw.INPUT_DRIVE, name)] for name in
                              ("position", "velocity", "current", "statusword", "error_code", "mode_display"))
        first_bad_drive(self._in_rows[3], self._in_rows[5])   # compile or load it now, not in the handshake's images
        self._have_cmd = False
        self._reset_latch = np.zeros(self.n, dtype=bool)
        # link state
        self._tick = _Tick()                # wakes the link thread
        self._io = threading.Lock()         # held for an exchange or a (re)connection: by the link thread or the cycle
        self._cycle_started = -math.inf     # time.monotonic() of the cycle's last begin_cycle
        self._in_flight: _ExchangeRequest | None = None    # a function-23 request sent, its answer not taken yet
        self._in_flight_t0 = 0.0
        self._handed_over = False           # the cycle left a late answer to the link thread (_cycle_collect)
        self._carrying = False              # the words _command_words returned last carry a command
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._up = False
        self._down_reason = ""
        self._watchdog_alarm = False     # an image reported the host watchdog expired; read() raises once
        self._watchdog_seen = False      # the last image had the watchdog bit (an alarm per rising edge)
        self._beat = 0
        self._fc23 = False                       # the gateway mirrors its inputs: one function 23 per exchange
        self._last_counter: int | None = None   # None: the next image is the first of this connection
        self._last_ts_us = 0
        self._ts_epoch = 0                      # wraps of the gateway's 32-bit microsecond clock
        # counters (link_stats)
        self.counts = {"exchanges": 0, "fresh_images": 0, "repeated_images": 0, "missed_images": 0,
                       "invalid_images": 0, "bad_images": 0, "exception_responses": 0, "timeouts": 0,
                       "connections_lost": 0, "connect_failures": 0, "reconnects": 0, "writes": 0, "refused_writes": 0,
                       "unsendable_commands": 0, "superseded_commands": 0, "idle_reads": 0, "watchdog_expired": 0,
                       "handovers": 0}
        self.last_error = ""
        self.gateway_refused_writes = 0
        self._bad_images = Throttle(_log, logging.WARNING, TROUBLE_LOG_INTERVAL_S)
        self._link_trouble = Throttle(_log, logging.ERROR, TROUBLE_LOG_INTERVAL_S)
        self._timeouts = Throttle(_log, logging.WARNING, TROUBLE_LOG_INTERVAL_S)
        self._rtt = np.zeros(ROUND_TRIP_WINDOW)
        self._rate_mark = (time.monotonic(), 0)

    # -- Arm -----------------------------------------------------------------------------------------
    def open(self) -> None:
        """Connect, check the gateway's layout version and drive count, start the link thread; LinkError
        naming the gateway when it cannot be reached or does not match the model."""
        if self._thread is not None:
            return
        self._warm_up()             # before the handshake: the gateway's host watchdog counts from it
        opts = self.options
        deadline = time.monotonic() + opts.handshake_timeout_ms / 1000
        attempts = 0
        while True:
            attempts += 1
            try:
                self._connect()
                break
            except _NoAnswer as exc:             # connected, not answered: ask again on a new connection
                self._close_client()
                self.counts["timeouts"] += 1
                if time.monotonic() + opts.timeout_ms / 1000 > deadline:
                    raise self._down(f"no answer to the handshake within {opts.handshake_timeout_ms:g} ms "
                                     f"({attempts} attempts of {opts.timeout_ms:g} ms): {exc}") from None
            except LinkError:
                self._close_client()
                raise
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="armid-gateway-link", daemon=True)
        self._thread.start()
        _log.info("%s: connected, %d drives", self.where, self.n, extra={"endpoint": f"{opts.host}:{opts.port}"})

    def check_reachable(self) -> None:
        """The gateway accepts a TCP connection (closed again at once: no Modbus request, so its host watchdog
        does not start)."""
        opts = self.options
        try:
            socket.create_connection((opts.host, opts.port), timeout=opts.timeout_ms / 1000).close()
        except OSError as exc:
            self.counts["connect_failures"] += 1
            raise self._down(f"cannot connect to {opts.host}:{opts.port}: {exc}") from None

    def _warm_up(self) -> None:
        """Compile (or load from numba's cache) the link's kernels here, not in its first exchanges (a compile
        there stalls the cycle for seconds): one command and one image of zeros through them."""
        c = self._cmds[0]
        _command_fields(c.controlword, c.mode, c.target_position, c.target_torque, c.torque_offset,
                        self._counts_per_rad, self._offset_per_nm, np.zeros(self.n, dtype=bool), self._latched_cw,
                        self._fields)
        gw.encode_outputs_into(self._out_header, self._fields, self._words)
        words = gw.encode_inputs_into(self._in_header, self._in_drives, np.zeros(self._input_count, np.uint16))
        for image in (words, words.astype(np.int64)):   # as function 23 (_ExchangeResponse) and 4 hand them over
            gw.decode_inputs_into(image, self._in_header, self._in_drives)

    def close(self) -> None:
        """Stop the link thread (bounded wait) and close the connection. Idempotent."""
        self._stop.set()
        self._tick.set()
        if self._thread is not None:
            self._thread.join(5 * self.options.timeout_ms / 1000 + 2.0)
            self._thread = None
        held = self._io.acquire(timeout=self.options.timeout_ms / 1000 + 1.0)   # a cycle still in an exchange
        try:
            self._close_client()
        finally:
            if held:
                self._io.release()
        self._up = False
        for throttle in (self._bad_images, self._link_trouble, self._timeouts):
            throttle.flush()

    def begin_cycle(self) -> None:
        """The cycle's start. With function 23 the cycle runs the exchanges itself, pipelined (module docstring):
        here it takes the answer to the request the last cycle's write() sent (a period ago: normally already
        there, so this does not wait), and before the first command it sends a request that only re-arms the
        watchdog and reads. Otherwise (functions 16 + 4, or the link thread holding the connection: a
        reconnection) it lets the link thread start an exchange before the first command."""
        self._cycle_started = time.monotonic()
        if not self._fc23 or self._handed_over or not self._io.acquire(blocking=False):
            if not self._have_cmd or self._handed_over:
                self._tick.set()
            return
        try:
            if self._in_flight is not None and not self._cycle_collect():
                return
            if not self._have_cmd and self._client is not None:
                self._guarded(self._send_exchange, self._command_words())
        finally:
            self._io.release()

    def _cycle_collect(self) -> bool:
        """The cycle takes the answer in flight (the caller holds _io) if it comes within ANSWER_WAIT_S; else it
        hands the exchanges over to the link thread (which waits for the answer up to timeout_ms and sends what was
        queued meanwhile) and returns False: the cycle goes on, stale, instead of stalling on the network."""
        sock = self._client.socket if self._client is not None else None
        try:
            ready = sock is not None and bool(select.select([sock], [], [], ANSWER_WAIT_S)[0])
        except (OSError, ValueError):      # the socket closed under it: the exchange's own error handling decides
            ready = True
        if not ready:
            self.counts["handovers"] += 1
            self._handed_over = True
            self._tick.set()
            return False
        self._guarded(self._collect)
        return True

    def _cycle_exchanges(self) -> bool:
        """True while the cycle runs the exchanges itself (function 23, a begin_cycle within IDLE_EXCHANGE_S)."""
        return self._fc23 and time.monotonic() - self._cycle_started < IDLE_EXCHANGE_S

    def read(self, out: ArmState) -> bool:
        """Copy the newest decoded sample into out; True when the gateway's image is new since the last
        read. LinkError while the link is down and once when the gateway's host watchdog has expired."""
        if not self._up:
            raise LinkError(f"{self.where}: {self._down_reason or 'not connected'}")
        with self._lock:
            if self._watchdog_alarm:
                self._watchdog_alarm = False
                raise LinkError(f"{self.where}: the host watchdog expired ({self.options.watchdog_ms} ms without "
                                f"a write): the gateway quick-stopped the drives")
            return self._ring.take(out)

    def lost_samples(self) -> int:
        """Device samples lost so far (overwritten unread in the ring)."""
        return self._ring.overwritten

    def backlog(self) -> int:
        """Images decoded and not read yet (at most SAMPLE_RING are kept): the cycle publishes the older ones
        first, so that two images between two cycles are both published."""
        return self._ring.unread()

    def write(self, command: ArmCommand) -> None:
        """Queue the command; every command goes out once, in order, one per exchange (beyond COMMAND_QUEUE unsent
        the oldest are dropped: superseded_commands, a fault reset among them latched into the next one sent).
        While the cycle runs the exchanges (function 23) this sends it at once without waiting (older ones still
        queued first, each waited for) and the next begin_cycle() takes the answer; else the link thread sends it."""
        with self._lock:
            self._drop_unsent(COMMAND_QUEUE - 1)       # the link is COMMAND_QUEUE exchanges behind
            c = self._cmds[self._written % COMMAND_QUEUE]
            _keep_command(command.controlword, command.mode, command.target_position, command.target_torque,
                          command.torque_offset, c.controlword, c.mode, c.target_position, c.target_torque,
                          c.torque_offset)
            self._written += 1
            self._have_cmd = True
        if not self._cycle_exchanges() or self._handed_over or not self._io.acquire(blocking=False):
            self._tick.set()
            return
        try:
            while self._client is not None and self._sent != self._written:
                if self._in_flight is not None:        # a cycle that could not take it at its start
                    if not self._cycle_collect():
                        return
                    continue
                words = self._command_words()
                if words is None:                      # not sendable (counted): the next one, if any
                    continue
                if self._sent != self._written:        # older ones queued: each waited for, in order
                    self._guarded(self._exchange_words, words)
                else:                                  # this cycle's: its answer is the next begin_cycle's
                    self._guarded(self._send_exchange, words)
        finally:
            self._io.release()

    def _drop_unsent(self, keep: int) -> None:
        """Drop the oldest queued commands not sent until at most `keep` remain (the caller holds the lock): each
        is counted (superseded_commands), and a fault reset in one of them is latched for the next one sent."""
        while self._written - self._sent > keep:
            dropped = self._cmds[self._sent % COMMAND_QUEUE].controlword
            self._reset_latch |= (dropped & _FAULT_RESET_BIT) != 0
            self._sent += 1
            self.counts["superseded_commands"] += 1

    def link_stats(self) -> dict:
        """Counters of the link and the exchange round trips (ms) over the last ROUND_TRIP_WINDOW exchanges."""
        now, done = time.monotonic(), self.counts["exchanges"]
        t0, done0 = self._rate_mark
        self._rate_mark = (now, done)
        k = min(done, ROUND_TRIP_WINDOW)
        rtt = self._rtt[:k] * 1e3
        return {"transport": "gateway", "host": self.options.host, "port": self.options.port,
                "connected": self._up, "down_reason": None if self._up else self._down_reason,
                "exchange": "function 23 (read/write multiple)" if self._fc23 else "functions 16 + 4",
                "exchange_rate_hz": (done - done0) / max(now - t0, 1e-9), **self.counts,
                "gateway_refused_writes": self.gateway_refused_writes, "samples_overwritten": self._ring.overwritten,
                "round_trip_ms": {"p50": float(np.percentile(rtt, 50)) if k else 0.0,
                                  "p99": float(np.percentile(rtt, 99)) if k else 0.0,
                                  "max": float(rtt.max()) if k else 0.0},
                "last_error": self.last_error}

    # -- the link thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        name_os_thread()                 # "gateway-link" in top -H and the benchmark's CPU by thread
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - a bug here must become a link fault, not a silent stop
            self._down(f"the link thread failed: {type(exc).__name__}: {exc}")
            self._close_client()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self._client is None:
                # down: pause between attempts; up (a response was lost): reopen at once
                if not self._up and self._stop.wait(self.options.reconnect_ms / 1000):
                    break
                with self._io:
                    self._reconnect()
                continue
            self._tick.wait(IDLE_EXCHANGE_S)
            if self._stop.is_set():
                break
            if self._handed_over:
                self._catch_up()
                continue
            if self._cycle_exchanges():
                continue                        # the cycle runs the exchanges (begin_cycle, write)
            with self._io:
                if self._in_flight is not None:
                    self._guarded(self._collect)
                if self._client is not None:
                    self._guarded(self._exchange)

    def _catch_up(self) -> None:
        """The exchanges the cycle handed over (a late answer): take the answer in flight (up to timeout_ms), send
        every command queued meanwhile, each waited for, then give the exchanges back to the cycle."""
        with self._io:
            if self._in_flight is not None:
                self._guarded(self._collect)
            while self._client is not None and self._sent != self._written and not self._stop.is_set():
                self._guarded(self._exchange)
            self._handed_over = False

    def _guarded(self, step, *args) -> None:
        """Run one step of an exchange (the caller holds _io): a reset or closed connection marks the link down, a
        response not in time (or not pairing with its request) closes the connection; either way the link thread
        reopens it."""
        try:
            step(*args)
        except (ConnectionException, OSError) as exc:   # reset or closed by the gateway: the link is down
            self.counts["connections_lost"] += 1
            self._down(f"connection lost: {exc}")
            self._link_trouble.hit("%s: connection lost: %s; reconnecting", self.where, exc)
            self._close_client()
            self._tick.set()
        except ModbusException as exc:      # no response in time, or one that does not pair with the request
            self.counts["timeouts"] += 1
            self.last_error = f"no response within {self.options.timeout_ms:g} ms: {exc}"
            self._timeouts.hit("%s: %s", self.where, self.last_error)
            self._close_client()            # a late response must never answer a later request
            self._tick.set()

    def _reconnect(self) -> None:
        """One attempt to (re)open the connection. A handshake without an answer leaves the link as it was
        (a silent gateway: the samples go stale and the cycle's watchdog decides); a refused connection or
        a wrong gateway marks it down."""
        try:
            self._connect()
            self.counts["reconnects"] += 1
            _log.info("%s: reconnected", self.where)
        except _NoAnswer as exc:
            self.counts["timeouts"] += 1
            self.last_error = f"no answer to the handshake: {exc}"
            self._close_client()
        except LinkError as exc:
            self._link_trouble.hit("%s", exc)
            self._close_client()

    def _connect(self) -> None:
        """Open the TCP connection and check the header (layout version, drive count): LinkError when the
        connection fails or the gateway does not match, _NoAnswer when the handshake is not answered."""
        opts = self.options
        self._close_client()
        self._client = ModbusTcpClient(opts.host, port=opts.port, timeout=opts.timeout_ms / 1000, retries=0)
        self._client.register(_ExchangeResponse)      # function 23's responses decoded by the class above
        if not self._client.connect():
            self.counts["connect_failures"] += 1
            raise self._down(f"cannot connect to {opts.host}:{opts.port}")
        try:
            # one small request and its answer per exchange half: never hold a segment back (Nagle)
            self._client.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            header = self._read(gw.INPUT_BASE, gw.INPUT_HEADER_SIZE)
            if len(header) < 2:
                raise self._down(f"the header (input registers {gw.INPUT_BASE:#06x}..) came back with {len(header)} "
                                 f"registers, not {gw.INPUT_HEADER_SIZE}")
            if header[0] != gw.LAYOUT_VERSION:
                raise self._down(f"layout_version (input register {gw.INPUT_BASE:#06x}) = {header[0]}, this host "
                                 f"speaks version {gw.LAYOUT_VERSION} (docs/reference/wire-gateway.md)")
            if header[1] != self.n:
                raise self._down(f"the gateway serves {header[1]} drives, the model {self.model.name} has "
                                 f"{self.n} joints")
            self._write_registers(gw.HOLDING_BASE, [self._next_beat(), opts.watchdog_ms])
            self._fc23 = self._has_mirror()
        except _Refused as exc:
            raise self._down(f"handshake refused: {exc}") from None
        except (ConnectionException, OSError) as exc:
            self.counts["connect_failures"] += 1
            raise self._down(f"connection lost during the handshake: {exc}") from None
        except ModbusException as exc:
            raise _NoAnswer(str(exc)) from None
        self._last_counter = None
        with self._lock:        # what was queued while the link was down is stale: only the newest goes out
            self._drop_unsent(1)
        self._up = True

    def _has_mirror(self) -> bool:
        """True when the gateway mirrors its input image in holding registers (INPUT_MIRROR_BASE), so that an
        exchange is one function-23 request; a gateway without it answers ILLEGAL DATA ADDRESS (or zeros)."""
        reply = self._client.read_holding_registers(gw.INPUT_MIRROR_BASE, count=gw.INPUT_HEADER_SIZE,
                                                    device_id=self.options.device_id)
        return not reply.isError() and list(reply.registers[:2]) == [gw.LAYOUT_VERSION, self.n]

    def _down(self, reason: str) -> LinkError:
        self._down_reason = self.last_error = reason
        self._up = False
        return LinkError(f"{self.where}: {reason}")

    def _close_client(self) -> None:
        self._in_flight = None           # its answer, if it ever comes, dies with the connection
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def _next_beat(self) -> int:
        self._beat = (self._beat + 1) & 0xFFFF
        return self._beat

    def _read(self, address: int, count: int) -> list[int]:
        reply = self._client.read_input_registers(address, count=count, device_id=self.options.device_id)
        if reply.isError():
            self.counts["exception_responses"] += 1
            raise _Refused(str(reply))
        return reply.registers

    def _write_registers(self, address: int, words: list[int]) -> None:
        reply = self._client.write_registers(address, words, device_id=self.options.device_id)
        if reply.isError():
            raise _Refused(str(reply))

    def _exchange(self) -> None:
        """One exchange, waited for: the oldest queued command (or the watchdog alone), or only a read."""
        self._exchange_words(self._command_words())

    def _exchange_words(self, words: list[int] | None) -> None:
        """One write of `words` from HOLDING_BASE (None: nothing to write), then one read of the input image, waited
        for: writing first lets the image read in the same exchange already show the command's effect. With the
        gateway's input mirror both are one function-23 request; nothing to write, a refused write (nothing
        applied, nothing read) or a command that cannot be sent leaves a plain read (function 4)."""
        if words is not None and self._fc23:
            self._send_exchange(words)
            self._collect()
            return
        t0 = time.perf_counter()
        if words is not None:
            try:
                self._write_registers(gw.HOLDING_BASE, words)
            except _Refused as exc:
                self._refused(str(exc))
        self._read_image()
        self._count_exchange(t0)

    def _send_exchange(self, words: list[int]) -> None:
        """Send one function-23 request (words written from HOLDING_BASE, the input mirror read) without waiting
        for its answer (pymodbus's no_response_expected): _collect takes it."""
        request = _ExchangeRequest(read_address=gw.INPUT_MIRROR_BASE, read_count=self._input_count,
                                   write_address=gw.HOLDING_BASE, write_registers=words, dev_id=self.options.device_id)
        self._in_flight_t0 = time.perf_counter()
        self._client.execute(True, request)
        self._in_flight = request

    def _collect(self) -> None:
        """Wait (timeout_ms at most) for the answer to the function-23 request in flight and take its image; a
        refused write (nothing applied, nothing read) is followed by a plain read (function 4). A response that
        does not come, or does not pair with the request, is a ModbusIOException."""
        request, self._in_flight = self._in_flight, None
        try:
            reply = self._client.transaction.sync_get_response(request.dev_id, request.transaction_id)
        except asyncio.TimeoutError:
            raise ModbusIOException("no response received", function_code=request.function_code) from None
        if reply.transaction_id != request.transaction_id or reply.dev_id != request.dev_id:
            raise ModbusIOException(f"the response of transaction {reply.transaction_id} (device {reply.dev_id}) "
                                    f"to request {request.transaction_id} (device {request.dev_id})",
                                    function_code=request.function_code)
        if reply.isError():
            self.counts["exception_responses"] += 1
            self._refused(str(reply))
            self._read_image()
        else:
            self._take(reply.registers, time.time_ns())
        self._count_exchange(self._in_flight_t0)

    def _read_image(self) -> None:
        """Read the input image (function 4) and take it."""
        try:
            self._take(self._read(gw.INPUT_BASE, self._input_count), time.time_ns())
        except _Refused as exc:
            self.last_error = f"read refused: {exc}"

    def _count_exchange(self, t0: float) -> None:
        k = self.counts["exchanges"]
        self._rtt[k % ROUND_TRIP_WINDOW] = time.perf_counter() - t0
        self.counts["exchanges"] = k + 1

    def _take(self, words: list[int] | np.ndarray, host_ns: int) -> None:
        """Decode an input image into the back buffer and publish it when it is new and valid."""
        c = self.counts
        try:
            gw.decode_inputs_into(words, self._in_header, self._in_drives)
        except gw.GatewayError as exc:
            c["bad_images"] += 1
            self.last_error = f"bad image dropped: {exc}"
            self._bad_images.hit("%s: %s", self.where, self.last_error)
            return
        _, _, status, refused, counter, ts_us = self._in_header.tolist()   # INPUT_HEADER's order
        self.gateway_refused_writes = refused
        first = self._last_counter is None
        if status & gw.STATUS_WATCHDOG_EXPIRED:
            # the first image of a connection may predate the handshake's watchdog write: not an alarm
            if not (self._watchdog_seen or first):
                c["watchdog_expired"] += 1
                _log.error("%s: the gateway's watchdog expired (no command within its watchdog time)", self.where)
                with self._lock:
                    self._watchdog_alarm = True
            self._watchdog_seen = True
        else:
            self._watchdog_seen = False
        if not status & gw.STATUS_DATA_VALID:
            c["invalid_images"] += 1
            return
        _, _, _, status_row, _, mode_row = self._in_rows
        bad = first_bad_drive(status_row, mode_row)
        if bad >= 0:          # counted and dropped, never turned into numbers (each read of it, as a decode error)
            c["bad_images"] += 1
            self.last_error = f"bad image dropped: {bad_drive_text(bad, status_row, mode_row)}"
            self._bad_images.hit("%s: %s", self.where, self.last_error)
            return
        if not first:
            step = (counter - self._last_counter) % _U32
            if step == 0:
                c["repeated_images"] += 1
                return
            c["missed_images"] += step - 1
            if ts_us < self._last_ts_us - (_U32 >> 1):
                self._ts_epoch += 1
        self._last_counter, self._last_ts_us = counter, ts_us
        device_ns = (self._ts_epoch * _U32 + ts_us) * 1000
        with self._lock:      # the slot may be the oldest unread one, which read() could be copying
            b = self._ring.next_slot()
            b.device_time_ns, b.host_time_ns = device_ns, host_ns
            raw_to_si(*self._in_rows, self._counts_per_rad, CURRENT_LSB, self._torque_per_amp, b.floats, b.words,
                      b.mode)
            self._ring.commit()
        c["fresh_images"] += 1

    def _refused(self, reason: str) -> None:
        self.counts["refused_writes"] += 1
        self.last_error = f"write refused (nothing applied): {reason}"
        if self._carrying:           # the drives did not see its controlwords: a fault reset in them waits again
            self._relatch()

    def _relatch(self) -> None:
        """Latch again the fault resets of the controlwords last converted (_latched_cw): they were not applied."""
        with self._lock:
            self._reset_latch |= (self._latched_cw & _FAULT_RESET_BIT) != 0

    def _command_words(self) -> list[int] | None:
        """The words to write from HOLDING_BASE: a command the cycle wrote since the last exchange, as the whole
        holding image (re-arming the watchdog), or the watchdog alone while the cycle has not commanded
        anything yet. None, and the exchange only reads, when the cycle has written nothing new (an idle
        exchange while the cycle is late: sending its last command again would re-arm the gateway's watchdog
        without the cycle, and a gateway whose cycle follows the host's writes would run a cycle on a stale
        target) or a command that cannot be represented (counted; never sent)."""
        with self._lock:
            have = self._have_cmd
            fresh = self._sent != self._written
            if have and fresh:
                c = self._cmds[self._sent % COMMAND_QUEUE]
                self._sent += 1
                if self._sent != self._written:     # more queued: the next exchange starts right after this one
                    self._tick.set()
                bad = _command_fields(c.controlword, c.mode, c.target_position, c.target_torque, c.torque_offset,
                                      self._counts_per_rad, self._offset_per_nm, self._reset_latch, self._latched_cw,
                                      self._fields)
                if bad >= 0:
                    return self._not_sent(self._unsendable(c))
        self._carrying = False
        if not have:
            return [self._next_beat(), self.options.watchdog_ms]
        if not fresh:
            self.counts["idle_reads"] += 1
            return None
        self._out_header[0] = self._next_beat()
        try:
            words = gw.encode_outputs_into(self._out_header, self._fields, self._words)
        except gw.GatewayError as exc:       # e.g. a mode of operation the layout does not know
            self._relatch()
            return self._not_sent(str(exc))
        self.counts["writes"] += 1
        self._carrying = True                # until the next call: the words of the exchange under way
        return words.tolist()                # what pymodbus packs: a list of ints (the cheapest of the sequences)

    def _not_sent(self, reason: str) -> None:
        """Count a command that cannot be represented; never sent: without the watchdog write the gateway stops
        the drives itself."""
        self.counts["unsendable_commands"] += 1
        self.last_error = f"command not sent: {reason}"

    def _unsendable(self, command: ArmCommand) -> str:
        """Why a command's targets cannot be sent (naming the field, the value and the joint)."""
        return unsendable(command, self._counts_per_rad, self._offset_per_nm, _OFFSET_MAX)
