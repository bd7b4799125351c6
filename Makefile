# Two entry points for a fresh machine: `make up` (all-in-one with demo traffic on the
# embedded store) and `make test` (the whole suite). Both create/refresh .venv first;
# the stamp file keeps them from reinstalling while pyproject.toml is unchanged.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: up test test-fast bench browser clean

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

test: $(STAMP) browser
	$(BIN)/pytest -q

test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not browser"

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .servelens .pytest_cache
