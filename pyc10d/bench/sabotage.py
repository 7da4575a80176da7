"""A test seam for the benchmarks' correctness checks: one timed call made to do nothing.

A benchmark's check is only worth its name if it fails when the operation it times does not
do its work. ``skip_call(owner, name, nth)`` replaces ``owner.name`` (a module's function)
so that the ``nth`` call made on this thread *inside a timed loop* (one of
``pyc10d.bench.timing.back_to_back``'s) does nothing the caller can see; a test then runs
the benchmark and expects its check to report the damage. Nothing in the benchmarks reads
this module: production code pays nothing for it.

What "does nothing" means depends on the call (``mode``):

* ``"blind"`` (in-place collectives): the call runs on a clone of its first tensor argument,
  the one it writes, so every rank still takes part and nothing hangs, and the caller's
  tensor is left as it was; an asynchronous call returns a finished handle whose future
  holds that untouched tensor.
* ``"stale"`` (calls that return a new result, e.g. functional collectives, fused ops):
  the call runs, and the caller gets the previous call's result instead: the worst case of
  an output buffer that was never written.
* ``"drop"`` (calls with no peers: a store's ``set``, a world-size-1 collective): the call
  is not made at all and returns ``None``.

For processes a benchmark launches, ``python -m pyc10d.bench.sabotage`` (as the module
``pyc10d.bench.launch.run_worker`` starts) applies ``PYC10D_SABOTAGE=module:attr:nth:mode``
(``attr`` may be ``Class.method``)
(several, comma-separated, each with a count of its own)
and then runs ``PYC10D_SABOTAGE_RUN`` (a benchmark module) as ``__main__`` with the same
arguments.
"""

from __future__ import annotations

import importlib
import runpy
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from pyc10d import settings

_local = threading.local()
MODES = ("blind", "stale", "drop")


class _Done:
    """A finished ``Work`` whose future holds ``tensor``: what a blinded async call returns."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._fut: torch.futures.Future = torch.futures.Future()
        self._fut.set_result([tensor])

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        return self._fut


def _timed() -> bool:
    return getattr(_local, "timed", 0) > 0


def _arm_timing() -> Callable[[], None]:
    """Make every ``back_to_back`` loop (the original and each module's imported name) mark
    its body calls as timed; returns the undo."""
    from pyc10d.bench import timing

    original = timing.back_to_back

    def back_to_back(dist: Any, body: Callable[[int], Any], k: int, group: Any = None) -> float:
        def marked(i: int) -> Any:
            _local.timed = getattr(_local, "timed", 0) + 1
            try:
                return body(i)
            finally:
                _local.timed -= 1
        return original(dist, marked, k, group)

    holders = [timing] + [m for name, m in list(sys.modules.items())
                          if name.startswith("pyc10d.bench") and getattr(m, "back_to_back", None) is original]
    for m in holders:
        m.back_to_back = back_to_back  # type: ignore[attr-defined]

    def undo() -> None:
        for m in holders:
            m.back_to_back = original  # type: ignore[attr-defined]
    return undo


def _first_tensor(args: list[Any], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            return i, a
    for k, a in kwargs.items():
        if isinstance(a, torch.Tensor):
            return k, a
    raise TypeError("sabotage: the call has no tensor argument to blind")


def saboteur(real: Callable[..., Any], nth: int, mode: str, only_timed: bool = True
             ) -> Callable[..., Any]:
    """``real`` with its ``nth`` (1-based) call on each thread, counting only timed calls
    when ``only_timed``, made to do nothing (see the module docstring for ``mode``)."""
    if mode not in MODES:
        raise ValueError(f"sabotage mode {mode!r}: use one of {MODES}")
    state = threading.local()

    def call(*args: Any, **kwargs: Any) -> Any:
        counted = not only_timed or _timed()
        if counted:
            state.n = getattr(state, "n", 0) + 1
        hit = counted and state.n == nth
        if mode == "stale":
            result = real(*args, **kwargs)
            if hit and hasattr(state, "last"):
                return state.last
            state.last = result
            return result
        if not hit:
            return real(*args, **kwargs)
        if mode == "drop":
            return None
        largs, lkw = list(args), dict(kwargs)
        where, tensor = _first_tensor(largs, lkw)
        if isinstance(where, int):
            largs[where] = tensor.clone()
        else:
            lkw[where] = tensor.clone()
        work = real(*largs, **lkw)
        if work is None:
            return None
        work.wait()
        return _Done(tensor)

    call.sabotaged = True  # type: ignore[attr-defined]
    return call


@contextmanager
def skip_call(owner: Any, name: str, nth: int, mode: str = "blind", only_timed: bool = True
              ) -> Iterator[None]:
    """Within the block, the ``nth`` call of ``owner.name`` on each thread does nothing."""
    real = getattr(owner, name)
    undo = _arm_timing() if only_timed else (lambda: None)
    setattr(owner, name, saboteur(real, nth, mode, only_timed))
    try:
        yield
    finally:
        setattr(owner, name, real)
        undo()


def run_sabotaged(bench: str, target: str, world: int, worker_args: list[str], out: Any,
                  timeout: float) -> Any:
    """``pyc10d.bench.launch.run_worker`` of the benchmark module ``bench`` on ``world`` ranks,
    with ``target`` (``"module:attr:nth:mode"``, or several joined by commas) sabotaged in every rank: the JSON the
    workers wrote, or a string saying why there is none (a check that stops the job)."""
    from pyc10d.bench.launch import run_worker

    return run_worker(__name__, world, worker_args, out, timeout,
                      env={settings.SABOTAGE.name: target, settings.SABOTAGE_RUN.name: bench})


def main() -> None:
    """``PYC10D_SABOTAGE=module:attr:nth:mode PYC10D_SABOTAGE_RUN=bench.module python -m
    pyc10d.bench.sabotage ARGS``: the benchmark module run with one call sabotaged."""
    _arm_timing()
    for target in settings.SABOTAGE.get().split(","):
        where, attr, nth, mode = target.split(":")
        owner = importlib.import_module(where)
        *path, attr = attr.split(".")  # ``module:Class.method`` reaches a method
        for name in path:
            owner = getattr(owner, name)
        setattr(owner, attr, saboteur(getattr(owner, attr), int(nth), mode))
    target = settings.SABOTAGE_RUN.get()
    sys.argv = [target, *sys.argv[1:]]
    runpy.run_module(target, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
