# Two commands on a fresh machine with Python 3.11+:  make demo  |  make test
# Each creates .venv and installs what it needs the first time.

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
TEST_WORKERS ?= 2
STAMP   = $(VENV)/.installed-$(shell cat pyproject.toml src/pgcdc/*/_*.c | cksum | cut -d" " -f1)

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml $(wildcard src/pgcdc/*/_*.c)
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "pgcdc needs Python 3.11 or later")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark,embedded]'
	@rm -f $(VENV)/.installed-* && touch $@

demo: $(STAMP)
	$(BIN)/pgcdc demo

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25 $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/decode.py
	$(BIN)/python benchmarks/stream.py
	$(BIN)/python benchmarks/pipeline.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
