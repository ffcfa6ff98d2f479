# Every target creates .venv on first use and installs what it needs; a stamp file per
# install set re-runs the install only when pyproject.toml changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q
# The tensor layer's pin: a CPU build of torch that installs from local disk here
# (pyproject.toml's torch extra accepts torch>=2.4). The tests and mypy need it.
TORCH  := torch==2.13.0

.PHONY: run test bench lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.base: pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	@touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(PIP) install $(TORCH)
	$(PIP) install -e '.[test]'
	@touch $@

## make run: the main benchmark on the built-in default (the course lesson's workload)
run: $(VENV)/.base
	$(BIN)/pagedkv bench

## make test: the whole test suite (stateful Hypothesis tests included)
test: $(VENV)/.test
	$(BIN)/python -m pytest -n 2 -q

## make bench: micro-benchmarks of the memory manager against a list-based floor
bench: $(VENV)/.base
	$(BIN)/python benchmarks/bench_memory.py
	$(BIN)/python benchmarks/bench_engine.py

## make lint: ruff and mypy, both must be clean
lint: $(VENV)/.test
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
