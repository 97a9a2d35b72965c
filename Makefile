# The two quickstart commands: `make demo` (whole pipeline on a synthetic corpus) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ecgpos-installed

.PHONY: demo test test-fast test-slurm lint docs docs-check install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[train,dev,export,docs]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ecgpos demo

# The suite runs on TEST_WORKERS pytest-xdist workers (2: the CI machine's cores). Most of its time is spent
# in subprocesses, imports and one-thread torch steps, which two workers overlap: serially it takes over
# 45 minutes on the 2-core CI machine. `--dist loadfile` keeps each module on one worker (its module-scoped
# runs and shards are built once); tests/conftest.py makes the Slurm modules one unit (one cluster at a time),
# hands out the longest units first (hence --no-loadscope-reorder) and builds the session's shards and runs
# once for all workers. `make test TEST_WORKERS=0` runs it serially.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: $(STAMP) lint docs-check
	$(PY) -m pytest -q $(XDIST)

test-fast: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m "not slurm and not slow"

test-slurm: $(STAMP)
	$(PY) -m pytest -q -m slurm

clean:
	rm -rf $(VENV) build site *.egg-info

# The codebase's own hygiene, part of `make test`: ruff (rules in pyproject.toml) and the import
# contracts (layers, no cycles) checked by import-linter.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# The documentation site (mkdocs.yml, docs/). docs-check, part of `make test`, builds it with --strict
# into a temporary folder: a broken link, a missing anchor or page, or an API docstring that does not
# resolve fails it. `make docs` serves it at http://127.0.0.1:8000 while you edit.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

docs-check: $(STAMP)
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir "$$tmp"
