# `make test` installs everything the tests need on a fresh Debian machine and runs them.
# `make simulate` runs the simulator on its built-in trace and prints the comparison.
PYTHON ?= python3
export OPENBLAS_NUM_THREADS ?= 1

.PHONY: test install install-system install-python install-runtime lint simulate

test: install lint
	$(PYTHON) -m pytest -q

install: install-system install-python

install-system:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; \
	fi

install-python:
	$(PYTHON) -m pip install -q --disable-pip-version-check -e '.[dev]'

install-runtime:
	$(PYTHON) -m pip install -q --disable-pip-version-check -e .

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy autoscaler forecasting benchmarks
	$(PYTHON) -c "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"

simulate: install-runtime
	$(PYTHON) -m autoscaler.cli simulate
