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

test: $(STAMP) lint docs-check
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slurm and not slow"

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
