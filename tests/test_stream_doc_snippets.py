"""docs/reference/stream.md's CURVE client, run as the page writes it: its key-making snippet in a fresh folder, a driver
(the in-process simulator) secured by the files its config snippet names, and its Python client against that
driver, on loopback. A key that is not in the authorised folder gets no answer. The page's state table is the
definition's layout."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import zmq.auth

from armid.client import ArmClient, NoReply
from driver.daemon import Curve, Endpoints
from firmware_bridge import stream
from ident.model import load_model
from local_driver import local_driver

DOC = Path(__file__).resolve().parents[1] / "docs" / "reference" / "stream.md"


def _blocks(section: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block in the section of docs/reference/stream.md headed `section`."""
    text = DOC.read_text().split(f"\n## {section}\n")[1].split("\n## ")[0]
    return re.findall(r"```(\w+)\n(.*?)```", text, re.S)


def test_the_documented_curve_client_is_answered_by_a_driver_with_the_documented_keys(tmp_path, monkeypatch, capsys):
    blocks = _blocks("A CURVE client")
    python = [code for lang, code in blocks if lang == "python"]
    config = [code for lang, code in blocks if lang == "toml"]
    assert len(python) == 2 and len(config) == 1
    monkeypatch.chdir(tmp_path)
    exec(compile(python[0], "docs/reference/stream.md", "exec"), {})                     # the keys
    table = tomllib.loads(config[0])["zmq"]["curve"]
    curve = Curve(**{k: str(tmp_path / v) for k, v in table.items()})        # relative: next to the config
    with local_driver(load_model("generic6"), seed=6, endpoints=Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*",
                                                                         curve)) as (d, _):
        client = python[1]
        for host, bound in (("tcp://arm-pc.local:5555", d.bound["state"]), ("tcp://arm-pc.local:5556",
                                                                              d.bound["commands"])):
            assert host in client
            client = client.replace(host, bound)
        capsys.readouterr()
        exec(compile(client, "docs/reference/stream.md", "exec"), {})
        assert capsys.readouterr().out == "False\n"                          # status answered: not enabled
        zmq.auth.create_certificates(tmp_path, "stranger")
        with ArmClient(d.bound["state"], d.bound["commands"], timeout_s=0.5, retries=0,
                       curve_server_public="keys/server.key", curve_client_secret="stranger.key_secret") as other:
            with pytest.raises(NoReply):
                other.status()


_DOC_TYPES = {"char[4]": "S4", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "int64": "<i8", "float64[n]": "<f8",
              "uint16[n]": "<u2", "int8[n]": "i1"}


def test_the_documented_state_table_is_the_definitions_layout():
    """Every row of the page's state table (offset, type, name) against firmware_bridge.stream's tables."""
    text = DOC.read_text().split("\n## Topic `state`")[1].split("\n## ")[0]
    rows = re.findall(r"^\| (\d+(?: \+ \d*n)?) +\| (\S+) +\| (\w+) +\|", text, re.M)
    fields = stream.HEADER_FIELDS + stream.JOINT_FIELDS
    assert [name for _, _, name in rows] == [f.name for f in fields]
    for (offset, ctype, name), field in zip(rows, fields):
        assert _DOC_TYPES[ctype] == field.dtype, name
        base, _, per_joint = offset.partition(" + ")
        for n in (1, 6, 7):
            k = int(per_joint[:-1] or 1) if per_joint else 0
            want = stream.HEADER_OFFSETS[name] if field in stream.HEADER_FIELDS else stream.joint_offset(name, n)
            assert int(base) + k * n == want, (name, n)
    assert f"Size: {stream.HEADER_SIZE} + {stream.JOINT_SIZE} n bytes ({stream.message_size(6)} for six joints)" in text
