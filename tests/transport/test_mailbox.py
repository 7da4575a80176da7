"""Mailbox matching: per-peer FIFO, receives from any source, loss and abort."""

from __future__ import annotations

import pytest

from pyc10d.errors import DistBackendError, DistNetworkError, DistTimeoutError
from pyc10d.transport.base import ANY_SOURCE, Mailbox, RecvHandle

CH = (5 << 32) | 1


def post(box: Mailbox, peer: int, nbytes: int = 4, channel: int = CH) -> RecvHandle:
    h = RecvHandle(memoryview(bytearray(nbytes)), peer, channel)
    box.post(h)
    return h


def test_any_source_takes_the_earliest_arrival() -> None:
    box = Mailbox(4)
    box.arrived(3, CH, b"ccc3", 0)
    box.arrived(1, CH, b"aaa1", 0)
    box.arrived(3, CH + 1, b"othr", 0)  # another channel never matches
    first, second = post(box, ANY_SOURCE), post(box, ANY_SOURCE)
    assert first.wait(1) == (4, 0) and first.peer == 3 and bytes(first.buf) == b"ccc3"
    assert second.wait(1) == (4, 0) and second.peer == 1 and bytes(second.buf) == b"aaa1"


def test_specific_receive_goes_before_any_source() -> None:
    box = Mailbox(3)
    anyone, from2 = post(box, ANY_SOURCE), post(box, 2)
    handle = box.take_posted(2, CH)
    assert handle is from2
    handle = box.take_posted(1, CH)
    assert handle is anyone and anyone.peer == 1
    assert box.take_posted(1, CH) is None


def test_any_source_fails_only_when_every_peer_is_gone() -> None:
    box = Mailbox(3)
    h = post(box, ANY_SOURCE)
    box.peer_lost(1, DistNetworkError("rank 1 closed its connection"))
    assert not h.done()  # rank 2 may still send
    box.peer_lost(2, DistNetworkError("rank 2 closed its connection"))
    with pytest.raises(DistNetworkError, match="rank 2"):
        h.wait(1)
    # and a new one fails at once
    with pytest.raises(DistNetworkError):
        post(box, ANY_SOURCE).wait(1)


def test_any_source_abort_and_timeout_messages() -> None:
    box = Mailbox(2)
    h = post(box, ANY_SOURCE)
    with pytest.raises(DistTimeoutError, match="from any rank"):
        h.wait(0.05)
    box.abort(CH >> 32, DistBackendError("aborted by rank 1: boom"))
    with pytest.raises(DistBackendError, match="boom"):
        h.wait(1)
