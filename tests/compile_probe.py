"""Run in a fresh interpreter (tests/test_warm_start.py): a free-running simulated arm behind a pty and the driver
on it, in this process. After Driver.start() has returned (the driver said it is ready), every numba kernel of
ours that any code then compiles or loads gets a new signature; this counts them while the driver enables, moves,
stops a move along its path, runs servo sessions (position, torque, torque with gravity and friction compensation), quick-stops and disables, and prints one JSON line: the new signatures by kernel and the
driver's faults.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np
import zmq


def kernels() -> dict[str, object]:
    """Every numba dispatcher in our loaded modules, by qualified name."""
    from numba.core.registry import CPUDispatcher

    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("driver", "sim", "firmware_bridge", "ident")):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, CPUDispatcher):
                found[f"{value.py_func.__module__}.{value.py_func.__qualname__}"] = value
    return found


def signatures() -> dict[str, int]:
    return {name: len(k.signatures) for name, k in kernels().items()}


def _call(sock, **request) -> dict:
    sock.send(json.dumps(request).encode())
    if not sock.poll(120_000):
        raise SystemExit(f"no reply to {request}")
    return json.loads(sock.recv())


def main() -> None:
    from driver.daemon import Driver, Endpoints
    from driver.transports.serial_link import SerialArm
    from firmware_bridge import servo_wire
    from ident.model import load_model
    from sim import Simulator
    from sim.serial_device import SerialDevice

    model = load_model("generic6")
    dev = SerialDevice(watchdog_s=5.0)
    sim = Simulator(model, transport=dev, realtime=True, seed=1)
    sim.warm_up()
    sim.start()
    driver = Driver(model, SerialArm(model, dev.path, device_watchdog_ms=5000),
                    endpoints=Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"), watchdog_s=0.25, clock="device")
    ctx = zmq.Context.instance()
    cmd = ctx.socket(zmq.REQ)
    cmd.setsockopt(zmq.LINGER, 0)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    faults = []
    try:
        driver.start()
        before = signatures()
        cmd.connect(driver.bound["commands"])
        deadline = time.monotonic() + 30
        while driver.cycle.fresh < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        _call(cmd, cmd="enable")
        deadline = time.monotonic() + 30
        while not driver.cycle.enabled() and time.monotonic() < deadline:
            time.sleep(0.01)
        goal = (driver.cycle.hold + 0.05).tolist()
        reply = _call(cmd, cmd="move_to", q=goal, speed=0.5)
        if not reply.get("ok"):
            faults.append(f"move_to: {reply}")
        deadline = time.monotonic() + 60
        while driver.cycle.motion is None and time.monotonic() < deadline and reply.get("ok"):
            time.sleep(0.005)
        while driver.cycle.motion is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        # a stop along the path: planned in this process, beside the cycle (as a preempting blend or a back-off)
        reply = _call(cmd, cmd="move_to", q=(driver.cycle.hold - 0.05).tolist(), speed=0.5)
        while driver.cycle.motion is None and time.monotonic() < deadline and reply.get("ok"):
            time.sleep(0.005)
        time.sleep(0.1)
        reply = _call(cmd, cmd="stop")
        if not reply.get("ok"):
            faults.append(f"stop: {reply}")
        while driver.cycle.motion is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        for mode, extra in (("position", {}), ("torque", {}), ("torque", {"compensate": ["gravity", "friction"]})):
            reply = _call(cmd, cmd="servo", mode=mode, timeout_cycles=2000, **extra)
            if not reply.get("ok"):
                faults.append(f"servo {mode}: {reply}")
                continue
            push.connect(reply["endpoint"])
            q = driver.cycle.hold.copy()
            for k in range(50):
                values = q if mode == "position" else np.zeros(model.n)   # torque: the compensation's, or none
                push.send(servo_wire.encode(servo_wire.MODES[mode], reply["token"], k + 1, time.time_ns(), values))
                time.sleep(0.002)
            _call(cmd, cmd="servo_stop")
            push.disconnect(reply["endpoint"])
        _call(cmd, cmd="quick_stop")
        _call(cmd, cmd="fault_reset")
        _call(cmd, cmd="enable")
        time.sleep(0.1)
        _call(cmd, cmd="disable")
        time.sleep(0.1)
        after = signatures()
        faults += [text for _, text in driver.cycle.events if text.startswith("fault:")]
    finally:
        cmd.close(0)
        push.close(0)
        driver.stop()
        sim.stop()
    new = {name: after[name] - before.get(name, 0) for name in after if after[name] != before.get(name, 0)}
    print(json.dumps({"new_signatures": new, "faults": faults, "kernels": len(after)}))


if __name__ == "__main__":
    main()
