"""Collective benchmarks in the style of nccl-tests: ``python -m pyc10d.bench --help``.

* :mod:`pyc10d.bench.metrics` - sizes, iteration counts and the nccl-tests bandwidth formulas;
* :mod:`pyc10d.bench.worker` - the per-rank timing loop (run under ``pyc10d.run``);
* :mod:`pyc10d.bench.report` - tables, JSON and the plot;
* :mod:`pyc10d.bench.__main__` - the driver that launches one job per backend x world size;
* :mod:`pyc10d.bench.floor` - the floor under an 8 B all_reduce at 2 ranks (a busy-wait
  exchange through shared memory) and what each layer above it adds.
"""
