# One entry point for a fresh machine: `make demo` and `make test` set up .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The stamp changes with pyproject.toml, so editing dependencies re-runs the install.
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
EXTRAS ?= trainer,hta,dev

.PHONY: setup demo test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# torch is pinned to 2.13.0 in the `trainer` extra: unpinned it pulls GBs of CUDA wheels.
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
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

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/bench_analyze.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
