"""The gateway codec's numba kernels (firmware_bridge.gateway): the words of random images of 1..64 drives over
every field's whole range against an independent encoding with struct (">H", ">h", ">i", ">I", laid out from
the register tables of docs/reference/wire-gateway.md, not from the Field tables), words computed by hand for one image
of each block, and every kind of bad value refused with the same full GatewayError text through the public
functions and the preallocated *_into path."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firmware_bridge import gateway as gw

# the layout as docs/reference/wire-gateway.md writes it: (name, register offset in the block, struct code)
IN_HEADER = (("gateway_status", 2, "H"), ("refused_writes", 3, "H"), ("cycle_counter", 4, "I"),
             ("timestamp_us", 6, "I"))
IN_DRIVE = (("statusword", 0, "H"), ("mode_display", 1, "h"), ("error_code", 2, "H"), ("position", 4, "i"),
            ("velocity", 6, "i"), ("current", 8, "i"), ("torque", 10, "i"))
OUT_HEADER = (("watchdog", 0, "H"), ("watchdog_timeout_ms", 1, "H"))
OUT_DRIVE = (("controlword", 0, "H"), ("mode", 1, "h"), ("target_position", 2, "i"), ("target_torque", 4, "i"),
             ("torque_offset", 6, "i"))
LAYOUT, OUT_STRIDE = 2, 8      # layout version 2: each holding block ends with the torque offset
MODES = (0, 1, 8, 9, 10)          # CiA 402 modes of operation the layout allows


def struct_words(header_size: int, stride: int, header: dict, drive_fields, drives: dict, n: int,
                 header_fields) -> list[int]:
    """The image's register words made with struct, big-endian, from the documented offsets."""
    raw = bytearray(2 * (header_size + stride * n))
    for name, off, code in header_fields:
        struct.pack_into(">" + code, raw, 2 * off, header[name])
    for k in range(n):
        for name, off, code in drive_fields:
            struct.pack_into(">" + code, raw, 2 * (header_size + stride * k + off), int(drives[name][k]))
    return list(struct.unpack(f">{len(raw) // 2}H", raw))


def input_words(img: gw.InputImage) -> list[int]:
    header = {"gateway_status": img.gateway_status, "refused_writes": img.refused_writes,
              "cycle_counter": img.cycle_counter, "timestamp_us": img.timestamp_us}
    words = struct_words(8, 12, header, IN_DRIVE, vars(img), img.n, IN_HEADER)
    words[0], words[1] = LAYOUT, img.n                  # layout version, drive count
    return words


def output_words(img: gw.OutputImage) -> list[int]:
    return struct_words(2, OUT_STRIDE, vars(img), OUT_DRIVE, vars(img), img.n, OUT_HEADER)


u16, i16, i8 = st.integers(0, 0xFFFF), st.integers(-0x8000, 0x7FFF), st.integers(-128, 127)
u32, i32 = st.integers(0, 0xFFFFFFFF), st.integers(-2 ** 31, 2 ** 31 - 1)


@st.composite
def input_images(draw):
    n = draw(st.integers(1, gw.MAX_DRIVES))
    col = lambda s: np.array(draw(st.lists(s, min_size=n, max_size=n)), dtype=np.int64)  # noqa: E731
    return gw.InputImage(draw(u16), draw(u16), draw(u32), draw(u32), col(u16), col(i8), col(u16), col(i32), col(i32),
                         col(i32), col(i32))


@st.composite
def output_images(draw):
    n = draw(st.integers(1, gw.MAX_DRIVES))
    col = lambda s: np.array(draw(st.lists(s, min_size=n, max_size=n)), dtype=np.int64)  # noqa: E731
    return gw.OutputImage(draw(u16), draw(u16), col(u16), col(st.sampled_from(MODES)), col(i32), col(i32), col(i32))


def in_arrays(img: gw.InputImage) -> tuple[np.ndarray, np.ndarray]:
    header = np.array([0, 0, img.gateway_status, img.refused_writes, img.cycle_counter, img.timestamp_us], np.int64)
    return header, np.array([getattr(img, name) for name, _, _ in IN_DRIVE], np.int64)


def out_arrays(img: gw.OutputImage) -> tuple[np.ndarray, np.ndarray]:
    header = np.array([img.watchdog, img.watchdog_timeout_ms], np.int64)
    return header, np.array([getattr(img, name) for name, _, _ in OUT_DRIVE], np.int64)


@given(input_images())
@settings(max_examples=40, deadline=None)
def test_input_images_of_1_to_64_drives_encode_to_the_struct_words_and_decode_back(img):
    expected = input_words(img)
    assert gw.encode_inputs(img).tolist() == expected
    header, drives = in_arrays(img)
    out = np.zeros(gw.input_count(img.n), np.uint16)
    assert gw.encode_inputs_into(header, drives, out).tolist() == expected
    assert header[:2].tolist() == [LAYOUT, img.n]
    back_h, back_d = np.zeros(6, np.int64), np.zeros((7, img.n), np.int64)
    gw.decode_inputs_into(expected, back_h, back_d)
    assert np.array_equal(back_h, header) and np.array_equal(back_d, drives)
    decoded = gw.decode_inputs(np.array(expected, np.uint16), img.n)
    assert all(np.array_equal(getattr(decoded, f), getattr(img, f)) for f in img.__dataclass_fields__)


@given(output_images())
@settings(max_examples=40, deadline=None)
def test_output_images_of_1_to_64_drives_encode_to_the_struct_words_and_decode_back(img):
    expected = output_words(img)
    assert gw.encode_outputs(img).tolist() == expected
    header, drives = out_arrays(img)
    out = np.full(gw.holding_count(img.n), 0xABCD, np.uint16)       # garbage from before: all overwritten
    assert gw.encode_outputs_into(header, drives, out).tolist() == expected
    back_h, back_d = np.zeros(2, np.int64), np.zeros((5, img.n), np.int64)
    gw.decode_outputs_into(expected, back_h, back_d)
    assert np.array_equal(back_h, header) and np.array_equal(back_d, drives)
    decoded = gw.decode_outputs(expected, img.n)
    assert all(np.array_equal(getattr(decoded, f), getattr(img, f)) for f in img.__dataclass_fields__)


def test_one_input_image_gives_the_words_computed_by_hand_from_the_register_table():
    img = gw.InputImage(gateway_status=5, refused_writes=2, cycle_counter=0x00010002, timestamp_us=70000,
                        statusword=np.array([0x0237]), mode_display=np.array([-1]), error_code=np.array([0x1000]),
                        position=np.array([65536]), velocity=np.array([-1]), current=np.array([-65536]),
                        torque=np.array([0x7FFFFFFF]))
    by_hand = [2, 1, 5, 2, 0x0001, 0x0002, 0x0001, 0x1170,      # 70000 us = 0x00011170
               0x0237, 0xFFFF, 0x1000, 0, 0x0001, 0x0000, 0xFFFF, 0xFFFF, 0xFFFF, 0x0000, 0x7FFF, 0xFFFF]
    assert gw.encode_inputs(img).tolist() == by_hand
    header, drives = np.zeros(6, np.int64), np.zeros((7, 1), np.int64)
    gw.decode_inputs_into(by_hand, header, drives)
    assert header.tolist() == [2, 1, 5, 2, 65538, 70000]
    assert drives[:, 0].tolist() == [0x0237, -1, 0x1000, 65536, -1, -65536, 2 ** 31 - 1]


def test_one_output_image_gives_the_words_computed_by_hand_from_the_register_table():
    img = gw.OutputImage(watchdog=0x1234, watchdog_timeout_ms=100, controlword=np.array([0x000F, 0x0080]),
                         mode=np.array([8, 10]), target_position=np.array([-2, -2 ** 31]),
                         target_torque=np.array([0x12345678, 1000]), torque_offset=np.array([-48000, 0x01020304]))
    by_hand = [0x1234, 100, 0x000F, 8, 0xFFFF, 0xFFFE, 0x1234, 0x5678, 0xFFFF, 0x4480,     # -48000 = 0xFFFF4480
               0x0080, 10, 0x8000, 0x0000, 0x0000, 0x03E8, 0x0102, 0x0304]
    assert gw.encode_outputs(img).tolist() == by_hand
    back = gw.decode_outputs(by_hand)
    assert back.target_position.tolist() == [-2, -2 ** 31] and back.torque_offset.tolist() == [-48000, 0x01020304]


# -- refusals: the full text, the same through the public functions and the *_into path -------------------------
# (field, register offset in its block, lo, hi) as the docs' tables give them
IN_RANGES = {"statusword": (0, 0, 0xFFFF), "mode_display": (1, -128, 127), "error_code": (2, 0, 0xFFFF),
             "position": (4, -2 ** 31, 2 ** 31 - 1), "velocity": (6, -2 ** 31, 2 ** 31 - 1),
             "current": (8, -2 ** 31, 2 ** 31 - 1), "torque": (10, -2 ** 31, 2 ** 31 - 1)}
OUT_RANGES = {"controlword": (0, 0, 0xFFFF), "target_position": (2, -2 ** 31, 2 ** 31 - 1),
              "target_torque": (4, -2 ** 31, 2 ** 31 - 1), "torque_offset": (6, -2 ** 31, 2 ** 31 - 1)}
N = 3


def good_inputs() -> gw.InputImage:
    return gw.InputImage(1, 0, 7, 7000, *(np.zeros(N, np.int64) for _ in range(7)))


def good_outputs() -> gw.OutputImage:
    return gw.OutputImage(1, 100, np.zeros(N, np.int64), np.full(N, 8), np.zeros(N, np.int64), np.zeros(N, np.int64))


def refusal(encode, *args) -> str:
    with pytest.raises(gw.GatewayError) as info:
        encode(*args)
    return str(info.value)


def both_encodings(img) -> tuple[str, str]:
    """The error text of encode_* and of encode_*_into for the same image."""
    if isinstance(img, gw.InputImage):
        header, drives = in_arrays(img)
        return (refusal(gw.encode_inputs, img),
                refusal(gw.encode_inputs_into, header, drives, np.zeros(gw.input_count(N), np.uint16)))
    header, drives = out_arrays(img)
    return (refusal(gw.encode_outputs, img),
            refusal(gw.encode_outputs_into, header, drives, np.zeros(gw.holding_count(N), np.uint16)))


@pytest.mark.parametrize("block, name, beyond", [(b, name, side) for b, ranges in (("input", IN_RANGES),
                                                                                   ("holding", OUT_RANGES))
                                                 for name in ranges for side in ("below", "above")])
def test_a_value_outside_its_fields_range_is_refused_naming_field_drive_and_register(block, name, beyond):
    off, lo, hi = (IN_RANGES if block == "input" else OUT_RANGES)[name]
    value = lo - 1 if beyond == "below" else hi + 1
    img = good_inputs() if block == "input" else good_outputs()
    getattr(img, name)[1] = value                     # drive 2
    base, header, stride = (0, 8, 12) if block == "input" else (1024, 2, OUT_STRIDE)
    expected = (f"gateway {block} image: drive 2 {name} (register {base + header + stride + off:#06x}) = {value}: "
                f"expected {lo}..{hi}")
    assert both_encodings(img) == (expected, expected)


def test_an_unknown_mode_is_refused_listing_the_modes_of_the_layout():
    img = good_outputs()
    img.mode[2] = 7
    expected = "gateway holding image: drive 3 mode (register 0x0413) = 7: expected 0, 1, 8, 9, 10"
    assert both_encodings(img) == (expected, expected)


def test_the_first_bad_value_is_named_header_first_then_field_by_field():
    img = good_outputs()
    img.mode[0] = 7                                   # field 2, drive 1
    img.controlword[2] = -1                           # field 1, drive 3: comes first
    expected = "gateway holding image: drive 3 controlword (register 0x0412) = -1: expected 0..65535"
    assert both_encodings(img) == (expected, expected)
    img.watchdog = 70000                              # a header field before any drive field
    assert both_encodings(img)[0] == "gateway holding image: watchdog (register 0x0400) = 70000: expected 0..65535"


@pytest.mark.parametrize("value, shown", [(np.nan, "nan"), (1.5, "1.5"), (np.inf, "inf")])
def test_nan_or_a_fraction_where_an_integer_is_needed_is_refused(value, shown):
    img = good_outputs()
    img.target_torque = np.array([0.0, value, 0.0])
    assert refusal(gw.encode_outputs, img) == f"gateway holding image: target_torque: expected integers, got [0.0, {shown}, 0.0]"
    header, drives = out_arrays(good_outputs())
    out = np.zeros(gw.holding_count(N), np.uint16)
    assert "expected int64 values and a uint16 buffer" in refusal(gw.encode_outputs_into, header,
                                                                  drives.astype(float), out)


def encoded_inputs() -> list[int]:
    return gw.encode_inputs(good_inputs()).tolist()


def both_decodings(words, n=N) -> tuple[str, str]:
    """The error text of decode_inputs(words, n) and of decode_inputs_into."""
    return (refusal(gw.decode_inputs, words, n),
            refusal(gw.decode_inputs_into, words, np.zeros(6, np.int64), np.zeros((7, n), np.int64)))


@pytest.mark.parametrize("change, expected", [
    (lambda w: w.__setitem__(0, 1), "gateway input image: layout_version (register 0x0000) = 1, this host speaks "
                                    "version 2"),             # a gateway of the layout before the torque offset
    (lambda w: w.__setitem__(1, 2), "gateway input image: drive_count (register 0x0001) = 2, but 44 registers were "
                                    "read"),
    (lambda w: w.__setitem__(1, 0), "gateway input image: drive_count (register 0x0001) = 0: expected 1..64"),
    (lambda w: w.__setitem__(8 + 12 + 1, 0x0080), "gateway input image: drive 2 mode_display (register 0x0015) = 128: "
                                                  "expected -128..127"),
    (lambda w: w.__setitem__(30, 65536), "gateway input image: register 0x001e = 65536: not a 16-bit word"),
    (lambda w: w.__setitem__(30, -1), "gateway input image: register 0x001e = -1: not a 16-bit word"),
    (lambda w: w.pop(), "gateway input image: 43 registers is not a header of 8 plus whole drive blocks of 12"),
    (lambda w: w.extend([0] * 12), "gateway input image: 56 registers hold 4 drives, expected 3"),
    (lambda w: w.__delitem__(slice(5, None)), "gateway input image: 5 registers, the header alone is 8"),
])
def test_bad_input_words_are_refused_with_the_same_text_on_both_paths(change, expected):
    words = encoded_inputs()
    change(words)
    assert both_decodings(words) == (expected, expected)


def test_bad_holding_words_are_refused_with_the_same_text_on_both_paths():
    words = gw.encode_outputs(good_outputs()).tolist()
    words[2 + OUT_STRIDE * 2 + 1] = 0xFFF9            # drive 3's mode: -7
    expected = "gateway holding image: drive 3 mode (register 0x0413) = -7: expected 0, 1, 8, 9, 10"
    assert refusal(gw.decode_outputs, words, N) == expected
    assert refusal(gw.decode_outputs_into, words, np.zeros(2, np.int64), np.zeros((5, N), np.int64)) == expected
    assert refusal(gw.decode_outputs, words[:-8], N) == "gateway holding image: 18 registers hold 2 drives, expected 3"
    # a host of layout 1 wrote blocks of 6 registers: 3 of them are no whole number of blocks of 8
    assert refusal(gw.decode_outputs, words[:2 + 6 * 3], N) == ("gateway holding image: 20 registers is not a header "
                                                                "of 2 plus whole drive blocks of 8")


def test_buffers_of_the_wrong_shape_or_type_are_refused_not_written_past():
    header, drives = in_arrays(good_inputs())
    assert "buffers of the wrong shape" in refusal(gw.encode_inputs_into, header, drives,
                                                   np.zeros(gw.input_count(N) - 1, np.uint16))
    assert "buffers of the wrong shape" in refusal(gw.encode_inputs_into, header[:4], drives,
                                                   np.zeros(gw.input_count(N), np.uint16))
    assert "0 drives, expected 1..64" in refusal(gw.encode_inputs_into, header, drives[:, :0], np.zeros(8, np.uint16))
    words = encoded_inputs()
    assert "expected int64 arrays" in refusal(gw.decode_inputs_into, words, np.zeros(6), np.zeros((7, N)))
    assert "buffers of the wrong shape" in refusal(gw.decode_inputs_into, words, np.zeros(6, np.int64),
                                                   np.zeros((6, N), np.int64))
    assert "expected a sequence of register words" in refusal(gw.decode_inputs_into, [1.5] * 44, np.zeros(6, np.int64),
                                                              np.zeros((7, N), np.int64))


def test_field_rows_follow_the_tables():
    assert [gw.field_row(gw.INPUT_DRIVE, name) for name, _, _ in IN_DRIVE] == list(range(7))
    assert [gw.field_row(gw.HOLDING_DRIVE, name) for name, _, _ in OUT_DRIVE] == list(range(5))
