"""A ROS 2 action client on plain DDS, as rcl_action and rmw_cyclonedds lay it out, with types generated from the
ROS 2 definitions (ros2_peer.idl_class): run by ros2_peer.py's `action` mode in a process of its own.

The script (a pickle) is a list of steps, each a dict:
  {"send": NAME, "joints": [...], "points": [(t, q, qd or None)], "tolerance": {...} (optional)}   send a goal
  {"wait_result": NAME, "timeout": S}                wait for its result
  {"cancel": NAME, "after": S}                       after S seconds, cancel it (by its id)
  {"sleep": S}
What it saw goes to OUT (a pickle): per goal its acceptance, feedback messages (raw CDR), result (raw CDR of the
get_result reply, with the request header), and each cancel reply (raw CDR).
"""
from __future__ import annotations

import os
import pickle
import time

from ros2_peer import _qos, idl_class, typestore

ACTION = "control_msgs/action/FollowJointTrajectory"


def run_script(domain: int, action_name: str, script_path: str, out: str) -> None:
    from cyclonedds._clayer import ddspy_take
    from cyclonedds.core import InstanceState, SampleState, ViewState
    from cyclonedds.domain import DomainParticipant
    from cyclonedds.pub import DataWriter
    from cyclonedds.sub import DataReader
    from cyclonedds.topic import Topic

    with open(script_path, "rb") as f:
        script = pickle.load(f)
    store = typestore()
    dp = DomainParticipant(domain)
    mask = SampleState.Any | ViewState.Any | InstanceState.Any
    base = action_name + "/_action/"
    services = {}
    for service, req_type, rep_type in (
            ("send_goal", f"{ACTION}_SendGoal_Request", f"{ACTION}_SendGoal_Response"),
            ("get_result", f"{ACTION}_GetResult_Request", f"{ACTION}_GetResult_Response"),
            ("cancel_goal", "action_msgs/srv/CancelGoal_Request", "action_msgs/srv/CancelGoal_Response")):
        req_cls, rep_cls = idl_class(store, req_type, True), idl_class(store, rep_type, True)
        rq = Topic(dp, f"rq{base}{service}Request", req_cls, qos=_qos(True, False, 10))
        rr = Topic(dp, f"rr{base}{service}Reply", rep_cls, qos=_qos(True, False, 10))
        services[service] = (DataWriter(dp, rq, qos=_qos(True, False, 10)), DataReader(dp, rr, qos=_qos(True, False, 10)),
                             req_cls, rep_cls)
    fb_cls = idl_class(store, f"{ACTION}_FeedbackMessage")
    feedback = DataReader(dp, Topic(dp, f"rt{base}feedback", fb_cls, qos=_qos(True, False, 10)),
                          qos=_qos(True, False, 100))
    status_cls = idl_class(store, "action_msgs/msg/GoalStatusArray")
    status = DataReader(dp, Topic(dp, f"rt{base}status", status_cls, qos=_qos(True, True, 1)), qos=_qos(True, True, 1))
    # wait_for_action_server: every service's request reader and reply writer matched
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
            w.get_matched_subscriptions() and r.get_matched_publications() for w, r, _, _ in services.values()):
        time.sleep(0.05)
    seen = {"server_found": time.monotonic() < deadline, "goals": {}, "cancels": {}, "status": []}
    guid = int.from_bytes(os.urandom(8), "little") >> 1
    seq = [0]
    replies: dict[tuple[str, int], bytes] = {}
    pending_results: dict[str, int] = {}
    ids: dict[str, bytes] = {}
    UUID = idl_class(store, "unique_identifier_msgs/msg/UUID")

    def pump():
        for name, (_, reader, _, rep_cls) in services.items():
            for data, info in ddspy_take(reader._ref, mask, 64):
                if info.valid_data:
                    reply = rep_cls.deserialize(data)
                    if reply.guid == guid:
                        replies[(name, reply.seq)] = bytes(data)
        for data, info in ddspy_take(feedback._ref, mask, 256):
            if info.valid_data:
                msg = fb_cls.deserialize(data)
                for goal_name, uuid in ids.items():
                    if bytes(msg.goal_id.uuid) == uuid:
                        seen["goals"][goal_name]["feedback"].append(bytes(data))
        for s in status.take(16):
            seen["status"].append([(bytes(x.goal_info.goal_id.uuid), x.status) for x in s.status_list])

    def call(service, timeout=30.0, **fields):
        writer, _, req_cls, _ = services[service]
        seq[0] += 1
        writer.write(req_cls(guid=guid, seq=seq[0], **fields))
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            pump()
            if (service, seq[0]) in replies:
                return replies.pop((service, seq[0]))
            time.sleep(0.005)
        return None

    def request_result(name):
        writer, _, req_cls, _ = services["get_result"]
        seq[0] += 1
        pending_results[name] = seq[0]
        writer.write(req_cls(guid=guid, seq=seq[0], goal_id=UUID(uuid=list(ids[name]))))

    Goal = idl_class(store, f"{ACTION}_Goal")
    Traj = idl_class(store, "trajectory_msgs/msg/JointTrajectory")
    Point = idl_class(store, "trajectory_msgs/msg/JointTrajectoryPoint")
    Duration = idl_class(store, "builtin_interfaces/msg/Duration")
    Tol = idl_class(store, "control_msgs/msg/JointTolerance")
    send_rep = services["send_goal"][3]
    for step in script:
        if "send" in step:
            name = step["send"]
            ids[name] = os.urandom(16)
            seen["goals"][name] = {"feedback": [], "result": None, "accepted": None, "sent": time.time_ns()}
            points = [Point(positions=list(q), velocities=list(qd) if qd is not None else [],
                            time_from_start=Duration(sec=int(t), nanosec=int(round((t - int(t)) * 1e9))))
                      for t, q, qd in step["points"]]
            tol = step.get("tolerance", {})
            goal = Goal(trajectory=Traj(joint_names=list(step["joints"]), points=points),
                        path_tolerance=[Tol(name=j, position=v) for j, v in tol.get("path", {}).items()],
                        goal_tolerance=[Tol(name=j, position=v) for j, v in tol.get("goal", {}).items()])
            raw = call("send_goal", goal_id=UUID(uuid=list(ids[name])), goal=goal)
            accepted = raw is not None and send_rep.deserialize(raw).accepted
            seen["goals"][name]["accepted"] = accepted if raw is not None else None
            if accepted:
                request_result(name)
        elif "wait_result" in step:
            name = step["wait_result"]
            end = time.monotonic() + step.get("timeout", 60.0)
            key = ("get_result", pending_results.get(name))
            while time.monotonic() < end and key not in replies:
                pump()
                time.sleep(0.005)
            seen["goals"][name]["result"] = replies.pop(key, None)
        elif "cancel" in step:
            time.sleep(step.get("after", 0.0))
            GoalInfo = idl_class(store, "action_msgs/msg/GoalInfo")
            raw = call("cancel_goal", goal_info=GoalInfo(goal_id=UUID(uuid=list(ids[step["cancel"]]))))
            seen["cancels"][step["cancel"]] = raw
        elif "sleep" in step:
            end = time.monotonic() + step["sleep"]
            while time.monotonic() < end:
                pump()
                time.sleep(0.005)
    pump()
    seen["ids"] = ids
    with open(out, "wb") as f:
        pickle.dump(seen, f)
