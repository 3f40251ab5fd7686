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

demo: setup
	$(BIN)/diag analyze tests/data/dlrm_4_ranks_alltoall

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/bench_analyze.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
