"""PayloadPool: buffers come back warm, foreign buffers are left alone, small ones unpooled."""

from __future__ import annotations

import torch

from pyc10d.transport.pool import POOL_MIN, PayloadPool, copy_bytes


def test_released_buffer_is_reused_for_the_same_capacity() -> None:
    pool = PayloadPool()
    v = pool.acquire(3 * POOL_MIN)
    assert len(v) == 3 * POOL_MIN and not v.readonly
    pool.release(v)
    w = pool.acquire(3 * POOL_MIN - 7)  # rounds up to the same capacity
    assert w.obj is v.obj and len(w) == 3 * POOL_MIN - 7
    other = pool.acquire(2 * POOL_MIN)
    assert other.obj is not v.obj


def test_foreign_and_small_buffers_are_not_taken() -> None:
    pool = PayloadPool()
    foreign = memoryview(torch.empty(POOL_MIN, dtype=torch.uint8).numpy())
    pool.release(foreign)
    assert pool.acquire(POOL_MIN).obj is not foreign.obj
    small = pool.acquire(100)
    assert len(small) == 100
    pool.release(small)  # ignored, no error


def test_a_buffer_is_pooled_once_even_if_released_twice() -> None:
    pool = PayloadPool()
    v = pool.acquire(POOL_MIN)
    pool.release(v)
    pool.release(v)
    assert pool.acquire(POOL_MIN).obj is v.obj
    assert pool.acquire(POOL_MIN).obj is not v.obj


def test_copy_bytes_large_and_small() -> None:
    for n in (10, 200_000):
        src = torch.randint(0, 255, (n,), dtype=torch.uint8)
        dst = torch.zeros(n + 3, dtype=torch.uint8)
        copy_bytes(memoryview(dst.numpy()), memoryview(src.numpy()))
        assert torch.equal(dst[:n], src) and int(dst[n:].sum()) == 0
    dst = bytearray(5)
    copy_bytes(memoryview(dst), b"hello")
    assert dst == b"hello"
