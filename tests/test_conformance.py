"""Conformance of every collective, for every backend in ``BACKENDS``, world sizes 1-4; above
4 ranks (where ``select`` asks the cost model) a sample on threaded and tcp, and every size
5-33 with PYC10D_ALL_WORLDS=1 (``make test-worlds``).

One test = one multi-rank launch for (backend, world size, family); inside it every rank
loops over the family's collectives x dtypes x sizes (x ops, x roots) and compares each
result with a reference it computes locally from every rank's (regenerable) input. A rank
collects mismatches instead of stopping at the first, so ranks stay in step and the report
lists every failing case.

Most families run with the ring thresholds and ``SEGMENT_BYTES`` patched small (``PATCHED``),
so sizes up to ``LARGE`` elements exercise the direct and the ring algorithms and multi-segment
pipelines cheaply (above 4 ranks: a cost model whose bytes cost 128x more, see ``PATCHED``);
the ``defaults`` family checks the unpatched thresholds and model with real sizes.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import pytest
import torch
from _multirank import BACKENDS, run_ranks
from _refs import (
    DTYPES,
    FLOATS,
    PATCHED,
    Check,
    factor_of,
    gen,
    guard_ok,
    op_names,
    reduce_op,
    ref_reduce,
    short,
    strided,
)

import pyc10d as dist
from pyc10d import settings
from pyc10d.algorithms import cost
from pyc10d.algorithms.cost import Model

#: Every threshold at 0 and 8-byte segments: rings even for 1 element (blocks empty when n < ws).
#: Above 4 ranks, a model where only bytes cost (and a step a trillionth of a byte, to break
#: ties): the bandwidth-bound algorithms (ring, Rabenseifner, halving, chain, scatter +
#: doubling) on tensors of fewer elements than ranks.
RING_EVERYWHERE = {k: 0 for k in PATCHED if ".SMALL_" in k} | {
    "pyc10d.algorithms.segments.SEGMENT_BYTES": 8, "pyc10d.backends.shm.SLOT_BYTES": 256,
    "pyc10d.algorithms.MODEL": Model(alpha=1e-12, o=1e-12, beta=1e-6, gamma=1e-6),
}
#: > every patched threshold for 1-byte dtypes too; prime, so never divisible by the world size.
LARGE = 4099
SIZES = [0, 1, 1009, LARGE]
#: SIZES plus a 0-dim tensor (shape ()), for the collectives that take one.
SHAPES: list = [(), *SIZES]
RUN_TIMEOUT = 40.0


# -- families (each runs on every rank of one launch) ------------------------------------------
def fam_all_reduce(rank: int, ws: int) -> int:
    c = Check(rank)
    for dtype in DTYPES:
        for n in SHAPES:
            for name in op_names(dtype):
                key = f"ar/{short(dtype)}/{n}/{name}"
                xs = [gen(key, r, dtype, n, name) for r in range(ws)]
                t = xs[rank].clone()
                dist.all_reduce(t, op=reduce_op(dist, name))
                c.eq(t, ref_reduce(xs, name), key, approx=name == "AVG")
        # non-contiguous and 2-D inputs, every op
        for name in op_names(dtype):
            key = f"ar-strided/{short(dtype)}/{name}"
            xs = [gen(key, r, dtype, (37, 29), name) for r in range(ws)]
            view, base = strided(xs[rank].t())
            dist.all_reduce(view, op=reduce_op(dist, name))
            c.eq(view, ref_reduce([x.t() for x in xs], name), key, approx=name == "AVG")
            c.true(guard_ok(base), f"{key}: wrote outside the view")
    # the default op is SUM
    t = torch.ones(5)
    dist.all_reduce(t)
    c.eq(t, torch.full((5,), float(ws)), "ar default op")
    return c.finish()


def fam_broadcast(rank: int, ws: int) -> int:
    c = Check(rank)
    for src in range(ws):
        for dtype in DTYPES:
            for n in SHAPES:
                key = f"bc/{src}/{short(dtype)}/{n}"
                t = gen(key, rank, dtype, n)
                dist.broadcast(t, src=src)
                c.eq(t, gen(key, src, dtype, n), key)
            key = f"bc-strided/{src}/{short(dtype)}"
            view, base = strided(gen(key, rank, dtype, (13, 11)))
            dist.broadcast(view, src=src)
            c.eq(view, gen(key, src, dtype, (13, 11)), key)
            c.true(guard_ok(base), f"{key}: wrote outside the view")
    return c.finish()


def fam_reduce(rank: int, ws: int) -> int:
    c = Check(rank)
    for dst in range(ws):
        for dtype in DTYPES:
            names = op_names(dtype)
            for n in SHAPES:
                # two ops per size, rotating through all of them
                i = len(str(n)) + dst  # rotate through every op over sizes and roots
                for name in dict.fromkeys([names[i % len(names)], names[(i + 1) % len(names)]]):
                    key = f"red/{dst}/{short(dtype)}/{n}/{name}"
                    xs = [gen(key, r, dtype, n, name) for r in range(ws)]
                    t = xs[rank].clone()
                    dist.reduce(t, dst=dst, op=reduce_op(dist, name))
                    if rank == dst:
                        c.eq(t, ref_reduce(xs, name), key, approx=name == "AVG")
            key = f"red-strided/{dst}/{short(dtype)}"
            xs = [gen(key, r, dtype, (9, 7)) for r in range(ws)]
            view, base = strided(xs[rank].clone())
            dist.reduce(view, dst=dst, op=dist.ReduceOp.SUM)
            if rank == dst:
                c.eq(view, ref_reduce(xs, "SUM"), key)
            c.true(guard_ok(base), f"{key}: wrote outside the view")
    return c.finish()


def fam_all_gather(rank: int, ws: int) -> int:
    c = Check(rank)
    for dtype in DTYPES:
        for n in SHAPES:
            key = f"ag/{short(dtype)}/{n}"
            want = [gen(key, r, dtype, n) for r in range(ws)]
            outs = [torch.empty(n, dtype=dtype) for _ in range(ws)]
            dist.all_gather(outs, gen(key, rank, dtype, n))
            for r in range(ws):
                c.eq(outs[r], want[r], f"{key} all_gather block {r}")
            if n == ():
                continue  # torch's Gloo rejects a 0-dim input to all_gather_into_tensor
            out = torch.empty(ws * n, dtype=dtype)
            dist.all_gather_into_tensor(out, gen(key, rank, dtype, n))
            c.eq(out, torch.cat(want), f"{key} all_gather_into_tensor (concat)")
            out2 = torch.empty(ws, n, dtype=dtype)
            dist.all_gather_into_tensor(out2, gen(key, rank, dtype, n))
            c.eq(out2, torch.stack(want), f"{key} all_gather_into_tensor (stack)")
        # non-contiguous input and outputs
        key = f"ag-strided/{short(dtype)}"
        want = [gen(key, r, dtype, (6, 5)) for r in range(ws)]
        inp, _ = strided(gen(key, rank, dtype, (6, 5)))
        pairs = [strided(torch.zeros(6, 5, dtype=dtype)) for _ in range(ws)]
        dist.all_gather([v for v, _ in pairs], inp)
        for r, (v, base) in enumerate(pairs):
            c.eq(v, want[r], f"{key} block {r}")
            c.true(guard_ok(base), f"{key}: wrote outside output view {r}")
        out = torch.empty(ws * 6, 5, dtype=dtype)
        dist.all_gather_into_tensor(out, inp)
        c.eq(out, torch.cat(want), f"{key} into_tensor")
    return c.finish()


def fam_gather_scatter(rank: int, ws: int) -> int:
    c = Check(rank)
    for root in range(ws):
        for dtype in DTYPES:
            for n in SHAPES:
                key = f"ga/{root}/{short(dtype)}/{n}"
                outs = [torch.empty(n, dtype=dtype) for _ in range(ws)] if rank == root else None
                dist.gather(gen(key, rank, dtype, n), outs, dst=root)
                if rank == root:
                    for r in range(ws):
                        c.eq(outs[r], gen(key, r, dtype, n), f"{key} block {r}")
                key = f"sc/{root}/{short(dtype)}/{n}"
                blocks = [gen(key, r, dtype, n) for r in range(ws)] if rank == root else None
                out = torch.empty(n, dtype=dtype)
                dist.scatter(out, blocks, src=root)
                c.eq(out, gen(key, rank, dtype, n), key)
            key = f"gs-strided/{root}/{short(dtype)}"
            inp, _ = strided(gen(key, rank, dtype, (4, 3)))
            pairs = [strided(torch.zeros(4, 3, dtype=dtype)) for _ in range(ws)]
            dist.gather(inp, [v for v, _ in pairs] if rank == root else None, dst=root)
            if rank == root:
                for r, (v, base) in enumerate(pairs):
                    c.eq(v, gen(key, r, dtype, (4, 3)), f"{key} gather block {r}")
                    c.true(guard_ok(base), f"{key}: gather wrote outside view {r}")
            out, base = strided(torch.zeros(4, 3, dtype=dtype))
            src_blocks = [strided(gen(key, r, dtype, (4, 3)))[0] for r in range(ws)]
            dist.scatter(out, src_blocks if rank == root else None, src=root)
            c.eq(out, gen(key, rank, dtype, (4, 3)), f"{key} scatter")
            c.true(guard_ok(base), f"{key}: scatter wrote outside the view")
    return c.finish()


def fam_reduce_scatter(rank: int, ws: int) -> int:
    c = Check(rank)
    for dtype in DTYPES:
        names = op_names(dtype)
        for n in SIZES:
            for name in names:
                key = f"rst/{short(dtype)}/{n}/{name}"
                # a rank's input is ws blocks generated apart, so that the reference needs
                # block `rank` of every rank only (at 33 ranks, 1/33 of the random numbers)
                inp = torch.cat([gen(f"{key}/{j}", rank, dtype, n, name) for j in range(ws)])
                want = ref_reduce([gen(f"{key}/{rank}", r, dtype, n, name) for r in range(ws)], name)
                out = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(out, inp, op=reduce_op(dist, name))
                c.eq(out, want, f"{key} (concat)", approx=name == "AVG")
            name = names[n % len(names)]
            key = f"rst2/{short(dtype)}/{n}/{name}"
            xs = [gen(key, r, dtype, (ws, n), name) for r in range(ws)]
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, xs[rank], op=reduce_op(dist, name))
            c.eq(out, ref_reduce([x[rank] for x in xs], name), f"{key} (stack)", approx=name == "AVG")
            for name in dict.fromkeys([names[0], names[(n + 2) % len(names)]]):
                key = f"rs/{short(dtype)}/{n}/{name}"
                # this rank's blocks, and block `rank` of every rank (not all ws * ws blocks)
                mine = [gen(f"{key}/{j}", rank, dtype, n, name) for j in range(ws)]
                theirs = [gen(f"{key}/{rank}", r, dtype, n, name) for r in range(ws)]
                out = torch.empty(n, dtype=dtype)
                dist.reduce_scatter(out, mine, op=reduce_op(dist, name))
                c.eq(out, ref_reduce(theirs, name), f"{key} (list)", approx=name == "AVG")
        key = f"rs-strided/{short(dtype)}"
        xs = [gen(key, r, dtype, (ws * 5, 3)) for r in range(ws)]
        inp, _ = strided(xs[rank])
        out, base = strided(torch.zeros(5, 3, dtype=dtype))
        dist.reduce_scatter_tensor(out, inp, op=reduce_op(dist, names[0]))
        c.eq(out, ref_reduce([x[rank * 5:(rank + 1) * 5] for x in xs], names[0]), key)
        c.true(guard_ok(base), f"{key}: wrote outside the view")
        ins = [strided(xs[rank][j * 5:(j + 1) * 5])[0] for j in range(ws)]
        out, base = strided(torch.zeros(5, 3, dtype=dtype))
        dist.reduce_scatter(out, ins, op=reduce_op(dist, names[0]))
        c.eq(out, ref_reduce([x[rank * 5:(rank + 1) * 5] for x in xs], names[0]), f"{key} list")
        c.true(guard_ok(base), f"{key} list: wrote outside the view")
    return c.finish()


def _split(r: int, j: int, scale: int) -> int:
    """Rows rank r sends to rank j (uneven, some zero)."""
    return ((r * 7 + j * 3) % 5) * scale


def fam_all_to_all(rank: int, ws: int) -> int:
    c = Check(rank)
    for dtype in DTYPES:
        for scale in (1, 3, 211):
            # all_to_all with tensor lists of uneven sizes
            key = f"a2a/{short(dtype)}/{scale}"
            ins = [gen(f"{key}/{j}", rank, dtype, _split(rank, j, scale)) for j in range(ws)]
            outs = [torch.empty(_split(j, rank, scale), dtype=dtype) for j in range(ws)]
            dist.all_to_all(outs, ins)
            for j in range(ws):
                c.eq(outs[j], gen(f"{key}/{rank}", j, dtype, _split(j, rank, scale)), f"{key} from {j}")
            # all_to_all_single, uneven split sizes
            key = f"a2as-uneven/{short(dtype)}/{scale}"
            in_splits = [_split(rank, j, scale) for j in range(ws)]
            out_splits = [_split(j, rank, scale) for j in range(ws)]
            inp = gen(key, rank, dtype, (sum(in_splits), 2))
            out = torch.empty(sum(out_splits), 2, dtype=dtype)
            dist.all_to_all_single(out, inp, out_splits, in_splits)
            want = torch.cat([gen(key, j, dtype, (sum(_split(j, k, scale) for k in range(ws)), 2))
                              .split([_split(j, k, scale) for k in range(ws)])[rank] for j in range(ws)])
            c.eq(out, want, key)
        for rows in (0, 1, 17, LARGE):
            # all_to_all_single, equal splits (None)
            key = f"a2as-even/{short(dtype)}/{rows}"
            inp = gen(key, rank, dtype, (ws * rows, 3))
            out = torch.empty(ws * rows, 3, dtype=dtype)
            dist.all_to_all_single(out, inp)
            want = torch.cat([gen(key, j, dtype, (ws * rows, 3))[rank * rows:(rank + 1) * rows]
                              for j in range(ws)])
            c.eq(out, want, key)
        # all_to_all_single rejects non-contiguous tensors, locally, before anything moves (torch
        # rejects a strided input too; a strided output it writes as if it were contiguous)
        key = f"a2as-strided/{short(dtype)}"
        strided_in, _ = strided(gen(key, rank, dtype, ws * 4))
        strided_out, base = strided(torch.zeros(ws * 4, dtype=dtype))
        for what, o, i in (("input", torch.empty(ws * 4, dtype=dtype), strided_in),
                           ("output", strided_out, gen(key, rank, dtype, ws * 4))):
            try:
                dist.all_to_all_single(o, i)
                c.true(False, f"{key}: strided {what} accepted")
            except ValueError as e:
                c.true("contiguous" in str(e), f"{key}: strided {what}: {e}")
        c.true(guard_ok(base), f"{key}: wrote outside the view")
        # all_to_all (tensor lists) takes non-contiguous tensors
        key = f"a2a-strided/{short(dtype)}"
        ins = [strided(gen(f"{key}/{j}", rank, dtype, (3, 2)))[0] for j in range(ws)]
        pairs = [strided(torch.zeros(3, 2, dtype=dtype)) for _ in range(ws)]
        dist.all_to_all([v for v, _ in pairs], ins)
        for j, (v, b) in enumerate(pairs):
            c.eq(v, gen(f"{key}/{rank}", j, dtype, (3, 2)), f"{key} from {j}")
            c.true(guard_ok(b), f"{key}: wrote outside output view {j}")
    return c.finish()


def fam_p2p(rank: int, ws: int) -> int:
    c = Check(rank)
    right, left = (rank + 1) % ws, (rank - 1) % ws
    for dtype in DTYPES:
        for n in SIZES:
            key = f"p2p/{short(dtype)}/{n}"
            out = torch.empty(n, dtype=dtype)
            rw = dist.irecv(out, src=left)
            sw = dist.isend(gen(key, rank, dtype, n), dst=right)
            sw.wait()
            c.true(rw.wait() is True, f"{key}: irecv Work.wait() did not return True")
            c.eq(out, gen(key, left, dtype, n), key)
        # blocking send/recv, even ranks send first; recv returns the sender's rank
        key = f"p2p-block/{short(dtype)}"
        out, base = strided(torch.zeros(7, 3, dtype=dtype))
        if rank % 2 == 0:
            dist.send(gen(key, rank, dtype, (7, 3)), dst=right)
            who = dist.recv(out, src=left)
        else:
            who = dist.recv(out, src=left)
            dist.send(gen(key, rank, dtype, (7, 3)), dst=right)
        c.eq(out, gen(key, left, dtype, (7, 3)), key)
        c.true(who == left, f"{key}: recv returned {who}, want {left}")
        c.true(guard_ok(base), f"{key}: recv wrote outside the view")
    # tags: messages match by tag whatever the posting order; same tag stays FIFO
    if rank == 0:
        for tag in (3, 1, 2):
            dist.send(torch.full((tag,), float(tag)), dst=1, tag=tag)
        for i in range(3):
            dist.send(torch.full((4,), float(10 + i)), dst=1, tag=7)
    elif rank == 1:
        bufs = {tag: torch.zeros(tag) for tag in (1, 2, 3)}
        works = [dist.irecv(bufs[tag], src=0, tag=tag) for tag in (1, 2, 3)]
        fifo = [torch.zeros(4) for _ in range(3)]
        works += [dist.irecv(b, src=0, tag=7) for b in fifo]
        for w in works:
            w.wait()
        for tag, b in bufs.items():
            c.eq(b, torch.full((tag,), float(tag)), f"tag {tag}")
        for i, b in enumerate(fifo):
            c.eq(b, torch.full((4,), float(10 + i)), f"fifo message {i} of tag 7")
    # batch_isend_irecv with every peer, receives listed before and after the sends
    for n in (0, 5, LARGE):
        key = f"batch/{n}"
        recvs = {p: torch.empty(n, dtype=torch.int64) for p in range(ws) if p != rank}
        ops = []
        for p in range(ws):
            if p == rank:
                continue
            send = dist.P2POp(dist.isend, gen(f"{key}/{p}", rank, torch.int64, n), p)
            recv = dist.P2POp(dist.irecv, recvs[p], p)
            ops += [send, recv] if p % 2 else [recv, send]
        works = dist.batch_isend_irecv(ops)
        c.true(len(works) == len(ops), f"{key}: {len(works)} works for {len(ops)} ops")
        for w in works:
            w.wait()
        for p, b in recvs.items():
            c.eq(b, gen(f"{key}/{rank}", p, torch.int64, n), f"{key} from {p}")
    # receive from any source (src=None): recv returns whoever sent, payloads stay paired
    if ws > 1:
        if rank == 0:
            got = {}
            for _ in range(ws - 1):
                buf = torch.empty(4)
                got[dist.recv(buf, tag=11)] = buf
            c.true(sorted(got) == list(range(1, ws)), f"any-source: senders {sorted(got)}")
            for who, buf in got.items():
                c.eq(buf, torch.full((4,), float(who)), f"any-source payload from {who}")
        else:
            dist.send(torch.full((4,), float(rank)), dst=0, tag=11)
        # posted before the message exists; a message on another tag does not match it
        late = torch.empty(2)
        work = dist.irecv(late, tag=12) if rank == 0 else None
        dist.barrier()
        if rank == ws - 1:
            dist.send(torch.full((3,), -1.0), dst=0, tag=13)
            dist.send(torch.full((2,), 5.0), dst=0, tag=12)
        if rank == 0:
            work.wait()
            c.eq(late, torch.full((2,), 5.0), "any-source posted first")
            c.true(work.source_rank() == ws - 1, f"any-source: source_rank {work.source_rank()}")
            other = torch.empty(3)
            c.true(dist.recv(other, tag=13) == ws - 1, "any-source on tag 13")
    # irecv completes through its future too
    out = torch.empty(3)
    fut = dist.irecv(out, src=left).get_future()
    dist.send(torch.full((3,), float(rank)), dst=right)
    fut.wait()
    c.eq(out, torch.full((3,), float(left)), "irecv future")
    return c.finish()


def fam_objects(rank: int, ws: int) -> int:
    c = Check(rank)

    def obj(r: int, salt: str) -> dict:
        return {"rank": r, "salt": salt, "pad": "x" * (r * 1000 + 3), "nested": [r] * r, "none": None}

    got: list = [None] * ws
    dist.all_gather_object(got, obj(rank, "ago"))
    c.true(got == [obj(r, "ago") for r in range(ws)], f"all_gather_object: {got!r:.200}")
    tensor_objs: list = [None] * ws
    dist.all_gather_object(tensor_objs, torch.arange(rank + 2))
    for r in range(ws):
        c.eq(tensor_objs[r], torch.arange(r + 2), f"all_gather_object tensor from {r}")
    for root in range(ws):
        lst = [obj(root, "b"), "s" * root, 3.5, None] if rank == root else [None] * 4
        dist.broadcast_object_list(lst, src=root)
        c.true(lst == [obj(root, "b"), "s" * root, 3.5, None], f"broadcast_object_list src {root}")
        out = [None] * ws if rank == root else None
        dist.gather_object(obj(rank, f"g{root}"), out, dst=root)
        if rank == root:
            c.true(out == [obj(r, f"g{root}") for r in range(ws)], f"gather_object dst {root}")
        got1: list = [None]
        ins = [obj(r, f"s{root}") for r in range(ws)] if rank == root else None
        dist.scatter_object_list(got1, ins, src=root)
        c.true(got1[0] == obj(rank, f"s{root}"), f"scatter_object_list src {root}: {got1[0]!r:.100}")
    dist.barrier()
    return c.finish()


def fam_async(rank: int, ws: int) -> int:
    c = Check(rank)
    for dtype in (torch.float32, torch.int64, torch.bool, torch.complex64, torch.bfloat16):
        for n in (0, 7, LARGE):
            key = f"async/{short(dtype)}/{n}"
            name = "SUM" if dtype != torch.int64 else "MAX"
            ar_in = [gen(f"{key}/ar", r, dtype, n) for r in range(ws)]
            ar = ar_in[rank].clone()
            bc = gen(f"{key}/bc", rank, dtype, n)
            rd_in = [gen(f"{key}/rd", r, dtype, n) for r in range(ws)]
            rd = rd_in[rank].clone()
            ag = [torch.empty(n, dtype=dtype) for _ in range(ws)]
            agt = torch.empty(ws * n, dtype=dtype)
            rs_in = [gen(f"{key}/rs", r, dtype, ws * n) for r in range(ws)]
            rs = torch.empty(n, dtype=dtype)
            ga = [torch.empty(n, dtype=dtype) for _ in range(ws)] if rank == 0 else None
            sc = torch.empty(n, dtype=dtype)
            a2a = torch.empty(ws * n, dtype=dtype)
            works = [
                ("all_reduce", dist.all_reduce(ar, op=reduce_op(dist, name), async_op=True)),
                ("broadcast", dist.broadcast(bc, src=ws - 1, async_op=True)),
                ("reduce", dist.reduce(rd, dst=ws - 1, op=reduce_op(dist, name), async_op=True)),
                ("all_gather", dist.all_gather(ag, gen(f"{key}/ag", rank, dtype, n), async_op=True)),
                ("all_gather_into_tensor",
                 dist.all_gather_into_tensor(agt, gen(f"{key}/ag", rank, dtype, n), async_op=True)),
                ("reduce_scatter_tensor",
                 dist.reduce_scatter_tensor(rs, rs_in[rank], op=reduce_op(dist, name), async_op=True)),
                ("gather", dist.gather(gen(f"{key}/ga", rank, dtype, n), ga, dst=0, async_op=True)),
                ("scatter", dist.scatter(sc, [gen(f"{key}/sc", r, dtype, n) for r in range(ws)]
                                         if rank == 0 else None, src=0, async_op=True)),
                ("all_to_all_single",
                 dist.all_to_all_single(a2a, gen(f"{key}/a2a", rank, dtype, ws * n), async_op=True)),
                ("barrier", dist.barrier(async_op=True)),
            ]
            # a synchronous op issued behind the async ones is ordered after them
            sync = gen(f"{key}/sync", rank, dtype, n)
            dist.broadcast(sync, src=0)
            c.eq(sync, gen(f"{key}/sync", 0, dtype, n), f"{key} sync broadcast behind async ops")
            for i, (what, w) in enumerate(reversed(works)):
                if i % 2:
                    w.get_future().wait()
                else:
                    c.true(w.wait() is True, f"{key} {what}: Work.wait() did not return True")
                c.true(w.is_completed() and w.is_success(), f"{key} {what}: not completed/successful")
            c.eq(ar, ref_reduce(ar_in, name), f"{key} all_reduce")
            c.eq(bc, gen(f"{key}/bc", ws - 1, dtype, n), f"{key} broadcast")
            if rank == ws - 1:
                c.eq(rd, ref_reduce(rd_in, name), f"{key} reduce")
            want_ag = [gen(f"{key}/ag", r, dtype, n) for r in range(ws)]
            for r in range(ws):
                c.eq(ag[r], want_ag[r], f"{key} all_gather {r}")
            c.eq(agt, torch.cat(want_ag), f"{key} all_gather_into_tensor")
            c.eq(rs, ref_reduce([x.view(ws, n)[rank] for x in rs_in], name), f"{key} reduce_scatter")
            if rank == 0:
                for r in range(ws):
                    c.eq(ga[r], gen(f"{key}/ga", r, dtype, n), f"{key} gather {r}")
            c.eq(sc, gen(f"{key}/sc", rank, dtype, n), f"{key} scatter")
            want = torch.cat([gen(f"{key}/a2a", j, dtype, ws * n)[rank * n:(rank + 1) * n] for j in range(ws)])
            c.eq(a2a, want, f"{key} all_to_all_single")
    # the future's value is the list of output tensors; then() chains on it
    t = torch.full((4,), float(rank + 1))
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    total = float(ws * (ws + 1) // 2)
    c.eq(fut.value()[0], torch.full((4,), total), "future value of all_reduce")
    c.eq(doubled, torch.full((4,), 2 * total), "future.then")
    return c.finish()


def fam_subgroups(rank: int, ws: int) -> int:
    c = Check(rank)
    specs = [list(range(0, ws, 2)), list(range(1, ws)), sorted({0, ws - 1}), list(range(ws))[::-1]]
    groups = [(sorted(s), dist.new_group(s)) for s in specs if s]
    for members, g in groups:
        if rank not in members:
            c.true(dist.get_rank(g) == -1 and dist.get_world_size(g) == -1, f"non-member of {members}")
            t = torch.ones(3)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                c.true(dist.all_reduce(t, group=g) is None, f"non-member all_reduce in {members}")
            c.eq(t, torch.ones(3), f"non-member tensor untouched in {members}")
            continue
        gs, gr = len(members), members.index(rank)
        c.true(dist.get_rank(g) == gr and dist.get_world_size(g) == gs, f"rank/size in {members}")
        c.true(dist.get_process_group_ranks(g) == members, f"ranks of {members}")
        for dtype in (torch.float32, torch.int32, torch.bool):
            for n in (0, 1, 1009, LARGE):
                key = f"sub/{members}/{short(dtype)}/{n}"
                name = "SUM" if dtype != torch.int32 else "BXOR"
                xs = [gen(key, r, dtype, n) for r in members]
                t = xs[gr].clone()
                dist.all_reduce(t, op=reduce_op(dist, name), group=g)
                c.eq(t, ref_reduce(xs, name), f"{key} all_reduce")
                src = members[-1]
                t = gen(f"{key}/bc", rank, dtype, n)
                dist.broadcast(t, src=src, group=g)
                c.eq(t, gen(f"{key}/bc", src, dtype, n), f"{key} broadcast src {src}")
                t = gen(f"{key}/bc2", rank, dtype, n)
                dist.broadcast(t, group=g, group_src=0)
                c.eq(t, gen(f"{key}/bc2", members[0], dtype, n), f"{key} broadcast group_src 0")
                t = xs[gr].clone()
                dist.reduce(t, dst=src, op=reduce_op(dist, name), group=g)
                if rank == src:
                    c.eq(t, ref_reduce(xs, name), f"{key} reduce dst {src}")
                out = torch.empty(gs * n, dtype=dtype)
                dist.all_gather_into_tensor(out, gen(f"{key}/ag", rank, dtype, n), group=g)
                c.eq(out, torch.cat([gen(f"{key}/ag", r, dtype, n) for r in members]), f"{key} all_gather")
                ins = [gen(f"{key}/rs", r, dtype, gs * n) for r in members]
                out = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(out, ins[gr], op=reduce_op(dist, name), group=g)
                c.eq(out, ref_reduce([x.view(gs, n)[gr] for x in ins], name), f"{key} reduce_scatter")
                outs = [torch.empty(n, dtype=dtype) for _ in members] if rank == src else None
                dist.gather(gen(f"{key}/ga", rank, dtype, n), outs, dst=src, group=g)
                if rank == src:
                    for i, r in enumerate(members):
                        c.eq(outs[i], gen(f"{key}/ga", r, dtype, n), f"{key} gather from {r}")
                out = torch.empty(n, dtype=dtype)
                blocks = [gen(f"{key}/sc", r, dtype, n) for r in members] if rank == src else None
                dist.scatter(out, blocks, src=src, group=g)
                c.eq(out, gen(f"{key}/sc", rank, dtype, n), f"{key} scatter")
                out = torch.empty(gs * n, dtype=dtype)
                dist.all_to_all_single(out, gen(f"{key}/a2a", rank, dtype, gs * n), group=g)
                want = torch.cat([gen(f"{key}/a2a", r, dtype, gs * n)[gr * n:(gr + 1) * n] for r in members])
                c.eq(out, want, f"{key} all_to_all_single")
        if gs > 1:
            # p2p inside the group, by global rank and by group rank
            nxt, prv = members[(gr + 1) % gs], members[(gr - 1) % gs]
            out = torch.empty(4)
            if gr % 2 == 0:
                dist.send(torch.full((4,), float(rank)), dst=nxt, group=g)
                who = dist.recv(out, src=prv, group=g)
            else:
                who = dist.recv(out, src=prv, group=g)
                dist.send(torch.full((4,), float(rank)), dst=nxt, group=g)
            c.eq(out, torch.full((4,), float(prv)), f"p2p in {members}")
            c.true(who == prv, f"recv in {members} returned {who}, want global rank {prv}")
            out = torch.empty(4)
            w = dist.irecv(out, group=g, group_src=(gr - 1) % gs)
            dist.send(torch.full((4,), float(rank)), group=g, group_dst=(gr + 1) % gs)
            w.wait()
            c.eq(out, torch.full((4,), float(prv)), f"p2p group_dst in {members}")
        objs: list = [None] * gs
        dist.all_gather_object(objs, ("obj", rank), group=g)
        c.true(objs == [("obj", r) for r in members], f"all_gather_object in {members}")
        root = members[-1]
        lst = [("b", root), None] if rank == root else [None, None]
        dist.broadcast_object_list(lst, src=root, group=g)
        c.true(lst == [("b", root), None], f"broadcast_object_list in {members}: {lst}")
        got = [None] * gs if rank == root else None
        dist.gather_object({"r": rank}, got, dst=root, group=g)
        if rank == root:
            c.true(got == [{"r": r} for r in members], f"gather_object in {members}: {got}")
        one: list = [None]
        dist.scatter_object_list(one, [f"s{r}" for r in members] if rank == root else None, src=root, group=g)
        c.true(one == [f"s{rank}"], f"scatter_object_list in {members}: {one}")
        dist.barrier(group=g)
    # two disjoint groups run concurrently without their messages mixing
    if ws >= 2:
        halves = [list(range(0, ws, 2)), list(range(1, ws, 2))]
        hg = [dist.new_group(h) for h in halves]
        mine = 0 if rank % 2 == 0 else 1
        members = halves[mine]
        xs = [gen("halves", r, torch.float64, LARGE) for r in members]
        t = xs[members.index(rank)].clone()
        work = dist.all_reduce(t, group=hg[mine], async_op=True)
        w2 = dist.all_reduce(torch.ones(3), async_op=True)  # world group, in parallel
        work.wait()
        w2.wait()
        c.eq(t, ref_reduce(xs, "SUM"), f"concurrent all_reduce in {members}")
        if ws % 2 == 0:
            mine_g, all_g = dist.new_subgroups(2)
            c.true(len(all_g) == ws // 2 and dist.get_world_size(mine_g) == 2, "new_subgroups(2)")
            t = torch.full((3,), float(rank))
            dist.all_reduce(t, group=mine_g)
            base = rank - rank % 2
            c.eq(t, torch.full((3,), float(2 * base + 1)), "all_reduce in new_subgroups group")
    return c.finish()


def _streamed(key: str, ws: int, dtype: torch.dtype, n: int, name: str) -> torch.Tensor:
    """``ref_reduce`` of every rank's ``gen(key, r, dtype, n)``, one input in memory at a time
    (at 33 ranks the full list is gigabytes per rank, and every rank builds it)."""
    acc = gen(key, 0, dtype, n).to(torch.float64 if dtype.is_floating_point else torch.int64)
    for r in range(1, ws):
        x = gen(key, r, dtype, n)
        acc = acc.add_(x) if name == "SUM" else torch.maximum(acc, x.to(acc.dtype), out=acc)
    return acc.to(dtype)


def fam_defaults(rank: int, ws: int) -> int:
    """Unpatched thresholds and segments: sizes around and well above them (float32/int64).
    The largest tensor is ``min(ws, 4)`` segments (and 4099 elements): at 4 ranks a ring block
    over a segment, at 33 ranks a message in the ring's range of the cost model."""
    from pyc10d import algorithms as algo
    from pyc10d.algorithms import segments

    c = Check(rank)
    seg = segments.SEGMENT_BYTES
    sizes = [algo.SMALL_ALLREDUCE // 4, algo.SMALL_ALLREDUCE // 4 + 1, (min(ws, 4) * seg) // 4 + 4099]
    for dtype in (torch.float32, torch.int64):
        for n in sizes:
            key = f"big/{short(dtype)}/{n}"
            t = gen(key, rank, dtype, n)
            dist.all_reduce(t)
            c.eq(t, _streamed(key, ws, dtype, n, "SUM"), f"{key} all_reduce")
            t = gen(f"{key}/bc", rank, dtype, n)
            dist.broadcast(t, src=ws - 1)
            c.eq(t, gen(f"{key}/bc", ws - 1, dtype, n), f"{key} broadcast")
            t = gen(key, rank, dtype, n)
            dist.reduce(t, dst=0, op=dist.ReduceOp.MAX)
            if rank == 0:
                c.eq(t, _streamed(key, ws, dtype, n, "MAX"), f"{key} reduce")
    n = seg // 4 + 1009  # a block larger than one segment
    key = f"big-ag/{n}"
    out = torch.empty(ws * n)
    dist.all_gather_into_tensor(out, gen(key, rank, torch.float32, n))
    c.eq(out, torch.cat([gen(key, r, torch.float32, n) for r in range(ws)]), f"{key} all_gather")
    # reduce_scatter: rank r's input is the blocks gen(f"{key}/{j}", r) for j = 0..ws-1, so
    # a rank's reference needs only its own block of every rank
    for m, again in ((n, ""), (n - 7, "again")):  # again: reused scratch buffers, a new size
        inp = torch.cat([gen(f"{key}{again}/{j}", rank, torch.float32, m) for j in range(ws)])
        out = torch.empty(m)
        dist.reduce_scatter_tensor(out, inp)
        del inp
        c.eq(out, _streamed(f"{key}{again}/{rank}", ws, torch.float32, m, "SUM"),
             f"{key} reduce_scatter {again}")
    return c.finish()


def fam_ring_everywhere(rank: int, ws: int) -> int:
    """Every threshold 0: ring algorithms on tiny tensors (fewer elements than ranks). Above
    9 ranks broadcast and reduce take 5 roots, not all (the families above take every root)."""
    c = Check(rank)
    roots = range(ws) if ws <= 9 else sorted({0, 1, ws // 2, ws - 2, ws - 1})
    for dtype in (torch.float32, torch.int64, torch.bool, torch.float16, torch.complex64):
        for n in list(range(0, ws + 3)) + [101]:
            key = f"ring/{short(dtype)}/{n}"
            for name in op_names(dtype)[:3]:
                xs = [gen(f"{key}/{name}", r, dtype, n, name) for r in range(ws)]
                t = xs[rank].clone()
                dist.all_reduce(t, op=reduce_op(dist, name))
                c.eq(t, ref_reduce(xs, name), f"{key} all_reduce {name}", approx=name == "AVG")
                for root in roots:
                    t = xs[rank].clone()
                    dist.reduce(t, dst=root, op=reduce_op(dist, name))
                    if rank == root:
                        c.eq(t, ref_reduce(xs, name), f"{key} reduce {name} dst {root}",
                             approx=name == "AVG")
            for root in roots:
                t = gen(f"{key}/bc", rank, dtype, n)
                dist.broadcast(t, src=root)
                c.eq(t, gen(f"{key}/bc", root, dtype, n), f"{key} broadcast src {root}")
            out = torch.empty(ws * n, dtype=dtype)
            dist.all_gather_into_tensor(out, gen(f"{key}/ag", rank, dtype, n))
            c.eq(out, torch.cat([gen(f"{key}/ag", r, dtype, n) for r in range(ws)]), f"{key} all_gather")
            xs = [gen(f"{key}/rs", r, dtype, ws * n) for r in range(ws)]
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, xs[rank])
            c.eq(out, ref_reduce([x.view(ws, n)[rank] for x in xs], "SUM"), f"{key} reduce_scatter")
    return c.finish()


FAMILIES = {
    "all_reduce": (fam_all_reduce, PATCHED),
    "broadcast": (fam_broadcast, PATCHED),
    "reduce": (fam_reduce, PATCHED),
    "all_gather": (fam_all_gather, PATCHED),
    "gather_scatter": (fam_gather_scatter, PATCHED),
    "reduce_scatter": (fam_reduce_scatter, PATCHED),
    "all_to_all": (fam_all_to_all, PATCHED),
    "p2p": (fam_p2p, PATCHED),
    "objects": (fam_objects, PATCHED),
    "async": (fam_async, PATCHED),
    "subgroups": (fam_subgroups, PATCHED),
    "defaults": (fam_defaults, None),
    "ring_everywhere": (fam_ring_everywhere, RING_EVERYWHERE),
}
WORLD_SIZES = [1, 2, 3, 4]
#: ``make test`` runs shm at 1, 2 and 4 ranks and tcp at 1 and 2 (threaded at all four; tcp
#: at 5 below, and across namespace hosts in test_multihost); shm at 3 and tcp at 3 and 4
#: (~70 CPU-seconds) are ``full`` (``make test-full``).
SMALL_FULL = {("shm", 3), ("tcp", 3), ("tcp", 4)}
SMALL_CASES = [pytest.param(b, ws, f, id=f"{b}-ws{ws}-{f}",
                            marks=[pytest.mark.full] if (b, ws) in SMALL_FULL else [])
               for b in BACKENDS for ws in WORLD_SIZES for f in FAMILIES]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("backend", "world_size", "family"), SMALL_CASES)
def test_conformance(backend: str, world_size: int, family: str) -> None:
    if family == "p2p" and world_size == 1:
        pytest.skip("point-to-point needs a peer")
    fn, patches = FAMILIES[family]
    counts = run_ranks(backend, world_size, fn, timeout=RUN_TIMEOUT, patches=patches)
    assert all(n > 0 for n in counts)


# -- above 4 ranks: the cost model's algorithms (5-33 ranks) -----------------------------------
#: ``make test`` samples threaded at 5 ranks (every family) and tcp at 5 (reduce_scatter);
#: ``make test-full`` adds threaded at 9 (the families below) and tcp's all_reduce at 5;
#: PYC10D_ALL_WORLDS=1 (``make test-worlds``) runs every family at every size 5-33 on both.
ALL_WORLDS = settings.ALL_WORLDS.get()
#: The per-test limit of ``make test-worlds`` (PYC10D_WORLDS_TIMEOUT seconds): a launch of
#: 33 processes on 2 cores runs for minutes.
WORLDS_TIMEOUT = settings.WORLDS_TIMEOUT.get()
BIG_WORLDS = list(range(5, 34)) if ALL_WORLDS else [5, 9]
TCP_SAMPLE = list(FAMILIES) if ALL_WORLDS else ["all_reduce", "reduce_scatter"]
#: At 9 ranks ``make test-full`` runs the families whose algorithm the world size chooses
#: (recursive halving and doubling with a remainder rank, Bruck; 5 = 4 + 1 has the same shape):
#: 5 ranks covers the rest (point to point, objects, async, subgroups, defaults,
#: gather/scatter: the same code at 5 and 9), and ring_everywhere at 9 (18 s) runs at 5.
#: ``make test-worlds`` runs every one at every size.
AT_NINE = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all"}
BIG_CASES = [("threaded", ws, f) for ws in BIG_WORLDS for f in FAMILIES
             if ALL_WORLDS or ws != 9 or f in AT_NINE] + [
    ("tcp", ws, f) for ws in (BIG_WORLDS if ALL_WORLDS else [5]) for f in TCP_SAMPLE]


#: ``full`` unless ``make test`` samples it (see above).
SHORT_BIG = {("threaded", 5), ("tcp", 5, "reduce_scatter")}


def _big_case(backend: str, ws: int, family: str) -> Any:
    short = ALL_WORLDS or (backend, ws) in SHORT_BIG or (backend, ws, family) in SHORT_BIG
    return pytest.param(backend, ws, family, id=f"{backend}-ws{ws}-{family}",
                        marks=[] if short else [pytest.mark.full])


@pytest.mark.timeout(WORLDS_TIMEOUT)
@pytest.mark.parametrize(("backend", "world_size", "family"), [_big_case(*c) for c in BIG_CASES])
def test_conformance_big_worlds(backend: str, world_size: int, family: str) -> None:
    fn, patches = FAMILIES[family]
    t0 = time.monotonic()
    counts = run_ranks(backend, world_size, fn, timeout=WORLDS_TIMEOUT - 10, patches=patches)
    assert all(n > 0 for n in counts)
    if ALL_WORLDS:
        print(f"\n{backend} ws={world_size} {family}: {time.monotonic() - t0:.1f} s", flush=True)


def _family_bytes(itemsizes: tuple[int, ...], elements: list[int]) -> set[int]:
    return {e * b for e in elements for b in itemsizes}


def test_patched_model_covers_small_and_large_algorithms() -> None:
    """At every size 5-33 the patched models make ``select`` pick, over the sizes the families
    use, a latency-bound and a bandwidth-bound algorithm of every collective that has both
    within the peer budget (all_gather: Bruck and recursive doubling move the same bytes as
    the ring in fewer steps, so they win at every size)."""
    seg = PATCHED["pyc10d.algorithms.segments.SEGMENT_BYTES"]
    model = PATCHED["pyc10d.algorithms.MODEL"]
    sizes = _family_bytes((1, 2, 4, 8, 16), [0, 1, 1009, LARGE, 37 * 29, 13 * 11, 9 * 7])
    small = {"allreduce": {"allreduce_direct", "allreduce_recursive_doubling"},
             "broadcast": {"broadcast_direct", "broadcast_binomial"},
             "reduce": {"reduce_direct", "reduce_binomial"}}
    large = {"allreduce": {"allreduce_ring", "allreduce_rabenseifner"},
             "broadcast": {"broadcast_scatter_allgather", "broadcast_scatter_doubling", "broadcast_chain"},
             "reduce": {"reduce_ring", "reduce_rabenseifner"},
             "reduce_scatter": {"reduce_scatter_ring", "reduce_scatter_halving"}}
    for ws in range(5, 34):
        for coll in small:
            got = {cost.cheapest(coll, ws, s, model, seg) for s in sizes}
            assert got & small[coll] and got & large[coll], f"{coll} at {ws} ranks: only {got}"
        # the thresholds of ring_everywhere: bandwidth-bound algorithms on tiny tensors
        ring_model = RING_EVERYWHERE["pyc10d.algorithms.MODEL"]
        tiny = _family_bytes((1, 2, 4, 8), list(range(1, ws + 3)))
        for coll, names in large.items():
            got = {cost.cheapest(coll, ws, s, ring_model, 8) for s in tiny}
            if coll != "reduce_scatter" or ws > 9:  # below, the flat one moves no more bytes
                assert got & names, f"ring_everywhere: {coll} at {ws} ranks: only {got}"
    # every logarithmic algorithm is taken at some size of some family
    taken = {cost.cheapest(c, ws, s, m, g) for c in cost.COSTS for ws in range(5, 34)
             for s, m, g in [(s, model, seg) for s in sizes] + [(s, ring_model, 8) for s in tiny]}
    assert {n for names in cost.COSTS.values() for n in names} - taken <= {"allgather_ring"}


def test_reference_exact_at_33_ranks() -> None:
    """The references hold for every order a collective may reduce in: over 33 ranks each
    case reduced in the dtype itself left to right, right to left and as a tree gives the
    reference exactly (AVG: the sum, divided once)."""
    import functools

    def kernel(name: str):
        return {"PRODUCT": torch.mul, "MIN": torch.minimum, "MAX": torch.maximum,
                "BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
                "BXOR": torch.bitwise_xor}.get(name, torch.add)

    def tree(xs: list, f):
        return xs[0] if len(xs) == 1 else f(tree(xs[:len(xs) // 2], f), tree(xs[len(xs) // 2:], f))

    for dtype in [d for d in DTYPES if d != torch.bool]:
        for name in op_names(dtype):
            xs = [gen(f"exact/{name}", r, dtype, 4099, name) for r in range(33)]
            want = ref_reduce(xs, "SUM" if name == "AVG" else name)
            if name.startswith("PREMUL_SUM"):
                xs = [x * factor_of(name) for x in xs]
            f = kernel(name)
            for order in (xs, xs[::-1], xs[5:] + xs[:5]):
                assert torch.equal(functools.reduce(f, order), want), f"{short(dtype)} {name}"
                assert torch.equal(tree(order, f), want), f"{short(dtype)} {name} (tree)"
            if name == "PRODUCT" and dtype.is_floating_point:
                assert want.abs().max() > 16 and (want < 0).any(), "products too weak to tell"


def test_reference_helpers() -> None:
    """The local references themselves (wrapping int sums/products, bool reductions)."""
    xs = [torch.tensor([100, -128, 3], dtype=torch.int8), torch.tensor([100, -1, 5], dtype=torch.int8)]
    assert ref_reduce(xs, "SUM").tolist() == [-56, 127, 8]
    assert ref_reduce(xs, "PRODUCT").tolist() == [16, -128, 15]
    b = [torch.tensor([True, False, True]), torch.tensor([True, False, False])]
    assert ref_reduce(b, "SUM").tolist() == [True, False, True]
    assert ref_reduce(b, "PRODUCT").tolist() == [True, False, False]
    assert ref_reduce(b, "MIN").tolist() == [True, False, False]
    assert ref_reduce(b, "BXOR").tolist() == [False, False, True]
    f = [torch.tensor([1.0, 2.0], dtype=torch.bfloat16), torch.tensor([3.0, -2.0], dtype=torch.bfloat16)]
    assert ref_reduce(f, "PREMUL_SUM").tolist() == [2.0, 0.0]
    assert ref_reduce(f, "AVG").dtype == torch.bfloat16
    for dtype in FLOATS:
        assert gen("k", 0, dtype, 5).dtype == dtype
