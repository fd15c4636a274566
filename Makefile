# Two commands do everything on a fresh clone:
#   make book   executes every notebook (profile standard) and builds the HTML book in _build/html
#   make test   the whole suite: unit tests, notebooks (profile quick), strict book build, browser check
# Both create .venv and install the project into it on first use.

PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.nwlib-installed
STAGE   := _build/stage
HTML    := _build/html
PROFILE ?= standard
JB_FLAGS ?=

.PHONY: book test unit notebooks html browser-check bench clean help

help:
	@echo "make book    - execute notebooks (PROFILE=$(PROFILE)) and build the book into $(HTML)"
	@echo "make test    - unit tests, notebooks (quick), strict book build, browser check"
	@echo "make bench   - run the benchmarks and update benchmarks/results/latest.json"

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# An installed torch (CPU or CUDA build, chosen by the user) is kept; otherwise PyPI's.
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch
	$(PY) -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

book: $(STAMP)
	$(MAKE) --no-print-directory notebooks PROFILE=$(PROFILE)
	$(MAKE) --no-print-directory html
	@echo "Book built: open $(abspath $(HTML))/index.html"

notebooks: $(STAMP)
	rm -rf $(STAGE)
	$(PY) tools/run_notebooks.py --profile $(PROFILE) --stage $(STAGE)

html: $(STAMP)
	rm -rf $(HTML)
	$(VENV)/bin/jupyter-book build $(STAGE) --path-output _build $(JB_FLAGS)
	@# jupyter-book writes to <path-output>/_build/html; keep the documented location.
	rm -rf $(HTML) && mv _build/_build/html $(HTML) && rm -rf _build/_build

unit: $(STAMP)
	@$(PY) -m pytest -m "not browser" ; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

browser-check: $(STAMP)
	@NWLIB_REQUIRE_BOOK=1 $(PY) -m pytest -m browser ; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no browser tests: failing" >&2; exit 1; fi; exit $$rc

test: $(STAMP)
	$(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory notebooks PROFILE=quick
	$(MAKE) --no-print-directory html JB_FLAGS="-n -W --keep-going"
	$(MAKE) --no-print-directory browser-check
	@git diff --quiet && test -z "$$(git status --porcelain)" || { echo "make test left the tree dirty:" >&2; git status --porcelain >&2; exit 1; }

bench: $(STAMP)
	$(PY) -m benchmarks.run

clean:
	rm -rf _build
