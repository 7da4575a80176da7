"""Re-raising with the operation in front keeps the exception's type, whatever its constructor."""

from __future__ import annotations

import pytest
import torch

from pyc10d.algorithms.comm import PendingRecv
from pyc10d.errors import DistBackendError, DistNetworkError, with_message


class TwoArgError(RuntimeError):
    """An exception whose constructor does not take one message (``type(e)(msg)`` fails)."""

    def __init__(self, peer: int, why: str) -> None:
        super().__init__(f"peer {peer}: {why}")
        self.peer = peer


def test_one_argument_types_are_rebuilt() -> None:
    new = with_message(DistNetworkError("closed"), "allreduce: rank 1: closed")
    assert type(new) is DistNetworkError and str(new) == "allreduce: rank 1: closed"


def test_other_constructors_keep_their_type_and_attributes() -> None:
    new = with_message(TwoArgError(3, "gone"), "allreduce: rank 0: peer 3: gone")
    assert isinstance(new, TwoArgError) and new.peer == 3
    assert str(new) == "allreduce: rank 0: peer 3: gone"


class _Comm:
    op, rank, timeout = "allreduce #4", 0, 1.0

    def remaining(self) -> float:
        return 1.0


class _Handle:
    buf = memoryview(bytearray(4))

    def wait(self, timeout: float) -> tuple[int, int]:
        raise TwoArgError(1, "connection reset")


def test_a_receive_failing_with_such_an_exception_names_the_op() -> None:
    recv = PendingRecv(_Comm(), _Handle(), torch.zeros(1), 1)  # type: ignore[arg-type]
    with pytest.raises(TwoArgError) as info:  # before: TypeError from TwoArgError(msg)
        recv.wait()
    assert str(info.value) == "allreduce #4: rank 0: peer 1: connection reset"


def test_unsubclassable_types_fall_back_to_a_backend_error() -> None:
    new = with_message(StopIteration(), "x")  # builds fine: kept
    assert type(new) is StopIteration
    new = with_message(TypeError.__new__(TypeError), "y")
    assert str(new) == "y"
    assert isinstance(with_message(_final_error(), "z"), DistBackendError)


def _final_error() -> BaseException:
    class Final(Exception):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(a, b)

        def __init_subclass__(cls) -> None:
            raise TypeError("final")

    return Final(1, 2)
