# Two commands set everything up on a fresh machine (Python 3.11 + make):
#   make example   build the venv if needed, then verify the bundled example pairs
#   make test      build the venv if needed, then lint and run the whole test suite
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch-xla pins torch exactly; PyPI's torch 2.9.0 brings its CUDA wheels (~3 min, ~7 GB).
	$(BIN)/pip install -q -e '.[frontend,bot,dev]'
	touch $(STAMP)

.PHONY: install test example lint
install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) lint
	PJRT_DEVICE=CPU $(BIN)/python -m pytest -q

example: $(STAMP)
	bash examples/check-examples.sh $(BIN)/shardproof
