"""Freed memory goes back to the operating system.

glibc's malloc serves a block of at least its mmap threshold (128 KiB) with a mapping of its own, returned to
the OS when freed; but it raises that threshold to the size of each such block freed, up to 32 MiB. After a
client's large requests (a trajectory near the request size limit, and the ZeroMQ and Python copies of it)
have been freed, later blocks of that size come from the heap, whose freed memory the process keeps: a flood
of 4 MiB requests left the driver's RSS 440 MB higher for good. `return_freed_memory` fixes the threshold
(mallopt M_MMAP_THRESHOLD, which also ends the adjustment of the trim threshold), so every large block is
unmapped when freed, and the heap's free top beyond M_TRIM_THRESHOLD is returned. Small blocks freed amid
others (a thousand connections' ZeroMQ pipes and buffers: 28 MB) stay in the heap until `trim` (malloc_trim)
hands their pages back; the command server calls it when it goes idle after a burst of requests. Elsewhere
than glibc both do nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

M_TRIM_THRESHOLD = -1          # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024     # glibc's own starting value, kept fixed
TRIM_THRESHOLD_BYTES = 128 * 1024
_log = logging.getLogger(__name__)


def _glibc():
    """The C library when it is glibc, else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.gnu_get_libc_version        # glibc only: elsewhere mallopt's parameters mean other things
        libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    return libc


_LIBC = _glibc()


def trim() -> bool:
    """Hand the pages of freed heap memory back to the OS (glibc's malloc_trim(0)); True when some were. It
    walks every arena under its lock: call it outside the cycle thread, and not often."""
    return bool(_LIBC.malloc_trim(0)) if _LIBC is not None else False


def return_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; True when they were set."""
    libc = _LIBC
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD,
                                                                                   TRIM_THRESHOLD_BYTES))
    if not done:
        _log.warning("allocator: mallopt refused the mmap and trim thresholds; freed memory may stay with the "
                     "process")
    return done
