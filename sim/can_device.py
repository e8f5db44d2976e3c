"""The simulator's CAN device side: one CiA 402 drive per joint, each a python-canopen `LocalNode` (node ids
1..n) with the armid EDS, on one `canopen.Network` over any python-can bus.

python-canopen does the protocols: the SDO server, NMT slave (boot-up, heartbeat producer at 0x1017),
the PDO configuration (maps read from the object dictionary, communication parameters) and EMCY producer.
The cyclic PDOs themselves take a leaner path than canopen's PdoMap objects (tens of microseconds a frame):
RPDOs are decoded straight from the network's dispatch, TPDOs are packed in place into preallocated messages
with firmware_bridge's PdoCodec and sent through the fault injection. This module adds what a LocalNode
leaves to the application, the way a drive's firmware would:

  * SYNC (COB-ID 0x080): latch the RPDOs received since the last SYNC (one Simulator.set_commands for all
    drives), step the simulator one cycle, then send each OPERATIONAL node's TPDOs (transmission type n:
    every n-th SYNC; 0: on SYNC when the payload changed) with the new sample;
  * a SYNC without a new CSP target from a drive streaming them (its RPDO1 lost, late, or repeating the last
    target): the drive continues the targets it received for up to DriveConfig.extrapolated_targets SYNCs,
    then holds the last one (sim.drive_targets, the same on every transport); counted;
  * RPDOs (OPERATIONAL only) become commands at the next SYNC, as synchronous RPDOs are latched; SDO writes
    of 0x6040, 0x6060, 0x607A, 0x6071, 0x2002 become Simulator.set_commands at once (the simulator too
    applies them at its next cycle); SDO reads of the process
    objects (0x6041, 0x6064, 0x606C, 0x2000, ...) return the latest sample; drive parameters (0x6065,
    0x6066, 0x607D, 0x6072, 0x6085, 0x605A) read and write Simulator.drive_parameters / configure_drive;
  * EMCY with the drive's error code (0x603F) and error register when a drive enters FAULT, the error
    reset EMCY (code 0) when it leaves it;
  * NMT: SDO is refused in STOPPED, PDOs only run in OPERATIONAL; reset node / communication restore the
    communication parameters and send a new boot-up;
  * PDO communication parameters (COB-ID valid bit, transmission type) writable by SDO; the mappings are
    static (CiA 301 allows it);
  * frames that do not fit (SYNC longer than 1 byte, RPDO of the wrong length or with a mode the drive does
    not have, SDO requests that are not 8 bytes, NMT commands that are not 2) are counted in `counts` and
    dropped; the device keeps running;
  * every frame it sends (PDO, SDO response, EMCY, heartbeat, boot-up) passes sim.faults: dropped (also while
    the bus is silent, and for BAD_CRC: a CAN controller discards a frame whose CRC fails), corrupted (one
    payload bit flipped, as if the CRC had missed it) or delayed by a latency spike.

Usage: `Simulator(model, transport=CanDevice(bus=can.Bus(interface="virtual", channel="x")))`, or
`CanDevice(interface="socketcan", channel="vcan0")` to open the bus at start(). Wire units and maps:
firmware_bridge.canopen_map, docs/reference/wire-can.md.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import can
import canopen
import numpy as np
from can.broadcastmanager import ThreadBasedCyclicSendTask
from canopen.sdo import SdoAbortedError

from firmware_bridge.can_socket import tune_udp_multicast, udp_receive_drops
from firmware_bridge import canopen_map as cm
from firmware_bridge.runtime.log_throttle import Throttle
from firmware_bridge import cia402
from firmware_bridge.units import ENCODER_COUNTS_PER_REV, JointScaling, WireValueError, wire_gear_ratio
from firmware_bridge.runtime.errors import InputError
from firmware_bridge.runtime.options import Option, OptionSet
from sim.device_contract import DeviceSide
from sim.drive_targets import streams_for, target_limits, target_refusal
from sim.can_objects import ABORT_VALUE_RANGE, MODES, fit_type, read_object, write_object
from sim.faults import Fate, FaultInjection

if TYPE_CHECKING:
    from sim.simulator import SimState, Simulator

log = logging.getLogger(__name__)
TROUBLE_LOG_INTERVAL_S = 10.0   # refused RPDOs, unsendable TPDOs: the first logged, then one line per interval

EDS_PATH = Path(str(resources.files("firmware_bridge") / "armid_drive.eds"))   # package data
_STOP_TIMEOUT = 2.0                 # s, bound on joining each thread at stop()
_NMT_RESET_NODE, _NMT_RESET_COMM = 129, 130
_COUNT_NAMES = ("sync_length", "rpdo_length", "rpdo_value", "rpdo_not_operational", "sdo_length",
                "sdo_not_available", "sdo_aborted", "nmt_length", "tx_value", "tx_failed", "rpdo_out_of_limits",
                "extended_id")
MALFORMED = ("sync_length", "rpdo_length", "rpdo_value", "sdo_length", "nmt_length", "extended_id")
_TPDO_FIELDS = tuple(p.fields for p in cm.TPDOS)
_COMMANDS = ("controlword", "mode", "target_position", "target_torque", "torque_offset")   # RPDO1 + RPDO2


def rpdo_commands(pdo: cm.PdoDef, data: bytes | bytearray, counts_per_rad: float,
                  rated_torque: float = 0.0) -> dict[str, float | int]:
    """The commands an RPDO payload carries, in Simulator.set_commands' arguments and units: controlword,
    mode, target_position (rad), target_torque (N m), torque_offset (N m: 0x60B2 per mille of rated_torque,
    N m, the drive's 0x6076). CanFrameError (naming the PDO and field) for a payload of the wrong length, a
    mode the drive does not have, or an offset on a drive without a rated torque; then nothing is commanded."""
    values = pdo.unpack(data)
    out: dict[str, float | int] = {}
    for e, v in zip(pdo.entries, values):
        if e.field == "controlword":
            out["controlword"] = v
        elif e.field == "mode":
            if v not in MODES:
                raise cm.CanFrameError(f"{pdo.name}: mode: {v} is not a supported mode ({sorted(MODES)})")
            out["mode"] = v
        elif e.field == "target_position":
            out["target_position"] = v / counts_per_rad
        elif e.field == "target_torque":
            out["target_torque"] = v * 1e-3
        elif e.field == "torque_offset":
            if v and not rated_torque > 0:
                raise cm.CanFrameError(f"{pdo.name}: torque_offset: {v} per mille of a rated torque (0x6076) this "
                                       f"drive does not have")
            out["torque_offset"] = v * 1e-3 * rated_torque
        else:
            raise cm.CanFrameError(f"{pdo.name}: {e.field}: not a command this device takes")
    return out


class _Counts:
    """Thread-safe tallies of frames refused or failed (see CanDevice.counts)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._d = dict.fromkeys(_COUNT_NAMES, 0)

    def add(self, name: str) -> None:
        with self._lock:
            self._d[name] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._d)


class _StandardIdsOnly(can.Listener):
    """In front of the canopen Network's listeners: the bus carries 11-bit identifiers only, so a 29-bit frame
    (whatever its low bits say: 0x080 is not a SYNC in it) is counted (extended_id) and dropped."""

    def __init__(self, listeners: list[can.Listener], counts: _Counts):
        self.listeners, self.counts = listeners, counts

    def on_message_received(self, msg: can.Message) -> None:
        if msg.is_extended_id:
            self.counts.add("extended_id")
            return
        for listener in self.listeners:
            listener.on_message_received(msg)


class _FaultyBus:
    """What the canopen Network sends through: every frame passes the fault injection, then the real bus.
    Also runs the periodic sends (heartbeat) through the same path, and joins their threads at close()."""

    def __init__(self, bus: can.BusABC, faults: FaultInjection, counts: _Counts, on_sent: Callable[[can.Message], None]):
        self.bus = bus
        self.faults = faults
        self.counts = counts
        self.on_sent = on_sent
        self.channel_info = f"fault injection over {bus.channel_info}"
        self._tasks: list[ThreadBasedCyclicSendTask] = []
        self._lock = threading.Lock()

    def send(self, msg: can.Message, timeout: float | None = None) -> None:
        fate = self.faults.frame_fate()
        if fate in (Fate.DROP, Fate.BAD_CRC):
            return
        if fate is Fate.CORRUPT:
            msg = can.Message(arbitration_id=msg.arbitration_id, is_extended_id=msg.is_extended_id,
                              data=self.faults.corrupt(bytes(msg.data)))
        delay = self.faults.latency()
        if delay:
            time.sleep(delay)
        try:
            self.bus.send(msg, timeout)
        except can.CanError as exc:   # a full queue or a bus-off: counted, the device goes on
            self.counts.add("tx_failed")
            log.debug("CAN send failed: %s", exc)
            return
        self.on_sent(msg)

    def send_periodic(self, msgs, period: float, duration: float | None = None, store_task: bool = True,
                      autostart: bool = True, modifier_callback=None) -> ThreadBasedCyclicSendTask:
        task = ThreadBasedCyclicSendTask(self, self._lock, msgs, period, duration, on_error=lambda exc: True,
                                         autostart=autostart, modifier_callback=modifier_callback)
        self._tasks.append(task)
        return task

    def close(self, timeout: float) -> None:
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.stop()
        for t in tasks:
            if t.thread is not None:
                t.thread.join(timeout)


@dataclass
class _Drive:
    """One joint's node and its PDO bookkeeping."""

    joint: int
    node: canopen.LocalNode
    tpdos: list[tuple[cm.PdoDef, canopen.pdo.PdoMap]] = field(default_factory=list)
    rpdos: list[tuple[cm.PdoDef, canopen.pdo.PdoMap]] = field(default_factory=list)
    last_sent: dict[int, bytes] = field(default_factory=dict)
    receivers: dict[int, Callable] = field(default_factory=dict)       # RPDO number -> its network callback
    tx_msgs: list[can.Message] = field(default_factory=list)            # one per TPDO, payload = the codec's
    latched: dict = field(default_factory=dict)                          # RPDO commands since the last SYNC
    faulted: bool = False
    # commanded values as the host wrote them (for SDO read-back): controlword, mode, counts, N m
    controlword: int = 0
    mode: int = 0
    target_counts: int = 0
    target_torque: float = 0.0
    torque_offset: float = 0.0

    def remember(self, commands: dict, counts_per_rad: float) -> None:
        """Keep what the host commanded (Simulator.set_commands arguments) for SDO read-back."""
        if "controlword" in commands:
            self.controlword = int(commands["controlword"])
        if "mode" in commands:
            self.mode = int(commands["mode"])
        if "target_position" in commands:
            self.target_counts = int(round(commands["target_position"] * counts_per_rad))
        if "target_torque" in commands:
            self.target_torque = float(commands["target_torque"])
        if "torque_offset" in commands:
            self.torque_offset = float(commands["torque_offset"])


CAN_DEVICE_OPTIONS = OptionSet(
    "can device",
    Option("bus", "any", in_config=False, doc="a python-can bus to use (left open at stop())"),
    Option("interface", "text", None, nullable=True, what="a python-can interface name",
           doc="without a bus: the python-can interface of the bus opened at start() (shut down at stop())"),
    Option("channel", "text or integer", None, nullable=True, what="the interface's channel",
           doc="its channel (vcan0, a udp_multicast group, ...)"),
    Option("bitrate", "integer", None, low=10_000, high=1_000_000, unit="bit/s", nullable=True,
           doc="its bit rate, for interfaces that set it"),
    Option("node_ids", "integers", None, low=cm.MIN_NODE_ID, high=cm.MAX_NODE_ID, nullable=True,
           doc="one node id per joint (none: 1..n)"),
    Option("heartbeat_ms", "integer", None, low=0, high=0xFFFF, unit="ms", nullable=True,
           doc="producer heartbeat time instead of the EDS default (0: none)"),
    Option("start_operational", "flag", False,
           doc="enter NMT OPERATIONAL after boot-up without waiting for the host's NMT start"),
    Option("eds", "path", EDS_PATH, doc="the object dictionary (EDS file)"))


class CanDevice(DeviceSide):
    """The device side of the CAN transport, clocked by the host's SYNC: CanDevice(**options)
    (CAN_DEVICE_OPTIONS): a python-can `bus`, or `interface` and `channel` to open one at start().
    """

    may_clock_simulator = True
    OPTION_SPEC = CAN_DEVICE_OPTIONS

    def __init__(self, **options):
        opts = CAN_DEVICE_OPTIONS.parse(options)
        bus, interface, channel, bitrate = opts.bus, opts.interface, opts.channel, opts.bitrate
        node_ids, heartbeat_ms, start_operational, eds = opts.node_ids, opts.heartbeat_ms, opts.start_operational, opts.eds
        if bus is None and interface is None:
            raise InputError("can device: give a python-can bus, or an interface (and channel) to open one")
        if bus is not None and (interface is not None or channel is not None or bitrate is not None):
            raise InputError("can device: give either a bus or interface/channel/bitrate, not both")
        self._bus_given = bus
        self._bus_options = {k: v for k, v in (("interface", interface), ("channel", channel), ("bitrate", bitrate))
                             if v is not None}
        self._node_ids = None if node_ids is None else [int(i) for i in node_ids]
        self._heartbeat_ms = heartbeat_ms
        self._start_operational = bool(start_operational)
        self._eds = str(eds)
        self._counts = _Counts()
        self._refused_log = Throttle(log, logging.WARNING, TROUBLE_LOG_INTERVAL_S)
        self._tx_log = Throttle(log, logging.WARNING, TROUBLE_LOG_INTERVAL_S)
        self.last_refusal = ""              # why the last RPDO was refused (its target outside the limits)
        self._lock = threading.Lock()       # start/stop
        self.sim: "Simulator | None" = None
        self.network: canopen.Network | None = None
        self.drives: list[_Drive] = []
        self.bus: can.BusABC | None = None
        self._faulty: _FaultyBus | None = None
        self._notifier: can.Notifier | None = None
        self._running = False
        self._sync_count = 0
        self.bus_tuning: dict[str, object] = {}     # tune_udp_multicast's answer for a bus opened here
        self._own_filtered: frozenset[int] = frozenset()   # ids the bus's kernel filter drops (ours)
        self._own_sent = 0                                  # frames sent with those ids
        self._sent_lock = threading.Lock()

    # -- DeviceSide ---------------------------------------------------------------------------------
    def clocks_simulator(self) -> bool:
        """True: each SYNC from the host runs one simulator cycle."""
        return True

    def attach(self, sim: "Simulator") -> None:
        """Build the n LocalNodes for `sim` (called by Simulator.__init__)."""
        if self.sim is not None:
            raise InputError("can: this CanDevice is already attached to a simulator")
        n, model = sim.n, sim.model
        ids = self._node_ids if self._node_ids is not None else [cm.node_id(j) for j in range(n)]
        if len(ids) != n or len(set(ids)) != n or not all(cm.MIN_NODE_ID <= i <= cm.MAX_NODE_ID for i in ids):
            raise InputError(f"can: node_ids: expected {n} distinct ids in 1..127, got {ids}")
        gear = np.asarray(model.gear_ratio, dtype=float)
        if np.any(gear <= 0):
            j = int(np.flatnonzero(gear <= 0)[0])
            raise InputError(f"can: joint {j + 1} ({model.joint_names[j]}): gear ratio {gear[j]:g}: 0x6091 has no sign, "
                             f"the CAN drive needs a positive gear ratio")
        self.sim = sim
        self.counts_per_rev = sim.plant.noise.encoder_counts or ENCODER_COUNTS_PER_REV
        self.gear_fractions = [wire_gear_ratio(g) for g in gear]
        self.scaling = JointScaling.from_gear([float(f) for f in self.gear_fractions], self.counts_per_rev)
        torque_per_amp = model.joint_torque_per_amp()
        self.rated_torque = np.where(np.isfinite(model.tau_max), model.tau_max, 0.0)     # N m (0: unknown)
        self.rated_current = np.divide(self.rated_torque, torque_per_amp, out=np.zeros(n),
                                       where=torque_per_amp != 0)                       # A
        self.targets = streams_for(sim)
        self._streaming = np.zeros(n, dtype=bool)
        self._limits = target_limits(model, self.scaling.counts_per_rad)
        self.network = canopen.Network()
        self.network.subscribe(cm.SYNC_COB_ID, self._on_sync)
        self._tx_codec = cm.PdoCodec(cm.TPDOS, ids)
        self._tx_fields = ()            # the sample fields the enabled TPDOs carry (_load_pdos)
        for j, nid in enumerate(ids):
            node = canopen.LocalNode(nid, canopen.objectdictionary.import_od(self._eds, nid))
            self.network.add_node(node)
            drive = _Drive(j, node)
            drive.tx_msgs = [can.Message(arbitration_id=p.cob_id(nid), is_extended_id=False,
                                         data=self._tx_codec.payloads[k][j]) for k, p in enumerate(cm.TPDOS)]
            drive.receivers = {p.number: functools.partial(self._on_rpdo, drive, p) for p in cm.RPDOS}
            self._guard_services(drive)
            self._store_constants(drive)
            node.add_read_callback(functools.partial(self._on_read, drive))
            node.add_write_callback(functools.partial(self._on_write, drive))
            self.drives.append(drive)
            self._load_pdos(drive)
        # one NMT handler for all nodes, with the length check before the library sees the frame
        self.network.unsubscribe(cm.NMT_COB_ID)
        self.network.subscribe(cm.NMT_COB_ID, self._on_nmt)

    def connection(self) -> dict:
        """The driver's [transport] options that reach this device (the bus it was opened on)."""
        if self._bus_given is not None:
            return {"interface": getattr(self._bus_given, "interface", type(self._bus_given).__name__),
                    "channel": str(self._bus_given.channel_info)}
        return dict(self._bus_options)

    def start(self) -> None:
        """Open the bus (unless given), start receiving, boot every node (boot-up, PRE-OPERATIONAL, heartbeat)."""
        with self._lock:
            if self._running:
                return
            if self.sim is None:
                raise RuntimeError("can: start() before attach(): pass the CanDevice to a Simulator")
            self.bus = self._bus_given if self._bus_given is not None else self._open_bus()
            self._faulty = _FaultyBus(self.bus, self.sim.faults, self._counts, self._on_sent)
            self.network.bus = self._faulty
            state = self.sim.read_state()
            for d in self.drives:
                d.faulted = bool(int(state.statusword[d.joint]) & cia402.SW_FAULT)
            self._notifier = can.Notifier(self.bus, [_StandardIdsOnly(self.network.listeners, self._counts)],
                                          timeout=0.05)
            self._running = True
            for d in self.drives:
                self._boot(d)

    def _open_bus(self) -> can.BusABC:
        """The bus from the interface options; on udp_multicast with its own group only, a large receive
        buffer and a kernel filter that drops the device's own frames handed back to it
        (firmware_bridge.can_socket.tune_udp_multicast, the driver's side does the same)."""
        try:
            bus = can.Bus(**self._bus_options)
        except (can.CanError, OSError, ValueError, ImportError) as exc:
            opts = ", ".join(f"{k}={v!r}" for k, v in self._bus_options.items())
            raise InputError(f"can: cannot open the CAN bus ({opts}): {exc}") from None
        own = self._own_ids
        self.bus_tuning = tune_udp_multicast(bus, own_ids=own)
        if self.bus_tuning.get("own_frames_filtered"):
            self._own_filtered = own
        return bus

    @property
    def _own_ids(self) -> frozenset[int]:
        """The ids only this device sends (every TPDO's default COB-ID, EMCY, SDO answers, heartbeat of each
        node): udp_multicast hands each frame back to its sender, and the bus's kernel filter drops these."""
        ids = {base + d.node.id for d in self.drives
               for base in (cm.EMCY_COB_BASE, cm.SDO_TX_COB_BASE, cm.HEARTBEAT_COB_BASE)}
        ids.update(p.cob_id(d.node.id) for d in self.drives for p in cm.TPDOS)
        return frozenset(ids)

    def udp_receive_drops(self) -> int | None:
        """Frames the kernel dropped at the device's udp_multicast socket for want of room; None on other
        buses or when stopped. The kernel counts the frames its filter dropped (our own, handed back) among
        its drops: those sent are taken off (a frame in flight may not be counted yet)."""
        bus = self.bus
        drops = None if bus is None else udp_receive_drops(bus)
        if drops is not None and self.bus_tuning.get("own_frames_filtered"):
            drops = max(drops - self._own_sent, 0)
        return drops

    def stop(self) -> None:
        """Stop the heartbeats and the receive thread (bounded joins); shut the bus down if we opened it."""
        with self._lock:
            if not self._running:
                return
            self._running = False
            self._report_losses()
            self._refused_log.flush()
            self._tx_log.flush()
            for d in self.drives:
                d.node.nmt.stop_heartbeat()
            self._faulty.close(_STOP_TIMEOUT)
            self._notifier.stop(_STOP_TIMEOUT)
            self._notifier = None
            self.network.bus = None
            if self._bus_given is None:
                self.bus.shutdown()
            self.bus = None

    def _report_losses(self) -> None:
        """One warning at stop when process data from the host went missing (it lands in `armid sim`'s stderr)."""
        c = self.counts
        drops = self.udp_receive_drops()
        if c["missed_targets"] or drops:
            log.warning("can: %d drive cycles found no CSP target (%d continued, %d held, repeated targets "
                        "included)%s", c["missed_targets"], c["extrapolated_targets"], c["held_targets"], "" if drops is None else f"; the kernel dropped {drops} frames "
                        f"at the socket")

    @property
    def running(self) -> bool:
        """True between start() and stop()."""
        return self._running

    @property
    def counts(self) -> dict[str, int]:
        """Frames refused or failed, by cause: sync_length, rpdo_length, rpdo_value (unsupported mode),
        rpdo_not_operational, sdo_length, sdo_not_available (NMT STOPPED), sdo_aborted (abort responses
        sent), nmt_length, tx_value (a sample not representable in int32), tx_failed (bus send errors),
        rpdo_out_of_limits (RPDOs with a target outside the joint's limits: refused whole), extended_id (29-bit
        frames on a 11-bit-only bus); and per drive, SYNCs without a new CSP target (sim.drive_targets):
        missed_targets (nothing came), repeated_targets (the last target again), early_targets (it came with
        the SYNC before), and what the drive did on a missed or repeated one: extrapolated_targets,
        held_targets."""
        c = self._counts.snapshot()
        c.update(self.targets.counts.as_dict())
        return c

    @property
    def malformed(self) -> int:
        """Malformed frames received and dropped so far."""
        c = self._counts.snapshot()
        return sum(c[k] for k in MALFORMED)

    def node_ids(self) -> list[int]:
        """The node id of each joint's drive, in joint order."""
        return [d.node.id for d in self.drives]

    # -- setup ---------------------------------------------------------------------------------------
    def _guard_services(self, d: _Drive) -> None:
        """Put length / NMT-state checks in front of the library's SDO server."""
        node = d.node
        self.network.unsubscribe(node.sdo.rx_cobid, node.sdo.on_request)
        self.network.subscribe(node.sdo.rx_cobid, functools.partial(self._on_sdo_request, d))

    def _store_constants(self, d: _Drive) -> None:
        j, node = d.joint, d.node
        frac = self.gear_fractions[j]
        values = {
            (cia402.POSITION_ENCODER_RESOLUTION, 1): self.counts_per_rev,
            (cia402.POSITION_ENCODER_RESOLUTION, 2): 1,
            (cia402.GEAR_RATIO, 1): frac.numerator,
            (cia402.GEAR_RATIO, 2): frac.denominator,
            (cia402.RATED_TORQUE, 0): fit_type(cm.UNSIGNED32, self.rated_torque[j] * 1e3),
            (cia402.RATED_CURRENT, 0): fit_type(cm.UNSIGNED32, self.rated_current[j] * 1e3),
            (cm.IDENTITY, 4): node.id,
        }
        if self._heartbeat_ms is not None:
            values[(cm.PRODUCER_HEARTBEAT_TIME, 0)] = self._heartbeat_ms
        for (index, sub), v in values.items():
            self._store(node, index, sub, v)

    @staticmethod
    def _store(node: canopen.LocalNode, index: int, sub: int, value: int) -> None:
        obj = node.object_dictionary[index]
        if not isinstance(obj, canopen.objectdictionary.ODVariable):
            obj = obj[sub]
        node.data_store.setdefault(index, {})[sub] = obj.encode_raw(value)

    def _load_pdos(self, d: _Drive) -> None:
        """The node's PDO maps from its object dictionary defaults, checked against canopen_map; the RPDOs'
        COB-IDs dispatch to _on_rpdo (canopen's own PdoMap handlers stay unsubscribed)."""
        for pdef, pdo_map in d.rpdos:
            self._unsubscribe(pdo_map.cob_id, d.receivers[pdef.number])
        for maps in (d.node.tpdo, d.node.rpdo):
            maps.read(from_od=True)
            for pdo_map in maps.map.values():
                if pdo_map.cob_id is not None:
                    self._unsubscribe(pdo_map.cob_id, pdo_map.on_message)
        d.tpdos, d.rpdos = [], []
        for defs, maps, out in ((cm.TPDOS, d.node.tpdo, d.tpdos), (cm.RPDOS, d.node.rpdo, d.rpdos)):
            for pdef in defs:
                pdo_map = maps.map[pdef.number]
                got = tuple((v.index, v.subindex, v.length) for v in pdo_map.map)
                want = tuple((e.index, e.subindex, e.bits) for e in pdef.entries)
                if got != want or pdo_map.cob_id != pdef.cob_id(d.node.id) or pdo_map.enabled != pdef.enabled:
                    raise InputError(f"can: {self._eds}: {pdef.name} of node {d.node.id} does not match "
                                     f"firmware_bridge.canopen_map ({got} vs {want})")
                out.append((pdef, pdo_map))
                if not pdef.transmit and pdo_map.enabled:
                    self.network.subscribe(pdo_map.cob_id, d.receivers[pdef.number])
        d.last_sent.clear()
        self._update_tx_fields()

    def _update_tx_fields(self) -> None:
        self._tx_fields = tuple(dict.fromkeys(f for d in self.drives for pdef, m in d.tpdos if m.enabled
                                              for f in pdef.fields))

    def _unsubscribe(self, cob_id: int, callback) -> None:
        if callback in self.network.subscribers.get(cob_id, []):
            self.network.unsubscribe(cob_id, callback)

    def _boot(self, d: _Drive) -> None:
        nmt = d.node.nmt
        nmt.state = "INITIALISING"        # boot-up message
        nmt.state = "PRE-OPERATIONAL"     # heartbeat starts at 0x1017's period
        if self._start_operational:
            nmt.state = "OPERATIONAL"

    # -- received frames (all in the notifier thread) ------------------------------------------------
    def _on_sync(self, can_id: int, data: bytearray, timestamp: float) -> None:
        if len(data) > 1:
            self._counts.add("sync_length")
            return
        self._latch_rpdos()
        sample = self.sim.step(1)
        self._sync_count += 1
        try:
            wire = self._wire_values(sample)
        except WireValueError as exc:
            self._counts.add("tx_value")
            self._tx_log.hit("can: TPDOs not sent this cycle: %s", exc)
            wire = None
        for d in self.drives:
            state = d.node.nmt.state
            if wire is not None and state == "OPERATIONAL":
                self._send_tpdos(d, wire)
            self._check_fault(d, sample, state)

    def _wire_values(self, s: "SimState") -> dict[str, list[int]]:
        """The fields of the enabled TPDOs in wire units, {field: one int per joint}; WireValueError if one
        does not fit its type."""
        sc = self.scaling
        convert = {
            "statusword": lambda: s.statusword, "mode_display": lambda: s.mode_display,
            "position_actual": lambda: sc.position_to_counts(s.position),
            "velocity_actual": lambda: sc.velocity_to_counts(s.velocity),
            "current_actual": lambda: sc.current_to_raw(s.current),
            "torque_actual": lambda: sc.torque_to_raw(s.torque),
            "following_error_actual": lambda: sc.position_to_counts(s.following_error),
            "time_stamp": lambda: np.full(len(self.drives), cm.time_stamp(s.time), dtype=np.int64),
        }
        return {f: convert[f]().tolist() for f in self._tx_fields}

    def _send_tpdos(self, d: _Drive, wire: dict[str, list[int]]) -> None:
        j = d.joint
        for k, (pdef, pdo_map) in enumerate(d.tpdos):
            tt = pdo_map.trans_type
            if not pdo_map.enabled or (tt and self._sync_count % tt):
                continue
            payload = self._tx_codec.encode(k, j, [wire[f][j] for f in _TPDO_FIELDS[k]])
            if tt == 0:
                if d.last_sent.get(pdef.number) == payload:
                    continue
                d.last_sent[pdef.number] = bytes(payload)
            msg = d.tx_msgs[k]
            msg.arbitration_id = pdo_map.cob_id
            with self.network.send_lock:
                self._faulty.send(msg)

    def _latch_rpdos(self) -> None:
        """The RPDO commands received since the last SYNC become the simulator's (one set_commands when every
        drive got both RPDOs, as a host sends them; per drive otherwise). A drive streaming CSP targets without
        a new one follows what sim.drive_targets makes of the targets it received."""
        self._follow_targets()
        latched = [d.latched for d in self.drives]
        if not any(latched):
            return
        try:
            if all(len(c) == len(_COMMANDS) for c in latched):
                self.sim.set_commands(**{k: [c[k] for c in latched] for k in _COMMANDS})
            else:
                for j, c in enumerate(latched):
                    if c:
                        self.sim.set_commands(joint=j, **c)
        except InputError:      # cannot happen for frames rpdo_commands accepted; counted if it does
            self._counts.add("rpdo_value")
        for c in latched:
            c.clear()

    def _follow_targets(self) -> None:
        """At a SYNC: each OPERATIONAL drive in CSP follows its CSP targets (TargetStreams, which _on_rpdo fed:
        the newest, the one that came early, a continuation of the received ones, or the last received one),
        into d.latched where that is not the target latched from this cycle's RPDO1."""
        streaming = self._streaming
        for d in self.drives:
            streaming[d.joint] = d.mode == cia402.Mode.CSP and d.node.nmt.state == "OPERATIONAL"
        target = self.targets.cycle(streaming)
        following = self.targets.following
        for d in self.drives:
            j = d.joint
            if streaming[j] and following[j] and d.latched.get("target_position") != target[j]:
                d.latched["target_position"] = float(target[j])

    def _check_fault(self, d: _Drive, sample: "SimState", nmt_state: str) -> None:
        faulted = bool(int(sample.statusword[d.joint]) & cia402.SW_FAULT)
        if faulted == d.faulted:
            return
        d.faulted = faulted
        if nmt_state not in ("OPERATIONAL", "PRE-OPERATIONAL"):
            return
        if faulted:
            code = int(sample.error_code[d.joint])
            d.node.emcy.send(code, cm.error_register(code))
        else:
            d.node.emcy.reset(0)

    def _on_rpdo(self, d: _Drive, pdef: cm.PdoDef, can_id: int, data: bytearray, timestamp: float) -> None:
        """An RPDO frame (network dispatch, notifier thread): a whole valid frame is latched for the next
        SYNC; anything else is counted and dropped."""
        if d.node.nmt.state != "OPERATIONAL":
            self._counts.add("rpdo_not_operational")
            return
        if len(data) != pdef.dlc:
            self._counts.add("rpdo_length")
            return
        try:
            commands = rpdo_commands(pdef, data, self.scaling.counts_per_rad[d.joint], self.rated_torque[d.joint])
        except cm.CanFrameError:
            self._counts.add("rpdo_value")
            return
        refusal = self.target_refusal(d.joint, commands)
        if refusal is not None:
            self._counts.add("rpdo_out_of_limits")
            self.last_refusal = f"node {d.node.id}: {pdef.name}: {refusal}"
            self._refused_log.hit("can: %s refused", self.last_refusal)
            return
        d.latched.update(commands)
        d.remember(commands, self.scaling.counts_per_rad[d.joint])
        if "target_position" in commands:
            self.targets.receive(d.joint, commands["target_position"])

    def target_refusal(self, joint: int, commands: dict) -> str | None:
        """Why drive `joint` refuses these commands (Simulator.set_commands arguments), or None: a target
        outside the joint's limits, a torque offset beyond them alone or with the target torque
        (sim.drive_targets.target_refusal)."""
        return target_refusal(commands.get("target_position"), commands.get("target_torque"), *self._limits,
                              self.sim.model.joint_names, first_joint=joint, offset=commands.get("torque_offset"))

    def _on_sdo_request(self, d: _Drive, can_id: int, data: bytearray, timestamp: float) -> None:
        if len(data) != 8:
            self._counts.add("sdo_length")
            return
        if d.node.nmt.state == "STOPPED":
            self._counts.add("sdo_not_available")
            return
        d.node.sdo.on_request(can_id, data, timestamp)

    def _on_nmt(self, can_id: int, data: bytearray, timestamp: float) -> None:
        if len(data) != 2:
            self._counts.add("nmt_length")
            return
        command, target = data[0], data[1]
        for d in self.drives:
            if target not in (0, d.node.id):
                continue
            d.node.nmt.on_command(can_id, data, timestamp)
            if command in (_NMT_RESET_NODE, _NMT_RESET_COMM):
                self._reset(d, node=command == _NMT_RESET_NODE)

    def _reset(self, d: _Drive, node: bool) -> None:
        """NMT reset communication (and reset node): communication parameters back to their defaults,
        boot-up, PRE-OPERATIONAL. Reset node also disables the drive (controlword 0)."""
        d.node.nmt.stop_heartbeat()
        for index in [i for i in d.node.data_store if 0x1000 <= i < 0x2000]:
            del d.node.data_store[index]
        self._store_constants(d)
        self._load_pdos(d)
        if node:
            self.sim.set_commands(controlword=0, joint=d.joint)
            d.controlword = 0
        self._boot(d)

    # -- SDO access to live objects (sim.can_objects) --------------------------------------------------
    def _on_read(self, d: _Drive, index: int, subindex: int, od) -> int | None:
        value = read_object(self, d, index, subindex, od)
        if value is None and 0x1400 <= index < 0x1C00 and subindex in (1, 2):
            pdo_map = self._pdo_map(d, index)
            if pdo_map is not None:
                if subindex == 1:
                    return pdo_map.cob_id | (0 if pdo_map.enabled else cm.PDO_NOT_VALID)
                return pdo_map.trans_type
        return value

    def _on_write(self, d: _Drive, index: int, subindex: int, od, data: bytes) -> None:
        value = od.decode_raw(data)
        if not write_object(self, d, index, subindex, value) and 0x1400 <= index < 0x1C00:
            self._write_pdo_parameter(d, index, subindex, value)

    def _pdo_map(self, d: _Drive, comm_index: int):
        for pdef, pdo_map in d.tpdos + d.rpdos:
            if pdef.communication_index == comm_index:
                return pdo_map
        return None

    def _write_pdo_parameter(self, d: _Drive, index: int, subindex: int, value: int) -> None:
        """COB-ID (valid bit; a new id only while the PDO is not valid) and transmission type."""
        pdo_map = self._pdo_map(d, index)
        if pdo_map is None:
            return
        transmit = index >= 0x1800
        if subindex == 1:
            valid, cob = not value & cm.PDO_NOT_VALID, value & 0x1FFFFFFF
            if value & (1 << 29) or not 0 < cob <= 0x7FF or (pdo_map.enabled and valid and cob != pdo_map.cob_id):
                raise SdoAbortedError(ABORT_VALUE_RANGE)
            number = index - (0x1800 if transmit else 0x1400) + 1
            if not transmit:
                self._unsubscribe(pdo_map.cob_id, d.receivers[number])
            pdo_map.cob_id, pdo_map.enabled = cob, valid
            if not transmit and valid:
                self.network.subscribe(cob, d.receivers[number])
            d.last_sent.clear()
            self._update_tx_fields()
        elif subindex == 2:
            ok = value in cm.SYNC_TRANSMISSION_TYPES or (not transmit and value in cm.RPDO_ASYNC_TRANSMISSION_TYPES)
            if not ok:
                raise SdoAbortedError(ABORT_VALUE_RANGE)
            pdo_map.trans_type = value

    def _on_sent(self, msg: can.Message) -> None:
        if msg.arbitration_id in self._own_filtered:
            with self._sent_lock:
                self._own_sent += 1
        if cm.SDO_TX_COB_BASE < msg.arbitration_id <= cm.SDO_TX_COB_BASE + 0x7F and msg.data and msg.data[0] == 0x80:
            self._counts.add("sdo_aborted")


