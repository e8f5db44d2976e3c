"""A DDS participant that knows ROS 2 only from its message definitions: types generated from rosbags' ROS 2 Humble
store (and the upstream .msg/.srv/.action text of the few it lacks), named and laid out as ROS 2's IDL makes them,
never from armid's own. Run as a second process by the ROS 2 bridge's tests (`python ros2_peer.py MODE ...`); it
writes what it saw to a pickle file. Also imported by those tests for the loopback-only Cyclone DDS setup and a
domain id of their own.

Modes:
  listen DOMAIN NAMESPACE SECONDS OUT   subscribe to the bridge's topics, keep the raw CDR and the discovery data
  action DOMAIN NAMESPACE OUT SCRIPT    act as a ROS 2 action client (SCRIPT: a pickle of goals to send)
"""
from __future__ import annotations

import fcntl
import os
import pickle
import random
import sys
import time
import types as pytypes
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# Loopback only, unicast discovery to this host: no packet leaves the machine.
LOOPBACK_CONFIG = """<CycloneDDS><Domain id="any"><General><Interfaces><NetworkInterface address="127.0.0.1"/>
</Interfaces><AllowMulticast>false</AllowMulticast></General><Discovery><ParticipantIndex>auto</ParticipantIndex>
<MaxAutoParticipantIndex>20</MaxAutoParticipantIndex><Peers><Peer address="127.0.0.1"/></Peers></Discovery>
</Domain></CycloneDDS>"""
DOMAINS = range(120, 200)            # domain ids the tests take one of (ports 7400 + 250 d .. + 20 participants)


def use_loopback() -> None:
    os.environ["CYCLONEDDS_URI"] = LOOPBACK_CONFIG.replace("\n", "")


@contextmanager
def own_domain():
    """A DDS domain id no other test on this machine holds (a lock file per id), for as long as the block runs;
    tried in a random order, so that a test seldom gets the id of one just before it (whose participants this
    process may not have collected yet)."""
    for domain in random.sample(list(DOMAINS), len(DOMAINS)):
        path = Path(f"/tmp/armid-test-dds-domain-{domain}.lock")
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        try:
            yield domain
            return
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
    raise RuntimeError(f"no free DDS domain id in {DOMAINS}")


# -- the ROS 2 definitions rosbags' store lacks (upstream text: std_srvs, action_msgs, control_msgs 4.x/5.x) ----------
UPSTREAM = {
    "std_srvs/srv/Trigger_Request": "",
    "std_srvs/srv/Trigger_Response": "bool success # indicate successful run of triggered service\n"
                                     "string message # informational, e.g. for error messages\n",
    "action_msgs/srv/CancelGoal_Request": "action_msgs/GoalInfo goal_info\n",
    "action_msgs/srv/CancelGoal_Response": "int8 ERROR_NONE=0\nint8 ERROR_REJECTED=1\nint8 ERROR_UNKNOWN_GOAL_ID=2\n"
                                           "int8 ERROR_GOAL_TERMINATED=3\nint8 return_code\naction_msgs/GoalInfo[] goals_canceling\n",
    "control_msgs/msg/JointTolerance": "string name\nfloat64 position  # in radians or meters\n"
                                       "float64 velocity  # in rad/sec or m/sec\nfloat64 acceleration  # in rad/sec^2\n",
    "control_msgs/msg/JointComponentTolerance": "uint16 X_AXIS=1\nuint16 Y_AXIS=2\nuint16 Z_AXIS=3\nuint16 TRANSLATION=4\n"
                                                "uint16 ROTATION=5\nstring joint_name\nuint16 component\n"
                                                "float64 position\nfloat64 velocity\nfloat64 acceleration\n",
    "control_msgs/action/FollowJointTrajectory_Goal": """\
trajectory_msgs/JointTrajectory trajectory
trajectory_msgs/MultiDOFJointTrajectory multi_dof_trajectory
control_msgs/JointTolerance[] path_tolerance
control_msgs/JointComponentTolerance[] component_path_tolerance
control_msgs/JointTolerance[] goal_tolerance
control_msgs/JointComponentTolerance[] component_goal_tolerance
builtin_interfaces/Duration goal_time_tolerance
""",
    "control_msgs/action/FollowJointTrajectory_Result": """\
int32 error_code
int32 SUCCESSFUL = 0
int32 INVALID_GOAL = -1
int32 INVALID_JOINTS = -2
int32 OLD_HEADER_TIMESTAMP = -3
int32 PATH_TOLERANCE_VIOLATED = -4
int32 GOAL_TOLERANCE_VIOLATED = -5
string error_string
""",
    "control_msgs/action/FollowJointTrajectory_Feedback": """\
std_msgs/Header header
string[] joint_names
trajectory_msgs/JointTrajectoryPoint desired
trajectory_msgs/JointTrajectoryPoint actual
trajectory_msgs/JointTrajectoryPoint error
string[] multi_dof_joint_names
trajectory_msgs/MultiDOFJointTrajectoryPoint multi_dof_desired
trajectory_msgs/MultiDOFJointTrajectoryPoint multi_dof_actual
trajectory_msgs/MultiDOFJointTrajectoryPoint multi_dof_error
""",
    # what rosidl derives from an action (package-qualified names, as rosbags resolves them)
    "control_msgs/action/FollowJointTrajectory_SendGoal_Request":
        "unique_identifier_msgs/UUID goal_id\ncontrol_msgs/action/FollowJointTrajectory_Goal goal\n",
    "control_msgs/action/FollowJointTrajectory_SendGoal_Response": "bool accepted\nbuiltin_interfaces/Time stamp\n",
    "control_msgs/action/FollowJointTrajectory_GetResult_Request": "unique_identifier_msgs/UUID goal_id\n",
    "control_msgs/action/FollowJointTrajectory_GetResult_Response":
        "int8 status\ncontrol_msgs/action/FollowJointTrajectory_Result result\n",
    "control_msgs/action/FollowJointTrajectory_FeedbackMessage":
        "unique_identifier_msgs/UUID goal_id\ncontrol_msgs/action/FollowJointTrajectory_Feedback feedback\n",
}


def typestore():
    """rosbags' ROS 2 Humble store with the definitions above added."""
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.ROS2_HUMBLE)
    for name, text in UPSTREAM.items():
        # rosbags files a name of three parts under pkg/kind/msg/Name: keep ROS 2's own name
        store.register({name: next(iter(get_types_from_msg(text, name).values())) if text else ([], [])})
    return store


_IDL: dict = {}


def idl_class(store, name: str, request_header: bool = False):
    """A Cyclone DDS struct for the ROS 2 type `name`, from rosbags' field definitions: ROS 2's DDS type name
    (pkg::kind::dds_::Name_), final, an empty message given `uint8 structure_needs_at_least_one_member`; a service
    message preceded by rmw_cyclonedds's request header (uint64 guid, int64 seq) when request_header."""
    from cyclonedds.idl import IdlStruct
    from cyclonedds.idl import annotations as annotate
    from cyclonedds.idl import types as t
    from rosbags.typesys.base import Nodetype

    key = (name, request_header)
    if key in _IDL:
        return _IDL[key]
    base = {"bool": bool, "byte": t.byte, "char": t.uint8, "int8": t.int8, "uint8": t.uint8, "int16": t.int16,
            "uint16": t.uint16, "int32": t.int32, "uint32": t.uint32, "int64": t.int64, "uint64": t.uint64,
            "float32": t.float32, "float64": t.float64, "string": str}

    def kind_of(node):
        what, detail = node
        if what == Nodetype.BASE:
            typ, bound = detail
            if typ == "string":
                return (t.bounded_str[bound] if bound else str), str
            return base[typ], (float if typ.startswith("float") else bool if typ == "bool" else int)
        if what == Nodetype.NAME:
            cls = idl_class(store, detail)
            return cls, cls
        inner, _ = kind_of(detail[0])
        if what == Nodetype.ARRAY:
            return t.array[inner, detail[1]], (lambda: [0] * detail[1])
        return (t.sequence[inner, detail[1]] if detail[1] else t.sequence[inner]), list

    members = [("guid", t.uint64, int), ("seq", t.int64, int)] if request_header else []
    for fname, node in store.fielddefs[name][1]:
        kind, factory = kind_of(node)
        members.append((fname, kind, factory))
    if len(members) == (2 if request_header else 0):
        members.append(("structure_needs_at_least_one_member", t.uint8, int))
    pkg, kind, short = name.split("/")
    typename = f"{pkg}::{kind}::dds_::{short}_"

    def body(ns):
        ns["__annotations__"] = {m: k for m, k, _ in members}
        for m, _, f in members:
            ns[m] = field(default_factory=f)
    cls = dataclass(annotate.final(pytypes.new_class(short + "_", (IdlStruct,), {"typename": typename}, body)))
    _IDL[key] = cls
    return cls


# -- listen --------------------------------------------------------------------------------------------------------
LISTEN = {  # DDS topic (relative ones under the namespace) -> (ROS type, reliable, transient local, depth)
    "joint_states": ("sensor_msgs/msg/JointState", True, False, 10),
    "/tf": ("tf2_msgs/msg/TFMessage", True, False, 100),
    "/tf_static": ("tf2_msgs/msg/TFMessage", True, True, 1),
    "robot_description": ("std_msgs/msg/String", True, True, 1),
    "/diagnostics": ("diagnostic_msgs/msg/DiagnosticArray", True, False, 10),
}


ACTION_BASE = "armid_controller/follow_joint_trajectory/_action/"
ENDPOINTS = ["rr{ns}/enableReply", "rr{ns}/disableReply", "rr{ns}/quick_stopReply",
             "rt{ns}/" + ACTION_BASE + "status", "rt{ns}/" + ACTION_BASE + "feedback",
             "rr{ns}/" + ACTION_BASE + "send_goalReply", "rr{ns}/" + ACTION_BASE + "cancel_goalReply",
             "rr{ns}/" + ACTION_BASE + "get_resultReply"]    # the bridge's other publications, awaited too


def _qos(reliable: bool, transient: bool, depth: int):
    from cyclonedds.qos import Policy, Qos

    return Qos(Policy.Reliability.Reliable(max_blocking_time=100_000_000) if reliable else Policy.Reliability.BestEffort,
               Policy.Durability.TransientLocal if transient else Policy.Durability.Volatile,
               Policy.History.KeepLast(depth))


def ros_topic(name: str, namespace: str) -> str:
    return "rt" + (name if name.startswith("/") else f"{namespace}/{name}")


def listen(domain: int, namespace: str, seconds: float, out: str) -> None:
    """Raw samples per topic [(cdr bytes, source timestamp ns)] and the publications discovered
    (topic, type, reliability, durability, history) until each topic has 3 samples or `seconds` pass."""
    from cyclonedds._clayer import ddspy_take
    from cyclonedds.builtin import BuiltinDataReader, BuiltinTopicDcpsPublication
    from cyclonedds.core import InstanceState, SampleState, ViewState
    from cyclonedds.domain import DomainParticipant
    from cyclonedds.sub import DataReader
    from cyclonedds.topic import Topic

    store = typestore()
    dp = DomainParticipant(domain)
    readers = {}
    for name, (typ, reliable, transient, depth) in LISTEN.items():
        topic = Topic(dp, ros_topic(name, namespace), idl_class(store, typ), qos=_qos(reliable, transient, depth))
        readers[name] = DataReader(dp, topic, qos=_qos(reliable, transient, max(depth, 200)))
    pubs = BuiltinDataReader(dp, BuiltinTopicDcpsPublication)
    got = {name: [] for name in readers}
    found = {}
    mask = SampleState.Any | ViewState.Any | InstanceState.Any
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for name, reader in readers.items():
            for data, info in ddspy_take(reader._ref, mask, 256):
                if info.valid_data:
                    got[name].append((bytes(data), int(info.source_timestamp)))
        for p in pubs.take(64):
            if getattr(p, "topic_name", None):
                q = p.qos
                found[p.topic_name] = {"type": p.type_name, "reliability": type(q[_policy("Reliability")]).__name__,
                                       "durability": str(q[_policy("Durability")]),
                                       "history": str(q[_policy("History")])}
        if all(len(v) >= 3 for k, v in got.items() if k not in ("/tf_static", "robot_description")) \
                and got["/tf_static"] and got["robot_description"] and len(got["/diagnostics"]) >= 2 \
                and all(ros_topic(n, namespace) in found for n in LISTEN) \
                and all(e.format(ns=namespace) in found for e in ENDPOINTS):
            break
        time.sleep(0.01)
    with open(out, "wb") as f:
        pickle.dump({"samples": got, "publications": found}, f)


def _policy(name: str):
    from cyclonedds.qos import Policy

    return getattr(Policy, name)


if __name__ == "__main__":
    use_loopback()
    mode, *args = sys.argv[1:]
    if mode == "listen":
        listen(int(args[0]), args[1], float(args[2]), args[3])
    elif mode == "action":
        from ros2_action_client import run_script
        run_script(int(args[0]), args[1], args[2], args[3])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
