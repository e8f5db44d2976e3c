"""The device side of the EtherCAT-through-Modbus-TCP gateway: a pymodbus Modbus TCP server serving the
simulated arm's CiA 402 process image in the layout of firmware_bridge.gateway.

    sim = Simulator(model, transport=GatewayDevice(host="127.0.0.1", port=0), realtime=False)
    sim.start(); print(sim.transport.port)      # port 0: the port picked
    ...                                          # any Modbus TCP client reads and writes the image
    sim.stop()                                   # server shut down, thread joined, port released

* Every simulator cycle (a cycle callback) keeps a copy of the sample and runs the watchdog; the first
  read after a cycle encodes that cycle's image into the input registers (no encoding for cycles nobody
  reads): positions and velocities in motor counts (the model's gear ratios and the simulator's encoder
  resolution, as JointScaling), currents in uA, torques in mN m, the cycle counter and the device time in us.
* The input image is mirrored in read-only holding registers from gw.INPUT_MIRROR_BASE, so that one
  function-23 request (read/write multiple registers) writes the commands and reads the state: the write
  part is applied (or refused, and then nothing is read) before the read part is served.
* A write to the holding registers is decoded as a whole command image and becomes one
  sim.set_commands. An impossible image (unknown or unsupported mode, a target position outside the
  joint's limits, a target torque above its tau_max: sim.drive_targets.target_refusal, the rule of every
  transport; switching the watchdog off) is refused with the Modbus exception ILLEGAL DATA VALUE, counted,
  and nothing of it is applied. Each cycle, a drive in CSP without a new target follows what
  sim.drive_targets makes of the targets it received (target_counts).
* Scaling, read-only input registers from gw.SCALING_BASE: per drive the encoder counts per motor
  revolution, the gear ratio (numerator, denominator) and the motor torque constant, so that a Modbus-only
  host needs no model file.
* Host watchdog: when the host has not written the watchdog register for watchdog_timeout_ms (wall clock,
  time.monotonic, so it means the same in real-time and fast mode), every OPERATION ENABLED drive gets a
  quick stop, its controlword register then reads quick stop, and the status bit stays set until the next
  watchdog write. The watchdog runs only once a host has written (before that no host was ever there to
  be missed).
* Host-clocked (step_on_exchange=True): the gateway has no clock of its own; every accepted write request
  that carries process data (function 23's write part, or 16, 6, 22, reaching past the two watchdog words)
  runs exactly one simulator cycle, after the write is applied and before anything is read: a function-23
  exchange answers with the image of the cycle its own command started, and a following read (3, 4)
  returns that same image until the next write. Reads, refused writes and writes of the watchdog words
  alone (a host's reconnection) step nothing, except that the first accepted write of all runs the first
  cycle (a host's handshake writes the watchdog: the image is valid from then on). This is the real gateway's EtherCAT cycle, which follows the master's process-data
  exchange, and the serial device's step_on_command; the simulated arm's time then advances one dt per
  exchange and stands still while the host is silent.
* Fault injection (sim.faults): each response draws frame_fate(); DROP, CORRUPT and BAD_CRC send nothing
  (Modbus TCP has no checksum of its own: TCP's discards a corrupted segment, so the host sees a lost
  response), silent sends no response at all, latency() delays the response.
* The server runs pymodbus's asyncio server in the thread "armid-gateway" with its own event loop; the
  register store is pymodbus's SimDevice, whose action hook does the checks above.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import NamedTuple

import numba
import numpy as np
from pymodbus.constants import ExcCodes
from pymodbus.server import ModbusTcpServer
from pymodbus.server.requesthandler import ServerRequestHandler
from pymodbus.simulator import DataType, SimData, SimDevice

from firmware_bridge import cia402
from firmware_bridge import gateway as gw
from firmware_bridge.units import (CURRENT_LSB, ENCODER_COUNTS_PER_REV, INT32_MAX, TORQUE_CONSTANT_LSB, TORQUE_LSB,
                                   JointScaling, wire_gear_ratio)
from firmware_bridge.runtime.errors import InputError
from firmware_bridge.runtime.options import Option, OptionSet
from firmware_bridge.runtime.setpoint_buffer import MAX_DEPTH
from sim.device_contract import StepOrFreeRun
from sim.drive_targets import DeviceTargets, setpoints_for_device, target_limits, target_refusal
from sim.faults import Fate

_log = logging.getLogger(__name__)
_START_TIMEOUT = 10.0   # s to wait for the server to listen
_STOP_TIMEOUT = 5.0     # s to wait for the shutdown and the thread
_READ_FUNCTIONS = (3, 4)
_REGISTER_FUNCTIONS = (3, 4, 6, 16, 22, 23)
_OE_MASK, _OE_VALUE = cia402.STATE_PATTERNS[cia402.State.OPERATION_ENABLED]
_CW = np.asarray([gw.holding_address("controlword", k) - gw.HOLDING_BASE for k in range(gw.MAX_DRIVES)])
_WATCHDOG = gw.holding_address("watchdog") - gw.HOLDING_BASE
_TIMEOUT = gw.holding_address("watchdog_timeout_ms") - gw.HOLDING_BASE
# the rows of the value arrays _fill_inputs fills and _write reads (gw.*_into keep the Field tables' order)
assert tuple(f.name for f in gw.INPUT_DRIVE) == ("statusword", "mode_display", "error_code", "position", "velocity",
                                                 "current", "torque")
assert tuple(f.name for f in gw.HOLDING_DRIVE) == ("controlword", "mode", "target_position", "target_torque",
                                                  "torque_offset")
_WIRE_MAX = float(INT32_MAX)
_SW_FAULT = int(cia402.SW_FAULT)
_DATA_VALID, _DRIVE_FAULT = gw.STATUS_DATA_VALID, gw.STATUS_DRIVE_FAULT


@numba.njit(cache=True, nogil=True)
def _fill_inputs(si, statusword, mode_display, error_code, drives):
    """A cycle's values into the input image's drive rows (7, n) int64: statusword, mode display, error code,
    then si (4, n: position, velocity, current, torque already in wire units, not rounded) rounded, when every
    one of them fits int32 (else the rows keep the last representable values). The status bits: data valid
    (all fitted) and drive fault (some statusword has the fault bit)."""
    n = si.shape[1]
    status = _DATA_VALID
    for i in range(4):
        for j in range(n):
            if not abs(si[i, j]) <= _WIRE_MAX:       # False for NaN too
                status = 0
    for j in range(n):
        drives[0, j] = statusword[j]
        drives[1, j] = mode_display[j]
        drives[2, j] = error_code[j]
        if statusword[j] & _SW_FAULT:
            status |= _DRIVE_FAULT
        if status & _DATA_VALID:
            for i in range(4):
                drives[3 + i, j] = np.int64(np.rint(si[i, j]))
    return status


class _Snapshot(NamedTuple):
    """One cycle's values as the cycle callback left them: si (4, n) = position, velocity, current,
    torque already multiplied into wire units (not yet rounded)."""

    cycle: int
    time: float
    si: np.ndarray
    statusword: np.ndarray
    mode_display: np.ndarray
    error_code: np.ndarray
    watchdog_expired: bool


GATEWAY_DEVICE_OPTIONS = OptionSet(
    "gateway device",
    Option("host", "text", "127.0.0.1", what="an address to listen on", doc="the address to listen on"),
    Option("port", "integer", 0, low=0, high=65535, doc="the Modbus TCP port (0: a free one, then `.port`)"),
    Option("watchdog_s", "number", 0.1, low=0.001, high=65.535, unit="s", nullable=True,
           doc="the host watchdog time (none: disabled until the host writes watchdog_timeout_ms)"),
    Option("step_on_exchange", "flag", False,
           doc="host-clocked: each accepted write of process data runs one simulator cycle, after the write and "
               "before the request's read (false: the simulator's own clock)"),
    Option("target_buffer", "integer", None, low=0, high=MAX_DEPTH, unit="cycles", nullable=True,
           doc="depth of the drives' setpoint buffer (none: 3 when free-running, 0 when host-clocked)"))


class GatewayDevice(StepOrFreeRun):
    """Modbus TCP gateway in front of the simulated drives: GatewayDevice(**options) (GATEWAY_DEVICE_OPTIONS).
    Counters: refused_writes, dropped_responses, watchdog_trips, exchanges (cycles run by writes when
    host-clocked); last_refusal is the last refused write's reason.
    """

    OPTION_SPEC = GATEWAY_DEVICE_OPTIONS

    def __init__(self, **options):
        opts = GATEWAY_DEVICE_OPTIONS.parse(options)
        host, port, watchdog_s = opts.host, opts.port, opts.watchdog_s
        self.step_on_exchange = self.host_clocked = opts.step_on_exchange
        self.setpoints = setpoints_for_device(opts.target_buffer, self.step_on_exchange, "gateway device")
        self.exchanges = 0
        self.host, self.port = host, port
        self._timeout_ms = 0 if watchdog_s is None else int(round(watchdog_s * 1000))
        self.refused_writes = 0
        self.dropped_responses = 0
        self.watchdog_trips = 0
        self.last_refusal = ""
        self._sim = None
        self._lock = threading.Lock()           # the holding image, the watchdog
        self._holding = np.zeros(0, np.int64)
        self._inputs: list[int] = []
        self._last_watchdog = 0.0
        self._expired = False
        self._server: ModbusServerThread | None = None

    # -- DeviceSide --------------------------------------------------------------------------------
    def attach(self, sim) -> None:
        """Bind to the simulator (called by Simulator.__init__): scaling, limits, cycle callback."""
        n, model = sim.n, sim.model
        if n > gw.MAX_DRIVES:
            raise InputError(f"gateway: {n} drives, the layout serves at most {gw.MAX_DRIVES}")
        self._sim, self._n = sim, n
        counts_per_rev = sim.plant.noise.encoder_counts or ENCODER_COUNTS_PER_REV
        gears = [wire_gear_ratio(g) for g in model.gear_ratio]
        self._scaling = JointScaling.from_gear([float(g) for g in gears], counts_per_rev)
        self._limits = target_limits(model, self._scaling.counts_per_rad)
        self.drive_targets = DeviceTargets(sim, self.setpoints)
        self.targets = self.drive_targets.streams
        self._scaling_words = gw.encode_scaling(gw.ScalingImage(
            counts_per_rev=np.full(n, counts_per_rev, np.int64),
            gear_numerator=np.array([g.numerator for g in gears], np.int64),
            gear_denominator=np.array([g.denominator for g in gears], np.int64),
            torque_constant=np.rint(np.asarray(model.torque_constant) / TORQUE_CONSTANT_LSB).astype(np.int64))).tolist()
        self._cw_at = _CW[:n]
        sc = self._scaling
        self._wire_scale = np.stack([sc.counts_per_rad, sc.counts_per_rad, np.full(n, 1.0 / CURRENT_LSB),
                                     np.full(n, 1.0 / TORQUE_LSB)])
        # the input image: header and drive values (wire units; the drives' rows keep the last representable
        # values) and its words, encoded with gw.encode_inputs_into
        self._in_header = np.zeros(len(gw.INPUT_HEADER), np.int64)
        self._in_drives = np.zeros((len(gw.INPUT_DRIVE), n), np.int64)
        self._in_words = np.zeros(gw.input_count(n), np.uint16)
        # a write: the holding image decoded into these (gw.decode_outputs_into)
        self._out_header = np.zeros(len(gw.HOLDING_HEADER), np.int64)
        self._out_drives = np.zeros((len(gw.HOLDING_DRIVE), n), np.int64)
        self._out_rows = tuple(self._out_drives)       # controlword, mode, target_position, target_torque, offset
        self._snapshot: _Snapshot | None = None
        self._encoded_from: _Snapshot | None = None
        # compile (or load from numba's cache) the kernels now, not at the first cycle or the first write
        _fill_inputs(np.zeros((4, n)), np.zeros(n, np.uint16), np.zeros(n, np.int8), np.zeros(n, np.uint16),
                     self._in_drives)
        self._inputs = gw.encode_inputs_into(self._in_header, self._in_drives, self._in_words).tolist()
        gw.decode_outputs_into(np.array(gw.encode_outputs_into(self._out_header, self._out_drives, np.zeros(
            gw.holding_count(n), np.uint16)), np.int64), self._out_header, self._out_drives)
        sim.add_cycle_callback(self._on_cycle)

    def start(self) -> None:
        """Listen (bounded wait; InputError if the address cannot be bound). Idempotent."""
        if self._server is not None:
            return
        if self._sim is None:
            raise RuntimeError("gateway: attach(sim) first (Simulator(model, transport=GatewayDevice(...)))")
        state = self._sim.read_state()
        self._holding = gw.encode_outputs(gw.OutputImage(
            0, self._timeout_ms, np.zeros(self._n, np.int64), state.mode_display.astype(np.int64),
            self._scaling.position_to_counts(state.position), np.zeros(self._n, np.int64))).astype(np.int64)
        self._last_watchdog, self._expired, self._host_seen = time.monotonic(), False, False
        self.drive_targets.start_from(state.position)
        device = register_device(self._holding.tolist(), self._inputs, action=self._action, mirror=True,
                                 scaling=self._scaling_words)
        server = ModbusServerThread(device, self.host, self.port, trace_packet=self._trace_packet)
        try:
            self.port = server.start()
        except (OSError, RuntimeError, TimeoutError) as exc:
            raise InputError(f"gateway: cannot listen on {self.host}:{self.port}: {exc}") from None
        self._server = server
        _log.info("Modbus TCP gateway listening on %s:%d (%d drives, layout %d)", self.host, self.port, self._n,
                  gw.LAYOUT_VERSION)

    def stop(self) -> None:
        """Shut the server down, join its thread, release the port (bounded waits). Idempotent."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    def connection(self) -> dict:
        """The driver's [transport] options that reach this gateway."""
        return {"host": self.host, "port": self.port}

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the server listens on (the real port once started)."""
        return self.host, self.port

    def _trace_packet(self, sending: bool, data: bytes) -> bytes:
        """pymodbus hook on every packet: a response whose fate is not DELIVER is not sent."""
        if not sending or self._sim.faults.frame_fate() is Fate.DELIVER:
            return data
        self.dropped_responses += 1
        return b""

    async def _action(self, function_code: int, start: int, address: int, count: int,
                      registers: list[int], values: list[int] | None) -> ExcCodes | None:
        """pymodbus SimDevice hook, before each access: refresh the registers, check and apply writes."""
        if function_code not in _REGISTER_FUNCTIONS:
            return ExcCodes.ILLEGAL_FUNCTION
        if values is not None or function_code in _READ_FUNCTIONS:  # once per request
            delay = self._sim.faults.latency()
            if delay:
                await asyncio.sleep(delay)
        if function_code == 4:
            if start != gw.INPUT_BASE:             # the scaling block: constant
                return None
            inputs = self._encoded()
            registers[:len(inputs)] = inputs
            return None
        with self._lock:
            if values is not None:
                refused = self._write(address - start, values)
                if refused is not None:
                    return refused
            registers[:len(self._holding)] = self._holding.tolist()
        if values is not None and self.step_on_exchange and (
                address - start + len(values) > gw.HOLDING_HEADER_SIZE or self.exchanges == 0):
            # host-clocked: an accepted write of process data is one cycle (its commands latched at the cycle's
            # start), run before the request's read part; a write of the watchdog words alone (a host's
            # reconnection) runs none, but the first write of all runs the first. Outside the lock: the
            # cycle's watchdog check may take it
            self._sim.step(1)
            self.exchanges += 1
        if values is None and address + count > gw.INPUT_MIRROR_BASE:     # a read of the mirror (3, 23)
            inputs = self._encoded()
            at = gw.INPUT_MIRROR_BASE - start
            registers[at:at + len(inputs)] = inputs
        return None

    # -- holding registers: the host's commands ------------------------------------------------------
    def _write(self, offset: int, values: list[int]) -> ExcCodes | None:
        """Apply a write at `offset` (registers from HOLDING_BASE) as one command image, or refuse it."""
        new = self._holding.copy()
        new[offset:offset + len(values)] = values
        written = range(offset, offset + len(values))
        header, (controlword, mode, position, torque, offset) = self._out_header, self._out_rows
        try:
            gw.decode_outputs_into(new, header, self._out_drives)
            if _TIMEOUT in written and header[1] == 0 and self._holding[_TIMEOUT] != 0:
                raise gw.GatewayError("watchdog_timeout_ms: 0 would switch the host watchdog off")
            target = self._scaling.counts_to_position(position)
            torque = self._scaling.raw_to_torque(torque)
            offset = self._scaling.raw_to_torque(offset)
            refusal = target_refusal(target, torque, *self._limits, self._sim.model.joint_names, offset=offset)
            if refusal is not None:
                raise gw.GatewayError(refusal)
            self.drive_targets.arrived(controlword, mode, target, torque, offset)
        except (gw.GatewayError, InputError) as exc:
            self.refused_writes += 1
            self.last_refusal = str(exc)
            return ExcCodes.ILLEGAL_VALUE
        self._holding = new
        self._host_seen = True
        if _WATCHDOG in written:
            self._last_watchdog, self._expired = time.monotonic(), False
        return None

    @property
    def target_counts(self) -> dict[str, int]:
        """Cycles in which a drive streaming CSP targets got no new one, and what it did (sim.drive_targets)."""
        return self.targets.counts.as_dict()

    # -- every cycle (the simulator's stepping thread) -----------------------------------------------
    def _on_cycle(self, sample) -> None:
        """Keep this cycle's values (copies, swapped in whole); encoding waits for a read (_encoded). Then the
        drives' targets for the next cycle (sim.drive_targets)."""
        with self._lock:
            self.drive_targets.after_cycle()
        si = np.array((sample.position, sample.velocity, sample.current, sample.torque))
        si *= self._wire_scale   # JointScaling's factors: counts/rad, counts/s per rad/s, 1/uA, 1/mN m
        expired = self._watchdog(sample.statusword)
        self._snapshot = _Snapshot(sample.cycle, sample.time, si, sample.statusword.copy(),
                                   sample.mode_display.copy(), sample.error_code.copy(), expired)

    def _encoded(self) -> list[int]:
        """The input registers of the latest cycle (encoded once per cycle, at the first read)."""
        snap = self._snapshot
        if snap is None or snap is self._encoded_from:
            return self._inputs
        status = _fill_inputs(snap.si, snap.statusword, snap.mode_display, snap.error_code, self._in_drives)
        if snap.watchdog_expired:
            status |= gw.STATUS_WATCHDOG_EXPIRED
        header = self._in_header
        header[2] = status                              # INPUT_HEADER's order: layout, count, status, ...
        header[3] = self.refused_writes & 0xFFFF
        header[4] = snap.cycle & 0xFFFFFFFF
        header[5] = int(round(snap.time * 1e6)) & 0xFFFFFFFF
        self._inputs = gw.encode_inputs_into(header, self._in_drives, self._in_words).tolist()
        self._encoded_from = snap
        return self._inputs

    def _watchdog(self, statusword: np.ndarray) -> bool:
        """Quick-stop the enabled drives once the host watchdog has run out; True while it has."""
        timeout_ms = self._holding[_TIMEOUT] if len(self._holding) else 0
        if timeout_ms == 0 or not self._host_seen or time.monotonic() - self._last_watchdog <= timeout_ms / 1000:
            return self._expired
        enabled = (statusword & _OE_MASK) == _OE_VALUE
        with self._lock:
            if time.monotonic() - self._last_watchdog <= self._holding[_TIMEOUT] / 1000:
                return self._expired   # the host wrote it meanwhile
            self._expired = True
            if enabled.any():
                cw = self._holding[self._cw_at].copy()
                cw[enabled] = cia402.CW_QUICK_STOP
                self._holding[self._cw_at] = cw
                self._sim.set_commands(controlword=cw)
                self.watchdog_trips += 1
        return True



def register_device(holding: list[int], inputs: list[int], action=None, mirror: bool = False,
                    scaling: list[int] | None = None) -> SimDevice:
    """pymodbus's register store for the gateway layout: holding registers from HOLDING_BASE, input
    registers from INPUT_BASE (initial words given), with mirror=True the input image again as read-only
    holding registers from INPUT_MIRROR_BASE (the action keeps them current), the scaling words (given)
    as input registers from SCALING_BASE; no coils or discrete inputs worth the name (one placeholder each;
    the gateway's action refuses bit functions)."""
    holding_blocks = [SimData(gw.HOLDING_BASE, values=list(holding), datatype=DataType.REGISTERS)]
    if mirror:
        holding_blocks.append(SimData(gw.INPUT_MIRROR_BASE, values=list(inputs), datatype=DataType.REGISTERS,
                                      readonly=True))
    return SimDevice(id=0, action=action, simdata=(
        [SimData(0, values=False, datatype=DataType.BITS)],
        [SimData(0, values=False, datatype=DataType.BITS)],
        holding_blocks,
        [SimData(gw.INPUT_BASE, values=list(inputs), datatype=DataType.REGISTERS)]
        + ([] if scaling is None else [SimData(gw.SCALING_BASE, values=list(scaling), datatype=DataType.REGISTERS)])))


class _InLoopRequestHandler(ServerRequestHandler):
    """pymodbus's request handler, scheduling each request's coroutine directly on the running loop.

    pymodbus (3.16) hands every decoded request to `asyncio.run_coroutine_threadsafe` from inside the loop's
    own thread, which writes the loop's self-pipe and costs one more epoll wake-up per request: about a third
    of the server's CPU per request (benchmarks/bench_gateway.py measures both)."""

    def handle_later(self):
        self.loop.create_task(self.handle_request())


class FastModbusTcpServer(ModbusTcpServer):
    """ModbusTcpServer whose connections use _InLoopRequestHandler (same protocol, same datastore)."""

    def callback_new_connection(self):
        return _InLoopRequestHandler(self, self.trace_packet, self.trace_pdu, self.trace_connect)


class ModbusServerThread:
    """pymodbus's asyncio ModbusTcpServer for one SimDevice, in its own thread ("armid-gateway") and event
    loop. start() returns the port it listens on (bounded wait); stop() shuts it down and joins the thread."""

    def __init__(self, device: SimDevice, host: str, port: int, trace_packet=None, server_class=FastModbusTcpServer):
        self.device, self.host, self.port, self.trace_packet = device, host, port, trace_packet
        self.server_class = server_class
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: ModbusTcpServer | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> int:
        """Listen; the port (RuntimeError/OSError when the address cannot be bound, TimeoutError)."""
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._serve, name="armid-gateway", daemon=True)
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT) or self._error is not None:
            error = self._error or TimeoutError(f"not listening after {_START_TIMEOUT} s")
            self.stop()
            raise error
        return self.port

    def stop(self) -> None:
        """Shut the server down and join its thread (bounded waits). Idempotent."""
        thread, loop, server = self._thread, self._loop, self._server
        if thread is None:
            return
        if loop is not None and server is not None:
            try:
                asyncio.run_coroutine_threadsafe(server.shutdown(), loop).result(_STOP_TIMEOUT)
            except (RuntimeError, TimeoutError, asyncio.TimeoutError):
                pass  # the loop already ended: the thread's finally has closed everything
        thread.join(_STOP_TIMEOUT)
        if thread.is_alive():
            raise RuntimeError("gateway: the server thread did not stop")
        self._thread = self._loop = self._server = None

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:
            self._error = exc
        finally:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(asyncio.sleep(0))  # let the closed transports' callbacks run
            loop.close()
            asyncio.set_event_loop(None)
            self._ready.set()

    async def _main(self) -> None:
        server = self.server_class(self.device, address=(self.host, self.port), trace_packet=self.trace_packet)
        await server.serve_forever(background=True)   # RuntimeError when the address cannot be bound
        self.port = server.transport.sockets[0].getsockname()[1]
        self._loop, self._server = asyncio.get_running_loop(), server
        self._ready.set()
        await server.serving
