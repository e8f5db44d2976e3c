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
from firmware_bridge.runtime.transport_contract import LinkError

GEAR_TOLERANCE = 1e-4       # relative: drive scaling vs model gear * counts_per_rev


class CanOptionError(InputError):
    """A [transport] option of the can transport that is not usable."""


def check_options(n: int, interface, channel, bitrate, node_ids, counts_per_rev, sdo_timeout_s, boot_timeout_s,
                  heartbeat_ms) -> list[int]:
    """The node ids (joint order) after checking the transport's options; CanOptionError naming the option."""
    if not isinstance(interface, str) or not interface:
        raise CanOptionError(f"can: interface: expected a python-can interface name (socketcan, pcan, kvaser, "
                             f"virtual, udp_multicast, ...), got {interface!r}")
    if isinstance(channel, bool) or not isinstance(channel, (str, int)) or channel == "":
        raise CanOptionError(f"can: channel: expected the interface's channel (e.g. can0, PCAN_USBBUS1, 0), got {channel!r}")
    if bitrate is not None and (isinstance(bitrate, bool) or not isinstance(bitrate, int) or not 10_000 <= bitrate <= 1_000_000):
        raise CanOptionError(f"can: bitrate: expected bit/s in 10000..1000000, got {bitrate!r}")
    ids = list(range(1, n + 1)) if node_ids is None else node_ids
    if (not isinstance(ids, (list, tuple)) or len(ids) != n or any(isinstance(i, bool) or not isinstance(i, int) for i in ids)
            or len(set(ids)) != n or not all(cm.MIN_NODE_ID <= i <= cm.MAX_NODE_ID for i in ids)):
        raise CanOptionError(f"can: node_ids: expected {n} distinct node ids in 1..127 (joint order), got {node_ids!r}")
    if isinstance(counts_per_rev, bool) or not isinstance(counts_per_rev, int) or counts_per_rev <= 0:
        raise CanOptionError(f"can: counts_per_rev: expected a positive integer (encoder counts per motor revolution), "
                             f"got {counts_per_rev!r}")
    for name, v in (("sdo_timeout_s", sdo_timeout_s), ("boot_timeout_s", boot_timeout_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise CanOptionError(f"can: {name}: expected a positive number of seconds, got {v!r}")
    if isinstance(heartbeat_ms, bool) or not isinstance(heartbeat_ms, int) or not 0 <= heartbeat_ms <= 0xFFFF:
        raise CanOptionError(f"can: heartbeat_ms: expected 0..65535 ms (0: no heartbeat), got {heartbeat_ms!r}")
    return [int(i) for i in ids]


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
