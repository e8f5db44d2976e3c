"""The serial joint-board protocol: golden vectors, byte layout against hand-built frames, encoder refusals,
the stream decoder's drop counters and sequence accounting, and hypothesis properties on the decoders."""
from __future__ import annotations

import json
import struct
import zlib
from dataclasses import fields

import numpy as np
import pytest
from cobs import cobs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firmware_bridge import serial_protocol as sp
from firmware_bridge import serial_vectors as sv
from firmware_bridge.units import WireValueError

VECTORS = json.loads(sv.VECTORS_PATH.read_text())


def crc32_bitwise(data: bytes) -> int:
    """Independent CRC-32 (reflected 0xEDB88320, init/xorout 0xFFFFFFFF), bit by bit."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def raw_frame(version: int, kind: int, seq: int, payload: bytes, length: int | None = None) -> bytes:
    """A frame with any header and a correct CRC (to reach the checks after the CRC)."""
    body = struct.pack("<BBHH", version, kind, seq, len(payload) if length is None else length) + payload
    return body + struct.pack("<I", zlib.crc32(body))


def wire(frame: bytes) -> bytes:
    return cobs.encode(frame) + b"\0"


def same(msg, expected) -> bool:
    """Two messages of the same type with equal values and seq."""
    return type(msg) is type(expected) and msg.seq == expected.seq and \
        json.dumps(sv.values_of(msg)) == json.dumps(sv.values_of(expected))


# -- golden vectors -------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", VECTORS["cases"], ids=[c["name"] for c in VECTORS["cases"]])
def test_golden_vector_bytes_decode_to_its_values_and_its_values_encode_to_its_bytes(case):
    wire_bytes, frame = bytes.fromhex(case["wire_hex"]), bytes.fromhex(case["frame_hex"])
    msg = sp.decode(wire_bytes)
    assert type(msg).__name__ == sp.SPECS[sp.MsgType[case["type"]]].cls.__name__
    assert msg.seq == case["seq"]
    assert json.loads(json.dumps(sv.values_of(msg))) == case["values"]
    again = sv.message_from(case["type"], case["values"], case["seq"])
    assert sp.encode_frame(again) == frame
    assert sp.encode(again) == wire_bytes
    assert cobs.encode(frame) + b"\0" == wire_bytes          # the framing is plain COBS + delimiter
    assert struct.unpack("<I", frame[-4:])[0] == crc32_bitwise(frame[:-4])   # independent CRC


def test_golden_vectors_cover_every_message_type_and_the_committed_file_is_the_generators():
    assert {c["type"] for c in VECTORS["cases"]} == {t.name for t in sp.MsgType}
    assert sv.VECTORS_PATH.read_text() == sv.vectors_text()
    assert any(len(bytes.fromhex(c["frame_hex"])) > 254 for c in VECTORS["cases"])  # a multi-block COBS frame


def test_committed_doc_contains_the_generated_tables_and_examples():
    doc = sv.DOC_PATH.read_text()
    assert sv.doc_block() in doc
    assert sp.doc_tables() in doc


def test_crc_is_the_catalogued_crc32_check_value():
    assert zlib.crc32(b"123456789") == crc32_bitwise(b"123456789") == 0xCBF43926


def test_cobs_framing_matches_the_published_examples():
    # Cheshire & Baker's encoding, examples as in the COBS literature
    assert sp.cobs_encode(b"\x00") == b"\x01\x01"
    assert sp.cobs_encode(b"\x11\x22\x00\x33") == b"\x03\x11\x22\x02\x33"
    assert sp.cobs_encode(bytes(range(1, 255))) == b"\xff" + bytes(range(1, 255))
    assert sp.cobs_encode(b"\x00" + bytes(range(1, 255))) == b"\x01\xff" + bytes(range(1, 255))


def test_heartbeat_bytes_follow_the_documented_layout_built_by_hand():
    t, seq = 0x1122334455667788, 0xBEEF
    body = bytes([2, 3]) + seq.to_bytes(2, "little") + (8).to_bytes(2, "little") + t.to_bytes(8, "little")
    frame = body + crc32_bitwise(body).to_bytes(4, "little")
    assert sp.encode_frame(sp.Heartbeat(time_us=t), seq) == frame
    back = sp.decode(wire(frame))
    assert isinstance(back, sp.Heartbeat) and back.time_us == t and back.seq == seq


def test_command_bytes_with_the_torque_offset_follow_the_documented_layout_built_by_hand():
    le = lambda v, k: int(v).to_bytes(k, "little", signed=v < 0)  # noqa: E731
    joints = [(0x000F, 8, 123_456, 0, -48_000), (0x000F, 10, -1, 2_500, 2 ** 31 - 1)]
    payload = le(len(joints), 1)
    for cw, mode, pos, tq, off in joints:
        payload += le(cw, 2) + le(mode, 1) + le(pos, 4) + le(tq, 4) + le(off, 4)
    body = bytes([2, 5]) + le(300, 2) + le(len(payload), 2) + payload
    frame = body + le(crc32_bitwise(body), 4)
    cols = [np.array(c) for c in zip(*joints)]
    msg = sp.Command(controlword=cols[0], mode=cols[1], target_position=cols[2], target_torque=cols[3],
                     torque_offset=cols[4])
    assert sp.encode_frame(msg, 300) == frame
    back = sp.decode_frame(frame)
    assert back.torque_offset.tolist() == [-48_000, 2 ** 31 - 1] and back.target_torque.tolist() == [0, 2_500]


def test_a_command_of_the_protocol_before_the_offset_is_dropped_for_its_version_never_misread():
    """Version 1 sent COMMAND joints of 11 bytes (no torque_offset): such a frame, CRC and all, is counted as
    `version` and dropped, and the decoder names the version it spoke."""
    payload = bytes([1]) + struct.pack("<Hbii", 0x0F, 8, 1000, 1500)
    dec = sp.StreamDecoder()
    assert dec.feed(wire(raw_frame(1, 5, 0, payload))) == []
    assert dec.counters.version == 1 and dec.other_version == 1


def test_state_bytes_follow_the_documented_layout_built_by_hand():
    le = lambda v, k: int(v).to_bytes(k, "little", signed=v < 0)  # noqa: E731
    joints = [(0x0237, 8, 0, -5, 1000, -2_000_000), (0x0208, -1, 0x8611, 2 ** 31 - 1, -(2 ** 31), 7)]
    payload = le(123_456_789, 8) + le(42, 4) + le(len(joints), 1)
    for sw, mode, err, pos, vel, cur in joints:
        payload += le(sw, 2) + le(mode, 1) + le(err, 2) + le(pos, 4) + le(vel, 4) + le(cur, 4)
    body = bytes([2, 4]) + le(9, 2) + le(len(payload), 2) + payload
    frame = body + le(crc32_bitwise(body), 4)
    cols = list(zip(*joints))
    msg = sp.State(timestamp_us=123_456_789, cycle=42, statusword=cols[0], mode_display=cols[1], error_code=cols[2],
                   position=cols[3], velocity=cols[4], current=cols[5])
    assert sp.encode_frame(msg, 9) == frame
    back = sp.decode_frame(frame)
    assert back.position.tolist() == list(cols[3]) and back.mode_display.tolist() == [8, -1]
    assert back.current.dtype == np.int64 and back.seq == 9


def test_message_classes_have_exactly_the_fields_of_their_tables():
    for spec in sp.SPECS.values():
        table = [n for n in spec.fixed.names if n != "n_joints"] + (list(spec.joint.names) if spec.joint else [])
        assert [f.name for f in fields(spec.cls) if f.name != "seq"] == table, spec.type.name
        assert ("n_joints" in spec.fixed.names) == (spec.joint is not None)


# -- encoder refusals -----------------------------------------------------------------------------------
def command(n=3, **over):
    kw = dict(controlword=np.full(n, 0x0F), mode=np.full(n, 8), target_position=np.arange(n),
              target_torque=np.zeros(n, int))
    kw.update(over)
    return sp.Command(**kw)


@pytest.mark.parametrize("msg, words", [
    (command(target_position=[0, 1, 2 ** 31]), ["COMMAND", "target_position", "joint 3"]),
    (command(target_torque=[0.0, np.nan, 0.0]), ["target_torque", "joint 2"]),
    (command(controlword=[1.5, 0, 0]), ["controlword", "joint 1"]),
    (command(controlword=[-1, 0, 0]), ["controlword", "joint 1"]),
    (command(mode=[8, 8, 200]), ["mode", "joint 3"]),
    (command(mode=[8, 8]), ["mode", "3 values"]),
    (command(n=65), ["1..64 joints"]),
    (sp.Command(controlword=[], mode=[], target_position=[], target_torque=[]), ["1..64 joints"]),
    (sp.HelloAck(cycle_period_us=1000, watchdog_us=0, counts_per_rev=[1, 1], gear_ratio=[1.0, np.inf]),
     ["gear_ratio", "joint 2"]),
    (sp.Heartbeat(time_us=-1), ["HEARTBEAT", "time_us"]),
    (sp.Heartbeat(time_us=True), ["time_us", "expected a number"]),
    (sp.Fault(joint=0, error_code=0x10000, statusword=0), ["FAULT", "error_code"]),
    (sp.Heartbeat(time_us=0, seq=70_000), ["seq"]),
])
def test_encoders_refuse_values_the_wire_cannot_hold_naming_field_and_joint(msg, words):
    with pytest.raises(WireValueError) as err:
        sp.encode(msg)
    for w in words:
        assert w in str(err.value)


def test_encode_command_helper_and_frame_encoder_number_frames():
    enc = sp.FrameEncoder(first_seq=65535)
    a, b = enc.encode(sp.Heartbeat(time_us=1)), enc.encode(sp.Heartbeat(time_us=2))
    dec = sp.StreamDecoder()
    got = dec.feed(a + b + sp.encode_command(1, [6], [8], [100], [-3]))
    assert [m.seq for m in got] == [65535, 0, 1]
    assert got[2].target_position.tolist() == [100] and got[2].target_torque.tolist() == [-3]
    assert dec.counters.gaps == 0 and dec.counters.backwards == 0


# -- stream decoder: every drop reason ------------------------------------------------------------------
GOOD = sp.encode(sp.Heartbeat(time_us=99, seq=5))
STATE0 = sp.encode_frame(sv.golden_cases()[4][1])           # state_6


def _state_payload(n: int, joints: int) -> bytes:
    return struct.pack("<QIB", 0, 0, n) + bytes(17 * joints)


@pytest.mark.parametrize("bad, reason", [
    (b"\x05\x01\x00", "cobs"),
    (wire(b"\x01\x03\x00\x00\x00"), "truncated"),
    (wire(STATE0[:20] + bytes([STATE0[20] ^ 0x10]) + STATE0[21:]), "crc"),
    (wire(STATE0[:-7]), "crc"),                                             # lost bytes
    (wire(raw_frame(1, 3, 0, bytes(8))), "version"),                    # an older peer
    (wire(raw_frame(2, 99, 0, bytes(8))), "unknown_type"),
    (wire(raw_frame(2, 3, 0, bytes(8), length=9)), "length"),
    (wire(raw_frame(2, 3, 0, bytes(7))), "length"),
    (wire(raw_frame(2, 4, 0, _state_payload(6, 5))), "length"),
    (wire(raw_frame(2, 4, 0, _state_payload(0, 0))), "value"),
    (wire(raw_frame(2, 4, 0, _state_payload(65, 0))), "value"),
    (wire(raw_frame(2, 4, 0, _state_payload(65, 65))), "overflow"),               # longer than any valid frame
    (wire(raw_frame(2, 2, 0, struct.pack("<BII", 1, 1000, 0) + struct.pack("<Id", 1, float("nan")))), "value"),
])
def test_stream_decoder_counts_and_drops_each_kind_of_bad_frame_then_resynchronises(bad, reason):
    dec = sp.StreamDecoder()
    assert dec.feed(bad) == []
    counts = dec.counters.as_dict()
    assert counts[reason] == 1 and dec.counters.dropped == 1, counts
    got = dec.feed(GOOD)
    assert len(got) == 1 and got[0].time_us == 99 and dec.counters.frames == 1


def test_stream_decoder_memory_stays_bounded_on_garbage_without_delimiters():
    dec = sp.StreamDecoder()
    for _ in range(20):
        assert dec.feed(b"\xAA" * 500) == []
        assert dec.buffered <= dec.max_encoded
    assert dec.counters.overflow == 1            # one overlong frame, counted once
    assert dec.feed(b"\xAA" * 10 + b"\0") == []  # the end of the overlong frame is discarded, not decoded
    assert dec.counters.dropped == 1
    assert len(dec.feed(GOOD)) == 1


def test_stream_decoder_counts_sequence_gaps_lost_frames_and_restarts():
    dec = sp.StreamDecoder()
    stream = b"".join(sp.encode(sp.Heartbeat(time_us=s), s) for s in (65534, 65535, 0, 3, 4, 9, 0))
    got = dec.feed(stream)
    assert [m.seq for m in got] == [65534, 65535, 0, 3, 4, 9, 0]
    c = dec.counters
    assert (c.gaps, c.lost, c.backwards, c.frames, c.dropped) == (2, 2 + 4, 1, 7, 0)


def test_stream_decoder_ignores_empty_frames_between_delimiters():
    dec = sp.StreamDecoder()
    assert len(dec.feed(b"\0\0" + GOOD + b"\0")) == 1 and dec.counters.dropped == 0


# -- properties -----------------------------------------------------------------------------------------
def _ints(ctype: str):
    from firmware_bridge.wire import CTYPES
    t = CTYPES[ctype]
    return st.integers(int(t.lo), int(t.hi))


@st.composite
def messages(draw):
    spec = draw(st.sampled_from(list(sp.SPECS.values())))
    kw = {}
    n = draw(st.integers(1, 8))
    for f in spec.fixed.fields:
        if f.name != "n_joints":
            kw[f.name] = draw(_ints(f.ctype))
    if spec.joint:
        for f in spec.joint.fields:
            elem = st.floats(allow_nan=False, allow_infinity=False) if f.type.is_float else _ints(f.ctype)
            kw[f.name] = np.array(draw(st.lists(elem, min_size=n, max_size=n)))
    return spec.cls(**kw, seq=draw(_ints("uint16")))


@settings(max_examples=60, deadline=None)
@given(msgs=st.lists(messages(), min_size=1, max_size=5), cuts=st.lists(st.integers(0, 2000), max_size=6))
def test_any_messages_round_trip_through_the_stream_decoder_in_any_chunking(msgs, cuts):
    stream = b"".join(sp.encode(m) for m in msgs)
    dec, got = sp.StreamDecoder(), []
    start = 0
    for cut in sorted(c % (len(stream) + 1) for c in cuts) + [len(stream)]:
        got += dec.feed(stream[start:cut])
        start = cut
    assert len(got) == len(msgs) and dec.counters.dropped == 0
    assert all(same(a, b) for a, b in zip(got, msgs))


def _frames_in(data: bytes) -> set[bytes]:
    """Every chunk between delimiters that is valid COBS, decoded (independently of the decoder)."""
    out = set()
    for chunk in data.split(b"\0"):
        try:
            out.add(cobs.decode(chunk))
        except cobs.DecodeError:
            pass
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=600), chunk=st.integers(1, 64))
def test_random_bytes_never_raise_and_yield_only_frames_whose_crc_was_right(data, chunk):
    dec = sp.StreamDecoder()
    got = []
    for i in range(0, len(data), chunk):
        got += dec.feed(data[i:i + chunk])
    frames = _frames_in(data)
    for m in got:   # a message comes out only if its exact frame, CRC included, was in the input
        assert sp.encode_frame(m) in frames
    assert dec.counters.frames == len(got)


@settings(max_examples=150, deadline=None)
@given(msg=messages(), edits=st.lists(st.tuples(st.sampled_from(["flip", "delete", "insert"]),
                                                st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4))
def test_mutated_frames_never_raise_and_never_yield_a_different_message(msg, edits):
    data = bytearray(sp.encode(msg))
    for op, pos, byte in edits:
        i = pos % len(data) if data else 0
        if op == "flip" and data:
            data[i] ^= 1 << (byte % 8)
        elif op == "delete" and data:
            del data[i]
        else:
            data.insert(i, byte)
    dec = sp.StreamDecoder()
    got = dec.feed(bytes(data)) + dec.feed(b"\0")
    assert all(same(m, msg) for m in got)   # the original, or nothing: corruption never becomes numbers
    assert len(got) <= 1


@settings(max_examples=100, deadline=None)
@given(frame=st.binary(max_size=200))
def test_decode_frame_raises_only_frame_error_with_a_known_reason(frame):
    try:
        sp.decode_frame(frame)
    except sp.FrameError as exc:
        assert exc.reason in sp.DROP_REASONS


@pytest.mark.parametrize("n", [1, 6, 13])
def test_state_frame_on_the_wire_is_25_plus_17_bytes_per_joint_as_documented(n):
    z = np.zeros(n, int)
    msg = sp.State(timestamp_us=1, cycle=1, statusword=z, mode_display=z, error_code=z, position=z, velocity=z,
                   current=z)
    assert len(sp.encode(msg)) == 25 + 17 * n
    assert "127 bytes on the wire (25 + 17 per joint" in sv.DOC_PATH.read_text()


def test_a_frame_of_another_version_is_dropped_and_its_version_kept_for_the_message():
    dec = sp.StreamDecoder()
    assert dec.other_version is None
    assert dec.feed(wire(raw_frame(7, 2, 0, bytes(9)))) == []
    assert dec.counters.version == 1 and dec.other_version == 7


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=300))
def test_decode_of_one_wire_frame_raises_only_frame_error(data):
    try:
        sp.decode(data)
    except sp.FrameError as exc:
        assert exc.reason in sp.DROP_REASONS


def test_encoding_something_that_is_not_a_message_is_a_wire_value_error():
    with pytest.raises(WireValueError, match="not a serial message"):
        sp.encode(object())
