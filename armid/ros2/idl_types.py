"""ROS 2 interface definitions (armid.ros2.interfaces) as Cyclone DDS types, named and laid out as ROS 2's IDL
makes them: struct `pkg::msg::dds_::Name_` (srv and action likewise), every struct final (plain CDR, no
extensibility headers), `byte` an octet, `char` a uint8, an empty message one `uint8
structure_needs_at_least_one_member`; constants are left out (they are not on the wire).

    types = idl_types.Registry()
    JointState = types.message("sensor_msgs/msg/JointState")
    Request, Response = types.service("std_srvs/srv/Trigger")
    parts = types.action("control_msgs/action/FollowJointTrajectory")   # SendGoal_Request, ..., FeedbackMessage

A service's request and reply carry, ahead of the message's fields, the 16-byte header rmw_cyclonedds puts there
(`guid`, the client's writer, and `seq`, the request's number), which the reply repeats: Registry.service gives
those wire types.
"""
from __future__ import annotations

import re
import types as pytypes
from dataclasses import dataclass, field

from cyclonedds.idl import IdlStruct
from cyclonedds.idl import annotations as annotate
from cyclonedds.idl import types as t

from armid.ros2.interfaces import DEFINITIONS

PRIMITIVES = {"bool": bool, "byte": t.byte, "char": t.uint8, "float32": t.float32, "float64": t.float64,
              "int8": t.int8, "uint8": t.uint8, "int16": t.int16, "uint16": t.uint16, "int32": t.int32,
              "uint32": t.uint32, "int64": t.int64, "uint64": t.uint64, "string": str, "wstring": str}
_FIELD = re.compile(r"^(?P<type>[A-Za-z0-9_/]+(?:<=\d+)?)(?P<array>\[(?:<=)?\d*\])?\s+(?P<name>[A-Za-z_][A-Za-z0-9_]*)")
EMPTY_MEMBER = "structure_needs_at_least_one_member"
REQUEST_HEADER = (("guid", t.uint64), ("seq", t.int64))


class DefinitionError(ValueError):
    """A definition that does not parse, or names a type that is not defined."""


def dds_type_name(full_name: str) -> str:
    """`pkg/msg/Name` -> `pkg::msg::dds_::Name_` (ROS 2's type name on DDS)."""
    pkg, kind, name = full_name.split("/")
    return f"{pkg}::{kind}::dds_::{name}_"


def parse_fields(text: str) -> list[tuple[str, str]]:
    """(type, name) of each field of one .msg part, in order; comments, constants and blank lines skipped."""
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if "=" in line and line.split("=", 1)[0].split()[-1].isupper():
            continue                                                    # a constant
        m = _FIELD.match(line)
        if m is None:
            raise DefinitionError(f"line {number}: cannot read {raw!r}")
        out.append((m["type"] + (m["array"] or ""), m["name"]))
    return out


def _struct(typename: str, members: list[tuple[str, object, object]]):
    """A final Cyclone DDS struct named `typename` with members (name, idl type, default factory)."""
    def body(ns):
        ns["__annotations__"] = {name: kind for name, kind, _ in members}
        for name, _, factory in members:
            ns[name] = field(default_factory=factory)
    cls = pytypes.new_class(typename.rsplit("::", 1)[1], (IdlStruct,), {"typename": typename}, body)
    return dataclass(annotate.final(cls))


class Registry:
    """Cyclone DDS types for the definitions (DEFINITIONS by default), each made once."""

    def __init__(self, definitions: dict[str, str] | None = None):
        self.definitions = DEFINITIONS if definitions is None else definitions
        self._types: dict[str, type] = {}

    def _resolve(self, type_name: str, package: str) -> str:
        if type_name.count("/") == 2:
            return type_name
        if "/" in type_name:
            pkg, name = type_name.split("/")
            return f"{pkg}/msg/{name}"
        return f"{package}/msg/{type_name}"

    def _member(self, spec: str, package: str, local: dict):
        """(idl type, default factory) of a field type such as float64[], uint8[16], string<=10, pkg/Name[<=3];
        `local` maps names (an action's own Name_Goal, ...) to structs already made."""
        base, _, array = spec.partition("[")
        bound = None
        if "<=" in base:
            base, bound = base.split("<=")
        if base in PRIMITIVES:
            kind = PRIMITIVES[base]
            zero = str if kind is str else bool if kind is bool else float if base.startswith("float") else int
            if bound is not None and kind is str:
                kind = t.bounded_str[int(bound)]
        else:
            kind = local.get(base) or self.message(self._resolve(base, package))
            zero = kind
        if not array:
            return kind, zero
        size = array.rstrip("]")
        if size.startswith("<="):
            return t.sequence[kind, int(size[2:])], list
        if size:
            return t.array[kind, int(size)], (lambda: [zero() for _ in range(int(size))])
        return t.sequence[kind], list

    def _make(self, full_name: str, text: str, prefix: tuple = (), local: dict | None = None):
        package = full_name.split("/")[0]
        members = [(name, kind, int) for name, kind in prefix]
        for spec, name in parse_fields(text):
            kind, factory = self._member(spec, package, local or {})
            members.append((name, kind, factory))
        if len(members) == len(prefix):
            members.append((EMPTY_MEMBER, t.uint8, int))
        return _struct(dds_type_name(full_name), members)

    def _parts(self, full_name: str, count: int) -> list[str]:
        try:
            text = self.definitions[full_name]
        except KeyError:
            raise DefinitionError(f"{full_name}: no such definition") from None
        parts = re.split(r"^---\s*$", text, flags=re.M)
        if len(parts) != count:
            raise DefinitionError(f"{full_name}: expected {count} parts separated by ---, got {len(parts)}")
        return parts

    def message(self, full_name: str):
        """The struct of a message `pkg/msg/Name` (or a part of a service or action, once made)."""
        if full_name not in self._types:
            (text,) = self._parts(full_name, 1)
            self._types[full_name] = self._make(full_name, text)
        return self._types[full_name]

    def service(self, full_name: str, *, header: bool = True):
        """(request, response) wire structs of a service `pkg/srv/Name`: `Name_Request_`, `Name_Response_`, with
        rmw_cyclonedds's request header first when `header`."""
        key = (full_name, header)
        if key not in self._types:
            request, response = self._parts(full_name, 2)
            prefix = REQUEST_HEADER if header else ()
            self._types[key] = (self._make(full_name + "_Request", request, prefix),
                                self._make(full_name + "_Response", response, prefix))
        return self._types[key]

    def action(self, full_name: str) -> "ActionTypes":
        """The structs of an action `pkg/action/Name`: its goal, result and feedback, and the wire types of its
        send_goal and get_result services (with the request header) and of its feedback topic."""
        if full_name not in self._types:
            goal, result, feedback = self._parts(full_name, 3)
            name = full_name.rsplit("/", 1)[1]
            local = {f"{name}_{part}": self._make(f"{full_name}_{part}", text)
                     for part, text in (("Goal", goal), ("Result", result), ("Feedback", feedback))}
            uuid = "unique_identifier_msgs/UUID goal_id\n"
            wire = {
                "SendGoal_Request": (uuid + f"{name}_Goal goal\n", REQUEST_HEADER),
                "SendGoal_Response": ("bool accepted\nbuiltin_interfaces/Time stamp\n", REQUEST_HEADER),
                "GetResult_Request": (uuid, REQUEST_HEADER),
                "GetResult_Response": (f"int8 status\n{name}_Result result\n", REQUEST_HEADER),
                "FeedbackMessage": (uuid + f"{name}_Feedback feedback\n", ())}
            made = {part: self._make(f"{full_name}_{part}", text, prefix, local)
                    for part, (text, prefix) in wire.items()}
            self._types[full_name] = ActionTypes(
                local[f"{name}_Goal"], local[f"{name}_Result"], local[f"{name}_Feedback"],
                made["SendGoal_Request"], made["SendGoal_Response"], made["GetResult_Request"],
                made["GetResult_Response"], made["FeedbackMessage"])
        return self._types[full_name]


@dataclass(frozen=True)
class ActionTypes:
    """The structs of one action (Registry.action)."""

    goal: type
    result: type
    feedback: type
    send_goal_request: type
    send_goal_response: type
    get_result_request: type
    get_result_response: type
    feedback_message: type
