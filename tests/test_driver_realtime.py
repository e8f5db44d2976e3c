"""The driver's [realtime] settings: the config is validated; in a running driver the cycle thread and libzmq's
I/O thread really run SCHED_FIFO (the kernel says so), status and health report it, stop gives the threads their
old policy back; a setting the OS refuses (a real unprivileged process; a monkeypatched EPERM) is one warning
and the driver runs on, or an error with required = true."""
import errno
import json
import logging
import os
import pwd
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import zmq

from driver import realtime as rt
from driver.config import load_config
from driver.daemon import Driver, Endpoints
from driver.realtime import Realtime, RealtimeError
from sim.local_transport import LocalSimArm
from firmware_bridge import stream
from firmware_bridge.runtime.errors import InputError
from ident.model import load_model
from sim import Simulator
from waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
LOCAL = Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
PRIORITY = 7          # low: above the default policy, below anything a real-time system runs
can_fifo = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                              reason="SCHED_FIFO needs root (or CAP_SYS_NICE) on Linux")


def _config(tmp_path, section: str) -> Path:
    cfg = tmp_path / "driver.toml"
    cfg.write_text(f'[transport]\nname = "sim"\n[realtime]\n{section}\n')
    return cfg


def test_a_full_realtime_section_loads_into_the_settings(tmp_path):
    cfg = load_config(_config(tmp_path, 'priority = 80\nthreads = ["cycle", "serial-link"]\ncpus = [0]\n'
                                        'lock_memory = true\nrequired = true'))
    assert cfg.realtime == Realtime(80, ("cycle", "serial-link"), (0,), True, True)
    defaults = load_config(_config(tmp_path, ""))
    assert defaults.realtime == Realtime(None, ("cycle", "zmq-io"), None, False, False)
    no_section = tmp_path / "plain.toml"
    no_section.write_text('[transport]\nname = "sim"\n')
    assert load_config(no_section).realtime is None


@pytest.mark.parametrize("section, key", [
    ("priority = 0", "realtime.priority"),
    ("priority = 100", "realtime.priority"),
    ("priority = 50.5", "realtime.priority"),
    ("priority = true", "realtime.priority"),
    (f"cpus = [{os.cpu_count()}]", "realtime.cpus"),
    ("cpus = [-1]", "realtime.cpus"),
    ("cpus = [0, 0]", "realtime.cpus"),
    ("cpus = []", "realtime.cpus"),
    ('cpus = "0"', "realtime.cpus"),
    ('threads = ["cycle", "health"]', "realtime.threads"),
    ("threads = []", "realtime.threads"),
    ('lock_memory = "yes"', "realtime.lock_memory"),
    ("required = 1", "realtime.required"),
    ("nice = -5", "realtime.nice"),
])
def test_a_bad_realtime_setting_is_one_error_naming_the_file_and_the_key(tmp_path, section, key):
    path = _config(tmp_path, section)
    with pytest.raises(InputError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: {key}: expected")


def test_the_deploy_example_configs_carry_a_valid_realtime_section():
    for name in ("driver-serial.toml", "driver-can.toml", "driver-gateway.toml"):
        settings = load_config(ROOT / "deploy" / name).realtime
        assert settings is not None and settings.priority is not None and settings.lock_memory, name


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def _driver(model, settings):
    sim = Simulator(model, seed=5, realtime=True)
    return sim, Driver(model, LocalSimArm(model, simulator=sim), endpoints=LOCAL, watchdog_s=0.5,
                       realtime=settings)


def _status(driver) -> dict:
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(driver.bound["commands"])
    try:
        sock.send(json.dumps({"cmd": "status"}).encode())
        assert sock.poll(10000), "no answer to status"
        return json.loads(sock.recv())
    finally:
        sock.close(0)


def _health(driver, timeout_s=10.0) -> dict:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(driver.bound["state"])
    sub.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_HEALTH)
    try:
        assert sub.poll(int(timeout_s * 1000)), "no health message"
        return json.loads(sub.recv_multipart()[1])
    finally:
        sub.close(0)


@can_fifo
def test_the_cycle_and_zmq_io_threads_run_sched_fifo_status_and_health_say_so_and_stop_restores(model):
    cpu = sorted(os.sched_getaffinity(0))[-1]
    sim, d = _driver(model, Realtime(priority=PRIORITY, cpus=(cpu,)))
    d.start()
    try:
        tid = d.cycle.native_id
        io = rt.threads_named(rt.ZMQ_IO_PREFIX)
        assert tid is not None and io
        assert os.sched_getscheduler(tid) == os.SCHED_FIFO
        assert os.sched_getparam(tid).sched_priority == PRIORITY
        assert os.sched_getaffinity(tid) == {cpu}
        assert all(os.sched_getscheduler(t) == os.SCHED_FIFO for t in io)
        # the kernel's own view of the thread: policy 1 is SCHED_FIFO in /proc/PID/task/TID/sched
        sched = Path(f"/proc/self/task/{tid}/sched").read_text()
        assert any(line.split() == ["policy", ":", "1"] for line in sched.splitlines())
        # health and commands stay at the default policy
        for name in ("commands", "health"):
            others = rt.threads_named(name)
            assert others and all(os.sched_getscheduler(t) == os.SCHED_OTHER for t in others), name
        assert wait_until(lambda: d.cycle.cycles > 50, 10.0)
        status = _status(d)["realtime"]
        assert status["threads"]["cycle"] == {"tid": tid, "policy": "SCHED_FIFO", "priority": PRIORITY, "cpus": [cpu]}
        assert status["threads"]["zmq-io"]["policy"] == "SCHED_FIFO"
        assert status["requested"]["priority"] == PRIORITY and status["refused"] == []
        assert status["gc_frozen"] > 0                   # start-up froze the collector's view
        health = _health(d)["realtime"]
        assert health["threads"]["cycle"]["policy"] == "SCHED_FIFO"
    finally:
        d.stop()
        sim.stop()
    assert all(os.sched_getscheduler(t) == os.SCHED_OTHER for t in io)    # the shared context's I/O thread


@can_fifo
def test_lock_memory_locks_the_process_and_stop_unlocks_it(model):
    sim, d = _driver(model, Realtime(lock_memory=True))
    assert rt._status_kib("VmLck") == 0
    d.start()
    try:
        status = d.status()["realtime"]
        assert status["memory_locked"] and status["locked_kib"] > 10_000     # the interpreter, numpy, numba: > 10 MB
        assert status["locked_kib"] == rt._status_kib("VmLck")
    finally:
        d.stop()
        sim.stop()
    assert rt._status_kib("VmLck") == 0


def test_a_refused_priority_is_one_warning_and_the_driver_runs_on(model, monkeypatch, caplog):
    def refuse(*args):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    sim, d = _driver(model, Realtime(priority=PRIORITY))
    caplog.set_level(logging.WARNING, logger="driver.daemon")
    d.start()
    try:
        assert wait_until(lambda: d.cycle.cycles > 50, 10.0), "the cycle does not run"
        warnings = [r.getMessage() for r in caplog.records if r.name == "driver.daemon" and r.levelno == logging.WARNING]
        assert len(warnings) == 1          # one for the setting, not one per thread
        assert "realtime.priority: SCHED_FIFO 7 for the cycle thread refused by the OS: Operation not permitted" \
            in warnings[0] and "RLIMIT_RTPRIO" in warnings[0]
        status = d.status()["realtime"]
        assert status["refused"] and status["threads"]["cycle"]["policy"] == "SCHED_OTHER"
        assert d.cycle.running and d.cycle.error is None
    finally:
        d.stop()
        sim.stop()


def test_a_refused_priority_with_required_stops_the_start_with_an_error(model, monkeypatch):
    def refuse(*args):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    sim, d = _driver(model, Realtime(priority=PRIORITY, required=True))
    try:
        with pytest.raises(RealtimeError, match=r"realtime.priority: .* Operation not permitted.*\(required = true\)"):
            d.start()
        assert not d.cycle.running and d._pub is None and d._rep is None
    finally:
        d.stop()
        sim.stop()


UNPRIVILEGED = textwrap.dedent("""
    import json, os, resource, sys, threading
    sys.path.insert(0, sys.argv[1])
    from driver import realtime as rt          # imported first: the interpreter's files may be root's alone
    resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 * 1024, 64 * 1024))
    os.setgid(int(sys.argv[3])); os.setuid(int(sys.argv[2]))   # an ordinary user: no CAP_SYS_NICE, CAP_IPC_LOCK
    settings = rt.Realtime(priority=10, lock_memory=True, required=sys.argv[4] == "1")
    warnings = []
    try:
        applied = rt.apply(settings, {"cycle": threading.get_native_id()}, warnings.append)
    except rt.RealtimeError as exc:
        print(json.dumps({"error": str(exc)})); sys.exit(0)
    print(json.dumps({"warnings": warnings, "effect": rt.in_effect({"cycle": threading.get_native_id()}, applied)}))
""")


def _unprivileged(required: bool) -> dict:
    try:
        user = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' to run an unprivileged process as")
    out = subprocess.run([sys.executable, "-c", UNPRIVILEGED, str(ROOT), str(user.pw_uid), str(user.pw_gid),
                          "1" if required else "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@can_fifo
def test_an_unprivileged_process_gets_one_warning_per_refused_setting_and_keeps_its_policy():
    got = _unprivileged(required=False)
    assert len(got["warnings"]) == 2
    lock, prio = got["warnings"]
    assert lock.startswith("realtime.lock_memory: mlockall(MCL_CURRENT | MCL_FUTURE) refused by the OS: "
                           "Cannot allocate memory") and "LimitMEMLOCK" in lock
    assert prio.startswith("realtime.priority: SCHED_FIFO 10 for the cycle thread refused by the OS: "
                           "Operation not permitted")
    effect = got["effect"]
    assert effect["threads"]["cycle"]["policy"] == "SCHED_OTHER" and not effect["memory_locked"]
    assert effect["refused"] == got["warnings"]


@can_fifo
def test_an_unprivileged_process_with_required_gets_the_error_of_the_first_refusal():
    got = _unprivileged(required=True)
    assert got["error"].startswith("realtime.lock_memory: mlockall") and got["error"].endswith("(required = true)")


@can_fifo
def test_a_required_refusal_undoes_what_was_applied_before_it(monkeypatch):
    import threading

    def refuse(*args):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    cpus = os.sched_getaffinity(0)
    one = {sorted(cpus)[0]}
    with pytest.raises(RealtimeError, match="realtime.priority"):
        rt.apply(Realtime(priority=PRIORITY, cpus=tuple(one), lock_memory=True, required=True),
                 {"cycle": threading.get_native_id()}, warn=print)
    assert rt._status_kib("VmLck") == 0                    # mlockall succeeded, then was undone
    assert os.sched_getaffinity(0) == cpus                 # the affinity set before the refusal is back
