# private-telemetry developer commands. `make demo` and `make test` are the two commands of README.md.
#   make setup  -- .venv (python3 -m venv), pip install -e ".[test]" -c constraints.txt, Maven fetch of Kafka 3.9.1,
#                  Debian's chromium for the browser tests and Debian's haproxy for the production-shape rig
#                  (apt-get as root on Debian/Ubuntu, else what to install)
#   make demo   -- setup, then the end-to-end demo (`ptel demo`)
#   make test   -- setup, then the whole test suite against a real Kafka broker (`pytest`; it runs the TypeScript
#                  client's `npm test` too, tests/unit/test_typescript_client.py)
#   make test-e2e-long -- the randomized end-to-end suite over 20 seeds (`make test` runs 2), and under each fault
#                  (worker and gateway kill -9, broker stop and pause across a window boundary) over 3 seeds (~25 min)
#   make test-production-long -- the production-shape rig (3 brokers, HAProxy before 2 gateway replicas, 3 workers;
#                  tests/production) under every fault alone and the compound fault, over 3 seeds (`make test`
#                  runs 1 seed with the compound fault; ~2.5 min a run, ~60 min)
#   make test-acl-matrix -- the least-privilege test with every ACL removed in turn (opt-in, ~3 min)
#   make lint   -- ruff check + mypy + the TypeScript client's strict type check (tsc)
#   make audit  -- the end-to-end privacy audit with 10x its trials (more power; ~15 min): PTEL_AUDIT_SCALE=10
#   make bench  -- every benchmark under bench/, with the anchors of the `bench` extra (results in bench/results/)
#   make check-deploy -- Prometheus' promtool runs `check rules` and `test rules` on deploy/prometheus/ (make setup
#                  puts Debian's promtool into .tools/, and make test runs the same through tests/unit/test_deploy.py;
#                  elsewhere it is built with `go install`, ~15 min the first time)
#   make clean  -- stop this checkout's local brokers, delete .venv, .kafka and caches
# Every step is idempotent: the install re-runs only when pyproject.toml or constraints.txt change, and the
# Maven fetch is skipped when the jars are cached.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.ptel-installed
TS_CLIENT := clients/typescript
# The TypeScript client's dev dependencies (typescript, esbuild, fast-check), exactly as its committed lockfile says;
# re-run only when package.json or package-lock.json change.
TS_INSTALLED := $(TS_CLIENT)/node_modules/.ptel-npm-ci

.PHONY: setup browser load-balancer promtool demo test test-production-long test-e2e-long test-acl-matrix lint audit bench check-deploy broker-start broker-stop clean

setup: $(INSTALLED) browser load-balancer promtool $(TS_INSTALLED)
	@echo "[setup 3/3] Apache Kafka $$($(BIN)/python -c 'from ptel.kafka_broker import KAFKA_VERSION as v; print(v)') jars from Maven Central into .kafka (skipped when cached; ~46 MB the first time)"
	@$(BIN)/ptel broker fetch
	@echo "[setup] done: run 'make demo' or 'make test'"

# The dashboard's browser tests drive Debian's Chromium (Playwright with executable_path; never `playwright install`).
# As root on Debian/Ubuntu it is installed with apt-get; otherwise this says what to install (the tests then fail
# with the same message). One line when /usr/bin/chromium is already there.
browser:
	@echo "[setup 2/3] Chromium for the dashboard's browser tests"
	@if [ -x /usr/bin/chromium ]; then echo "      /usr/bin/chromium is there"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for the dashboard's browser tests (apt-get)"; \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq >/dev/null && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; } || \
		{ echo "make setup: could not apt-get install chromium; the browser tests need /usr/bin/chromium"; exit 1; }; \
	else \
		echo "make setup: the dashboard's browser tests need Chromium at /usr/bin/chromium: run"; \
		echo "    sudo apt-get update && sudo apt-get install -y chromium     (Debian/Ubuntu)"; \
	fi

# The production-shape rig (testbed/production.py) puts Debian's HAProxy before the gateway replicas; installed like
# Chromium: apt-get as root on Debian/Ubuntu, else the command to run. One line when /usr/sbin/haproxy is there.
load-balancer:
	@echo "[setup 2/3] HAProxy for the production-shape rig"
	@if command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ]; then echo "      haproxy is there"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's haproxy for the production-shape rig (apt-get)"; \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null 2>&1 || { apt-get update -qq >/dev/null && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null; }; } || \
		{ echo "make setup: could not apt-get install haproxy; the production-shape tests need it"; exit 1; }; \
	else \
		echo "make setup: the production-shape tests need HAProxy (/usr/sbin/haproxy): run"; \
		echo "    sudo apt-get update && sudo apt-get install -y haproxy     (Debian/Ubuntu)"; \
	fi

$(INSTALLED): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required (found " + sys.version.split()[0] + "); set PYTHON=python3.11")'
	@test -x $(BIN)/python || { echo "[setup 1/3] creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@echo "[setup 1/3] installing private-telemetry and its test extra into $(VENV) (pinned by constraints.txt; a few minutes the first time)"
	@# one short line a package as pip resolves it; pip's exit status is kept (sh has no pipefail)
	@{ $(BIN)/python -m pip install --progress-bar off --disable-pip-version-check -e ".[test]" -c constraints.txt 2>&1; \
		echo "pip-exit=$$?"; } | sed -n -e 's/^Collecting \([^ ]*\).*/      collecting \1/p' -e 's/^Installing collected packages.*/      installing the collected packages.../p' \
		-e 's/^Successfully installed.*/      installed/p' -e 's/^ERROR:/      ERROR:/p' -e '/^pip-exit=/p' | \
		{ rc=1; while IFS= read -r line; do case "$$line" in pip-exit=*) rc=$${line#pip-exit=};; *) echo "$$line";; esac; done; exit $$rc; }
	@touch $@

$(TS_INSTALLED): $(TS_CLIENT)/package.json $(TS_CLIENT)/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "make setup: the TypeScript client needs Node.js >= 20 and npm (apt-get install nodejs npm)"; exit 1; }
	@echo "[setup] the TypeScript client's dev dependencies from its lockfile (npm ci in $(TS_CLIENT))"
	@cd $(TS_CLIENT) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

demo: setup
	$(BIN)/ptel demo $(ARGS)

test: setup
	$(BIN)/pytest

audit: setup
	PTEL_AUDIT_SCALE=10 $(BIN)/pytest -s tests/unit/test_privacy_audit.py tests/unit/test_shuffle_audit.py

test-e2e-long: setup
	PTEL_E2E_SEEDS=$$(seq -s, 1 20) PTEL_E2E_FAULT_SEEDS=1,2,3 \
	PTEL_E2E_FAULTS=worker_kill9,gateway_kill9,broker_stop,broker_pause,worker_kill9+gateway_kill9 \
	$(BIN)/pytest tests/integration/test_randomized_e2e.py

# Every ACL of the device, worker and analyst removed one at a time (tests/integration/test_least_privilege.py; about
# 3 minutes: `make test` runs the five representative cases).
test-production-long: setup
	PTEL_PROD_SEEDS=1,2,3 \
	PTEL_PROD_FAULTS=gateway_kill9,leader_kill9,txn_coordinator_kill9,group_coordinator_kill9,controller_kill9,leader_freeze,worker_kill9_in_rebalance,gateway_kill9+leader_kill9 \
	$(BIN)/pytest -s tests/production

test-acl-matrix: setup
	PTEL_ACL_MATRIX=1 $(BIN)/pytest tests/integration/test_least_privilege.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy .
	cd $(TS_CLIENT) && npm run --silent typecheck

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

# Debian's promtool (package prometheus, ~19 MB): downloaded and unpacked into .tools/ -- not installed, so no
# Prometheus service is set up -- for `promtool test rules` in make test (tests/unit/test_deploy.py).
promtool:
	@if [ -x $(TOOLS)/promtool ]; then echo "      $(TOOLS)/promtool is there"; \
	elif command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then \
		echo "[setup] Debian's promtool into $(TOOLS) (apt-get download prometheus; unpacked, not installed)"; \
		rm -rf $(TOOLS)/deb && mkdir -p $(TOOLS)/deb && cd $(TOOLS)/deb && \
		{ apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq >/dev/null && apt-get download prometheus >/dev/null; }; } && \
		dpkg-deb -x prometheus_*.deb x && mv x/usr/bin/promtool $(TOOLS)/promtool && cd $(TOOLS) && rm -rf deb || \
		{ echo "make setup: could not fetch Debian's promtool; tests/unit/test_deploy.py needs $(TOOLS)/promtool"; exit 1; }; \
	else echo "make setup: put promtool at $(TOOLS)/promtool (make check-deploy builds it with go install)"; fi

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
	rm -rf $(VENV) .kafka .tools .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info build dist \
		$(TS_CLIENT)/node_modules $(TS_CLIENT)/dist
