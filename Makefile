# One entry point for a fresh machine: every target builds .venv first if it is missing.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
FAIRSEQ := fairseq-fixed==0.12.3.1

.PHONY: setup demo test bench gpu-kit clean

setup: $(STAMP)

# torch, numpy and cython go in first so fairseq-fixed builds (no build isolation) against them
# instead of fetching a second torch; fairseq-fixed's own deps are pinned in requirements.txt.
$(STAMP): requirements.txt setup.py research/pyproject.toml $(wildcard csrc/cpu/*)
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q pip==26.3 setuptools==84.2.1 wheel==0.48.0
	$(VPY) -m pip install -q -r requirements.txt
	$(VPY) -m pip install -q --no-deps --no-build-isolation $(FAIRSEQ)
	# compat: a plain path entry, so that Hydra's plugin scan finds hydra_plugins/ (fairseq's CLIs then
	# load the plugin without --user-dir); setuptools' default editable finder hides it from that scan
	$(VPY) -m pip install -q --no-deps --no-build-isolation --config-settings editable_mode=compat -e .
	# the research harness (research/fw_research: experiments, demo, benchmarks, tools) beside the plugin
	$(VPY) -m pip install -q --no-deps --no-build-isolation --config-settings editable_mode=compat -e research
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python -m fw_research.demo.demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile --durations=25 tests

bench: $(STAMP)
	$(VENV)/bin/python -m fw_research.benchmarks.bench_ops_cpu

# The offline GPU node's kit (gpu_kit/): wheels for cp312, sdists, and the node's builds made here where this
# machine has CPython 3.12 and nvcc (fw_research.gpu_node.gpu_prebuilt; its build venv in .gpu_build/); needs network.
gpu-kit:
	PYTHONPATH=research$${PYTHONPATH:+:$$PYTHONPATH} $(PY) -m fw_research.gpu_node.gpu_kit --out gpu_kit

clean:
	rm -rf $(VENV) build *.egg-info research/build research/*.egg-info .gpu_build
