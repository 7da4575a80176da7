"""The eager functional collectives' memory: recycled outputs, copy-on-write inputs, inline policy."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest
import torch

import pyc10d as dist
import pyc10d.functional as ft_c
from pyc10d.functional import _buffers, _eager
from pyc10d.testing import MultiThreadedTestCase

pytestmark = pytest.mark.timeout(30)  # the copy-on-write cases run two rank-threads

BIG = 64 * 1024  # elements: 256 KiB of float32, above the pool's minimum and the inline limit


def test_storage_is_reused_only_when_nothing_refers_to_it() -> None:
    _buffers.empty_cache()
    a = _buffers.empty([BIG], torch.float32)
    ptr = a.data_ptr()
    b = _buffers.empty([BIG], torch.float32)
    assert b.data_ptr() != ptr  # ``a`` is alive
    view = a[10:20]
    del a
    c = _buffers.empty([BIG], torch.float32)
    assert c.data_ptr() != ptr  # a view of it is alive
    arr = view.numpy()
    del view
    d = _buffers.empty([BIG], torch.float32)
    assert d.data_ptr() != ptr  # a numpy array of it is alive
    del arr
    e = _buffers.empty([BIG // 2, 2], torch.float32)  # same bytes, another shape
    assert e.data_ptr() == ptr and e.shape == (BIG // 2, 2) and e.is_contiguous()
    f = _buffers.empty([BIG], torch.float64)  # other size: another storage
    assert f.data_ptr() not in (ptr, b.data_ptr(), c.data_ptr(), d.data_ptr())
    del b, c, d, e, f
    _buffers.empty_cache()
    assert _buffers.cached_bytes() == 0


def test_small_sizes_and_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    _buffers.empty_cache()
    small = _buffers.empty([4], torch.float32)
    assert _buffers.cached_bytes() == 0 and small.shape == (4,)
    monkeypatch.setattr(_buffers, "_CAP", 3 * BIG * 4)
    held = [_buffers.empty([BIG], torch.float32) for _ in range(5)]  # 2 over the cap: plain
    assert _buffers.cached_bytes() == 3 * BIG * 4
    assert len({t.data_ptr() for t in held}) == 5
    del held
    other = _buffers.empty([2 * BIG], torch.float32)  # evicts unused storages to fit
    assert _buffers.cached_bytes() <= 3 * BIG * 4 and other.numel() == 2 * BIG
    del other
    _buffers.empty_cache()
    assert _buffers.cached_bytes() == 0


def test_autograd_keeps_a_saved_output_out_of_reuse() -> None:
    _buffers.empty_cache()
    out = _buffers.empty([BIG], torch.float32)
    out.fill_(2.0)
    w = torch.ones(BIG, requires_grad=True)
    loss = (w * out).sum()  # saves ``out`` for the backward
    ptr = out.data_ptr()
    del out
    again = _buffers.empty([BIG], torch.float32)
    assert again.data_ptr() != ptr
    again.fill_(7.0)
    loss.backward()
    assert bool((w.grad == 2.0).all())


def test_inline_policy_follows_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(_eager, "INLINE_BYTES", None)
    for local, spare in ((1, cores >= 2), (cores, False), (cores // 2 or 1, cores >= 2)):
        monkeypatch.setattr(_eager, "_auto_limit", None)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
        assert _eager.inline_limit() == (_eager.DEFAULT_INLINE_BYTES if spare else sys.maxsize), local
    monkeypatch.setattr(_eager, "INLINE_BYTES", 123)
    assert _eager.inline_limit() == 123


class TestCopyOnWriteInput(MultiThreadedTestCase):
    """An asynchronous functional all_reduce reads its input on the progress thread: it must
    see the values of the call, whatever the caller does to the input afterwards."""

    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._old = _eager.INLINE_BYTES
        _eager.INLINE_BYTES = _eager.DEFAULT_INLINE_BYTES  # asynchronous above 16 KiB, on any host
        self._spawn_threads()

    def tearDown(self):
        _eager.INLINE_BYTES = self._old
        super().tearDown()

    def _check_mutation_after_call(self, make_input):
        rank = dist.get_rank()
        x = make_input(rank)
        if rank == 1:
            time.sleep(0.2)  # rank 0's collective stays pending while it writes its input
        out = ft_c.all_reduce(x, "sum", dist.group.WORLD)
        x.add_(100.0)  # the collective already has its values
        x[0] = -5.0
        self.assertEqual(out, torch.full((BIG,), 3.0))
        self.assertEqual(float(x[1]), rank + 101.0)

    def test_write_to_a_tensor_input(self):
        self._check_mutation_after_call(lambda r: torch.full((BIG,), float(r + 1)))

    def test_write_to_a_view_input(self):  # part of a larger storage: copied at the call
        self._check_mutation_after_call(lambda r: torch.full((2 * BIG,), float(r + 1))[BIG:])

    def test_write_to_a_numpy_input(self):  # memory torch does not own: copied at the call
        self._check_mutation_after_call(lambda r: torch.from_numpy(np.full(BIG, r + 1.0, dtype=np.float32)))
