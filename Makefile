# make demo / make test set up (or refresh) .venv from the project's own files, then run.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint clean

$(STAMP): pyproject.toml kv-cache-tester/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "agentsweep needs Python >= 3.11 (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e './kv-cache-tester[tokenizer,hf,fast,plots]' -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(BIN)/agentsweep matrix --key demo

test: venv
	$(BIN)/python -m pytest -q

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) results
