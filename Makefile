# Two commands do all the set-up on a fresh clone: `make demo` and `make test`.
# Both create and reuse .venv; torch==2.13.0 (CPU build) is installed first when torch is missing,
# so the package's `torch>=2.4` range never pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.postrl-installed

.PHONY: venv test bench demo control-demo lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test,tensorboard,parquet,lora,datasets,judge]"
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m pytest -q -m slow
	$(PY) benchmarks/control.py --quick

demo: $(STAMP)
	$(VENV)/bin/postrl demo --out runs/demo

lint: $(STAMP)
	$(VENV)/bin/ruff check postrl tests benchmarks
	$(VENV)/bin/ruff format --check postrl tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
