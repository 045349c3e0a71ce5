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

.PHONY: help locks venv demo demo-mt demo-trime-mt demo-lamemo demo-pkm demo-pkm-bert demo-ext demo-marge test smoke bench accelerator-check format format-check fixtures clean-venv

LOCK := requirements/$(ACCEL).lock

# `make help`: the targets and their minutes on a 2-core CPU, from the `##`
# comments after each target (minutes as measured in docs/ and the README).
help:
	@awk -F':.*## ' '/^[a-z][a-z-]*:.*## / {printf "  %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# memjax, jax 0.10.2 and libtpu need Python 3.11; a TPU VM's image ships 3.10.
PYTHON_MISSING = memjax: error: $(PYTHON) is missing or not Python 3.11, which memjax needs: install it (a TPU VM's Ubuntu 22.04: sudo add-apt-repository -y ppa:deadsnakes/ppa && sudo apt-get install -y python3.11 python3.11-venv; anywhere: uv python install 3.11) or name it: make venv PYTHON=/path/to/python3.11 (docs/hardware.md)

$(STAMP): $(LOCK) requirements/dev.lock setup.py
	@test -x $(PY) || $(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1 || { echo "$(PYTHON_MISSING)" >&2; exit 2; }
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
# GPT-2, Llama and Qwen2 models built by Hugging Face's PyTorch classes, with
# their outputs, the oracle of memjax's import. Its own virtual environment,
# outside the locks (the suite needs neither package): CPU torch from
# PyTorch's index, since the PyPI torch wheel brings several GB of CUDA wheels.
FIXTURES_VENV ?= .venv-fixtures
fixtures: ## minutes not recorded (downloads): rebuild tests/fixtures/pretrained/ with transformers and CPU torch
	test -x $(FIXTURES_VENV)/bin/python || $(PYTHON) -m venv $(FIXTURES_VENV)
	$(FIXTURES_VENV)/bin/python -m pip install -q --upgrade pip
	$(FIXTURES_VENV)/bin/python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
	$(FIXTURES_VENV)/bin/python -m pip install -q transformers tokenizers safetensors numpy
	$(FIXTURES_VENV)/bin/python tests/fixtures/pretrained/make_hf_fixtures.py

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
