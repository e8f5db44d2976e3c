"""CANopen (CiA 301 / CiA 402) wire definition of one armid joint drive, defined once:

  * node ids and COB-IDs (pre-defined connection set: node id = joint index + 1),
  * the object dictionary (OBJECTS), from which the EDS file is generated (eds_text();
    firmware_bridge/armid_drive.eds is its committed output),
  * the PDO maps (TPDOS, RPDOS) as data, with a byte codec (PdoDef.pack / unpack) for the golden
    vectors, the driver and the C header (c_constants()),
  * EMCY error register bits and the bus-load arithmetic of one SYNC cycle.

Units on the wire are firmware_bridge.units': position counts, velocity counts/s, current uA, torque mN m.
CiA 402's own current and torque objects (0x6071, 0x6077, 0x6078) count in per mille of the rated value,
too coarse for identification (0.1 % of a 120 N m joint is 0.12 N m), so the PDOs carry manufacturer
objects in int32: 0x2000 current actual (uA), 0x2001 torque actual (mN m), 0x2002 target torque (mN m).
The standard objects stay readable and writable by SDO in per mille of 0x6075 / 0x6076. The torque offset is
CiA 402's own 0x60B2 (INTEGER16, per mille of 0x6076), mapped in RPDO2 after the target torque: in CSP the
drive adds it to its position loop's torque, in CST to the target torque (a host sends the model's feed-forward
or its gravity and friction compensation there). A drive whose RPDO2 maps the target torque alone (revision 1
of this dictionary) is refused by the host at start, naming the map: its RPDO2 is never sent 6 bytes.

`python -m firmware_bridge.canopen_map eds` prints the EDS; `... doc` prints the tables of docs/reference/wire-can.md.
"""
from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from firmware_bridge import cia402


class CanFrameError(ValueError):
    """A CAN frame (or a value meant for one) that does not fit its definition; names the frame."""


# -- CiA 301 data types (DataType codes of the EDS) -------------------------------------------------
INTEGER8, INTEGER16, INTEGER32 = 0x0002, 0x0003, 0x0004
UNSIGNED8, UNSIGNED16, UNSIGNED32 = 0x0005, 0x0006, 0x0007
VISIBLE_STRING = 0x0009
_FORMAT = {INTEGER8: "b", INTEGER16: "h", INTEGER32: "i", UNSIGNED8: "B", UNSIGNED16: "H", UNSIGNED32: "I"}
_TYPE_NAME = {INTEGER8: "int8", INTEGER16: "int16", INTEGER32: "int32", UNSIGNED8: "uint8",
              UNSIGNED16: "uint16", UNSIGNED32: "uint32", VISIBLE_STRING: "string"}


def type_bits(data_type: int) -> int:
    """Size in bits of a numeric CiA 301 data type."""
    return 8 * struct.calcsize("<" + _FORMAT[data_type])


def type_range(data_type: int) -> tuple[int, int]:
    """(min, max) of a numeric CiA 301 data type."""
    bits = type_bits(data_type)
    if _FORMAT[data_type].islower():
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


# -- identity --------------------------------------------------------------------------------------
DEVICE_TYPE_VALUE = 0x00020192     # CiA 402 (0x192), servo drive (0x0002)
VENDOR_ID = 0x00000000             # placeholder: no CiA-assigned vendor id yet
PRODUCT_CODE = 0x41524D31          # "ARM1"
REVISION_NUMBER = 0x00020000       # major 2, minor 0 (CiA 301: major changes break the OD; 2: 0x60B2 in RPDO2)
DEVICE_NAME = "armid joint drive"
DEFAULT_HEARTBEAT_MS = 100         # 0x1017 default

# -- communication objects (CiA 301) and manufacturer objects --------------------------------------
DEVICE_TYPE = 0x1000
ERROR_REGISTER = 0x1001
COB_ID_SYNC = 0x1005
MANUFACTURER_DEVICE_NAME = 0x1008
HIGH_RES_TIME_STAMP = 0x1013       # uint32, the drive's clock in us at the SYNC that latched the TPDOs (wraps)
COB_ID_EMCY = 0x1014
PRODUCER_HEARTBEAT_TIME = 0x1017
IDENTITY = 0x1018
CURRENT_ACTUAL_UA = 0x2000         # int32, motor current, uA (units.CURRENT_LSB)
TORQUE_ACTUAL_MNM = 0x2001         # int32, joint torque, mN m (units.TORQUE_LSB)
TARGET_TORQUE_MNM = 0x2002         # int32, target torque (CST) / torque feed-forward (CSP), mN m

# -- COB-IDs (pre-defined connection set) ----------------------------------------------------------
NMT_COB_ID = 0x000
SYNC_COB_ID = 0x080
EMCY_COB_BASE = 0x080
SDO_TX_COB_BASE = 0x580            # server -> client (response), + node id
SDO_RX_COB_BASE = 0x600            # client -> server (request), + node id
HEARTBEAT_COB_BASE = 0x700
PDO_NOT_VALID = 1 << 31            # COB-ID bit 31: PDO disabled
RTR_NOT_ALLOWED = 1 << 30
MIN_NODE_ID, MAX_NODE_ID = 1, 127


def node_id(joint: int) -> int:
    """Node id of 0-based joint `joint` (joint 0 is node 1)."""
    if not 0 <= joint < MAX_NODE_ID:
        raise CanFrameError(f"joint {joint}: no node id (joints 0..{MAX_NODE_ID - 1} map to nodes 1..{MAX_NODE_ID})")
    return joint + 1


# -- EMCY -------------------------------------------------------------------------------------------
ERROR_RESET = 0x0000               # EMCY code of the "error reset / no error" message
# error register (0x1001) bits, CiA 301
ER_GENERIC, ER_CURRENT, ER_VOLTAGE, ER_TEMPERATURE = 1 << 0, 1 << 1, 1 << 2, 1 << 3
ER_COMMUNICATION, ER_DEVICE_PROFILE, ER_MANUFACTURER = 1 << 4, 1 << 5, 1 << 7


def error_register(code: int) -> int:
    """The error register (0x1001) a drive with EMCY/0x603F error `code` reports (0 for no error)."""
    if code & 0xFF00 == 0:
        return 0
    group = code & 0xF000
    extra = {0x2000: ER_CURRENT, 0x3000: ER_VOLTAGE, 0x4000: ER_TEMPERATURE, 0x8000: ER_DEVICE_PROFILE}.get(group, 0)
    if code & 0xFF00 == 0x8100:    # 0x81xx: communication
        extra = ER_COMMUNICATION
    if code & 0xFF00 == 0xFF00:
        extra = ER_MANUFACTURER
    return ER_GENERIC | extra


# -- PDO maps ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mapped:
    """One object mapped into a PDO: index, subindex, CiA 301 data type, and a short field name (used by the
    golden vectors, the docs and the C header), with its unit."""

    index: int
    subindex: int
    data_type: int
    field: str
    unit: str

    @property
    def bits(self) -> int:
        return type_bits(self.data_type)

    @property
    def mapping_word(self) -> int:
        """The mapping parameter entry: index << 16 | subindex << 8 | length in bits."""
        return self.index << 16 | self.subindex << 8 | self.bits


@dataclass(frozen=True)
class PdoDef:
    """One PDO: TPDO (drive -> host) or RPDO (host -> drive) number 1..4, its mapped objects in order,
    whether it is valid by default, and its transmission type (1: every SYNC)."""

    transmit: bool
    number: int
    entries: tuple[Mapped, ...]
    enabled: bool = True
    transmission_type: int = 1

    def __post_init__(self):
        if not 1 <= self.number <= 4:
            raise CanFrameError(f"{self.name}: only PDOs 1..4 have pre-defined COB-IDs")
        if sum(e.bits for e in self.entries) > 64:
            raise CanFrameError(f"{self.name}: {sum(e.bits for e in self.entries)} bits mapped, a CAN frame holds 64")
        object.__setattr__(self, "_struct", struct.Struct("<" + "".join(_FORMAT[e.data_type] for e in self.entries)))
        object.__setattr__(self, "_ranges", tuple(type_range(e.data_type) for e in self.entries))

    @property
    def name(self) -> str:
        return f"{'T' if self.transmit else 'R'}PDO{self.number}"

    @property
    def cob_base(self) -> int:
        """COB-ID minus the node id (0x180, 0x280, ... for TPDOs; 0x200, 0x300, ... for RPDOs)."""
        return (0x180 if self.transmit else 0x200) + 0x100 * (self.number - 1)

    def cob_id(self, node: int) -> int:
        """The PDO's COB-ID on node `node` (1..127)."""
        if not MIN_NODE_ID <= node <= MAX_NODE_ID:
            raise CanFrameError(f"{self.name}: node id {node} outside {MIN_NODE_ID}..{MAX_NODE_ID}")
        return self.cob_base + node

    @property
    def communication_index(self) -> int:
        return (0x1800 if self.transmit else 0x1400) + self.number - 1

    @property
    def mapping_index(self) -> int:
        return (0x1A00 if self.transmit else 0x1600) + self.number - 1

    @property
    def dlc(self) -> int:
        """Payload length in bytes."""
        return self._struct.size

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(e.field for e in self.entries)

    def offsets(self) -> tuple[int, ...]:
        """Byte offset of each entry in the payload."""
        out, at = [], 0
        for e in self.entries:
            out.append(at)
            at += e.bits // 8
        return tuple(out)

    def pack(self, values: Sequence[int]) -> bytes:
        """The payload of `values` (one integer per entry, in wire units). CanFrameError names the field of
        a value that is not an integer of its type's range."""
        if len(values) != len(self.entries):
            raise CanFrameError(f"{self.name}: expected {len(self.entries)} values ({', '.join(self.fields)}), "
                                f"got {len(values)}")
        for e, (lo, hi), v in zip(self.entries, self._ranges, values):
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise CanFrameError(f"{self.name}: {e.field}: expected an integer in {lo}..{hi}, got {v!r}")
        return self._struct.pack(*values)

    def unpack(self, data: bytes | bytearray) -> tuple[int, ...]:
        """The values in a payload; CanFrameError when its length is not the PDO's DLC."""
        if len(data) != self._struct.size:
            raise CanFrameError(f"{self.name}: DLC {len(data)}, expected {self._struct.size}")
        return self._struct.unpack(bytes(data))

    def unpack_dict(self, data: bytes | bytearray) -> dict[str, int]:
        """unpack() as {field: value}."""
        return dict(zip(self.fields, self.unpack(data)))

    @property
    def dtype(self) -> np.dtype:
        """The payload as a packed numpy record (one field per entry, little-endian, itemsize = dlc): for
        encoding or decoding many payloads at once; its bytes are pack() / unpack()'s."""
        return np.dtype([(e.field, "<" + _FORMAT[e.data_type]) for e in self.entries])


_TIME = Mapped(HIGH_RES_TIME_STAMP, 0, UNSIGNED32, "time_stamp", "us")
_SW = Mapped(cia402.STATUSWORD, 0, UNSIGNED16, "statusword", "")
_POS = Mapped(cia402.POSITION_ACTUAL, 0, INTEGER32, "position_actual", "counts")
_MODE_DISPLAY = Mapped(cia402.MODES_OF_OPERATION_DISPLAY, 0, INTEGER8, "mode_display", "")
_VEL = Mapped(cia402.VELOCITY_ACTUAL, 0, INTEGER32, "velocity_actual", "counts/s")
_CUR = Mapped(CURRENT_ACTUAL_UA, 0, INTEGER32, "current_actual", "uA")
_TQ = Mapped(TORQUE_ACTUAL_MNM, 0, INTEGER32, "torque_actual", "mN m")
_FERR = Mapped(cia402.FOLLOWING_ERROR_ACTUAL, 0, INTEGER32, "following_error_actual", "counts")
_CW = Mapped(cia402.CONTROLWORD, 0, UNSIGNED16, "controlword", "")
_TPOS = Mapped(cia402.TARGET_POSITION, 0, INTEGER32, "target_position", "counts")
_MODE = Mapped(cia402.MODES_OF_OPERATION, 0, INTEGER8, "mode", "")
_TTQ = Mapped(TARGET_TORQUE_MNM, 0, INTEGER32, "target_torque", "mN m")
_TOFF = Mapped(cia402.TORQUE_OFFSET, 0, INTEGER16, "torque_offset", "per mille of 0x6076")

TPDO1 = PdoDef(True, 1, (_SW, _POS, _MODE_DISPLAY))
TPDO2 = PdoDef(True, 2, (_VEL, _CUR))
TPDO3 = PdoDef(True, 3, (_TQ, _FERR), enabled=False)   # a host enables it by SDO (0x1802 sub 1 bit 31)
TPDO4 = PdoDef(True, 4, (_TIME,))     # when the sample was latched, on the drive's clock: PDOs carry no time
RPDO1 = PdoDef(False, 1, (_CW, _TPOS, _MODE))
RPDO2 = PdoDef(False, 2, (_TTQ, _TOFF))
TPDOS: tuple[PdoDef, ...] = (TPDO1, TPDO2, TPDO3, TPDO4)
RPDOS: tuple[PdoDef, ...] = (RPDO1, RPDO2)
PDOS: tuple[PdoDef, ...] = TPDOS + RPDOS
SYNC_TRANSMISSION_TYPES = range(0, 241)   # 0: on SYNC when changed (TPDO); 1..240: every n-th SYNC
RPDO_ASYNC_TRANSMISSION_TYPES = (254, 255)


class PdoCodec:
    """The cyclic PDOs `pdos` of the nodes `node_ids`, for the side that exchanges them every SYNC (a host's
    TPDO decoding and RPDO encoding, a drive's the other way round): one preallocated payload (bytearray)
    per (PDO, node) that encode() fills in place, and decode() of a received frame by its COB-ID. The bytes
    are PdoDef.pack / unpack's; nothing is allocated per frame but the decoded tuple."""

    def __init__(self, pdos: Sequence[PdoDef], node_ids: Sequence[int]):
        self.pdos = tuple(pdos)
        self.node_ids = tuple(int(i) for i in node_ids)
        self.slots = {p.cob_id(nid): (k, j) for k, p in enumerate(self.pdos) for j, nid in enumerate(self.node_ids)}
        if len(self.slots) != len(self.pdos) * len(self.node_ids):
            raise CanFrameError(f"two of {[p.name for p in self.pdos]} on nodes {list(self.node_ids)} share a COB-ID")
        self.payloads = tuple(tuple(bytearray(p.dlc) for _ in self.node_ids) for p in self.pdos)
        self.structs = self._structs = tuple(p._struct for p in self.pdos)   # PDO k's struct.Struct (pack / unpack)

    def unpack(self, k: int, j: int, data: bytes | bytearray) -> tuple[int, ...]:
        """The values of PDO k's payload from node j (index into node_ids); CanFrameError naming the PDO and
        the node when its length is not the DLC."""
        s = self._structs[k]
        if len(data) != s.size:
            raise CanFrameError(f"{self.pdos[k].name} of node {self.node_ids[j]}: DLC {len(data)}, expected {s.size}")
        return s.unpack_from(data)

    def decode(self, cob_id: int, data: bytes | bytearray) -> tuple[int, int, tuple[int, ...]] | None:
        """(k, j, values) of a frame of PDO k from node j; None when cob_id is none of these PDOs';
        CanFrameError for a payload of the wrong length."""
        slot = self.slots.get(cob_id)
        if slot is None:
            return None
        k, j = slot
        return k, j, self.unpack(k, j, data)

    def encode(self, k: int, j: int, values: Sequence[int]) -> bytearray:
        """PDO k's payload for node j with `values` (one integer per entry, wire units), written into the
        preallocated payload, which is returned (reused by the next call). CanFrameError names the field of
        a value outside its type's range; the payload may then be half-written and must not be sent."""
        buf = self.payloads[k][j]
        try:
            self._structs[k].pack_into(buf, 0, *values)
        except struct.error:
            pdef = self.pdos[k]
            pdef.pack([int(v) if not isinstance(v, bool) else v for v in values])   # names the field
            raise CanFrameError(f"{pdef.name} of node {self.node_ids[j]}: cannot encode {list(values)}") from None
        return buf


def pdo_by_name(name: str) -> PdoDef:
    """The PdoDef called `name` ('TPDO1', ...)."""
    for p in PDOS:
        if p.name == name:
            return p
    raise CanFrameError(f"unknown PDO {name!r} (known: {', '.join(p.name for p in PDOS)})")


# -- the object dictionary ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Var:
    """One variable of the object dictionary. default: the EDS DefaultValue text (may use $NODEID) or None.
    access: ro, rw, wo, const. pdo: PDO-mappable."""

    subindex: int
    name: str
    data_type: int
    access: str
    default: str | None = None
    pdo: bool = False
    unit: str = ""
    low: int | None = None
    high: int | None = None


@dataclass(frozen=True)
class Obj:
    """An object: a single Var (subindex 0), or a RECORD of Vars (sub 0 = highest subindex)."""

    index: int
    name: str
    vars: tuple[Var, ...]
    record: bool = False
    description: str = ""


def _var(index, name, data_type, access, default=None, pdo=False, unit="", description="", low=None, high=None) -> Obj:
    return Obj(index, name, (Var(0, name, data_type, access, default, pdo, unit, low, high),), description=description)


def _record(index, name, members: Sequence[Var], description="") -> Obj:
    top = max(v.subindex for v in members)
    head = Var(0, "Highest sub-index supported", UNSIGNED8, "const", f"0x{top:02X}")
    return Obj(index, name, (head,) + tuple(members), record=True, description=description)


def _pdo_objects(p: PdoDef) -> list[Obj]:
    cob = f"$NODEID+0x{p.cob_base | (0 if p.enabled else PDO_NOT_VALID):X}"
    kind = "Transmit" if p.transmit else "Receive"
    comm = _record(p.communication_index, f"{kind} PDO {p.number} communication parameter", (
        Var(1, "COB-ID used by PDO", UNSIGNED32, "rw", cob),
        Var(2, "Transmission type", UNSIGNED8, "rw", f"0x{p.transmission_type:02X}"),
    ))
    mapping = Obj(p.mapping_index, f"{kind} PDO {p.number} mapping parameter", (
        Var(0, "Number of mapped objects", UNSIGNED8, "const", f"{len(p.entries)}"),) + tuple(
        Var(k + 1, f"Mapped object {k + 1}", UNSIGNED32, "const", f"0x{e.mapping_word:08X}")
        for k, e in enumerate(p.entries)), record=True)
    return [comm, mapping]


_I32 = type_range(INTEGER32)
OBJECTS: tuple[Obj, ...] = tuple([
    _var(DEVICE_TYPE, "Device type", UNSIGNED32, "ro", f"0x{DEVICE_TYPE_VALUE:08X}"),
    _var(ERROR_REGISTER, "Error register", UNSIGNED8, "ro", "0x00", pdo=True),
    _var(COB_ID_SYNC, "COB-ID SYNC", UNSIGNED32, "ro", f"0x{SYNC_COB_ID:08X}"),
    _var(MANUFACTURER_DEVICE_NAME, "Manufacturer device name", VISIBLE_STRING, "const", DEVICE_NAME),
    _var(HIGH_RES_TIME_STAMP, "High resolution time stamp", UNSIGNED32, "ro", "0", pdo=True, unit="us",
         description="The drive's clock in microseconds when it latched its inputs at the last SYNC (wraps "
                     "after 2^32 us, 71.6 min)"),
    _var(COB_ID_EMCY, "COB-ID EMCY", UNSIGNED32, "ro", f"$NODEID+0x{EMCY_COB_BASE:X}"),
    _var(PRODUCER_HEARTBEAT_TIME, "Producer heartbeat time", UNSIGNED16, "rw", f"{DEFAULT_HEARTBEAT_MS}", unit="ms"),
    _record(IDENTITY, "Identity object", (
        Var(1, "Vendor-ID", UNSIGNED32, "ro", f"0x{VENDOR_ID:08X}"),
        Var(2, "Product code", UNSIGNED32, "ro", f"0x{PRODUCT_CODE:08X}"),
        Var(3, "Revision number", UNSIGNED32, "ro", f"0x{REVISION_NUMBER:08X}"),
        Var(4, "Serial number", UNSIGNED32, "ro", "0x00000000"),
    )),
    *[o for p in RPDOS for o in _pdo_objects(p)[:1]],
    *[o for p in RPDOS for o in _pdo_objects(p)[1:]],
    *[o for p in TPDOS for o in _pdo_objects(p)[:1]],
    *[o for p in TPDOS for o in _pdo_objects(p)[1:]],
    _var(CURRENT_ACTUAL_UA, "Current actual value uA", INTEGER32, "ro", "0", pdo=True, unit="uA",
         description="Motor current in microamperes (manufacturer object; 0x6078 is per mille of 0x6075)"),
    _var(TORQUE_ACTUAL_MNM, "Torque actual value mNm", INTEGER32, "ro", "0", pdo=True, unit="mN m",
         description="Joint torque in millinewton-metres (manufacturer object; 0x6077 is per mille of 0x6076)"),
    _var(TARGET_TORQUE_MNM, "Target torque mNm", INTEGER32, "rw", "0", pdo=True, unit="mN m",
         description="CST target torque, CSP torque feed-forward, in millinewton-metres (0x6071 in per mille)"),
    _var(cia402.ERROR_CODE, "Error code", UNSIGNED16, "ro", "0x0000", pdo=True),
    _var(cia402.CONTROLWORD, "Controlword", UNSIGNED16, "rw", "0x0000", pdo=True),
    _var(cia402.STATUSWORD, "Statusword", UNSIGNED16, "ro", "0x0000", pdo=True),
    _var(cia402.QUICK_STOP_OPTION, "Quick stop option code", INTEGER16, "rw", "2"),
    _var(cia402.MODES_OF_OPERATION, "Modes of operation", INTEGER8, "rw", "0", pdo=True),
    _var(cia402.MODES_OF_OPERATION_DISPLAY, "Modes of operation display", INTEGER8, "ro", "0", pdo=True),
    _var(cia402.POSITION_ACTUAL, "Position actual value", INTEGER32, "ro", "0", pdo=True, unit="counts"),
    _var(cia402.FOLLOWING_ERROR_WINDOW, "Following error window", UNSIGNED32, "rw", None, unit="counts"),
    _var(cia402.FOLLOWING_ERROR_TIMEOUT, "Following error time out", UNSIGNED16, "rw", None, unit="ms"),
    _var(cia402.VELOCITY_ACTUAL, "Velocity actual value", INTEGER32, "ro", "0", pdo=True, unit="counts/s"),
    _var(cia402.TARGET_TORQUE, "Target torque", INTEGER16, "rw", "0", pdo=True, unit="per mille of 0x6076"),
    _var(cia402.MAX_TORQUE, "Max torque", UNSIGNED16, "rw", None, unit="per mille of 0x6076"),
    _var(cia402.RATED_CURRENT, "Motor rated current", UNSIGNED32, "ro", None, unit="mA"),
    _var(cia402.RATED_TORQUE, "Motor rated torque", UNSIGNED32, "ro", None, unit="mN m"),
    _var(cia402.TORQUE_ACTUAL, "Torque actual value", INTEGER16, "ro", "0", pdo=True, unit="per mille of 0x6076"),
    _var(cia402.CURRENT_ACTUAL, "Current actual value", INTEGER16, "ro", "0", pdo=True, unit="per mille of 0x6075"),
    _var(cia402.TARGET_POSITION, "Target position", INTEGER32, "rw", "0", pdo=True, unit="counts"),
    _record(cia402.SOFTWARE_POSITION_LIMIT, "Software position limit", (
        Var(1, "Min position limit", INTEGER32, "rw", None, unit="counts"),
        Var(2, "Max position limit", INTEGER32, "rw", None, unit="counts"),
    )),
    _var(cia402.QUICK_STOP_DECELERATION, "Quick stop deceleration", UNSIGNED32, "rw", None, unit="counts/s^2"),
    _record(cia402.POSITION_ENCODER_RESOLUTION, "Position encoder resolution", (
        Var(1, "Encoder increments", UNSIGNED32, "ro", None),
        Var(2, "Motor revolutions", UNSIGNED32, "ro", None),
    )),
    _record(cia402.GEAR_RATIO, "Gear ratio", (
        Var(1, "Motor revolutions", UNSIGNED32, "ro", None),
        Var(2, "Shaft revolutions", UNSIGNED32, "ro", None),
    )),
    _var(cia402.TORQUE_OFFSET, "Torque offset", INTEGER16, "rw", "0", pdo=True, unit="per mille of 0x6076",
         description="Added to the position loop's torque in CSP and to the target torque in CST"),
    _var(cia402.FOLLOWING_ERROR_ACTUAL, "Following error actual value", INTEGER32, "ro", "0", pdo=True, unit="counts"),
    _var(cia402.SUPPORTED_DRIVE_MODES, "Supported drive modes", UNSIGNED32, "ro",
         f"0x{cia402.SUPPORTED_MODE_BITS[8] | cia402.SUPPORTED_MODE_BITS[10]:08X}"),
])
MANDATORY = (DEVICE_TYPE, ERROR_REGISTER, IDENTITY)


def eds_text() -> str:
    """The EDS (CiA 306) of one drive, generated from OBJECTS; armid_drive.eds is this text."""
    lines = [
        "; armid joint drive, CiA 402. Generated by `python -m firmware_bridge.canopen_map eds`: edit",
        "; firmware_bridge/canopen_map.py, not this file.",
        "[FileInfo]", "FileName=armid_drive.eds", "FileVersion=1", "FileRevision=0", "EDSVersion=4.0",
        "Description=armid 6-DOF arm joint drive (CiA 402, CSP and CST)", "CreatedBy=armid",
        "", "[DeviceInfo]", "VendorName=armid", f"VendorNumber=0x{VENDOR_ID:08X}", f"ProductName={DEVICE_NAME}",
        f"ProductNumber=0x{PRODUCT_CODE:08X}", f"RevisionNumber=0x{REVISION_NUMBER:08X}",
        *[f"BaudRate_{r}={int(r in (125, 250, 500, 1000))}" for r in (10, 20, 50, 125, 250, 500, 800, 1000)],
        "SimpleBootUpMaster=0", "SimpleBootUpSlave=1", "Granularity=0", "DynamicChannelsSupported=0",
        "GroupMessaging=0", f"NrOfRXPDO={len(RPDOS)}", f"NrOfTXPDO={len(TPDOS)}", "LSS_Supported=0",
        "", "[DummyUsage]", *[f"Dummy{i:04d}=0" for i in range(1, 8)],
    ]
    groups = {"MandatoryObjects": [o for o in OBJECTS if o.index in MANDATORY],
              "OptionalObjects": [o for o in OBJECTS if o.index not in MANDATORY and not 0x2000 <= o.index < 0x6000],
              "ManufacturerObjects": [o for o in OBJECTS if 0x2000 <= o.index < 0x6000]}
    for group, objs in groups.items():
        lines += ["", f"[{group}]", f"SupportedObjects={len(objs)}"]
        lines += [f"{k + 1}=0x{o.index:04X}" for k, o in enumerate(objs)]
    for objs in groups.values():
        for o in objs:
            if o.record:
                lines += ["", f"[{o.index:04X}]", f"ParameterName={o.name}", "ObjectType=0x9",
                          f"SubNumber={len(o.vars)}"]
                for v in o.vars:
                    lines += ["", f"[{o.index:04X}sub{v.subindex}]", *_var_lines(v)]
            else:
                lines += ["", f"[{o.index:04X}]", *_var_lines(o.vars[0])]
                if o.description:
                    lines.append(f"Description={o.description}")
    return "\n".join(lines) + "\n"


def _var_lines(v: Var) -> list[str]:
    out = [f"ParameterName={v.name}", "ObjectType=0x7", f"DataType=0x{v.data_type:04X}", f"AccessType={v.access}"]
    if v.default is not None:
        out.append(f"DefaultValue={v.default}")
    out.append(f"PDOMapping={int(v.pdo)}")
    if v.low is not None:
        out.append(f"LowLimit={v.low}")
    if v.high is not None:
        out.append(f"HighLimit={v.high}")
    if v.unit:
        out.append(f"Unit={v.unit}")
    return out


# -- bus load ----------------------------------------------------------------------------------------
def frame_bits(dlc: int, stuffing: bool = True) -> int:
    """Bits one standard (11-bit id) data frame of dlc bytes occupies on the bus, with the 3-bit
    interframe space; stuffing=True adds the worst-case stuff bits (one per 4 bits of the 34 + 8 dlc
    stuffed ones)."""
    if not 0 <= dlc <= 8:
        raise CanFrameError(f"DLC {dlc}: a classic CAN frame carries 0..8 bytes")
    bits = 47 + 8 * dlc
    if stuffing:
        bits += (34 + 8 * dlc - 1) // 4
    return bits


TIME_STAMP_WRAP = 1 << 32    # 0x1013 counts us modulo 2^32


def time_stamp(seconds: float) -> int:
    """0x1013's value (us, modulo 2^32) for a time in seconds on the drive's clock."""
    return round(seconds * 1e6) % TIME_STAMP_WRAP


def cycle_bits(n_nodes: int, stuffing: bool = True, pdos: Sequence[PdoDef] | None = None) -> int:
    """Bits of one SYNC cycle: the SYNC frame plus every enabled PDO (default maps) of n_nodes drives."""
    pdos = [p for p in PDOS if p.enabled] if pdos is None else pdos
    return frame_bits(0, stuffing) + n_nodes * sum(frame_bits(p.dlc, stuffing) for p in pdos)


def max_cycle_rate(n_nodes: int, bitrate: float = 1e6, stuffing: bool = True) -> float:
    """Highest SYNC rate (Hz) that fits the cycle's frames into a bus of `bitrate` bit/s (100 % load)."""
    return bitrate / cycle_bits(n_nodes, stuffing)


# -- generated documentation and C constants ---------------------------------------------------------
def _hex(v: int, width: int = 4) -> str:
    return f"0x{v:0{width}X}"


def pdo_table() -> str:
    """Markdown tables of every PDO map (docs/reference/wire-can.md includes this text verbatim)."""
    out = []
    for p in PDOS:
        state = "valid" if p.enabled else "not valid by default (set 0x%04X sub 1 bit 31 = 0)" % p.communication_index
        out.append(f"**{p.name}** COB-ID {_hex(p.cob_base, 3)} + node id, DLC {p.dlc}, transmission type "
                   f"{p.transmission_type}, {state}; communication {_hex(p.communication_index)}, "
                   f"mapping {_hex(p.mapping_index)}")
        out.append("")
        out.append("| byte | object | type | field | unit | mapping entry |")
        out.append("| --- | --- | --- | --- | --- | --- |")
        for off, e in zip(p.offsets(), p.entries):
            out.append(f"| {off}..{off + e.bits // 8 - 1} | {_hex(e.index)}:{e.subindex:02X} | "
                       f"{_TYPE_NAME[e.data_type]} | {e.field} | {e.unit or '-'} | {_hex(e.mapping_word, 8)} |")
        out.append("")
    return "\n".join(out)


def object_table() -> str:
    """Markdown table of the object dictionary (docs/reference/wire-can.md includes this text verbatim)."""
    out = ["| index:sub | name | type | access | PDO | unit | default |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for o in OBJECTS:
        if 0x1400 <= o.index < 0x1C00:
            continue   # the PDO parameters are in the PDO tables
        for v in o.vars:
            if o.record and v.subindex == 0:
                continue
            name = v.name if not o.record else f"{o.name}: {v.name}"
            out.append(f"| {_hex(o.index)}:{v.subindex:02X} | {name} | {_TYPE_NAME[v.data_type]} | {v.access} | "
                       f"{'yes' if v.pdo else 'no'} | {v.unit or '-'} | {v.default if v.default is not None else 'per joint'} |")
    return "\n".join(out) + "\n"


def c_constants() -> list[tuple[str, int, str]]:
    """(name, value, comment) for the generated C header: COB-ID bases, PDO lengths, mapped objects and
    their byte offsets, the manufacturer object indices, the device type."""
    out: list[tuple[str, int, str]] = [
        ("CAN_NMT_COB_ID", NMT_COB_ID, "NMT command"),
        ("CAN_SYNC_COB_ID", SYNC_COB_ID, "SYNC (default of 0x1005)"),
        ("CAN_EMCY_COB_BASE", EMCY_COB_BASE, "EMCY COB-ID = base + node id"),
        ("CAN_SDO_TX_COB_BASE", SDO_TX_COB_BASE, "SDO response (server -> client) = base + node id"),
        ("CAN_SDO_RX_COB_BASE", SDO_RX_COB_BASE, "SDO request (client -> server) = base + node id"),
        ("CAN_HEARTBEAT_COB_BASE", HEARTBEAT_COB_BASE, "heartbeat / boot-up = base + node id"),
        ("CAN_DEVICE_TYPE", DEVICE_TYPE_VALUE, "0x1000: CiA 402 servo drive"),
        ("CAN_DEFAULT_HEARTBEAT_MS", DEFAULT_HEARTBEAT_MS, "0x1017 default, ms"),
        ("CAN_OD_CURRENT_ACTUAL_UA", CURRENT_ACTUAL_UA, "int32 motor current, uA"),
        ("CAN_OD_TORQUE_ACTUAL_MNM", TORQUE_ACTUAL_MNM, "int32 joint torque, mN m"),
        ("CAN_OD_TARGET_TORQUE_MNM", TARGET_TORQUE_MNM, "int32 target torque / feed-forward, mN m"),
    ]
    for p in PDOS:
        n = f"CAN_{p.name}"
        out.append((f"{n}_COB_BASE", p.cob_base, f"{p.name} COB-ID = base + node id"))
        out.append((f"{n}_DLC", p.dlc, f"{p.name} payload bytes"))
        out.append((f"{n}_ENABLED", int(p.enabled), f"{p.name} valid by default"))
        for off, e in zip(p.offsets(), p.entries):
            f = e.field.upper()
            out.append((f"{n}_{f}_MAPPING", e.mapping_word, f"0x{e.index:04X}:{e.subindex:02X}, {e.bits} bits"))
            out.append((f"{n}_{f}_OFFSET", off, f"byte offset of {e.field} ({_TYPE_NAME[e.data_type]}, "
                                                f"{e.unit or 'no unit'})"))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m firmware_bridge.canopen_map eds|doc`: print the EDS or the docs tables."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["eds"]:
        sys.stdout.write(eds_text())
    elif args == ["doc"]:
        sys.stdout.write(pdo_table() + "\n" + object_table())
    else:
        sys.stderr.write("usage: python -m firmware_bridge.canopen_map eds|doc\n")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
