"""Groups that let go: a group nobody references any more shuts down as ``destroy`` would.

torchft drops a failed replica's group by reference (``self._pg = None``); a Gloo group
closes its connections in its destructor and its peers fail at once. A pyc10d engine is kept
alive by its own threads, so without ``backends.lifetime.release_on_drop`` its peers waited out
their timeout. Here one rank drops its group (garbage collection off: the reference count
alone must do it) and the others are timed; a create/use/drop loop counts threads, file
descriptors and shared-memory segments; and the process's watchdog thread ends with the
last group.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref
from datetime import timedelta
from typing import Any

import pytest
import torch
from _clock import bound
from _multirank import FORK, run_ranks

pytestmark = pytest.mark.timeout(50)

CASES = [("native", "tcp"), ("native", "shm"), ("plugin", "tcp"), ("plugin", "shm"),
         ("native", "threaded")]


def _group(api: str, backend: str, rank: int, world: int, name: str) -> Any:
    """A group made the way a library that manages its own groups makes one (torchft's
    ``_create_pg``): an engine over a fresh prefix of the store, held only by the caller."""
    import pyc10d
    from pyc10d.groups import _get_default_store
    from pyc10d.process_group import ProcessGroup, make_engine

    store = pyc10d.PrefixStore(name, _get_default_store())
    engine = make_engine(backend, store, rank, world, timedelta(seconds=20), name)
    if api == "plugin":
        from pyc10d.torch_backend import TorchProcessGroup

        return TorchProcessGroup(engine, rank, world, "pyc10d_" + backend)
    return ProcessGroup(rank, world, engine=engine, group_name=name)


def _group_threads(name: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.endswith(name) or f"-{name}-" in t.name]


def _drop_in_rank1(rank: int, world: int, api: str, backend: str) -> Any:
    import pyc10d
    from pyc10d.groups import _get_default_store

    pg = _group(api, backend, rank, world, "dropme")
    t = torch.ones(4)
    pg.allreduce([t]).wait()
    assert t[0].item() == world
    store = _get_default_store()
    pyc10d.barrier()
    if rank == 1:
        engine = pg.engine if api == "plugin" else pg._get_backend()
        worker = engine._worker  # its progress thread (ranks as threads share the names)
        assert worker is not None and worker.is_alive()
        del engine
        gc.disable()  # the last reference going must be enough, not a collector pass
        try:
            del pg
            threads = [] if not worker.is_alive() else [worker.name]
            if backend != "threaded":
                threads += _group_threads("dropme")  # the transport's, in a process of its own
        finally:
            gc.enable()
        store.wait(["peers-done"], timedelta(seconds=20))  # alive until the others have looked
        return threads
    time.sleep(0.3)  # rank 1 has dropped it by now (it is not waiting for us)
    t0 = time.monotonic()
    try:
        pg.allreduce([t]).wait()
        outcome: Any = ("returned", t.tolist())
    except Exception as e:  # noqa: BLE001 - what the peer raised, checked by the test
        outcome = (type(e).__name__, str(e))
    took = time.monotonic() - t0
    if store.add("peers-looked", 1) == world - 1:
        store.set("peers-done", "1")
    return took, outcome


@pytest.mark.parametrize(("api", "backend"), CASES)
def test_the_peers_of_a_dropped_group_raise_within_a_second(api: str, backend: str) -> None:
    res = run_ranks("tcp" if backend != "threaded" else "threaded", 3, _drop_in_rank1, api, backend,
                    timeout=40)
    assert res[1] == [], f"rank 1 kept threads of the dropped group: {res[1]}"
    for rank in (0, 2):
        took, (kind, msg) = res[rank]
        assert kind == "DistNetworkError", res[rank]
        assert "Connection closed by peer" in msg and "rank 1" in msg, msg
        # within a second on this machine's scale (rank 1 holds on until they have looked)
        assert took < bound(1.0), f"rank {rank} raised {took:.2f}s after it called"


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _shm_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum("/dev/shm/" in line for line in f)


def _cycles(rank: int, world: int, api: str, backend: str, cycles: int) -> list[tuple[int, int, int, int]]:
    """(threads, fds, shm mappings, shm names this rank created) after 10 cycles and after all."""
    from pyc10d.transport.shm import segment as shm_segment

    seen = []
    for i in range(cycles):
        pg = _group(api, backend, rank, world, f"cycle{i}")
        t = torch.full((8,), float(rank + 1))
        pg.allreduce([t]).wait()
        assert t[0].item() == world * (world + 1) / 2
        del pg
        if i in (9, cycles - 1):
            deadline = time.monotonic() + 2.0  # a peer's sockets close when it drops its own
            while True:
                state = (threading.active_count(), _fds(), _shm_maps(),
                         len(shm_segment.created_by(os.getpid())))
                settled = bool(seen) and all(b <= a for a, b in zip(seen[0], state))
                if settled or time.monotonic() > deadline or i == 9:
                    break
                time.sleep(0.05)
            seen.append(state)
    return seen


@pytest.mark.parametrize(("api", "backend"), [("plugin", "shm"), ("native", "tcp")])
def test_create_use_drop_200_times_leaks_nothing(api: str, backend: str) -> None:
    res = run_ranks("tcp", 2, _cycles, api, backend, 200, timeout=45)
    for rank, (after10, after200) in enumerate(res):
        names = ("threads", "fds", "shm mappings", "shm names")
        grew = {n: (a, b) for n, a, b in zip(names, after10, after200) if b > a}
        assert not grew, f"rank {rank}: grew from cycle 10 to 200: {grew}"


def _threaded_world_then_threads() -> None:
    def body(rank: int, world: int) -> None:
        import pyc10d

        t = torch.ones(2)
        pyc10d.all_reduce(t)
        pyc10d.barrier()

    run_ranks("threaded", 2, body, timeout=20)  # destroys every rank's world at the end
    deadline = time.monotonic() + 1.0
    while any(t.name.startswith("pyc10d-") for t in threading.enumerate()):
        if time.monotonic() > deadline:
            names = sorted(t.name for t in threading.enumerate())
            raise SystemExit(f"pyc10d threads alive 1 s after every group was destroyed: {names}")
        time.sleep(0.02)


def test_no_pyc10d_thread_outlives_the_last_group() -> None:
    """The watchdog thread among them: it ends once no group is registered."""
    p = FORK.Process(target=_threaded_world_then_threads)  # a process with no other groups
    p.start()
    p.join(30)
    assert p.exitcode == 0, "see the child's stderr above"


def _abort_in_rank1(rank: int, world: int) -> str:
    import pyc10d

    t = torch.ones(2)
    pyc10d.all_reduce(t)
    if rank == 1:
        time.sleep(0.3)
        pyc10d.abort_process_group()
        return ""
    try:
        pyc10d.all_reduce(t)
    except Exception as first:  # noqa: BLE001 - checked below
        try:
            pyc10d.all_reduce(t)
        except Exception as second:  # noqa: BLE001
            return f"{first}\n{second}"
    return "no error"


@pytest.mark.parametrize("backend", ["tcp", "shm", "threaded"])
def test_an_abort_reads_once(backend: str) -> None:
    """What a peer of an aborted group is told says each thing once: who aborted, no rank
    prefix twice, one flight-recorder note per error."""
    first, second = run_ranks(backend, 2, _abort_in_rank1, timeout=30, may_exit=(1,))[0].split("\n")
    assert "rank 1" in first and "abort" in first, first
    for msg in (first, second):
        assert "rank 0: rank 0:" not in msg, msg
        assert msg.count("[flight recorder:") <= 1, msg
        assert msg.count("aborted by rank 1") <= 1, msg
        assert msg.count("group '0'") <= 2, msg  # the operation's, and the earlier one's


def _groups_in_cycles(api: str, world: int) -> list[weakref.ref]:
    """Groups of ``world`` ranks made as threads of this process, used once, and left live in
    reference cycles (as a caught exception's traceback leaves them)."""
    from pyc10d.process_group import ProcessGroup, make_engine
    from pyc10d.store.hash import HashStore
    from pyc10d.store.prefix import PrefixStore

    store, refs = HashStore(), [None] * world

    def rank_main(rank: int) -> None:
        engine = make_engine("shm", PrefixStore("inherited", store), rank, world,
                             timedelta(seconds=20), "inherited")
        if api == "plugin":
            from pyc10d.torch_backend import TorchProcessGroup

            pg: Any = TorchProcessGroup(engine, rank, world, "pyc10d_shm")
        else:
            pg = ProcessGroup(rank, world, engine=engine, group_name="inherited")
        t = torch.ones(4)
        pg.allreduce([t]).wait()
        assert t[0].item() == world
        pg.cycle = pg
        refs[rank] = weakref.ref(pg)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert all(r is not None and r() is not None for r in refs), "a rank failed to make its group"
    return refs  # type: ignore[return-value]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("api", ["native", "plugin"])
def test_a_forked_child_keeps_the_groups_it_inherits(api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shm groups made by ranks as threads are garbage in reference cycles when the process
    forks; the child's collector must leave them alone (what a group holds may join the
    parent's threads in its destructor, fatal in a child: ``backends.lifetime``), and the
    parent's then releases them, engines shut down."""
    # Not placed: placement pins the whole process (here the test runner's, for the tests after)
    monkeypatch.setenv("PYC10D_BIND", "none")
    gc.collect()  # earlier tests' garbage (their torch stores included) is not this test's
    gc.disable()  # the cycles must still be there at the fork
    try:
        refs = _groups_in_cycles(api, 2)
        engines = [r().engine if api == "plugin" else r()._get_backend() for r in refs]
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                gc.enable()
                gc.collect()
                code = 0 if all(r() is not None for r in refs) else 4
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    finally:
        gc.enable()
        gc.collect()
    assert os.WIFEXITED(status), f"the child died of signal {os.WTERMSIG(status)}"
    assert os.WEXITSTATUS(status) == 0, f"the child exited with {os.WEXITSTATUS(status)} (4: it destroyed them)"
    assert all(r() is None for r in refs)
    deadline = time.monotonic() + 5.0
    while not all(e._closed for e in engines) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(e._closed for e in engines), "the parent's collection did not shut the engines down"
