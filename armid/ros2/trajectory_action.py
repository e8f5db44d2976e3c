"""control_msgs/action/FollowJointTrajectory over the driver's run_trajectory (filled in below)."""
from __future__ import annotations


class TrajectoryAction:
    def __init__(self, bridge, workers):
        self.bridge = bridge

    def poll(self) -> None:
        pass

    def busy(self) -> bool:
        return False

    def shutdown(self) -> None:
        pass
