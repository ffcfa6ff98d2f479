# Every target creates .venv on first use and installs what it needs; a stamp file per
# install set re-runs the install only when pyproject.toml changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q
# The tensor layer's pin: a CPU build of torch that installs from local disk here
# (pyproject.toml's torch extra accepts torch>=2.4). The tests and mypy need it.
TORCH  := torch==2.13.0

# The differential test against vLLM's own v1 scheduler runs in an environment of its own:
# vLLM without its GPU dependencies (--no-deps), beside the CPU torch.
VLLM_VENV := .venv-vllm
VLLM_BIN  := $(VLLM_VENV)/bin
VLLM_PIP  := $(VLLM_BIN)/python -m pip --disable-pip-version-check -q
VLLM      := vllm==0.33.0 xgrammar==0.2.8

.PHONY: run test test-vllm bench lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.base: pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	@touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(PIP) install $(TORCH)
	$(PIP) install -e '.[test]'
	@# Headless Chromium opens the HTML report in a test (tests/report/test_browser.py): Debian's
	@# package where it is missing and the machine allows it; never a reason to fail the build.
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  (export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq chromium >/dev/null 2>&1 || \
	   (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1) || \
	   (sudo -n apt-get update -qq >/dev/null 2>&1 && \
	    sudo -n apt-get install -y -qq chromium >/dev/null 2>&1)) || \
	  echo "chromium not installed: the browser test of the HTML report will be skipped"
	@touch $@

## make run: the main benchmark on the built-in default (the course lesson's workload)
run: $(VENV)/.base
	$(BIN)/pagedkv bench

## make test: the whole test suite (stateful Hypothesis tests included)
test: $(VENV)/.test
	$(BIN)/python -m pytest -n 2 -q

$(VLLM_VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) install $(TORCH)
	$(VLLM_PIP) install -e '.[vllm-diff]'
	$(VLLM_PIP) install --no-deps $(VLLM)
	@touch $@

## make test-vllm: pagedkv's vllm-v1 policy against vLLM 0.33's own scheduler, step by step
test-vllm: $(VLLM_VENV)/.stamp
	HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 $(VLLM_BIN)/python -m pytest -n 2 -q -p no:cacheprovider tests/vllm_diff

## make bench: micro-benchmarks of the memory manager against a list-based floor
bench: $(VENV)/.base $(VENV)/.test
	$(BIN)/python benchmarks/bench_memory.py
	$(BIN)/python benchmarks/bench_engine.py
	$(BIN)/python benchmarks/bench_sweep.py
	$(BIN)/python benchmarks/bench_attention.py
	$(BIN)/python benchmarks/bench_e2e.py
	$(BIN)/python benchmarks/bench_fidelity.py

## make lint: ruff and mypy, both must be clean
lint: $(VENV)/.test
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
