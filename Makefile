# `make demo` and `make test` bootstrap .venv on a fresh machine, then run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-fast lint smoke venv clean

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: any other torch spec pulls several GB of CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m stability_callbacks demo $(DEMO_ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider $(TEST_ARGS)

# The fast tier: every module exercised, the tests marked slow left out (under 2 minutes on 2
# cores); `make test` (and .ci/run) still runs everything.
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow" $(TEST_ARGS)

# Bug-finding rules only (pyproject.toml [tool.ruff.lint]); mypy on the core ([tool.mypy], ~5 s cold).
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The built wheel in a clean venv, from outside the checkout (scripts/smoke_wheel.sh).
smoke:
	PYTHON=$(PYTHON) bash scripts/smoke_wheel.sh

clean:
	rm -rf $(VENV) build dist *.egg-info
