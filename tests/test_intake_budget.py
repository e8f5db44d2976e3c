"""The cycle's work per period is bounded whatever clients send: a client flooding the servo socket with valid
setpoints (another process, as fast as it can) leaves the cycle at its rate; what the cycle has no time for
waits in the socket, and the drives get one checked setpoint per cycle.

The rate is counted, not timed: the cycles the driver ran over a stretch against those its own clock asked for
(stretch / period), during the flood and, as the reference, over a quiet stretch just before it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from driver.realtime import Realtime
from firmware_bridge.runtime.rt_timing import DEFAULT_RT_PRIORITY, rt_permission
from ident.model import load_model
from local_driver import local_driver
from waiting import wait_until

FLOOD = """
import sys, time
import numpy as np, zmq
from firmware_bridge import servo_wire
endpoint, n, q = sys.argv[1], int(sys.argv[2]), np.array([float(x) for x in sys.argv[3].split(',')])
token = int(sys.argv[5])
sock = zmq.Context.instance().socket(zmq.PUSH)
sock.setsockopt(zmq.LINGER, 0)
sock.setsockopt(zmq.SNDHWM, 1000)
sock.connect(endpoint)
t0 = time.time_ns()
end = time.monotonic() + float(sys.argv[4])
k = 0
while time.monotonic() < end:
    try:
        sock.send(servo_wire.encode(servo_wire.MODE_POSITION, token, k + 1, t0 + 1000 * k, q), zmq.NOBLOCK)
        k += 1
    except zmq.Again:
        time.sleep(0)
print(k)
"""
FLOOD_S = 2.0


def _rate_ratio(driver, seconds: float) -> float:
    """Cycles run over `seconds` / the cycles the period asks for."""
    c0, t0 = driver.cycle.cycles, time.perf_counter()
    time.sleep(seconds)
    return (driver.cycle.cycles - c0) / ((time.perf_counter() - t0) * driver.cycle.rate_hz)


@pytest.mark.skipif(rt_permission(DEFAULT_RT_PRIORITY) is None, reason="the flooding process would take the cycle's "
                    "core on a 2-core machine without real-time scheduling (ratio 0.47 measured, time bound or not)")
def test_a_flood_of_valid_servo_setpoints_keeps_the_cycle_at_its_rate():
    model = load_model("generic6")
    ctx = zmq.Context.instance()
    # the cycle thread real-time where permitted, as the driver runs by default (not the memory lock: this is
    # the test process); the flooding process is at the default priority, as a normal client is
    realtime = Realtime(priority=DEFAULT_RT_PRIORITY) if rt_permission(DEFAULT_RT_PRIORITY) else None
    with local_driver(model, watchdog_s=2.0, realtime=realtime) as (driver, sim):
        cmd = ctx.socket(zmq.REQ)
        cmd.setsockopt(zmq.LINGER, 0)
        cmd.connect(driver.bound["commands"])
        try:
            def call(**req):
                cmd.send(json.dumps(req).encode())
                assert cmd.poll(30000), req
                return json.loads(cmd.recv())

            assert wait_until(lambda: driver.cycle.fresh > 50, 30)
            assert call(cmd="enable")["ok"]
            assert wait_until(driver.cycle.enabled, 10)
            reply = call(cmd="servo", mode="position", timeout_cycles=5000)
            assert reply["ok"], reply
            quiet = _rate_ratio(driver, 1.0)
            q = ",".join(f"{x:.17g}" for x in driver.cycle.hold)
            flooder = subprocess.Popen([sys.executable, "-c", FLOOD, reply["endpoint"], str(model.n), q, str(FLOOD_S),
                                        str(reply["token"])],
                                       stdout=subprocess.PIPE, text=True)
            try:
                assert wait_until(lambda: driver.cycle.servo is not None and driver.cycle.servo.received > 1000, 30)
                flooded = _rate_ratio(driver, 1.0)
                sent = int(flooder.communicate(timeout=60)[0])
            finally:
                if flooder.poll() is None:
                    flooder.kill()
                    flooder.wait(5)
            session = driver.cycle.servo
            assert session is not None, driver.cycle.servo_ended      # the session held: nothing refused or timed out
            stats = session.stats()
            call(cmd="servo_stop")
            assert driver.cycle.fault is None, driver.cycle.fault
        finally:
            cmd.close(0)
    print(f"cycle rate ratio quiet {quiet:.3f}, flooded {flooded:.3f}; {sent} setpoints sent, {stats['received']} "
          f"received, {stats['accepted']} accepted")
    assert sent > 10 * stats["accepted"]            # it was a flood: many setpoints per cycle
    assert flooded >= 0.95 * quiet, (flooded, quiet)   # before the time bound: 0.83 (0.03 without real time)
