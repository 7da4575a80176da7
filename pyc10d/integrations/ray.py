"""Ray on pyc10d: a ``ray.util.collective`` backend, for actors' collectives on CPU tensors.

Ray Train needs nothing from here: ``TorchTrainer(..., torch_config=TorchConfig(backend=
"pyc10d"))`` calls torch's ``init_process_group("pyc10d")`` in each worker, which the plugin
serves. ``ray.util.collective`` (Ray 2.5x and newer has a registry of backends) is Ray's own
API for collectives between actors; its ``GLOO`` backend runs on torch.distributed's Gloo.
``register()`` adds ``PYC10D`` beside it, in each process that makes a group (the driver and
every actor, as Ray asks of any registered backend)::

    import ray.util.collective as col
    from pyc10d.integrations import ray as pyc10d_ray

    pyc10d_ray.register()
    col.init_collective_group(world_size, rank, backend="PYC10D", group_name="g")
    col.allreduce(tensor, group_name="g")

Each group is a pyc10d group of its own (shared memory between a host's actors, tcp across
hosts: the ``auto`` engine), not the process's default group, so an actor may belong to
several. Rendezvous: rank 0 serves a pyc10d ``TCPStore`` on its node's address and publishes
it in Ray's internal key-value store under the group's name, as Ray's Gloo backend does with
its own address; the others wait for it (``timeout_s``).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import ray
import torch
from ray.experimental import internal_kv
from ray.util.collective.backend_registry import _global_registry, register_collective_backend
from ray.util.collective.collective_group.base_collective_group import BaseGroup
from ray.util.collective.types import ReduceOp as RayReduceOp

from ..process_group import ProcessGroup, make_engine
from ..store.tcp import TCPStore
from ..types import (
    AllgatherOptions,
    AllreduceOptions,
    BroadcastOptions,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
)

__all__ = ["NAME", "Pyc10dGroup", "register"]

NAME = "PYC10D"
_OPS = {RayReduceOp.SUM: ReduceOp.SUM, RayReduceOp.PRODUCT: ReduceOp.PRODUCT,
        RayReduceOp.MIN: ReduceOp.MIN, RayReduceOp.MAX: ReduceOp.MAX}


def register() -> None:
    """Make ``backend="PYC10D"`` known to ``ray.util.collective`` in this process (idempotent)."""
    if not _global_registry.is_registered(NAME):
        register_collective_backend(NAME, Pyc10dGroup)


def _key(group_name: str) -> str:
    return f"pyc10d_collective_group_{group_name}"


def _one(tensors: Any, what: str) -> torch.Tensor:
    """ray.util.collective passes a list of one tensor (or NumPy array)."""
    t = tensors[0] if isinstance(tensors, list | tuple) and len(tensors) == 1 else tensors
    if not isinstance(t, torch.Tensor):
        try:
            t = torch.from_numpy(t)
        except TypeError:
            raise TypeError(f"pyc10d ray group {what}: expected a torch.Tensor or a NumPy array, "
                            f"got {type(t).__name__}") from None
    if t.device.type != "cpu":
        raise ValueError(f"pyc10d ray group {what}: CPU tensors only, got one on {t.device}")
    return t


def _many(tensors: Any, what: str) -> list[torch.Tensor]:
    inner = tensors[0] if isinstance(tensors, list) and len(tensors) == 1 and isinstance(tensors[0], list) \
        else tensors
    return [_one([t], what) for t in inner]


class Pyc10dGroup(BaseGroup):
    """One ``ray.util.collective`` group on a pyc10d engine (see the module's docstring)."""

    def __init__(self, world_size: int, rank: int, group_name: str, timeout_s: float = 60.0) -> None:
        super().__init__(world_size, rank, group_name)
        timeout = timedelta(seconds=timeout_s)
        key = _key(group_name)
        if rank == 0:
            host = ray.util.get_node_ip_address()
            self._store = TCPStore(host, 0, world_size, True, timeout=timeout, wait_for_workers=False)
            internal_kv._internal_kv_put(key, f"{host}:{self._store.port}", overwrite=True)
        else:
            deadline = time.monotonic() + timeout_s
            while (found := internal_kv._internal_kv_get(key)) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"pyc10d ray group {group_name!r}: rank {rank}: Timed out after "
                                       f"{timeout_s:.0f} s waiting for rank 0 to publish its store")
                time.sleep(0.05)
            host, port = found.decode().rsplit(":", 1)
            self._store = TCPStore(host, int(port), world_size, False, timeout=timeout)
        name = f"ray:{group_name}"
        engine = make_engine("auto", self._store, rank, world_size, timeout, name)
        self._pg = ProcessGroup(rank, world_size, engine=engine, group_name=name, backend_name="auto")
        self._pg.barrier().wait()
        if rank == 0:  # every rank has joined: the address is no longer needed
            internal_kv._internal_kv_del(key)

    @classmethod
    def backend(cls) -> str:
        return NAME

    @classmethod
    def check_backend_availability(cls) -> bool:
        return True

    def destroy_group(self) -> None:
        self._pg.shutdown()

    def allreduce(self, tensor: Any, allreduce_options: Any = None) -> None:
        opts = AllreduceOptions()
        opts.reduceOp = _OPS[getattr(allreduce_options, "reduceOp", RayReduceOp.SUM)]
        self._pg.allreduce([_one(tensor, "allreduce")], opts).wait()

    def barrier(self, barrier_options: Any = None) -> None:
        self._pg.barrier().wait()

    def reduce(self, tensor: Any, reduce_options: Any = None) -> None:
        opts = ReduceOptions()
        opts.reduceOp = _OPS[getattr(reduce_options, "reduceOp", RayReduceOp.SUM)]
        opts.rootRank = getattr(reduce_options, "root_rank", 0)
        t = _one(tensor, "reduce")
        # ray.util.collective leaves a non-root rank's tensor as it was
        self._pg.reduce([t if self.rank == opts.rootRank else t.clone()], opts).wait()

    def allgather(self, tensor_list: Any, tensor: Any, allgather_options: Any = None) -> None:
        self._pg.allgather([_many(tensor_list, "allgather")], [_one(tensor, "allgather")], AllgatherOptions()).wait()

    def broadcast(self, tensor: Any, broadcast_options: Any = None) -> None:
        opts = BroadcastOptions()
        opts.rootRank = getattr(broadcast_options, "root_rank", 0)
        self._pg.broadcast([_one(tensor, "broadcast")], opts).wait()

    def reducescatter(self, tensor: Any, tensor_list: Any, reducescatter_options: Any = None) -> None:
        opts = ReduceScatterOptions()
        opts.reduceOp = _OPS[getattr(reducescatter_options, "reduceOp", RayReduceOp.SUM)]
        self._pg.reduce_scatter([_one(tensor, "reducescatter")], [_many(tensor_list, "reducescatter")],
                                opts).wait()

    def send(self, tensor: Any, send_options: Any) -> None:
        self._pg.send([_one(tensor, "send")], send_options.dst_rank, 0).wait()

    def recv(self, tensor: Any, recv_options: Any) -> None:
        self._pg.recv([_one(tensor, "recv")], recv_options.src_rank, 0).wait()

