"""ROS 2's conventions on plain DDS (Cyclone DDS's Python binding): topic names, QoS profiles, raw CDR writers and
readers, and services as rmw_cyclonedds carries them.

Names: a ROS name relative to the node's namespace (`joint_states` under `/arm1` is `/arm1/joint_states`), or absolute
(`/tf`), becomes the DDS topic `rt/arm1/joint_states`; a service `/arm1/enable` the request topic
`rq/arm1/enableRequest` and the reply topic `rr/arm1/enableReply`. Every writer and reader uses the plain CDR
representation (XCDR1, as ROS 2's RMWs do) and the QoS of the profile it is given.

Samples go out as CDR bytes (encapsulation header first), so that a message encoded once (firmware_bridge.mcap_schema's
fixed layouts) is written without another encoding.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from cyclonedds._clayer import ddspy_take, ddspy_write, ddspy_write_ts
from cyclonedds.core import DDSException, InstanceState, SampleState, ViewState
from cyclonedds.domain import DomainParticipant
from cyclonedds.pub import DataWriter
from cyclonedds.qos import Policy, Qos
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic

from firmware_bridge.runtime.errors import InputError

MAX_DOMAIN_ID = 232            # DDS's port mapping leaves 0..232
_NAME_TOKEN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ANY = SampleState.Any | ViewState.Any | InstanceState.Any


class NameError_(InputError):
    """A namespace or ROS name that ROS 2 would not accept."""


def check_domain_id(domain_id: int) -> int:
    if isinstance(domain_id, bool) or not isinstance(domain_id, int) or not 0 <= domain_id <= MAX_DOMAIN_ID:
        raise InputError(f"domain id {domain_id!r}: expected an integer 0..{MAX_DOMAIN_ID}")
    return domain_id


def normalize_namespace(namespace: str) -> str:
    """'' or 'arm1' or '/arm1/left' -> '' or '/arm1' or '/arm1/left' (InputError naming a bad token)."""
    parts = [p for p in str(namespace).strip().split("/") if p]
    for p in parts:
        if not _NAME_TOKEN.match(p) or "__" in p:
            raise NameError_(f"namespace {namespace!r}: {p!r} is not a ROS name token (letters, digits, underscores, "
                             f"not starting with a digit, no '__')")
    return "".join("/" + p for p in parts)


def qualify(name: str, namespace: str) -> str:
    """The fully qualified ROS name: absolute names stay, relative ones go under the namespace."""
    if name.startswith("/"):
        return name
    return f"{normalize_namespace(namespace)}/{name}"


def topic_name(fqn: str) -> str:
    """ROS 2 topic -> DDS topic: '/arm1/joint_states' -> 'rt/arm1/joint_states'."""
    return "rt" + fqn


def service_topics(fqn: str) -> tuple[str, str]:
    """ROS 2 service -> its DDS request and reply topics: ('rq/NAMERequest', 'rr/NAMEReply')."""
    return f"rq{fqn}Request", f"rr{fqn}Reply"


@dataclass(frozen=True)
class Profile:
    """A ROS 2 QoS profile: reliability, durability, history depth (keep last)."""

    reliable: bool = True
    transient_local: bool = False
    depth: int = 10

    def qos(self) -> Qos:
        return Qos(Policy.Reliability.Reliable(max_blocking_time=100_000_000) if self.reliable
                   else Policy.Reliability.BestEffort,
                   Policy.Durability.TransientLocal if self.transient_local else Policy.Durability.Volatile,
                   Policy.History.KeepLast(self.depth),
                   Policy.DataRepresentation(use_cdrv0_representation=True))


DEFAULT = Profile()                                          # rmw_qos_profile_default: reliable, volatile, 10
LATCHED = Profile(transient_local=True, depth=1)             # /robot_description, /tf_static, an action's status
TF = Profile(depth=100)                                      # tf2's TransformBroadcaster
SERVICES = Profile()                                         # rmw_qos_profile_services_default
SENSOR = Profile(reliable=False, depth=1)                    # a stream where only the newest counts


class Writer:
    """A DDS writer of one ROS topic; `write(cdr)` sends a CDR-encoded sample (bytes, encapsulation first)."""

    def __init__(self, participant: DomainParticipant, dds_topic: str, data_type, profile: Profile):
        self.topic = Topic(participant, dds_topic, data_type, qos=profile.qos())
        self.writer = DataWriter(participant, self.topic, qos=profile.qos())
        self.data_type = data_type

    def write(self, cdr: bytes, timestamp_ns: int | None = None) -> None:
        if len(cdr) % 4:
            cdr = cdr + bytes(-len(cdr) % 4)
        ret = ddspy_write(self.writer._ref, cdr) if timestamp_ns is None else \
            ddspy_write_ts(self.writer._ref, cdr, int(timestamp_ns))
        if ret < 0:
            raise DDSException(ret, f"writing on {self.topic.name}")

    def write_sample(self, sample) -> None:
        """Encode a sample of the writer's type (plain CDR) and write it."""
        self.write(sample.serialize(use_version_2=False))

    def matched(self) -> int:
        return len(self.writer.get_matched_subscriptions())


class Reader:
    """A DDS reader of one ROS topic: `take()` returns the CDR bytes of the samples that arrived."""

    def __init__(self, participant: DomainParticipant, dds_topic: str, data_type, profile: Profile):
        self.topic = Topic(participant, dds_topic, data_type, qos=profile.qos())
        self.reader = DataReader(participant, self.topic, qos=profile.qos())
        self.data_type = data_type

    def take(self, n: int = 64) -> list[bytes]:
        return [data for data, _ in self.take_with_times(n)]

    def take_with_times(self, n: int = 64) -> list[tuple[bytes, int]]:
        """(CDR bytes, the writer's source timestamp in UNIX ns) of each sample that arrived."""
        ret = ddspy_take(self.reader._ref, _ANY, n)
        if isinstance(ret, int):
            raise DDSException(ret, f"taking from {self.topic.name}")
        return [(data, int(info.source_timestamp)) for data, info in ret if info.valid_data]

    def take_samples(self, n: int = 64) -> list:
        """The samples that arrived, decoded; those that do not decode are skipped (InputError not raised)."""
        out = []
        for data in self.take(n):
            try:
                out.append(self.data_type.deserialize(data))
            except Exception:                                    # noqa: BLE001 -- a peer's bad bytes
                continue
        return out


class Service:
    """A ROS 2 service server as rmw_cyclonedds carries it: requests on `rq/NAMERequest`, replies on
    `rr/NAMEReply`, each request's header (the client's guid and sequence number) repeated in its reply."""

    def __init__(self, participant: DomainParticipant, fqn: str, request_type, response_type):
        rq, rr = service_topics(fqn)
        self.name = fqn
        self.requests = Reader(participant, rq, request_type, SERVICES)
        self.replies = Writer(participant, rr, response_type, SERVICES)
        self.response_type = response_type

    def take(self) -> list:
        return self.requests.take_samples()

    def reply(self, request, **fields) -> None:
        self.replies.write_sample(self.response_type(guid=request.guid, seq=request.seq, **fields))
