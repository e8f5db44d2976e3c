"""The ROS 2 interface definitions the bridge speaks, as ROS 2 writes them (.msg, .srv and .action text).

Those the recordings already carry (JointState, String, TFMessage, DiagnosticArray and what they use) come from
firmware_bridge.mcap_schema, defined once; the others are the definitions of ROS 2 Humble and Jazzy (their
comments left out): builtin_interfaces, std_msgs, geometry_msgs, trajectory_msgs, unique_identifier_msgs,
action_msgs, std_srvs and control_msgs 4.x/5.x (FollowJointTrajectory without the feedback `index` of control_msgs
6, which Rolling ships).

`DEFINITIONS` maps a full name ("pkg/msg/Name", "pkg/srv/Name", "pkg/action/Name") to its text; a .srv's parts are
separated by `---`, an .action's three likewise.
"""
from __future__ import annotations

from firmware_bridge import mcap_schema

_OWN = {
    "builtin_interfaces/msg/Time": "int32 sec\nuint32 nanosec\n",
    "builtin_interfaces/msg/Duration": "int32 sec\nuint32 nanosec\n",
    "std_msgs/msg/MultiArrayDimension": "string label\nuint32 size\nuint32 stride\n",
    "std_msgs/msg/MultiArrayLayout": "MultiArrayDimension[] dim\nuint32 data_offset\n",
    "std_msgs/msg/Float64MultiArray": "MultiArrayLayout layout\nfloat64[] data\n",
    "geometry_msgs/msg/Twist": "Vector3 linear\nVector3 angular\n",
    "trajectory_msgs/msg/JointTrajectoryPoint": """\
float64[] positions
float64[] velocities
float64[] accelerations
float64[] effort
builtin_interfaces/Duration time_from_start
""",
    "trajectory_msgs/msg/JointTrajectory": """\
std_msgs/Header header
string[] joint_names
JointTrajectoryPoint[] points
""",
    "trajectory_msgs/msg/MultiDOFJointTrajectoryPoint": """\
geometry_msgs/Transform[] transforms
geometry_msgs/Twist[] velocities
geometry_msgs/Twist[] accelerations
builtin_interfaces/Duration time_from_start
""",
    "trajectory_msgs/msg/MultiDOFJointTrajectory": """\
std_msgs/Header header
string[] joint_names
MultiDOFJointTrajectoryPoint[] points
""",
    "unique_identifier_msgs/msg/UUID": "uint8[16] uuid\n",
    "action_msgs/msg/GoalInfo": "unique_identifier_msgs/UUID goal_id\nbuiltin_interfaces/Time stamp\n",
    "action_msgs/msg/GoalStatus": """\
int8 STATUS_UNKNOWN   = 0
int8 STATUS_ACCEPTED  = 1
int8 STATUS_EXECUTING = 2
int8 STATUS_CANCELING = 3
int8 STATUS_SUCCEEDED = 4
int8 STATUS_CANCELED  = 5
int8 STATUS_ABORTED   = 6
GoalInfo goal_info
int8 status
""",
    "action_msgs/msg/GoalStatusArray": "GoalStatus[] status_list\n",
    "action_msgs/srv/CancelGoal": """\
GoalInfo goal_info
---
int8 ERROR_NONE=0
int8 ERROR_REJECTED=1
int8 ERROR_UNKNOWN_GOAL_ID=2
int8 ERROR_GOAL_TERMINATED=3
int8 return_code
GoalInfo[] goals_canceling
""",
    "std_srvs/srv/Trigger": "---\nbool success\nstring message\n",
    "control_msgs/msg/JointTolerance": """\
string name
float64 position
float64 velocity
float64 acceleration
""",
    "control_msgs/msg/JointComponentTolerance": """\
uint16 X_AXIS=1
uint16 Y_AXIS=2
uint16 Z_AXIS=3
uint16 TRANSLATION=4
uint16 ROTATION=5
string joint_name
uint16 component
float64 position
float64 velocity
float64 acceleration
""",
    "control_msgs/action/FollowJointTrajectory": """\
trajectory_msgs/JointTrajectory trajectory
trajectory_msgs/MultiDOFJointTrajectory multi_dof_trajectory
JointTolerance[] path_tolerance
JointComponentTolerance[] component_path_tolerance
JointTolerance[] goal_tolerance
JointComponentTolerance[] component_goal_tolerance
builtin_interfaces/Duration goal_time_tolerance
---
int32 error_code
int32 SUCCESSFUL = 0
int32 INVALID_GOAL = -1
int32 INVALID_JOINTS = -2
int32 OLD_HEADER_TIMESTAMP = -3
int32 PATH_TOLERANCE_VIOLATED = -4
int32 GOAL_TOLERANCE_VIOLATED = -5
string error_string
---
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
}


def split_bundle(name: str, text: str) -> dict[str, str]:
    """A definition with its dependencies appended as MCAP's ros2msg schemas carry them ("MSG: pkg/Name"
    sections) as {full name: text}."""
    out, current, lines = {}, name, []
    for line in text.splitlines():
        if line.startswith("====="):
            continue
        if line.startswith("MSG: "):
            out[current] = "\n".join(lines) + "\n"
            pkg, _, short = line[5:].strip().partition("/")
            current, lines = f"{pkg}/msg/{short}", []
            continue
        lines.append(line)
    out[current] = "\n".join(lines) + "\n"
    return out


def _definitions() -> dict[str, str]:
    out: dict[str, str] = {}
    for name, text in (mcap_schema.JOINT_STATE, mcap_schema.STRING, mcap_schema.TF_MESSAGE,
                       mcap_schema.DIAGNOSTIC_ARRAY):
        for full, part in split_bundle(name, text).items():
            out.setdefault(full, part)
    out.update(_OWN)
    return out


DEFINITIONS = _definitions()
