"""Object collectives and object point-to-point: the one place pyc10d pickles (user
objects, never tensor payloads).

Each object is pickled to a uint8 tensor; sizes travel first (an all_gather, broadcast or
send of int64), then the bytes, so every receiver knows how much to read.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch

from . import collectives as C  # noqa: N812 - the public API, short
from . import p2p as P  # noqa: N812 - the public API, short
from ._preamble import group_or_warn, group_rank

__all__ = ["all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list",
           "send_object_list", "recv_object_list"]


def _to_tensor(obj: Any) -> torch.Tensor:
    buf = io.BytesIO()
    pickle.Pickler(buf).dump(obj)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _from_tensor(t: torch.Tensor, size: int) -> Any:
    return pickle.loads(t[:size].numpy().tobytes())


def _sizes(pg: Any, local: torch.Tensor) -> list[int]:
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(pg.size())]
    C.all_gather(sizes, torch.tensor([local.numel()], dtype=torch.int64), group=pg)
    return [int(s) for s in sizes]


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    pg = group_or_warn(group, "all_gather_object")
    if pg is None:
        return
    local = _to_tensor(obj)
    sizes = _sizes(pg, local)
    biggest = max(sizes)
    padded = torch.zeros(biggest, dtype=torch.uint8)
    padded[: local.numel()] = local
    out = torch.empty(biggest * pg.size(), dtype=torch.uint8)
    C.all_gather_into_tensor(out, padded, group=pg)
    for i, size in enumerate(sizes):
        object_list[i] = _from_tensor(out[i * biggest:(i + 1) * biggest], size)


def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int | None = None, group: Any = None,
                  group_dst: int | None = None) -> None:
    pg = group_or_warn(group, "gather_object")
    if pg is None:
        return
    root = group_rank(pg, dst, group_dst, "dst")
    local = _to_tensor(obj)
    sizes = _sizes(pg, local)
    biggest = max(sizes)
    padded = torch.zeros(biggest, dtype=torch.uint8)
    padded[: local.numel()] = local
    is_root = pg.rank() == root
    outs = [torch.empty(biggest, dtype=torch.uint8) for _ in range(pg.size())] if is_root else None
    C.gather(padded, outs, group=pg, group_dst=root)
    if is_root:
        if object_gather_list is None:
            raise ValueError("gather_object: the destination rank must pass object_gather_list")
        for i, size in enumerate(sizes):
            object_gather_list[i] = _from_tensor(outs[i], size)


def broadcast_object_list(object_list: list[Any], src: int | None = None, group: Any = None, device: Any = None,
                          group_src: int | None = None) -> None:
    pg = group_or_warn(group, "broadcast_object_list")
    if pg is None:
        return
    root = group_rank(pg, src, group_src, "src")
    if pg.rank() == root:
        tensors = [_to_tensor(o) for o in object_list]
        sizes = torch.tensor([t.numel() for t in tensors], dtype=torch.int64)
    else:
        sizes = torch.empty(len(object_list), dtype=torch.int64)
    C.broadcast(sizes, group=pg, group_src=root)
    payload = torch.cat(tensors) if pg.rank() == root and tensors else torch.empty(int(sizes.sum()), dtype=torch.uint8)
    C.broadcast(payload, group=pg, group_src=root)
    if pg.rank() != root:
        offset = 0
        for i, size in enumerate(sizes.tolist()):
            object_list[i] = _from_tensor(payload[offset:offset + size], size)
            offset += size


def scatter_object_list(scatter_object_output_list: list[Any], scatter_object_input_list: list[Any] | None = None,
                        src: int | None = None, group: Any = None, group_src: int | None = None) -> None:
    pg = group_or_warn(group, "scatter_object_list")
    if pg is None:
        return
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError("Expected argument scatter_object_output_list to be a list of size at least 1.")
    root = group_rank(pg, src, group_src, "src")
    is_root = pg.rank() == root
    if is_root:
        tensors = [_to_tensor(o) for o in scatter_object_input_list]
        biggest = torch.tensor([max(t.numel() for t in tensors)], dtype=torch.int64)
    else:
        biggest = torch.zeros(1, dtype=torch.int64)
    C.broadcast(biggest, group=pg, group_src=root)
    n = int(biggest)
    padded = None
    sizes = None
    if is_root:
        padded = []
        for t in tensors:
            p = torch.zeros(n, dtype=torch.uint8)
            p[: t.numel()] = t
            padded.append(p)
        sizes = [torch.tensor([t.numel()], dtype=torch.int64) for t in tensors]
    out = torch.empty(n, dtype=torch.uint8)
    size = torch.empty(1, dtype=torch.int64)
    C.scatter(out, padded, group=pg, group_src=root)
    C.scatter(size, sizes, group=pg, group_src=root)
    scatter_object_output_list[0] = _from_tensor(out, int(size))


def send_object_list(object_list: list[Any], dst: int | None = None, group: Any = None, device: Any = None,
                     group_dst: int | None = None, use_batch: bool = False) -> None:
    """Send the objects to one rank, whose ``recv_object_list`` holds as many slots: their
    sizes (an int64 each), then their pickles back to back, as two sends.

    ``device`` and ``use_batch`` change nothing here: the pickles are bytes on the host
    either way (a CUDA tensor would be staged through it), and every send already goes over
    the group's own connections (torch's ``use_batch`` avoids making 2-rank communicators).
    """
    pg = group_or_warn(group, "send_object_list")
    if pg is None:
        return
    tensors = [_to_tensor(o) for o in object_list]
    sizes = torch.tensor([t.numel() for t in tensors], dtype=torch.int64)
    payload = torch.cat(tensors) if tensors else torch.empty(0, dtype=torch.uint8)
    P.send(sizes, dst, group=pg, group_dst=group_dst)
    P.send(payload, dst, group=pg, group_dst=group_dst)


def recv_object_list(object_list: list[Any], src: int | None = None, group: Any = None, device: Any = None,
                     group_src: int | None = None, use_batch: bool = False) -> int:
    """Fill ``object_list`` with the objects one rank sent with ``send_object_list`` (from
    any rank when neither ``src`` nor ``group_src`` is given); return the sender's global
    rank, -1 on a rank outside ``group``. The list must have as many slots as were sent."""
    pg = group_or_warn(group, "recv_object_list")
    if pg is None:
        return -1
    sizes = torch.empty(len(object_list), dtype=torch.int64)
    if src is None and group_src is None:
        sender = P.recv(sizes, group=pg)
    else:
        sender = P.recv(sizes, src, group=pg, group_src=group_src)
    payload = torch.empty(int(sizes.sum()), dtype=torch.uint8)
    P.recv(payload, sender, group=pg)  # the same sender's second message
    offset = 0
    for i, size in enumerate(sizes.tolist()):
        object_list[i] = _from_tensor(payload[offset:offset + size], size)
        offset += size
    return sender
