"""A subscriber to a driver's state stream that keeps every message it hears (seq, flags, device and host time, q),
the command-to-motion lag measured from it in cycles (no wall clock).

The lag: a motion advances one planned sample per fresh device sample (the driver on the device's clock, and
host-clocked arms alike), so the k-th fresh message since the motion began carries the arm as it was when
the k-th target went out. Where the measured angle of the joint that moves farthest crosses the planned one,
(fresh message index) - (planned index at that angle) is how many cycles the arm runs behind the targets:
the setpoint buffer, the link, the drives' interpolation and their tracking, together.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import zmq

from firmware_bridge import stream


class StreamTap:
    """Collects decoded state messages from `endpoint` in a thread until stop() (bounded: at most `limit`)."""

    def __init__(self, endpoint: str, n: int = 6, limit: int = 2_000_000):
        self.endpoint, self.n, self.limit = endpoint, n, limit
        self.seq: list[int] = []
        self.flags: list[int] = []
        self.device_ns: list[int] = []
        self.host_ns: list[int] = []
        self.q: list[np.ndarray] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="stream-tap", daemon=True)

    def __enter__(self) -> "StreamTap":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("stream tap: no subscriber socket")
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        sock = zmq.Context.instance().socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_STATE)
        sock.connect(self.endpoint)
        self._ready.set()
        try:
            while not self._stop.is_set() and len(self.seq) < self.limit:
                if not sock.poll(50):
                    continue
                while True:
                    try:
                        topic, payload = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if topic != stream.TOPIC_STATE:
                        continue
                    m = stream.decode_state(payload)
                    with self._lock:
                        self.seq.append(int(m["seq"]))
                        self.flags.append(int(m["flags"]))
                        self.device_ns.append(int(m["device_time_ns"]))
                        self.host_ns.append(int(m["host_time_ns"]))
                        self.q.append(np.array(m["q"], dtype=float))
        finally:
            sock.close(0)

    def reach(self, seq: int, timeout_s: float = 30.0) -> bool:
        """Wait (at most timeout_s) until the tap has heard the message `seq` or a later one (a status reply's
        "seq"): a tap in a process short of CPU time reads the stream late. True when it has."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self.seq and self.seq[-1] >= seq:
                    return True
            time.sleep(0.005)
        return False

    def count(self) -> int:
        with self._lock:
            return len(self.seq)

    def arrays(self, start: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(seq, flags, device_time_ns, q) of the messages from index `start` on."""
        with self._lock:
            return (np.array(self.seq[start:], dtype=np.int64), np.array(self.flags[start:], dtype=np.int64),
                    np.array(self.device_ns[start:], dtype=np.int64),
                    np.array(self.q[start:]).reshape(-1, self.n))

    def host_times(self, start: int = 0) -> np.ndarray:
        """host_time_ns of the messages from index `start` on."""
        with self._lock:
            return np.array(self.host_ns[start:], dtype=np.int64)


def motion_lag_cycles(flags: np.ndarray, q: np.ndarray, planned: np.ndarray, fraction: tuple[float, float] = (0.1, 0.9)
                      ) -> np.ndarray:
    """The lag (cycles) of every fresh sample of one motion whose measured angle of the farthest-moving joint
    lies within `fraction` of the way from the start to the goal. flags, q: the messages from before the motion
    to after it (the first with FLAG_MOVING is the one after which the first target went out); planned: the
    motion's planned angles (samples, n), one per cycle."""
    fresh = (flags & stream.FLAG_STALE) == 0
    moving = np.flatnonzero((flags & stream.FLAG_MOVING) != 0)
    if moving.size == 0:
        raise AssertionError("no message with FLAG_MOVING: the motion was not seen")
    first = int(moving[0])
    idx = np.flatnonzero(fresh[first:]) + first
    j = int(np.argmax(np.abs(planned[-1] - planned[0])))
    sign = 1.0 if planned[-1, j] >= planned[0, j] else -1.0
    p = sign * planned[:, j]
    m = sign * q[idx, j]
    lo = p[0] + fraction[0] * (p[-1] - p[0])
    hi = p[0] + fraction[1] * (p[-1] - p[0])
    inside = np.flatnonzero((m > lo) & (m < hi))
    if inside.size == 0:
        raise AssertionError("the measured joint never crossed the motion's middle")
    rising = np.maximum.accumulate(p)          # the quintic rises monotonically; flat ends keep np.interp defined
    planned_index = np.interp(m[inside], rising, np.arange(p.size))
    return inside - planned_index
