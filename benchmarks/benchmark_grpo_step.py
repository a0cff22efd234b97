# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Prints two tables: GRPO seconds/step and peak memory for a fixed config (with and without reference sync), and
the time of one reference sync against the memory-bandwidth floor and a naive per-parameter update.

    python benchmarks/benchmark_grpo_step.py                       # tiny Qwen2, CPU, fp32
    python benchmarks/benchmark_grpo_step.py --preset 0.5b         # Qwen2.5-0.5B shape, bf16, GPU if there is one
    python benchmarks/benchmark_grpo_step.py --preset 0.5b --skip_step   # sync table only (e.g. on a CPU)
    python benchmarks/benchmark_grpo_step.py --smoke                     # tiny, 2 steps per run, 5 syncs timed
"""

import argparse
import os
import statistics
import sys
import tempfile
import time


os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder's shared helpers

import torch  # noqa: E402
from _smoke import parse_args_with_smoke  # noqa: E402
from transformers import PrinterCallback, TrainerCallback  # noqa: E402

from trl import GRPOConfig, GRPOTrainer, create_reference_model  # noqa: E402
from trl.models.tiny import QWEN2_5_0_5B_SHAPE, build_tiny_causal_lm  # noqa: E402
from trl.reference.ref_sync import mix_tensors_  # noqa: E402
from trl.tasks import accuracy_reward, arithmetic_corpus, closeness_reward, make_arithmetic_dataset  # noqa: E402


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step (from on_step_begin to on_step_end)."""

    def __init__(self):
        self.times, self._start = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._start)


PRESETS = {
    "tiny": dict(hidden_size=64, num_layers=2),
    "0.5b": QWEN2_5_0_5B_SHAPE,
}
SMOKE = dict(preset="tiny", steps=2, device="cpu", sync_repeats=5)


def grpo_step_time(model_dir: str, steps: int, sync: bool, use_cpu: bool, dtype: str) -> tuple[float, float, float]:
    bf16 = dtype == "bfloat16"
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=8,
        learning_rate=1e-3,
        beta=0.04,
        sync_ref_model=sync,
        ref_model_sync_steps=1,
        ref_model_mixup_alpha=0.6,
        max_steps=steps,
        logging_steps=steps,
        save_strategy="no",
        report_to="none",
        use_cpu=use_cpu,
        disable_tqdm=True,
        seed=0,
        bf16=bf16 and not use_cpu,
        gradient_checkpointing=False,
        model_init_kwargs={"dtype": dtype},
    )
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=[closeness_reward, accuracy_reward],
        args=config,
        train_dataset=make_arithmetic_dataset(4096),
    )
    timer = StepTimer()
    trainer.add_callback(timer)
    trainer.remove_callback(PrinterCallback)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    times = timer.times[len(timer.times) // 4 :]  # drop warm-up
    peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() and not use_cpu else float("nan")
    return statistics.median(times), statistics.pstdev(times), peak


def _sync_timer(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def sync_times(model: torch.nn.Module, repeats: int) -> dict[str, float]:
    """Median seconds of: our sync (α=0.6), a naive per-parameter mul_/add_ loop, and one copy of all parameters."""
    device = next(model.parameters()).device
    reference = create_reference_model(model)
    params = [p.detach() for p in model.parameters()]
    refs = [p.detach() for p in reference.parameters()]

    def measure(fn):
        fn()
        samples = []
        for _ in range(repeats):
            start = _sync_timer(device)
            fn()
            samples.append(_sync_timer(device) - start)
        return statistics.median(samples)

    def naive():
        with torch.no_grad():
            for r, p in zip(refs, params):
                r.mul_(0.4).add_(p, alpha=0.6)

    flat_src = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=device)
    flat_dst = torch.empty_like(flat_src)
    copy_time = measure(lambda: flat_dst.copy_(flat_src))
    nbytes = flat_src.numel() * flat_src.element_size()
    bandwidth = 2 * nbytes / copy_time  # a copy reads and writes every byte
    return {
        "sync": measure(lambda: mix_tensors_(refs, params, 0.6)),
        "naive": measure(naive),
        "floor": 3 * nbytes / bandwidth,  # the sync reads ref and policy, writes ref
        "bytes": nbytes,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype", default=None, choices=["float32", "bfloat16"], help="default: fp32 for tiny, bf16 for 0.5b"
    )
    parser.add_argument("--skip_step", action="store_true", help="only the sync table")
    parser.add_argument("--sync_repeats", type=int, default=None, help="syncs timed (default: 50 tiny, 10 0.5b)")
    parser.add_argument("--model_dir", default=None, help="where to build the model (default: a new temp dir)")
    args = parse_args_with_smoke(parser, SMOKE, argv)
    dtype = args.dtype or ("float32" if args.preset == "tiny" else "bfloat16")
    use_cpu = args.device == "cpu"
    shape = PRESETS[args.preset]

    model_dir = build_tiny_causal_lm(args.model_dir or tempfile.mkdtemp(), corpus=arithmetic_corpus(), **shape)
    if not args.skip_step:
        print(
            f"\nGRPO step: preset {args.preset} ({shape['hidden_size']}-wide, {shape['num_layers']} layers), {dtype}, "
            f"64 completions/step (8 prompts × 8), max_completion_length 8, device {args.device}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads"
        )
        print(f"| {'sync':<14} | {'s/step (median)':>15} | {'std':>8} | {'peak GPU MiB':>12} |")
        print(f"|{'-' * 16}|{'-' * 17}|{'-' * 10}|{'-' * 14}|")
        for sync in (False, True):
            median, std, peak = grpo_step_time(model_dir, args.steps, sync, use_cpu, dtype)
            label = "every step" if sync else "none"
            print(f"| {label:<14} | {median:>15.4f} | {std:>8.4f} | {peak:>12.1f} |")

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(args.device)
    result = sync_times(model, repeats=args.sync_repeats or (50 if args.preset == "tiny" else 10))
    print(
        f"\nOne reference sync (α=0.6), preset {args.preset}, {result['bytes'] / 2**20:.2f} MiB of {dtype} parameters, device {args.device}"
    )
    print(f"| {'method':<40} | {'ms':>9} | {'× floor':>8} |")
    print(f"|{'-' * 42}|{'-' * 11}|{'-' * 10}|")
    for name, key in (
        ("bandwidth floor (3 × bytes / copy BW)", "floor"),
        ("trl sync (mix_tensors_, fp32 maths)", "sync"),
        ("naive per-parameter mul_/add_", "naive"),
    ):
        print(f"| {name:<40} | {result[key] * 1e3:>9.4f} | {result[key] / result['floor']:>8.2f} |")


if __name__ == "__main__":
    main()
