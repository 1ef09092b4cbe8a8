# Two commands do all the set-up on a fresh machine:
#   make demo   - create .venv, copy the shipped digits reference model (hash-checked), run baseline vs accelerated
#   make test   - create .venv and run the test suite
# pip --no-compile: Python compiles the modules it imports instead of all of torch at install (~40 s less)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv demo test lint clean

$(BIN)/fastdiff: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile -e ".[dev,bench]"
	touch $(BIN)/fastdiff

venv: $(BIN)/fastdiff

demo: venv
	$(BIN)/fastdiff demo

test: venv
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

lint: venv
	$(BIN)/ruff check fastdiff tests benchmarks
	$(BIN)/ruff format --check fastdiff tests benchmarks

clean:
	rm -rf $(VENV) .fastdiff-cache out
