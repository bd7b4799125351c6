"""The C allocator's heaps (glibc; elsewhere a no-op).

glibc's malloc gives a thread that finds the heap busy an arena of its own, up to eight
per core, and each arena keeps what its threads freed for them to reuse. The collector's
threads (receivers, write-ahead log, inserter) pass request bodies and batches of a few
MiB between them, so every arena ends up holding its own high-water mark. Two arenas hold
the same work in less, at the same throughput (BENCHMARKS.md, "Ingest with the default
configuration", the malloc arenas). Python allocates with its interpreter lock held, so the
threads seldom wait for a heap either way.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

ARENAS = 2
_M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


def limit_arenas(arenas: int = ARENAS) -> bool:
    """At most `arenas` malloc arenas from now on (threads that already hold one keep it),
    unless MALLOC_ARENA_MAX already says how many. Whether it was applied."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False  # the operator's choice stands
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        return bool(libc.mallopt(_M_ARENA_MAX, arenas))
    except (OSError, AttributeError, TypeError):  # not glibc: no mallopt, or no libc found
        return False
