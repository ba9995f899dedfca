# `make test` installs everything the tests need on a fresh Debian machine and runs them.
# `make simulate` runs the simulator on its built-in trace and prints the comparison.
# Debian's own python3 is "externally managed" (PEP 668) and pip refuses to install into it;
# with such an interpreter every target uses a virtual environment in .venv instead.
BASE_PYTHON ?= python3
# (A virtual environment is exempt, PEP 668 says, even when made from such an interpreter.)
MANAGED := $(shell $(BASE_PYTHON) -c 'import os, sys, sysconfig; print(sys.prefix == sys.base_prefix and os.path.isfile(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))' 2>/dev/null)
ifeq ($(MANAGED),True)
PYTHON ?= .venv/bin/python
VENV := .venv/bin/python
else
PYTHON ?= $(BASE_PYTHON)
VENV :=
endif
export OPENBLAS_NUM_THREADS ?= 1
# apt-get needs root: as another user it runs through sudo.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: test install install-system install-python install-runtime lint simulate

test: install lint
	$(PYTHON) -m pytest -q

install: install-system install-python

install-system:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; \
	fi

install-python: $(VENV)
	$(PYTHON) -m pip install -q --disable-pip-version-check -e '.[dev]'

install-runtime: $(VENV)
	$(PYTHON) -m pip install -q --disable-pip-version-check -e .

# Debian ships venv's pip bootstrap separately (python3-venv).
.venv/bin/python:
	@$(BASE_PYTHON) -m venv .venv 2>/dev/null || { rm -rf .venv; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv && \
	  $(BASE_PYTHON) -m venv .venv; }

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy autoscaler forecasting benchmarks
	$(PYTHON) -c "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"

simulate: install-runtime
	$(PYTHON) -m autoscaler.cli simulate
