"""The process keeps at most core.allocator.ARENAS malloc arenas (glibc), counted by glibc's
own malloc_info after threads that contend for the heap."""

from __future__ import annotations

import subprocess
import sys

import pytest

from servelens.core import allocator

# Eight threads that allocate with the interpreter lock released (zlib's compressor state),
# then the arenas glibc reports.
_PROBE = """
import ctypes, ctypes.util, os, sys, tempfile, threading, zlib
from servelens.core import allocator
if sys.argv[1] == "limited":
    assert allocator.limit_arenas()
data = os.urandom(1 << 16)
def work():
    for _ in range(400):
        zlib.compress(data, 1)
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
path = tempfile.mktemp()
f = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(f))
libc.fclose(ctypes.c_void_p(f))
print(open(path).read().count("<heap nr="))
os.unlink(path)
"""


def _arenas(mode: str, env: dict[str, str] | None = None) -> int:
    done = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_contending_threads_share_at_most_two_arenas():
    free = _arenas("free")
    if free <= allocator.ARENAS:
        pytest.skip(f"these threads made only {free} arenas without a limit: nothing to compare")
    assert _arenas("limited") <= allocator.ARENAS < free


def test_an_operators_malloc_arena_max_stands(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert allocator.limit_arenas() is False
