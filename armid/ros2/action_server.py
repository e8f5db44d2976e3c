"""A ROS 2 action server on plain DDS, as rcl_action lays an action out: three services and two topics under
`<action>/_action/`:

  send_goal    service  {guid, seq, goal_id (UUID), goal}            -> {guid, seq, accepted, stamp}
  cancel_goal  service  action_msgs/srv/CancelGoal {goal_info}        -> {return_code, goals_canceling}
  get_result   service  {guid, seq, goal_id}                          -> {guid, seq, status, result}, once the goal ends
  feedback     topic    {goal_id, feedback}                            reliable, volatile, keep last 10
  status       topic    action_msgs/msg/GoalStatusArray                reliable, transient local, keep last 1

The behaviour (accepting, executing, cancelling) is the owner's, through the callbacks; this class keeps the goals'
states, answers the services and publishes the status on every change. poll() serves what arrived, from one thread;
the other methods may be called from any thread.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from armid.ros2 import dds

UNKNOWN, ACCEPTED, EXECUTING, CANCELING, SUCCEEDED, CANCELED, ABORTED = range(7)
TERMINAL = (SUCCEEDED, CANCELED, ABORTED)
CANCEL_NONE, CANCEL_REJECTED, CANCEL_UNKNOWN_GOAL, CANCEL_TERMINATED = range(4)
KEEP_ENDED = 32                 # ended goals whose results stay available


@dataclass
class Goal:
    """One goal: its id (16 bytes), acceptance time (UNIX ns), status, the decoded goal, its result once ended."""

    uuid: bytes
    stamp_ns: int
    request: object
    status: int = ACCEPTED
    result: object | None = None
    waiting: list = field(default_factory=list)      # get_result requests answered when it ends
    cancel_requested: threading.Event = field(default_factory=threading.Event)

    @property
    def done(self) -> bool:
        return self.status in TERMINAL


def _time(types, ns: int):
    sec, nanosec = divmod(int(ns), 1_000_000_000)
    return types.message("builtin_interfaces/msg/Time")(sec=sec, nanosec=nanosec)


class ActionServer:
    """The DDS endpoints of one action and the states of its goals.

    on_goal(goal) -> str | None: None accepts (the owner then executes it and calls finish), a text rejects.
    on_cancel(goal) -> bool: True when the goal will be cancelled (it becomes CANCELING; the owner calls finish
    with CANCELED once it has stopped).
    """

    def __init__(self, participant, registry, fqn: str, action_type: str, on_goal, on_cancel):
        self.types = registry
        self.action = registry.action(action_type)
        self.name = fqn
        base = f"{fqn}/_action/"
        self.send_goal = dds.Service(participant, base + "send_goal", self.action.send_goal_request,
                                     self.action.send_goal_response)
        self.get_result = dds.Service(participant, base + "get_result", self.action.get_result_request,
                                      self.action.get_result_response)
        self.cancel_goal = dds.Service(participant, base + "cancel_goal", *registry.service("action_msgs/srv/CancelGoal"))
        self.feedback = dds.Writer(participant, dds.topic_name(base + "feedback"), self.action.feedback_message,
                                   dds.DEFAULT)
        self.status = dds.Writer(participant, dds.topic_name(base + "status"),
                                 registry.message("action_msgs/msg/GoalStatusArray"), dds.LATCHED)
        self.on_goal, self.on_cancel = on_goal, on_cancel
        self.goals: dict[bytes, Goal] = {}
        self.rejected = 0
        self._lock = threading.RLock()
        self._publish_status()

    # -- served from the owner's thread -------------------------------------------------------------------------
    def poll(self) -> list[Goal]:
        """Serve the requests that arrived; returns the goals accepted now (the owner starts executing them)."""
        accepted = []
        for request in self.send_goal.take():
            uuid = bytes(request.goal_id.uuid)
            goal = Goal(uuid, time.time_ns(), request)
            with self._lock:
                duplicate = uuid in self.goals
            why = "a goal with this id exists" if duplicate else self.on_goal(goal)
            ok = why is None
            if ok:
                with self._lock:
                    self.goals[uuid] = goal
                accepted.append(goal)
            else:
                self.rejected += 1
            self.send_goal.reply(request, accepted=ok, stamp=_time(self.types, goal.stamp_ns))
        if accepted:
            self._publish_status()
        for request in self.cancel_goal.take():
            self._cancel(request)
        for request in self.get_result.take():
            with self._lock:
                goal = self.goals.get(bytes(request.goal_id.uuid))
                if goal is not None and not goal.done:
                    goal.waiting.append(request)
                    continue
            if goal is None:
                self.get_result.reply(request, status=UNKNOWN, result=self.action.result())
            else:
                self.get_result.reply(request, status=goal.status, result=goal.result)
        return accepted

    def _cancel(self, request) -> None:
        info = request.goal_info
        uuid, stamp = bytes(info.goal_id.uuid), info.stamp.sec * 1_000_000_000 + info.stamp.nanosec
        with self._lock:
            if any(uuid):
                chosen = [g for g in self.goals.values() if g.uuid == uuid or (stamp and g.stamp_ns <= stamp)]
            else:
                chosen = [g for g in self.goals.values() if not stamp or g.stamp_ns <= stamp]
            if any(uuid) and uuid not in self.goals:
                code, canceling = CANCEL_UNKNOWN_GOAL, []
            else:
                live = [g for g in chosen if not g.done]
                canceling = [g for g in live if g.status == CANCELING or self.on_cancel(g)]
                for g in canceling:
                    g.status = CANCELING
                    g.cancel_requested.set()
                code = CANCEL_NONE if canceling else CANCEL_TERMINATED if chosen and not live else CANCEL_REJECTED
        infos = [self.types.message("action_msgs/msg/GoalInfo")(
            goal_id=self.types.message("unique_identifier_msgs/msg/UUID")(uuid=list(g.uuid)),
            stamp=_time(self.types, g.stamp_ns)) for g in canceling]
        self.cancel_goal.reply(request, return_code=code, goals_canceling=infos)
        if canceling:
            self._publish_status()

    # -- from any thread --------------------------------------------------------------------------------------
    def set_executing(self, goal: Goal) -> None:
        with self._lock:
            if goal.status == ACCEPTED:
                goal.status = EXECUTING
        self._publish_status()

    def finish(self, goal: Goal, status: int, result) -> None:
        """End a goal (SUCCEEDED, CANCELED or ABORTED) with its result; answers the waiting get_result requests."""
        with self._lock:
            if goal.done:
                return
            goal.status, goal.result = status, result
            waiting, goal.waiting = goal.waiting, []
            ended = [g for g in self.goals.values() if g.done]
            for old in ended[:-KEEP_ENDED]:
                self.goals.pop(old.uuid, None)
        for request in waiting:
            self.get_result.reply(request, status=status, result=result)
        self._publish_status()

    def publish_feedback(self, goal: Goal, feedback) -> None:
        uuid = self.types.message("unique_identifier_msgs/msg/UUID")(uuid=list(goal.uuid))
        self.feedback.write_sample(self.action.feedback_message(goal_id=uuid, feedback=feedback))

    def _publish_status(self) -> None:
        T = self.types.message
        with self._lock:
            entries = [T("action_msgs/msg/GoalStatus")(
                goal_info=T("action_msgs/msg/GoalInfo")(goal_id=T("unique_identifier_msgs/msg/UUID")(uuid=list(g.uuid)),
                                                       stamp=_time(self.types, g.stamp_ns)),
                status=g.status) for g in self.goals.values()]
        self.status.write_sample(T("action_msgs/msg/GoalStatusArray")(status_list=entries))
