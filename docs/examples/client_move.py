"""Connect armid.client.ArmClient to a running driver, read samples and make a checked move.

The driver runs here in-process on the simulated generic6 arm (the `sim` transport), so the example needs
no hardware; against a real driver, give ArmClient its [zmq] state and commands endpoints instead.

usage: python client_move.py
"""
import numpy as np

from armid.client import ArmClient
from driver.daemon import Driver, Endpoints
from ident.model import load_model
from sim import Simulator
from sim.local_transport import LocalSimArm

model = load_model("generic6")
sim = Simulator(model, seed=0, realtime=True)                       # the simulated arm, on the wall clock
driver = Driver(model, LocalSimArm(model, simulator=sim),
                endpoints=Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"), watchdog_s=0.5)
driver.start()
try:
    with ArmClient(driver.bound["state"], driver.bound["commands"], timeout_s=30.0) as arm:
        arm.enable()                                                # waits until every drive is enabled
        start = arm.latest()
        print("enabled:", start.enabled, "at q =", np.round(start.q, 3), "rad")
        target = start.q + np.array([0.2, -0.1, 0.1, 0.0, 0.0, 0.3])
        reply = arm.move_to(target, speed=0.5, wait=True)         # checked against the limits, then run
        seqs = [s.seq for s in arm.samples(count=100)]              # 100 samples in order, 1 kHz
        reached = arm.latest().q
        print(f"move took {reply['duration']:.2f} s; samples in order: {seqs == sorted(seqs)}")
        print(f"largest error from the target: {np.abs(reached - target).max():.4f} rad")
        try:
            arm.move_to(model.q_max + 1.0)                         # beyond the limits: refused, never moved
        except Exception as exc:
            print("refused:", type(exc).__name__)
finally:
    driver.stop()
    sim.stop()
