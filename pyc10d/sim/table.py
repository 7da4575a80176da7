"""One row of the scaling table: an op at (n, S) under today's selection and the new one.

Today's selection is ``algorithms.select_small_world`` (the measured thresholds, which were the
rule at every n before the cost model), the new one ``algorithms.select``. A flat or ring
algorithm at hundreds of ranks sends n^2 messages in all, too many to simulate one by one
in Python; above ``SIM_LIMIT`` messages its time is the closed form of ``algorithms.cost``
with the same parameters, and the row says so (``model``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .. import algorithms as algo
from ..algorithms import cost
from ..types import ReduceOp
from .engine import simulate
from .network import Net

SIM_LIMIT = 400_000  # messages per simulated call


@dataclass
class Outcome:
    algorithm: str
    seconds: float
    bytes_per_rank: float  # the most any rank sent
    msgs_per_rank: int
    peers_per_rank: int
    how: str  # "sim" or "model"


def model_of(net: Net) -> cost.Model:
    """The closed-form model matching ``net`` (one rank per host's view of it)."""
    return cost.Model(alpha=net.latency + net.local_latency, o=net.o,
                      beta=net.nic_beta + 2 * net.cpu_beta, gamma=net.gamma)


def _job(op: str, fn: Any, n: int, nbytes: int) -> tuple[Any, float]:
    """The per-rank body running ``fn`` on a scaled-down tensor, and the scale."""
    if op == "barrier":
        k, scale = 1, 1.0
    elif op in ("allgather", "reduce_scatter"):
        k, scale = 1, max(nbytes, 1) / 4
    else:
        k = max(1, min(nbytes // 4, n))
        scale = max(nbytes, 1) / (4 * k)
    sum_ = ReduceOp.SUM

    def body(c: Any) -> None:
        if op == "allreduce":
            fn(c, torch.ones(k), sum_)
        elif op == "broadcast":
            fn(c, torch.ones(k), 0)
        elif op == "reduce":
            fn(c, torch.ones(k), 0, sum_)
        elif op == "allgather":
            fn(c, list(torch.zeros(n * k).split(k)))
        elif op == "reduce_scatter":
            fn(c, list(torch.ones(n * k).split(k)), torch.empty(k), sum_)
        else:
            fn(c)

    return body, scale


def _messages(name: str, n: int) -> float:
    return n * (cost.peers(name, n) if name in cost.FLAT else 2 * n if name.endswith(("_ring", "_chain",
                "scatter_allgather")) else 4 * math.log2(max(n, 2)))


def outcome(op: str, fn: Any, n: int, nbytes: int, net: Net) -> Outcome:
    name = fn.__name__
    if n > 1 and _messages(name, n) > SIM_LIMIT:
        m = model_of(net)
        t = cost.COSTS[op][name](n, nbytes, algo.segments.SEGMENT_BYTES, m)
        return Outcome(name, t, math.nan, -1, cost.peers(name, n), "model")
    body, scale = _job(op, fn, n, nbytes)
    sim, _ = simulate(n, net, body, scale)
    return Outcome(name, max(sim.clock), max(sim.sent_bytes), max(sim.sent_msgs),
                   max(len(p) for p in sim.peers), "sim")


def today(op: str, n: int, nbytes: int) -> Any:
    return algo.select_small_world(op, n, nbytes)


def new(op: str, n: int, nbytes: int) -> Any:
    return algo.select(op, n, nbytes)
