"""A driver on the in-process simulator (the `sim` transport, real time) with loopback endpoints, for tests
that talk to a running driver as a client does."""
from __future__ import annotations

from contextlib import contextmanager

from driver.daemon import Driver, Endpoints
from sim import Simulator
from sim.local_transport import LocalSimArm

LOCAL = Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")


@contextmanager
def local_driver(model, *, seed: int = 3, endpoints: Endpoints = LOCAL, watchdog_s: float = 0.5, **options):
    """Start the driver (Driver(**options)) on a real-time simulator; yield (driver, simulator); stop both."""
    sim = Simulator(model, seed=seed, realtime=True)
    d = Driver(model, LocalSimArm(model, simulator=sim), endpoints=endpoints, watchdog_s=watchdog_s, **options)
    d.start()
    try:
        yield d, sim
    finally:
        d.stop()
        sim.stop()
