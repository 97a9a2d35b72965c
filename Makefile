# The two quickstart commands: `make demo` (whole pipeline on a synthetic corpus) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ecgpos-installed

.PHONY: demo test test-fast test-slurm lint install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[train,dev,export]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ecgpos demo

test: $(STAMP) lint
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slurm and not slow"

test-slurm: $(STAMP)
	$(PY) -m pytest -q -m slurm

clean:
	rm -rf $(VENV) build *.egg-info

# The codebase's own hygiene, part of `make test`: ruff (rules in pyproject.toml) and the import
# contracts (layers, no cycles) checked by import-linter.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
