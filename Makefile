# Two entry points: `make run` (local 3-node cluster) and `make test` (whole suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint format bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -e '.[dev,spark]'
	touch $(STAMP)

# Bytecode compiled once: every node process the dev cluster and the tests start imports
# laminar, and without it (PYTHONDONTWRITEBYTECODE set) each compiled it anew, 0.3 s of CPU.
run: $(STAMP)
	$(BIN)/python -m compileall -q laminar
	$(BIN)/laminar dev

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m compileall -q laminar
	$(BIN)/pytest -q -n 2 --dist loadfile  # two workers (most multi-process tests wait more than they compute); a file's tests stay on one, in order, with its module fixtures

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python bench/segment_bench.py --quick
	$(BIN)/python bench/raft_bench.py --quick
	$(BIN)/python bench/produce_bench.py --quick

clean:
	rm -rf $(VENV) .laminar
