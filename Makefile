# The two commands of the README, and the setup they share (idempotent; fast when nothing changed).
.PHONY: setup train test test-cluster bench docs study stress
VENV := .venv

setup:
	@bash scripts/setup.sh

# The main job: ssgd on scikit-learn's digits, 4 MPI processes, result printed at the end.
train: setup
	$(VENV)/bin/hvd-async train --np 4 --metrics-out runs/metrics.json --logdir runs/tb

# Unit tests in one process, then the MPI suites under mpirun at 1 to 5 ranks (and under a one-node
# Slurm: the setup then also installs slurmd, slurmctld and munge).
test: setup
	$(VENV)/bin/python -m pytest tests -q -p no:cacheprovider -m "not cluster"
test: export HVD_ASYNC_TEST_TOOLS := 1

# The cross-host checks on a 3-host cluster of network namespaces (needs root; CI runs them after make test).
test-cluster: setup
	$(VENV)/bin/python -m pytest tests -q -p no:cacheprovider -m cluster
test-cluster: export HVD_ASYNC_TEST_TOOLS := 1

# Ratios measured side by side in one run each; JSON and plots go to benchmarks/results/.
bench: setup
	$(VENV)/bin/python benchmarks/speed/ssgd_overhead.py
	$(VENV)/bin/python benchmarks/speed/rma_bandwidth.py --mode shm
	$(VENV)/bin/python benchmarks/speed/rma_bandwidth.py --mode no-shm
	$(VENV)/bin/python benchmarks/speed/straggler_throughput.py

# Before submitting a change to a hot path (issue 19): the quick forms of the ratio benchmarks against their
# targets and the committed results (a few minutes; results in runs/bench-check/; exits 0 unless one crashed).
.PHONY: bench-check
bench-check: setup
	$(VENV)/bin/python benchmarks/speed/bench_check.py $(BENCH_CHECK_ARGS)

# The CLI reference (docs/cli.md) from the parser; a test checks it is current.
docs: setup
	$(VENV)/bin/python scripts/gen_cli_docs.py

# The reproduction study of the papers' claims at one commit: first the real runs its real checks read
# (five seeds or repeats each), then the simulated parts and docs/results.md (about 80 minutes on 2 cores).
study: setup
	$(VENV)/bin/python benchmarks/study/overlap_claims.py
	$(VENV)/bin/python benchmarks/study/compensation_claims.py
	$(VENV)/bin/python benchmarks/study/scaling_claims.py
	$(VENV)/bin/python benchmarks/study/reproduce.py

# The whole fault matrix: every algorithm family x every way one rank fails x shared memory on and off
# (benchmarks/faults/faults.py; about 25 minutes here); make test runs its fast part (tests/test_faults.py).
.PHONY: faults
faults: setup
	$(VENV)/bin/python benchmarks/faults/faults.py

# The long stress run (randomized asynchronous jobs); make test runs a short one.
stress: setup
	STRESS_RUNS=$${STRESS_RUNS:-40} STRESS_RESULTS=benchmarks/results/stress.json $(VENV)/bin/python -m pytest tests/test_stress.py -q -p no:cacheprovider
