"""The generated C header: the committed file is the generator's output, every contributing module's constants
are in it, and a C program compiled with the system compiler packs the golden-vector values into the header's
structs, computes the CRC with the header's function and gets the golden bytes (and reads them back); another
decodes state-stream messages made by firmware_bridge.stream with the header's struct and macros."""
from __future__ import annotations

import json
import shutil
import subprocess
import types

import numpy as np
import pytest

from firmware_bridge import c_header
from firmware_bridge import serial_protocol as sp
from firmware_bridge import serial_vectors as sv
from firmware_bridge import stream

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def test_committed_header_is_the_generators_output():
    assert c_header.HEADER_PATH.read_text() == c_header.generate()


def test_header_holds_the_constants_of_every_module_that_defines_c_constants():
    names = [m.__name__ for m in c_header.contributing_modules()]
    assert {"firmware_bridge.cia402", "firmware_bridge.units", "firmware_bridge.serial_protocol",
            "firmware_bridge.stream"} <= set(names)
    text = c_header.generate()
    for module in c_header.contributing_modules():
        for name, value, _ in module.c_constants():
            full = name if name.startswith("ARMID_") else "ARMID_" + name
            assert f"#define {full} " in text
    assert "ARMID_ARMID_" not in text
    assert "#define ARMID_CIA402_CW_ENABLE_OPERATION 15 " in text
    assert "#define ARMID_CIA402_CONTROLWORD 0x6040 " in text
    assert "#define ARMID_SERIAL_CRC32_POLY 0xEDB88320u " in text
    assert '#define ARMID_STREAM_TOPIC_STATE "state" ' in text
    assert "#define ARMID_STREAM_HEADER_SIZE 36 " in text


def test_string_constants_are_c_literals_and_unsafe_ones_are_refused(monkeypatch):
    ok = types.SimpleNamespace(__name__="fb.ok", c_constants=lambda: [("S", b"state", "s")])
    monkeypatch.setattr(c_header, "contributing_modules", lambda: [ok])
    assert '#define ARMID_S "state"  /* s */' in c_header.generate()
    for bad in (b'a"b', b"a\\b", b"a\nb", b"\xe9", b"??="):
        m = types.SimpleNamespace(__name__="fb.bad", c_constants=lambda bad=bad: [("S", bad, "")])
        monkeypatch.setattr(c_header, "contributing_modules", lambda m=m: [m])
        with pytest.raises(ValueError, match="C string constant"):
            c_header.generate()


def test_generator_refuses_two_modules_defining_the_same_constant(monkeypatch):
    a = types.SimpleNamespace(__name__="fb.a", c_constants=lambda: [("X", 1, "")])
    b = types.SimpleNamespace(__name__="fb.b", c_constants=lambda: [("X", 2, "")])
    monkeypatch.setattr(c_header, "contributing_modules", lambda: [a, b])
    with pytest.raises(ValueError, match="ARMID_X defined by fb.a and fb.b"):
        c_header.generate()


def _c_int(v: int) -> str:
    return f"UINT64_C({v})" if v >= 0 else f"(-INT64_C({-v - 1}) - 1)"


def _c_value(field, v) -> str:
    return repr(float(v)) if field.type.is_float else f"({field.type.c_name}){_c_int(int(v))}"


def _c_program(cases: list[dict]) -> str:
    """One check per golden case: pack the values into a buffer through the structs, append armid_crc32,
    compare with the vector's frame; then cast the vector's bytes to the structs and compare the values."""
    body = []
    for case in cases:
        spec = sp.SPECS[sp.MsgType[case["type"]]]
        frame = bytes.fromhex(case["frame_hex"])
        vals = case["values"]
        n = len(vals[spec.joint.fields[0].name]) if spec.joint else 0
        t = f"{spec.c_name}_t"
        lines = [f"{{ /* {case['name']} */",
                 f"  static const uint8_t want[{len(frame)}] = {{{', '.join(str(b) for b in frame)}}};",
                 "  uint8_t buf[ARMID_SERIAL_MAX_FRAME];",
                 "  memset(buf, 0xA5, sizeof buf);",
                 "  armid_serial_header_t *h = (armid_serial_header_t *)buf;",
                 f"  {t} *m = ({t} *)(buf + sizeof(armid_serial_header_t));",
                 f"  size_t payload = armid_serial_payload_size(ARMID_SERIAL_MSG_{case['type']}, {n});",
                 "  h->version = ARMID_SERIAL_VERSION;",
                 f"  h->type = ARMID_SERIAL_MSG_{case['type']};",
                 f"  h->seq = {case['seq']};",
                 "  h->length = (uint16_t)payload;"]
        for f in spec.fixed.fields:
            v = n if f.name == "n_joints" else vals[f.name]
            lines.append(f"  m->{f.name} = {_c_value(f, v)};")
        for k in range(n):
            for f in spec.joint.fields if spec.joint else ():
                lines.append(f"  m->joints[{k}].{f.name} = {_c_value(f, vals[f.name][k])};")
        lines += ["  size_t len = sizeof(armid_serial_header_t) + payload;",
                  "  uint32_t crc = armid_crc32(buf, len);",
                  "  memcpy(buf + len, &crc, sizeof crc);",
                  "  len += ARMID_SERIAL_CRC_SIZE;",
                  f'  if (len != sizeof want || memcmp(buf, want, len) != 0) {{ printf("FAIL pack {case["name"]}\\n"); '
                  "fails++; }",
                  "  uint8_t in[sizeof want];",
                  "  memcpy(in, want, sizeof want);",
                  f"  const {t} *r = (const {t} *)(in + sizeof(armid_serial_header_t));",
                  "  int ok = armid_crc32(in, sizeof want - ARMID_SERIAL_CRC_SIZE) == "
                  "(uint32_t)(in[sizeof want - 4] | in[sizeof want - 3] << 8 | in[sizeof want - 2] << 16 | "
                  "(uint32_t)in[sizeof want - 1] << 24);"]
        for f in spec.fixed.fields:
            v = n if f.name == "n_joints" else vals[f.name]
            lines.append(f"  ok = ok && r->{f.name} == {_c_value(f, v)};")
        for k in range(n):
            for f in spec.joint.fields if spec.joint else ():
                lines.append(f"  ok = ok && r->joints[{k}].{f.name} == {_c_value(f, vals[f.name][k])};")
        lines += [f'  if (!ok) {{ printf("FAIL read {case["name"]}\\n"); fails++; }}', "  checked++;",
                  "}"]
        body.append("\n".join(lines))
    return "\n".join([
        "#include <stdint.h>", "#include <stdio.h>", "#include <string.h>", '#include "armid_wire.h"', "",
        "int main(void)", "{", "  int fails = 0, checked = 0;",
        '  if (armid_crc32((const uint8_t *)"123456789", 9) != 0xCBF43926u) { printf("FAIL crc check value\\n"); fails++; }',
        '  if (armid_crc32_update(armid_crc32((const uint8_t *)"1234", 4), (const uint8_t *)"56789", 5) != 0xCBF43926u)'
        ' { printf("FAIL crc update\\n"); fails++; }',
        *body,
        '  printf("checked %d fails %d\\n", checked, fails);', "  return fails != 0;", "}", ""])


def _build(folder, name: str, program: str, std: str):
    """Compile a C program against the generated header, warnings as errors; the executable's path."""
    src, exe = folder / f"{name}.c", folder / name
    src.write_text(program)
    build = subprocess.run([CC, f"-std={std}", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O1",
                            f"-I{c_header.HEADER_PATH.parent}", str(src), "-o", str(exe)],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    return exe


@pytest.mark.skipif(CC is None, reason="no C compiler (cc, gcc or clang) on this machine")
@pytest.mark.parametrize("std", ["c99", "c11"])
def test_c_program_packs_the_golden_vectors_into_the_header_structs_byte_for_byte(tmp_path, std):
    cases = json.loads(sv.VECTORS_PATH.read_text())["cases"]
    exe = _build(tmp_path, "vectors", _c_program(cases), std)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    assert run.stdout.strip().endswith(f"checked {len(cases)} fails 0"), run.stdout
    assert run.returncode == 0


_COBS_PROGRAM = r"""
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "armid_wire.h"

static uint8_t in[4096], out[8192];

int main(void)
{
    char op, hex[8200];
    while (scanf(" %c %8199s", &op, hex) == 2) {
        size_t len = strlen(hex) / 2, n = 0;
        if (hex[0] == '-') len = 0;
        for (size_t i = 0; i < len; i++) {
            unsigned v;
            sscanf(hex + 2 * i, "%2x", &v);
            in[i] = (uint8_t)v;
        }
        if (op == 'E') {
            n = armid_cobs_encode(in, len, out);
            if (n > ARMID_COBS_MAX_ENCODED(len)) { printf("OVERRUN\n"); continue; }
        } else if (armid_cobs_decode(in, len, out, &n) != 0) {
            printf("ERR\n");
            continue;
        }
        for (size_t i = 0; i < n; i++) printf("%02x", out[i]);
        printf("%s\n", n ? "" : "-");
    }
    return 0;
}
"""


def _cobs_inputs() -> list[bytes]:
    """Edge cases and seeded random strings: zero runs, 253/254/255-byte non-zero runs, up to 600 bytes."""
    rng = np.random.default_rng(4)
    out = [b"", b"\0", b"\0\0", bytes(range(1, 255)), bytes(range(1, 256)), b"\x01" * 253, b"\x01" * 254 + b"\0",
           b"\x07" * 508, b"\x07" * 509]
    for _ in range(150):
        n = int(rng.integers(0, 600))
        zero_p = rng.choice([0.0, 0.01, 0.3])
        data = rng.integers(1, 256, n).astype(np.uint8)
        data[rng.random(n) < zero_p] = 0
        out.append(data.tobytes())
    return out


@pytest.mark.skipif(CC is None, reason="no C compiler (cc, gcc or clang) on this machine")
def test_c_cobs_encodes_and_decodes_as_the_cobs_package_and_refuses_what_it_refuses(tmp_path):
    from cobs import cobs
    exe = _build(tmp_path, "cobs", _COBS_PROGRAM, "c99")
    plain = _cobs_inputs()
    vectors = json.loads(sv.VECTORS_PATH.read_text())["cases"]
    frames = [bytes.fromhex(c["frame_hex"]) for c in vectors]
    wires = [bytes.fromhex(c["wire_hex"])[:-1] for c in vectors]
    rng = np.random.default_rng(5)
    garbage = [rng.integers(0, 256, int(rng.integers(1, 40))).astype(np.uint8).tobytes() for _ in range(100)]
    garbage += [w[:-3] for w in wires]                                   # truncated blocks
    jobs = [("E", b) for b in plain + frames] + [("D", b) for b in [cobs.encode(p) for p in plain] + wires + garbage]
    stdin = "".join(f"{op} {data.hex() or '-'}\n" for op, data in jobs)
    run = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, timeout=60)
    lines = run.stdout.split("\n")[:-1]
    assert len(lines) == len(jobs)
    refused = 0
    for (op, data), line in zip(jobs, lines):
        if op == "E":
            assert line == cobs.encode(data).hex(), data.hex()
            continue
        try:
            want = cobs.decode(data).hex() or "-"
        except cobs.DecodeError:
            want = "ERR"
            refused += 1
        assert line == want, data.hex()
    assert refused > 20                                                   # the refusals were exercised
    for frame, line in zip(frames, lines[len(plain):]):
        assert bytes.fromhex(line) == cobs.encode(frame)                  # the golden wire bytes, in C


_STREAM_PROGRAM = r"""
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include "armid_wire.h"

/* stdin: records of (uint32 length, payload); stdout: one line per record, the decoded values or BAD */
int main(void)
{
    static uint8_t msg[1 << 16];
    uint32_t len;
    while (fread(&len, sizeof len, 1, stdin) == 1 && len <= sizeof msg && fread(msg, 1, len, stdin) == len) {
        armid_stream_header_t h;
        int n = armid_stream_check(msg, len, &h);
        if (n < 0) { printf("BAD\n"); continue; }
        printf("%u %d %" PRIu64 " %" PRIu32 " %" PRIu32 " %" PRId64 " %" PRId64, (unsigned)h.version, n, h.seq,
               h.flags & ARMID_STREAM_DRIVER_FLAGS_MASK, ARMID_STREAM_LOST_SAMPLES(h.flags), h.device_time_ns,
               h.host_time_ns);
        const size_t doubles[5] = {ARMID_STREAM_Q_OFFSET(n), ARMID_STREAM_QD_OFFSET(n), ARMID_STREAM_CURRENT_OFFSET(n),
                                   ARMID_STREAM_TORQUE_OFFSET(n), ARMID_STREAM_TAU_EXT_OFFSET(n)};
        for (int f = 0; f < 5; f++)
            for (int k = 0; k < n; k++) {
                double v;
                memcpy(&v, msg + doubles[f] + (size_t)k * ARMID_STREAM_Q_ELEM_SIZE, sizeof v);
                printf(" %a", v);
            }
        for (int k = 0; k < n; k++) {
            uint16_t sw, ec;
            int8_t mode;
            memcpy(&sw, msg + ARMID_STREAM_STATUSWORD_OFFSET(n) + 2u * (size_t)k, sizeof sw);
            memcpy(&ec, msg + ARMID_STREAM_ERROR_CODE_OFFSET(n) + 2u * (size_t)k, sizeof ec);
            memcpy(&mode, msg + ARMID_STREAM_MODE_OFFSET(n) + (size_t)k, sizeof mode);
            printf(" %u %u %d", (unsigned)sw, (unsigned)ec, (int)mode);
        }
        printf(" %d\n", len == ARMID_STREAM_MESSAGE_SIZE(n));
    }
    return 0;
}
"""


def _random_state(rng, n: int, version: int = stream.STREAM_VERSION) -> bytes:
    m = stream.StateMessage(n)
    m.record["version"] = version
    m.set_header(int(rng.integers(0, 2**63)), int(rng.integers(0, 64)) | stream.lost_flags(int(rng.integers(0, 70000))),
                 int(rng.integers(-2**62, 2**62)), int(rng.integers(0, 2**62)))
    m.floats[:] = rng.normal(0, 10, (4, n)) * 10.0 ** rng.integers(-5, 5, (4, n))
    m.words[:] = rng.integers(0, 2**16, (2, n))
    m.mode[:] = rng.integers(-128, 128, n)
    m.tau_ext[:] = rng.normal(0, 10, n)
    return bytes(m.buffer)


def _parsed(line: str) -> list:
    """A line of the C program's output as numbers (%a hex floats exactly)."""
    return [float.fromhex(t) if "0x" in t else int(t) for t in line.split()]


def _expected(payload: bytes) -> list:
    r = stream.decode_state(payload)
    n = int(r["n"])
    head = [int(r["version"]), n, int(r["seq"]), int(r["flags"]) & 0xFFFF, stream.lost_samples(int(r["flags"])),
            int(r["device_time_ns"]), int(r["host_time_ns"])]
    doubles = [float(x) for f in ("q", "qd", "current", "torque", "tau_ext") for x in r[f]]
    words = [int(v) for k in range(n) for v in (r["statusword"][k], r["error_code"][k], r["mode"][k])]
    return [*head, *doubles, *words, 1]


@pytest.mark.skipif(CC is None, reason="no C compiler (cc, gcc or clang) on this machine")
def test_c_program_decodes_state_messages_with_the_headers_struct_and_macros_as_decode_state_does(tmp_path):
    exe = _build(tmp_path, "stream", _STREAM_PROGRAM, "c11")
    rng = np.random.default_rng(22)
    good = [_random_state(rng, n) for n in (1, 2, 6, 7, 64) for _ in range(3)]
    six = good[6]
    older = _random_state(rng, 6)[:stream.message_size(6, 2)]      # a version-2 message: the older layout
    older = older[:4] + (2).to_bytes(2, "little") + older[6:]
    assert stream.decode_state(older)["tau_ext"].tolist() == [0.0] * 6     # Python reads it, the C header not
    bad = [b"ARMX" + six[4:], six[:4] + (4).to_bytes(2, "little") + six[6:], six[:4] + bytes(2) + six[6:],
           six[:-1], six + b"\0", six[:20], b"", older]
    records = good + bad
    run = subprocess.run([str(exe)], input=b"".join(len(r).to_bytes(4, "little") + r for r in records),
                         capture_output=True, timeout=60)
    lines = run.stdout.decode().splitlines()
    assert run.returncode == 0 and len(lines) == len(records)
    for payload, line in zip(good, lines):
        assert _parsed(line) == _expected(payload)
    assert lines[len(good):] == ["BAD"] * len(bad)


_SERVO_PROGRAM = r"""
#include <stdint.h>
#include <stdio.h>
#include "armid_wire.h"

int main(void)
{
    static const double values[6] = {0.1, -0.2, 0.3, 0.0, 1e-9, -3.0};
    uint8_t buf[ARMID_SERVO_MESSAGE_SIZE(6)];
    size_t len = armid_servo_encode(buf, ARMID_SERVO_MODE_POSITION, UINT64_C(0x0123456789ABCDEF), UINT64_C(42),
                                    INT64_C(1700000000123456789), values, 6);
    for (size_t i = 0; i < len; i++) printf("%02x", buf[i]);
    printf("\n");
    return len != sizeof buf;
}
"""


@pytest.mark.skipif(CC is None, reason="no C compiler (cc, gcc or clang) on this machine")
@pytest.mark.parametrize("std", ["c99", "c11"])
def test_c_program_writes_a_servo_setpoint_that_the_driver_decodes_byte_for_byte(tmp_path, std):
    from firmware_bridge import servo_wire

    exe = _build(tmp_path, "servo", _SERVO_PROGRAM, std)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    raw = bytes.fromhex(run.stdout.strip())
    values = np.array([0.1, -0.2, 0.3, 0.0, 1e-9, -3.0])
    assert raw == servo_wire.encode(servo_wire.MODE_POSITION, 0x0123456789ABCDEF, 42, 1700000000123456789, values)
    got = servo_wire.decode(raw, 6)
    assert (got.token, got.seq, got.sent_ns) == (0x0123456789ABCDEF, 42, 1700000000123456789)
