# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Every script in benchmarks/ runs end to end with `--smoke` (its smallest settings: fewest steps, smallest model or
preset, one seed) and prints its table with the expected columns and sensible values.

The scripts are found by globbing benchmarks/*.py (modules starting with `_` are shared helpers, not scripts), so a
new script fails here until it has a smoke mode and an entry in `CHECKS`. Each runs as a subprocess from `tmp_path`,
writing its outputs there. The compare_upstream_* scripts run against TRL 1.16.0 from `tests/upstream_venv.py`;
reproduce_real_model.py uses the session's converted SmolLM2-135M-Instruct (`smollm2_path`).

    TRL_SLOW_TESTS_ON_CPU=1 python -m pytest -m slow tests/slow/test_benchmarks_smoke.py   (~5 min on 2 busy cores)
"""

import glob
import json
import os
import re
import subprocess
import sys
import time

import pytest
from upstream_venv import UPSTREAM_TRL_VERSION, upstream_trl_python_or_skip


pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(
    os.path.basename(path)
    for path in glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))
    if not os.path.basename(path).startswith("_")
)
TIMEOUT = 600  # seconds per script; the slowest (reproduce_real_model.py) takes ~1 min on 2 busy cores
# gloo's teardown has been seen to abort a process of a 2-process launch after its work was done and written (about 1
# run in 70, tests/test_distributed.py); a script that fails with it is run once more
GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def tables(stdout: str) -> list[tuple[list[str], list[list[str]]]]:
    """The markdown tables of `stdout`, each as (header cells, data rows' cells), the separator row dropped."""
    found, block = [], []
    for line in stdout.splitlines() + [""]:
        if line.startswith("|"):
            block.append([cell.strip() for cell in line.strip().strip("|").split("|")])
            continue
        if block:
            assert len(block) >= 2 and all(set(c) <= set("-: ") for c in block[1]), f"not a table: {block}"
            found.append((block[0], block[2:]))
            block = []
    return found


def table_with(stdout: str, first_column: str) -> tuple[list[str], list[list[str]]]:
    """The one table whose first header cell is `first_column`."""
    matches = [t for t in tables(stdout) if t[0] and t[0][0] == first_column]
    assert len(matches) == 1, f"expected one table starting with {first_column!r}, got:\n{stdout}"
    return matches[0]


def number(cell: str) -> float:
    """The first number of a cell ("0.123 ± 0.004" -> 0.123, "1.78%" -> 1.78, "nan" -> nan)."""
    match = re.search(r"[-+]?(\d+\.?\d*(e[-+]?\d+)?|nan)", cell)
    assert match, f"no number in {cell!r}"
    return float(match.group(0))


# ---------------------------------------------------------------------------------------- per-script checks
# Each: (extra command-line arguments given tmp_path and the fixtures' values, check(stdout, tmp_path)).


def _check_generation(out, tmp):
    header, rows = table_with(out, "prompt tokens")
    assert header == ["prompt tokens", "shared_prefix", "generate", "shared_prefix / generate"]
    assert [row[0] for row in rows] == ["5", "16"]
    for row in rows:
        shared, plain, ratio = (number(c) for c in row[1:])
        # the times are printed to 0.1 ms and the ratio from the unrounded ones (to 0.01): the ratio of the printed
        # times may be off by what those two roundings allow
        slack = 0.05 * (shared + plain) / plain**2 + 0.005
        assert shared > 0 and plain > 0 and ratio == pytest.approx(shared / plain, abs=slack)


def _check_packed_scoring(out, tmp):
    header, rows = table_with(out, "L")
    assert header[:6] == ["L", "scored tokens", "positions padded", "cache", "inline", "auto picks"]
    assert len(header) == 13 and [row[0] for row in rows] == ["8"]
    row = rows[0]
    prompt_pass, padded = (int(x) for x in re.match(r"(\d+) \+ (\d+)", row[2]).groups())
    cached = int(re.match(r"\d+ \+ (\d+)", row[3]).group(1))
    inline = int(row[4].split()[0])
    # 16 rows of 8 tokens + 1 padded; packed into fewer; inline rows also hold the prompts
    assert padded == 16 * 9 and int(row[1]) <= cached < padded and inline > int(row[1])
    assert prompt_pass > 0
    assert all(number(cell) > 0 for cell in row[6:12]) and number(row[12]) < 1e-4


def _check_lm_head(out, tmp):
    header, rows = table_with(out, "path")
    assert header == ["path", "ms (median)", "peak MiB", "max abs Δ logp", "rel Δ grad W"]
    assert [row[0] for row in rows] == ["plain", "chunked_logprobs"]
    assert all(number(row[1]) > 0 and row[2] == "n/a" for row in rows)  # the smoke run is on the CPU
    assert number(rows[1][3]) < 1e-4 and number(rows[1][4]) < 1e-4  # float32: the same values up to rounding


def _check_grpo_step(out, tmp):
    header, rows = table_with(out, "sync")
    assert header == ["sync", "s/step (median)", "std", "peak GPU MiB"]
    assert [row[0] for row in rows] == ["none", "every step"]
    assert all(number(row[1]) > 0 and number(row[2]) >= 0 for row in rows)
    header, rows = table_with(out, "method")
    assert header == ["method", "ms", "× floor"]
    assert [row[0] for row in rows] == [
        "bandwidth floor (3 × bytes / copy BW)",
        "trl sync (mix_tensors_, fp32 maths)",
        "naive per-parameter mul_/add_",
    ]
    assert number(rows[0][2]) == 1.0 and all(number(row[1]) > 0 for row in rows)


def _check_sync_zero3(out, tmp):
    header, rows = table_with(out, "sync")
    assert header == [
        "sync",
        "time of one sync (ms)",
        "extra peak RSS per rank (MiB)",
        "% of model bytes",
        "torch bytes allocated per rank (MiB)",
        "% of model bytes",
    ]
    assert [row[0] for row in rows] == ["shard-local (trl)", "gather-everything (baseline)"]
    assert all(number(row[1]) > 0 for row in rows)
    local, gathered = (number(row[4]) for row in rows)
    assert local < gathered  # the baseline materialises every full tensor; the shard-local sync allocates ~nothing
    assert "Qwen2 1 layers × hidden 64, vocab 1000" in out


def _check_zero3_generation(out, tmp):
    header, rows = table_with(out, "implementation")
    assert header == [
        "implementation",
        "generate s/step",
        "collectives inside generate per step",
        "step s",
        "generate share of step",
    ]
    assert [row[0] for row in rows] == ["ours (trl 1.16.0+iterative.0.1)", f"upstream (trl {UPSTREAM_TRL_VERSION})"]
    assert all(number(row[1]) > 0 and number(row[3]) > 0 for row in rows)
    # ours: weights gathered once, hooks out of the way; only transformers' per-token all-reduce is left in generate
    assert rows[0][2] == "all_reduce 9"  # 8 tokens
    assert "Qwen2 2 layers × hidden 64" in out


def _check_upstream_loss(out, tmp):
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("case "))
    assert lines[start].split() == [
        "case",
        "loss",
        "(ours)",
        "|Δ",
        "loss|",
        "|Δ",
        "grad|",
        "|Δ",
        "metric|",
        "upstream-only",
        "metrics",
    ]
    rows = lines[start + 1 : start + 7]
    assert [row[:30].strip() for row in rows] == [
        "grpo",
        "dapo+kl",
        "cispo+sequence+kl",
        "dapo+top entropy+kl",
        "grpo+adaptive entropy",
        "dapo+bonus+aux, accum 4",
    ]
    worst = re.search(r"largest differences: loss (\S+), gradient (\S+), metric (\S+)", out)
    assert worst, out
    loss, grad, metric = (float(x) for x in worst.groups())
    assert loss < 1e-8 and grad < 1e-8 and metric < 1e-5  # float64 tensors; the metrics are logged in float32


def _check_upstream_trl(out, tmp):
    header, rows = table_with(out, "case")
    assert header[:8] == [
        "case",
        "implementation",
        "s/step median (wall)",
        "per-run medians",
        "CPU s/step median",
        "ratio ours/upstream (wall, CPU)",
        "peak RSS MB",
        "completion tokens",
    ]
    step_parts = ("generate", "reward", "ref_old_logps", "prepare_rest", "fwd_bwd", "optimizer", "sync", "other")
    assert header[8:] == [f"{p} ms" for p in step_parts]
    assert [(row[0], row[1].split()[0]) for row in rows] == [("sync=every", "ours"), ("sync=every", "upstream")]
    assert rows[1][1] == f"upstream {UPSTREAM_TRL_VERSION}"
    ours, upstream = rows
    assert number(ours[2]) > 0 and number(upstream[2]) > 0 and upstream[5] == "-"
    assert number(ours[5]) == pytest.approx(number(ours[2]) / number(upstream[2]), abs=0.01)
    assert 0 < number(ours[7]) <= 8 and 0 < number(upstream[7]) <= 8  # max_completion_length 8
    assert "GRPO step, preset tiny:" in out and "2 steps/run, first 1 dropped" in out
    header, rows = table_with(out, "memory case")  # MB: imports, after init, peak, where, then per part
    parts = ["generate", "ref_old_logps", "prepare", "fwd_bwd", "optimizer", "sync", "other"]
    assert header == ["memory case", "implementation", "imports", "after init", "peak", "peak set in", *parts]
    assert [row[1] for row in rows] == ["ours", "upstream"]
    for row in rows:
        imports, init, peak = number(row[2]), number(row[3]), number(row[4])
        assert 100 < imports <= init <= peak and row[5]
        sampled = [number(cell) for cell in row[6:] if cell != "-"]
        assert "-" not in (row[6], row[9]) and all(imports <= value <= peak + 1 for value in sampled)  # generate, loss
    header, rows = table_with(out, "kernel case")  # page faults and system CPU time per step
    assert header[1:5] == ["implementation", "minor page faults/step", "system CPU s/step", "share of CPU s/step"]
    assert header[5:] == [f"{p} faults" for p in step_parts] and [row[1] for row in rows] == ["ours", "upstream"]
    with open(tmp / "steps.json") as f:
        steps = json.load(f)
    assert sorted(steps) == ["ours/every/", "upstream/every/"]
    assert all(len(runs) == 1 and len(runs[0]["times"]) == 2 for runs in steps.values())
    for (runs,), row in zip((steps["ours/every/"], steps["upstream/every/"]), rows):
        assert len(runs["faults"]) == len(runs["sys_times"]) == 2
        assert number(row[2]) == runs["faults"][1] and number(row[3]) == pytest.approx(runs["sys_times"][1], abs=1e-3)
        # nested parts taken out of their parents: no part (nor the rest, "other") below zero in time or faults
        for step in runs["parts"]:
            assert all(step[p][0] > -1e-6 and step[p][1] > -1e-6 and step[p][2] >= 0 for p in step_parts), step
        assert [number(cell) for cell in row[5:]] == [runs["parts"][1][p][2] for p in step_parts]


def _check_lora_memory(out, tmp):
    header, rows = table_with(out, "model")
    assert header == ["model", "full reference copy", "reference adapter", "ratio"]
    assert [row[0] for row in rows] == ["tiny (tests)", "Qwen2 0.5B shape"]
    full, adapter, ratio = (number(c) for c in rows[1][1:])
    assert 900 < full < 1000 and adapter < full and ratio == pytest.approx(100 * adapter / full, abs=0.01)


def _check_results(tmp, plot_name: str) -> dict:
    with open(tmp / "out" / "results.json") as f:
        results = json.load(f)
    assert os.path.getsize(tmp / "out" / plot_name) > 0, "the smoke run writes its figure into --output_dir"
    return results


def _check_cold_start(out, tmp):
    header, rows = table_with(out, "β")
    assert header == ["β", "KL correction", "arm", "final accuracy (n=1)", "final KL", "accuracy per seed"]
    assert [row[:3] for row in rows] == [
        ["0.5", "on", "fixed reference"],
        ["0.5", "on", "hard sync (α=1, τ=1)"],
        ["0.5", "on", "soft sync (α=0.6, τ=1)"],
    ]
    assert all(0 <= number(row[3]) <= 1 and number(row[4]) >= 0 for row in rows)
    runs = _check_results(tmp, "iterative_grpo_cold_start.png")["runs"]
    assert [(r["arm"], r["steps"], r["num_syncs"]) for r in runs] == [
        ("fixed", [1, 2], 0),
        ("hard", [1, 2], 2),
        ("soft", [1, 2], 2),
    ]


def _check_reward_model(out, tmp):
    header, rows = table_with(out, "reward model (2 steps, 1 seeds)")
    assert header[1:] == [
        "true reward, step 1",
        "final true reward",
        "final RM prediction σ(score)",
        "final gap (prediction − true)",
    ]
    assert [row[0] for row in rows] == ["(a) frozen", "(b) refreshed every 1 steps, 10% replay"]
    for row in rows:
        true, predicted, gap = number(row[2]), number(row[3]), number(row[4])
        assert 0 <= true <= 1 and 0 <= predicted <= 1 and gap == pytest.approx(predicted - true, abs=2e-3)
    runs = _check_results(tmp, "reward_model_refresh.png")["runs"]
    assert [(r["arm"], r["steps"], r["num_updates"]) for r in runs] == [
        ("frozen", [1, 2], 0),
        ("refreshed", [1, 2], 2),
    ]


def _check_real_model(out, tmp):
    header, rows = table_with(out, "β")
    assert header == [
        "β",
        "arm",
        "final train accuracy (n=1)",
        "held-out accuracy after",
        "held-out per seed",
        "final KL",
    ]
    assert [row[:2] for row in rows] == [["0.5", "fixed reference"], ["0.5", "soft sync (α=0.6, τ=1)"]]
    assert all(0 <= number(row[2]) <= 1 and 0 <= number(row[3]) <= 1 for row in rows)
    assert "SmolLM2-135M-Instruct, 2 steps of 1 prompts × 4 completions" in out
    results = _check_results(tmp, "iterative_grpo_real_model.png")
    assert [(r["arm"], r["steps"], r["num_syncs"], len(r["heldout_completions"])) for r in results["runs"]] == [
        ("fixed", [1, 2], 0, 4),
        ("soft", [1, 2], 2, 4),
    ]


def _check_fingerprint(out, tmp):
    header, rows = table_with(out, "config")
    assert header == ["config", "params sha256", "reference sha256", "logs sha256", "steps", "wall s"]
    assert [row[0] for row in rows] == ["sync_hard", "lora"] and all(row[4] == "1" for row in rows)
    digest = re.compile(r"^[0-9a-f]{16}$")
    assert all(digest.match(row[1]) and digest.match(row[3]) for row in rows)
    assert rows[0][1] == rows[0][2]  # a hard sync (alpha = 1) after the step: the reference is the policy's bits
    assert rows[1][2].endswith("(ref adapter)")


def _check_vllm_generation(out, tmp):
    header, rows = table_with(out, "path")
    assert header == ["path", "s per batch (median)", "completion tokens", "tokens/s"]
    assert [row[0] for row in rows] == [
        "transformers generate, this package's CPU default",
        "transformers generate, plain (TRL)",
        "vLLM colocate",
        "vLLM weight push (272 tensors)",
    ]
    assert all(number(row[1]) > 0 for row in rows)
    assert all(1 <= number(row[2]) <= 2 * 4 for row in rows[:3])  # 1 prompt × 2 completions of ≤ 4 tokens
    assert "vLLM engine start" in out


def _output_dir(tmp, values):
    return ["--output_dir", str(tmp / "out")]


CHECKS = {
    "behaviour_fingerprint.py": (lambda tmp, values: [], _check_fingerprint),
    "benchmark_generation.py": (lambda tmp, values: ["--model_dir", str(tmp / "model")], _check_generation),
    "benchmark_packed_scoring.py": (lambda tmp, values: ["--model_dir", str(tmp / "model")], _check_packed_scoring),
    "benchmark_grpo_step.py": (lambda tmp, values: ["--model_dir", str(tmp / "model")], _check_grpo_step),
    "benchmark_lm_head.py": (lambda tmp, values: [], _check_lm_head),
    "benchmark_sync_zero3.py": (lambda tmp, values: [], _check_sync_zero3),
    "benchmark_zero3_generation.py": (
        lambda tmp, values: ["--upstream_python", values["upstream_python"], "--model_dir", str(tmp / "model")],
        _check_zero3_generation,
    ),
    "compare_upstream_loss.py": (
        lambda tmp, values: ["--upstream_python", values["upstream_python"]],
        _check_upstream_loss,
    ),
    "compare_upstream_trl.py": (
        lambda tmp, values: [
            "--upstream_python",
            values["upstream_python"],
            "--model_dir",
            str(tmp / "model"),
            "--json",
            str(tmp / "steps.json"),
        ],
        _check_upstream_trl,
    ),
    "benchmark_vllm_generation.py": (
        lambda tmp, values: ["--model_dir", values["smollm2_path"]],
        _check_vllm_generation,
    ),
    "lora_reference_memory.py": (lambda tmp, values: [], _check_lora_memory),
    "reproduce_cold_start.py": (_output_dir, _check_cold_start),
    "reproduce_reward_model.py": (_output_dir, _check_reward_model),
    "reproduce_real_model.py": (
        lambda tmp, values: _output_dir(tmp, values) + ["--model_dir", values["smollm2_path"]],
        _check_real_model,
    ),
}
# The fixtures (and other values) each script's arguments need; built only when that script is collected.
NEEDS = {
    "benchmark_zero3_generation.py": ("upstream_python",),
    "compare_upstream_loss.py": ("upstream_python",),
    "compare_upstream_trl.py": ("upstream_python",),
    "reproduce_real_model.py": ("smollm2_path",),
    "benchmark_vllm_generation.py": ("smollm2_path", "vllm_python"),
}
# Scripts that run in another interpreter than this one: the name of the fixture giving its path.
INTERPRETERS = {"benchmark_vllm_generation.py": "vllm_python"}


@pytest.fixture(scope="module")
def upstream_python() -> str:
    return upstream_trl_python_or_skip()


@pytest.fixture(scope="module")
def vllm_python() -> str:
    """The python of the vLLM venv (`make vllm_tests` builds it; `TRL_VLLM_PYTHON` names another one). Without it the
    vLLM benchmark is skipped, except under CI (`CI` set), where that is a failure."""
    python = os.environ.get("TRL_VLLM_PYTHON") or os.path.join(ROOT, ".venv-vllm", "bin", "python")
    if not os.path.exists(python):
        if os.environ.get("CI"):
            pytest.fail(f"no vLLM venv at {python}: run `make vllm_tests` first")
        pytest.skip(f"no vLLM venv at {python} (`make vllm_tests` builds it)")
    return python


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_smoke(script, tmp_path, request):
    """`python benchmarks/<script> --smoke` exits 0 and prints its table with the expected header and values."""
    assert script in CHECKS, f"benchmarks/{script} has no smoke check: give it a --smoke mode and add it to CHECKS"
    arguments, check = CHECKS[script]
    values = {name: request.getfixturevalue(name) for name in NEEDS.get(script, ())}
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    python = values[INTERPRETERS[script]] if script in INTERPRETERS else sys.executable
    command = [python, os.path.join(ROOT, "benchmarks", script), "--smoke", *arguments(tmp_path, values)]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    if done.returncode != 0 and GLOO_TEARDOWN_ABORT in done.stderr:  # once: says nothing about the code under test
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr[-8000:]}"
    print(f"{script} --smoke: {seconds:.0f} s")
    check(done.stdout, tmp_path)
