"""The transports' options, declared once (firmware_bridge.runtime.options): one error style for every option of
every transport, the names a config may give taken from the declaration, and the tables of
docs/reference/driver-config.md equal to the tables the declarations make, so the page cannot drift."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from driver.transports import TRANSPORTS, options_table, transport_class
from firmware_bridge.runtime.errors import InputError
from firmware_bridge.runtime.options import Option, OptionSet
from sim.device_contract import device_class, registered

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "driver-config.md"
BLOCK = re.compile(r"<!-- options of (\w+) -->\n(.*?)<!-- end of options -->", re.S)

SPEC = OptionSet(
    "demo",
    Option("port", "text", required=True, what="a device path"),
    Option("baudrate", "integer", 3_000_000, low=50, high=100_000_000, unit="bit/s"),
    Option("timeout_s", "number", 0.5, low=0, above=True, unit="s"),
    Option("bitrate", "integer", None, low=10_000, high=1_000_000, nullable=True),
    Option("ids", "integers", None, low=1, high=127, nullable=True),
    Option("fast", "flag", False),
    Option("channel", "text or integer", "can0"))


def tables(text: str) -> dict[str, str]:
    """{transport: its table} of the page's generated blocks."""
    return {name: table for name, table in BLOCK.findall(text)}


def test_every_transports_table_on_the_page_is_made_from_its_declaration():
    page = tables(PAGE.read_text())
    assert set(page) == set(TRANSPORTS), "a transport without its options table in docs/reference/driver-config.md"
    for name in TRANSPORTS:
        assert page[name] == options_table(name), f"driver-config.md: the {name} table is stale; it is:\n" \
                                                   f"{options_table(name)}"


def test_a_stale_table_is_found():
    text = PAGE.read_text()
    stale = text.replace("| `baudrate` |", "| `baud_rate` |", 1)
    assert stale != text and tables(stale)["serial"] != options_table("serial")


@pytest.mark.parametrize("given, message", [
    ({}, "demo: option 'port': expected a device path, got nothing (it is required)"),
    ({"port": " "}, "demo: option 'port': expected a device path, got ' '"),
    ({"port": "x", "baudrate": "fast"}, "demo: option 'baudrate': expected an integer of bit/s in 50..100000000, "
                                        "got 'fast'"),
    ({"port": "x", "baudrate": 9600.0}, "option 'baudrate': expected an integer of bit/s in 50..100000000, got 9600.0"),
    ({"port": "x", "baudrate": True}, "option 'baudrate': expected an integer"),
    ({"port": "x", "baudrate": 49}, "got 49"),
    ({"port": "x", "timeout_s": 0}, "option 'timeout_s': expected a number of s above 0, got 0"),
    ({"port": "x", "timeout_s": float("nan")}, "option 'timeout_s': expected a number of s above 0, got nan"),
    ({"port": "x", "bitrate": 5}, "option 'bitrate': expected an integer in 10000..1000000 or none, got 5"),
    ({"port": "x", "ids": [1, 128]}, "option 'ids': expected a list of integers in 1..127 or none, got [1, 128]"),
    ({"port": "x", "fast": "yes"}, "option 'fast': expected true or false, got 'yes'"),
    ({"port": "x", "channel": 1.5}, "option 'channel': expected text or an integer, got 1.5"),
    ({"port": "x", "speed": 3}, "demo: unknown option 'speed' (options: port, baudrate, timeout_s, bitrate, ids, "
                                "fast, channel)"),
])
def test_bad_input_gets_one_message_naming_the_option_and_what_it_takes(given, message):
    with pytest.raises(InputError) as err:
        SPEC.parse(given)
    assert message in str(err.value)


def test_good_input_is_parsed_and_the_rest_defaulted():
    got = SPEC.parse({"port": " /dev/x ", "baudrate": 115200, "ids": [1, 2], "bitrate": None, "channel": 0})
    assert got == {"port": "/dev/x", "baudrate": 115200, "timeout_s": 0.5, "bitrate": None, "ids": [1, 2],
                   "fast": False, "channel": 0}
    assert got.baudrate == 115200
    assert SPEC.names[:2] == ("port", "baudrate") and SPEC.required == ("port",)


def test_every_transport_takes_its_names_from_its_declaration_and_refuses_the_rest():
    for cls in [transport_class(n) for n in TRANSPORTS] + [device_class(n) for n in registered()]:
        spec = cls.OPTION_SPEC
        assert all(name in spec.names for name in getattr(cls, "OPTIONS", spec.in_config))
        if hasattr(cls, "OPTIONS"):
            assert cls.OPTIONS == spec.in_config and cls.REQUIRED_OPTIONS == spec.required
    with pytest.raises(InputError, match=r"^serial device: option 'state_queue': expected an integer in 1\.\.256, "
                                         r"got 0$"):
        device_class("serial")(state_queue=0)
