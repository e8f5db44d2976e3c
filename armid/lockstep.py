"""A driver (its Cycle, not its sockets) on the simulator in lockstep, with the model's watch configured: what the
collision tests and benchmarks/bench_collision.py drive. One driver cycle is one simulator cycle.

    rig = Rig(load_model("generic6"), Watch(detect=True))
    rig.enable()
    plan, start = rig.excite()             # seed000 at full speed, planned by the driver
    rig.step(start + 500)
    rig.sim.apply_wrench(**push_making(rig.model, rig.sim.read_truth().q, link=3, torque=5.0))

The simulated drives default to HOST_DRIVES: their own acceleration and friction feed-forward off, as drives are
set up for a host that sends its model's torque (the driver does); `following_error` measures the motion's
tracking with and without that torque.
"""
from __future__ import annotations

import numpy as np

from driver import motion
from driver.collision import Watch
from driver.daemon import Driver, Endpoints
from firmware_bridge import cia402, stream
from ident.fit import excitation
from ident.model import dynamics
from sim import Simulator
from sim.drive import DriveConfig
from sim.local_transport import LocalSimArm

HOST_DRIVES = DriveConfig(friction_feedforward=False, acceleration_feedforward=False)


class Rig:
    """Driver(model, watch) on Simulator(model, **sim_options) (seed 1 and drive HOST_DRIVES unless given), stepped
    by hand."""

    def __init__(self, model, watch: Watch = Watch(), **sim_options):
        self.model = model
        self.sim = Simulator(model, **{"seed": 1, "drive": HOST_DRIVES, **sim_options})
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


def push_making(model, q, link: int, torque: float, point=(0.05, 0.05, 0.0), duration: float = 1.0) -> dict:
    """Simulator.apply_wrench arguments: a horizontal force at `point` (m, in the link's frame) of `link` whose
    largest joint torque at q is `torque` N m (the best of 12 directions), for `duration` s."""
    best = None
    for angle in np.linspace(0.0, np.pi, 12, endpoint=False):
        f = np.array([np.cos(angle), np.sin(angle), 0.0])
        tau = dynamics.wrench_torques(model, q, link, point, f)
        if best is None or np.abs(tau).max() > best[1]:
            best = (f, np.abs(tau).max())
    return {"link": link, "force": (best[0] * torque / best[1]).tolist(), "point": list(point), "duration": duration}


def following_error(model, feed_forward: bool = True, **sim_options) -> np.ndarray:
    """RMS per joint (n,) rad of (planned - measured position) over seed000 at full speed through the driver's own
    cycle (the move to its start and the blend left out): with the planned torque as the drives' torque offset, or
    with none (feed_forward False)."""
    rig = Rig(model, **sim_options)
    rig.enable()
    plan, start = rig.excite(feed_forward=feed_forward)
    err = np.zeros((plan.samples - start, model.n))
    for k in range(plan.samples):
        rig.step()
        if k >= start:
            err[k - start] = plan.q[k] - rig.state()["q"]
    return np.sqrt(np.mean(np.square(err), axis=0))
