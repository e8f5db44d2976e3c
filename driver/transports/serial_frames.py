"""The two frames the serial link carries every cycle, without allocating per frame: the host's COMMAND
and the device's STATE, laid out by firmware_bridge.serial_protocol's own records (HEADER, the messages'
fixed and joint records as numpy dtypes), so the bytes are the protocol's by construction
(tests/test_serial_frames.py checks them byte for byte against serial_protocol.encode / decode).

    enc = CommandEncoder(n, counts_per_rad)   ->  enc.encode(seq, command) = 0x00 COBS(frame) 0x00
    dec = FrameSplitter(n)                    ->  dec.feed(data) -> [(kind, value)]: STATE frames straight
                                                  into a preallocated record, anything else through
                                                  serial_protocol.StreamDecoder (its checks, its counters)
"""
from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

import numpy as np
from cobs import cobs

from driver.hal import OFFSET_MNM, ArmCommand, command_to_wire, unsendable
from firmware_bridge import serial_protocol as sp
from firmware_bridge.units import INT32_MAX, WireValueError

_CRC = struct.Struct("<I")
_SEQ = struct.Struct("<H")


def frame_dtype(kind: sp.MsgType, n: int) -> np.dtype:
    """The packed dtype of one decoded frame of type kind with n joints: header, fixed record, joints, CRC."""
    spec = sp.SPECS[kind]
    parts = [("header", sp.HEADER.dtype), ("fixed", spec.fixed.dtype)]
    if spec.joint is not None:
        parts.append(("joints", spec.joint.dtype, (n,)))
    return np.dtype(parts + [("crc", "<u4")])


class CommandEncoder:
    """COMMAND frames for n joints into one preallocated buffer (targets in SI, converted with counts_per_rad
    per joint and mN m, as JointScaling does)."""

    def __init__(self, n: int, counts_per_rad: np.ndarray):
        self.n = n
        self.counts_per_rad = np.ascontiguousarray(counts_per_rad, dtype=np.float64)
        dt = frame_dtype(sp.MsgType.COMMAND, n)
        self._bytes = bytearray(dt.itemsize)            # the frame; the record below is a view of it
        self._record = np.frombuffer(self._bytes, dt)
        rec = self._record[0]
        rec["header"]["version"] = sp.VERSION
        rec["header"]["type"] = int(sp.MsgType.COMMAND)
        rec["header"]["length"] = sp.SPECS[sp.MsgType.COMMAND].payload_size(n)
        rec["fixed"]["n_joints"] = n
        joints = self._record["joints"][0]
        self._columns = (joints["controlword"], joints["mode"], joints["target_position"], joints["target_torque"],
                         joints["torque_offset"])
        self._offset_per_nm = np.full(n, OFFSET_MNM)
        self._body = memoryview(self._bytes)[:-sp.CRC_SIZE]
        self._crc_at = dt.itemsize - sp.CRC_SIZE
        c = ArmCommand(n)         # compile (or load) the conversion now, not at the cycle's first command
        self._to_wire(c)

    def _to_wire(self, command) -> int:
        return command_to_wire(command.controlword, command.mode, command.target_position, command.target_torque,
                               command.torque_offset, self.counts_per_rad, self._offset_per_nm, INT32_MAX,
                               *self._columns)

    def encode(self, seq: int, command) -> bytes:
        """Wire bytes (0x00, COBS frame, 0x00) of command (driver.hal.ArmCommand) with sequence number seq.
        WireValueError, naming the field and the joint, for a target or offset that is not finite or does not
        fit int32."""
        if self._to_wire(command) >= 0:
            raise WireValueError(unsendable(command, self.counts_per_rad, self._offset_per_nm, INT32_MAX))
        _SEQ.pack_into(self._bytes, 2, seq & 0xFFFF)
        _CRC.pack_into(self._bytes, self._crc_at, zlib.crc32(self._body))
        return b"\0" + cobs.encode(self._bytes) + b"\0"


STATE = "state"
MESSAGE = "message"


class FrameSplitter:
    """Splits the device's byte stream at the 0x00 delimiters. A well-formed STATE frame for n joints (right
    size, CRC, version, type, length, n_joints: a STATE holds only integers, so nothing else can be wrong) is
    copied into `state` (a record of frame_dtype(STATE, n)) and reported as (STATE, seq); every other chunk
    goes, delimiter and all, through `decoder` (serial_protocol.StreamDecoder), which decodes it or counts
    why it was dropped: (MESSAGE, message). `decoder.counters` counts every frame, both paths."""

    def __init__(self, n: int, decoder: sp.StreamDecoder | None = None):
        self.n = n
        self.decoder = decoder or sp.StreamDecoder()
        dt = frame_dtype(sp.MsgType.STATE, n)
        self.size = dt.itemsize
        self._record = np.zeros(1, dt)
        self.state = self._record[0]
        self.raw = self._record.view(np.uint8)
        self._raw_bytes = memoryview(self.raw)
        self.joints = self._record["joints"][0]
        self._prefix = bytes((sp.VERSION, int(sp.MsgType.STATE)))
        self._length = struct.pack("<H", sp.SPECS[sp.MsgType.STATE].payload_size(n))
        self._n_at = sp.HEADER.size + dt["fixed"].fields["n_joints"][1]
        self._buf = bytearray()
        self._passing = False      # an overlong chunk is being handed to the decoder up to its delimiter

    def feed(self, data: bytes) -> Iterator[tuple[str, object]]:
        """Add bytes; yield what they completed, in order: (STATE, seq) or (MESSAGE, message). A generator:
        `state` holds a STATE's values until the next item is asked for."""
        if not data:
            return
        if self._passing:             # the rest of an overlong chunk: the decoder discards it
            end = data.find(b"\0")
            if end < 0:
                self.decoder.feed(data)
                return
            yield from self._pass(data[:end + 1])
            self._passing = False
            data = data[end + 1:]
        self._buf += data
        *chunks, rest = self._buf.split(b"\0")
        if len(rest) > self.decoder.max_encoded:
            self._passing = True          # the decoder counts the overflow and skips to a delimiter
        else:
            self._buf = bytearray(rest)
        if self._passing:
            self._buf = bytearray()
        for chunk in chunks:
            if not chunk:
                continue
            seq = self._state(chunk)
            if seq >= 0:
                self.decoder._sequence(seq)       # the decoder's own frame and sequence accounting
                yield STATE, seq
            else:
                yield from self._pass(chunk + b"\0")
        if self._passing and rest:
            yield from self._pass(rest)

    def _pass(self, data: bytes) -> Iterator[tuple[str, object]]:
        for msg in self.decoder.feed(data):
            yield MESSAGE, msg

    def _state(self, chunk: bytes) -> int:
        """The frame's seq if chunk is a well-formed STATE for n joints (copied into `state`), else -1."""
        if len(chunk) > self.size + 3:            # COBS adds 1 byte per 254, so a STATE is at most this
            return -1
        try:
            frame = cobs.decode(chunk)
        except cobs.DecodeError:
            return -1
        if (len(frame) != self.size or frame[0:2] != self._prefix or frame[4:6] != self._length
                or frame[self._n_at] != self.n
                or zlib.crc32(memoryview(frame)[:-sp.CRC_SIZE]) != _CRC.unpack_from(frame, self.size - sp.CRC_SIZE)[0]):
            return -1
        self._raw_bytes[:] = frame            # a C-level copy into the record (no numpy call per frame)
        return _SEQ.unpack_from(frame, 2)[0]
