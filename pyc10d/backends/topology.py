"""Which ranks of a group share a host: pure index math for the hierarchical backend.

Kept apart from any communication (as ``device_mesh`` keeps mesh layout apart from group
creation) so the hierarchical collectives read as data movement, and so that a subgroup's
layout is derived from its parent's by the same rules on every rank.

Conventions every rank relies on: hosts are ordered by their lowest rank, the ranks of a
host ascend, and the first (lowest) rank of each host is its *leader*. So the leaders, in
host order, ascend too, and a leader's rank among the leaders is its host's index.
"""

from __future__ import annotations

from dataclasses import dataclass


def hostname_of(identity: str) -> str:
    """The hostname inside a ``backends.shm.host_identity()`` string (for messages)."""
    if identity.startswith("no-shm:"):
        return identity.rsplit(":", 1)[-1]
    return identity.split("/", 1)[0]


def kernel_of(identity: str) -> str:
    """The kernel (boot id) inside a ``host_identity()`` string: hosts that are containers or
    network namespaces of one machine differ in name and ``/dev/shm`` but share it, and its CPUs."""
    parts = identity.split("/")
    return parts[1] if len(parts) == 3 and not identity.startswith("no-shm:") else identity


@dataclass(frozen=True)
class HostLayout:
    """``hosts[j]``: the group ranks on host j; ``names[j]``: its hostname; ``kernels[j]``: the
    kernel it runs on (empty: each host its own)."""

    hosts: tuple[tuple[int, ...], ...]
    names: tuple[str, ...]
    kernels: tuple[str, ...] = ()

    @classmethod
    def from_identities(cls, identities: list[str]) -> HostLayout:
        """Group ranks by host identity (one string per rank, equal on a shared host)."""
        by_host: dict[str, list[int]] = {}
        for rank, ident in enumerate(identities):
            by_host.setdefault(ident, []).append(rank)
        ordered = sorted(by_host.items(), key=lambda kv: kv[1][0])
        return cls(tuple(tuple(r) for _, r in ordered), tuple(hostname_of(i) for i, _ in ordered),
                   tuple(kernel_of(i) for i, _ in ordered))

    def kernel_slot(self, rank: int) -> tuple[int, int]:
        """``rank``'s index among the group's ranks on its host's kernel, and their number:
        what CPU placement must count, since hosts that share a kernel share its CPUs."""
        j = self.host_of(rank)
        if not self.kernels:
            return self.local_index(rank), len(self.hosts[j])
        same = sorted(r for k, h in enumerate(self.hosts) if self.kernels[k] == self.kernels[j] for r in h)
        return same.index(rank), len(same)

    @property
    def size(self) -> int:
        return sum(len(h) for h in self.hosts)

    @property
    def num_hosts(self) -> int:
        return len(self.hosts)

    @property
    def max_local(self) -> int:
        """Ranks on the fullest host: the padded width of a host's block across hosts."""
        return max(len(h) for h in self.hosts)

    @property
    def leaders(self) -> list[int]:
        return [h[0] for h in self.hosts]

    def host_of(self, rank: int) -> int:
        return self._index()[rank][0]

    def local_index(self, rank: int) -> int:
        return self._index()[rank][1]

    def slot(self, rank: int) -> int:
        """Block index of ``rank`` in the host-major, padded order leaders exchange:
        ``host * max_local + local index``."""
        j, i = self._index()[rank]
        return j * self.max_local + i

    def host_major(self) -> bool:
        """Hosts equally full and holding consecutive ranks: the padded host-major order is
        plain rank order, so blocks can be exchanged without reordering."""
        return self.num_hosts * self.max_local == self.size and all(
            self.slot(r) == r for r in range(self.size))

    def subset(self, ranks: list[int]) -> HostLayout:
        """The layout of the subgroup made of ``ranks`` (its ranks renumbered 0..k-1)."""
        where = {r: i for i, r in enumerate(ranks)}
        hosts, names, kernels = [], [], []
        for j, (h, name) in enumerate(zip(self.hosts, self.names)):
            members = sorted(where[r] for r in h if r in where)
            if members:
                hosts.append(tuple(members))
                names.append(name)
                kernels.append(self.kernels[j] if self.kernels else str(j))
        order = sorted(range(len(hosts)), key=lambda j: hosts[j][0])
        return HostLayout(tuple(hosts[j] for j in order), tuple(names[j] for j in order),
                          tuple(kernels[j] for j in order))

    def describe_lost(self, dead: set[int]) -> str:
        """``"host 'h1' (ranks 2, 3)"`` for every host with a dead rank; a partly dead host
        says which of its ranks are gone."""
        parts = []
        for h, name in zip(self.hosts, self.names):
            gone = [r for r in h if r in dead]
            if not gone:
                continue
            listed = ", ".join(str(r) for r in gone)
            word = "ranks" if len(gone) > 1 else "rank"
            if len(gone) == len(h):
                parts.append(f"host {name!r} ({word} {listed})")
            else:
                parts.append(f"{word} {listed} of host {name!r}")
        return "; ".join(parts)

    def _index(self) -> dict[int, tuple[int, int]]:
        cached = self.__dict__.get("_idx")
        if cached is None:
            cached = {r: (j, i) for j, h in enumerate(self.hosts) for i, r in enumerate(h)}
            object.__setattr__(self, "_idx", cached)
        return cached
