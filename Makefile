# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The project's bytecode, compiled ahead: an editable install leaves it uncompiled, and where
# PYTHONDONTWRITEBYTECODE is set every start would compile ~150 modules again (~0.3 s).
COMPILE := $(BIN)/python -m compileall -q gateway channels scheduler

.PHONY: run test lint install chat migrate bench clean

# The first run installs for a minute or so, quietly: a line says so before it starts.
$(STAMP): pyproject.toml
	@echo "installing the gateway and its dependencies into $(VENV): the first time (or after pyproject.toml changed) this takes about a minute..."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,postgres]'
	$(COMPILE)
	touch $(STAMP)
	@echo "installed into $(VENV)"

install: $(STAMP)

run: $(STAMP)
	@$(COMPILE)
	$(BIN)/gateway serve

chat: $(STAMP)
	$(BIN)/gateway chat

migrate: $(STAMP)
	$(BIN)/gateway migrate

# -rs: every skipped tier says why (no PostgreSQL URL, no llama.cpp server environment).
test: $(STAMP)
	$(BIN)/pytest -q -rs

# ruff (pyflakes, isort, bugbear, pyupgrade, complexity, lines <= 120), mypy, and every test
# module imported (mypy does not read tests/: a name one test module takes from another that is
# gone shows up here, not only in a full run); CI runs it.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	@$(BIN)/pytest --collect-only -q -p no:cacheprovider > $(VENV)/collect.log \
		|| { cat $(VENV)/collect.log; exit 1; }
	@tail -n 1 $(VENV)/collect.log

clean:
	rm -rf $(VENV)
