"""python-can socket helpers for a CAN cycle between processes: tune a `udp_multicast` bus (own group only, a
larger receive buffer, a kernel filter for the frames the bus sends itself) and read the datagrams the kernel
dropped at it. The driver's CAN transport and the simulated drives (sim.can_device) both tune their buses with
these, so they sit in the bottom layer, under both.
"""
from __future__ import annotations

import ctypes
import os
import socket
from typing import Iterable

import can

# python-can's udp_multicast (the only CAN between two processes without SocketCAN): one datagram per frame,
# and every member of the group, the sender too, receives every frame (31 per cycle for 6 drives). The kernel's
# default receive buffer (net.core.rmem_default, 212992 bytes here) holds 256 of them, 33 ms at 250 Hz: a
# process that stalls longer under load loses frames. UDP_RECEIVE_BUFFER asks for 4 MiB (the kernel doubles
# it for its bookkeeping: ~10000 frames, 1.3 s at 250 Hz); SO_RCVBUFFORCE gets it with CAP_NET_ADMIN, a plain
# SO_RCVBUF up to net.core.rmem_max otherwise.
UDP_RECEIVE_BUFFER = 4 * 1024 * 1024       # bytes requested
_SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)                 # Linux values; not in Python's socket
_IP_MULTICAST_ALL = getattr(socket, "IP_MULTICAST_ALL", 49)
_IPV6_MULTICAST_ALL = getattr(socket, "IPV6_MULTICAST_ALL", 29)


_SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)


class _SockFilter(ctypes.Structure):         # struct sock_filter (linux/filter.h): one classic BPF instruction
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):          # struct sock_fprog: the program SO_ATTACH_FILTER takes
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


# python-can's udp_multicast datagram (can.interfaces.udp_multicast.utils.pack_message): a msgpack map whose first
# two entries are "timestamp" (float64) and "arbitration_id", so the id sits at byte 35 of the payload, after this
# fixed prefix (the 8 bytes of the float between): map of 11, "timestamp", float64 marker, "arbitration_id".
_MSGPACK_HEAD = (b"\x8b\xa9timestamp\xcb", b"\xaearbitration_id")
_ID_AT = len(_MSGPACK_HEAD[0]) + 8 + len(_MSGPACK_HEAD[1])     # 35
_UDP_HEADER = 8                              # a UDP socket's filter sees the datagram from its UDP header on


def own_frames_filter(cob_ids: Iterable[int]) -> list[tuple[int, int, int, int]]:
    """A classic BPF socket filter (instructions (code, jt, jf, k)) for a udp_multicast socket that drops the
    datagrams of python-can frames whose 11-bit id is in cob_ids and accepts everything else, including any
    datagram whose head is not python-can's msgpack layout (a change in python-can then costs CPU, never frames)."""
    ids = sorted({int(i) for i in cob_ids})
    if not ids or len(ids) > 200 or not all(0 <= i <= 0x7FF for i in ids):
        raise ValueError(f"own_frames_filter: expected 1..200 11-bit CAN ids, got {ids}")
    ld_len, ld_w, ld_h, ld_b, jeq, jge, ja, ret = 0x80, 0x20, 0x28, 0x30, 0x15, 0x35, 0x05, 0x06
    head = _MSGPACK_HEAD[0] + bytes(8) + _MSGPACK_HEAD[1]
    checks = [(at, head[at:at + 4]) for at in (0, 4, 8, 20, 24, 28, 31)]     # all of it but the float
    prog: list[tuple[int, int, int, int | str]] = [(ld_len, 0, 0, 0), (jge, 0, "accept", _UDP_HEADER + _ID_AT + 3)]
    for at, want in checks:
        prog.append((ld_w, 0, 0, _UDP_HEADER + at))
        prog.append((jeq, 0, "accept", int.from_bytes(want, "big")))
    prog += [(ld_b, 0, 0, _UDP_HEADER + _ID_AT),            # the id's msgpack marker, or the id itself (fixint)
             (jeq, "uint8", 0, 0xCC), (jeq, "uint16", 0, 0xCD), (jge, "accept", "compare", 0x80),
             ("uint8", ld_b, 0, 0, _UDP_HEADER + _ID_AT + 1), (ja, 0, 0, "compare"),
             ("uint16", ld_h, 0, 0, _UDP_HEADER + _ID_AT + 1), ("compare",)]
    prog += [(jeq, "drop", 0, i) for i in ids]
    prog += [(ret, 0, 0, 0xFFFFFFFF), ("drop", ret, 0, 0, 0), ("accept", ret, 0, 0, 0xFFFFFFFF)]
    labels, out, at = {}, [], 0
    for ins in prog:                          # a label names the next instruction: ("name", code, ...) or ("name",)
        if isinstance(ins[0], str):
            labels[ins[0]] = at
            ins = ins[1:]
        if ins:
            out.append(ins)
            at += 1

    def target(here: int, x) -> int:
        return labels[x] - here - 1 if isinstance(x, str) else x

    return [(code, target(i, jt), target(i, jf), target(i, k) if code == ja else k)
            for i, (code, jt, jf, k) in enumerate(out)]


def tune_udp_multicast(bus: can.BusABC, receive_buffer: int = UDP_RECEIVE_BUFFER,
                       own_ids: Iterable[int] = ()) -> dict[str, object]:
    """Make a python-can `udp_multicast` bus fit for a CAN cycle between processes; any other bus is left
    alone ({} returned).

    * receive only its own group: Linux delivers every group joined anywhere on the host to every socket
      bound to the port (IP_MULTICAST_ALL defaults to 1), so two runs on different groups heard each
      other's SDO answers and PDOs (same node ids, same COB-IDs);
    * a receive buffer of `receive_buffer` bytes (see UDP_RECEIVE_BUFFER);
    * own_ids: a kernel socket filter (own_frames_filter) drops the frames with these ids before python-can
      reads them: udp_multicast returns every frame a bus sends to that bus too, which SocketCAN does not,
      and each costs python-can a receive (~23 us of CPU here) and the reading thread a wake-up.

    python-can has no option for any of these; its public `fileno()` gives the socket, and the options are set
    on a duplicate of that descriptor (same socket, closed again here). Returns {"receive_buffer_bytes": what
    the kernel granted (SO_RCVBUF), "own_group_only": bool} and with own_ids "own_frames_filtered": bool; an
    option the kernel refuses is left as it was."""
    from can.interfaces.udp_multicast import UdpMulticastBus

    if not isinstance(bus, UdpMulticastBus):
        return {}
    out: dict[str, object] = {}
    with socket.socket(fileno=os.dup(bus.fileno())) as sock:
        own_only = True
        try:
            if sock.family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, _IPV6_MULTICAST_ALL, 0)
            else:
                sock.setsockopt(socket.IPPROTO_IP, _IP_MULTICAST_ALL, 0)
        except OSError:
            own_only = False                  # not Linux, or an old kernel: groups are per socket already
        try:
            sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, receive_buffer)
        except OSError:                       # no CAP_NET_ADMIN: capped at net.core.rmem_max
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            except OSError:
                pass
        out["receive_buffer_bytes"] = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        out["own_group_only"] = own_only
        own_ids = list(own_ids)
        if own_ids:
            prog = own_frames_filter(own_ids)
            code = (_SockFilter * len(prog))(*(_SockFilter(*ins) for ins in prog))
            try:
                sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, bytes(_SockFprog(len(prog), code)))
                out["own_frames_filtered"] = True
            except OSError:                   # not Linux: the receive side ignores them instead (own_frames)
                out["own_frames_filtered"] = False
    return out


def udp_receive_drops(bus: can.BusABC) -> int | None:
    """Datagrams the kernel dropped at this udp_multicast bus's socket because its receive buffer was full
    (the `drops` column of /proc/net/udp[6]); None for other buses or where that is not readable."""
    from can.interfaces.udp_multicast import UdpMulticastBus

    if not isinstance(bus, UdpMulticastBus):
        return None
    try:
        inode = str(os.fstat(bus.fileno()).st_ino)
        for table in ("/proc/net/udp", "/proc/net/udp6"):
            with open(table) as f:
                for line in f:
                    cols = line.split()
                    if len(cols) > 12 and cols[9] == inode:
                        return int(cols[-1])
    except (OSError, ValueError):
        return None
    return None
