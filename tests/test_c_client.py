"""docs/examples/stream_client.c, compiled with the system C compiler against libzmq (the system's, or the one
pyzmq's wheel bundles with tests/c/zmq.h declaring the few functions it uses) and run against a live driver on
the in-process simulator: every value it prints is what firmware_bridge.stream decodes from the same message,
received by a Python subscriber. It refuses a message that is not a state message and gives up on silence. The
memcpy snippet of docs/reference/stream.md compiles and reads q at any alignment of the buffer; its CURVE snippet is
answered by a secured driver with the client's keys and not with a fresh pair that is not authorised."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.auth

from armid.client import ArmClient
from driver.daemon import Curve, Endpoints
from firmware_bridge import c_header, stream
from ident.model import load_model
from local_driver import local_driver

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "stream_client.c"
CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
# a misaligned load of a double stops the program (UBSan): the examples must copy the values out
_ALIGNMENT_CHECK = ["-fsanitize=alignment", "-fno-sanitize-recover=all"]
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc, gcc or clang) on this machine")


def _libzmq_flags() -> list[str]:
    """Include and link flags: the system <zmq.h> if the compiler finds one, else tests/c/zmq.h; the libzmq
    bundled with pyzmq's wheel if there is one (rpath set), else the system's -lzmq."""
    probe = subprocess.run([CC, "-E", "-x", "c", "-"], input="#include <zmq.h>\n", capture_output=True, text=True,
                           timeout=60)
    flags = [] if probe.returncode == 0 else [f"-I{Path(__file__).parent / 'c'}"]
    libs = Path(zmq.__file__).resolve().parent.parent / "pyzmq.libs"
    bundled = sorted(libs.glob("libzmq*.so*")) if libs.is_dir() else []
    if bundled:
        return flags + [f"-L{libs}", f"-l:{bundled[0].name}", f"-Wl,-rpath,{libs}"]
    return flags + ["-lzmq"]


@pytest.fixture(scope="module")
def client_exe(tmp_path_factory):
    exe = tmp_path_factory.mktemp("c_client") / "stream_client"
    build = subprocess.run([CC, "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O1", *_ALIGNMENT_CHECK,
                            f"-I{c_header.HEADER_PATH.parent}", str(EXAMPLE), "-o", str(exe), *_libzmq_flags()],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    return exe


def test_the_example_is_short_and_uses_the_headers_macros():
    text = EXAMPLE.read_text()
    assert 60 <= len(text.splitlines()) <= 120
    for name in ("ARMID_STREAM_TOPIC_STATE", "armid_stream_check", "ARMID_STREAM_Q_OFFSET", "ARMID_STREAM_QD_OFFSET",
                 "ARMID_STREAM_TORQUE_OFFSET", "ARMID_STREAM_LOST_SAMPLES", "memcpy", "ZMQ_RCVTIMEO"):
        assert name in text
    code = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    assert not re.search(r"\b(36|37|8 ?\* ?n)\b", code)                     # no hand-copied offsets


def _documented(text: str, start: str) -> str:
    """The one line of `text` (a doc's indented block, or the example's comment) that begins with `start`."""
    lines = [line.strip(" *") for line in text.splitlines() if line.strip(" *").startswith(start)]
    assert len(lines) == 1, lines
    return re.split(r"\s{2,}\(", lines[0])[0]          # without a trailing "(from armid's folder)"


def test_the_documented_build_runs_as_written_with_the_package_it_names(tmp_path):
    doc = (ROOT / "docs" / "reference" / "stream.md").read_text()
    command = _documented(doc, "cc ")
    assert command == _documented(EXAMPLE.read_text(), "cc ")             # the example says the same
    package = _documented(doc, "sudo apt-get install ").split()[-1]
    assert _documented(EXAMPLE.read_text(), "sudo apt-get install ").split()[-1] == package
    probe = subprocess.run([CC, "-E", "-x", "c", "-"], input="#include <zmq.h>\n", capture_output=True, text=True,
                           timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"no <zmq.h> on this machine: the documented build needs {package} (or its equivalent)")
    header = re.search(r'"(/[^"]*/zmq\.h)"', probe.stdout).group(1)
    if shutil.which("dpkg"):                                           # the named package provides that header
        owner = subprocess.run(["dpkg", "-S", header], capture_output=True, text=True, timeout=60)
        assert owner.stdout.split(":")[0] == package, owner.stdout or owner.stderr
    for folder in ("firmware_bridge", "docs"):                         # "from armid's folder", writing elsewhere
        (tmp_path / folder).symlink_to(ROOT / folder)
    build = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    model = load_model("generic6")
    with local_driver(model, seed=5) as (d, _):
        out = _run(tmp_path / "stream_client", d.bound["state"], 10)
    assert out.returncode == 0, out.stderr
    assert [len(line.split()) for line in out.stdout.splitlines()] == [5 + 3 * model.n] * 10


def _run(exe, endpoint: str, count: int) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), endpoint, str(count)], capture_output=True, text=True, timeout=60)


def test_the_c_client_prints_what_a_python_subscriber_decodes_from_the_same_messages(client_exe):
    model = load_model("generic6")
    n = model.n
    with local_driver(model, seed=5) as (d, _):
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.connect(d.bound["state"])
        sub.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_STATE)
        try:
            assert sub.poll(10_000), "the driver publishes nothing"
            with ArmClient(d.bound["state"], d.bound["commands"]) as arm:
                arm.enable()                                   # the drives hold the arm: torques are not zero
                arm.move_to([0.2, -0.1, 0.15, 0.05, -0.1, 0.2], speed=0.8)
            out = _run(client_exe, d.bound["state"], 200)
            assert out.returncode == 0, out.stderr
            rows = [line.split() for line in out.stdout.splitlines()]
            assert len(rows) == 200 and all(len(r) == 5 + 3 * n for r in rows)
            seqs = [int(r[0]) for r in rows]
            assert seqs == list(range(seqs[0], seqs[0] + 200))
            decoded: dict[int, np.void] = {}
            while seqs[-1] not in decoded and sub.poll(10_000):
                r = stream.decode_state(sub.recv_multipart()[1])
                decoded[int(r["seq"])] = r
            assert set(seqs) <= set(decoded)
        finally:
            sub.close(0)
    for row in rows:
        r = decoded[int(row[0])]
        flags = int(r["flags"])
        assert [int(x) for x in row[1:5]] == [flags & 0xFFFF, stream.lost_samples(flags), int(r["device_time_ns"]),
                                              int(r["host_time_ns"])]
        values = np.array([float(x) for x in row[5:]])
        np.testing.assert_array_equal(values, np.concatenate([r["q"], r["qd"], r["torque"]]))
    assert all(int(row[1]) & stream.FLAG_ENABLED for row in rows)
    assert np.abs(np.array([[float(x) for x in row[5 + 2 * n:]] for row in rows])).max() > 1.0   # N m


def test_the_c_client_refuses_a_message_that_is_not_a_state_message_and_gives_up_on_silence(client_exe):
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    good = stream.StateMessage(6)
    bad = bytes(good.buffer)[:-1]                           # one byte short of its size
    stop = threading.Event()

    def publish():
        while not stop.wait(0.01):                          # until the client has subscribed and read one
            pub.send_multipart([stream.TOPIC_STATE, bad])
    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:
        out = _run(client_exe, f"tcp://127.0.0.1:{port}", 5)
    finally:
        stop.set()
        thread.join(5)
        pub.close(0)
    assert out.returncode == 1 and out.stdout == ""
    assert "not a state message of version 3-3 (305 bytes)" in out.stderr
    silent = ctx.socket(zmq.PUB)
    silent.setsockopt(zmq.LINGER, 0)
    try:
        port = silent.bind_to_random_port("tcp://127.0.0.1")
        out = _run(client_exe, f"tcp://127.0.0.1:{port}", 5)
    finally:
        silent.close(0)
    assert out.returncode == 1 and "no state message within 5 s" in out.stderr


_SNIPPET_MAIN = r"""
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "armid_wire.h"

static int snippet(const void *payload, size_t len)
{
SNIPPET
    for (int k = 0; k < n; k++) printf("%a\n", q[k]);
    return n;
}

int main(void)
{
    static uint8_t storage[4096];
    size_t len = fread(storage + 3, 1, sizeof storage - 3, stdin);    /* payload at an odd address */
    return snippet(storage + 3, len) > 0 ? 0 : 1;
}
"""


def test_the_documented_memcpy_snippet_reads_q_from_a_payload_at_an_odd_address(tmp_path):
    doc = (ROOT / "docs" / "reference" / "stream.md").read_text().split("\n## Reading the stream from C, C++ and MATLAB\n")[1]
    code = doc.split("```c\n")[1].split("```")[0]
    src, exe = tmp_path / "snippet.c", tmp_path / "snippet"
    src.write_text(_SNIPPET_MAIN.replace("SNIPPET", textwrap.indent(code, "    ")))
    build = subprocess.run([CC, "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", *_ALIGNMENT_CHECK,
                            f"-I{c_header.HEADER_PATH.parent}", str(src), "-o", str(exe)],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    m = stream.StateMessage(6)
    m.q[:] = np.random.default_rng(7).normal(size=6)
    run = subprocess.run([str(exe)], input=bytes(m.buffer), capture_output=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert [float.fromhex(x) for x in run.stdout.decode().split()] == m.q.tolist()


_CURVE_MAIN = r"""
#include <stdio.h>
#include <string.h>
#include <zmq.h>

int main(void)
{
    void *ctx = zmq_ctx_new();
    int timeout = 2000, linger = 0;
    char reply[65536];
SNIPPET
    zmq_setsockopt(req, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    zmq_setsockopt(req, ZMQ_LINGER, &linger, sizeof linger);
    int len = zmq_recv(req, reply, sizeof reply - 1, 0);
    if (len >= 0) reply[len < (int)sizeof reply - 1 ? len : (int)sizeof reply - 1] = 0;
    puts(len >= 0 ? reply : "NO REPLY");
    zmq_close(req);
    zmq_ctx_term(ctx);
    return len < 0;
}
"""


def _c_string(z85: bytes) -> str:
    return '"' + z85.decode().replace("?", "\\?") + '"'


def test_the_documented_c_curve_snippet_is_answered_with_the_clients_keys_only(tmp_path):
    doc = (ROOT / "docs" / "reference" / "stream.md").read_text().split("\n## A CURVE client\n")[1].split("\n## ")[0]
    snippet = doc.split("```c\n")[1].split("```")[0]
    keys, clients = tmp_path / "keys", tmp_path / "keys" / "clients"
    clients.mkdir(parents=True)
    server_public, server_secret = zmq.auth.create_certificates(keys, "server")
    client_public, client_secret = zmq.auth.create_certificates(keys, "client")
    Path(client_public).rename(clients / "client.key")
    server_key = zmq.auth.load_certificate(server_public)[0]
    public, secret = zmq.auth.load_certificate(client_secret)
    keypair = "zmq_curve_keypair(public_key, secret_key);"
    assert '"...";' in snippet and keypair in snippet and "tcp://arm-pc.local:5556" in snippet
    endpoints = Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", Curve(server_secret, str(clients)))
    with local_driver(load_model("generic6"), seed=7, endpoints=endpoints) as (d, _):
        as_written = snippet.replace('"..."', _c_string(server_key)).replace("tcp://arm-pc.local:5556",
                                                                          d.bound["commands"])
        with_keys = as_written.replace(keypair, f"strcpy(public_key, {_c_string(public)}); "
                                                f"strcpy(secret_key, {_c_string(secret)});")
        out = {}
        for name, code in (("authorised", with_keys), ("fresh pair", as_written)):
            src, exe = tmp_path / f"{name[0]}.c", tmp_path / name[0]
            src.write_text(_CURVE_MAIN.replace("SNIPPET", textwrap.indent(code, "    ")))
            build = subprocess.run([CC, "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", str(src), "-o",
                                    str(exe), *_libzmq_flags()], capture_output=True, text=True, timeout=120)
            assert build.returncode == 0, build.stderr
            out[name] = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    reply = json.loads(out["authorised"].stdout)
    assert out["authorised"].returncode == 0 and reply["ok"] and reply["joints"] == list(load_model("generic6").joint_names)
    assert out["fresh pair"].returncode == 1 and out["fresh pair"].stdout == "NO REPLY\n"
