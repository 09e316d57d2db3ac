# The two commands: `make demo` (the main job, offline) and `make test` (the test suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo test test-fast benchmarks clean docs

install: $(STAMP)

$(STAMP): setup.py
	@command -v java >/dev/null 2>&1 || { echo "Installing Java (for the coco-caption PTB tokenizer and METEOR)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless) \
	  && command -v java >/dev/null 2>&1 \
	  || { echo "ERROR: Java is required and could not be installed: the Evaluator's PTB tokenizer and METEOR (blessing metrics) run on it. Install a Java runtime (Debian/Ubuntu: sudo apt-get install default-jre-headless) and run make install again." >&2; exit 1; }; }
	@command -v cjpeg >/dev/null 2>&1 || { echo "Installing cjpeg (libjpeg-turbo's encoder, for the decode-work tests)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libjpeg-turbo-progs) \
	  || echo "WARNING: could not install cjpeg: its decode-work tests will be skipped"; }
	@{ command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } || { echo "Installing chromium and chromium-driver (for the browser tests of captioner serve --ui)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) \
	  || echo "WARNING: could not install chromium: the browser tests will be skipped (they fail under CI=true)"; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip wheel setuptools
	$(BIN)/pip install -q -e '.[test]'
	@touch $(STAMP)

demo: install
	$(BIN)/captioner demo --output demo_output

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow and not e2e" $(PYTEST_ARGS)

benchmarks: install
	$(BIN)/python benchmarks/preprocess.py
	$(BIN)/python benchmarks/train_step.py
	$(BIN)/python benchmarks/decode.py
	$(BIN)/python benchmarks/train_throughput.py
	$(BIN)/python benchmarks/serving.py

docs: install
	$(BIN)/python -m pipeline.docgen

clean:
	rm -rf demo_output pipeline_root
