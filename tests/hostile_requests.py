"""A corpus of hostile and careless command requests, for the tests that fire them at a live driver.

`CASES` holds named requests with what the reply must say; `hostile_requests(n, count, seed)` yields
`count` requests (bytes) drawn from every family below, deterministic for a seed. Extend either: add a case
to CASES, or a family to FAMILIES (a function rng, n -> bytes).
"""
from __future__ import annotations

import json
import random

COMMANDS = ("status", "enable", "disable", "quick_stop", "fault_reset", "move_to", "run_trajectory", "set_payload")

# numbers and values that must never become a setpoint
BAD_NUMBERS = ["1e400", "-1e400", "NaN", "Infinity", "-Infinity", "1e-400", "5e-324", "1e308", "-1e308",
               "9" * 5000, "-" + "9" * 30, "1" + "0" * 19, "0.0", "-0.0", "1e300", "1e-300"]
BAD_VALUES = ['null', 'true', 'false', '"x"', '""', '[]', '{}', '[[]]', '"\\u0000"', '"\\ud800"',
              '[1, 2]', '{"a": 1}', '"' + "a" * 5000 + '"'] + BAD_NUMBERS

# (name, request bytes, text the error reply must contain)
CASES: list[tuple[str, bytes, str]] = [
    ("deep list", b"[" * 1000 + b"]" * 1000, "nested 1000 deep"),
    ("deeper dict", b'{"a":' * 50000 + b"1" + b"}" * 50000, "nested 50000 deep"),
    ("5000-digit integer", b'{"cmd": "status", "x": ' + b"9" * 5000 + b"}", "integer of 5000 digits"),
    ("q of 10**400", b'{"cmd": "move_to", "q": [1' + b"0" * 400 + b', 0, 0, 0, 0, 0]}', "integer of 401 digits"),
    ("q of 1e400", b'{"cmd": "move_to", "q": [1e400, 0, 0, 0, 0, 0]}', "not finite"),
    ("NaN", b'{"cmd": "move_to", "q": [NaN, 0, 0, 0, 0, 0]}', "NaN is not a number JSON allows"),
    ("speed 1e-300", b'{"cmd": "move_to", "q": [0.1, 0, 0, 0, 0, 0], "speed": 1e-300}', "bound on a motion"),
    ("speed 5e-324", b'{"cmd": "move_to", "q": [0.1, 0, 0, 0, 0, 0], "speed": 5e-324}', "bound on a motion"),
    ("speed 1e-6", b'{"cmd": "move_to", "q": [0.1, 0, 0, 0, 0, 0], "speed": 1e-6}', "bound on a motion"),
    ("speed 2", b'{"cmd": "move_to", "q": [0.1, 0, 0, 0, 0, 0], "speed": 2}', "expected 0 < speed <= 1"),
    ("t to 1e300", b'{"cmd": "run_trajectory", "samples": {"t": [0, 1e300], "q": [[0,0,0,0,0,0],[0.1,0,0,0,0,0]]}}',
     "bound on a motion"),
    ("t backwards", b'{"cmd": "run_trajectory", "samples": {"t": [1, 0], "q": [[0,0,0,0,0,0],[0.1,0,0,0,0,0]]}}',
     "not strictly increasing"),
    ("periods 1e300", b'{"cmd": "run_trajectory", "file": "t.toml", "periods": 1e300}', "periods"),
    ("periods 1e-300", b'{"cmd": "run_trajectory", "file": "t.toml", "periods": 1e-300}', ""),
    ("file with NUL", b'{"cmd": "run_trajectory", "file": "a\\u0000b"}', "file"),
    ("file outside", b'{"cmd": "run_trajectory", "file": "../../../../etc/passwd"}', "file"),
    ("absolute file", b'{"cmd": "run_trajectory", "file": "/etc/passwd"}', "file"),
    ("device file", b'{"cmd": "run_trajectory", "file": "/dev/zero"}', "file"),
    ("50 kg payload", b'{"cmd": "set_payload", "mass": 50}', "rated payload"),
    ("1e308 kg payload", b'{"cmd": "set_payload", "mass": 1e308}', "rated payload"),
    ("negative mass", b'{"cmd": "set_payload", "mass": -2}', "mass"),
    ("far CoM", b'{"cmd": "set_payload", "mass": 1, "com": [100, 0, 0]}', "reach"),
    ("non-physical inertia", b'{"cmd": "set_payload", "mass": 1, "inertia": [-1, 0, 0, 1, 0, 1]}', "not a physical body"),
    ("not UTF-8", b"\xff\xfe\xfd", "not UTF-8"),
    ("empty", b"", "not JSON"),
    ("a list", b"[1, 2]", '"cmd" string'),
    ("unknown command", b'{"cmd": "fly"}', "unknown command"),
    ("unknown field", b'{"cmd": "move_to", "q": [0, 0, 0, 0, 0, 0], "sped": 1}', "unknown field"),
    ("cmd not a string", b'{"cmd": 1}', '"cmd" string'),
]


def _request(cmd: str, **fields) -> bytes:
    body = ", ".join(f'"{k}": {v}' for k, v in fields.items())
    return ('{"cmd": "%s"%s}' % (cmd, ", " + body if body else "")).encode()


def _random_bytes(rng: random.Random, n: int) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 300)))


def _deep(rng: random.Random, n: int) -> bytes:
    k = rng.choice([7, 50, 1000, 20000])
    open_, close = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
    inner = b"1" if open_ != b"[" else b""
    return b'{"cmd": "move_to", "q": ' + open_ * k + inner + close * k + b"}"


def _bad_number(rng: random.Random, n: int) -> bytes:
    x = rng.choice(BAD_NUMBERS)
    field = rng.choice(["q", "speed", "mass", "com", "inertia", "periods", "t"])
    cmd = {"q": "move_to", "speed": "move_to", "mass": "set_payload", "com": "set_payload",
           "inertia": "set_payload", "periods": "run_trajectory", "t": "run_trajectory"}[field]
    if field == "q":
        row = [x if j == rng.randrange(n) else "0" for j in range(n)]
        return _request(cmd, q="[" + ", ".join(row) + "]")
    if field == "t":
        return _request(cmd, samples='{"t": [0, %s], "q": [%s, %s]}' % (x, [0] * n, [0.1] * n))
    if field in ("com", "inertia"):
        size = 3 if field == "com" else 6
        return _request(cmd, mass="1", **{field: "[" + ", ".join([x] + ["0"] * (size - 1)) + "]"})
    if field == "periods":
        return _request(cmd, file='"t.toml"', periods=x)
    return _request(cmd, **({field: x} if field != "speed" else {"q": str([0.05] * n), "speed": x}))


def _wrong_type(rng: random.Random, n: int) -> bytes:
    cmd = rng.choice(COMMANDS)
    field = rng.choice(["q", "speed", "mass", "com", "inertia", "periods", "file", "samples", "cmd", "x"])
    value = rng.choice(BAD_VALUES)
    if field == "cmd":
        return ('{"cmd": %s}' % value).encode()
    return _request(cmd, **{field: value})


def _out_of_range(rng: random.Random, n: int) -> bytes:
    choice = rng.randrange(8)
    if choice == 0:
        return _request("move_to", q=str([rng.uniform(-50, 50) for _ in range(n)]), speed=str(rng.uniform(-1, 2)))
    if choice == 1:
        return _request("move_to", q=str([0.0] * rng.choice([0, 1, n - 1, n + 1, 1000])))
    if choice == 2:
        k = rng.choice([1, 2, 3])
        t = sorted(rng.uniform(-1e6, 1e6) for _ in range(k))
        return _request("run_trajectory", samples=json.dumps({"t": t, "q": [[rng.uniform(-9, 9)] * n] * k}))
    if choice == 3:
        return _request("run_trajectory", file=json.dumps(rng.choice(
            ["../x.toml", "/", ".", "", "a/../../b", "/proc/self/mem", "/dev/stdin", "x" * 5000, "~/.ssh/id_rsa"])))
    if choice == 4:
        return _request("set_payload", mass=str(rng.choice([50, 1e6, 3.5, -1e-9])),
                        com=str([rng.uniform(-1e3, 1e3) for _ in range(3)]))
    if choice == 5:
        return _request("run_trajectory", samples=json.dumps({"t": [0, 1], "q": [[0] * n]}))
    if choice == 6:
        return _request("run_trajectory", file='"t.toml"', samples='{"t": [], "q": []}')
    return _request(rng.choice(COMMANDS), **{f"extra{rng.randrange(3)}": "1"})


def _mutated(rng: random.Random, n: int) -> bytes:
    base = bytearray(_request("move_to", q=str([0.1] * n), speed="0.5"))
    for _ in range(rng.randint(1, 4)):
        k = rng.randrange(len(base))
        op = rng.randrange(3)
        if op == 0:
            base[k] = rng.getrandbits(8)
        elif op == 1:
            del base[k]
        else:
            base.insert(k, rng.getrandbits(8))
    return bytes(base)


def _case(rng: random.Random, n: int) -> bytes:
    return rng.choice(CASES)[1]


FAMILIES = [_random_bytes, _deep, _bad_number, _wrong_type, _out_of_range, _mutated, _case]


def hostile_requests(n: int, count: int, seed: int = 0):
    """`count` hostile requests for an arm of n joints, every family in turn (deterministic for a seed)."""
    rng = random.Random(seed)
    for k in range(count):
        yield FAMILIES[k % len(FAMILIES)](rng, n)
