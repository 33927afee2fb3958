# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install chat migrate bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,postgres]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/gateway serve

chat: $(STAMP)
	$(BIN)/gateway chat

migrate: $(STAMP)
	$(BIN)/gateway migrate

test: $(STAMP)
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV)
