"""`armid sim`: run the simulated arm behind one of its transports until Ctrl-C / SIGTERM."""
from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("sim", help="run the simulated arm on a transport (CAN, serial, Modbus gateway)")
    p.add_argument("--transport", required=True, help="can, serial or gateway")
    p.add_argument("--model", default="generic6", help="model file or shipped name (default: generic6)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--realtime", dest="realtime", action="store_true", default=True,
                      help="run at the cycle rate in real time (default)")
    mode.add_argument("--fast", dest="realtime", action="store_false", help="run as fast as possible")
    p.add_argument("--rate", type=float, default=1000.0, help="cycle rate, Hz (default: 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sensor noise (default: 0)")
    p.add_argument("--payload", default=None, metavar="KG[,CX,CY,CZ]",
                   help="attach a payload: mass in kg and optionally its CoM in m (flange frame)")
    p.add_argument("--clock-drift-ppm", type=float, default=0.0, metavar="PPM",
                   help="the simulated device clock's drift against the host's, ppm (positive: slow; default 0)")
    p.add_argument("--clock-jitter-us", type=float, default=0.0, metavar="US",
                   help="standard deviation of each device tick's wake-up jitter, us (default 0)")
    p.add_argument("--mismatch", type=float, default=0.0, metavar="FRACTION",
                   help="the simulated arm's dynamics off the model's by this fraction (each link's inertial "
                        "parameters, rotor inertia and friction times 1 +- FRACTION; default 0)")
    p.add_argument("--control", default="tcp://127.0.0.1:*", metavar="ENDPOINT",
                   help="ZeroMQ endpoint of the control socket that attaches, swaps and detaches payloads and "
                        "pushes the arm at run time (docs/reference/simulator.md; default: a free loopback port, "
                        "printed; 'off': none)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a transport option, e.g. --option port=5020 (see docs/reference/simulator.md); repeatable")
    p.set_defaults(run=_run)


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _run(args: argparse.Namespace) -> int:
    import logging
    import signal
    import threading

    from ident.errors import InputError
    from sim import Simulator
    from sim.simulator import TRANSPORTS, effort_delay

    log = logging.getLogger(__name__)
    if args.transport not in TRANSPORTS:
        raise InputError(f"--transport: unknown {args.transport!r} (available: {', '.join(sorted(TRANSPORTS))})")
    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--option {item!r}: expected KEY=VALUE")
        options[key] = _value(value)
    sim = Simulator(args.model, args.transport, realtime=args.realtime, rate_hz=args.rate, seed=args.seed,
                    clock_drift_ppm=args.clock_drift_ppm, clock_jitter_us=args.clock_jitter_us, mismatch=args.mismatch,
                    **options)
    if args.payload:
        try:
            parts = [float(x) for x in args.payload.split(",")]
        except ValueError:
            raise InputError(f"--payload {args.payload!r}: expected KG or KG,CX,CY,CZ") from None
        if len(parts) not in (1, 4):
            raise InputError(f"--payload {args.payload!r}: expected KG or KG,CX,CY,CZ")
        sim.attach_payload(parts[0], parts[1:] or (0.0, 0.0, 0.0))
    control = None
    if args.control != "off":
        from sim.control import ControlServer

        attached = None if not args.payload else {"mass": parts[0], "com": parts[1:] or [0.0] * 3, "inertia": [0.0] * 6}
        control = ControlServer(sim, args.control, attached=attached)
        control.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    sim.warm_up()      # every cycle kernel loads (or compiles) before the ready line, not in a host's handshake
    if args.realtime:
        _start_realtime(sim, log)
    else:
        sim.start()
    try:
        where = " ".join(f"{k}={v}" for k, v in sim.transport.connection().items())
        print(f"armid sim: {args.transport} ready: {where}", flush=True)
        if control is not None:
            print(f"armid sim: control ready: endpoint={control.bound}", flush=True)
        log.info("%s, %d joints, %g Hz, %s; Ctrl-C stops", sim.model.name, sim.n, args.rate,
                 "real time" if args.realtime else "as fast as possible")
        log.info("a driver on it sets [driver] model = %r and effort_delay_ms = %g (its torque readings lag its "
                 "positions by that)", sim.model.name, 1000.0 * effort_delay(args.rate))
        while not stop.wait(0.5):
            if sim.error is not None:
                log.critical("the simulator failed: %s", sim.error)
                return 1
    finally:
        if control is not None:
            control.stop()
        sim.stop()
        setpoints = sim.transport.setpoint_buffer()
        if setpoints is not None:
            c = setpoints.counts
            log.info("setpoint buffer (%d cycles): %d targets received, %d consumed, %d cycles without one, %d "
                     "dropped to bound the latency", setpoints.depth, c.received, c.consumed, c.underruns, c.skipped)
    return 0


def _start_realtime(sim, log) -> None:
    """Start the simulator's threads (its device loop, the transport's) at SCHED_FIFO DEFAULT_RT_PRIORITY when
    the process may take it (they inherit it from this thread, which goes back to its own policy after),
    else at the default priority; one line either way. After the warm-up: a compile never runs real-time."""
    import os

    from firmware_bridge.runtime.rt_timing import DEFAULT_RT_PRIORITY, rt_permission, rt_priority_within_limit, take_fifo

    why = rt_permission(1)
    priority = rt_priority_within_limit(DEFAULT_RT_PRIORITY)
    # this thread's own policy, to return to: a process started at a real-time policy as a whole (the demo
    # chain's SCHED_RR) keeps it for this thread too; at the default policy on a busy machine it could be
    # preempted while it holds the interpreter lock, and the device loop would wait for it
    before = (os.sched_getscheduler(0), os.sched_getparam(0)) if hasattr(os, "sched_getscheduler") else None
    if why is None or not take_fifo(priority):
        log.info("realtime: not permitted (not root, no CAP_SYS_NICE, RLIMIT_RTPRIO 0, or ARMID_REALTIME=0): the "
                 "device loop runs at the default priority")
        sim.start()
        return
    try:
        sim.start()
    finally:
        os.sched_setscheduler(0, *before)
    log.info("realtime: SCHED_FIFO %d for the device loop and the transport's threads (permitted: %s)", priority, why)
