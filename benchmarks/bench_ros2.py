"""ROS 2 bridge benchmark: /joint_states as a DDS subscriber receives it from `armid ros2`, beside the driver's own
ZeroMQ stream to a plain subscriber (reference), in the same run; and a FollowJointTrajectory goal's time to the
first moving sample, beside run_trajectory sent directly through armid.client (reference).

The driver runs in this process on the simulated generic6 arm (1 kHz); `armid ros2` runs as a process of its own
(its CPU time read from /proc), and each subscriber is a process of its own: the DDS one (Cyclone DDS, the
bridge's own message types) and the ZeroMQ one (pyzmq SUB, decoding each state message). Latency is the time from
the sample's host_time_ns (when the driver read it) to its arrival in the subscriber, on this host's one clock.
DDS stays on loopback (CYCLONEDDS_URI), in a domain of its own.

usage: python benchmarks/bench_ros2.py [--seconds 10] [--goals 5]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

LOOPBACK = ('<CycloneDDS><Domain id="any"><General><Interfaces><NetworkInterface address="127.0.0.1"/></Interfaces>'
            '<AllowMulticast>false</AllowMulticast></General><Discovery><ParticipantIndex>auto</ParticipantIndex>'
            '<MaxAutoParticipantIndex>20</MaxAutoParticipantIndex><Peers><Peer address="127.0.0.1"/></Peers>'
            '</Discovery></Domain></CycloneDDS>')
DOMAIN = 211
ROOT = Path(__file__).resolve().parents[1]


def listen_dds(seconds: float, out: str) -> None:
    """Subscribe to rt/joint_states; write [(arrival ns, stamp ns)]."""
    from cyclonedds.core import ReadCondition, SampleState, ViewState, InstanceState, WaitSet
    from cyclonedds.domain import DomainParticipant
    from cyclonedds.util import duration

    from armid.ros2 import dds
    from armid.ros2.idl_types import Registry

    dp = DomainParticipant(DOMAIN)
    reader = dds.Reader(dp, "rt/joint_states", Registry().message("sensor_msgs/msg/JointState"), dds.DEFAULT)
    ws = WaitSet(dp)
    ws.attach(ReadCondition(reader.reader, SampleState.Any | ViewState.Any | InstanceState.Any))
    got = []
    cpu, end = time.process_time(), time.monotonic() + seconds
    while time.monotonic() < end:
        ws.wait(duration(milliseconds=100))
        now = time.time_ns()
        for data, stamp in reader.take_with_times(256):
            got.append((now, stamp))
    Path(out).write_text(json.dumps({"rows": got, "cpu": (time.process_time() - cpu) / seconds}))


def listen_zmq(endpoint: str, seconds: float, out: str) -> None:
    """Subscribe to the driver's state topic; write [(arrival ns, host_time_ns)]."""
    import zmq

    from firmware_bridge import stream

    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_STATE)
    sub.connect(endpoint)
    got = []
    cpu, end = time.process_time(), time.monotonic() + seconds
    while time.monotonic() < end:
        if sub.poll(100):
            _, payload = sub.recv_multipart()
            got.append((time.time_ns(), int(stream.decode_state(payload)["host_time_ns"])))
    Path(out).write_text(json.dumps({"rows": got, "cpu": (time.process_time() - cpu) / seconds}))
    sub.close(0)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _figures(rows, seconds: float) -> tuple[float, float, float]:
    a = np.array(rows, dtype=np.int64).reshape(-1, 2)
    if len(a) < 2:
        return 0.0, float("nan"), float("nan")
    lat = (a[:, 0] - a[:, 1]) / 1e6
    return len(a) / seconds, float(np.median(lat)), float(np.percentile(lat, 99))


def _run_listeners(driver, rate: float, seconds: float, tmp: Path, env: dict) -> None:
    bridge = subprocess.Popen([sys.executable, "-m", "armid.cli", "ros2", "--state", driver.bound["state"],
                               "--commands", driver.bound["commands"], "--domain-id", str(DOMAIN), "--rate", str(rate)],
                              env=env, stdout=subprocess.DEVNULL)
    try:
        time.sleep(3.0)                                    # the bridge up and discovered
        me = [sys.executable, __file__]
        dds_p = subprocess.Popen(me + ["--listen-dds", str(seconds), str(tmp / "dds.json")], env=env)
        zmq_p = subprocess.Popen(me + ["--listen-zmq", driver.bound["state"], str(seconds), str(tmp / "zmq.json")],
                                 env=env)
        time.sleep(1.0)                                   # discovery, then the measured window
        cpu0, t0 = _cpu_s(bridge.pid), time.monotonic()
        dds_p.wait(seconds + 60)
        cpu = (_cpu_s(bridge.pid) - cpu0) / (time.monotonic() - t0)
        zmq_p.wait(seconds + 60)
    finally:
        bridge.terminate()
        bridge.wait(20)
    dds_seen, zmq_seen = (json.loads((tmp / f).read_text()) for f in ("dds.json", "zmq.json"))
    rate_d, p50_d, p99_d = _figures(dds_seen["rows"], seconds)
    rate_z, p50_z, p99_z = _figures(zmq_seen["rows"], seconds)
    cpu_ref = zmq_seen["cpu"]
    tag = f"{rate:g} Hz"
    print(f"joint_states delivered rate at {tag}: {rate_d:.1f} msg/s (reference ZeroMQ stream: {rate_z:.1f} msg/s, "
          f"ratio {rate_d / rate_z:.3f}x; asked {rate:g})")
    print(f"joint_states latency p50 at {tag}: {p50_d:.3f} ms (reference ZeroMQ stream: {p50_z:.3f} ms, "
          f"ratio {p50_d / p50_z:.2f}x)")
    print(f"joint_states latency p99 at {tag}: {p99_d:.3f} ms (reference ZeroMQ stream: {p99_z:.3f} ms, "
          f"ratio {p99_d / p99_z:.2f}x)")
    print(f"bridge CPU at {tag}: {100 * cpu:.1f} % of a core (reference ZeroMQ subscriber decoding every sample: "
          f"{100 * cpu_ref:.1f} %, ratio {cpu / cpu_ref:.2f}x)")


def _first_motion_ns(arm, after_ns: int, timeout_s: float = 30.0) -> int:
    end = time.monotonic() + timeout_s
    for s in arm.samples(timeout_s=timeout_s):
        if s.moving and s.host_time_ns >= after_ns:
            return s.host_time_ns
        if time.monotonic() > end:
            break
    raise SystemExit("bench_ros2: the arm did not start moving")


def _goals(driver, model, n: int, env: dict) -> None:
    """Goal-to-first-motion: FollowJointTrajectory through the bridge vs run_trajectory through the client."""
    from cyclonedds.domain import DomainParticipant

    from armid.client import ArmClient
    from armid.ros2 import dds
    from armid.ros2.idl_types import Registry

    bridge = subprocess.Popen([sys.executable, "-m", "armid.cli", "ros2", "--state", driver.bound["state"],
                               "--commands", driver.bound["commands"], "--domain-id", str(DOMAIN)], env=env,
                              stdout=subprocess.DEVNULL)
    types = Registry()
    action = types.action("control_msgs/action/FollowJointTrajectory")
    dp = DomainParticipant(DOMAIN)
    base = "/armid_controller/follow_joint_trajectory/_action/send_goal"
    rq, rr = dds.service_topics(base)
    req = dds.Writer(dp, rq, action.send_goal_request, dds.SERVICES)
    rep = dds.Reader(dp, rr, action.send_goal_response, dds.SERVICES)
    P = types.message("trajectory_msgs/msg/JointTrajectoryPoint")
    D = types.message("builtin_interfaces/msg/Duration")
    ours, ref = [], []
    try:
        with ArmClient(driver.bound["state"], driver.bound["commands"], timeout_s=10.0) as arm:
            arm.enable()
            end = time.monotonic() + 30
            while not (req.matched() and rep.reader.get_matched_publications()) and time.monotonic() < end:
                time.sleep(0.05)
            q0 = arm.latest().q.copy()
            for k in range(n):
                for target, log in ((q0 + 0.05, ours), (q0, ref)):
                    arm.wait_motion(30)
                    time.sleep(0.2)
                    q_now = arm.latest().q
                    t = time.time_ns()
                    if log is ours:
                        goal = action.goal()
                        goal.trajectory.joint_names = list(model.joint_names)
                        goal.trajectory.points = [P(positions=list(target), time_from_start=D(sec=1))]
                        uuid = types.message("unique_identifier_msgs/msg/UUID")(uuid=list(os.urandom(16)))
                        req.write_sample(action.send_goal_request(guid=1, seq=k + 1, goal_id=uuid, goal=goal))
                    else:
                        arm.run_trajectory(samples=([0.0, 1.0], [q_now, target]))
                    log.append((_first_motion_ns(arm, t) - t) / 1e6)
                    arm.wait_motion(30)
                    time.sleep(0.5)
    finally:
        bridge.terminate()
        bridge.wait(20)
    print(f"goal to first motion: {np.median(ours):.1f} ms median of {len(ours)} (reference run_trajectory through "
          f"armid.client: {np.median(ref):.1f} ms, ratio {np.median(ours) / np.median(ref):.2f}x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window per rate (default 10)")
    parser.add_argument("--goals", type=int, default=5, help="goals timed for each (default 5)")
    parser.add_argument("--listen-dds", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--listen-zmq", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["CYCLONEDDS_URI"] = LOOPBACK
    if args.listen_dds:
        listen_dds(float(args.listen_dds[0]), args.listen_dds[1])
        return 0
    if args.listen_zmq:
        listen_zmq(args.listen_zmq[0], float(args.listen_zmq[1]), args.listen_zmq[2])
        return 0
    import tempfile

    from driver.daemon import Driver, Endpoints
    from ident.model import load_model
    from sim import Simulator
    from sim.local_transport import LocalSimArm

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    model = load_model("generic6")
    sim = Simulator(model, seed=0, realtime=True)
    driver = Driver(model, LocalSimArm(model, simulator=sim),
                    endpoints=Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"), watchdog_s=0.5)
    driver.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for rate in (100.0, 1000.0) if not os.environ.get("BENCH_ROS2_GOALS_ONLY") else ():
                _run_listeners(driver, rate, args.seconds, Path(tmp), env)
        _goals(driver, model, args.goals, env)
    finally:
        driver.stop()
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
