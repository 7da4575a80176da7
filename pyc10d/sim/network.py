"""The simulated network: a LogGP-style model of hosts, their CPUs and their NICs.

``Net`` holds the parameters; ``pyc10d.sim.fit`` measures them on a real host from a
ping-pong and a reduction, never from the collectives it is later compared with.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Net:
    #: ranks per host (rank r lives on host r // ranks_per_host) and the cores each host has
    ranks_per_host: int = 1
    cores_per_host: int = 1
    #: s: wire latency between hosts, and between ranks of one host
    latency: float = 25e-6
    local_latency: float = 0.0
    #: s of CPU per message sent and per message received (system call, framing, Python)
    o: float = 8e-6
    #: s per byte on a host's NIC, each direction (10 Gb/s: 0.8 ns)
    nic_beta: float = 1 / 1.25e9
    #: s of CPU per byte copied in or out of the kernel, per side (same host: the whole copy)
    cpu_beta: float = 0.0
    #: s of CPU per byte reduced
    gamma: float = 1 / 2.0e9

    def host(self, rank: int) -> int:
        return rank // self.ranks_per_host
