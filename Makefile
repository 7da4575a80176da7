# Developer entry points. Everything runs from the project's own virtualenv in .venv.
#   make venv   create .venv (once; again when pyproject.toml changes) with torch 2.13.0;
#               TORCH=2.14.1 (any target) uses and creates .venv-torch2.14.1 instead
#   make demo   4-rank tour of the collectives, then a short DDP training run (2 ranks)
#   make test   the test suite, one pytest-xdist worker per CPU (docs/testing.md), without
#               the cases marked full (the rest of the grids: make test-full runs those)
#   make test-torch-next  make test on torch 2.14.1 (TORCH_NEXT), in .venv-torch2.14.1
#   make test-launchers  env:// under torchrun, Slurm and MPI environments, real mpirun
#               (installs Debian's openmpi-bin first when mpirun is missing; needs root)
#   make bench  benchmarks vs torch.distributed's gloo (BENCH_ARGS="..." passes options),
#               then functional vs in-place collectives (python -m pyc10d.bench.funcol)
#               and the per-call cost at world size 1 (python -m pyc10d.bench.percall),
#               then the floor under an 8 B all_reduce and each layer above it (bench.floor)
#   make bench-compare BASE=<commit>  the n=2 all_reduce grid (8 B-16 MiB; shm, tcp, the plugin)
#               of BASE and this tree alternated in one run, 6 fresh jobs each: ratio and spread
#   make bench-calls  Python calls per n=2 call on the calling thread (all_reduce 8 B, 64 KiB,
#               1 MiB; send/recv 8 B) against benchmarks/calls-reference.json (make test checks it)
#   make bench-instructions  instructions per call under valgrind's callgrind (python -m
#               pyc10d.bench.instructions: 8 B all_reduce, broadcast and barrier at world size 1
#               on shm, tcp, threaded and the plugin, fake, functional, a TCPStore set+get),
#               exit 1 naming each path over 5% above benchmarks/instructions-reference.json
#               (minutes; make test runs a smaller guard); UPDATE=1 rewrites the reference
#               instead, for a reviewed commit that says why
#   make test-instructions  the instruction guard of make test over every path of
#               bench-instructions instead of one path of each layer (~80 CPU-s; .ci/run runs
#               it after make test)
#   make fuzz   100,000 malformed frames at a live TCPStore server and 100,000 garbage
#               handshakes at the tcp transport's listener (and bad frames from its peers)
#               while good clients keep working; prints frames, time and peak memory;
#               then PROPERTY_EXAMPLES (3,000) random collective calls per property test
#               (tests/test_properties.py; make test runs 60)
#   make chaos  500 trials: a rank SIGKILLed mid-run on tcp and shm (tests/chaos.py), then
#               400 of torch's DDP / FSDP2 training on the plugin (pyc10d_shm, pyc10d_tcp)
#   make torch-suite  torch's own backend suite (torch.testing's distributed_test) on
#               pyc10d_shm / pyc10d_tcp (world size 2) and pyc10d_shm (4) beside Gloo, then the
#               tests torch gates on the name gloo against pyc10d; prints the table that
#               docs/coming-from-torch.md shows
#               (minutes; results in benchmarks/results/torch_suite; a slice runs in make test)
#   make test-torchft  torchft's own multi-PG and Manager tests (from its wheel) on
#               pyc10d.integrations.torchft.ProcessGroupPyc10d, 3 runs, beside torchft's
#               ProcessGroupGloo and ProcessGroupBabyGloo (minutes; make test runs them once)
#   make chaos-torchft  200 failures under torchft (tests/chaos_torchft.py): replica groups on
#               ProcessGroupPyc10d, one SIGKILLed and restarted at a time; then the recovery
#               bench beside torchft's Gloo classes (python -m pyc10d.bench.torchft_recovery)
#   make test-worlds  the conformance families (tests/test_conformance.py) at every world size
#               1-33 on threaded and tcp, and the logarithmic algorithms at 1-33 (make test:
#               5 ranks; make test-full: 9); hours on 2 cores (WORLDS_TIMEOUT: seconds per launch)
#   make exit-trials  programs that end right after their last collective (8 ranks as threads;
#               2 ranks on shm, tcp and the plugin, forked and exec-started), EXIT_TRIALS (50)
#               runs each: every one must exit 0 (make test runs each once, forked)
#   make test-clients  programs written for torch.distributed, unchanged, on pyc10d and Gloo:
#               a nanoGPT-sized model under torchrun, Lightning Fabric's DDP, and an accelerate
#               script run with PYC10D_SERVE_GLOO=1 and with the default group made first
#               (lightning and accelerate installed into .venv-clients), losses and parameters
#               compared (pyc10d/testing/clients.py)
#   make test-slurm  a real Slurm cluster on namespace hosts (slurmctld, a slurmd per host; needs
#               root, installs Debian's slurm-wlm and munge when missing): a torch DDP script
#               through srun and sbatch on pyc10d and Gloo, pyc10d's API under srun with nothing
#               set, a node lost mid-job (tests/testing/test_slurm.py, which make test leaves to it)
#   make test-ray  a real Ray cluster on namespace hosts (Ray installed into .venv-ray): Ray
#               Train's TorchTrainer on pyc10d and Gloo, ray.util.collective on pyc10d beside
#               Ray's Gloo backend (python -m pyc10d.testing.raycluster)
#   make lint   ruff

PYTHON ?= python3
# The torch a venv holds: 2.13.0 (the small CPU build) in .venv; another in its own folder
# (make venv TORCH=2.14.1 -> .venv-torch2.14.1, a CUDA build that runs on the CPU, 5.5 GB).
TORCH ?= 2.13.0
TORCH_NEXT ?= 2.14.1
VENV := $(if $(filter 2.13.0,$(TORCH)),.venv,.venv-torch$(TORCH))
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stamp
BENCH_ARGS ?=

FUZZ_FRAMES ?= 100000
PROPERTY_EXAMPLES ?= 3000

# A launch of 33 processes on 2 cores runs for minutes: the per-test limit of test-worlds.
WORLDS_TIMEOUT ?= 1800

.PHONY: venv demo test test-torch-next test-full test-launchers test-worlds fuzz chaos bench bench-compare bench-calls bench-instructions test-instructions torch-suite test-torchft \
	chaos-torchft lint clean exit-trials test-clients test-slurm test-ray

venv: $(STAMP)

# torch is pinned and installed first: an unpinned torch would pull a multi-GB CUDA build.
# --no-compile: pip would compile every module of every package (torch's alone: ~28 of its
# ~40 CPU-seconds); the modules the suite imports (a minority) are compiled on first import
# instead: these targets let Python write bytecode (PYTHONDONTWRITEBYTECODE, below).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --no-compile torch==$(TORCH)
	$(VENV)/bin/pip install --no-compile -e '.[test,bench,dev]'
	touch $@

# Where PYTHONDONTWRITEBYTECODE is set (as on these machines), every interpreter would compile
# each module it imports that has no bytecode yet: torch's and pyc10d's on every start (the
# suite starts hundreds). Exported empty, it lets each module be compiled once, on first import.
export PYTHONDONTWRITEBYTECODE =

demo: $(STAMP)
	$(PY) -m pyc10d.run --nproc-per-node 4 examples/demo.py
	$(PY) -m pyc10d.run --nproc-per-node 2 examples/train_ddp.py --steps 30

# -q and the 60 s per-test timeout come from pyproject.toml's addopts; a second -q here
# would hide pytest's closing "N passed" line. Tests run on TEST_WORKERS pytest-xdist workers
# (default: one per CPU; TEST_WORKERS=0 runs them in this process, one after the other).
# --dist loadgroup hands out single tests, so the long files (conformance, hier) spread too.
# The Slurm cluster's tests run in make test-slurm alone (.ci/run runs it): beside the suite
# their 4-rank jobs pushed a torchft example over its limit.
# tmux for the terminal test of pyc10d.status --watch, tcpdump and openssl for the TLS tests (a
# sniffed wire, throwaway certificates), iptables for the silent-partition tests (each skips only
# where its tool cannot be had).
# compileall: pyc10d's and the tests' bytecode before the workers start, compiled once in
# parallel rather than by the first interpreters that import them.
TEST_WORKERS ?= auto
test: $(STAMP)
	command -v tmux >/dev/null && command -v tcpdump >/dev/null && command -v iptables >/dev/null && \
		command -v openssl >/dev/null || { apt-get update && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y tmux tcpdump iptables openssl; } || true
	$(PY) -m compileall -q -j 0 pyc10d tests examples _pyc10d_autoload.py
	$(PY) -m pytest tests -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup -m "not full" \
		--ignore=tests/testing/test_slurm.py

# The whole suite again on the next torch (its own venv: make venv TORCH=$(TORCH_NEXT)).
test-torch-next:
	$(MAKE) test TORCH=$(TORCH_NEXT)

# The rest of the grids whose short forms make test runs (tests marked full: tests/conftest.py).
test-full: $(STAMP)
	$(PY) -m pytest tests -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup -m full

# Open MPI from Debian when mpirun is absent: without it the real-mpirun tests skip.
test-launchers: $(STAMP)
	command -v mpirun >/dev/null || { apt-get update && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y openmpi-bin; }
	$(PY) -m pytest tests/test_launchers.py tests/test_run.py -p no:cacheprovider

# Not part of `make test` (which samples 5 ranks, and make test-full 9); --durations=0 lists every launch's seconds.
test-worlds: $(STAMP)
	PYC10D_ALL_WORLDS=1 PYC10D_WORLDS_TIMEOUT=$(WORLDS_TIMEOUT) $(PY) -m pytest -p no:cacheprovider --durations=0 \
		-n $(TEST_WORKERS) --dist loadgroup tests/test_conformance.py tests/algorithms/test_logarithmic.py

# Not part of `make test` (which runs the same tests with a few thousand frames): minutes.
fuzz: $(STAMP)
	PYC10D_FUZZ_FRAMES=$(FUZZ_FRAMES) PYC10D_FUZZ_HANDSHAKES=100000 $(PY) -m pytest -p no:cacheprovider --durations=0 \
		tests/store/test_store_fuzz.py::test_fuzz_server tests/transport/test_tcp_fuzz.py
	PYC10D_PROPERTY_EXAMPLES=$(PROPERTY_EXAMPLES) $(PY) -m pytest -p no:cacheprovider tests/test_properties.py

bench: $(STAMP)
	$(PY) -m pyc10d.bench $(BENCH_ARGS)
	$(PY) -m pyc10d.bench.funcol
	$(PY) -m pyc10d.bench.percall
	$(PY) -m pyc10d.bench.floor
	$(PY) -m pyc10d.bench.floor --ladder tcp

# BASE and this tree alternated in one run, fresh jobs (python -m pyc10d.bench.compare): the n=2
# all_reduce grid, 8 B to 16 MiB, on shm, tcp and the plugin, each figure's ratio and spread.
# Run it on every change to a hot path and quote it in the commit. BASE: a commit or a folder.
BASE ?= HEAD~1
COMPARE_ARGS ?=
bench-compare: $(STAMP)
	$(PY) -m pyc10d.bench.compare $(BASE) $(COMPARE_ARGS)

# Python calls per call on the calling thread at n=2 (python -m pyc10d.bench.calls; make test
# holds them to benchmarks/calls-reference.json): UPDATE=1 rewrites the reference.
bench-calls: $(STAMP)
	$(PY) -m pyc10d.bench.calls $(if $(UPDATE),--write-reference)

# Counts are per call (segments of N and 2N calls, differenced), the least of 3 heap layouts.
# UPDATE=1 writes the reference instead of checking against it: commit that file alone, in a
# reviewed commit whose message says why the counts moved.
INSTRUCTIONS_CALLS ?= 500
bench-instructions: $(STAMP)
	command -v valgrind >/dev/null || { apt-get update && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y valgrind; }
	$(PY) -m pyc10d.bench.instructions --calls $(INSTRUCTIONS_CALLS) \
		$(if $(UPDATE),--write-reference,--check) benchmarks/instructions-reference.json

# The guard's test (tests/bench/test_bench_instructions.py) over every path: make test runs six.
test-instructions: $(STAMP)
	command -v valgrind >/dev/null || { apt-get update && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y valgrind; }
	$(PY) -m pytest tests/bench/test_bench_instructions.py -p no:cacheprovider -m full

chaos: $(STAMP)
	$(PY) tests/chaos.py --trials 500
	$(PY) tests/chaos.py --trials 400 --backends pyc10d_shm,pyc10d_tcp

# Not part of `make test` (tests/torch_backend/test_torch_suite.py runs a fixed slice of it): minutes.
torch-suite: $(STAMP)
	$(PY) -m pyc10d.testing.torch_suite

# Programs written for torch.distributed run unchanged on pyc10d and on Gloo, their losses and
# parameters compared (pyc10d/testing/clients.py): a nanoGPT-sized model under torchrun,
# Lightning Fabric, and Hugging Face accelerate (which names no backend but gloo on CPU: run
# with PYC10D_SERVE_GLOO=1 and with the default group made on pyc10d first); lightning and
# accelerate are installed into their own venv, beside torch pinned as for make venv.
CLIENTS_VENV ?= .venv-clients
test-clients:
	test -x $(CLIENTS_VENV)/bin/python || $(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/pip install -q --no-compile torch==$(TORCH)
	$(CLIENTS_VENV)/bin/pip install -q --no-compile -e . lightning accelerate
	$(CLIENTS_VENV)/bin/python -m pyc10d.testing.clients

# A real Slurm cluster in namespace hosts (pyc10d/testing/slurm.py); the Slurm tests fail here,
# rather than skip, where Slurm or the hosts cannot be had.
test-slurm: $(STAMP)
	command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null || { \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
		slurmctld slurmd slurm-client munge; }
	PYC10D_REQUIRE_SLURM=1 $(PY) -m pytest tests/testing/test_slurm.py -p no:cacheprovider --durations=0

# A real Ray cluster in namespace hosts (pyc10d/testing/raycluster.py), Ray in its own venv
# beside torch pinned as for make venv (Ray Train's workers import torch from it).
RAY_VENV ?= .venv-ray
RAY ?= 2.60.0
test-ray:
	test -x $(RAY_VENV)/bin/python || $(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/pip install -q --no-compile torch==$(TORCH)
	$(RAY_VENV)/bin/pip install -q --no-compile -e . 'ray[train]==$(RAY)' matplotlib
	$(RAY_VENV)/bin/python -m pyc10d.testing.raycluster

# Not part of `make test` (tests/integrations/test_torchft.py runs the selection once on pyc10d).
test-torchft: $(STAMP)
	$(PY) -m pyc10d.testing.torchft_suite --runs 3

chaos-torchft: $(STAMP)
	$(PY) tests/chaos_torchft.py --failures 200
	$(PY) -m pyc10d.bench.torchft_recovery --trials 5

EXIT_TRIALS ?= 50
exit-trials: $(STAMP)
	PYC10D_EXIT_TRIALS=$(EXIT_TRIALS) $(PY) -m pytest -p no:cacheprovider tests/test_threads.py
	PYC10D_EXIT_TRIALS=$(EXIT_TRIALS) PYC10D_EXIT_START=exec $(PY) -m pytest -p no:cacheprovider \
		tests/test_threads.py -k launched

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf build *.egg-info .ruff_cache
	find . -name __pycache__ -type d -not -path './$(VENV)/*' -prune -exec rm -rf {} +
