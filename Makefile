# Two commands set everything up on a fresh machine (Python 3.11 + make):
#   make example   build the venv if needed, then build and check examples/.shardproof.yml
#   make test      build the venv if needed, then lint and run the whole test suite
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch-xla pins torch exactly; PyPI's torch 2.9.0 brings its CUDA wheels (~3 min, ~7 GB).
	$(BIN)/pip install -q -e '.[frontend,bot,dev,megatron,flax,dtensor,fairscale,deepspeed]'
	touch $(STAMP)

# The bot's test tools: Prism with GitHub's REST description (contract tests), marked (GFM
# previews) and Chromium (trace.html and the review rendered to PNG). The tests need them and
# fail without them.
TOOLS := .tools
TOOLS_STAMP := $(TOOLS)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(TOOLS_STAMP):
	npm install --no-audit --no-fund --prefix $(TOOLS) @stoplight/prism-cli@5.14.2 @octokit/openapi@23.0.2 marked@15.0.12
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends chromium; }
	touch $(TOOLS_STAMP)

# The action's Docker tests start their own dockerd and make their base image with debootstrap
# (Docker Hub is not reachable everywhere); they fail without these.
DOCKER_STAMP := $(TOOLS)/.docker-installed

$(DOCKER_STAMP):
	command -v dockerd >/dev/null && command -v debootstrap >/dev/null || \
	  { $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends docker.io debootstrap; }
	mkdir -p $(TOOLS) && touch $(DOCKER_STAMP)

.PHONY: install test example lint
install: $(STAMP) $(TOOLS_STAMP) $(DOCKER_STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) $(TOOLS_STAMP) $(DOCKER_STAMP) lint
	PJRT_DEVICE=CPU $(BIN)/python -m pytest -q

example: $(STAMP)
	PJRT_DEVICE=CPU $(BIN)/shardproof run --config examples/.shardproof.yml
