"""The `gateway` transport: EtherCAT drives behind a Modbus TCP gateway (docs/wire-gateway.md), spoken with
pymodbus's sync client.

    arm = GatewayArm(model, host="192.168.10.20", port=502, watchdog_ms=100)

The link runs in its own thread ("armid-gateway-link") over one persistent connection (TCP_NODELAY): one
exchange is one write of the whole holding image (function 16, which also re-arms the gateway's host
watchdog) and one read of the whole input image (function 4), at most one exchange per cycle: write()
starts it, so that it carries the command this cycle just computed (begin_cycle starts it only until the
first command, so that samples come in before there is anything to write). A command that a newer one
replaces before any exchange sent it is counted (superseded_commands): with the gateway in step with the
exchanges (the simulated gateway's step_on_exchange, a real gateway's cycle following the master's process
data), each is a target the drives never saw. An exchange without a new command (the cycle late by more
than IDLE_EXCHANGE_S) only reads (idle_reads): re-sending the last command would re-arm the gateway's
watchdog without the cycle, and give such a gateway a cycle on a stale target, a torque kick. A gateway that mirrors its input image in holding registers
(gw.INPUT_MIRROR_BASE; checked at connect) gets both in one request, function 23 (read/write multiple
registers: the write is applied first), which halves the requests and the round trips; pymodbus's sync client costs less CPU per request than its
asyncio client (benchmarks/bench_gateway.py measures both). The cycle never waits for the network:
read() copies the newest decoded sample out of a preallocated buffer and says whether it is new (a gateway
image with a cycle counter not seen before); write() leaves the newest command in another preallocated
buffer, which the next exchange sends. A Modbus round trip costs milliseconds, so at a 1 kHz cycle most
cycles see no new image: read() returns False for them (the cycle flags them stale), nothing is invented.

Commands that must not be lost between exchanges: a controlword with the fault-reset bit (7) set is held
until one exchange has sent it, so that the drives see its rising edge even when the cycle's one-cycle
pulse falls between two exchanges.

Faults: a refused or dropped TCP connection marks the link down, read() raises LinkError naming the
gateway and the cause, and the link thread reconnects every reconnect_ms; a response that does not come
within timeout_ms is counted, the connection is reopened (stale responses never pair with a later
request) and the sample goes stale (a gateway that answers nothing at all leaves every cycle stale, and the
cycle's watchdog trips); an image that fails decoding (wrong layout version, drive count,
impossible field) is counted and dropped; the gateway's host-watchdog bit (it has quick-stopped the drives)
raises LinkError once. link_stats() reports every counter and the exchange round trips.
"""
from __future__ import annotations

import logging
import math
import socket
import threading
import time
from dataclasses import dataclass

import numba
import numpy as np
from pymodbus.client import ModbusTcpClient
from pymodbus.exceptions import ConnectionException, ModbusException

from driver.hal import ArmCommand, ArmState, LinkError, copy_sample, raw_to_si
from driver.timer import name_os_thread
from firmware_bridge import cia402
from firmware_bridge import gateway as gw
from firmware_bridge.units import CURRENT_LSB, ENCODER_COUNTS_PER_REV, JointScaling, WireValueError
from ident.errors import InputError

ROUND_TRIP_WINDOW = 1024        # exchanges kept for the round-trip percentiles
IDLE_EXCHANGE_S = 0.02          # without cycles (before the cycle starts), exchange at least this often
_FAULT_RESET_BIT = 0x0080
# pymodbus logs every lost response and refused connection at ERROR; our counters and the health topic
# report them, so without a logging configuration of the application they do not go to stderr
logging.getLogger("pymodbus").addHandler(logging.NullHandler())
_U32 = 1 << 32


@dataclass(frozen=True)
class GatewayOptions:
    """The transport's options (the [transport] table of the driver config, besides name).

    host: the gateway's address; port: its Modbus TCP port; device_id: the Modbus unit id (gateways of
    this layout ignore it); timeout_ms: how long one request may wait for its response; watchdog_ms: the
    host-watchdog time written to the gateway (it quick-stops the drives when no write came for this long);
    reconnect_ms: the pause between reconnection attempts; handshake_timeout_ms: how long open() keeps asking a
    gateway that accepted the connection but did not answer (a gateway still booting, a loaded host), each
    attempt waiting timeout_ms; counts_per_rev: the motor encoders' resolution.
    """

    host: str
    port: int = 502
    device_id: int = 1
    timeout_ms: float = 100.0
    watchdog_ms: int = 100
    reconnect_ms: float = 500.0
    handshake_timeout_ms: float = 2000.0
    counts_per_rev: int = ENCODER_COUNTS_PER_REV


def _fail(key: str, expected: str, got) -> InputError:
    return InputError(f"transport gateway: {key}: expected {expected}, got {got!r}")


def _integer(options: dict, key: str, default, lo: int, hi: int) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _fail(key, f"an integer in {lo}..{hi}", value)
    return value


def _milliseconds(options: dict, key: str, default: float, lo: float, hi: float) -> float:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not lo <= value <= hi:
        raise _fail(key, f"a number of ms in {lo:g}..{hi:g}", value)
    return float(value)


def gateway_options(**options) -> GatewayOptions:
    """Validated GatewayOptions from the config's keywords; InputError naming the option otherwise."""
    known = {f for f in GatewayOptions.__dataclass_fields__}
    for key in options:
        if key not in known:
            raise InputError(f"transport gateway: unknown option {key!r} (options: {', '.join(sorted(known))})")
    host = options.get("host")
    if not isinstance(host, str) or not host.strip():
        raise _fail("host", "the gateway's IP address or host name", host)
    return GatewayOptions(
        host=host.strip(),
        port=_integer(options, "port", 502, 1, 65535),
        device_id=_integer(options, "device_id", 1, 0, 255),
        timeout_ms=_milliseconds(options, "timeout_ms", 100.0, 1.0, 10000.0),
        watchdog_ms=_integer(options, "watchdog_ms", 100, 1, 65535),
        reconnect_ms=_milliseconds(options, "reconnect_ms", 500.0, 1.0, 60000.0),
        handshake_timeout_ms=_milliseconds(options, "handshake_timeout_ms", 2000.0, 1.0, 600000.0),
        counts_per_rev=_integer(options, "counts_per_rev", ENCODER_COUNTS_PER_REV, 1, 2 ** 31 - 1))


class _NoAnswer(Exception):
    """The gateway accepted the connection but did not answer within timeout_ms."""


@numba.njit(cache=True, nogil=True)
def _keep_command(controlword, mode, target_position, target_torque, cw_out, mode_out, position_out, torque_out,
                  reset_latch):
    """write()'s copy of a command (one call instead of seven numpy calls per cycle); a joint whose controlword
    has the fault-reset bit set is latched in reset_latch until an exchange sends it."""
    for j in range(controlword.shape[0]):
        cw_out[j] = controlword[j]
        mode_out[j] = mode[j]
        position_out[j] = target_position[j]
        torque_out[j] = target_torque[j]
        if controlword[j] & _FAULT_RESET_BIT:
            reset_latch[j] = True


class _Refused(Exception):
    """The gateway answered a request with a Modbus exception (the request was not carried out)."""


class GatewayArm:
    """Arm over a Modbus TCP gateway: GatewayArm(model, host=..., **options) (see GatewayOptions)."""

    def __init__(self, model, **options):
        self.options = opts = gateway_options(**options)
        self.model, self.n = model, model.n
        if not 1 <= self.n <= gw.DRIVES_PER_READ:
            raise InputError(f"transport gateway: the model {model.name} has {self.n} joints; this transport reads "
                             f"the whole image in one request, which holds 1..{gw.DRIVES_PER_READ} drives")
        self.where = f"gateway {opts.host}:{opts.port}"
        self.scaling = JointScaling.from_gear(model.gear_ratio, opts.counts_per_rev)
        self._torque_per_amp = np.asarray(model.joint_torque_per_amp(), dtype=float)
        self._input_count = gw.input_count(self.n)
        self._client: ModbusTcpClient | None = None
        # the sample: the link thread fills _back, then copies it into _front under the lock
        self._lock = threading.Lock()
        self._back, self._front = ArmState(self.n), ArmState(self.n)
        self._published = 0            # images copied into _front
        self._taken = 0                # images read() has returned
        # the command: write() fills _cmd under the lock, the link thread copies it into _out
        self._cmd, self._out = ArmCommand(self.n), ArmCommand(self.n)
        self._have_cmd = False
        self._cmd_pending = False      # a command written that no exchange has taken yet
        self._reset_latch = np.zeros(self.n, dtype=bool)
        # link state
        self._tick = threading.Event()
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
                       "unsendable_commands": 0, "superseded_commands": 0, "idle_reads": 0, "watchdog_expired": 0}
        self.last_error = ""
        self.gateway_refused_writes = 0
        self._rtt = np.zeros(ROUND_TRIP_WINDOW)
        self._rate_mark = (time.monotonic(), 0)

    # -- Arm -----------------------------------------------------------------------------------------
    def open(self) -> None:
        """Connect, check the gateway's layout version and drive count, start the link thread; LinkError
        naming the gateway when it cannot be reached or does not match the model."""
        if self._thread is not None:
            return
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

    def close(self) -> None:
        """Stop the link thread (bounded wait) and close the connection. Idempotent."""
        self._stop.set()
        self._tick.set()
        if self._thread is not None:
            self._thread.join(3 * self.options.timeout_ms / 1000 + 2.0)
            self._thread = None
        self._close_client()
        self._up = False

    def begin_cycle(self) -> None:
        """Before the first command: let the link thread start its next exchange (afterwards write() does,
        so that the exchange carries this cycle's command)."""
        if not self._have_cmd:
            self._tick.set()

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
            src = self._front
            out.device_time_ns, out.host_time_ns = src.device_time_ns, src.host_time_ns
            copy_sample(src, out)
            fresh = self._published != self._taken
            self._taken = self._published
        return fresh

    def write(self, command: ArmCommand) -> None:
        """Keep the command for the next exchange and start it (at once, or right after the one in flight);
        the newest wins (the one replaced is counted in superseded_commands); a fault-reset bit is held
        until sent."""
        with self._lock:
            if self._cmd_pending:
                self.counts["superseded_commands"] += 1
            self._cmd_pending = True
            c = self._cmd
            _keep_command(command.controlword, command.mode, command.target_position, command.target_torque,
                          c.controlword, c.mode, c.target_position, c.target_torque, self._reset_latch)
            self._have_cmd = True
        self._tick.set()

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
                "gateway_refused_writes": self.gateway_refused_writes,
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
                self._reconnect()
                continue
            self._tick.wait(IDLE_EXCHANGE_S)
            self._tick.clear()
            if self._stop.is_set():
                break
            try:
                self._exchange()
            except (ConnectionException, OSError) as exc:   # reset or closed by the gateway: the link is down
                self.counts["connections_lost"] += 1
                self._down(f"connection lost: {exc}")
                self._close_client()
            except ModbusException as exc:      # no response in time, or one that does not pair with the request
                self.counts["timeouts"] += 1
                self.last_error = f"no response within {self.options.timeout_ms:g} ms: {exc}"
                self._close_client()            # a late response must never answer a later request

    def _reconnect(self) -> None:
        """One attempt to (re)open the connection. A handshake without an answer leaves the link as it was
        (a silent gateway: the samples go stale and the cycle's watchdog decides); a refused connection or
        a wrong gateway marks it down."""
        try:
            self._connect()
            self.counts["reconnects"] += 1
        except _NoAnswer as exc:
            self.counts["timeouts"] += 1
            self.last_error = f"no answer to the handshake: {exc}"
            self._close_client()
        except LinkError:
            self._close_client()

    def _connect(self) -> None:
        """Open the TCP connection and check the header (layout version, drive count): LinkError when the
        connection fails or the gateway does not match, _NoAnswer when the handshake is not answered."""
        opts = self.options
        self._close_client()
        self._client = ModbusTcpClient(opts.host, port=opts.port, timeout=opts.timeout_ms / 1000, retries=0)
        if not self._client.connect():
            self.counts["connect_failures"] += 1
            raise self._down(f"cannot connect to {opts.host}:{opts.port}")
        # one small request and its answer per exchange half: never hold a segment back (Nagle)
        self._client.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            header = self._read(gw.INPUT_BASE, gw.INPUT_HEADER_SIZE)
            if header[0] != gw.LAYOUT_VERSION:
                raise self._down(f"layout_version (input register {gw.INPUT_BASE:#06x}) = {header[0]}, this host "
                                 f"speaks version {gw.LAYOUT_VERSION} (docs/wire-gateway.md)")
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
        if self._client is not None:
            self._client.close()
            self._client = None

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
        """One write of the cycle's new command (or of the watchdog alone), then one read of the input image:
        writing first lets the image read in the same exchange already show the command's effect. With
        the gateway's input mirror both are one function-23 request; nothing new to send, a refused write
        (nothing applied, nothing read) or a command that cannot be sent leaves a plain read (function 4)."""
        t0 = time.perf_counter()
        words = self._command_words()
        read = True
        if words is not None and self._fc23:
            reply = self._client.readwrite_registers(read_address=gw.INPUT_MIRROR_BASE, read_count=self._input_count,
                                                     write_address=gw.HOLDING_BASE, values=words,
                                                     device_id=self.options.device_id)
            if reply.isError():
                self.counts["exception_responses"] += 1
                self._refused(str(reply))
            else:
                self._take(reply.registers, time.time_ns())
                read = False
        elif words is not None:
            try:
                self._write_registers(gw.HOLDING_BASE, words)
            except _Refused as exc:
                self._refused(str(exc))
        if read:
            try:
                self._take(self._read(gw.INPUT_BASE, self._input_count), time.time_ns())
            except _Refused as exc:
                self.last_error = f"read refused: {exc}"
        k = self.counts["exchanges"]
        self._rtt[k % ROUND_TRIP_WINDOW] = time.perf_counter() - t0
        self.counts["exchanges"] = k + 1

    def _take(self, words: list[int], host_ns: int) -> None:
        """Decode an input image into the back buffer and publish it when it is new and valid."""
        c = self.counts
        try:
            img = gw.decode_inputs(words, self.n)
        except gw.GatewayError as exc:
            c["bad_images"] += 1
            self.last_error = f"bad image dropped: {exc}"
            return
        self.gateway_refused_writes = img.refused_writes
        first = self._last_counter is None
        if img.gateway_status & gw.STATUS_WATCHDOG_EXPIRED:
            # the first image of a connection may predate the handshake's watchdog write: not an alarm
            if not (self._watchdog_seen or first):
                c["watchdog_expired"] += 1
                with self._lock:
                    self._watchdog_alarm = True
            self._watchdog_seen = True
        else:
            self._watchdog_seen = False
        if not img.gateway_status & gw.STATUS_DATA_VALID:
            c["invalid_images"] += 1
            return
        if not first:
            step = (img.cycle_counter - self._last_counter) % _U32
            if step == 0:
                c["repeated_images"] += 1
                return
            c["missed_images"] += step - 1
            if img.timestamp_us < self._last_ts_us - (_U32 >> 1):
                self._ts_epoch += 1
        self._last_counter, self._last_ts_us = img.cycle_counter, img.timestamp_us
        b, sc = self._back, self.scaling
        b.device_time_ns, b.host_time_ns = (self._ts_epoch * _U32 + img.timestamp_us) * 1000, host_ns
        raw_to_si(img.position, img.velocity, img.current, img.statusword, img.error_code, img.mode_display,
                  sc.counts_per_rad, CURRENT_LSB, self._torque_per_amp, b.floats, b.words, b.mode)
        with self._lock:
            f = self._front
            f.device_time_ns, f.host_time_ns = b.device_time_ns, b.host_time_ns
            copy_sample(b, f)
            self._published += 1
        c["fresh_images"] += 1

    def _refused(self, reason: str) -> None:
        self.counts["refused_writes"] += 1
        self.last_error = f"write refused (nothing applied): {reason}"

    def _command_words(self) -> list[int] | None:
        """The words to write from HOLDING_BASE: a command the cycle wrote since the last exchange, as the whole
        holding image (re-arming the watchdog), or the watchdog alone while the cycle has not commanded
        anything yet. None, and the exchange only reads, when the cycle has written nothing new (an idle
        exchange while the cycle is late: sending its last command again would re-arm the gateway's watchdog
        without the cycle, and a gateway whose cycle follows the host's writes would run a cycle on a stale
        target) or a command that cannot be represented (counted; never sent)."""
        out = self._out
        with self._lock:
            have = self._have_cmd
            fresh = self._cmd_pending
            self._cmd_pending = False
            if have and fresh:
                np.copyto(out.controlword, self._cmd.controlword)
                np.copyto(out.mode, self._cmd.mode)
                np.copyto(out.target_position, self._cmd.target_position)
                np.copyto(out.target_torque, self._cmd.target_torque)
                latched = self._reset_latch.copy()
                self._reset_latch[:] = False
        if not have:
            return [self._next_beat(), self.options.watchdog_ms]
        if not fresh:
            self.counts["idle_reads"] += 1
            return None
        cw = np.where(latched & ((out.controlword & _FAULT_RESET_BIT) == 0), cia402.CW_FAULT_RESET, out.controlword)
        try:
            image = gw.OutputImage(self._next_beat(), self.options.watchdog_ms, cw.astype(np.int64),
                                   out.mode.astype(np.int64), self.scaling.position_to_counts(out.target_position),
                                   self.scaling.torque_to_raw(out.target_torque))
            words = gw.encode_outputs(image)
        except (WireValueError, gw.GatewayError) as exc:
            # never sent: without the watchdog write the gateway stops the drives itself
            self.counts["unsendable_commands"] += 1
            self.last_error = f"command not sent: {exc}"
            return None
        self.counts["writes"] += 1
        return words.tolist()
