"""Print the armid driver's state stream (layout: docs/reference/stream.md). Needs only pyzmq.
usage: python stream_client.py [ENDPOINT] [COUNT]"""
import itertools
import struct
import sys

import zmq

endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"
count = int(sys.argv[2]) if len(sys.argv) > 2 else 0
sub = zmq.Context().socket(zmq.SUB)
sub.connect(endpoint)
sub.setsockopt(zmq.SUBSCRIBE, b"state")
sub.setsockopt(zmq.RCVTIMEO, 5000)                      # ms: give up when the driver is gone
for k in itertools.count():
    if count and k >= count:
        break
    topic, msg = sub.recv_multipart()
    magic, version, n, flags, seq, t_device, t_host = struct.unpack_from("<4sHHIQqq", msg, 0)
    if magic != b"ARMS" or version != 3 or len(msg) != 36 + 45 * n:
        sys.exit(f"not a version-3 state message ({len(msg)} bytes)")
    lost = flags >> 16                                              # device samples lost before this one
    q = struct.unpack_from(f"<{n}d", msg, 36)                       # rad
    current = struct.unpack_from(f"<{n}d", msg, 36 + 16 * n)        # A
    status = struct.unpack_from(f"<{n}H", msg, 36 + 32 * n)         # CiA 402 statusword
    print(seq, flags & 0xFFFF, lost, t_host, *(f"{x:+.6f}" for x in q), *(f"{i:+.4f}" for i in current),
          *(f"{w:04x}" for w in status), flush=True)
