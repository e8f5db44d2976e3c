"""Logging: `armid --log-level/--log-format` (armid/logs.py), JSON lines for journald with PRIORITY, the
third-party loggers at WARNING, and rate-limited lines for floods (firmware_bridge/runtime/log_throttle.py), checked
in-process and on `armid driver` / `armid sim` running as processes."""
from __future__ import annotations

import json
import logging
import logging.handlers
import os
import signal
import subprocess
import sys
import select
import time
from datetime import datetime
from pathlib import Path

import dask
import distributed
import numpy as np
import pytest
import zmq
from distributed.config import initialize_logging

from armid import logs
from driver import command_server
from driver.transports import serial_link
from firmware_bridge.runtime import log_throttle
from firmware_bridge import stream
from firmware_bridge.runtime.errors import InputError
from firmware_bridge.runtime.log_throttle import Throttle
from ident.model import load_model
from sim import Simulator
from sim.serial_device import SerialDevice
from waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
PRIORITY = {"DEBUG": 7, "INFO": 6, "WARNING": 4, "ERROR": 3, "CRITICAL": 2}


# -- in-process: the set-up and the throttle ------------------------------------------------------------
@pytest.fixture
def configured():
    """configure() for one test; then shutdown(), which must give every logger its level back."""
    names = ("", *logs.THIRD_PARTY)
    before = [logging.getLogger(name or None).level for name in names]
    yield logs.configure
    logs.shutdown()
    assert [logging.getLogger(name or None).level for name in names] == before
    assert not any(isinstance(h, logging.handlers.QueueHandler) for h in logging.getLogger().handlers)


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


def test_json_lines_carry_time_level_logger_message_priority_and_extra_fields(configured, tmp_path):
    out = tmp_path / "log"
    with open(out, "w") as stream_:
        assert configured("INFO", "json", stream=stream_, environ={}) == (logging.INFO, "json")
        logging.getLogger("driver.cycle").error("drive %d faulted", 3, extra={"joint": 3, "error_code": "0x7305"})
        logging.getLogger("driver.cycle").debug("not at INFO")
        logging.getLogger("sim.serial_device").warning("refused")
        logs.shutdown()
    first, second = (json.loads(line) for line in _lines(out))
    assert list(first)[:4] == ["time", "level", "logger", "message"]
    assert first["level"] == "ERROR" and first["logger"] == "driver.cycle" and first["message"] == "drive 3 faulted"
    assert first["PRIORITY"] == 3 and first["joint"] == 3 and first["error_code"] == "0x7305"
    assert abs(datetime.fromisoformat(first["time"]).timestamp() - time.time()) < 60    # ISO 8601 with its zone
    assert (second["level"], second["PRIORITY"], second["logger"]) == ("WARNING", 4, "sim.serial_device")


@pytest.mark.parametrize("level", ["INFO", "WARNING", "DEBUG"])
def test_python_can_and_canopen_go_through_the_same_handler_at_warning_unless_debug(configured, tmp_path, level):
    out = tmp_path / "log"
    with open(out, "w") as stream_:
        configured(level, "json", stream=stream_, environ={})
        for name in ("can", "can.interfaces.udp_multicast", "canopen.sdo", "driver.daemon"):
            for lvl in ("debug", "info", "warning"):
                getattr(logging.getLogger(name), lvl)(f"{name} {lvl}")
        logs.shutdown()
    got = {json.loads(line)["message"] for line in _lines(out)}
    for name in ("can", "can.interfaces.udp_multicast", "canopen.sdo"):
        assert f"{name} warning" in got
        assert (f"{name} info" in got) == (level == "DEBUG")
        assert (f"{name} debug" in got) == (level == "DEBUG")
    assert ("driver.daemon info" in got) == (level != "WARNING")
    assert ("driver.daemon debug" in got) == (level == "DEBUG")


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_a_dask_cluster_logs_nothing_below_warning_unless_debug(configured, tmp_path, level):
    out = tmp_path / "log"
    with open(out, "w") as stream_:
        configured(level, "text", stream=stream_, environ={})
        initialize_logging(dask.config.config)      # what importing distributed does: its loggers back to INFO
        try:
            with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                          dashboard_address=None) as cluster, distributed.Client(cluster) as client:
                assert client.submit(sum, [1, 2]).result(timeout=30) == 3
                logging.getLogger("distributed.scheduler").warning("a warning passes")
        finally:
            logs.shutdown()
    lines = [line for line in _lines(out) if " distributed." in line]
    assert any("a warning passes" in line for line in lines)
    below = [line for line in lines if " INFO distributed." in line or " DEBUG distributed." in line]
    assert bool(below) == (level == "DEBUG"), below


def test_level_and_format_resolve_from_option_then_environment_and_a_bad_level_is_named():
    assert logs.resolve_level(None, {}) == logging.INFO
    assert logs.resolve_level(None, {"ARMID_LOG_LEVEL": "warning"}) == logging.WARNING
    assert logs.resolve_level("ERROR", {"ARMID_LOG_LEVEL": "DEBUG"}) == logging.ERROR
    with pytest.raises(InputError, match="ARMID_LOG_LEVEL='loud': expected one of DEBUG, INFO"):
        logs.resolve_level(None, {"ARMID_LOG_LEVEL": "loud"})
    master, slave = os.openpty()
    try:
        with open(slave, "w", closefd=False) as tty:
            assert logs.resolve_format(None, tty, {"JOURNAL_STREAM": "1:2"}) == "text"     # a terminal
    finally:
        os.close(master)
        os.close(slave)
    with open(os.devnull, "w") as pipe:
        assert logs.resolve_format(None, pipe, {"JOURNAL_STREAM": "1:2"}) == "json"
        assert logs.resolve_format(None, pipe, {}) == "text"
        assert logs.resolve_format("text", pipe, {"JOURNAL_STREAM": "1:2"}) == "text"


def test_the_armid_command_refuses_a_bad_level_in_one_line():
    run = subprocess.run([sys.executable, "-m", "armid.cli", "--log-level", "LOUD", "model", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--log-level: invalid choice: 'LOUD'" in run.stderr
    env = {**os.environ, "ARMID_LOG_LEVEL": "loud"}
    run = subprocess.run([sys.executable, "-m", "armid.cli", "model", "show", "generic6"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.splitlines() == ["armid: ARMID_LOG_LEVEL='loud': expected one of DEBUG, INFO, WARNING, ERROR, "
                                       "CRITICAL"]


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_flood_gives_the_first_line_then_one_per_interval_with_the_count(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(log_throttle.time, "monotonic", clock)
    records: list[logging.LogRecord] = []
    logger = logging.getLogger("test.throttle")
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        t = Throttle(logger, logging.WARNING, interval_s=5.0)
        hits = [t.hit("frame dropped (%s)", "crc", port="/dev/x") for _ in range(1000)]
        assert hits.count(True) == 1 and hits[0]
        clock.now += 4.9
        assert not t.hit("frame dropped (%s)", "cobs", count=7)
        clock.now += 0.2
        assert t.hit("frame dropped (%s)", "crc")
        for _ in range(41):
            t.hit("frame dropped (%s)", "length")
        assert t.flush() and not t.flush()             # the rest once, then nothing is left
        counts = [r.count for r in records]
        assert counts == [1, 999 + 7 + 1, 41] and sum(counts) == t.total == 1049
        assert [r.total for r in records] == [1, 1008, 1049]
        assert records[0].getMessage() == "frame dropped (crc) (1 since the last line, 1 in all)"
        assert records[-1].getMessage() == "frame dropped (length) (41 since the last line, 1049 in all)"
        assert records[0].port == "/dev/x" and all(r.levelno == logging.WARNING for r in records)
        logger.setLevel(logging.ERROR)                   # disabled: counted, no record built
        t.hit("frame dropped (%s)", "crc")
        clock.now += 10
        t.hit("frame dropped (%s)", "crc")
        assert len(records) == 3 and t.total == 1051
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


# -- `armid driver --log-format json` on the simulator's serial device -------------------------------------
def _client(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def _call(sock: zmq.Socket, timeout_s: float = 120.0, **request) -> dict:
    sock.send(json.dumps(request).encode())
    assert sock.poll(int(timeout_s * 1000)), f"no reply to {request}"
    return json.loads(sock.recv())


def _health(sub: zmq.Socket, timeout_s: float = 5.0) -> dict:
    while sub.poll(0):
        sub.recv_multipart()
    assert sub.poll(int(timeout_s * 1000)), "no health message"
    return json.loads(sub.recv_multipart()[1])


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(10)


def _enable(cmd: zmq.Socket) -> None:
    """enable, after a fault_reset when a fault is there (a loaded machine's start can trip the watchdog); the
    first enable may load the feed-forward kernel past the request's timeout."""
    for _ in range(5):
        if _call(cmd, cmd="status")["fault"] is not None:
            assert _call(cmd, cmd="fault_reset")["ok"]
            time.sleep(0.6)                              # past the cycle's fault-reset grace
        if _call(cmd, cmd="enable")["ok"]:
            return
    pytest.fail(f"enable refused 5 times: {_call(cmd, cmd='status')}")


def _powered(sim) -> np.ndarray:
    return (sim.read_state().statusword & 0x6F) == 0x27


def test_the_driver_logs_json_refusals_faults_and_a_bad_frame_flood_rate_limited(tmp_path):
    model = load_model("generic6")
    dev = SerialDevice(watchdog_s=0.5)
    sim = Simulator(model, transport=dev, realtime=True, seed=5)
    sim.start()
    state, commands = f"ipc://{tmp_path}/state", f"ipc://{tmp_path}/commands"
    cfg = tmp_path / "driver.toml"
    cfg.write_text(f'[driver]\nmodel = "generic6"\nwatchdog_ms = 1000\n'
                   f'[transport]\nname = "serial"\nport = "{dev.path}"\nreconnect_s = 0.1\ndevice_watchdog_ms = 500\n'
                   f'[zmq]\nstate = "{state}"\ncommands = "{commands}"\n')
    err = tmp_path / "driver.err"
    env = {k: v for k, v in os.environ.items() if k not in ("ARMID_LOG_LEVEL", "JOURNAL_STREAM")}
    with open(err, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "armid.cli", "driver", "--config", str(cfg),
                                 "--log-format", "json"], cwd=ROOT, stderr=f, stdout=subprocess.DEVNULL, env=env)
    cmd = _client(commands)
    health = zmq.Context.instance().socket(zmq.SUB)
    health.setsockopt(zmq.LINGER, 0)
    health.connect(state)
    health.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_HEALTH)
    try:
        assert _call(cmd, cmd="status")["ok"]
        # refused commands: a client sending 40 bad ones gets 40 error replies, the log a few lines
        started = time.monotonic()
        for _ in range(40):
            assert not _call(cmd, cmd="no_such_command")["ok"]
        refusal_s = time.monotonic() - started
        # a drive fault, on enabled drives
        _enable(cmd)
        assert wait_until(lambda: _powered(sim).all(), 20)
        sim.faults.drive_fault(2, 0x7305)
        assert wait_until(lambda: _call(cmd, cmd="status")["fault"] is not None, 10)
        # a flood of frames with a bad CRC (every fourth: samples still come, the watchdog holds)
        before = _health(health)["link"]["rx"]["crc"]
        flood_started = time.monotonic()
        sim.faults.set_frame_faults(bad_crc=0.25)
        assert wait_until(lambda: _health(health)["link"]["rx"]["crc"] - before > 300, 30)
        sim.faults.set_frame_faults(bad_crc=0.0)
        flood_s = time.monotonic() - flood_started
        dropped = _health(health)["link"]["rx"]["crc"]
    finally:
        cmd.close(0)
        health.close(0)
        code = _stop(proc)
        sim.stop()
    assert code == 0, err.read_text()[-3000:]
    records = [json.loads(line) for line in _lines(err)]            # every line is one JSON object
    for r in records:
        assert {"time", "level", "logger", "message", "PRIORITY"} <= set(r), r
        assert r["PRIORITY"] == PRIORITY[r["level"]], r

    def of(logger: str, level: str, text: str) -> list[dict]:
        return [r for r in records if r["logger"] == logger and r["level"] == level and text in r["message"]]

    started_lines = of("driver.daemon", "INFO", "state on ipc://")
    assert len(started_lines) == 1 and started_lines[0]["endpoints"]["commands"] == commands
    assert of("driver.transports.serial_link", "INFO", f"serial port {dev.path} opened")
    refused = of("driver.command_server", "WARNING", "command refused: ")
    assert refused and "no_such_command" in refused[0]["error"]
    assert len(refused) <= 2 + refusal_s / command_server.REFUSAL_LOG_INTERVAL_S
    assert sum(r["count"] for r in refused) == refused[-1]["total"] >= 40      # the rest flushed at the stop
    fault = of("driver.cycle", "ERROR", "fault: drive 3 faulted (error code 0x7305)")
    assert len(fault) == 1 and fault[0]["joint"] == 3 and fault[0]["error_code"] == "0x7305"
    assert of("driver.cycle", "ERROR", "quick stop: drive 3 faulted")
    frames = of("driver.transports.serial_link", "ERROR", "FAULT frame: joint 3, error code 0x7305")
    assert frames and frames[0]["joint"] == 3
    bad = of("driver.transports.serial_link", "WARNING", "bad frames dropped")
    assert 1 <= len(bad) <= 3 + flood_s / serial_link.TROUBLE_LOG_INTERVAL_S, [b["message"] for b in bad]
    assert sum(b["count"] for b in bad) == bad[-1]["total"] >= dropped - before    # the last line flushed at close
    assert "by reason: crc " in bad[-1]["message"]
    assert of("armid.commands.driver", "INFO", "stopped")


# -- `armid sim`: the level from the environment or the option, journald's priority prefix ---------------
def _run_sim(tmp_path: Path, name: str, *options: str, env_extra: dict) -> list[str]:
    """`armid [options] sim --transport serial` until it is ready, then SIGTERM; its stderr lines. Its stderr
    is a file whose device and inode JOURNAL_STREAM names when env_extra asks for "journal"."""
    err = tmp_path / f"{name}.err"
    err.touch()
    st = os.stat(err)
    env = {k: v for k, v in os.environ.items() if k not in ("ARMID_LOG_LEVEL", "JOURNAL_STREAM")}
    env.update({k: (f"{st.st_dev}:{st.st_ino}" if v == "journal" else v) for k, v in env_extra.items()})
    with open(err, "w") as fe:
        proc = subprocess.Popen([sys.executable, "-m", "armid.cli", *options, "sim", "--transport", "serial",
                                 "--control", "off"], cwd=ROOT, stdout=subprocess.PIPE, stderr=fe, text=True, env=env)
    try:
        out = ""
        deadline = time.monotonic() + 120
        while "serial ready" not in out and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 0.2)[0]:
                out += os.read(proc.stdout.fileno(), 4096).decode()
        assert "serial ready" in out, err.read_text()
    finally:
        code = _stop(proc)
        proc.stdout.close()
    assert code == 0, err.read_text()
    return _lines(err)


def test_the_level_filters_and_under_journald_lines_are_json_with_the_syslog_prefix(tmp_path):
    quiet = _run_sim(tmp_path, "quiet", env_extra={"ARMID_LOG_LEVEL": "WARNING", "JOURNAL_STREAM": "journal"})
    assert quiet == []                   # its INFO lines filtered out, and nothing else on stderr
    loud = _run_sim(tmp_path, "loud", "--log-level", "INFO",
                    env_extra={"ARMID_LOG_LEVEL": "WARNING", "JOURNAL_STREAM": "journal"})
    assert loud and all(line.startswith("<6>{") for line in loud), loud   # journald: <priority>, then JSON
    records = [json.loads(line[3:]) for line in loud]
    assert all(r["level"] == "INFO" and r["PRIORITY"] == 6 for r in records)
    assert any(r["logger"] == "armid.commands.sim" and "effort_delay_ms = " in r["message"] for r in records)
    text = _run_sim(tmp_path, "text", env_extra={})            # no journal: text lines at INFO
    assert any(" INFO armid.commands.sim: generic6, 6 joints" in line for line in text), text


# -- the CAN transport on a virtual bus: a flood of bad frames, an EMCY -------------------------------------
def test_can_counts_a_bad_frame_flood_in_few_lines_and_logs_an_emcy_as_an_error_with_its_code(caplog):
    import can

    from driver.transports import can as can_transport
    from driver.transports.can import CanArm
    from firmware_bridge import canopen_map as cm
    from sim.can_device import CanDevice

    model = load_model("generic6")
    channel = f"armid-test-logging-{time.monotonic_ns()}"
    dev_bus = can.Bus(interface="virtual", channel=channel)
    sim = Simulator(model, transport=CanDevice(bus=dev_bus, heartbeat_ms=50), seed=4)
    sim.start()
    arm = CanArm(model, interface="virtual", channel=channel, sdo_timeout_s=2.0, boot_timeout_s=10.0)
    caplog.set_level(logging.INFO, logger="driver.transports.can")
    arm.open()
    spy = can.Bus(interface="virtual", channel=channel)
    try:
        before = arm.link_stats()["bad_length"]
        started = time.monotonic()
        for _ in range(500):
            spy.send(can.Message(arbitration_id=cm.TPDO1.cob_id(1), data=bytes(3), is_extended_id=False))
        assert wait_until(lambda: arm.link_stats()["bad_length"] - before == 500, 20)
        flood_s = time.monotonic() - started
        node = arm.node_ids[1]                                   # drive 2: EMCY 0x2310 (over-current)
        spy.send(can.Message(arbitration_id=0x080 + node, data=bytes([0x10, 0x23, 0x01, 0, 0, 0, 0, 0]),
                             is_extended_id=False))
        assert wait_until(lambda: arm.link_stats()["emcy"] >= 1, 10)
    finally:
        spy.shutdown()
        arm.close()                                              # logs what is still counted
        sim.stop()
        dev_bus.shutdown()
    ours = [r for r in caplog.records if r.name == "driver.transports.can"]
    assert any(r.levelno == logging.INFO and "opened" in r.getMessage() for r in ours)
    bad = [r for r in ours if "frame dropped (bad_length)" in r.getMessage()]
    assert all(r.levelno == logging.WARNING for r in bad)
    assert 2 <= len(bad) <= 3 + flood_s / can_transport.TROUBLE_LOG_INTERVAL_S      # the first, then the count
    assert bad[0].count == 1 and sum(r.count for r in bad) == bad[-1].total == 500
    emcy = [r for r in ours if "EMCY" in r.getMessage()]
    assert len(emcy) == 1 and emcy[0].levelno == logging.ERROR
    assert (emcy[0].joint, emcy[0].error_code) == (2, "0x2310")
