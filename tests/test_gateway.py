"""The gateway's register layout (firmware_bridge.gateway): sizes against the Modbus limits, word order against
pymodbus's own register conversion, golden vectors, refusals with clear errors, hypothesis properties of the
decoders, the C constants and the generated tables in docs/reference/wire-gateway.md."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pymodbus.client import ModbusTcpClient

from firmware_bridge import gateway as gw

ROOT = Path(__file__).resolve().parents[1]
VECTORS = json.loads((ROOT / "firmware_bridge" / "vectors" / "gateway.json").read_text())
INT32 = ModbusTcpClient.DATATYPE.INT32
IN_ARRAYS = ("statusword", "mode_display", "error_code", "position", "velocity", "current", "torque")
OUT_ARRAYS = ("controlword", "mode", "target_position", "target_torque")


_CODECS = {"input": (gw.InputImage, gw.encode_inputs, gw.decode_inputs),
           "holding": (gw.OutputImage, gw.encode_outputs, gw.decode_outputs),
           "scaling": (gw.ScalingImage, gw.encode_scaling, gw.decode_scaling)}


def _image(kind: str, values: dict):
    return _CODECS[kind][0](**{k: (np.asarray(v) if isinstance(v, list) else v) for k, v in values.items()})


def _encode(kind: str, image):
    return _CODECS[kind][1](image)


def _decode(kind: str, words, n=None):
    return _CODECS[kind][2](words, n)


def _same(a, b) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)


# -- layout ----------------------------------------------------------------------------------------------
def test_six_drives_fit_one_read_and_one_write_and_the_documented_maxima_are_tight():
    assert gw.input_count(6) <= gw.MAX_READ_REGISTERS and gw.holding_count(6) <= gw.MAX_WRITE_REGISTERS
    assert gw.input_count(gw.DRIVES_PER_READ) <= 125 < gw.input_count(gw.DRIVES_PER_READ + 1)
    assert gw.holding_count(gw.DRIVES_PER_WRITE) <= 123 < gw.holding_count(gw.DRIVES_PER_WRITE + 1)
    assert (gw.DRIVES_PER_READ, gw.DRIVES_PER_WRITE) == (9, 15)


@pytest.mark.parametrize("group,size", [(gw.INPUT_HEADER, gw.INPUT_HEADER_SIZE), (gw.INPUT_DRIVE, gw.INPUT_DRIVE_STRIDE),
                                        (gw.HOLDING_HEADER, gw.HOLDING_HEADER_SIZE),
                                        (gw.HOLDING_DRIVE, gw.HOLDING_DRIVE_STRIDE),
                                        (gw.SCALING_DRIVE, gw.SCALING_DRIVE_STRIDE)])
def test_fields_do_not_overlap_fit_their_block_and_32_bit_values_start_on_even_offsets(group, size):
    taken = [o for f in group for o in range(f.offset, f.offset + f.size)]
    assert len(taken) == len(set(taken)) and max(taken) < size
    assert all(f.offset % 2 == 0 for f in group if f.size == 2)
    assert len({f.name for f in group}) == len(group)


def test_the_scaling_registers_lie_beyond_the_largest_input_image_and_fit_the_input_table():
    assert gw.INPUT_BASE + gw.input_count(gw.MAX_DRIVES) <= gw.SCALING_BASE
    assert gw.SCALING_BASE + gw.scaling_count(gw.MAX_DRIVES) <= 0x10000
    assert gw.scaling_count(gw.DRIVES_PER_READ) <= gw.MAX_READ_REGISTERS     # a 6-drive arm's scaling: one read


def test_scaling_counts_per_rad_is_what_joint_scaling_makes_of_the_gear_ratio():
    from firmware_bridge.units import JointScaling, wire_gear_ratio
    gears = [100.0, -50.0, 1.0 / 3.0, 121.5]
    fractions = [wire_gear_ratio(g) for g in gears]
    image = gw.ScalingImage(np.full(4, 2 ** 17), np.array([f.numerator for f in fractions]),
                            np.array([f.denominator for f in fractions]), np.full(4, 120000))
    want = JointScaling.from_gear(gears, 2 ** 17).counts_per_rad
    np.testing.assert_allclose(gw.decode_scaling(gw.encode_scaling(image), 4).counts_per_rad(), want, rtol=1e-15)


def test_input_and_holding_tables_do_not_share_addresses():
    inputs = range(gw.INPUT_BASE, gw.INPUT_BASE + gw.input_count(gw.MAX_DRIVES))
    assert gw.HOLDING_BASE not in inputs and gw.HOLDING_BASE > inputs[-1]


@given(st.integers(-2 ** 31, 2 ** 31 - 1), st.integers(1, 6), st.data())
@settings(max_examples=60, deadline=None)
def test_int32_words_are_what_pymodbus_makes_with_big_word_order(value, n, data):
    k = data.draw(st.integers(0, n - 1))
    values = {f: np.zeros(n, np.int64) for f in OUT_ARRAYS}
    values["target_position"][k] = value
    values["target_torque"][k] = -value - 1 if value > -2 ** 31 else 0
    words = gw.encode_outputs(gw.OutputImage(0, 0, **values))
    at = gw.holding_address("target_position", k) - gw.HOLDING_BASE
    assert words[at:at + 2].tolist() == ModbusTcpClient.convert_to_registers(value, INT32, word_order="big")
    at = gw.holding_address("target_torque", k) - gw.HOLDING_BASE
    assert ModbusTcpClient.convert_from_registers(words[at:at + 2].tolist(), INT32) == values["target_torque"][k]


# -- golden vectors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["name"])
def test_golden_vectors_encode_to_their_words_and_decode_back(vector):
    kind, image = vector["image"], _image(vector["image"], vector["values"])
    assert _encode(kind, image).tolist() == vector["words"]
    assert _same(_decode(kind, vector["words"], vector["drives"]), image)


@pytest.mark.parametrize("vector", VECTORS["invalid"], ids=lambda v: v["name"])
def test_golden_invalid_vectors_are_refused_naming_the_field(vector):
    with pytest.raises(gw.GatewayError, match=vector["error"]):
        _decode(vector["image"], vector["words"])


def test_golden_vectors_cover_both_images_and_the_current_layout_version():
    assert VECTORS["layout_version"] == gw.LAYOUT_VERSION
    assert {v["image"] for v in VECTORS["vectors"]} == {"input", "holding", "scaling"}


# -- refusals ----------------------------------------------------------------------------------------------
def _outputs(n=6, **changes):
    values = dict(watchdog=1, watchdog_timeout_ms=100, controlword=np.full(n, 0x0F), mode=np.full(n, 8),
                  target_position=np.arange(n) * 1000, target_torque=np.zeros(n, np.int64))
    values.update(changes)
    return gw.OutputImage(**values)


def _inputs(n=6, **changes):
    values = dict(gateway_status=1, refused_writes=0, cycle_counter=5, timestamp_us=5000,
                  **{f: np.zeros(n, np.int64) for f in IN_ARRAYS})
    values.update(changes)
    return gw.InputImage(**values)


@pytest.mark.parametrize("image,message", [
    (_outputs(mode=np.array([8, 8, 7, 8, 8, 8])), r"drive 3 mode \(register 0x0413\) = 7: expected 0, 1, 8, 9, 10"),
    (_outputs(torque_offset=np.array([0, 0, 0, 2 ** 31, 0, 0])), r"drive 4 torque_offset \(register 0x0420\)"),
    (_outputs(target_position=np.array([0, 0, 0, 0, 2 ** 31, 0])), r"drive 5 target_position .*-2147483648\.\.2147483647"),
    (_outputs(controlword=np.array([0, -1, 0, 0, 0, 0])), r"drive 2 controlword .* = -1"),
    (_outputs(target_torque=np.array([0, 0, np.nan, 0, 0, 0])), r"target_torque: expected integers"),
    (_outputs(target_torque=np.array([0, 0, 1.5, 0, 0, 0])), r"target_torque: expected integers"),
    (_outputs(watchdog=70000), r"watchdog \(register 0x0400\) = 70000"),
    (_outputs(mode=np.full(5, 8)), r"mode: expected shape \(6,\)"),
    (_outputs(n=0), r"0 drives"),
    (_inputs(mode_display=np.array([0, 0, 0, 0, 0, 128])), r"drive 6 mode_display .* = 128: expected -128\.\.127"),
    (_inputs(statusword=np.array([0, 0, 0, 0, 0, 0x10000])), r"drive 6 statusword"),
    (_inputs(cycle_counter=2 ** 32), r"cycle_counter"),
    (_inputs(position="far"), r"position: expected integers"),
])
def test_impossible_values_are_refused_naming_field_drive_and_register(image, message):
    encode = gw.encode_inputs if isinstance(image, gw.InputImage) else gw.encode_outputs
    with pytest.raises(gw.GatewayError, match=message):
        encode(image)


def test_a_host_refuses_another_layout_version_before_reading_anything_else():
    words = gw.encode_inputs(_inputs()).tolist()
    words[0] = gw.LAYOUT_VERSION + 1
    with pytest.raises(gw.GatewayError, match=r"layout_version .* = 3, this host speaks version 2"):
        gw.decode_inputs(words)
    words[0] = 1                      # a gateway of the layout before the torque offset (holding blocks of 6)
    with pytest.raises(gw.GatewayError, match=r"layout_version .* = 1, this host speaks version 2"):
        gw.decode_inputs(words)


def test_decoding_checks_the_drive_count_against_the_words_and_the_caller():
    words = gw.encode_inputs(_inputs()).tolist()
    assert gw.decode_inputs(words).n == 6
    with pytest.raises(gw.GatewayError, match="hold 6 drives, expected 5"):
        gw.decode_inputs(words, 5)
    with pytest.raises(gw.GatewayError, match="not a header of 8 plus whole drive blocks of 12"):
        gw.decode_inputs(words[:-3])
    with pytest.raises(gw.GatewayError, match="not a 16-bit word"):
        gw.decode_inputs(words[:-1] + [65536])


# -- properties of the decoders ------------------------------------------------------------------------------
@st.composite
def _input_images(draw):
    n = draw(st.integers(1, 9))
    i32 = st.integers(-2 ** 31, 2 ** 31 - 1)
    col = lambda s: np.array(draw(st.lists(s, min_size=n, max_size=n)), dtype=np.int64)  # noqa: E731
    return gw.InputImage(draw(st.integers(0, 0xFFFF)), draw(st.integers(0, 0xFFFF)), draw(st.integers(0, 2 ** 32 - 1)),
                         draw(st.integers(0, 2 ** 32 - 1)), col(st.integers(0, 0xFFFF)), col(st.integers(-128, 127)),
                         col(st.integers(0, 0xFFFF)), col(i32), col(i32), col(i32), col(i32))


@st.composite
def _output_images(draw):
    n = draw(st.integers(1, 20))
    i32 = st.integers(-2 ** 31, 2 ** 31 - 1)
    col = lambda s: np.array(draw(st.lists(s, min_size=n, max_size=n)), dtype=np.int64)  # noqa: E731
    return gw.OutputImage(draw(st.integers(0, 0xFFFF)), draw(st.integers(0, 0xFFFF)), col(st.integers(0, 0xFFFF)),
                          col(st.sampled_from([0, 1, 8, 9, 10])), col(i32), col(i32))


@given(_input_images())
@settings(max_examples=60, deadline=None)
def test_input_images_round_trip_through_words(image):
    words = gw.encode_inputs(image)
    assert words.dtype == np.uint16 and words.shape == (gw.input_count(image.n),)
    assert _same(gw.decode_inputs(words.tolist(), image.n), image)


@given(_output_images())
@settings(max_examples=60, deadline=None)
def test_output_images_round_trip_through_words(image):
    words = gw.encode_outputs(image)
    assert words.shape == (gw.holding_count(image.n),)
    assert _same(gw.decode_outputs(words, image.n), image)


def _check_decoded(image) -> None:
    for name in image.__dataclass_fields__:
        value = np.asarray(getattr(image, name))
        assert value.dtype.kind in "iu" and np.all(np.isfinite(value.astype(float)))


@given(st.lists(st.integers(-2 ** 40, 2 ** 40), max_size=140), st.booleans())
@settings(max_examples=200, deadline=None)
def test_random_words_decode_or_raise_only_gateway_error(words, valid_header):
    if valid_header and len(words) >= 2:
        words[0], words[1] = gw.LAYOUT_VERSION, max(1, (len(words) - gw.INPUT_HEADER_SIZE) // gw.INPUT_DRIVE_STRIDE)
    for kind in ("input", "holding"):
        try:
            image = _decode(kind, words)
        except gw.GatewayError:
            continue
        _check_decoded(image)
        assert _encode(kind, image).tolist() == words  # what decodes is exactly what encodes back


@given(st.integers(1, 9), st.data())
@settings(max_examples=60, deadline=None)
def test_random_16_bit_words_behind_a_valid_header_decode_unless_a_mode_is_impossible(n, data):
    words = data.draw(st.lists(st.integers(0, 0xFFFF), min_size=gw.input_count(n), max_size=gw.input_count(n)))
    words[0], words[1] = gw.LAYOUT_VERSION, n
    modes = [words[gw.input_address("mode_display", k)] for k in range(n)]
    legal = all(m <= 127 or m >= 0xFF80 for m in modes)
    try:
        image = gw.decode_inputs(words, n)
    except gw.GatewayError as exc:
        assert not legal and "mode_display" in str(exc)
        return
    assert legal
    _check_decoded(image)
    assert image.position.min() >= -2 ** 31 and image.position.max() < 2 ** 31


@pytest.mark.parametrize("junk", [None, "words", [1.5, 2.0], [[1, 2]], [object()], 12])
def test_junk_that_is_not_a_word_sequence_is_refused_with_gateway_error(junk):
    for kind in ("input", "holding"):
        with pytest.raises(gw.GatewayError):
            _decode(kind, junk)


# -- generated artefacts --------------------------------------------------------------------------------------
def test_c_constants_are_unique_c_identifiers_with_integer_values_that_match_the_layout():
    consts = gw.c_constants()
    names = [name for name, _, _ in consts]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"ARMID_GW_[A-Z0-9_]+", name) for name in names)
    assert all(isinstance(value, int) and isinstance(comment, str) and "*/" not in comment for _, value, comment in consts)
    c = {name: value for name, value, _ in consts}
    assert c["ARMID_GW_LAYOUT_VERSION"] == gw.LAYOUT_VERSION
    for k in (0, 5):
        assert (c["ARMID_GW_INPUT_BASE"] + c["ARMID_GW_INPUT_HEADER_SIZE"] + k * c["ARMID_GW_INPUT_DRIVE_STRIDE"]
                + c["ARMID_GW_IN_DRV_POSITION"]) == gw.input_address("position", k)
        assert (c["ARMID_GW_HOLDING_BASE"] + c["ARMID_GW_HOLDING_HEADER_SIZE"] + k * c["ARMID_GW_HOLDING_DRIVE_STRIDE"]
                + c["ARMID_GW_HOLD_DRV_TARGET_TORQUE"]) == gw.holding_address("target_torque", k)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_c_constants_compile_and_place_the_golden_vector_words(tmp_path):
    """A C program built from c_constants() alone finds the golden vector's position words where the
    firmware would put them (static asserts: 6 drives fit one read)."""
    vector = next(v for v in VECTORS["vectors"] if v["name"] == "input_two_drives_fault_and_extremes")
    defs = "\n".join(f"#define {name} {value} /* {comment} */" for name, value, comment in gw.c_constants())
    words = ", ".join(map(str, vector["words"]))
    src = tmp_path / "gw.c"
    src.write_text(f"""#include <stdint.h>
#include <stdio.h>
{defs}
_Static_assert(ARMID_GW_INPUT_HEADER_SIZE + 6 * ARMID_GW_INPUT_DRIVE_STRIDE <= 125, "6 drives in one read");
static const uint16_t w[] = {{{words}}};
int main(void) {{
    for (int k = 0; k < w[1]; k++) {{
        int at = ARMID_GW_INPUT_HEADER_SIZE + k * ARMID_GW_INPUT_DRIVE_STRIDE + ARMID_GW_IN_DRV_POSITION;
        printf("%ld\\n", (long)(int32_t)(((uint32_t)w[at] << 16) | w[at + 1]));
    }}
    return w[0] != ARMID_GW_LAYOUT_VERSION;
}}
""")
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-o", str(tmp_path / "gw"), str(src)], check=True, timeout=60)
    out = subprocess.run([str(tmp_path / "gw")], capture_output=True, text=True, timeout=10, check=True).stdout
    assert [int(x) for x in out.split()] == vector["values"]["position"]


def test_the_committed_doc_contains_the_generated_register_tables():
    doc = (ROOT / "docs" / "reference" / "wire-gateway.md").read_text()
    assert gw.register_tables_markdown() in doc
    # the hand-written address map agrees with the definitions
    for text in (f"| {gw.INPUT_HEADER_SIZE} + {gw.INPUT_DRIVE_STRIDE} n | {gw.input_count(6)} |",
                 f"| {gw.HOLDING_HEADER_SIZE} + {gw.HOLDING_DRIVE_STRIDE} n | {gw.holding_count(6)} |",
                 f"{gw.HOLDING_BASE} (0x{gw.HOLDING_BASE:04X})", f"up to **{gw.DRIVES_PER_READ} drives**",
                 f"up to **{gw.DRIVES_PER_WRITE} drives**", f"up to {gw.MAX_DRIVES} drives",
                 f"layout version ({gw.LAYOUT_VERSION})"):
        assert text in doc, text
