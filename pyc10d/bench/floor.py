"""The floor under a small all_reduce at 2 ranks, and what each layer above it costs.

``python -m pyc10d.bench.floor`` forks two processes that share one page of memory and time,
in those same two processes and back to back (a loop of K ops / K, the slower rank's figure,
the median over ``--loops`` loops), an 8-byte SUM all-reduce (two float32) built up layer by
layer:

``mmap_flag``
    The floor: each rank writes its 8-byte value into its slot of the page, publishes a
    sequence number and busy-waits for the peer's, then adds the two values (Python ints in
    ``memoryview`` words). Nothing below this is Python's to remove.
``mmap_torch``
    The same exchange with the payload in torch tensors that are views of the page: one
    ``copy_`` in, one ``torch.add(..., out=)`` out (what any torch-level all-reduce does).
``pyc10d_shm``
    ``pyc10d.all_reduce`` on the shm backend (the native API, every layer of pyc10d).
``plugin_shm``
    ``torch.distributed.all_reduce`` on backend ``pyc10d_shm`` (torch's dispatcher, then
    pyc10d's engine).

The tcp ladder (``--ladder tcp``) does the same over one loopback TCP connection between
the two processes:

``socket_block``
    Each rank sends its value (8 bytes, one ``send``) and sleeps in a blocking ``recv`` for
    the peer's: what a thread that waits for its data costs on this kernel.
``socket_spin``
    The same with the receiver looking (``MSG_DONTWAIT``) until the data is there: the floor
    of the tcp rows, nothing Python could remove below it.
``pyc10d_tcp``
    ``pyc10d.all_reduce`` on the tcp backend (its lean lane: ``transport/tcp/direct.py``).
``plugin_tcp``
    ``torch.distributed.all_reduce`` on backend ``pyc10d_tcp``.

and, beside them, the peer ``gloo`` (``torch.distributed`` on Gloo, same processes, same
loop). Each layer's figure minus the one below it is what that layer adds. Open MPI is not
here: its ranks must be mpirun's (``python -m pyc10d.bench --peer mpi`` has it). Every op's result is
checked (outputs poisoned with NaN, inputs different per op); a figure with a wrong result is
marked. Busy-waiting is right only with a core per rank: run it on a machine with two free
cores. Writes ``<out>/floor-<time>.json`` and a bar chart beside it (with matplotlib).
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyc10d.bench.report import write_result

LAYERS = ("mmap_flag", "mmap_torch", "pyc10d_shm", "plugin_shm")
TCP_LAYERS = ("socket_block", "socket_spin", "pyc10d_tcp", "plugin_tcp")
#: The floor of each ladder: the layer every other one is a multiple of.
FLOORS = {"mmap_flag": LAYERS, "socket_spin": TCP_LAYERS}
#: Timed the same way beside the layers, not one of them.
PEERS = ("gloo",)
_LINE = 8  # 64-byte cache lines, in 8-byte words
_SEQ = 0  # word of rank r's sequence number: _SEQ + r * _LINE
_VAL = 4 * _LINE  # word of parity q's, rank r's value: _VAL + (2 * q + r) * _LINE


def _flag_loop(words: memoryview, rank: int, k: int, base: int, skip: int) -> tuple[float, int]:
    """k exchanges of a value; (seconds, wrong results). Op i of rank r sends i * (r + 1)."""
    peer, wrong = 1 - rank, 0
    mine_seq, peer_seq = _SEQ + rank * _LINE, _SEQ + peer * _LINE
    t0 = time.perf_counter()
    for i in range(base, base + k):
        if i == skip:
            continue
        q = _VAL + 2 * (i & 1) * _LINE
        v = i * (rank + 1)
        words[q + rank * _LINE] = v
        words[mine_seq] = i + 1
        while words[peer_seq] < i + 1:
            pass
        if v + words[q + peer * _LINE] != 3 * i:
            wrong += 1
    return time.perf_counter() - t0, wrong


def _socket_loop(sock: Any, rank: int, k: int, base: int, skip: int, spin: bool) -> tuple[float, int]:
    """k exchanges of an 8-byte value over ``sock``; (seconds, wrong results)."""
    import socket
    import struct

    word = struct.Struct("<q")
    buf = bytearray(8)
    view, elsewhere = memoryview(buf), memoryview(bytearray(8))
    flags = socket.MSG_DONTWAIT if spin else socket.MSG_WAITALL
    wrong = 0
    t0 = time.perf_counter()
    for i in range(base, base + k):
        v = i * (rank + 1)
        sock.send(word.pack(v))
        into = elsewhere if i == skip else view  # the skipped op delivers nothing where it is checked
        got = 0
        while got < 8:
            try:
                n = sock.recv_into(into[got:], 8 - got, flags)
            except BlockingIOError:
                continue
            if n == 0:
                raise ConnectionResetError("floor: the peer closed its socket")
            got += n
        if v + word.unpack(buf)[0] != 3 * i:
            wrong += 1
    return time.perf_counter() - t0, wrong


def _torch_loop(mm: mmap.mmap, words: memoryview, rank: int, k: int, base: int, skip: int) -> tuple[float, int]:
    """k exchanges of two float32 through tensor views of the page; checked after the loop."""
    import torch

    peer = 1 - rank
    slots = [[torch.frombuffer(mm, dtype=torch.float32, count=2, offset=8 * (_VAL + (2 * q + r) * _LINE))
              for r in range(2)] for q in range(2)]
    inputs = [torch.tensor([i, i + 0.5]) * (rank + 1) for i in range(base, base + k)]
    outs = [torch.full((2,), float("nan")) for _ in range(k)]
    mine_seq, peer_seq = _SEQ + rank * _LINE, _SEQ + peer * _LINE
    t0 = time.perf_counter()
    for j in range(k):
        i = base + j
        if i == skip:
            continue
        pair = slots[i & 1]
        pair[rank].copy_(inputs[j])
        words[mine_seq] = i + 1
        while words[peer_seq] < i + 1:
            pass
        torch.add(pair[0], pair[1], out=outs[j])
    took = time.perf_counter() - t0
    wrong = sum(1 for j in range(k) if not torch.equal(outs[j], torch.tensor([base + j, base + j + 0.5]) * 3))
    return took, wrong


def _dist_loop(dist: Any, rank: int, k: int, base: int, skip: int) -> tuple[float, int]:
    """k in-place SUM all_reduces of two float32 through ``dist``; checked after the loop."""
    import torch

    bufs = [torch.tensor([i, i + 0.5]) * (rank + 1) for i in range(base, base + k)]
    dist.barrier()
    t0 = time.perf_counter()
    for j in range(k):  # a skipped op reduces a clone: the ranks stay in step, bufs[j] unchanged
        dist.all_reduce(bufs[j] if base + j != skip else bufs[j].clone())
    took = time.perf_counter() - t0
    wrong = sum(1 for j in range(k) if not torch.equal(bufs[j], torch.tensor([base + j, base + j + 0.5]) * 3))
    return took, wrong


def _rank(rank: int, mm: mmap.mmap, socks: list, tmp: str, layers: list[str], k: int, loops: int,
          skip: tuple[str, int] | None, conn: Any) -> None:
    """One rank: every layer, ``loops`` loops of ``k`` ops; sends {layer: [(s, wrong), ...]}."""
    import gc

    import torch

    gc.freeze()
    torch.set_num_threads(1)
    words = memoryview(mm).cast("q")
    out: dict[str, list[tuple[float, int]]] = {}
    seq = 0  # the exchange layers' op numbers continue across loops and layers
    try:
        for layer in layers:
            # op ``skip[1]`` of loop 0 does nothing on rank 0 (a test seam: the check must fail)
            bad = skip[1] if skip is not None and skip[0] == layer and rank == 0 else -1
            rows = []
            if layer in ("mmap_flag", "mmap_torch"):
                for loop in range(loops + 1):  # loop 0 warms up, unreported
                    _flag_loop(words, rank, 1, seq, -1)  # both ranks start the loop together
                    seq += 1
                    skip_at = seq + bad if loop == 1 and bad >= 0 else -1
                    if layer == "mmap_flag":
                        rows.append(_flag_loop(words, rank, k, seq, skip_at))
                    else:
                        rows.append(_torch_loop(mm, words, rank, k, seq, skip_at))
                    seq += k
            elif layer in ("socket_block", "socket_spin"):
                sock = socks[rank]
                for loop in range(loops + 1):
                    _socket_loop(sock, rank, 1, seq, -1, False)  # both ranks start the loop together
                    seq += 1
                    skip_at = seq + bad if loop == 1 and bad >= 0 else -1
                    rows.append(_socket_loop(sock, rank, k, seq, skip_at, layer == "socket_spin"))
                    seq += k
            else:
                dist = _join(layer, rank, tmp)
                try:
                    for loop in range(loops + 1):
                        rows.append(_dist_loop(dist, rank, k, 0, bad if loop == 1 else -1))
                finally:
                    dist.destroy_process_group()
            out[layer] = rows[1:]
        conn.send(("ok", out))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        conn.send(("error", f"rank {rank}: {type(e).__name__}: {e}"))
    finally:
        conn.close()
        os._exit(0)


def _join(layer: str, rank: int, tmp: str) -> Any:
    if layer in ("pyc10d_shm", "pyc10d_tcp"):
        import pyc10d as dist

        dist.init_process_group(layer[len("pyc10d_"):], store=dist.FileStore(os.path.join(tmp, f"store-{layer}"), 2),
                                rank=rank, world_size=2)
        return dist
    import torch.distributed as tdist

    import pyc10d.torch_backend  # noqa: F401 - registers the pyc10d_* backends with torch

    backend = "gloo" if layer == "gloo" else layer.replace("plugin_", "pyc10d_")
    tdist.init_process_group(backend, store=tdist.FileStore(os.path.join(tmp, f"store-{layer}"), 2), rank=rank,
                             world_size=2)
    return tdist


def measure(layers: list[str], k: int, loops: int, skip: tuple[str, int] | None = None,
            timeout: float = 120.0) -> list[dict[str, Any]]:
    """One record per layer: ``us`` (median over loops of the slower rank's time per op),
    every loop's figure, and ``correct`` (every op of every loop on both ranks)."""
    mm = mmap.mmap(-1, 4096)
    socks = _socket_pair()
    ctx = multiprocessing.get_context("fork")
    tmp = tempfile.mkdtemp(prefix="pyc10d-floor-")
    pipes, procs = [], []
    for rank in range(2):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_rank, args=(rank, mm, socks, tmp, layers, k, loops, skip, send), daemon=True)
        p.start()
        send.close()
        pipes.append(recv)
        procs.append(p)
    results = []
    for r, recv in enumerate(pipes):
        if not recv.poll(timeout):
            for p in procs:
                p.kill()
            raise TimeoutError(f"floor: rank {r} did not finish in {timeout:.0f} s")
        status, payload = recv.recv()
        if status != "ok":
            for p in procs:
                p.kill()
            raise RuntimeError(payload)
        results.append(payload)
    for p in procs:
        p.join(10)
    for sock in socks:
        sock.close()
    records = []
    for layer in layers:
        per_loop = [max(results[0][layer][i][0], results[1][layer][i][0]) / k * 1e6 for i in range(loops)]
        wrong = sum(w for rank_rows in results for _, w in rank_rows[layer])
        records.append({"layer": layer, "us": statistics.median(per_loop), "loops_us": per_loop,
                        "ops_per_loop": k, "wrong": wrong, "correct": wrong == 0})
    us = {r["layer"]: r["us"] for r in records}
    # The peers are compared with the first ladder measured (shm's when both are).
    peers_floor = next((us[f] for f in FLOORS if f in us), None)
    for rec in records:
        ladder = next((ld for ld in FLOORS.values() if rec["layer"] in ld), None)
        floor = peers_floor if ladder is None else us.get(ladder[0] if ladder is LAYERS else "socket_spin")
        rec["x_floor"] = rec["us"] / floor if floor else None
        below = [us[x] for x in (ladder or ())[:(ladder or ()).index(rec["layer"]) if ladder else 0] if x in us]
        rec["adds_us"] = rec["us"] - below[-1] if below else None
    return records


def _socket_pair() -> list:
    """Two ends of one loopback TCP connection (Nagle off), made before the fork."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return [a, b]


def _plot(records: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [r["layer"] + ("" if r["correct"] else " (wrong!)") for r in records]
    ax.barh(names[::-1], [r["us"] for r in records][::-1], color="#4c72b0")
    for y, r in enumerate(records[::-1]):
        ax.text(r["us"], y, f" {r['us']:.2f} us", va="center")
    ax.set_xlabel("us per 8 B all_reduce, 2 ranks (back to back, slower rank, median of loops)")
    ax.set_title("The floor and each layer above it")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pyc10d.bench.floor", description=__doc__.split("\n")[0])
    p.add_argument("--layers", default=None,
                   help=f"comma-separated, of {', '.join(LAYERS + TCP_LAYERS + PEERS)} (default: the ladder's and gloo)")
    p.add_argument("--ladder", choices=("shm", "tcp"), default="shm",
                   help="shm (default): shared memory's layers; tcp: a loopback socket's")
    p.add_argument("--iters", type=int, default=5000, help="ops per timed loop (default 5000)")
    p.add_argument("--loops", type=int, default=5, help="timed loops per layer (default 5)")
    p.add_argument("--out", default="benchmarks/results", help="directory for the JSON and PNG")
    args = p.parse_args(argv)
    ladder = TCP_LAYERS if args.ladder == "tcp" else LAYERS
    layers = args.layers.split(",") if args.layers else list(ladder + PEERS)
    unknown = sorted(set(layers) - set(LAYERS + TCP_LAYERS + PEERS))
    if unknown:
        p.error(f"unknown layer(s) {unknown}; choose from {', '.join(LAYERS + TCP_LAYERS + PEERS)}")
    records = measure(layers, args.iters, args.loops)
    print(f"{'layer':<12} {'us/op':>8} {'adds us':>8} {'x floor':>8}  loops (us)")
    for r in records:
        adds = "" if r["adds_us"] is None else f"{r['adds_us']:+8.2f}"
        ratio = "" if r["x_floor"] is None else f"{r['x_floor']:8.1f}"
        flag = "" if r["correct"] else f"  WRONG ({r['wrong']} ops)"
        print(f"{r['layer']:<12} {r['us']:8.2f} {adds:>8} {ratio:>8}  "
              f"{' '.join(f'{x:.2f}' for x in r['loops_us'])}{flag}")
    meta = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "ops_per_loop": args.iters,
            "loops": args.loops, "load_avg": os.getloadavg()}
    path = write_result(args.out, f"floor-{args.ladder}" if args.ladder != "shm" else "floor",
                        {"meta": meta, "records": records})
    _plot(records, path.with_suffix(".png"))
    print(f"wrote {path}")
    return 0 if all(r["correct"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
