"""Bad input through the real `armid` command: each malformed file or value exits with status 2 and one
line on stderr that names the file and the field, with no traceback and within a bounded time.

The corpus is the table CASES: an id, a function that writes the bad file(s) into a folder and returns the
command line, and the texts the error line must contain (the file's name and the field). Add a case by
adding a row. Most cases run in-process (armid.cli.main, stderr captured); SUBPROCESS_CASES run a few of
them as `python -m armid.cli` to prove that nothing else reaches stderr.
"""
from __future__ import annotations

import re
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from armid.jit import is_compile_line

from armid.cli import main

ROOT = Path(__file__).resolve().parents[1]
MAX_LINE_CHARS = 400         # the error line (the case's folder aside): a file's text is quoted in short
CASE_TIMEOUT_S = 60          # any case: exit long before this (a hang or a huge allocation would not)
GENERIC6 = (ROOT / "ident" / "models" / "generic6.toml").read_text()


# -- the files -------------------------------------------------------------------------------------------------
def _model(d: Path, old: str, new: str, name: str = "arm.toml") -> Path:
    text = GENERIC6.replace(old, new, 1)
    assert text != GENERIC6, old
    (d / name).write_text(text)
    return d / name


URDF = """<robot name="mini">
  <link name="base"/>
  <link name="l1"><inertial><origin xyz="0 0 0.1"/><mass value="2"/>
    <inertia ixx="0.01" ixy="0" ixz="0" iyy="0.01" iyz="0" izz="0.005"/></inertial></link>
  <link name="l2"><inertial><origin xyz="0.1 0 0"/><mass value="1"/>
    <inertia ixx="0.002" ixy="0" ixz="0" iyy="0.003" iyz="0" izz="0.003"/></inertial></link>
  <joint name="j1" type="continuous"><parent link="base"/><child link="l1"/><axis xyz="0 0 1"/></joint>
  <joint name="j2" type="revolute"><parent link="l1"/><child link="l2"/><origin xyz="0 0 0.2"/><axis xyz="0 1 0"/>
    <limit lower="-2" upper="2" velocity="3" effort="40"/></joint>
</robot>"""


def _long_model(d: Path, joints: int) -> Path:
    """generic6 with its second joint repeated: `joints` [[joint]] tables."""
    head, _, rest = GENERIC6.partition("[[joint]]")
    second = "[[joint]]" + rest.split("[[joint]]")[1]
    (d / "arm.toml").write_text(head + second * joints)
    return d / "arm.toml"


def _long_urdf(d: Path, joints: int) -> Path:
    """A chain of `joints` revolute joints."""
    links = "".join(f'<link name="l{k}"><inertial><mass value="1"/><inertia ixx="0.01" ixy="0" ixz="0" iyy="0.01" '
                    f'iyz="0" izz="0.01"/></inertial></link>' for k in range(1, joints + 1))
    chain = "".join(f'<joint name="j{k}" type="continuous"><parent link="l{k - 1}"/><child link="l{k}"/>'
                    f'<origin xyz="0 0 0.1"/><axis xyz="0 0 1"/></joint>' for k in range(1, joints + 1))
    (d / "arm.urdf").write_text(f'<robot name="snake"><link name="l0"/>{links}{chain}</robot>')
    return d / "arm.urdf"


def _urdf(d: Path, old: str, new: str) -> Path:
    text = URDF.replace(old, new, 1)
    assert text != URDF, old
    (d / "arm.urdf").write_text(text)
    return d / "arm.urdf"


def _trajectory(d: Path, **lines: str) -> Path:
    """seed000 as a trajectory file, each line starting with a key of `lines` replaced by its value (the first
    such line; "" drops it)."""
    from ident.fit import excitation

    path = d / "traj.toml"
    excitation.save(excitation.preset("seed000"), path)
    text = path.read_text().splitlines()
    for key, new in lines.items():
        at = next(k for k, line in enumerate(text) if line.startswith(key))
        text[at] = new
    path.write_text("\n".join(text) + "\n")
    return path


def _recording_rows(n: int = 6, count: int = 120) -> tuple[str, np.ndarray]:
    t = np.arange(count) / 100.0
    q = 0.3 * np.sin(np.outer(t, np.arange(1, n + 1)))
    header = ",".join(["t"] + [f"q{j + 1}" for j in range(n)] + [f"tau{j + 1}" for j in range(n)])
    return header, np.column_stack([t, q, np.cos(q)])


def _csv(d: Path, edit: Callable[[list[str]], None]) -> Path:
    header, rows = _recording_rows()
    lines = [header] + [",".join(repr(float(v)) for v in row) for row in rows]
    edit(lines)
    (d / "run.csv").write_text("\n".join(lines) + "\n")
    return d / "run.csv"


def _cell(lines: list[str], line: int, column: int, text: str) -> None:
    """Put text into 1-based CSV line `line` (the header is line 1), 0-based column."""
    cells = lines[line - 1].split(",")
    cells[column] = text
    lines[line - 1] = ",".join(cells)


def _npz(d: Path, **changes) -> Path:
    _, rows = _recording_rows()
    arrays = {"t": rows[:, 0], "q": rows[:, 1:7], "tau": rows[:, 7:]}
    arrays.update(changes)
    np.savez(d / "run.npz", **arrays)
    return d / "run.npz"


def _npz_claiming(d: Path, shape: tuple[int, ...]) -> Path:
    """An NPZ recording whose t.npy header claims `shape` over 64 bytes of data (numpy allocates the shape)."""
    import io
    import zipfile

    from numpy.lib import format as npy

    def member(shape, data: bytes) -> bytes:
        head = io.BytesIO()
        npy.write_array_header_1_0(head, {"descr": "<f8", "fortran_order": False, "shape": shape})
        return head.getvalue() + data

    with zipfile.ZipFile(d / "run.npz", "w") as z:
        z.writestr("t.npy", member(shape, bytes(64)))
        z.writestr("q.npy", member((8, 6), bytes(384)))
        z.writestr("tau.npy", member((8, 6), bytes(384)))
    return d / "run.npz"


def _measurements(d: Path, line: int, column: int, text: str) -> Path:
    rng = np.random.default_rng(1)
    rows = [[repr(float(v)) for v in np.concatenate([rng.uniform(-1, 1, 6), rng.uniform(-0.5, 0.5, 3)])]
            for _ in range(30)]
    rows[line - 1][column] = text
    (d / "meas.csv").write_text("\n".join(",".join(r) for r in rows) + "\n")
    return d / "meas.csv"


def _mcap(d: Path, damage: Callable[[bytearray], None] | None = None) -> Path:
    """A small armid recording (MCAP, 6 joints, several chunks), damaged by `damage`."""
    from driver.recorder import McapStateWriter
    from firmware_bridge import stream

    path = d / "run.mcap"
    writer = McapStateWriter(path, chunk_seconds=0.05, rate_hz=1000.0)
    for seq in range(200):
        m = stream.StateMessage(6)
        m.q[:] = np.sin(seq / 50 + np.arange(6))
        m.set_header(seq, 0, 1_000_000 * seq, 1_700_000_000_000_000_000 + 1_000_000 * seq)
        writer.write_state(bytes(m.buffer), 6, seq, 1_700_000_000_000_000_000 + 1_000_000 * seq)
    writer.close({})
    if damage is not None:
        data = bytearray(path.read_bytes())
        damage(data)
        path.write_bytes(bytes(data))
    return path


def _records(data: bytearray) -> list[tuple[int, int]]:
    """(opcode, offset) of the top-level MCAP records after the magic."""
    out, at = [], 8
    while at + 9 <= len(data) - 8:
        out.append((data[at], at))
        at += 9 + struct.unpack_from("<Q", data, at + 1)[0]
    return out


def _first_chunk(data: bytearray) -> int:
    return next(at for op, at in _records(data) if op == 0x06)


def _sparse(d: Path, name: str, size: int, lead: bytes = b"") -> Path:
    """A file of `size` bytes that starts with lead, the rest NUL bytes, made sparse (truncate): cheap however
    large, and read back as NULs."""
    path = d / name
    path.write_bytes(lead)
    with open(path, "r+b") as f:
        f.truncate(size)
    return path


def _manifest(d: Path, first_line: str, *lines: str) -> Path:
    (d / "manifest.csv").write_text("\n".join([first_line, *lines]) + "\n")
    return d / "manifest.csv"


def _measurements_in_mm(d: Path) -> Path:
    """generic6's tool points at 30 random poses, written in mm instead of metres (all within the range check)."""
    from ident.calibration.model import from_model, tool_pose
    from ident.model import load_model

    cm = from_model(load_model("generic6"))
    q = np.random.default_rng(2).uniform(-1.5, 1.5, (30, 6))
    points = tool_pose(cm, q)[:, :3, 3] * 1000.0
    assert np.abs(points).max() < 1e3
    (d / "meas.csv").write_text("\n".join(",".join(repr(float(v)) for v in row) for row in np.hstack([q, points])))
    return d / "meas.csv"


def _config(d: Path, body: str, name: str = "driver.toml") -> Path:
    """A driver config on ipc endpoints in d (nothing binds a TCP port), with `body` appended."""
    text = f'[zmq]\nstate = "ipc://{d}/state"\ncommands = "ipc://{d}/commands"\n' + body
    (d / name).write_text(text)
    return d / name


def _write(d: Path, name: str, text: str) -> Path:
    (d / name).write_text(text)
    return d / name


def _payload_json(d: Path, text: str) -> Path:
    (d / "payload.json").write_text(text)
    return d / "payload.json"


# -- the corpus ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    id: str
    argv: Callable[[Path], list[str]]     # writes the bad file(s) into the folder, returns the command line
    names: tuple[str, ...]                # what the one error line must contain: the file and the field
    #                                       ({dir} stands for the case's folder)


SIM = '[transport]\nname = "sim"\n'
CASES = [
    # model files (TOML, URDF)
    Case("model-unknown-key", lambda d: ["model", "show", str(_model(d, "inertia_com = [0.020", "inertia_cm = [0.020"))],
         ("arm.toml", "joint[0].link.inertia_cm", "unknown")),
    Case("model-unknown-table", lambda d: ["model", "show", str(_model(d, "[robot]", "[robot]\n[robots]\n"))],
         ("arm.toml", "robots")),
    Case("model-tip-without-urdf", lambda d: ["model", "show", str(_model(d, 'name = "generic6"', 'name = "x"\ntip = "t"'))],
         ("arm.toml", "robot.tip")),
    Case("model-nan", lambda d: ["model", "show", str(_model(d, "mass = 4.0", "mass = nan"))],
         ("arm.toml", "joint[0].link.mass")),
    Case("model-1e300", lambda d: ["model", "show", str(_model(d, "gear_ratio = 100.0", "gear_ratio = 1e300"))],
         ("arm.toml", "joint[0].drive.gear_ratio", "within")),
    Case("urdf-cycle", lambda d: ["model", "show", str(_urdf(d, "</robot>", """<link name="a"/><link name="b"/>
         <joint name="ab" type="revolute"><parent link="a"/><child link="b"/></joint>
         <joint name="ba" type="revolute"><parent link="b"/><child link="a"/></joint></robot>"""))],
         ("arm.urdf", "cycle", "a <- b <- a")),
    Case("urdf-two-parents", lambda d: ["model", "show", str(_urdf(d, "</robot>", """<joint name="back" type="fixed">
         <parent link="l2"/><child link="l1"/></joint></robot>"""))],
         ("arm.urdf", "joint[back].child", "l1")),
    Case("urdf-inconsistent-inertia", lambda d: ["model", "show", str(_urdf(d, 'iyy="0.003"', 'iyy="0.009"'))],
         ("arm.urdf", "link[l2].inertial.inertia", "triangle")),
    Case("urdf-negative-inertia", lambda d: ["model", "show", str(_urdf(d, 'izz="0.005"', 'izz="-0.005"'))],
         ("arm.urdf", "link[l1].inertial.inertia", "negative eigenvalue")),
    Case("model-4-gib-of-nul-bytes", lambda d: ["model", "show", str(_sparse(d, "arm.toml", 2 ** 32))],
         ("arm.toml", "(file)", "at most 16 MiB")),
    Case("urdf-4-gib-of-nul-bytes", lambda d: ["model", "show", str(_sparse(d, "arm.urdf", 2 ** 32))],
         ("arm.urdf", "(file)", "at most 16 MiB")),
    Case("model-300-joints", lambda d: ["model", "show", str(_long_model(d, 300))],
         ("arm.toml", "joint", "at most 32 movable joints", "got 300")),
    Case("urdf-40-joints", lambda d: ["model", "show", str(_long_urdf(d, 40))],
         ("arm.urdf", "joint", "at most 32 movable joints", "got 40")),
    # trajectories
    Case("trajectory-base-frequency-1e-9", lambda d: ["excite", "check", str(_trajectory(
        d, base_frequency="base_frequency = 1e-9", period="")), "--model", "generic6"],
         ("traj.toml", "trajectory.base_frequency", "samples")),
    Case("trajectory-base-frequency-1e308", lambda d: ["excite", "check", str(_trajectory(
        d, base_frequency="base_frequency = 1e308", period="")), "--model", "generic6"],
         ("traj.toml", "trajectory.base_frequency", "(0, 100]")),
    Case("design-base-frequency-1e-9", lambda d: ["excite", "design", "--model", "generic6", "--base-frequency", "1e-9",
                                                  "-o", str(d / "t.toml")],
         ("base_frequency", "samples")),
    Case("design-grid-1e8", lambda d: ["excite", "design", "--model", "generic6", "--grid", "100000000",
                                       "-o", str(d / "t.toml")],
         ("grid", "4..10000")),
    Case("trajectory-unknown-field", lambda d: ["excite", "check", str(_trajectory(
        d, q0='q0 = 0.0\nq00 = 1.0')), "--model", "generic6"],
         ("traj.toml", "q00")),
    # recordings (CSV, NPZ)
    Case("csv-1e300", lambda d: ["identify", str(_csv(d, lambda ls: _cell(ls, 6, 3, "1e300"))), "--model", "generic6",
                                 "-o", str(d / "out"), "--quiet"],
         ("run.csv", "line 6", "column q3", "out of range")),
    Case("csv-nan", lambda d: ["identify", str(_csv(d, lambda ls: _cell(ls, 9, 7, "nan"))), "--model", "generic6",
                               "-o", str(d / "out"), "--quiet"],
         ("run.csv", "line 9", "column tau1", "not a finite number")),
    Case("csv-inf-time", lambda d: ["identify", str(_csv(d, lambda ls: _cell(ls, 4, 0, "inf"))), "--model", "generic6",
                                    "-o", str(d / "out"), "--quiet"],
         ("run.csv", "line 4", "column t")),
    Case("csv-short-row", lambda d: ["identify", str(_csv(d, lambda ls: ls.__setitem__(6, ls[6].rsplit(",", 1)[0]))),
                                     "--model", "generic6", "-o", str(d / "out"), "--quiet"],
         ("run.csv", "line 7", "12 values")),
    Case("csv-empty", lambda d: ["identify", str(_csv(d, lambda ls: ls.clear())), "--model", "generic6",
                                 "-o", str(d / "out"), "--quiet"],
         ("run.csv", "empty")),
    Case("csv-header-only", lambda d: ["identify", str(_csv(d, lambda ls: ls.__delitem__(slice(1, None)))),
                                       "--model", "generic6", "-o", str(d / "out"), "--quiet"],
         ("run.csv", "no data rows")),
    Case("csv-1-gib-of-nul-bytes", lambda d: ["identify", str(_sparse(d, "run.csv", 2 ** 30)), "--model", "generic6",
                                              "-o", str(d / "out"), "--quiet"],
         ("run.csv", "line 1", "NUL byte")),
    Case("csv-nul-bytes-after-a-header", lambda d: ["identify", str(_sparse(d, "run.csv", 2 ** 30, b"# lost_samples = 0\n"
                                                    + _recording_rows()[0].encode() + b"\n")), "--model", "generic6",
                                                    "-o", str(d / "out"), "--quiet"],
         ("run.csv", "line 3", "NUL byte")),
    Case("csv-first-field-over-128-kib", lambda d: ["identify", str(_write(d, "run.csv", "x" * 200_000 + ",q1\n0,1\n")),
                                                    "--model", "generic6", "-o", str(d / "out"), "--quiet"],
         ("run.csv", "line 1", "longer than 64 KiB")),
    Case("csv-column-name-of-60-kib", lambda d: ["identify", str(_write(d, "run.csv", "t,q1," + "y" * 60_000 + "\n0,1,2\n")),
                                                 "--model", "generic6", "-o", str(d / "out"), "--quiet"],
         ("run.csv", "line 1", "column 3", "60000 characters")),
    Case("csv-not-utf8", lambda d: ["identify", str(_sparse(d, "run.csv", 7, b"# caf\xe9\n")), "--model",
                                    "generic6", "-o", str(d / "out"), "--quiet"],
         ("run.csv", "line 1", "UTF-8")),
    Case("manifest-first-field-over-128-kib", lambda d: ["identify", str(_manifest(d, "a" * 200_000 + ",model,recording")),
                                                         "-o", str(d / "out"), "--quiet"],
         ("manifest.csv", "--model", "no manifest", "arm_id, model, recording")),
    Case("manifest-field-over-128-kib", lambda d: ["identify", str(_manifest(
        d, "arm_id,model,recording", "a,generic6,run.csv", "b,generic6," + "r" * 200_000)), "-o", str(d / "out"),
        "--quiet"],
         ("manifest.csv", "line 3", "field larger than field limit")),
    Case("manifest-nul-bytes", lambda d: ["identify", str(_manifest(d, "arm_id,model,recording", "a,generic6,\0\0")),
                                          "-o", str(d / "out"), "--quiet"],
         ("manifest.csv", "line 2", "NUL byte")),
    Case("npz-1e300", lambda d: ["identify", str(_npz(d, tau=np.full((120, 6), 1e300))), "--model", "generic6",
                                 "-o", str(d / "out"), "--quiet"],
         ("run.npz", "sample 0", "column tau1", "out of range")),
    Case("npz-wrong-shape", lambda d: ["identify", str(_npz(d, q=np.zeros((120, 3)))), "--model", "generic6",
                                       "-o", str(d / "out"), "--quiet"],
         ("run.npz", "tau", "like q")),
    Case("npz-objects", lambda d: ["identify", str(_npz(d, t=np.array([None] * 120, dtype=object))),
                                   "--model", "generic6", "-o", str(d / "out"), "--quiet"],
         ("run.npz", "not a readable NPZ")),
    Case("npz-header-claims-8-tib", lambda d: ["identify", str(_npz_claiming(d, (2 ** 40,))), "--model", "generic6",
                                               "-o", str(d / "out"), "--quiet"],
         ("run.npz", "array 't'", "shape (1099511627776,)")),
    # calibration measurements
    Case("calibration-1e300", lambda d: ["calibrate", "identify", str(_measurements(d, 4, 7, "1e300")),
                                         "--model", "generic6", "-o", str(d / "out")],
         ("meas.csv", "line 4", "column 8 (y)", "out of range")),
    Case("calibration-joint-1e300", lambda d: ["calibrate", "identify", str(_measurements(d, 2, 2, "-1e300")),
                                               "--model", "generic6", "-o", str(d / "out")],
         ("meas.csv", "line 2", "column 3 (q3)")),
    Case("calibration-inf", lambda d: ["calibrate", "identify", str(_measurements(d, 5, 0, "inf")),
                                       "--model", "generic6", "-o", str(d / "out")],
         ("meas.csv", "line 5", "column 1", "not finite")),
    Case("calibration-positions-in-mm", lambda d: ["calibrate", "identify", str(_measurements_in_mm(d)),
                                                   "--model", "generic6", "-o", str(d / "out")],
         ("meas.csv", "column", "in mm?", "metres")),
    Case("calibration-plan-1e9-candidates", lambda d: ["calibrate", "plan", "--model", "generic6", "--count", "40",
                                                       "--candidates", "1000000000", "-o", str(d / "p.csv")],
         ("candidates", "1..100000")),
    Case("calibration-plan-per-joint-1e5", lambda d: ["calibrate", "plan", "--model", "generic6", "--count", "40",
                                                      "--per-joint", "100000", "-o", str(d / "p.csv")],
         ("per-joint values", "combinations")),
    # MCAP recordings
    Case("mcap-huge-record-length", lambda d: ["record", "convert", str(_mcap(
        d, lambda b: b.__setitem__(slice(9, 17), struct.pack("<Q", 2 ** 64 - 1)))), "-o", str(d / "run.npz")],
         ("run.mcap", "corrupt MCAP")),
    Case("mcap-huge-string-length", lambda d: ["record", "convert", str(_mcap(
        d, lambda b: b.__setitem__(slice(17, 21), struct.pack("<I", 2 ** 32 - 1)))), "-o", str(d / "run.npz")],
         ("run.mcap", "corrupt MCAP", "length of 4294967295 bytes")),
    Case("mcap-huge-chunk", lambda d: ["record", "info", str(_mcap(d, lambda b: b.__setitem__(
        slice(_first_chunk(b) + 25, _first_chunk(b) + 33), struct.pack("<Q", 2 ** 62))))],
         ("run.mcap", "corrupt MCAP", "chunk of 4611686018427387904 bytes")),
    Case("mcap-garbage", lambda d: ["record", "convert", str(_mcap(d, lambda b: b.__setitem__(
        slice(8, len(b) - 8), np.random.default_rng(3).integers(0, 256, len(b) - 16, dtype=np.uint8).tobytes()))),
        "-o", str(d / "run.npz")],
         ("run.mcap",)),
    Case("mcap-truncated-header", lambda d: ["record", "convert", str(_mcap(d, lambda b: b.__delitem__(slice(30, None)))),
                                             "-o", str(d / "run.npz")],
         ("run.mcap", "no /armid/state messages")),
    Case("mcap-not-mcap", lambda d: ["payload", "identify", "--method", "static", "--loaded",
                                     str(_mcap(d, lambda b: b.__setitem__(slice(0, 8), b"PK\x03\x04\0\0\0\0"))),
                                     "--unloaded", str(d / "run.mcap"), "--model", "generic6", "-o", str(d / "out"),
                                     "--quiet"],
         ("run.mcap", "not an MCAP file")),
    # driver configs
    Case("config-rate-1e9", lambda d: ["driver", "--config", str(_config(d, "[driver]\nrate_hz = 1e9\n" + SIM))],
         ("driver.toml", "driver.rate_hz", "1..10000")),
    Case("config-rate-nan", lambda d: ["driver", "--config", str(_config(d, "[driver]\nrate_hz = nan\n" + SIM))],
         ("driver.toml", "driver.rate_hz")),
    Case("config-watchdog-under-two-periods", lambda d: ["driver", "--config", str(_config(
        d, "[driver]\nrate_hz = 250\nwatchdog_ms = 5\n" + SIM))],
         ("driver.toml", "driver.watchdog_ms", "2 periods")),
    Case("config-watchdog-huge", lambda d: ["driver", "--config", str(_config(d, "[driver]\nwatchdog_ms = 1e12\n" + SIM))],
         ("driver.toml", "driver.watchdog_ms")),
    Case("config-unknown-transport-key", lambda d: ["driver", "--config", str(_config(d, SIM + "bogus = 3\n"))],
         ("driver.toml", "transport.bogus", "seed")),
    Case("config-unknown-serial-key", lambda d: ["driver", "--config", str(_config(
        d, '[transport]\nname = "serial"\nport = "/dev/null"\nspeed = 9600\n'))],
         ("driver.toml", "transport.speed", "baudrate")),
    Case("config-serial-without-port", lambda d: ["driver", "--config", str(_config(d, '[transport]\nname = "serial"\n'))],
         ("driver.toml", "transport.port", "missing")),
    Case("config-record-path-is-a-directory", lambda d: ["driver", "--config", str(_config(
        d, SIM + '[record]\npath = "."\n'))],
         ("driver.toml", "record.path", "directory")),
    Case("config-record-chunk-huge", lambda d: ["driver", "--config", str(_config(
        d, SIM + '[record]\npath = "r.mcap"\nchunk_seconds = 1e9\n'))],
         ("driver.toml", "record.chunk_seconds")),
    Case("config-endpoint-not-zeromq", lambda d: ["driver", "--config", str(_write(d, "driver.toml",
                                                  SIM + '[zmq]\nstate = "localhost:5555"\n'))],
         ("driver.toml", "zmq.state", "ZeroMQ endpoint")),
    Case("driver-record-is-a-directory", lambda d: ["driver", "--config", str(_config(d, SIM)), "--record", str(d)],
         ("--record {dir}", "directory")),
    Case("driver-serial-port-unreachable", lambda d: ["driver", "--config", str(_config(
        d, f'[transport]\nname = "serial"\nport = "{d}/no-such-tty"\nhandshake_timeout_s = 0.2\n'))],
         ("driver.toml", "transport.port", "no-such-tty")),
    Case("driver-gateway-host-unreachable", lambda d: ["driver", "--config", str(_config(
        d, '[transport]\nname = "gateway"\nhost = "127.0.0.1"\nport = 1\nhandshake_timeout_ms = 300\n'))],
         ("driver.toml", "transport.host", "127.0.0.1:1")),
    Case("driver-can-channel-unreachable", lambda d: ["driver", "--config", str(_config(
        d, '[transport]\nname = "can"\ninterface = "socketcan"\nchannel = "armid-nocan9"\n'))],
         ("driver.toml", "transport.interface/transport.channel", "armid-nocan9")),
    # the simulator's options
    Case("sim-unknown-option", lambda d: ["sim", "--transport", "serial", "--option", "bogus=3"],
         ("serial device", "'bogus'", "baudrate")),
    Case("sim-rate-1e12", lambda d: ["sim", "--transport", "serial", "--rate", "1e12"],
         ("rate_hz", "1..10000")),
    # the online identification's options
    Case("ident-service-stream-rate-1e12", lambda d: ["ident-service", "--model", "generic6", "--state",
                                                      f"ipc://{d}/none", "--stream-rate", "1e12"],
         ("rate_hz", "1..10000")),
    Case("ident-service-cutoff-1e-9", lambda d: ["ident-service", "--model", "generic6", "--state", f"ipc://{d}/none",
                                                 "--cutoff", "1e-9"],
         ("cutoff", "filter window")),
    Case("ident-service-forgetting-2", lambda d: ["ident-service", "--model", "generic6", "--state", f"ipc://{d}/none",
                                                  "--forgetting", "2"],
         ("forgetting", "0 < lambda <= 1")),
    # output files that cannot be written
    Case("excite-sample-output-is-a-directory", lambda d: ["excite", "sample", "seed000", "-o", str(d)],
         ("-o {dir}", "is a directory")),
    Case("excite-design-output-folder-missing", lambda d: ["excite", "design", "--model", "generic6",
                                                           "-o", str(d / "no" / "t.toml")],
         ("-o {dir}/no/t.toml", "does not exist")),
    Case("calibrate-plan-output-is-a-directory", lambda d: ["calibrate", "plan", "--model", "generic6", "--count", "40",
                                                            "-o", str(d)],
         ("-o {dir}", "is a directory")),
    Case("payload-plan-output-is-a-directory", lambda d: ["payload", "plan", "--method", "dynamic", "--model",
                                                          "generic6", "-o", str(d)],
         ("-o {dir}", "is a directory")),
    Case("identify-output-is-a-file", lambda d: ["identify", str(_csv(d, lambda ls: None)), "--model", "generic6",
                                                 "-o", str(_write(d, "out", "")), "--quiet"],
         ("-o {dir}/out", "is a file")),
    Case("calibrate-identify-output-under-a-file", lambda d: ["calibrate", "identify", str(_measurements(d, 1, 0, "0.1")),
                                                              "--model", "generic6",
                                                              "-o", str(_write(d, "out", "") / "sub")],
         ("-o {dir}/out/sub", "is a file")),
    # record output, payload files
    Case("record-output-is-a-directory", lambda d: ["record", "--state", f"ipc://{d}/none", "-o", str(d),
                                                    "--duration", "1"],
         ("{dir}: is a directory",)),
    Case("payload-json-nan-mass", lambda d: ["payload", "apply", str(_payload_json(
        d, '{"estimates": [{"method": "static", "set_payload": {"cmd": "set_payload", "mass": NaN, "com": [0, 0, 0]}}]}')),
        "--commands", f"ipc://{d}/none", "--timeout", "0.5"],
         ("payload.json", "estimates[0].set_payload.mass")),
    Case("payload-json-not-a-list", lambda d: ["payload", "apply", str(_payload_json(d, '{"estimates": [1, 2]}')),
                                               "--commands", f"ipc://{d}/none", "--timeout", "0.5"],
         ("payload.json", "estimates")),
    Case("payload-json-short-com", lambda d: ["payload", "apply", str(_payload_json(
        d, '{"estimates": [{"method": "static", "set_payload": {"cmd": "set_payload", "mass": 1.0, "com": [0, 0]}}]}')),
        "--commands", f"ipc://{d}/none", "--timeout", "0.5"],
         ("payload.json", "estimates[0].set_payload.com")),
]
BY_ID = {c.id: c for c in CASES}
# run as a separate `python -m armid.cli` too: stderr then holds everything the process printed
SUBPROCESS_CASES = ("urdf-cycle", "mcap-huge-string-length", "trajectory-base-frequency-1e-9",
                    "ident-service-cutoff-1e-9",
                    "config-unknown-transport-key", "driver-serial-port-unreachable", "driver-gateway-host-unreachable")


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout(f"no answer within {CASE_TIMEOUT_S} s")


def _check_line(err: str, case: Case, code: int, folder: Path) -> None:
    assert "Traceback" not in err, err
    assert code == 2, f"exit status {code}, stderr: {err}"
    lines = [line for line in err.splitlines() if not is_compile_line(line)]   # a cold cache's compile notices
    assert len(lines) == 1 and lines[0].startswith("armid: "), err
    quoted_text = lines[0].replace(str(folder), "")     # what is left: the message and what it quotes of the file
    assert len(quoted_text) < MAX_LINE_CHARS, f"{len(quoted_text)} characters: {lines[0][:300]}..."
    for name in (n.format(dir=folder) for n in case.names):
        assert name in lines[0], f"{name!r} not named in: {lines[0]}"


def test_the_corpus_ids_are_unique():
    assert len(BY_ID) == len(CASES) and set(SUBPROCESS_CASES) <= set(BY_ID)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_bad_file_exits_2_with_one_line_naming_the_file_and_the_field(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = case.argv(tmp_path)
    capsys.readouterr()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_TIMEOUT_S)
    t0 = time.monotonic()
    try:
        code = main(argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        for sig in (signal.SIGINT, signal.SIGTERM):      # `armid driver` and `record` install handlers
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    _check_line(capsys.readouterr().err, case, code, tmp_path)
    assert time.monotonic() - t0 < CASE_TIMEOUT_S


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_a_bad_file_gives_the_armid_process_one_line_on_stderr_and_no_traceback(case_id, tmp_path):
    case = BY_ID[case_id]
    argv = case.argv(tmp_path)
    run = subprocess.run([sys.executable, "-m", "armid.cli", *argv], cwd=tmp_path, capture_output=True, text=True,
                         timeout=CASE_TIMEOUT_S + 60)
    _check_line(run.stderr, case, run.returncode, tmp_path)


# -- mutated files: seeded, a bounded number of each kind ------------------------------------------------------
# Each mutation makes a file bad in a way that must be refused wherever it lands; the command must exit 2 with one
# line naming the file (and, where the mutation fixes it, the line or field), no traceback, in bounded time.
FUZZ_SEED = 20260301
BAD_CELLS = ("nan", "inf", "-inf", "", "abc", "1.2.3", "1e999", "\0", "1,2", "--1", "0x1F", "1e300")
BAD_TOML_NUMBERS = ("nan", '"text"', "true", "{}", "[]", "1e300", "-nan")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e-?\d+)?(?![\w.])")


def _mutated_csv(d: Path, rng: np.random.Generator) -> tuple[list[str], tuple[str, ...]]:
    """A recording with one data cell replaced by a token that is no finite number in range."""
    line, column = int(rng.integers(2, 122)), int(rng.integers(0, 13))
    tokens = [t for t in BAD_CELLS if not (column == 0 and t == "1e300")]  # a huge time is a later line's fault
    path = _csv(d, lambda ls: _cell(ls, line, column, str(rng.choice(tokens))))
    return ["identify", str(path), "--model", "generic6", "-o", str(d / "out"), "--quiet"], ("run.csv", f"line {line}")


def _mutated_toml(d: Path, rng: np.random.Generator) -> tuple[list[str], tuple[str, ...]]:
    """generic6 with one number of a joint's tables replaced by a value no field takes."""
    lines = GENERIC6.splitlines()
    joint, spots = -1, []
    for k, text in enumerate(lines):
        joint += text.startswith("[[joint]]")
        table = text.split("=", 1)[0].strip()
        if joint >= 0 and table in ("dh", "link", "drive", "limits"):
            spots += [(k, m.span(), f"joint[{joint}].{table}") for m in _NUMBER.finditer(text.split("=", 1)[1])]
    k, (a, b), field = spots[int(rng.integers(len(spots)))]
    head, value = lines[k].split("=", 1)
    lines[k] = f"{head}={value[:a]}{rng.choice(BAD_TOML_NUMBERS)}{value[b:]}"
    (d / "arm.toml").write_text("\n".join(lines) + "\n")
    return ["model", "show", str(d / "arm.toml")], ("arm.toml", field)


def _mutated_manifest(d: Path, rng: np.random.Generator) -> tuple[list[str], tuple[str, ...]]:
    """A manifest of 8 runs with one defect on a random line."""
    rows = [["arm_id", "model", "recording", "date"]] + [
        [f"arm{k % 3}", "generic6", f"r{k}.csv", f"2026-03-{k + 1:02d}T02:00"] for k in range(8)]
    line = int(rng.integers(2, len(rows) + 1))
    row = rows[line - 1]
    kind = int(rng.integers(6))
    if kind == 0:
        row[int(rng.integers(3))] = ""                               # a required value missing
    elif kind == 1:
        row[3] = str(rng.choice(["2026-13-01", "yesterday", "1e9", "2026-03-01T25:00"]))
    elif kind == 2:
        row.append("extra")                                          # more fields than columns
    elif kind == 3:
        row[0] = row[0][:1] + "\0" + row[0][1:]
    elif kind == 4:
        rows[line - 1] = list(rows[1 if line != 2 else 2])           # the same arm and run twice
        line = max(line, 3)
    else:
        column = int(rng.integers(4))
        rows[0][column] += "x"                                       # an unknown column
        line = 1
    (d / "manifest.csv").write_text("\n".join(",".join(r) for r in rows) + "\n")
    names = ("manifest.csv", f"line {line}")
    if kind == 5 and column < 3:       # without its required columns the file is no manifest: a recording needs --model
        names = ("manifest.csv", "--model", "no manifest", "arm_id, model, recording")
    return ["identify", str(d / "manifest.csv"), "-o", str(d / "out"), "--quiet"], names


@pytest.fixture(scope="module")
def good_mcap(tmp_path_factory) -> bytes:
    return _mcap(tmp_path_factory.mktemp("mcap")).read_bytes()


FUZZ = {"csv": (_mutated_csv, 24), "toml": (_mutated_toml, 24), "manifest": (_mutated_manifest, 24), "mcap": (None, 40)}


@pytest.mark.parametrize("kind", list(FUZZ))
def test_every_mutated_file_exits_2_with_one_line_naming_it(kind, good_mcap, tmp_path, capsys, monkeypatch):
    make, count = FUZZ[kind]
    rng = np.random.default_rng([FUZZ_SEED, list(FUZZ).index(kind)])
    monkeypatch.chdir(tmp_path)
    failures = []
    for k in range(count):
        d = tmp_path / str(k)
        d.mkdir()
        if kind == "mcap":       # one byte changed anywhere: every record is under a CRC, or is the magic
            data = bytearray(good_mcap)
            at = int(rng.integers(len(data)))
            data[at] ^= int(rng.integers(1, 256))
            (d / "run.mcap").write_bytes(bytes(data))
            argv, names = ["record", "convert", str(d / "run.mcap"), "-o", str(d / "run.npz")], ("run.mcap",)
        else:
            argv, names = make(d, rng)
        capsys.readouterr()
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(CASE_TIMEOUT_S)
        try:
            code = main(argv)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        try:
            _check_line(capsys.readouterr().err, Case(f"{kind}-{k}", lambda _: argv, names), code, d)
        except AssertionError as exc:
            failures.append(f"{kind} mutation {k} ({' '.join(argv[:2])}): {str(exc).splitlines()[0][:300]}")
    assert not failures, "\n".join(failures)
