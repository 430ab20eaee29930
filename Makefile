# private-telemetry developer commands. `make demo` and `make test` are the two commands of README.md.
#   make setup  -- .venv (python3 -m venv), pip install -e ".[test]" -c constraints.txt, Maven fetch of Kafka 3.9.1,
#                  Debian's chromium for the browser tests (apt-get as root on Debian/Ubuntu, else what to install)
#   make demo   -- setup, then the end-to-end demo (`ptel demo`)
#   make test   -- setup, then the whole test suite against a real Kafka broker (`pytest`)
#   make lint   -- ruff check + mypy
#   make bench  -- every benchmark under bench/, with the anchors of the `bench` extra (results in bench/results/)
#   make check-deploy -- opt-in: Prometheus' promtool (built with `go install` into .tools/, ~15 min the first
#                  time) runs `check rules` and `test rules` on deploy/prometheus/ (make test checks deploy/ without it)
#   make clean  -- stop this checkout's local brokers, delete .venv, .kafka and caches
# Every step is idempotent: the install re-runs only when pyproject.toml or constraints.txt change, and the
# Maven fetch is skipped when the jars are cached.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.ptel-installed

.PHONY: setup browser demo test lint bench check-deploy broker-start broker-stop clean

setup: $(INSTALLED) browser
	@$(BIN)/ptel broker fetch

# The dashboard's browser tests drive Debian's Chromium (Playwright with executable_path; never `playwright install`).
# As root on Debian/Ubuntu it is installed with apt-get; otherwise this says what to install (the tests then fail
# with the same message). Quiet when /usr/bin/chromium is already there.
browser:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for the dashboard's browser tests (apt-get)"; \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq >/dev/null && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; } || \
		{ echo "make setup: could not apt-get install chromium; the browser tests need /usr/bin/chromium"; exit 1; }; \
	else \
		echo "make setup: the dashboard's browser tests need Chromium at /usr/bin/chromium: run"; \
		echo "    sudo apt-get update && sudo apt-get install -y chromium     (Debian/Ubuntu)"; \
	fi

$(INSTALLED): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required (found " + sys.version.split()[0] + "); set PYTHON=python3.11")'
	@test -x $(BIN)/python || { echo "creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@echo "installing private-telemetry and its test extra into $(VENV) (pinned by constraints.txt)"
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test]" -c constraints.txt
	@touch $@

demo: setup
	$(BIN)/ptel demo

test: setup
	$(BIN)/pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy .

bench: setup
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test,bench]" -c constraints.txt
	$(BIN)/python -m bench.kafka_roundtrip
	$(BIN)/python -m bench.ldp_throughput
	$(BIN)/python -m bench.rappor_throughput
	$(BIN)/python -m bench.threshold_throughput
	$(BIN)/python -m bench.producer_throughput
	$(BIN)/python -m bench.agent_throughput
	$(BIN)/python -m bench.transaction_latency
	$(BIN)/python -m bench.gateway_throughput
	$(BIN)/python -m bench.dashboard_latency

TOOLS := $(CURDIR)/.tools
PROMTOOL_VERSION := v0.316.0

check-deploy: setup
	@command -v go >/dev/null 2>&1 || { echo "make check-deploy needs the Go toolchain (apt-get install golang-go)"; exit 1; }
	@test -x $(TOOLS)/promtool || { echo "building promtool $(PROMTOOL_VERSION) into $(TOOLS) (go install)"; \
		GOBIN=$(TOOLS) go install github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION); }
	$(TOOLS)/promtool check rules deploy/prometheus/ptel-rules.yml
	$(TOOLS)/promtool test rules deploy/prometheus/ptel-rules.test.yml

broker-start: setup
	$(BIN)/ptel broker start

broker-stop:
	@if [ -x $(BIN)/ptel ]; then $(BIN)/ptel broker stop; fi

clean:
	@if [ -x $(BIN)/ptel ]; then $(BIN)/ptel broker stop --all; fi
	rm -rf $(VENV) .kafka .tools .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info build dist
