"""A ``Comm`` seen with ranks renumbered so that ``root`` is rank 0.

Rooted algorithms built from unrooted ones (scatter + all-gather) run the unrooted part on
this view instead of re-indexing every block: the blocks keep their order in the buffer.
"""

from __future__ import annotations

from typing import Any

import torch


class RotatedComm:
    """``comm`` with rank ``(r - root) mod n``; only what algorithms use is forwarded."""

    def __init__(self, comm: Any, root: int) -> None:
        self.comm, self.root = comm, root
        self.size = comm.size
        self.rank = (comm.rank - root) % comm.size

    def _real(self, peer: int) -> int:
        return (peer + self.root) % self.size

    def send(self, peer: int, t: torch.Tensor) -> None:
        self.comm.send(self._real(peer), t)

    def irecv(self, peer: int, t: torch.Tensor) -> Any:
        return self.comm.irecv(self._real(peer), t)

    def recv(self, peer: int, t: torch.Tensor) -> torch.Tensor:
        return self.comm.recv(self._real(peer), t)

    def scratch(self, slot: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self.comm.scratch(slot, numel, dtype)
