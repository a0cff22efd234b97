# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Reference sync under DeepSpeed ZeRO-3 on 2 CPU processes: shard-local (trl) versus gather-everything (baseline).

    python benchmarks/benchmark_sync_zero3.py            # relaunches itself with torchrun --nproc_per_node 2
    python benchmarks/benchmark_sync_zero3.py --hidden_size 512 --num_layers 12 --repeats 5
    python benchmarks/benchmark_sync_zero3.py --smoke    # a 1-layer, 64-wide Qwen2 (vocab 1000), one timed sync

Policy and reference are the same Qwen2 (by default ≥ 50M parameters, fp32), both partitioned by ZeRO-3 (`zero.Init`) and
wrapped in DeepSpeed engines without optimizer, as `GRPOTrainer` does for the reference. One sync is α = 0.6.

* trl: `pair_for_sync(policy, reference)(alpha)`: every rank mixes its own partitions in place.
* baseline: gather every parameter of both models (`GatheredParameters(..., modifier_rank=0)`), mix the full
  tensors, and let DeepSpeed re-partition rank 0's result on exit (broadcast) — the usual way to sync.

How memory is measured (per rank, relative to just before the sync; the table shows the larger rank):
* torch bytes allocated: bytes of every tensor created during the sync (torch profiler, `profile_memory=True`,
  positive self allocations). An upper bound of the extra peak held by torch tensors.
* RSS peak: a thread samples `/proc/self/statm` every ~0.2 ms during the sync; the peak minus the RSS before
  (after `malloc_trim(0)`, so that heap freed by earlier runs and kept by glibc does not absorb the peak).
  This sees everything (DeepSpeed buffers, gloo), but sampling can miss very short peaks and adds noise (~1 MB).
Time: the median of `--repeats` syncs (wall clock, after a barrier, rank max).
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder's shared helpers
from _smoke import parse_args_with_smoke  # noqa: E402


SMOKE = dict(hidden_size=64, num_layers=1, vocab_size=1000, repeats=1)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden_size", type=int, default=512)
    parser.add_argument("--num_layers", type=int, default=12)
    parser.add_argument("--vocab_size", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=0.6)
    return parse_args_with_smoke(parser, SMOKE, argv)


def free_port() -> int:
    """A TCP port nothing listens on now (torchrun's default, 29500, may be taken by another job)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RssPeak:
    """Peak resident set size (bytes) of this process while the block runs, sampled by a thread."""

    def __init__(self, interval: float = 2e-4):
        self.interval, self.page = interval, os.sysconf("SC_PAGE_SIZE")
        self.before = self.peak = 0
        self._stop = threading.Event()

    def rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(self.interval)

    def __enter__(self):
        try:  # hand memory freed earlier back to the OS, so that re-used heap does not hide the peak
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        self.before = self.peak = self.rss()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.peak = max(self.peak, self.rss())
        self._stop.set()
        self._thread.join()

    @property
    def extra(self) -> int:
        return self.peak - self.before


def torch_bytes_allocated(fn) -> int:
    """Bytes of all tensors allocated while `fn` runs (frees not subtracted: an upper bound of the extra peak)."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return sum(max(e.self_cpu_memory_usage, 0) for e in prof.events() if e.name != "[memory]")


def main(argv=None) -> None:
    args = parse_args(argv)
    if "LOCAL_RANK" not in os.environ:  # relaunch on 2 processes
        env = dict(os.environ, DS_ACCELERATOR="cpu", DS_BUILD_OPS="0", OMP_NUM_THREADS="1")
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            os.path.abspath(__file__),
            *(sys.argv[1:] if argv is None else argv),
        ]
        sys.exit(subprocess.call(command, env=env))

    import deepspeed
    import torch
    import torch.distributed as dist
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trl.reference.ref_sync import mix_tensors_, pair_for_sync

    sys.setswitchinterval(1e-4)  # let the RSS sampler in
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    config = {
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "train_micro_batch_size_per_gpu": 1,
    }
    model_config = Qwen2Config(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=3 * args.hidden_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    )

    def build(seed: int):
        torch.manual_seed(seed)
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = Qwen2ForCausalLM(model_config)
        model.requires_grad_(False)
        engine, *_ = deepspeed.initialize(model=model, config=config)
        return engine.module

    policy, reference = build(0), build(1)
    num_params = sum(p.ds_numel for p in policy.parameters())
    model_bytes = sum(p.ds_numel * p.element_size() for p in policy.parameters())
    partition_bytes = sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in policy.parameters())
    largest_partition = max(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in policy.parameters())

    local_sync = pair_for_sync(policy, reference)

    def shard_local():
        local_sync(args.alpha)

    every = list(policy.parameters()) + list(reference.parameters())
    policy_params, reference_params = list(policy.parameters()), list(reference.parameters())

    def gather_everything():
        with deepspeed.zero.GatheredParameters(every, modifier_rank=0):
            mix_tensors_([p.data for p in reference_params], [p.data for p in policy_params], args.alpha)

    rows = {}
    for name, fn in (("shard-local (trl)", shard_local), ("gather-everything (baseline)", gather_everything)):
        fn()  # warm-up (first pairing, buffers)
        times = []
        for _ in range(args.repeats):
            dist.barrier()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        dist.barrier()
        with RssPeak() as rss:
            fn()
        dist.barrier()
        allocated = torch_bytes_allocated(fn)
        measured = torch.tensor([statistics.median(times), rss.extra, allocated], dtype=torch.float64)
        dist.all_reduce(measured, op=dist.ReduceOp.MAX)
        rows[name] = measured.tolist()

    if rank == 0:
        mib = 2**20
        print(
            f"\nZeRO-3, 2 CPU processes (gloo), Qwen2 {args.num_layers} layers × hidden {args.hidden_size}, "
            f"vocab {args.vocab_size}: {num_params / 1e6:.1f}M parameters, fp32"
        )
        print(
            f"model bytes: {model_bytes / mib:.1f} MiB; partition per rank: {partition_bytes / mib:.1f} MiB; "
            f"largest single partition: {largest_partition / mib:.2f} MiB\n"
        )
        print(
            "| sync | time of one sync (ms) | extra peak RSS per rank (MiB) | % of model bytes | torch bytes allocated per rank (MiB) | % of model bytes |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for name, (seconds, rss_extra, allocated) in rows.items():
            print(
                f"| {name} | {seconds * 1e3:.1f} | {rss_extra / mib:.2f} | {100 * rss_extra / model_bytes:.2f}% | "
                f"{allocated / mib:.2f} | {100 * allocated / model_bytes:.2f}% |"
            )
    dist.barrier()


if __name__ == "__main__":
    main()
