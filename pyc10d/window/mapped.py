"""Windows on one host's shared memory (the shm backend): every rank maps every rank's
registered tensor, so a put is a copy into the peer's memory and nothing else.

``tensor_register`` moves the tensor's storage into a segment that every rank of the group
maps (symmetric memory's allocation, ``symmetric_memory/alloc.py``; the ranks meet through
the group's own all_gather rather than a store): the tensor object the caller holds keeps
its contents and now lives in shared memory (``Tensor.set_``), so a peer's put shows in it
with no copy and no call on this rank. Views taken of the tensor before it was registered
keep the old memory. ``tensor_deregister`` moves it back into private memory once every rank
has stopped writing (a barrier).

Signals are symmetric memory's counters (``put_signal`` / ``wait_signal``: a futex per
counter after a spin as long as a synchronous collective's caller spins, a dead peer noticed
within a tenth of a second); x86-64 keeps stores in order, so
data copied before a signal is there when the signal is seen.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import DistNetworkError, DistTimeoutError
from ..symmetric_memory.alloc import Mapping, Members, exchange, lease
from ..symmetric_memory.handle import SymmetricMemory
from ..transport.shm.arena import caller_spin
from .base import Shape, Window, gather_bytes


class _Meeting(Members):
    """The group's ranks, meeting through the group's own collectives (no store needed)."""

    def __init__(self, engine: Any, name: str) -> None:
        self.engine, self.group_name = engine, name
        self.rank, self.size = engine.rank(), engine.size()
        self.members = list(engine.ranks)
        self.timeout = float(engine.timeout_s)
        self.count, self.watch = 0, None

    def meet(self, key: str, value: str, what: str) -> list[str]:
        return [b.decode() for b in gather_bytes(self.engine, value.encode())]


class MappedWindow(Window):
    kind = "mapped"

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self._meeting = _Meeting(engine, f"{self.group_name}/window/{self.number}")
        self._mapping: Mapping | None = None
        self._memory: SymmetricMemory | None = None
        self._flat: list[torch.Tensor] = []

    def _register(self, tensor: torch.Tensor) -> list[Shape]:
        peers = self.shape_exchange(tensor)
        self._meeting.timeout = float(self.engine.timeout_s)
        mapping = exchange(self._meeting, max(p.nbytes for p in peers))
        shared = lease(mapping, tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        shared.copy_(tensor)
        with torch.no_grad():
            tensor.set_(shared)
        # No peer may put before every rank has moved its contents in (they would be overwritten).
        self.engine.barrier().wait()
        # A wait_signal blocks its caller, who has nothing else to do: spin as a synchronous
        # collective's caller does before sleeping (``caller_spin``), not symmetric memory's 50 us.
        mapping.spin_s = caller_spin(self.size)
        self._mapping, self._memory = mapping, SymmetricMemory(mapping)
        # Each rank's registered elements, flat: a put is one slice and one copy.
        self._flat = [mapping.data(r)[: p.nbytes].view(p.dtype) for r, p in enumerate(peers)]
        return peers

    def _deregister(self) -> None:
        self.engine.barrier().wait()  # every put into this rank's memory has been made
        tensor = self.tensor
        if tensor is not None:
            with torch.no_grad():
                tensor.set_(tensor.clone())
        self._mapping = self._memory = None
        self._flat = []

    def _put(self, flat: torch.Tensor, dst: int, offset: int) -> None:
        self._flat[dst][offset:offset + flat.numel()].copy_(flat)

    def _signal(self, dst: int) -> None:
        assert self._memory is not None
        self._memory.put_signal(dst)

    def _wait_signal(self, src: int, timeout: float) -> None:
        assert self._memory is not None
        try:
            self._memory.wait_signal(src, 0, max(1, int(timeout * 1000)))
        except DistTimeoutError:
            raise self.timed_out(src, timeout) from None
        except DistNetworkError as e:
            raise DistNetworkError(f"Window.wait_signal: {e}") from None

    def _poll_signal(self, src: int) -> bool:
        assert self._memory is not None
        return self._memory.poll_signal(src)

    def _map(self, rank: int) -> torch.Tensor:
        assert self._mapping is not None and self.peers is not None
        peer = self.peers[rank]
        return self._mapping.data(rank)[: peer.nbytes].view(peer.dtype).view(peer.shape)
