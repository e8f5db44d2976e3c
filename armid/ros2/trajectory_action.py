"""control_msgs/action/FollowJointTrajectory over the driver's run_trajectory, behaving as ros2_controllers'
joint_trajectory_controller does towards its clients (MoveIt, rqt_joint_trajectory_controller):

- a goal is **rejected** when its trajectory is malformed: no joints or points, a joint the arm does not have or
  named twice, a point whose positions (velocities, accelerations) do not match the joints, efforts, a time that
  does not increase, a value that is not finite, a tolerance for a joint the arm does not have;
- an accepted goal becomes run_trajectory(samples=...) in the driver's joint order: times from time_from_start
  (a trajectory whose first point is later than 0 starts from where the arm is at 0), positions, and the
  waypoint velocities and accelerations when every point has them (a Hermite spline through them, driver.waypoints);
  the driver checks the whole motion against the limits before anything moves, and a motion it refuses (a goal
  outside the limits) is **aborted with INVALID_GOAL** and the driver's words (which joint, what, when);
- feedback at a fixed rate: desired (the driver's curve at the motion's progress), actual (the newest sample)
  and error, in the goal's joint order;
- path tolerance broken: the motion stops, **ABORTED, PATH_TOLERANCE_VIOLATED**; at the end the positions must be
  within the goal tolerance (default 0.01 rad) within goal_time_tolerance: **SUCCEEDED, SUCCESSFUL**, else
  **ABORTED, GOAL_TOLERANCE_VIOLATED**; a drive fault aborts with PATH_TOLERANCE_VIOLATED and the fault;
- cancel: the motion stops along its path, **CANCELED**; a new goal while one runs preempts it: the old one is
  **ABORTED with INVALID_GOAL**, "Current goal preempted by new incoming action.", and the driver blends the running
  motion into the new one without stopping (run_trajectory's preempt).

Tolerances follow control_msgs/JointTolerance: 0 keeps the default, a negative value (-1) erases it (not checked).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass

import numpy as np

from armid.client import ClientError, CommandRefused
from armid.ros2 import action_server as act
from driver import waypoints

log = logging.getLogger(__name__)
ACTION_TYPE = "control_msgs/action/FollowJointTrajectory"
SUCCESSFUL, INVALID_GOAL, INVALID_JOINTS, OLD_HEADER_TIMESTAMP, PATH_TOLERANCE_VIOLATED, GOAL_TOLERANCE_VIOLATED = \
    0, -1, -2, -3, -4, -5
DEFAULT_GOAL_TOLERANCE = 0.01       # rad at the end of a goal
AT_REST = 1e-6
PREEMPTED = "Current goal preempted by new incoming action."
STOP_WAIT_S = 30.0


def _seconds(duration) -> float:
    return duration.sec + duration.nanosec * 1e-9


@dataclass(frozen=True)
class GoalPlan:
    """A checked goal in the driver's joint order: t (N,) s, q (N, n) rad, qd and qdd (N, n) or None, tolerances
    (n,) rad (nan: not checked), goal_time_tolerance s, and the goal's joint order (order[i]: the driver's index of
    the goal's joint i)."""

    t: np.ndarray
    q: np.ndarray
    qd: np.ndarray | None
    qdd: np.ndarray | None
    path_tolerance: np.ndarray
    goal_tolerance: np.ndarray
    goal_time_tolerance: float
    order: np.ndarray
    names: list[str]


class GoalRejected(ValueError):
    """A goal joint_trajectory_controller would reject; the message says why."""


def _tolerances(entries, joints: list[str], default: float, what: str) -> np.ndarray:
    tol = np.full(len(joints), default)
    for e in entries:
        if e.name not in joints:
            raise GoalRejected(f"{what}: joint {e.name!r} is not one of the arm's {joints}")
        if not math.isfinite(e.position):
            raise GoalRejected(f"{what}: joint {e.name!r}: position tolerance {e.position} is not finite")
        if e.position > 0:
            tol[joints.index(e.name)] = e.position
        elif e.position < 0:
            tol[joints.index(e.name)] = np.nan             # erased: not checked
    return tol


def check_goal(goal, joints: list[str], goal_tolerance: float = DEFAULT_GOAL_TOLERANCE) -> GoalPlan:
    """The FollowJointTrajectory goal as a GoalPlan, or GoalRejected naming what is wrong with it."""
    traj = goal.trajectory
    names = list(traj.joint_names)
    n = len(joints)
    if not names:
        raise GoalRejected("the trajectory names no joints")
    unknown = [j for j in names if j not in joints]
    if unknown:
        raise GoalRejected(f"joint {unknown[0]!r} is not one of the arm's {joints}")
    if len(set(names)) != len(names):
        raise GoalRejected(f"a joint is named twice in {names}")
    if len(names) != n:
        missing = [j for j in joints if j not in names]
        raise GoalRejected(f"the trajectory must name every joint of the arm; {missing} missing")
    if multi := list(goal.multi_dof_trajectory.joint_names):
        raise GoalRejected(f"multi-DOF joints are not supported ({multi})")
    points = list(traj.points)
    if not points:
        raise GoalRejected("the trajectory has no points")
    order = np.array([joints.index(j) for j in names])
    t = np.array([_seconds(p.time_from_start) for p in points])
    q = np.empty((len(points), n))
    has_qd = all(len(p.velocities) for p in points)
    has_qdd = has_qd and all(len(p.accelerations) for p in points)
    qd = np.zeros((len(points), n)) if has_qd else None
    qdd = np.zeros((len(points), n)) if has_qdd else None
    for k, p in enumerate(points):
        if len(p.positions) != n:
            raise GoalRejected(f"point {k}: {len(p.positions)} positions for {n} joints")
        for label, values in (("velocities", p.velocities), ("accelerations", p.accelerations)):
            if len(values) not in (0, n):
                raise GoalRejected(f"point {k}: {len(values)} {label} for {n} joints")
        if len(p.effort):
            raise GoalRejected(f"point {k}: efforts are not supported (the arm follows positions)")
        q[k, order] = p.positions
        if qd is not None:
            qd[k, order] = p.velocities
        if qdd is not None:
            qdd[k, order] = p.accelerations
    for label, a in (("time_from_start", t), ("positions", q), ("velocities", qd), ("accelerations", qdd)):
        if a is not None and not np.isfinite(a).all():
            raise GoalRejected(f"{label}: a value is not finite")
    if t[0] < 0 or np.any(np.diff(t) <= 0):
        raise GoalRejected("time_from_start must not be negative and must increase from point to point")
    if len(points) == 1 and t[0] == 0:
        raise GoalRejected("a single point needs a time_from_start after 0")
    path = _tolerances(goal.path_tolerance, joints, np.nan, "path_tolerance")
    end = _tolerances(goal.goal_tolerance, joints, goal_tolerance, "goal_tolerance")
    gtt = _seconds(goal.goal_time_tolerance)
    if not math.isfinite(gtt) or gtt < 0:
        raise GoalRejected(f"goal_time_tolerance {gtt}: expected a duration >= 0")
    return GoalPlan(t, q, qd, qdd, path, end, gtt, order, names)


def samples_from(plan: GoalPlan, q_now: np.ndarray) -> tuple:
    """run_trajectory's samples: (t, q[, qd[, qdd]]), starting from q_now at 0 when the goal's first point is
    later than 0."""
    t, q, qd, qdd = plan.t, plan.q, plan.qd, plan.qdd
    if t[0] > 0:
        t = np.concatenate([[0.0], t])
        q = np.vstack([q_now, q])
        qd = None if qd is None else np.vstack([np.zeros(q.shape[1]), qd])
        qdd = None if qdd is None else np.vstack([np.zeros(q.shape[1]), qdd])
    return tuple(a for a in (t, q, qd, qdd) if a is not None)


class TrajectoryAction:
    """The FollowJointTrajectory action server of a bridge (armid.ros2.bridge), executing goals in worker threads."""

    def __init__(self, bridge, workers, goal_tolerance: float = DEFAULT_GOAL_TOLERANCE):
        self.bridge, self.client, self.workers = bridge, bridge.client, workers
        self.joints = list(bridge.model.joint_names)
        self.goal_tolerance = float(goal_tolerance)
        self.server = act.ActionServer(bridge.participant, bridge.types,
                                       bridge.name(f"{bridge.controller}/follow_joint_trajectory"), ACTION_TYPE,
                                       self._on_goal, lambda goal: True)
        self.types = self.server.action
        self.active: act.Goal | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.last_error = ""

    def busy(self) -> bool:
        return self.active is not None

    def poll(self) -> None:
        for goal in self.server.poll():
            self.workers.submit(self._run, goal)

    def shutdown(self) -> None:
        self._stopping.set()
        active = self.active
        if active is not None:
            active.cancel_requested.set()

    # -- goals -------------------------------------------------------------------------------------------------
    def _on_goal(self, goal: act.Goal) -> str | None:
        try:
            goal.plan = check_goal(goal.request.goal, self.joints, self.goal_tolerance)
        except GoalRejected as exc:
            self.last_error = f"goal rejected: {exc}"
            log.warning("%s", self.last_error)
            return str(exc)
        if self.bridge.commands is not None and self.bridge.commands.servo_active():
            self.last_error = "goal rejected: a servo session is running"
            return self.last_error
        return None

    def _result(self, code: int, text: str):
        return self.types.result(error_code=code, error_string=text)

    def _run(self, goal: act.Goal) -> None:
        try:
            self._execute(goal)
        except ClientError as exc:
            self.server.finish(goal, act.ABORTED, self._result(PATH_TOLERANCE_VIOLATED, f"driver: {exc}"))
        except Exception as exc:                                 # noqa: BLE001 -- the goal ends, the bridge goes on
            log.exception("goal failed")
            self.server.finish(goal, act.ABORTED, self._result(INVALID_GOAL, f"bridge error: {exc}"))
        finally:
            with self._lock:
                if self.active is goal:
                    self.active = None

    def _execute(self, goal: act.Goal) -> None:
        with self._lock:
            previous, self.active = self.active, goal
        preempting = previous is not None and not previous.done
        if preempting:
            self.server.finish(previous, act.ABORTED, self._result(INVALID_GOAL, PREEMPTED))
            previous.cancel_requested.set()
        plan: GoalPlan = goal.plan
        sample = self.client.last_sample or self.client.latest()
        samples = samples_from(plan, np.asarray(sample.q, dtype=float))
        if goal.cancel_requested.is_set():
            self.server.finish(goal, act.CANCELED, self._result(SUCCESSFUL, ""))
            return
        try:
            reply = self.client.run_trajectory(samples=samples, preempt=preempting)
        except CommandRefused as exc:
            if preempting:
                self._stop_motion()            # the old goal has ended: its motion must not go on
            self.last_error = str(exc)
            self.server.finish(goal, act.ABORTED, self._result(INVALID_GOAL, str(exc)))
            return
        self.server.set_executing(goal)
        curve = waypoints.curve(*samples)
        starts = {s["name"]: float(s["start"]) for s in reply.get("segments", [])}
        blend_s = starts.get("run_trajectory", 0.0) - starts["blend"] if "blend" in starts else 0.0
        t_end = float(samples[0][-1])
        period = 1.0 / self.bridge.feedback_hz
        ended_at = None
        started = False
        replied = time.monotonic()
        planned_s = float(reply.get("duration", t_end))
        while True:
            if goal.cancel_requested.is_set():
                if goal.done:            # preempted: the new goal has taken over
                    return
                self._stop_motion()
                self.server.finish(goal, act.CANCELED, self._result(SUCCESSFUL, ""))
                return
            status = self.client.status()
            s = self.client.last_sample
            q_act = np.asarray(s.q, dtype=float)
            if status.get("fault"):
                self.server.finish(goal, act.ABORTED, self._result(PATH_TOLERANCE_VIOLATED,
                                                                   f"the driver faulted: {status['fault']}"))
                return
            progress = status.get("progress")
            moving = progress is not None and progress.get("name") == "run_trajectory"
            started = started or moving
            if moving and progress["segment"] in ("blend", "run_trajectory"):
                # the goal's time: from the start of the blend into it, or of the trajectory after the approach
                tg = float(progress["elapsed_s"]) - float(progress["segment_start_s"]) + \
                    (blend_s if progress["segment"] == "run_trajectory" else 0.0)
            elif moving:
                tg = -1.0                        # the approach, or the hand-over from the goal it preempted
            elif started or ended_at is not None:
                tg = t_end
            else:
                tg = -1.0                        # the driver has not started it yet
            desired = curve(min(max(tg, 0.0), t_end)) if tg >= 0 else samples[1][0]
            qd_des = curve(min(max(tg, 0.0), t_end), 1) if 0 <= tg < t_end else np.zeros_like(q_act)
            self._feedback(goal, plan, desired, qd_des, s)
            error = np.abs(desired - q_act)
            if moving and tg >= 0 and np.any(error > plan.path_tolerance):
                j = int(np.nanargmax(np.where(np.isnan(plan.path_tolerance), -np.inf, error - plan.path_tolerance)))
                self._stop_motion()
                self.server.finish(goal, act.ABORTED, self._result(
                    PATH_TOLERANCE_VIOLATED, f"Aborted due to path tolerance violation: joint {self.joints[j]}: "
                                             f"error {error[j]:.4g} rad over {plan.path_tolerance[j]:.4g} rad at "
                                             f"t = {tg:.3f} s"))
                return
            if moving:
                ended_at = None
            elif started or time.monotonic() - replied > planned_s + 1.0:   # ran, or too short to be seen running
                ended_at = ended_at or time.monotonic()
                final = np.abs(samples[1][-1] - q_act)
                within = ~(final > plan.goal_tolerance)                 # nan (erased) counts as within
                if within.all():
                    self.server.finish(goal, act.SUCCEEDED, self._result(SUCCESSFUL, "Goal successfully reached!"))
                    return
                if time.monotonic() - ended_at > max(plan.goal_time_tolerance, 2 * period):
                    j = int(np.argmax(np.where(within, -np.inf, final)))
                    self.server.finish(goal, act.ABORTED, self._result(
                        GOAL_TOLERANCE_VIOLATED, f"Aborted due to goal tolerance: joint {self.joints[j]} "
                                                 f"{final[j]:.4g} rad from its goal (tolerance "
                                                 f"{plan.goal_tolerance[j]:.4g} rad)"))
                    return
            if self._stopping.wait(period):
                self._stop_motion()
                self.server.finish(goal, act.ABORTED, self._result(INVALID_GOAL, "the bridge stopped"))
                return

    def _feedback(self, goal, plan: GoalPlan, desired, qd_des, s) -> None:
        point = self.bridge.types.message("trajectory_msgs/msg/JointTrajectoryPoint")
        order = plan.order
        actual_q, actual_qd = np.asarray(s.q, dtype=float), np.asarray(s.qd, dtype=float)
        fb = self.types.feedback()
        sec, nanosec = divmod(int(s.host_time_ns), 1_000_000_000)
        fb.header.stamp.sec, fb.header.stamp.nanosec = sec, nanosec
        fb.joint_names = list(plan.names)
        fb.desired = point(positions=desired[order].tolist(), velocities=qd_des[order].tolist())
        fb.actual = point(positions=actual_q[order].tolist(), velocities=actual_qd[order].tolist(),
                          effort=np.asarray(s.torque, dtype=float)[order].tolist())
        fb.error = point(positions=(desired - actual_q)[order].tolist(), velocities=(qd_des - actual_qd)[order].tolist())
        self.server.publish_feedback(goal, fb)

    def _stop_motion(self) -> None:
        """Bring the running motion to rest with the drives enabled: the driver's controlled stop along the path
        when it has one, else a quick stop and enabling again (holding where the arm came to rest)."""
        try:
            self.client.request("stop")
            stopped_enabled = True
        except CommandRefused:
            self.client.quick_stop()
            stopped_enabled = False
        deadline = time.monotonic() + STOP_WAIT_S
        while self.client.status().get("moving") and time.monotonic() < deadline:
            time.sleep(0.02)
        if not stopped_enabled:
            self.client.enable(wait=True)
