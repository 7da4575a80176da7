"""One MPI rank of the benchmark whose timed call number ``NOOP_CALL`` does nothing (on every
rank, as collectives must match): the can-fail test of ``test_bench_mpi.py`` runs it under mpirun."""

import sys

from pyc10d.bench import mpi_worker

NOOP_CALL = 3  # the warm-up loop makes calls 0..K-1; this one is in the first timed loop
_make = mpi_worker._make


def _make_with_a_noop(comm, mpi, op, count, rank, n, k):  # test seam
    run, check, reset = _make(comm, mpi, op, count, rank, n, k)
    calls = [0]

    def run_or_skip(i: int) -> None:
        calls[0] += 1
        if calls[0] == k + NOOP_CALL:
            return
        run(i)

    return run_or_skip, check, reset


mpi_worker._make = _make_with_a_noop
sys.exit(mpi_worker.main())
