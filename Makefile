# One entry point for a fresh machine: `make demo` and `make test` set up .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The stamp changes with pyproject.toml, so editing dependencies re-runs the install.
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
EXTRAS ?= trainer,hta,dashboard,bench,cluster,dev

.PHONY: setup system-deps demo test audit bench bench-scale bench-big bench-tune bench-tune-record clean

# Debian packages the tests use for real: a headless browser for the dashboard test and a
# Prometheus server (with promtool) for the metrics integration test.
SYSTEM_DEPS := chromium chromium-driver prometheus
SYSTEM_BINS := /usr/bin/chromium /usr/bin/prometheus /usr/bin/promtool
system-deps:
	@missing=""; for b in $(SYSTEM_BINS); do test -x $$b || missing=yes; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing $(SYSTEM_DEPS) (Debian packages)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(SYSTEM_DEPS) \
	    || { echo "error: could not install $(SYSTEM_DEPS); the dashboard and Prometheus tests need them" >&2; exit 1; }; \
	fi

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# torch is pinned to 2.13.0 in the `trainer` extra: unpinned it pulls GBs of CUDA wheels.
	@# editable_mode=compat: the checkout as a path entry (.pth), not setuptools' import finder,
	@# which cost every Python start here 10-15 ms (pathlib and more) that a user's install never pays.
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]' --config-settings editable_mode=compat
	@rm -f $(VENV)/.installed-*
	@touch $@

# The whole story on a CPU: a small TP2 x PP2 x DP2 job (8 gloo processes), its traces analysed.
DEMO_OUT ?= runs/demo
demo: setup
	rm -rf $(DEMO_OUT)
	$(BIN)/python -m instrumented_trainer --nproc 8 --tensor-model-parallel-size 2 \
	  --pipeline-model-parallel-size 2 --global-batch-size 16 --micro-batch-size 2 \
	  --overlap-grad-reduce --train-iters 6 --profile-wait 1 --profile-warmup 1 --profile-active 3 \
	  --out $(DEMO_OUT)
	$(BIN)/diag analyze $(DEMO_OUT)
	@echo
	@echo "Next: $(BIN)/diag recommend $(DEMO_OUT)     # the changes worth trying, with the re-run commands"
	@echo "      $(BIN)/diag dashboard $(DEMO_OUT)     # the same run in the browser: http://127.0.0.1:8501/"

test: setup system-deps
	$(BIN)/python -m pytest -q

# Known vulnerabilities in the installed dependencies (pip-audit; says so when it cannot reach the data).
audit: setup
	$(BIN)/python scripts/audit.py

# diag vs HTA vs the JSON parse floor on two sizes of a real trace repeated in time (see benchmarks/README.md).
BENCH_SRC := tests/data/a100_rank0_of_2_nccl_args
# The common case, 5-15 MB: the source above as it is (9.8 MB), and the newest schema (14.2 MB).
BENCH_MID := tests/data/b200_rank0_of_8_eager/eager_trace.json.gz
bench: setup
	@mkdir -p bench_out
	@for k in 6 12; do test -f bench_out/a100_nccl_x$$k.json || \
	  $(BIN)/python benchmarks/make_big_trace.py $(BENCH_SRC) bench_out/a100_nccl_x$$k.json --copies $$k; done
	$(BIN)/python benchmarks/bench_analyze.py $(BENCH_SRC)/nccl_data.json.gz $(BENCH_MID) \
	  bench_out/a100_nccl_x6.json bench_out/a100_nccl_x12.json --rounds 5 --out bench_out/bench_big.json
	$(BIN)/python benchmarks/phases.py $(BENCH_SRC)/nccl_data.json.gz bench_out/a100_nccl_x6.json \
	  bench_out/a100_nccl_x12.json --rounds 3
	$(BIN)/python benchmarks/startup.py $(BENCH_SRC)/nccl_data.json.gz --rounds 9

# diag vs HTA as events per rank and ranks grow (synthesised jobs; see benchmarks/README.md)
bench-scale: setup
	@mkdir -p bench_out
	$(BIN)/python benchmarks/bench_scale.py --out bench_out/bench_scale.json

# One 2 GB trace (plain and gzipped) within 6 GiB of RAM, and HTA on it (see benchmarks/README.md).
bench-big: setup
	@mkdir -p bench_out
	$(BIN)/python benchmarks/bench_big.py --gz --hta --out bench_out/bench_big_2gb.json

# Issue #19's closed loop: each lever the recommender can propose, on a small trainer job built to
# trip it, applied and re-run; predicted against measured step change and peak memory (a benchmark:
# read its ratios next to the noise it prints; benchmarks/README.md has the readings).
bench-tune: setup
	@mkdir -p bench_out
	$(BIN)/python benchmarks/bench_tune.py --repeats 3 --max-repeats 20 --max-minutes 3 --out bench_out/tune-$$(date -u +%Y%m%d-%H%M)

# The closed loop's record: every reading bench-tune kept (bench_out/tune-*), priced again by the model at
# this code, pooled per lever (benchmarks/tune_record.py; benchmarks/README.md).
bench-tune-record: setup
	$(BIN)/python benchmarks/tune_record.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
