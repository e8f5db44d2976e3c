"""The driver's record option: `[record]` in the config and Driver(record=...) write the driver's own stream
into an MCAP file (an inproc SUB and a recorder thread, off the cycle) that `armid record convert` reads;
the file holds exactly the state messages a plain subscriber saw, and bad options are refused at once."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from driver.config import load_config
from driver.daemon import Driver, Endpoints, Record
from firmware_bridge.recording import read_recording
from sim.local_transport import LocalSimArm
from firmware_bridge import stream
from firmware_bridge.runtime.errors import InputError
from ident.model import load_model
from sim import Simulator

ROOT = Path(__file__).resolve().parents[1]
LOCAL = Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def test_a_recording_driver_writes_its_stream_and_armid_record_convert_reads_it(model, tmp_path):
    path = tmp_path / "run.mcap"
    sim = Simulator(model, seed=3)
    drv = Driver(model, LocalSimArm(model, simulator=sim), endpoints=LOCAL, rate_hz=500.0, watchdog_s=0.5,
                 record=Record(str(path), chunk_seconds=0.05), effort_delay_s=1e-3)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    seen: dict[int, np.void] = {}
    drv.start()
    try:
        sub.connect(drv.bound["state"])
        sub.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_STATE)
        deadline = time.monotonic() + 30
        while len(seen) < 400 and time.monotonic() < deadline:
            if sub.poll(100):
                m = stream.decode_state(sub.recv_multipart()[1])
                seen[int(m["seq"])] = m
        assert len(seen) >= 400
        assert drv.health(1.0, {})["recording"]["path"] == str(path)
        assert drv.status()["effort_delay_s"] == 1e-3
    finally:
        sub.close(0)
        drv.stop()
        sim.stop()
    assert drv.recording_error is None
    log = read_recording(path)
    assert log.complete and log.skipped == 0
    assert log.joint_names == tuple(model.joint_names)
    recorded = {int(s["seq"]): s for s in log.states}
    assert len(recorded) == drv.recording.messages and drv.recording.dropped == 0
    common = sorted(set(recorded) & set(seen))
    assert len(common) >= 300                       # the subscriber's messages are in the file, unchanged
    for k in common:
        for name in ("q", "qd", "current", "torque", "statusword", "flags", "host_time_ns", "device_time_ns"):
            np.testing.assert_array_equal(recorded[k][name], seen[k][name])

    from mcap.reader import make_reader

    from firmware_bridge import mcap_schema
    with open(path, "rb") as f:
        topics = [channel.topic for _, channel, _ in make_reader(f).iter_messages(log_time_order=False)]
    assert topics.count(mcap_schema.TOPIC_ROBOT_DESCRIPTION) == 1           # the driver's model, for a 3D view
    assert 0.08 * len(recorded) <= topics.count(mcap_schema.TOPIC_TF) <= 0.12 * len(recorded) + 1   # 50 of 500 Hz
    out = tmp_path / "run.npz"
    done = subprocess.run([sys.executable, "-m", "armid.cli", "record", "convert", str(path), "-o", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    arrays = np.load(out)
    assert arrays["q"].shape == (len(log.states), model.n)
    np.testing.assert_array_equal(arrays["q"], log.states["q"])
    assert float(arrays["effort_delay"]) == 1e-3          # the driver's effort delay, for identification


def test_the_config_takes_a_record_section_and_a_clock(tmp_path):
    cfg = tmp_path / "driver.toml"
    cfg.write_text('[driver]\nclock = "host"\neffort_delay_ms = 0.5\n[transport]\nname = "sim"\n[record]\n'
                   'path = "out/run.mcap"\nchunk_seconds = 0.5\n')
    c = load_config(cfg)
    assert c.clock == "host" and c.effort_delay_s == 0.5e-3
    assert c.record == Record(str((tmp_path / "out" / "run.mcap").resolve()), 0.5, False)


@pytest.mark.parametrize("text, error", [
    ('[record]\nchunk_seconds = 1\n', r"record\.path: expected the MCAP file to write"),
    ('[record]\npath = "a.mcap"\noverwrite = "yes"\n', r"record\.overwrite: expected true or false, got 'yes'"),
    ('[record]\npath = "a.mcap"\nspeed = 2\n', r"record\.speed: expected one of chunk_seconds, overwrite, path"),
    ('[driver]\nclock = "wall"\n', r"driver\.clock: expected one of auto, host, device, got 'wall'"),
    ('[driver]\neffort_delay_ms = "half"\n', r"driver\.effort_delay_ms: expected a number of ms within \+-100, got 'half'"),
    ('[driver]\neffort_delay_ms = 250\n', r"driver\.effort_delay_ms: expected a number of ms within \+-100, got 250"),
    ('[driver]\nrate_hz = 20000\n', r"driver\.rate_hz: expected a number 1\.\.10000 Hz, got 20000"),
    ('[driver]\nrate_hz = 0.5\n', r"driver\.rate_hz: expected a number 1\.\.10000 Hz"),
    ('[driver]\nrate_hz = inf\n', r"driver\.rate_hz: expected a number"),
    ('[driver]\nrate_hz = 1000\nwatchdog_ms = 1.5\n', r"driver\.watchdog_ms: expected a number 2\.\.10000 ms"),
    ('[driver]\nwatchdog_ms = 60000\n', r"driver\.watchdog_ms: expected a number 2\.\.10000 ms"),
    ('[record]\npath = "a.mcap"\nchunk_seconds = 3600\n', r"record\.chunk_seconds: expected a number 0\.001\.\.60 s"),
    ('[record]\npath = "."\n', r"record\.path: expected the MCAP file to write, not a directory"),
    ('[zmq]\nstate = "localhost:5555"\n', r"zmq\.state: expected a ZeroMQ endpoint"),
    ('[zmq]\ncommands = "tcp://127.0.0.1:0x10"\n', r"zmq\.commands: expected a ZeroMQ endpoint"),
])
def test_bad_record_and_clock_options_are_named(tmp_path, text, error):
    cfg = tmp_path / "driver.toml"
    cfg.write_text(text + '[transport]\nname = "sim"\n')
    with pytest.raises(InputError, match=error):
        load_config(cfg)


@pytest.mark.parametrize("transport, error", [
    ('name = "sim"\nspeed = 3\n', r"transport\.speed: expected an option of the sim transport: realtime, seed"),
    ('name = "serial"\nport = "/dev/x"\nbaud = 9600\n', r"transport\.baud: expected an option of the serial "
                                                          r"transport: port, baudrate"),
    ('name = "serial"\n', r"transport\.port: expected a value: the serial transport needs it \(missing\)"),
    ('name = "can"\ninterface = "virtual"\n', r"transport\.channel: expected a value"),
    ('name = "gateway"\nhost = "10.0.0.2"\ntimeout = 5\n', r"transport\.timeout: expected an option of the gateway "
                                                             r"transport: .*timeout_ms"),
])
def test_a_transport_option_the_transport_does_not_know_is_named_with_the_known_ones(tmp_path, transport, error):
    cfg = tmp_path / "driver.toml"
    cfg.write_text("[transport]\n" + transport)
    with pytest.raises(InputError, match=error) as err:
        load_config(cfg)
    assert str(cfg) in str(err.value)


def test_the_sim_transport_refuses_an_unknown_option_itself(model):
    from driver.transports import open_arm

    with pytest.raises(InputError, match="sim: unknown option 'speed'"):
        open_arm("sim", model, speed=3)


def test_a_recording_that_cannot_be_written_stops_the_driver_before_it_starts(model, tmp_path):
    existing = tmp_path / "old.mcap"
    existing.write_bytes(b"x")
    arm = LocalSimArm(model)
    with pytest.raises(InputError, match="old.mcap: exists"):
        Driver(model, arm, endpoints=LOCAL, record=Record(str(existing)))
    with pytest.raises(InputError, match="does not exist"):
        Driver(model, arm, endpoints=LOCAL, record=Record(str(tmp_path / "no" / "run.mcap")))
    arm.close()
