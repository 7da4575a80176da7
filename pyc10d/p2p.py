"""Point-to-point public API: send/recv, isend/irecv, batch_isend_irecv."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._preamble import check_tensor, group_or_warn, group_rank, tracing
from .groups import get_global_rank

__all__ = ["send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv"]


def _peer(pg: Any, peer: int | None, group_peer: int | None, what: str, opname: str) -> int:
    if peer is None and group_peer is None:
        raise ValueError(f"{opname}: {what} must be given")
    r = group_rank(pg, peer, group_peer, what)
    if r == pg.rank():
        which = "destination" if what == "dst" else "source"  # torch's words
        raise ValueError(
            f"Invalid {which} rank: {which} rank should not be the same as the rank of the current process."
        )
    return r


def _untraceable(opname: str) -> None:
    if tracing():  # a trace would run it once and record nothing: say so instead
        raise RuntimeError(f"{opname}: point-to-point operations cannot be traced by make_fx or torch.compile")


def isend(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> Any:
    check_tensor(tensor, "tensor")
    _untraceable("send")
    pg = group_or_warn(group, "isend")
    if pg is None:
        return None
    return pg.send([tensor], _peer(pg, dst, group_dst, "dst", "isend"), tag)


def irecv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> Any:
    check_tensor(tensor, "tensor")
    _untraceable("recv")
    pg = group_or_warn(group, "irecv")
    if pg is None:
        return None
    if src is None and group_src is None:
        return pg.recv_anysource([tensor], tag)
    return pg.recv([tensor], _peer(pg, src, group_src, "src", "irecv"), tag)


def send(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0,
         group_dst: int | None = None) -> None:
    work = isend(tensor, dst, group, tag, group_dst)
    if work is not None:
        work.wait()


def recv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0,
         group_src: int | None = None) -> int:
    """Receive into ``tensor``; return the sender's global rank (-1 for non-members)."""
    pg = group_or_warn(group, "recv")
    if pg is None:
        return -1
    work = irecv(tensor, src, group, tag, group_src)
    work.wait()
    return get_global_rank(pg, work.source_rank())


class P2POp:
    """One send or receive for ``batch_isend_irecv``: ``P2POp(dist.isend, tensor, peer)``."""

    def __init__(self, op: Callable[..., Any], tensor: torch.Tensor, peer: int | None = None, group: Any = None,
                 tag: int = 0, group_peer: int | None = None) -> None:
        if op not in (isend, irecv):
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``torch.distributed.isend`` or ``torch.distributed.irecv``.")
        self.op, self.tensor, self.peer, self.group, self.tag, self.group_peer = op, tensor, peer, group, tag, group_peer

    def __repr__(self) -> str:
        return f"P2POp(op={self.op.__name__}, peer={self.peer}, shape={tuple(self.tensor.shape)})"


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Any]:
    """Post every receive first, then every send, so no ordering of the list can deadlock."""
    if not p2p_op_list or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError("Invalid ``p2p_op_list``. Each op is expected to to be of type ``torch.distributed.P2POp``.")
    works: list[Any] = [None] * len(p2p_op_list)
    order = sorted(range(len(p2p_op_list)), key=lambda i: p2p_op_list[i].op is isend)
    for i in order:
        p = p2p_op_list[i]
        if p.op is isend:
            works[i] = isend(p.tensor, p.peer, p.group, p.tag, p.group_peer)
        else:
            works[i] = irecv(p.tensor, p.peer, p.group, p.tag, p.group_peer)
    return works

