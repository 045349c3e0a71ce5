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

.PHONY: locks venv demo demo-mt demo-trime-mt demo-lamemo demo-pkm demo-pkm-bert demo-ext demo-marge test smoke bench format format-check clean-venv

LOCK := requirements/$(ACCEL).lock

$(STAMP): $(LOCK) requirements/dev.lock setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r $(LOCK) -r requirements/dev.lock
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m memjax.demos.trime --workdir=$(WORKDIR)

# Transformer+RPE, Transformer-XL and LaMemo with the same steps, then the
# extrapolation and attention analyses; see docs/lamemo.md.
demo-lamemo: $(STAMP)
	$(PY) -m memjax.demos.lamemo --workdir=runs/lamemo_demo

# Memory-less, PKM and ResM LMs with the same steps; see docs/pkm.md.
demo-pkm: $(STAMP)
	$(PY) -m memjax.demos.pkm --workdir=runs/pkm_demo

# BERT-style encoders with PKM / ResM, initialisation and sentiment
# fine-tuning (Kim & Jung); see docs/pkm_bert.md.
demo-pkm-bert: $(STAMP)
	$(PY) -m memjax.demos.pkm_bert --workdir=runs/pkm_bert_demo --extra_steps=100

# kNN-LM and TRIMELM_ext with a ScaNN-searched datastore (docs/external_memory.md).
demo-ext: $(STAMP)
	$(PY) -m memjax.demos.external --workdir=runs/extmem_demo

# Vanilla LM and modified MARGE with the same steps; see docs/marge.md.
demo-marge: $(STAMP)
	$(PY) -m memjax.demos.marge --workdir=runs/marge_demo

smoke: $(STAMP)
	$(PY) -m memjax.main --config=configs/trime_wt103.py:smoke --workdir=runs/smoke

test: $(STAMP) format-check
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder --durations=40 tests

# Google style, 2-space indentation; configuration in pyproject.toml.
format: $(STAMP)
	$(VENV)/bin/pyink .

format-check: $(STAMP)
	$(VENV)/bin/pyink --check .

bench: $(STAMP)
	$(PY) benchmarks/train_throughput.py --config=configs/trime_wt103.py:demo

clean-venv:
	rm -rf $(VENV)

# Regenerates requirements/*.lock from setup.py (keeps existing pins; add
# ARGS=--upgrade to move to the newest versions that resolve).
locks: $(STAMP)
	UV=$(VENV)/bin/uv requirements/compile.sh $(ARGS)

# Translation: a vanilla encoder-decoder on the shipped German-English pairs.
demo-mt: $(STAMP)
	$(PY) -m memjax.demos.mt --workdir=runs/demo_mt

# Table 6: vanilla, vanilla + kNN-MT and TRIMEMT_ext, same steps (docs/trime_mt.md).
demo-trime-mt: $(STAMP)
	$(PY) -m memjax.demos.trime_mt --workdir=runs/demo_trime_mt
