# Two entry points: `make demo` and `make test`. Both create the virtual
# environment from requirements.lock when it is missing.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
WORKDIR ?= runs/demo

.PHONY: demo demo-ext test smoke bench format format-check clean-venv

$(STAMP): requirements.lock setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m memjax.demo --workdir=$(WORKDIR)

# kNN-LM and TRIMELM_ext with a ScaNN-searched datastore (docs/external_memory.md).
demo-ext: $(STAMP)
	$(PY) -m memjax.extmem_demo --workdir=runs/extmem_demo

smoke: $(STAMP)
	$(PY) -m memjax.main --config=configs/trime_wt103.py:smoke --workdir=runs/smoke

test: $(STAMP) format-check
	$(PY) -m pytest -q --durations=40 tests

# Google style, 2-space indentation; configuration in pyproject.toml.
format: $(STAMP)
	$(VENV)/bin/pyink .

format-check: $(STAMP)
	$(VENV)/bin/pyink --check .

bench: $(STAMP)
	$(PY) benchmarks/train_throughput.py --config=configs/trime_wt103.py:demo

clean-venv:
	rm -rf $(VENV)
