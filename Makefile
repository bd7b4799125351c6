# Two entry points for a fresh machine: `make up` (all-in-one with demo traffic on the
# embedded store) and `make test` (the whole suite). Both create/refresh .venv first;
# the stamp file keeps them from reinstalling while pyproject.toml is unchanged.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: up test test-fast bench fuzz browser clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

up: $(STAMP)
	$(BIN)/servelens up --demo

# A real headless browser for the dashboard tests (Debian's chromium + chromedriver).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { echo "installing chromium + chromium-driver for the browser tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }

# The suite in parallel: one worker per core, at most 4 (each holds its own embedded
# engine, ~1 GiB); TEST_JOBS=0 runs it in this process.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)

# Then the dashboard's API and pages again with access control on (tests/conftest.py
# TEST_AUTH): every request signed in as an admin, the access layer run whole.
AUTH_SUITES := tests/dashboard/test_api.py tests/dashboard/test_pages.py

test: $(STAMP) browser
	$(BIN)/pytest -q -n $(TEST_JOBS)
	SERVELENS_TEST_AUTH=1 $(BIN)/pytest -q -n $(TEST_JOBS) $(AUTH_SUITES)

test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not browser"

bench: $(STAMP)
	$(BIN)/python -m bench

# The fuzz suite (tests/fuzz) long: FUZZ_EXAMPLES examples per property, freshly drawn
# each run (`make test` runs a small fixed slice of it). A failure is kept in
# .servelens/fuzz-db and tried first next time.
FUZZ_EXAMPLES ?= 1000
fuzz: $(STAMP)
	SERVELENS_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest -q -m fuzz tests/fuzz --timeout=0

clean:
	rm -rf $(VENV) .servelens .pytest_cache

# Real OTLP output of the LLM instrumentation libraries teams install (interop/README.md):
# one venv per library under .interop/ (pinned by interop/requirements/<lib>.txt, needs
# PyPI), a fake OpenAI server and an OTLP capture receiver on loopback; writes
# tests/interop/captures/<lib>/. INTEROP_LIBS picks a subset (comma-separated).
INTEROP_LIBS ?= openai_v2,traceloop,openlit,openinference,langfuse,litellm,pydantic_ai,strands,openai_agents,vercel_ai,openinference_rag,traceloop_rag,anthropic_openinference,anthropic_traceloop,anthropic_openlit,langchain_traceloop,langchain_openinference
.PHONY: interop-capture
interop-capture:
	$(PYTHON) interop/capture_all.py --libs $(INTEROP_LIBS)

# Fleet scale (bench/fleet_data.py, bench/dashboard_scale.py, bench/rollup_cost.py):
# FLEET_REQUESTS requests over 30 days into FLEET_DIR (replaced), every dashboard page at
# every range in Chromium plus the API and the dashboard's peak RSS, then the rollup views'
# ingest cost and bytes (also on that store); figures into BENCHMARKS.md and
# .servelens/bench/*.json. 10 M on 2 cores: ~3.5 GiB of disk, ~20 min to generate, an hour
# or more of page loads.
FLEET_REQUESTS ?= 10000000
FLEET_DIR ?= .servelens/bench/fleet-$(FLEET_REQUESTS)
.PHONY: bench-fleet
bench-fleet: $(STAMP) browser
	$(BIN)/python -m bench.fleet_data --requests $(FLEET_REQUESTS) --dir $(FLEET_DIR) --force
	$(BIN)/python -m bench.dashboard_scale --reuse $(FLEET_DIR) --write
	$(BIN)/python -m bench.rollup_cost --fleet $(FLEET_DIR) --write
