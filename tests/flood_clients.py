"""Clients that flood a driver's command socket from processes of their own and never read a reply, for the
flood test and benchmark.

    python tests/flood_clients.py KIND ENDPOINT COUNT HOLD_S

KIND: `large` (one DEALER, COUNT requests just under the request size limit), `status` (one DEALER, COUNT
status requests), `connections` (COUNT REQ sockets, one status each), `move` (one DEALER, COUNT move_to
requests, each for the planner), `hostile` (one DEALER, COUNT of tests/hostile_requests.py). Each sends all
at once, prints "sent" and keeps its sockets open for HOLD_S seconds, then closes them and exits.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LARGE_BYTES = 4 * 1024 * 1024 - 128      # just under driver.requests.MAX_REQUEST_BYTES
CONNECTIONS = {"large": 1, "status": 1, "move": 1, "hostile": 1}   # per flooder; `connections`: COUNT


def _requests(kind: str, count: int):
    if kind == "large":
        pad = b'{"cmd": "move_to", "q": [0.1, 0, 0, 0, 0, 0], "pad": "' + b"x" * (LARGE_BYTES - 60)
        return (pad + b'"}' for _ in range(count))
    if kind in ("status", "connections"):
        return (b'{"cmd": "status"}' for _ in range(count))
    if kind == "move":
        return (json.dumps({"cmd": "move_to", "q": [0.1 * (k % 3), 0, 0, 0, 0, 0]}).encode() for k in range(count))
    if kind == "hostile":
        sys.path.insert(0, str(HERE))
        from hostile_requests import hostile_requests
        return hostile_requests(6, count, seed=7)
    raise SystemExit(f"flood_clients: unknown kind {kind!r}")


def main() -> None:
    import zmq

    kind, endpoint, count, hold_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    ctx = zmq.Context()
    socks = []
    if kind == "connections":
        for raw in _requests(kind, count):
            s = ctx.socket(zmq.REQ)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(endpoint)
            s.send(raw)
            socks.append(s)
    else:
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.setsockopt(zmq.SNDHWM, 0)        # queue everything here: the driver decides what it takes
        d.connect(endpoint)
        socks.append(d)
        for raw in _requests(kind, count):
            d.send_multipart([b"", raw])
    print("sent", flush=True)
    time.sleep(hold_s)
    for s in socks:
        s.close(0)
    ctx.term()


def start(plan: list[tuple[str, int]], endpoint: str, hold_s: float) -> list[subprocess.Popen]:
    """One process per (kind, count) of `plan`, flooding `endpoint` and holding its sockets hold_s."""
    return [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), kind, endpoint, str(count), str(hold_s)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for kind, count in plan]


def stop(floods: list[subprocess.Popen], timeout_s: float) -> list[str]:
    """Wait for the flooders to end (kill one that does not within timeout_s); their stdout and stderr."""
    out = []
    for p in floods:
        try:
            o, e = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate(timeout=10)
        out.append((o or "") + (e or ""))
    return out


def largest(kind: str, count: int) -> int:
    """The largest request of a flooder (bytes; ZeroMQ keeps at least a 64-byte message for each)."""
    return max(64, max(len(raw) for raw in _requests(kind, 1 if kind == "large" else count)))


def connections(plan: list[tuple[str, int]]) -> int:
    return sum(count if kind == "connections" else CONNECTIONS[kind] for kind, count in plan)


def rss_bytes(pid: int) -> int:
    """The resident set of a process (VmRSS in /proc/PID/status), bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


if __name__ == "__main__":
    main()
