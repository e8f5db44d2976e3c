"""Setting up the `can` transport's drives (driver/transports/can.py): its options, and at open() each drive over
SDO: device type (0x1000), counts per joint radian (0x608F encoder resolution, 0x6091 gear ratio: checked against
the model), producer heartbeat time (0x1017) and PDO configuration (read back and compared with
firmware_bridge.canopen_map). Wire format: docs/reference/wire-can.md.
"""
from __future__ import annotations

import math
from typing import Sequence

import can
from canopen.sdo import SdoAbortedError, SdoCommunicationError

from firmware_bridge import canopen_map as cm
from firmware_bridge import cia402
from firmware_bridge.runtime.errors import InputError
from firmware_bridge.runtime.options import Option, OptionSet, Values
from firmware_bridge.units import ENCODER_COUNTS_PER_REV
from firmware_bridge.runtime.transport_contract import LinkError

GEAR_TOLERANCE = 1e-4       # relative: drive scaling vs model gear * counts_per_rev


class CanOptionError(InputError):
    """A [transport] option of the can transport that is not usable."""


CAN_OPTIONS = OptionSet(
    "can",
    Option("interface", "text", required=True,
           what="a python-can interface name (socketcan, pcan, kvaser, virtual, udp_multicast, ...)",
           doc="any python-can interface: socketcan, pcan, kvaser, ixxat, virtual, udp_multicast, ..."),
    Option("channel", "text or integer", required=True, what="the interface's channel (e.g. can0, PCAN_USBBUS1, 0)",
           doc="the interface's channel (can0, PCAN_USBBUS1, 0, ...)"),
    Option("bitrate", "integer", None, low=10_000, high=1_000_000, unit="bit/s", nullable=True,
           doc="for interfaces that set it themselves (pcan, kvaser); socketcan: `ip link`"),
    Option("node_ids", "integers", None, low=cm.MIN_NODE_ID, high=cm.MAX_NODE_ID, nullable=True,
           doc="one distinct node id per joint, in joint order (left out: 1..n)"),
    Option("counts_per_rev", "integer", ENCODER_COUNTS_PER_REV, low=1,
           doc="motor encoder counts per motor revolution"),
    Option("sdo_timeout_s", "number", 0.5, low=0, above=True, unit="s", doc="per SDO request at open"),
    Option("boot_timeout_s", "number", 2.0, low=0, above=True, unit="s",
           doc="how long open waits for the first SYNC's PDOs"),
    Option("heartbeat_ms", "integer", cm.DEFAULT_HEARTBEAT_MS, low=0, high=0xFFFF, unit="ms",
           doc="written to each drive's producer heartbeat time 0x1017 (0: no heartbeat)"),
    error=CanOptionError)


def can_options(n: int, **options) -> Values:
    """The transport's options (CAN_OPTIONS) for n joints, node_ids filled in (1..n by default) and checked
    against n; CanOptionError naming the option."""
    opts = CAN_OPTIONS.parse(options)
    ids = list(range(1, n + 1)) if opts.node_ids is None else [int(i) for i in opts.node_ids]
    if len(ids) != n or len(set(ids)) != n:
        raise CAN_OPTIONS.fail("node_ids", f"{n} distinct node ids in {cm.MIN_NODE_ID}..{cm.MAX_NODE_ID} "
                                           f"(joint order)", opts.node_ids)
    opts.node_ids = ids
    return opts


def sdo(j: int, node, index: int, sub: int, value: int | None = None, bus_options: dict | None = None) -> int:
    """Read (value None) or write one object of drive j by SDO; LinkError naming the joint, node and object when the
    drive aborts or does not answer (bus_options: the bus, named in that message)."""
    what = f"can: joint {j + 1} (node {node.id}): SDO {'write' if value is not None else 'read'} 0x{index:04X}:{sub:02X}"
    try:
        var = node.sdo[index][sub] if sub else node.sdo[index]
        if value is None:
            return int(var.raw)
        var.raw = value
        return value
    except SdoAbortedError as exc:
        raise LinkError(f"{what}: aborted by the drive: {exc}") from None
    except (SdoCommunicationError, can.CanError, OSError) as exc:
        raise LinkError(f"{what}: no answer ({exc}); is the drive powered and on this bus at {bus_options}?") from None


def configure_drive(j: int, node, model_counts_per_rad: float, heartbeat_ms: int, pdos: Sequence, clock_tpdo,
                    bus_options: dict) -> float:
    """SDO setup of drive j: its device type, its scaling against the model's (model_counts_per_rad), its producer
    heartbeat time, its PDOs (check_pdos); returns its counts per joint radian. CanOptionError for a drive
    configured otherwise, LinkError for one that does not answer."""
    dtype = sdo(j, node, cm.DEVICE_TYPE, 0, bus_options=bus_options)
    if dtype != cm.DEVICE_TYPE_VALUE:
        raise CanOptionError(f"can: joint {j + 1} (node {node.id}): device type 0x{dtype:08X}, expected a CiA 402 "
                             f"servo drive 0x{cm.DEVICE_TYPE_VALUE:08X}")
    inc = sdo(j, node, cia402.POSITION_ENCODER_RESOLUTION, 1, bus_options=bus_options)
    mrev = sdo(j, node, cia402.POSITION_ENCODER_RESOLUTION, 2, bus_options=bus_options)
    gm = sdo(j, node, cia402.GEAR_RATIO, 1, bus_options=bus_options)
    gs = sdo(j, node, cia402.GEAR_RATIO, 2, bus_options=bus_options)
    if not (inc and mrev and gm and gs):
        raise CanOptionError(f"can: joint {j + 1} (node {node.id}): 0x608F {inc}/{mrev}, 0x6091 {gm}/{gs}: a zero "
                             f"in the drive's scaling")
    drive = inc / mrev * gm / gs / (2.0 * math.pi)
    model = float(model_counts_per_rad)
    if abs(drive - model) > GEAR_TOLERANCE * model:
        raise CanOptionError(f"can: joint {j + 1} (node {node.id}): the drive counts {drive:.6g} counts/rad "
                             f"(0x608F {inc}/{mrev}, 0x6091 {gm}/{gs}), the model's gear ratio and counts_per_rev "
                             f"give {model:.6g}: fix counts_per_rev or the model")
    sdo(j, node, cm.PRODUCER_HEARTBEAT_TIME, 0, heartbeat_ms, bus_options)
    check_pdos(j, node, pdos, clock_tpdo, bus_options)
    return drive


def check_pdos(j: int, node, pdos: Sequence, clock_tpdo, bus_options: dict) -> None:
    """Read drive j's PDO configuration by SDO; each of `pdos` (firmware_bridge.canopen_map PdoDefs) must be valid, on
    its COB-ID, every SYNC (TPDOs), with its map (a drive configured otherwise is refused); clock_tpdo, used from
    the first drive only, is switched off (COB-ID bit 31 set) on the others. Reading the maps subscribes canopen's
    PdoMaps to their COB-IDs: they are unsubscribed again (the transport handles its PDOs itself)."""
    try:
        node.tpdo.read()
        node.rpdo.read()
    except SdoAbortedError as exc:
        raise LinkError(f"can: joint {j + 1} (node {node.id}): reading the PDO configuration: {exc}") from None
    except (SdoCommunicationError, can.CanError, OSError) as exc:
        raise LinkError(f"can: joint {j + 1} (node {node.id}): no answer reading the PDO configuration ({exc})") from None
    for pdef in pdos:
        m = (node.tpdo if pdef.transmit else node.rpdo)[pdef.number]
        if pdef is clock_tpdo and j > 0:     # not used (the first drive's clock is): switched off, valid or not
            sdo(j, node, pdef.communication_index, 1, pdef.cob_id(node.id) | cm.PDO_NOT_VALID, bus_options)
            continue
        got = [(v.index, v.subindex) for v in m.map]
        want = [(e.index, e.subindex) for e in pdef.entries]
        problem = None
        if not m.enabled:
            problem = "not valid (COB-ID bit 31 set)"
        elif m.cob_id != pdef.cob_id(node.id):
            problem = f"COB-ID 0x{m.cob_id:03X}, expected 0x{pdef.cob_id(node.id):03X}"
        elif got != want:
            problem = f"maps {[f'0x{i:04X}:{s:02X}' for i, s in got]}, expected {[f'0x{i:04X}:{s:02X}' for i, s in want]}"
        elif pdef.transmit and m.trans_type != 1:
            problem = f"transmission type {m.trans_type}, expected 1 (every SYNC)"
        if problem:
            raise CanOptionError(f"can: joint {j + 1} (node {node.id}): {pdef.name}: {problem} (docs/reference/wire-can.md)")
    # reading the maps subscribed canopen's PdoMaps to their COB-IDs: the PDOs are ours (_on_frame, write)
    for maps in (node.tpdo, node.rpdo):
        for m in maps.map.values():
            if m.cob_id is not None and m.on_message in node.network.subscribers.get(m.cob_id, ()):
                node.network.unsubscribe(m.cob_id, m.on_message)
