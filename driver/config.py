"""The driver's TOML configuration (documented in docs/reference/driver-config.md; examples in deploy/).

    [driver]
    model = "generic6"          # shipped name, TOML or URDF path (relative paths: next to this file)
    rate_hz = 1000
    watchdog_ms = 10
    clock = "auto"              # auto | host | device (driver/cycle.py)
    effort_delay_ms = 0         # how late the drives' current/torque is against their positions (recorded
                                # with the data; identification aligns them): the simulator's is half a period
    trajectory_dir = "trajectories"  # the only folder run_trajectory {"file": ...} reads (relative: next to
                                # this file); without it, trajectories come inline ("samples")
    max_motion_s = 600          # the longest motion a command may plan (s)
    intake_share = 0.1          # of each period, the most the cycle spends on queued requests, and again on
                                # servo setpoints (0.01-0.5): a flood waits for the next cycles, counted

    [transport]
    name = "serial"             # sim | serial | can | gateway
    # ... the transport's own options (port, channel, interface, host, ...), passed as keywords

    [zmq]
    state = "tcp://127.0.0.1:5555"
    commands = "tcp://127.0.0.1:5556"
    [zmq.curve]                 # required when commands bind beyond loopback/ipc
    server_secret_file = "keys/server.key_secret"
    authorized_clients_dir = "keys/clients"

    [record]                    # optional: record the driver's own stream into MCAP while it runs
    path = "run.mcap"           # relative paths: next to this file
    chunk_seconds = 0.25
    overwrite = false

    [model]                     # optional: the observer's and feed-forward's model (driver/model_source.py)
    path = "ident-out/model.toml"   # what `armid identify --consistent` wrote, or a shipped name
    observer_gains = 100        # 1/s, one number or one per joint
    friction_smoothing = 0.01   # rad/s
    feed_forward = true         # plan the motions' torque feed-forward with this model
    feed_forward_friction = true    # with the model's friction (false: drives that compensate friction themselves)
    compensate = []             # torque servo: "gravity", "friction" added to the client's torque by default

    [collision]                 # optional: collision detection on (driver/collision.py)
    contact = [..]              # N m per joint (or one number); default: the rule from the residuals
    collision = [..]
    reaction = "quick_stop"     # quick_stop | stop_and_hold | back_off
    back_off_distance = 0.02    # rad: how far back_off yields (the most loaded joint), at most 0.2
    back_off_speed = 0.1        # rad/s: the fastest joint speed on the way, at most 1

    [realtime]                  # optional, all keys optional (driver/realtime.py, deploy/RT.md)
    priority = 80               # SCHED_FIFO 1-99 for `threads`
    threads = ["cycle", "zmq-io"]   # which: cycle | zmq-io (libzmq's I/O threads) | serial-link
    cpus = [3]                  # CPU affinity of those threads
    lock_memory = true          # mlockall(MCL_CURRENT | MCL_FUTURE)
    required = false            # true: a setting the OS refuses stops the driver (else: one warning)

A bad file gives one ConfigError naming the file, the field and what was expected.
"""
from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from driver.back_off import MAX_DISTANCE, MAX_SPEED
from driver.collision import REACTIONS, Watch
from driver.compensation import KINDS
from driver.cycle import CLOCKS, INTAKE_SHARE, INTAKE_SHARE_RANGE, LATE_AFTER_CYCLES, LATE_AFTER_RANGE
from driver.daemon import Curve, Endpoints, Metrics, Record
from driver.motion import MAX_MOTION_S
from driver.realtime import PRIORITY_RANGE, THREADS, Realtime
from firmware_bridge.runtime.errors import InputError


MAX_EFFORT_DELAY_MS = 100.0   # the bound ident.fit.preprocess.MAX_EFFORT_DELAY puts on a recording's effort delay
MAX_MOTION_LIMIT_S = 3600.0   # max_motion_s may not exceed this (an hour at 1 kHz: 3.6 M setpoints per joint)
RATE_RANGE_HZ = (1.0, 10_000.0)        # the cycle's rate: below 1 Hz nothing is controlled, above 10 kHz no link keeps up
MIN_WATCHDOG_PERIODS = 2               # a watchdog shorter than two periods fires on one late sample
MAX_WATCHDOG_MS = 10_000.0             # a silent link lets the arm move blind at most this long
CHUNK_RANGE_S = (0.001, 60.0)          # [record] chunk_seconds: the most a killed driver loses, held in memory


class ConfigError(InputError):
    def __init__(self, source: str, key: str, expected: str, got=None):
        got_text = "" if got is None else f", got {got!r}"
        super().__init__(f"{source}: {key}: expected {expected}{got_text}")


@dataclass(frozen=True)
class DriverConfig:
    model: str
    rate_hz: float
    watchdog_s: float
    transport: str
    transport_options: dict = field(default_factory=dict)
    endpoints: Endpoints = Endpoints()
    source: str = "<defaults>"
    clock: str = "auto"
    record: Record | None = None
    effort_delay_s: float = 0.0
    realtime: Realtime | None = None
    trajectory_dir: str | None = None
    max_motion_s: float = MAX_MOTION_S
    metrics: Metrics | None = None
    watch: Watch = Watch()
    intake_share: float = INTAKE_SHARE
    late_after_cycles: int = LATE_AFTER_CYCLES


_SECTIONS = {"driver": {"model", "rate_hz", "watchdog_ms", "clock", "effort_delay_ms", "trajectory_dir",
                        "max_motion_s", "intake_share",
                        "late_after_cycles"}, "transport": None,
             "zmq": {"state", "commands", "servo", "curve"}, "record": {"path", "chunk_seconds", "overwrite"},
             "realtime": {"priority", "threads", "cpus", "lock_memory", "required"},
             "metrics": {"address", "allow_remote"},
             "model": {"path", "observer_gains", "friction_smoothing", "feed_forward", "feed_forward_friction",
                       "compensate"},
             "collision": {"contact", "collision", "reaction", "back_off_distance", "back_off_speed"}}


def load_config(path: str | Path) -> DriverConfig:
    """Read and validate a driver config file."""
    path = Path(path)
    src = str(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{src}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{src}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{src}: not valid TOML: {exc}") from None
    for key in data:
        if key not in _SECTIONS:
            raise ConfigError(src, key, f"one of the sections {', '.join(_SECTIONS)}")
    for section, allowed in _SECTIONS.items():
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise ConfigError(src, section, "a table")
        if allowed is not None:
            for key in table:
                if key not in allowed:
                    raise ConfigError(src, f"{section}.{key}", f"one of {', '.join(sorted(allowed))}")
    drv, tr, zq = data.get("driver", {}), dict(data.get("transport", {})), data.get("zmq", {})

    model = drv.get("model", "generic6")
    if not isinstance(model, str) or not model:
        raise ConfigError(src, "driver.model", "a model name or path", model)
    if ("/" in model or model.endswith((".toml", ".urdf"))) and not Path(model).is_absolute():
        model = str((path.parent / model).resolve())
    rate = _within(src, "driver.rate_hz", drv.get("rate_hz", 1000.0), *RATE_RANGE_HZ, "Hz")
    watchdog = _within(src, "driver.watchdog_ms", drv.get("watchdog_ms", 10.0),
                       MIN_WATCHDOG_PERIODS * 1000.0 / rate, max(MAX_WATCHDOG_MS, MIN_WATCHDOG_PERIODS * 1000.0 / rate),
                       f"ms (at least {MIN_WATCHDOG_PERIODS} periods of rate_hz = {rate:g})") / 1000.0
    name = tr.pop("name", None)
    from driver.transports import TRANSPORTS, transport_options

    if name not in TRANSPORTS:
        raise ConfigError(src, "transport.name", f"one of {', '.join(sorted(TRANSPORTS))}", name)
    known, required = transport_options(name)
    for key in tr:
        if key not in known:
            raise ConfigError(src, f"transport.{key}", f"an option of the {name} transport: {', '.join(known)} "
                                                       "(this key is unknown)")
    for key in required:
        if key not in tr:
            raise ConfigError(src, f"transport.{key}", f"a value: the {name} transport needs it (missing)")
    endpoints = Endpoints(state=_endpoint(src, "zmq.state", zq.get("state", Endpoints.state)),
                          commands=_endpoint(src, "zmq.commands", zq.get("commands", Endpoints.commands)),
                          servo=None if "servo" not in zq else _endpoint(src, "zmq.servo", zq["servo"]),
                          curve=_curve(src, path.parent, zq.get("curve")))
    clock = drv.get("clock", "auto")
    if clock not in ("auto", *CLOCKS):
        raise ConfigError(src, "driver.clock", f"one of auto, {', '.join(CLOCKS)}", clock)
    delay = drv.get("effort_delay_ms", 0.0)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not abs(delay) <= MAX_EFFORT_DELAY_MS:
        raise ConfigError(src, "driver.effort_delay_ms", f"a number of ms within +-{MAX_EFFORT_DELAY_MS:g}", delay)
    trajectory_dir = None
    if "trajectory_dir" in drv:
        folder = (path.parent / _text(src, "driver.trajectory_dir", drv["trajectory_dir"])).resolve()
        if not folder.is_dir():
            raise InputError(f"{src}: driver.trajectory_dir: the folder {folder} does not exist; create it "
                             f"(mkdir {folder}) and put the trajectory files there, or remove the key (then "
                             f"run_trajectory takes presets and inline setpoints only)")
        trajectory_dir = str(folder)
    max_motion = _positive(src, "driver.max_motion_s", drv.get("max_motion_s", MAX_MOTION_S))
    if max_motion > MAX_MOTION_LIMIT_S:
        raise ConfigError(src, "driver.max_motion_s", f"at most {MAX_MOTION_LIMIT_S:g} s", max_motion)
    intake = _within(src, "driver.intake_share", drv.get("intake_share", INTAKE_SHARE), *INTAKE_SHARE_RANGE,
                     "of the period")
    late_after = drv.get("late_after_cycles", LATE_AFTER_CYCLES)
    if isinstance(late_after, bool) or not isinstance(late_after, int) or \
            not LATE_AFTER_RANGE[0] <= late_after <= LATE_AFTER_RANGE[1]:
        raise ConfigError(src, "driver.late_after_cycles",
                          "a whole number of cycles {}..{}".format(*LATE_AFTER_RANGE), late_after)
    return DriverConfig(model, rate, watchdog, name, tr, endpoints, src, clock,
                        _record(src, path.parent, data.get("record")), float(delay) / 1000.0,
                        _realtime(src, data.get("realtime")), trajectory_dir, max_motion,
                        _metrics(src, data.get("metrics")), _watch(src, path.parent, data), intake, late_after)


def _watch(src: str, base: Path, data: dict) -> Watch:
    """[model] and [collision]: their kinds here; the numbers against the model when the driver is built."""
    model, collision = data.get("model", {}), data.get("collision")
    path = model.get("path")
    if path is not None:
        path = _text(src, "model.path", path)
        if "/" in path or path.endswith((".toml", ".urdf")):
            path = str((base / path).resolve())
    gains = model.get("observer_gains", 100.0)
    if not (_is_number(gains) or (isinstance(gains, list) and gains and all(_is_number(g) for g in gains))):
        raise ConfigError(src, "model.observer_gains", "a number of 1/s or one per joint", gains)
    smoothing = _positive(src, "model.friction_smoothing", model.get("friction_smoothing", 0.01))
    feed_forward = model.get("feed_forward", True)
    if not isinstance(feed_forward, bool):
        raise ConfigError(src, "model.feed_forward", "true or false", feed_forward)
    friction = model.get("feed_forward_friction", True)
    if not isinstance(friction, bool):
        raise ConfigError(src, "model.feed_forward_friction", "true or false", friction)
    compensate = model.get("compensate", [])
    if not isinstance(compensate, list) or not all(k in KINDS for k in compensate):
        raise ConfigError(src, "model.compensate", f"a list of {', '.join(repr(k) for k in KINDS)} (or [])",
                          compensate)
    levels = {}
    for key in ("contact", "collision"):
        v = (collision or {}).get(key)
        if v is not None and not (_is_number(v) or (isinstance(v, list) and v and all(_is_number(x) for x in v))):
            raise ConfigError(src, f"collision.{key}", "a number of N m or one per joint", v)
        levels[key] = tuple(v) if isinstance(v, list) else v
    reaction = (collision or {}).get("reaction", "quick_stop")
    if reaction not in REACTIONS:
        raise ConfigError(src, "collision.reaction", f"one of {', '.join(REACTIONS)}", reaction)
    back = {}
    for key, top, unit in (("back_off_distance", MAX_DISTANCE, "rad"), ("back_off_speed", MAX_SPEED, "rad/s")):
        value = (collision or {}).get(key, getattr(Watch, key))
        back[key] = _positive(src, f"collision.{key}", value)
        if value > top:
            raise ConfigError(src, f"collision.{key}", f"a positive number at most {top:g} {unit}", value)
    return Watch(path, tuple(gains) if isinstance(gains, list) else gains, smoothing, feed_forward,
                 tuple(k for k in KINDS if k in compensate), collision is not None, levels["contact"],
                 levels["collision"], reaction, src, **back, feed_forward_friction=friction)


def _is_number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _metrics(src: str, table) -> Metrics | None:
    """[metrics]: the address is checked here (host:port, loopback unless allow_remote)."""
    if table is None:
        return None
    from driver.metrics import DEFAULT_ADDRESS, parse_address

    address = _text(src, "metrics.address", table.get("address", DEFAULT_ADDRESS))
    allow = table.get("allow_remote", False)
    if not isinstance(allow, bool):
        raise ConfigError(src, "metrics.allow_remote", "true or false", allow)
    try:
        parse_address(address, allow)
    except InputError as exc:
        raise InputError(f"{src}: {exc}") from None
    return Metrics(address, allow)


def _realtime(src: str, table: dict | None) -> Realtime | None:
    if table is None:
        return None
    lo, hi = PRIORITY_RANGE
    priority = table.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int) or not lo <= priority <= hi):
        raise ConfigError(src, "realtime.priority", f"a SCHED_FIFO priority, an integer {lo}..{hi}", priority)
    threads = table.get("threads", list(Realtime.threads))
    if not isinstance(threads, list) or not threads or any(t not in THREADS for t in threads) \
            or len(set(threads)) != len(threads):
        raise ConfigError(src, "realtime.threads", f"a list of distinct thread names among {', '.join(THREADS)}",
                          threads)
    cpus = table.get("cpus")
    if cpus is not None:
        count = os.cpu_count() or 1
        if not isinstance(cpus, list) or not cpus or len(set(cpus)) != len(cpus) or \
                any(isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < count for c in cpus):
            raise ConfigError(src, "realtime.cpus", f"a list of distinct CPU numbers 0..{count - 1} "
                                                    f"(this machine has {count})", cpus)
    flags = {}
    for key in ("lock_memory", "required"):
        flags[key] = table.get(key, False)
        if not isinstance(flags[key], bool):
            raise ConfigError(src, f"realtime.{key}", "true or false", flags[key])
    return Realtime(priority, tuple(threads), None if cpus is None else tuple(cpus), **flags)


def _record(src: str, base: Path, table: dict | None) -> Record | None:
    if table is None:
        return None
    if "path" not in table:
        raise ConfigError(src, "record.path", "the MCAP file to write")
    chunk = _within(src, "record.chunk_seconds", table.get("chunk_seconds", 0.25), *CHUNK_RANGE_S, "s")
    overwrite = table.get("overwrite", False)
    if not isinstance(overwrite, bool):
        raise ConfigError(src, "record.overwrite", "true or false", overwrite)
    target = (base / _text(src, "record.path", table["path"])).resolve()
    if target.is_dir():
        raise ConfigError(src, "record.path", f"the MCAP file to write, not a directory ({target} is one)",
                          table["path"])
    return Record(str(target), chunk, overwrite)


def _positive(src: str, key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(src, key, "a positive number", value)
    return float(value)


def _within(src: str, key: str, value, lo: float, hi: float, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise ConfigError(src, key, f"a number {lo:g}..{hi:g} {unit}", value)
    return float(value)


def _endpoint(src: str, key: str, value) -> str:
    """A ZeroMQ endpoint the daemon can bind: tcp://HOST:PORT (PORT or *), ipc://PATH or inproc://NAME."""
    text = _text(src, key, value)
    scheme, sep, rest = text.partition("://")
    port = rest.rpartition(":")[2]
    if not sep or not rest or scheme not in ("tcp", "ipc", "inproc") or \
            (scheme == "tcp" and not (port == "*" or (port.isdigit() and 0 < int(port) < 65536))):
        raise ConfigError(src, key, "a ZeroMQ endpoint tcp://HOST:PORT, ipc://PATH or inproc://NAME", value)
    return text


def _text(src: str, key: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(src, key, "a string", value)
    return value


def _curve(src: str, base: Path, table) -> Curve | None:
    if table is None:
        return None
    if not isinstance(table, dict) or set(table) != {"server_secret_file", "authorized_clients_dir"}:
        raise ConfigError(src, "zmq.curve", "a table with server_secret_file and authorized_clients_dir")
    paths = {k: str((base / _text(src, f"zmq.curve.{k}", v)).resolve()) for k, v in table.items()}
    return Curve(**paths)
