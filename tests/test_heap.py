"""HeapGuard hands freed heap memory back once it piles up, and leaves a steady heap alone."""

import ctypes
import sys

import pytest

from batchinfer.heap import HeapGuard, rss

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc only")


def test_freed_memory_is_handed_back_once_it_exceeds_the_margin():
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    guard = HeapGuard(margin=64 << 20)
    guard.check()
    assert guard.trims == 0  # nothing piled up yet
    blocks = [libc.malloc(64 << 10) for _ in range(3000)]  # 192 MB of heap blocks, below the mmap threshold
    for block in blocks:
        ctypes.memset(block, 1, 64 << 10)  # make them resident
    *freed, pin = blocks  # the last block keeps the heap top in use, as live objects do, so free() cannot shrink it
    for block in freed:
        libc.free(block)
    held = rss()
    guard.check()
    assert guard.trims == 1 and held - rss() > 100 << 20
    guard.check()
    assert guard.trims == 1  # back under the margin
    libc.free(pin)
