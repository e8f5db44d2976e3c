"""The `can` transport: CiA 402 joint drives over CANopen (python-canopen on any python-can interface).

The host is the SYNC master. At open(), over SDO: each node's device type (0x1000), its counts per joint
radian (0x608F encoder resolution, 0x6091 gear ratio: checked against the model and `counts_per_rev`), its
PDO configuration (read back and compared with firmware_bridge.canopen_map), the producer heartbeat time
(0x1017) (driver/transports/can_setup.py); then NMT start and one SYNC whose TPDOs must come back (the
handshake); each drive's rated torque (0x6076), the unit of its torque offset (0x60B2, per mille). In the cycle:
write() sends RPDO1 (controlword, target position, mode) and RPDO2 (target torque, torque offset) to every drive and then SYNC, so the drives latch the command at once and answer with TPDO1 (statusword, position,
mode display), TPDO2 (velocity, current)
and TPDO4 (0x1013, their time stamp at the SYNC); the cycle waits for that answer (pump_new) and publishes it
at once. begin_cycle() sends a SYNC of its own only when no write() sent one since its last call (before the
first sample, after a command that could not be sent). Wire format: docs/reference/wire-can.md.

python-canopen does what it is good at (SDO, NMT, EMCY, heartbeat, the EDS); the cyclic PDOs of all drives
take a leaner path, since canopen's per-PDO maps cost tens of microseconds a frame: _on_frame decodes every
TPDO with firmware_bridge's PdoCodec, hands every other frame to canopen (Network.notify, as canopen documents
for a bus it does not read itself), and SYNC and the RPDOs go out through python-can directly, as preallocated
messages whose payloads one numba call fills (driver.hal.command_to_wire over PdoDef.dtype records).

Who reads the bus: the cycle thread, while it waits (pump_new for the answer, pump_for until its deadline),
so that no other thread wakes per frame and takes the interpreter from it (python-can's Notifier did both: at
250 Hz it cost more CPU than everything else of the driver's); the receive thread (`can-rx`) only while the cycle
does not (during open(), once the cycle stopped, or stalled for PUMP_STANDBY_S). On udp_multicast, which returns
every frame to its sender (SocketCAN does not), a kernel socket filter drops our own SYNC and RPDOs before
python-can receives them (own_frames_filter); a bus that returns them anyway gets them counted and ignored.

A sample is complete when every drive's TPDO1 and TPDO2 and the first drive's TPDO4 have arrived; its device
time is that drive's time stamp (us modulo 2^32, unwrapped here), not the frames' arrival, which jitters with the
bus's load. The other drives' TPDO4 is switched off at open() (5 frames of 31 a cycle less for 6 drives: bus
load and CPU); a drive that reboots sends it again until the next open(), and it is ignored.
Complete samples are kept in order (SAMPLE_RING): read() returns the oldest not read yet and backlog() says how
many wait, so a sample that completes after the cycle's wait is published late (the cycle's caught_up) instead
of being replaced by the next; False when none is unread: the cycle's watchdog trips on a silent bus. Frames
of the wrong length, a statusword matching no CiA 402 state or an unknown mode are counted in link_stats and
dropped; a sample missing a frame is discarded whole. The error code comes from EMCY (0x603F by SDO when the
EMCY was lost).

A supervisor thread restarts (NMT start) a drive whose heartbeat reports boot-up, PRE-OPERATIONAL or
STOPPED, and reopens the bus after a send or a receive failed (interface down, bus-off), so that fault_reset +
enable recover without restarting the daemon.
"""
from __future__ import annotations

import functools
import logging
import threading
from importlib import resources
from pathlib import Path
import time

import can
import canopen
import numpy as np

from driver.hal import Arm, ArmCommand, ArmState, LinkError, command_to_wire, raw_to_si, unsendable
from driver.transports.can_setup import CAN_OPTIONS, CanOptionError, can_options, configure_drive, sdo
from driver.transports.link_pump import LinkPump
from driver.transports.sample_ring import oldest_unread, unread_held
from firmware_bridge import canopen_map as cm
from firmware_bridge import cia402
from firmware_bridge.can_socket import tune_udp_multicast, udp_receive_drops
from firmware_bridge.runtime.log_throttle import Throttle
from firmware_bridge.runtime.rt_timing import name_os_thread
from firmware_bridge.units import CURRENT_LSB, JointScaling

EDS_PATH = Path(str(resources.files("firmware_bridge") / "armid_drive.eds"))   # package data
SUPERVISE_PERIOD_S = 0.05
MODES = frozenset(int(m) for m in cia402.Mode)
NMT_OPERATIONAL = 0x05
_TPDOS = (cm.TPDO1, cm.TPDO2, cm.TPDO4)
_CLOCK_TPDO = cm.TPDO4                # only the first drive's: its time stamp is the sample's device time, so the
                                      # others' TPDO4 is switched off at open() (5 frames a cycle less for 6 drives)
_RPDOS = (cm.RPDO1, cm.RPDO2)
_ROWS = ((0, 1, 2), (3, 4), (5,))   # rows of the sample (statusword, position, mode, velocity, current, time stamp)
_N_ROWS = 1 + max(max(r) for r in _ROWS)
_PER_DRIVE = len(_TPDOS)            # bits per drive in the mask of frames received
_STAT_NAMES = ("syncs", "samples", "tpdo_frames", "bad_length", "bad_value", "incomplete_samples",
               "emcy", "nmt_restarts", "reconnects", "send_errors", "samples_overwritten", "own_frames",
               "canopen_errors", "extended_id")
_OFFSET_MAX = cm.type_range(cm.INTEGER16)[1]    # 0x60B2 is INTEGER16
SAMPLE_RING = 1024                  # complete samples kept until read (4 s at 250 Hz; a stalled cycle thread overran 64)
RX_POLL_S = 0.01                    # the receive thread's longest wait in one recv (it sees a stop this soon)
PUMP_STANDBY_S = 0.02               # the receive thread leaves the bus to the cycle this long after the cycle's pump
_log = logging.getLogger(__name__)
TROUBLE_LOG_INTERVAL_S = 10.0   # bad frames, EMCYs, send errors: the first logged, then one line per interval
_BAD_FRAMES = frozenset({"extended_id", "bad_length", "bad_value"})     # counted and logged by _count


EMCY_KEPT = 64     # EMCYs python-canopen keeps per node in its `log` and `active` lists (it never drops any)


def bound_emcy_lists(consumer, keep: int = EMCY_KEPT) -> None:
    """Make a canopen EmcyConsumer keep at most 2 * keep EMCYs in `log` and in `active`: it appends every EMCY
    to both (active until an error reset) forever, and a daemon runs for months beside drives that may
    repeat one. A callback trims each list to its newest `keep` once it holds twice as many (amortised)."""
    def trim(_error) -> None:
        with consumer.emcy_received:
            for name in ("log", "active"):
                entries = getattr(consumer, name)
                if len(entries) > 2 * keep:
                    del entries[:-keep]
    consumer.add_callback(trim)


@functools.lru_cache(maxsize=1024)
def _valid_statusword(word: int) -> bool:
    return cia402.state_of(word) is not None


def frames_per_cycle(n: int) -> tuple[int, int]:
    """(sent, received) CAN frames of one cycle of CanArm with n drives: SYNC and RPDO1/RPDO2 per drive; TPDO1 and
    TPDO2 per drive and the first drive's TPDO4."""
    return 1 + len(_RPDOS) * n, (len(_TPDOS) - 1) * n + 1


class CanArm(Arm):
    """Arm over CiA 402 drives on one CAN bus: CanArm(model, interface=..., channel=..., **options) (CAN_OPTIONS).
    The cycle reads the bus while it waits (pump_new, pump_for) and every complete sample is kept until read
    (backlog); the drives answer the host's SYNC, they keep no clock of their own for the cycle."""

    cycle_reads_link = True
    keeps_every_sample = True

    OPTION_SPEC = CAN_OPTIONS

    def __init__(self, model, **options):
        self.n = n = model.n
        opts = can_options(n, **options)
        self.node_ids = opts.node_ids
        gear = np.asarray(model.gear_ratio, dtype=float)
        if np.any(gear <= 0):
            j = int(np.flatnonzero(gear <= 0)[0])
            raise CanOptionError(f"can: joint {j + 1}: gear ratio {gear[j]:g}: CiA 402 drives (0x6091) need a positive one")
        self.model_scaling = JointScaling.from_gear(gear, opts.counts_per_rev)
        self.scaling = self.model_scaling          # replaced by the drives' own figures at open()
        self.torque_per_amp = np.asarray(model.joint_torque_per_amp(), dtype=float)
        self._bus_options = {"interface": opts.interface, "channel": opts.channel}
        if opts.bitrate is not None:
            self._bus_options["bitrate"] = opts.bitrate
        self.sdo_timeout_s, self.boot_timeout_s = float(opts.sdo_timeout_s), float(opts.boot_timeout_s)
        self.heartbeat_ms = opts.heartbeat_ms
        self.network: canopen.Network | None = None
        self.nodes: list[canopen.RemoteNode] = []
        # the cyclic PDOs: TPDOs decoded by _on_frame, SYNC and RPDOs sent as these preallocated messages
        self._tpdo_codec = cm.PdoCodec(_TPDOS, self.node_ids)
        # per TPDO COB-ID what _on_frame needs: (k, drive j, its bit in the mask, the codec's struct, the rows it fills)
        self._tpdo_slots = {cob: (k, j, 1 << (_PER_DRIVE * j + k), self._tpdo_codec.structs[k], _ROWS[k])
                            for cob, (k, j) in self._tpdo_codec.slots.items() if j == 0 or _TPDOS[k] is not _CLOCK_TPDO}
        self._rpdo_codec = cm.PdoCodec(_RPDOS, self.node_ids)
        self._rpdo_msgs = [[can.Message(arbitration_id=p.cob_id(nid), is_extended_id=False,
                                        data=self._rpdo_codec.payloads[k][j]) for j, nid in enumerate(self.node_ids)]
                           for k, p in enumerate(_RPDOS)]
        self._sync_msg = can.Message(arbitration_id=cm.SYNC_COB_ID, is_extended_id=False, data=b"")
        # write(): the targets of all drives converted and range-checked into RPDO1 and RPDO2 records in one numba
        # call, each record's bytes then copied into its drive's preallocated payload
        self._rpdo_records = [np.zeros(n, p.dtype) for p in _RPDOS]
        r1, r2 = self._rpdo_records
        self._rpdo_columns = (r1["controlword"], r1["mode"], r1["target_position"], r2["target_torque"],
                              r2["torque_offset"])
        # the torque offset's unit: per mille of each drive's rated torque (0x6076, read at open(); the model's
        # torque limit until then)
        tau_max = np.asarray(model.tau_max, dtype=float)
        self._offset_per_nm = np.where(np.isfinite(tau_max) & (tau_max > 0), 1000.0 / tau_max, 0.0)
        self._rpdo_copies = [(self._rpdo_codec.payloads[k][j], memoryview(rec.view(np.uint8))[j * p.dlc:(j + 1) * p.dlc])
                             for j in range(n) for k, (p, rec) in enumerate(zip(_RPDOS, self._rpdo_records))]
        self._counts_per_rad = np.ascontiguousarray(self.scaling.counts_per_rad, dtype=np.float64)
        # one cycle's frames, sent by write(): drive 1 RPDO1, RPDO2, drive 2 ..., then SYNC (the drives latch them)
        self._cycle_frames = [m for pair in zip(*self._rpdo_msgs) for m in pair] + [self._sync_msg]
        self._synced = False                  # write() sent this cycle's SYNC: begin_cycle() sends none
        self._own_ids = frozenset(m.arbitration_id for m in self._cycle_frames)    # frames only we send
        self._own_sent = 0                    # of them, sent on the open bus (udp_multicast returns each: filtered)
        # receive side -> cycle, under _lock; the bus is read by the receive thread, or by the cycle while it pumps
        self._lock = threading.Lock()
        self._stats = dict.fromkeys(_STAT_NAMES, 0)
        self._bad_frames = Throttle(_log, logging.WARNING, TROUBLE_LOG_INTERVAL_S)
        self._emcys = Throttle(_log, logging.ERROR, TROUBLE_LOG_INTERVAL_S)
        self._send_errors = Throttle(_log, logging.ERROR, TROUBLE_LOG_INTERVAL_S)
        # who reads the bus: the cycle while it pumps, else the receive thread (driver/transports/link_pump.py)
        self._link = LinkPump(self._has_new, PUMP_STANDBY_S)
        self._receiver: threading.Thread | None = None
        self._rx_stop = threading.Event()
        self._pend = [[0] * n for _ in range(_N_ROWS)]   # the rows of _ROWS, wire units
        # complete samples in arrival order (wire units), each with its device and host time (ns): read() takes the
        # oldest unread, so a sample that completes late is published late, not overwritten by the next one
        self._ring = np.zeros((SAMPLE_RING, _N_ROWS, n), np.int64)
        self._ring_times = np.zeros((SAMPLE_RING, 2), np.int64)
        self._mask, self._full = 0, sum(bit for _, _, bit, _, _ in self._tpdo_slots.values())   # every frame awaited
        self._ready_seq, self._read_seq = 0, 0       # complete samples so far, samples read so far
        self._stamp_raw: int | None = None           # drive 1's last time stamp (us mod 2^32) and its unwrapped us
        self._stamp_us = 0
        self._error_code = np.zeros(n, np.uint16)
        self._warm_up()
        self._heartbeat_at = np.zeros(n)             # time.monotonic() of each node's last heartbeat
        self._restart = np.zeros(n, bool)            # NMT start wanted (boot-up / not OPERATIONAL)
        self._rebooted = np.zeros(n, bool)           # boot-up seen, not yet reported by read()
        self._broken: str | None = None              # why the bus is down (send failed); None when up
        self._bus_tuning: dict[str, object] = {}     # tune_udp_multicast's answer for the open bus
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None

    # -- open / close ----------------------------------------------------------------------------------
    def _warm_up(self) -> None:
        """Compile (or load from numba's cache) the kernels write() and read() call, here and not in the first
        cycles (a compile there stalls the cycle for seconds and trips its watchdog): a zero command into the
        RPDO records and the ring's first row into a scratch sample; nothing is sent."""
        c = ArmCommand(self.n)
        self._to_wire(c)
        r, out = self._ring[0], ArmState(self.n)
        raw_to_si(r[1], r[3], r[4], r[0], self._error_code, r[2], self._counts_per_rad, CURRENT_LSB,
                  self.torque_per_amp, out.floats, out.words, out.mode)

    def open(self) -> None:
        """Open the bus, configure and start every drive (see the module docstring); LinkError / InputError."""
        if self.network is not None:
            return
        self.network = canopen.Network()       # never connect()ed: its notifier would read the bus (see _receive)
        try:
            self._connect()
            self._rx_stop.clear()
            self._receiver = threading.Thread(target=self._receive, name="armid-can-rx", daemon=True)
            self._receiver.start()
            for j, nid in enumerate(self.node_ids):
                node = canopen.RemoteNode(nid, canopen.objectdictionary.import_od(str(EDS_PATH), nid))
                node.sdo.RESPONSE_TIMEOUT = self.sdo_timeout_s
                self.network.add_node(node)
                self.nodes.append(node)
            counts_per_rad = np.array([self._configure(j, node) for j, node in enumerate(self.nodes)])
            self.scaling = JointScaling(counts_per_rad)
            self._counts_per_rad = np.ascontiguousarray(counts_per_rad, dtype=np.float64)
            self._start_all()
            self._handshake()
        except BaseException:
            self.close()
            raise
        self._stop.clear()
        self._supervisor = threading.Thread(target=self._supervise, name="armid-can-supervisor", daemon=True)
        self._supervisor.start()
        _log.info("can: %s opened: drives %s started", self._bus_options.get("channel", "bus"),
                  ", ".join(str(n) for n in self.node_ids), extra={"node_ids": list(self.node_ids)})

    def check_reachable(self) -> None:
        """The bus opens (an interface that is not there fails here), and is shut again at once: no frame is sent,
        so no drive is configured or started."""
        self._open_bus().shutdown()

    def _open_bus(self) -> can.BusABC:
        """A python-can bus with the transport's options; LinkError naming them when it cannot be opened."""
        try:
            return can.Bus(**self._bus_options)
        except (can.CanError, OSError, ValueError, ImportError) as exc:
            opts = ", ".join(f"{k}={v!r}" for k, v in self._bus_options.items())
            raise LinkError(f"can: cannot open the CAN bus ({opts}): {exc}") from None

    def _connect(self) -> None:
        """Open the python-can bus for the network (canopen's connect() without its notifier: this transport reads
        the bus itself and hands canopen its frames through Network.notify, as canopen documents for that case)."""
        self.network.bus = None
        bus = self._open_bus()
        self._own_sent = 0
        self._bus_tuning = tune_udp_multicast(bus, own_ids=self._own_ids)
        self.network.bus = bus

    def _sdo(self, j: int, node, index: int, sub: int, value: int | None = None) -> int:
        return sdo(j, node, index, sub, value, self._bus_options)

    def _configure(self, j: int, node) -> float:
        """SDO setup of one drive (can_setup.configure_drive), then its EMCY and heartbeat into the supervision;
        returns its counts per joint radian."""
        drive = configure_drive(j, node, self.model_scaling.counts_per_rad[j], self.heartbeat_ms, (*_TPDOS, *_RPDOS),
                                _CLOCK_TPDO, self._bus_options)
        rated = self._sdo(j, node, cia402.RATED_TORQUE, 0)
        if rated <= 0:
            raise CanOptionError(f"can: joint {j + 1} (node {node.id}): rated torque (0x6076) is {rated} mN m: the "
                                 f"torque offset (0x60B2, per mille of it) cannot be sent")
        self._offset_per_nm[j] = 1e6 / rated          # per mille per N m
        node.emcy.add_callback(lambda e, j=j: self._on_emcy(j, e))
        bound_emcy_lists(node.emcy)
        node.nmt.add_heartbeat_callback(lambda state, j=j: self._on_heartbeat(j, state))
        return drive

    def _start_all(self) -> None:
        for j, node in enumerate(self.nodes):
            self._nmt_start(j)

    def _nmt_start(self, j: int) -> None:
        self.nodes[j].nmt.state = "OPERATIONAL"
        self._restart[j] = False

    def _handshake(self) -> None:
        """One SYNC; every drive's TPDOs must answer within boot_timeout_s."""
        deadline = time.monotonic() + self.boot_timeout_s
        while time.monotonic() < deadline:
            seq = self._ready_seq
            self.begin_cycle()
            until = min(deadline, time.monotonic() + 0.2)
            while time.monotonic() < until:
                if self._ready_seq != seq:
                    return
                time.sleep(0.002)
        whole = (1 << _PER_DRIVE) - 1
        missing = [self.node_ids[j] for j in range(self.n) if not (self._mask >> (_PER_DRIVE * j)) & whole]
        raise LinkError(f"can: no PDOs from the drives after SYNC within {self.boot_timeout_s:g} s "
                        f"(silent nodes: {missing or 'none, but no complete sample'})")

    def close(self) -> None:
        """Stop the supervisor, the receive thread and the bus (idempotent)."""
        self._stop.set()
        self._rx_stop.set()
        if self._supervisor is not None:
            self._supervisor.join(2.0)
            self._supervisor = None
        if self._receiver is not None:
            self._receiver.join(2.0)
            self._receiver = None
        net, self.network = self.network, None
        if net is not None:
            try:
                net.disconnect()
            except Exception:  # noqa: BLE001 - closing must go on
                pass
        self.nodes = []
        for throttle in (self._bad_frames, self._emcys, self._send_errors):
            throttle.flush()

    # -- receive side: the receive thread, or the cycle thread while it pumps ---------------------------
    def _receive(self) -> None:
        """The receive thread (`can-rx`): reads the bus and dispatches every frame (_on_frame) while the cycle does
        not (before it starts, when it stalls: PUMP_STANDBY_S after its last pump); python-can's Notifier would read
        it all the time, and each frame would wake it and take the interpreter from the cycle."""
        name_os_thread("can-rx")
        stop = self._rx_stop
        while not stop.is_set():
            if self._link.cycle_reads():
                stop.wait(PUMP_STANDBY_S)
            elif not self._read_bus(RX_POLL_S, False, wait_s=RX_POLL_S):
                stop.wait(RX_POLL_S)          # the bus is down (the supervisor reopens it) or being read

    def _has_new(self) -> bool:
        return self._ready_seq != self._read_seq

    def _readable(self) -> bool:
        """The bus is open and not broken (the supervisor reopens a broken one)."""
        net = self.network
        return net is not None and net.bus is not None and self._broken is None

    def _read_bus(self, timeout_s: float, until_new: bool, wait_s: float = 0.0) -> bool:
        """Read and dispatch frames in the calling thread for timeout_s (s), or until a sample not read yet is
        complete (until_new). False when it could not read: the bus is down, or another thread reads it (and did
        not let go within wait_s)."""
        return self._readable() and self._link.take(self._read_frames, timeout_s, until_new, wait_s)

    def _read_frames(self, timeout_s: float, until_new: bool) -> None:
        """The reading loop (the caller holds the reader lock): frames for timeout_s, or until a sample not read yet
        is complete (until_new). A receive that fails (the interface went away) marks the bus broken."""
        net = self.network
        bus = net.bus if net is not None else None
        if bus is None:
            return
        try:
            end = time.monotonic() + timeout_s
            recv, dispatch = bus.recv, self._on_frame
            while not (until_new and self._ready_seq != self._read_seq):   # (another reader may have completed it)
                left = end - time.monotonic()
                msg = recv(left if left > 0.0 else 0.0)
                if msg is None:
                    break
                dispatch(msg)
                if left <= 0.0:
                    break              # past the end: frames that keep coming wait for the next call
        except (can.CanError, OSError, ValueError, AttributeError) as exc:
            if net.bus is bus and self._broken is None:
                self._broken = f"receive failed: {exc}"

    def pump_new(self, timeout_s: float) -> bool:
        """Read the bus in the calling thread (the cycle's) until a sample not read yet is complete (True) or
        timeout_s (s) passes (False): the cycle's wait for the drives' answer to the SYNC write() sent, with no
        other thread woken per frame. While the receive thread reads the bus (the cycle stalled), this waits up
        to RX_POLL_S for it to stand by; if it does not, the receive thread goes on reading and this waits for
        its sample (not while marked as pumping: the receive thread would stand by and nobody would read)."""
        # can-rx stands by from its current read on (at most RX_POLL_S); the bus down, or can-rx not letting go in
        # that time: it reads, this thread waits for its sample
        return self._link.pump_new(self._read_frames if self._readable() else None, timeout_s, wait_s=RX_POLL_S)

    def pump_for(self, timeout_s: float) -> bool:
        """Read the bus in the calling thread for timeout_s (s), whatever arrives (the cycle's wait for its
        deadline: heartbeats, EMCY, SDO answers, late TPDOs). False at once when it cannot: the caller sleeps."""
        return self._link.pump_for(self._read_frames if self._readable() else None, timeout_s)

    def _on_frame(self, msg: can.Message) -> None:
        """Every frame read: TPDO1/2/4 of our drives go into the pending sample; our own frames (a bus that returns
        them) are counted and ignored; the rest is canopen's (SDO answers, EMCY, heartbeats: Network.notify)."""
        cob = msg.arbitration_id
        slot = self._tpdo_slots.get(cob)
        if slot is None or msg.is_remote_frame or msg.is_error_frame or msg.is_extended_id:
            if msg.is_error_frame or msg.is_remote_frame:
                return
            if msg.is_extended_id:           # the bus carries 11-bit ids only: a 29-bit frame is nobody's
                self._count("extended_id")
                return
            if cob in self._own_ids:
                self._count("own_frames")
                return
            try:
                self.network.notify(cob, msg.data, msg.timestamp)
            except Exception as exc:  # noqa: BLE001 - a callback's error must not stop the reading (canopen's rule)
                self._count("canopen_errors")
                self._bad_frames.hit("can: canopen callback for frame 0x%03X failed: %s", cob, exc, reason="canopen")
            return
        k, j, bit, layout, rows = slot
        data = msg.data
        if len(data) != layout.size:          # PdoCodec.unpack's check, inlined: one call less per frame
            self._count("bad_length")
            return
        values = layout.unpack_from(data)
        if k == 0 and not (_valid_statusword(values[0]) and values[2] in MODES):
            self._count("bad_value")
            return
        with self._lock:
            self._stats["tpdo_frames"] += 1
            if self._mask & bit:             # a frame of the next SYNC before this sample completed
                self._stats["incomplete_samples"] += 1
                self._mask = 0
            pend = self._pend
            for r, v in zip(rows, values):
                pend[r][j] = v
            self._mask |= bit
            if self._mask == self._full:
                slot = self._ready_seq % SAMPLE_RING
                self._ring[slot] = pend
                self._mask = 0
                self._ready_seq += 1
                raw = pend[5][0]
                if self._stamp_raw is not None:
                    self._stamp_us += (raw - self._stamp_raw) % cm.TIME_STAMP_WRAP
                elif self._stamp_us:             # drive 1 restarted its clock: go on 1 us after the last stamp
                    self._stamp_us += 1
                else:
                    self._stamp_us = raw
                self._stamp_raw = raw
                self._ring_times[slot] = (self._stamp_us * 1000, time.time_ns())
                self._stats["samples"] += 1
                self._link.notify()

    def _on_emcy(self, j: int, error) -> None:
        self._error_code[j] = error.code & 0xFFFF
        self._count("emcy")
        self._emcys.hit("can: EMCY from drive %d: error code 0x%04X", j + 1, error.code & 0xFFFF, joint=j + 1,
                        error_code=f"0x{error.code & 0xFFFF:04X}")

    def _on_heartbeat(self, j: int, state: int) -> None:
        self._heartbeat_at[j] = time.monotonic()
        if state == 0 and self._supervisor is not None:
            self._rebooted[j] = True
            if j == 0:
                with self._lock:
                    self._stamp_raw = None           # its clock starts again: unwrap from its next stamp
        if state != NMT_OPERATIONAL:
            self._restart[j] = True

    def _count(self, name: str) -> None:
        with self._lock:
            self._stats[name] += 1
        if name in _BAD_FRAMES:
            self._bad_frames.hit("can: frame dropped (%s)", name, reason=name)

    # -- supervisor thread ---------------------------------------------------------------------------
    def _supervise(self) -> None:
        name_os_thread()
        while not self._stop.wait(SUPERVISE_PERIOD_S):
            try:
                if self._broken is not None:
                    self._reopen()
                    continue
                for j in np.flatnonzero(self._restart):
                    self._nmt_start(int(j))
                    self._count("nmt_restarts")
            except (LinkError, can.CanError, OSError, AttributeError) as exc:
                self._broken = self._broken or f"send failed: {exc}"
                continue
            try:
                self._fill_error_codes()
            except LinkError:
                pass          # no SDO answer (a silent drive): the next round tries again

    def _reopen(self) -> None:
        net = self.network
        if net is None:
            return
        got = self._link.reader.acquire(True, 1.0)      # nobody reads the old bus while it goes (a pump: one period)
        try:
            if net.bus is not None:
                net.bus.shutdown()
        except Exception:  # noqa: BLE001 - the old bus is gone either way
            pass
        finally:
            net.bus = None
            if got:
                self._link.reader.release()
        self._connect()
        self._broken = None
        self._count("reconnects")
        _log.warning("can: bus reopened after a send failure")
        self._start_all()

    def _fill_error_codes(self) -> None:
        """A drive in FAULT whose EMCY was lost: read its error code (0x603F) by SDO."""
        with self._lock:
            sw = self._ring[(self._ready_seq - 1) % SAMPLE_RING, 0].copy()
        for j in range(self.n):
            if sw[j] & cia402.SW_FAULT and self._error_code[j] == 0:
                self._error_code[j] = self._sdo(j, self.nodes[j], cia402.ERROR_CODE, 0)

    # -- the cycle's side ----------------------------------------------------------------------------
    def _send(self, msgs) -> None:
        """Send the messages in order through python-can (canopen's send lock: SDO and NMT share the bus)."""
        net = self.network
        if self._broken is not None:
            raise LinkError(f"can: the bus is down ({self._broken}); reconnecting")
        if net is None:
            raise LinkError("can: not open")
        sent = 0
        try:
            with net.send_lock:
                send = net.bus.send
                for msg in msgs:
                    send(msg)
                    sent += 1
        except (can.CanError, OSError, AttributeError) as exc:   # AttributeError: the bus went away under us
            self._own_sent += sent
            self._count("send_errors")
            self._broken = f"send failed: {exc}"
            self._send_errors.hit("can: send failed: %s; reopening the bus", exc)
            raise LinkError(f"can: send failed: {exc}") from None
        self._own_sent += sent

    def begin_cycle(self) -> None:
        """Transmit SYNC (the drives latch the last RPDOs, step, and answer with their TPDOs), unless write()
        sent it with the RPDOs since the last call. One SYNC every cycle, so that every command reaches the
        drives; drives slower than the cycle (a simulator) fall behind, which link_stats shows as sync_lag."""
        if self._synced:
            self._synced = False
            return
        self._send((self._sync_msg,))
        with self._lock:
            self._stats["syncs"] += 1

    def read(self, out: ArmState) -> bool:
        """The oldest complete sample not read yet, in SI units (each sample once, in order: one that came late
        is not lost to the next; beyond SAMPLE_RING unread the oldest are overwritten, counted); False when
        none is unread. LinkError once when a drive rebooted (it lost its state; the supervisor restarts it)."""
        if self._rebooted.any():
            j = int(np.flatnonzero(self._rebooted)[0])
            self._rebooted[j] = False
            raise LinkError(f"can: joint {j + 1} (node {self.node_ids[j]}) rebooted (boot-up message); "
                            f"restarted by NMT, fault_reset to go on")
        with self._lock:
            k, end = self._read_seq, self._ready_seq
            if k == end:
                return False
            k, lost = oldest_unread(k, end, SAMPLE_RING)
            self._stats["samples_overwritten"] += lost
            self._read_seq = k + 1
            r = self._ring[k % SAMPLE_RING]
            times = self._ring_times[k % SAMPLE_RING]
            raw_to_si(r[1], r[3], r[4], r[0], self._error_code, r[2], self.scaling.counts_per_rad, CURRENT_LSB,
                      self.torque_per_amp, out.floats, out.words, out.mode)
            out.device_time_ns, out.host_time_ns = int(times[0]), int(times[1])
        return True

    def lost_samples(self) -> int:
        """Device samples lost so far: overwritten unread, or incomplete (a drive's PDO of that SYNC missing)."""
        s = self._stats
        return s["samples_overwritten"] + s["incomplete_samples"]

    def backlog(self) -> int:
        """Complete samples not read yet (at most SAMPLE_RING are kept): the cycle publishes the older ones first
        (driver.cycle, caught_up)."""
        with self._lock:
            return unread_held(self._read_seq, self._ready_seq, SAMPLE_RING)

    def write(self, command: ArmCommand) -> None:
        """RPDO1 (controlword, target position, mode) and RPDO2 (target torque) to every drive, then SYNC: the
        drives latch the command at once and answer (pump_new waits for that answer; the next begin_cycle() sends
        no SYNC of its own)."""
        if self._to_wire(command) >= 0:          # the field, the joint and the value
            raise LinkError(f"can: command not sent: "
                            f"{unsendable(command, self._counts_per_rad, self._offset_per_nm, _OFFSET_MAX, 'per mille')}")
        for payload, record in self._rpdo_copies:
            payload[:] = record
        self._send(self._cycle_frames)
        self._synced = True
        with self._lock:
            self._stats["syncs"] += 1

    def _to_wire(self, command: ArmCommand) -> int:
        """The command into the RPDO records (driver.hal.command_to_wire): -1, or the first joint that does not fit."""
        return command_to_wire(command.controlword, command.mode, command.target_position, command.target_torque,
                               command.torque_offset, self._counts_per_rad, self._offset_per_nm, _OFFSET_MAX,
                               *self._rpdo_columns)

    def link_stats(self) -> dict:
        """Frame counters, dropped frames by reason, our own frames a bus returned (own_frames: ignored), canopen
        callbacks that failed, reconnects, heartbeat ages (s) and NMT restarts; on udp_multicast also the receive
        buffer the kernel granted (bytes), whether the socket hears its own group only, whether its filter drops
        our own frames (own_frames_filtered, with own_frames_sent: how many it dropped) and the datagrams the
        kernel dropped at it for want of room (udp_receive_drops: its drop count less the filtered frames)."""
        with self._lock:
            out = dict(self._stats)
        now = time.monotonic()
        out["sync_lag"] = out["syncs"] - out["samples"] - out["incomplete_samples"]   # SYNCs not (yet) answered
        out.update(transport="can", bus=" ".join(f"{k}={v}" for k, v in self._bus_options.items()),
                   link_up=self._broken is None and self.network is not None,
                   heartbeat_age_s=[round(float(now - t), 3) if t else None for t in self._heartbeat_at])
        net = self.network
        if self._bus_tuning and net is not None and net.bus is not None:
            drops = udp_receive_drops(net.bus)
            if drops is not None and self._bus_tuning.get("own_frames_filtered"):
                out["own_frames_sent"] = sent = self._own_sent    # each came back once and the filter dropped it
                drops = max(drops - sent, 0)      # a frame in flight at this moment may not be counted yet
            out.update(self._bus_tuning, udp_receive_drops=drops)
        return out
