"""The cost model ``select`` chooses by: per algorithm, the time of one call on the critical
path as a function of the world size ``n``, the message size ``S`` and a ``Model``.

The model is alpha-beta with two kinds of per-message cost, which is what separates the
flat algorithms from the logarithmic ones: ``alpha`` is paid per *step* (a round of
messages in flight together: wire latency, a wake-up), ``o`` per *message a rank sends or
receives* (a system call, a frame, Python; LogGP's overhead), ``beta`` per byte on the busiest
link of the rank, ``gamma`` per byte reduced. A flat exchange is 1 step of n-1 messages; a
recursive-doubling one log2(n) steps of one message each: which wins depends on alpha
against o, and that is the choice the measured n <= 4 thresholds made by hand.

``pyc10d.sim`` runs the algorithms themselves over a simulated network; this closed form is
what ``select`` can afford per call (a few dozen float operations, cached per (n, S)).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    alpha: float = 25e-6  # s per step: inter-host latency of a small TCP message
    o: float = 8e-6  # s per message sent or received by a rank (CPU)
    beta: float = 1 / 1.25e9  # s per byte: 10 Gb/s
    gamma: float = 1 / 2.0e9  # s per byte reduced (a torch add, one core)


def _lg(n: int) -> int:
    return (n - 1).bit_length()  # ceil(log2 n)


def _p(n: int) -> tuple[int, int]:
    """(log2 p, 1 if n is not a power of two): p the largest power of two <= n."""
    return n.bit_length() - 1, int(n & (n - 1) != 0)


def _t(m: Model, steps: float, msgs: float, sent: float, reduced: float = 0.0) -> float:
    return steps * m.alpha + msgs * m.o + sent * m.beta + reduced * m.gamma


# Each: (n, S, segment bytes, model) -> seconds. S: bytes of the whole tensor per rank
# (all_reduce, broadcast, reduce), of one rank's block (all_gather, reduce_scatter).
Cost = Callable[[int, float, int, Model], float]


def _chain(n: int, s: float, seg: int, m: Model) -> float:
    k = max(1, math.ceil(s / seg))
    return _t(m, n - 2 + k, 2 * (n - 2 + k), (n - 2 + k) * min(s, seg))


COSTS: dict[str, dict[str, Cost]] = {
    "allreduce": {
        "allreduce_direct": lambda n, s, g, m: _t(m, 1, 2 * (n - 1), (n - 1) * s, (n - 1) * s),
        "allreduce_ring": lambda n, s, g, m: _t(m, 2 * (n - 1), 4 * (n - 1), 2 * (n - 1) / n * s, (n - 1) / n * s),
        "allreduce_recursive_doubling": lambda n, s, g, m: (
            lambda lp, f: _t(m, lp + 2 * f, 2 * (lp + 2 * f), (lp + 2 * f) * s, (lp + f) * s))(*_p(n)),
        "allreduce_rabenseifner": lambda n, s, g, m: (
            lambda lp, f: _t(m, 2 * lp + 2 * f, 4 * lp + 4 * f, (2 - 2 / 2 ** lp + 2 * f) * s,
                             (1 - 1 / 2 ** lp + f) * s))(*_p(n)),
    },
    "reduce_scatter": {
        "reduce_scatter_direct": lambda n, b, g, m: _t(m, 1, 2 * (n - 1), (n - 1) * b, (n - 1) * b),
        "reduce_scatter_ring": lambda n, b, g, m: _t(m, n - 1, 2 * (n - 1), (n - 1) * b, (n - 1) * b),
        "reduce_scatter_halving": lambda n, b, g, m: (
            lambda lp, f: _t(m, lp + 2 * f, 2 * (lp + 2 * f), (n - n / 2 ** lp + f * (n + 1)) * b,
                             (n - n / 2 ** lp + f * n) * b))(*_p(n)),
    },
    "allgather": {
        "allgather_direct": lambda n, b, g, m: _t(m, 1, 2 * (n - 1), (n - 1) * b),
        "allgather_ring": lambda n, b, g, m: _t(m, n - 1, 2 * (n - 1), (n - 1) * b),
        # Bruck: a run that wraps is two messages, at most one step in two
        "allgather_bruck": lambda n, b, g, m: _t(m, _lg(n), 3 * _lg(n), (n - 1) * b),
        "allgather_recursive_doubling": lambda n, b, g, m: (
            _t(m, _lg(n), 2 * _lg(n), (n - 1) * b) if n & (n - 1) == 0 else math.inf),
    },
    "broadcast": {
        "broadcast_direct": lambda n, s, g, m: _t(m, 1, n - 1, (n - 1) * s),
        "broadcast_binomial": lambda n, s, g, m: _t(m, _lg(n), 2 * _lg(n), _lg(n) * s),
        "broadcast_scatter_allgather": lambda n, s, g, m: _t(m, n, 3 * (n - 1), 2 * (n - 1) / n * s),
        "broadcast_scatter_doubling": lambda n, s, g, m: _t(m, 2 * _lg(n), 5 * _lg(n), 2 * (n - 1) / n * s),
        "broadcast_chain": _chain,
    },
    "reduce": {
        "reduce_direct": lambda n, s, g, m: _t(m, 1, n - 1, (n - 1) * s, (n - 1) * s),
        "reduce_binomial": lambda n, s, g, m: _t(m, _lg(n), 2 * _lg(n), _lg(n) * s, _lg(n) * s),
        "reduce_ring": lambda n, s, g, m: _t(m, n, 3 * (n - 1), 2 * (n - 1) / n * s, (n - 1) / n * s),
        "reduce_rabenseifner": lambda n, s, g, m: (
            lambda lp, f: _t(m, 2 * lp + f, 4 * lp + 2 * f, (2 - 2 / 2 ** lp + f) * s,
                             (1 - 1 / 2 ** lp + f) * s))(*_p(n)),
    },
    "barrier": {
        "barrier_direct": lambda n, s, g, m: _t(m, 1, 2 * (n - 1), n - 1),
        "barrier_dissemination": lambda n, s, g, m: _t(m, _lg(n), 2 * _lg(n), _lg(n)),
    },
}


def lower_bound(collective: str, n: int, s: float, m: Model) -> float:
    """The textbook alpha-beta(-gamma) lower bound (Chan et al., 2007): ceil(log2 n) latency
    terms (alpha + o: one message), the bytes the busiest rank must move, the reduction
    work that must happen somewhere divided over the n ranks."""
    if n == 1:
        return 0.0
    lat = _lg(n) * (m.alpha + 2 * m.o)
    if collective == "allreduce":
        return lat + 2 * (n - 1) / n * s * m.beta + (n - 1) / n * s * m.gamma
    if collective == "reduce_scatter":
        return lat + (n - 1) * s * m.beta + (n - 1) * s * m.gamma
    if collective == "allgather":
        return lat + (n - 1) * s * m.beta
    if collective == "broadcast":
        return lat + s * m.beta
    if collective == "reduce":
        return lat + s * m.beta + (n - 1) / n * s * m.gamma
    if collective == "barrier":
        return lat
    raise KeyError(collective)


# Algorithms in which some rank talks to every other (the flat ones; the root of the flat
# scatter and of the ring reduce's gather). Every other one talks to at most 2·ceil(log2 n).
FLAT = {"allreduce_direct", "reduce_scatter_direct", "allgather_direct", "broadcast_direct",
        "broadcast_scatter_allgather", "reduce_direct", "reduce_ring", "barrier_direct"}


def peers(name: str, n: int) -> int:
    """The most peers one rank of ``name`` talks to: the tcp connections it opens."""
    if n == 1:
        return 0
    if name in FLAT:
        return n - 1
    return min(n - 1, 2 if name.endswith(("_ring", "_chain")) else 2 * _lg(n))


def cheapest(collective: str, n: int, s: float, m: Model, seg: int,
             allowed: set[str] | None = None) -> str:
    """The name of the algorithm with the least modelled time (ties: the first listed)
    among those that keep every rank within 2·ceil(log2 n) peers (each peer is a
    connection, a socket and a receiver thread per rank: at 256 ranks the flat algorithms
    would hold 255 of each on every rank), unless ``allowed`` names the candidates."""
    best, best_t = "", math.inf
    budget = 2 * _lg(n)
    for name, cost in COSTS[collective].items():
        if allowed is not None and name not in allowed:
            continue
        if allowed is None and peers(name, n) > budget:
            continue
        t = cost(n, s, seg, m)
        if t < best_t:
            best, best_t = name, t
    return best
