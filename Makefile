# Two entry points: `make demo` and `make test`. Both create the virtual
# environment from the locks in requirements/ when it is missing:
# requirements/$(ACCEL).lock (the runtime: cpu, cuda12, cuda13 or tpu) and
# requirements/dev.lock (tests, formatter, notebooks).
#   make venv ACCEL=cuda12    # a GPU node (NVIDIA driver >= 525)
PYTHON ?= python3.11
ACCEL ?= cpu
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP = $(VENV)/.installed-$(ACCEL)
WORKDIR ?= runs/demo
# Test processes (pytest-xdist): one per core, at most 4 (each holds a jax
# runtime with 8 fake devices, about 1.5 GB).
TEST_JOBS ?= $(shell $(PYTHON) -c "import os; print(min(4, os.cpu_count() or 1))")

.PHONY: help python-check venv-newest test-newest locks venv demo demo-mt demo-trime-mt demo-lamemo demo-pkm demo-pkm-bert demo-ext demo-marge test smoke bench accelerator-check format format-check fixtures clean-venv

LOCK := requirements/$(ACCEL).lock

# `make help`: the targets and their minutes on a 2-core CPU, from the `##`
# comments after each target (minutes as measured in docs/ and the README).
help:
	@awk -F':.*## ' '/^[a-z][a-z-]*:.*## / {printf "  %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# memjax runs on Python 3.11 to 3.13 (setup.py's python_requires), and the
# locks install on each; a TPU VM's image ships 3.10.
PYTHON_OK = import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))
PYTHON_MISSING = memjax: error: $(PYTHON) is missing or not Python 3.11 to 3.13, which memjax needs: install one (a TPU VM's Ubuntu 22.04: sudo add-apt-repository -y ppa:deadsnakes/ppa && sudo apt-get install -y python3.11 python3.11-venv; anywhere: uv python install 3.12) or name it: make venv PYTHON=/path/to/python3.12 (docs/hardware.md)
# An existing $(VENV) made by another Python than the one named on the command
# line is refused, not kept silently.
PYTHON_VERSION = import sys; print("%d.%d" % sys.version_info[:2])
VENV_OTHER_PYTHON = memjax: error: $(VENV) is Python $$have, not $(PYTHON)'s $$want: remove it first (make clean-venv VENV=$(VENV)) or make another beside it: make venv PYTHON=$(PYTHON) VENV=.venv-$$want

# Run on every use of the venv: cheap, and it must see a venv already made.
python-check: ## seconds: refuse a venv of another Python than the PYTHON named (every use of the venv runs it)
ifneq ($(filter command line environment,$(origin PYTHON)),)
	@if test -x $(PY); then have=$$($(PY) -c '$(PYTHON_VERSION)'); want=$$($(PYTHON) -c '$(PYTHON_VERSION)' 2>/dev/null); if test "$$have" != "$$want"; then echo "$(VENV_OTHER_PYTHON)" >&2; exit 2; fi; fi
endif

$(STAMP): $(LOCK) requirements/dev.lock setup.py | python-check
	@test -x $(PY) || $(PYTHON) -c '$(PYTHON_OK)' >/dev/null 2>&1 || { echo "$(PYTHON_MISSING)" >&2; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r $(LOCK) -r requirements/dev.lock
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

venv: $(STAMP) ## minutes not recorded (downloads): the virtual environment from requirements/$(ACCEL).lock

demo: $(STAMP) ## ~10 min: vanilla, vanilla + cache and TRIMELM (docs/trime.md)
	$(PY) -m memjax.demos.trime --workdir=$(WORKDIR)

# Transformer+RPE, Transformer-XL and LaMemo with the same steps, then the
# extrapolation and attention analyses; see docs/lamemo.md.
demo-lamemo: $(STAMP) ## ~15 min (17 CPU-min): Transformer+RPE, XL, LaMemo (docs/lamemo.md)
	$(PY) -m memjax.demos.lamemo --workdir=runs/lamemo_demo

# Memory-less, PKM, ResM and Memory+ LMs with the same steps; see docs/pkm.md.
demo-pkm: $(STAMP) ## ~80 min: memory-less, PKM, ResM and Memory+ LMs (docs/pkm.md)
	$(PY) -m memjax.demos.pkm --workdir=runs/pkm_demo

# BERT-style encoders with PKM / ResM, initialisation and sentiment
# fine-tuning (Kim & Jung); see docs/pkm_bert.md.
demo-pkm-bert: $(STAMP) ## ~13 min: BERT-style encoders with PKM/ResM, fine-tuning (docs/pkm_bert.md)
	$(PY) -m memjax.demos.pkm_bert --workdir=runs/pkm_bert_demo --extra_steps=100

# kNN-LM and TRIMELM_ext with a ScaNN-searched datastore (docs/external_memory.md).
demo-ext: $(STAMP) ## ~15 min (19 CPU-min): kNN-LM and TRIMELM_ext (docs/external_memory.md)
	$(PY) -m memjax.demos.external --workdir=runs/extmem_demo

# Vanilla LM and modified MARGE with the same steps; see docs/marge.md.
demo-marge: $(STAMP) ## ~21 min: vanilla LM and modified MARGE (docs/marge.md)
	$(PY) -m memjax.demos.marge --workdir=runs/marge_demo

smoke: $(STAMP) ## <1 min: a few steps of configs/trime_wt103.py:smoke
	$(PY) -m memjax.main --config=configs/trime_wt103.py:smoke --workdir=runs/smoke

test: $(STAMP) format-check ## <15 min: the test suite (docs/testing.md)
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder --durations=40 tests

# The newest releases within setup.py's ranges, resolved now (no lock), as a
# stock JAX image has them: jax, flax, optax and orbax-checkpoint, then what
# docs/hardware.md adds to such an image (requirements/stock-image.txt) and
# memjax with --no-deps; no TensorFlow, SeqIO or ScaNN. The tests marked
# `newest` run there (docs/testing.md) from the token caches that the locked
# environment writes into .cache/tokens (it makes them first).
NEWEST_PYTHON ?= python3.12
NEWEST_VENV ?= .venv-newest
NEWEST_PY := $(NEWEST_VENV)/bin/python
NEWEST_OK = import sys; sys.exit(not (3, 12) <= sys.version_info[:2] <= (3, 13))
RANGES = $(shell python3 requirements/ranges.py $(1))
IMAGE = jax flax optax orbax-checkpoint
venv-newest: ## a few min (downloads): .venv-newest, the newest releases as on a stock JAX image
	@$(NEWEST_PYTHON) -c '$(NEWEST_OK)' >/dev/null 2>&1 || { echo "memjax: error: $(NEWEST_PYTHON) is missing or not Python 3.12 or 3.13 (jax 0.11 and newer need 3.12): name one, e.g. make test-newest NEWEST_PYTHON=/path/to/python3.12" >&2; exit 2; }
	rm -rf $(NEWEST_VENV)
	$(NEWEST_PYTHON) -m venv $(NEWEST_VENV)
	$(NEWEST_PY) -m pip install -q --upgrade pip
	$(NEWEST_PY) -m pip install -q --upgrade $(foreach r,$(call RANGES,$(IMAGE)),'$(r)')
	$(NEWEST_PY) -m pip install -q --upgrade $(foreach r,$(call RANGES,$(shell grep -v '^\#' requirements/stock-image.txt) pytest pytest-xdist),'$(r)')
	$(NEWEST_PY) -m pip install -q --no-deps -e .
	$(NEWEST_PY) -m pip list --format=freeze > $(NEWEST_VENV)/versions.txt
	@grep -iE '^(jax|jaxlib|flax|optax|orbax-checkpoint|numpy)==' $(NEWEST_VENV)/versions.txt

test-newest: $(STAMP) venv-newest ## ~3 min (downloads): the tests marked newest on the newest releases
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile -m newest tests
	$(NEWEST_PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile -m newest tests

# Google style, 2-space indentation; configuration in pyproject.toml.
format: $(STAMP) ## <1 min: pyink the code
	$(VENV)/bin/pyink .

format-check: $(STAMP) ## <1 min: check the formatting
	$(VENV)/bin/pyink --check .

bench: $(STAMP) ## minutes not recorded: training throughput (benchmarks/)
	$(PY) benchmarks/train_throughput.py --config=configs/trime_wt103.py:demo

# A lent GPU or TPU with a stock JAX image, offline: the machine's own Python
# and the checkout's memjax (PYTHONPATH, nothing installed, no .venv).
# ACCEL_PATH: more of the path, e.g. an ml_collections wheel where the image
# lacks it; ACCEL_ARGS: flags (--budget_s=..., --items=..., --tiny).
# Writes runs/accelerator_check/accelerator_check.{json,md} (docs/plan.md).
ACCEL_PYTHON ?= python3
ACCEL_PATH ?=
ACCEL_ARGS ?=
accelerator-check: ## ~5 min: a lent GPU/TPU measured beside --mode=plan (docs/plan.md)
	PYTHONPATH=.$(if $(ACCEL_PATH),:$(ACCEL_PATH)) $(ACCEL_PYTHON) benchmarks/accelerator_check.py $(ACCEL_ARGS)

# The pretrained-model fixtures (tests/fixtures/pretrained/): tiny random
# GPT-2, Llama, Mistral, Qwen2, Qwen3 and Gemma 3 models built by Hugging
# Face's PyTorch classes, with their outputs, the oracle of memjax's import;
# CASES="qwen3 gemma3" rebuilds those folders only (the others are left as
# they are). Its own virtual environment, outside the locks (the suite needs
# neither package), with CPU torch, since the PyPI torch wheel brings
# several GB of CUDA wheels: from PyTorch's CPU index where it can be
# reached; else the newest '+cpu' build the configured indexes and
# find-links hold (`pip index versions torch`); else, with a warning, plain
# `torch` from the configured indexes (CUDA's wheels with it). It prints
# the torch it installed (a '+cpu' version is a CPU build).
FIXTURES_VENV ?= .venv-fixtures
FIXTURES_PIP = $(FIXTURES_VENV)/bin/python -m pip
CASES ?=
fixtures: ## minutes not recorded (downloads): rebuild tests/fixtures/pretrained/ (CASES=... only those) with transformers and CPU torch
	test -x $(FIXTURES_VENV)/bin/python || $(PYTHON) -m venv $(FIXTURES_VENV)
	$(FIXTURES_PIP) install -q --upgrade pip
	if $(FIXTURES_PIP) install -q --timeout 20 --retries 1 torch \
	    --index-url https://download.pytorch.org/whl/cpu; then :; \
	else \
	  v=$$($(FIXTURES_PIP) index versions torch 2>/dev/null \
	    | sed -n 's/^Available versions: //p' | tr ',' '\n' | tr -d ' ' \
	    | grep '+cpu$$' | head -1); \
	  if [ -n "$$v" ]; then \
	    echo "fixtures: PyTorch's index unreachable; torch $$v from the configured indexes"; \
	  else \
	    echo "fixtures: warning: no +cpu torch build found; plain torch from the configured indexes (with CUDA's wheels)"; \
	  fi; \
	  $(FIXTURES_PIP) install -q "torch$${v:+==$$v}"; \
	fi
	$(FIXTURES_PIP) show torch | sed -n 's/^Version: /fixtures: torch /p'
	$(FIXTURES_PIP) install -q transformers tokenizers safetensors numpy
	$(FIXTURES_VENV)/bin/python tests/fixtures/pretrained/make_hf_fixtures.py tests/fixtures/pretrained $(CASES)

clean-venv: ## seconds: remove the virtual environment
	rm -rf $(VENV)

# Regenerates requirements/*.lock from setup.py (keeps existing pins; add
# ARGS=--upgrade to move to the newest versions that resolve).
locks: $(STAMP) ## a few min: regenerate requirements/*.lock
	UV=$(VENV)/bin/uv requirements/compile.sh $(ARGS)

# Translation: a vanilla encoder-decoder on the shipped German-English pairs.
demo-mt: $(STAMP) ## ~69 min: vanilla encoder-decoder on German-English (docs/translation.md)
	$(PY) -m memjax.demos.mt --workdir=runs/demo_mt

# Table 6: vanilla, vanilla + kNN-MT and TRIMEMT_ext, same steps (docs/trime_mt.md).
demo-trime-mt: $(STAMP) ## ~11 min: vanilla, kNN-MT and TRIMEMT_ext (docs/trime_mt.md)
	$(PY) -m memjax.demos.trime_mt --workdir=runs/demo_trime_mt
