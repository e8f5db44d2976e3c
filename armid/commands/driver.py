"""`armid driver --config FILE`: the daemon on the controller PC (driver/)."""
from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("driver", help="run the driver daemon: drives -> 1 kHz ZeroMQ stream, checked commands")
    p.add_argument("--config", required=True, help="driver configuration (TOML; see docs/reference/driver-config.md and deploy/)")
    p.add_argument("--record", metavar="FILE.mcap", default=None,
                   help="record the driver's own stream into this MCAP file while it runs ([record] in the config)")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    import logging
    import signal
    import threading

    from pathlib import Path

    from driver.config import load_config
    from driver.daemon import Driver
    from driver.transports import open_arm
    from ident.errors import InputError
    from ident.model import load_model

    log = logging.getLogger(__name__)
    cfg = load_config(args.config)
    model = load_model(cfg.model)
    arm = open_arm(cfg.transport, model, **cfg.transport_options)
    from dataclasses import replace

    from driver.daemon import Record

    record = cfg.record
    if args.record and Path(args.record).is_dir():
        raise InputError(f"--record {args.record}: is a directory; expected the MCAP file to write")
    if args.record:
        record = replace(record, path=args.record) if record else Record(args.record)
    realtime, said = cfg.realtime, []
    if realtime is None:                # no [realtime] section: real time wherever the process may take it
        from driver.realtime import by_default

        realtime = by_default(said.append)
    driver = Driver(model, arm, endpoints=cfg.endpoints, rate_hz=cfg.rate_hz, watchdog_s=cfg.watchdog_s,
                    clock=cfg.clock, record=record, effort_delay_s=cfg.effort_delay_s,
                    realtime=realtime, trajectory_dir=cfg.trajectory_dir, max_motion_s=cfg.max_motion_s,
                    metrics=cfg.metrics, watch=cfg.watch, intake_share=cfg.intake_share,
                    late_after_cycles=cfg.late_after_cycles)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    from driver.hal import LinkError
    from driver.transports import transport_options

    try:
        driver.start()
    except LinkError as exc:
        # the port, bus or host the config names cannot be reached: the config is wrong for this machine
        # (bad input, status 2); a link lost later is a failure of the run (status 1, below)
        where = "/".join(f"transport.{k}" for k in transport_options(cfg.transport)[1]) or "transport"
        raise InputError(f"{cfg.source}: {where}: cannot start the {cfg.transport} link: {exc}") from None
    for line in said:                   # once started: a refused config or an unreachable link is its one error line
        log.info(line)
    try:
        while not stop.wait(0.5):
            if driver.cycle.error is not None:
                log.critical("the cycle failed: %s; stopping", driver.cycle.error)
                break
    finally:
        log.info("stopping: bringing the drives to rest and disabling them")
        driver.stop()
        log.info("stopped")
    return 1 if driver.cycle.error is not None else 0
