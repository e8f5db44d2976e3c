"""A driver (its Cycle, not its sockets) on the simulator in lockstep, with the model's watch configured: what the
collision tests and benchmarks/bench_collision.py drive. One driver cycle is one simulator cycle."""
from __future__ import annotations

import numpy as np

from driver import motion
from driver.collision import Watch
from driver.daemon import Driver, Endpoints
from firmware_bridge import cia402, stream
from ident.fit import excitation
from sim import Simulator
from sim.local_transport import LocalSimArm


class Rig:
    """Driver(model, watch) on Simulator(arm_model or model, **sim_options), stepped by hand."""

    def __init__(self, model, watch: Watch = Watch(), **sim_options):
        self.model = model
        self.sim = Simulator(model, **{"seed": 1, **sim_options})
        self.arm = LocalSimArm(model, simulator=self.sim)
        self.driver = Driver(model, self.arm, endpoints=Endpoints("inproc://unused-state", "inproc://unused-cmd"),
                             watch=watch)
        self.arm.open()
        self.cycle = self.driver.cycle
        self.last = None
        self.cycle.publish = self._keep
        self.step(3)

    def _keep(self, topic, payload) -> None:
        if topic == stream.TOPIC_STATE:
            self.last = payload

    def state(self):
        """The last published state message, decoded."""
        return stream.decode_state(bytes(self.last))

    def step(self, k: int = 1) -> None:
        for _ in range(k):
            self.cycle.step()

    def enable(self) -> None:
        self.cycle.submit(self.cycle.enable)
        self.step(10)
        assert self.cycle.enabled()

    def excite(self, periods: float = 1.0, feed_forward: bool = True) -> tuple[motion.PlannedMotion, int]:
        """Start seed000's excitation (full speed) through the driver's planner; returns the plan and the cycle
        index (from now) at which the excitation proper starts (after the move to its start and the blend)."""
        plan = motion.plan_trajectory(self.driver.planning_model, self.cycle.hold.copy(), excitation.preset("seed000"),
                                      self.cycle.rate_hz, periods=periods)
        if not feed_forward:
            plan = motion.PlannedMotion(plan.name, plan.rate_hz, plan.q, plan.qd, plan.qdd, np.zeros_like(plan.tau_ff),
                                        plan.segments)
        self.cycle.start_motion(plan)
        return plan, dict(plan.segments)["run_trajectory"]

    def quick_stopping(self) -> bool:
        """True once any drive got the quick-stop command or is in QUICK STOP ACTIVE or below."""
        return bool(np.any(self.cycle.command.controlword == cia402.CW_QUICK_STOP))
