# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Our GRPO loss against upstream TRL's on fixed tensors: value, gradient and logged metrics, for every loss type,
both importance-sampling levels, the KL correction on and off, `delta`, off-policy masking, top-entropy masking,
the entropy bonus and the MoE router loss, with and without gradient accumulation.

Each side runs its own trainer's loss step (`GRPOTrainer._compute_loss`, the same name on both sides) on a stub
`self`, whose `_get_per_token_logps_and_entropies` returns fixed float64 log-probs and entropies (and a stand-in
router loss), on one process. Under accumulation our value is divided by the accumulation steps, as transformers'
`Trainer` does before the backward pass (TRL divides inside its loss). Upstream TRL must live in its own virtual environment (see compare_upstream_trl.py):

    python benchmarks/compare_upstream_loss.py --upstream_python /opt/trl-upstream/bin/python
    python benchmarks/compare_upstream_loss.py --smoke     # SMOKE_CASES only, upstream from tests/upstream_venv.py

The upstream half is this same file run with `--worker OUT.json` under the upstream interpreter from a temporary
directory, so that it imports upstream's `trl`. Prints one row per case and the largest differences.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import types
from collections import defaultdict

import torch


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder's shared helpers
from _smoke import parse_args_with_smoke, upstream_trl_python  # noqa: E402


BASE = dict(
    loss_type="dapo",
    importance_sampling_level="token",
    epsilon=0.2,
    epsilon_high=None,
    delta=None,
    sapo_temperature_pos=1.0,
    sapo_temperature_neg=1.05,
    vespo_k_pos=2.0,
    vespo_lambda_pos=3.0,
    vespo_k_neg=3.0,
    vespo_lambda_neg=2.0,
    off_policy_mask_threshold=None,
    beta=0.0,
    use_bias_correction_kl=True,
    top_entropy_quantile=1.0,
    entropy_coef=0.0,
    use_adaptive_entropy=False,
    entropy_coef_min=0.0,
    entropy_coef_max=1.0,
    entropy_coef_delta=0.005,
    entropy_target=0.2,
    max_completion_length=5,
    gradient_accumulation_steps=1,  # also steps_per_generation: the generation batch is this many micro-batches
    router_aux_loss_coef=None,  # a float: add a (stub) MoE router loss with this weight
)
CASES = {}
for _loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"):
    CASES[_loss_type] = dict(loss_type=_loss_type, epsilon_high=5.0 if _loss_type == "cispo" else 0.28)
    CASES[f"{_loss_type}+kl"] = dict(
        loss_type=_loss_type, beta=0.04, epsilon_high=5.0 if _loss_type == "cispo" else None
    )
    CASES[f"{_loss_type}+sequence+kl"] = dict(loss_type=_loss_type, beta=0.1, importance_sampling_level="sequence")
CASES.update(
    {
        "grpo+kl, no correction": dict(loss_type="grpo", beta=0.04, use_bias_correction_kl=False),
        "dapo+delta": dict(delta=1.3),
        "dapo+off-policy mask+kl": dict(off_policy_mask_threshold=0.05, beta=0.04),
        "dapo+top entropy+kl": dict(top_entropy_quantile=0.3, beta=0.04),
        "grpo+entropy bonus": dict(loss_type="grpo", entropy_coef=0.1, top_entropy_quantile=0.5),
        "grpo+adaptive entropy": dict(
            loss_type="grpo", use_adaptive_entropy=True, entropy_coef=0.1, entropy_target=5.0
        ),
        "sapo, other temperatures": dict(loss_type="sapo", sapo_temperature_pos=2.0, sapo_temperature_neg=0.5),
        "vespo, other k/lambda": dict(
            loss_type="vespo", vespo_k_pos=1.0, vespo_lambda_pos=0.5, vespo_k_neg=4.0, vespo_lambda_neg=1.0
        ),
        "dapo+bonus+aux, accum 4": dict(gradient_accumulation_steps=4, entropy_coef=0.1, router_aux_loss_coef=0.02),
        "grpo+bonus+aux, accum 4": dict(
            loss_type="grpo", gradient_accumulation_steps=4, entropy_coef=0.1, router_aux_loss_coef=0.02
        ),
        "cispo+sequence+kl, accum 2": dict(
            loss_type="cispo", importance_sampling_level="sequence", beta=0.1, gradient_accumulation_steps=2
        ),
        "luspo+sequence+bonus, accum 2": dict(
            loss_type="luspo", importance_sampling_level="sequence", entropy_coef=0.1, gradient_accumulation_steps=2
        ),
    }
)


# `--smoke`: one case per code path (token and sequence level, KL, top-entropy mask, adaptive entropy, accumulation)
SMOKE_CASES = (
    "grpo",
    "dapo+kl",
    "cispo+sequence+kl",
    "dapo+top entropy+kl",
    "grpo+adaptive entropy",
    "dapo+bonus+aux, accum 4",
)


def fixed_tensors() -> dict:
    g = torch.Generator().manual_seed(0)
    logps = torch.randn(6, 5, generator=g, dtype=torch.float64) * 0.5 - 1.5
    return dict(
        logps=logps,
        old=logps + torch.randn(6, 5, generator=g, dtype=torch.float64) * 0.3,
        ref=logps + torch.randn(6, 5, generator=g, dtype=torch.float64) * 0.4,
        mask=torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] + [0] * 4, [1] * 4 + [0], [1] * 2 + [0] * 3, [1] * 5]),
        advantages=torch.tensor([1.0, -0.5, 0.0, 2.0, -1.5, 0.7], dtype=torch.float64),
        entropies=torch.rand(6, 5, generator=g, dtype=torch.float64) * 3,
    )


class _SingleProcess:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def config_defaults() -> dict:
    """Our `GRPOConfig`'s field defaults (those with a plain default or a default factory)."""
    import dataclasses

    from trl import GRPOConfig

    out = {}
    for f in dataclasses.fields(GRPOConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def run_case(trainer_cls, config: dict, upstream: bool) -> dict:
    """One loss evaluation through `trainer_cls`'s loss method on a stub trainer; returns loss, gradients, metrics."""
    t = fixed_tensors()
    logps, entropies = t["logps"].clone().requires_grad_(True), t["entropies"].clone().requires_grad_(True)
    accumulation = config["gradient_accumulation_steps"]
    aux_coef = config["router_aux_loss_coef"]
    aux_loss = logps.square().mean() if aux_coef is not None else None  # a differentiable stand-in
    # the fields the case sets, over (ours only) our GRPOConfig's defaults for every other field the loss reads
    # (e.g. `shared_prefix`), so that a new config field does not break the stub
    defaults = {} if upstream else config_defaults()
    stub = types.SimpleNamespace(
        args=types.SimpleNamespace(**{**defaults, **config, "steps_per_generation": accumulation}),
        accelerator=_SingleProcess(),
        model=types.SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        beta=config["beta"],
        loss_type=config["loss_type"],
        max_completion_length=config["max_completion_length"],
        aux_loss_enabled=aux_coef is not None,
        router_aux_loss_coef=aux_coef,
        current_gradient_accumulation_steps=accumulation,
        temperature=1.0,
    )
    inputs = {
        "prompt_ids": torch.zeros(6, 2, dtype=torch.long),
        "prompt_mask": torch.ones(6, 2, dtype=torch.long),
        "completion_ids": torch.zeros(6, 5, dtype=torch.long),
        "completion_mask": t["mask"],
        "advantages": t["advantages"],
        "old_per_token_logps": t["old"],
        # TRL counts the generation batch's tokens (here `accumulation` micro-batches like this one); we count them
        # per process and micro-batch
        "num_items_in_batch": t["mask"].sum().double() * (accumulation if upstream else 1),
    }
    if config["beta"] != 0.0:
        inputs["ref_per_token_logps"] = t["ref"]
    # both trainers' loss step is `_compute_loss(model, inputs)`, calling the same-named methods for log-probs and masks
    stub._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logps, entropies, aux_loss)
    stub.get_high_entropy_mask = types.MethodType(trainer_cls.get_high_entropy_mask, stub)
    stub.get_off_policy_mask = trainer_cls.get_off_policy_mask
    if upstream:
        stub.get_gamma_weights = trainer_cls.get_gamma_weights
        for name in ("top_entropy_quantile", "off_policy_mask_threshold", "importance_sampling_level", "entropy_coef"):
            setattr(stub, name, config[name])
        stub.epsilon_low = config["epsilon"]
        stub.epsilon_high = config["epsilon"] if config["epsilon_high"] is None else config["epsilon_high"]
        stub.use_vllm = stub.vllm_importance_sampling_correction = False
        stub.use_adaptive_entropy = config["use_adaptive_entropy"]
        stub._entropy_bonus_enabled = config["entropy_coef"] != 0.0 or config["use_adaptive_entropy"]
        stub._last_world_entropy, stub._entropy_window_stats = float("inf"), None
        loss = trainer_cls._compute_loss(stub, None, inputs)
    else:
        from trl.trainer.entropy_control import EntropyCoefficient
        from trl.trainer.grpo_losses import POLICY_LOSS_FIELDS

        stub.policy_loss_kwargs = {name: config[name] for name in POLICY_LOSS_FIELDS}
        stub.entropy_control = EntropyCoefficient.from_config(stub.args)
        # transformers' Trainer divides our loss by the accumulation steps before the backward pass
        loss = trainer_cls._compute_loss(stub, None, inputs) / accumulation
    loss.backward()
    return dict(
        loss=loss.item(),
        grad=logps.grad.tolist(),
        entropy_grad=None if entropies.grad is None else entropies.grad.tolist(),
        metrics={name: values[-1] for name, values in stub._metrics["train"].items()},
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--upstream_python",
        default=None,
        help="upstream TRL's python (default: /opt/trl-upstream/bin/python; with --smoke, tests/upstream_venv.py's)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parse_args_with_smoke(parser, {})
    cases = {name: CASES[name] for name in SMOKE_CASES} if args.smoke else CASES
    from trl import GRPOTrainer

    if args.worker:  # upstream side
        results = {name: run_case(GRPOTrainer, {**BASE, **over}, upstream=True) for name, over in cases.items()}
        with open(args.worker, "w") as f:
            json.dump(results, f)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "upstream.json")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # upstream's `trl`, never ours
        if args.upstream_python is None:
            args.upstream_python = upstream_trl_python() if args.smoke else "/opt/trl-upstream/bin/python"
        command = [args.upstream_python, os.path.abspath(__file__), "--worker", out] + ["--smoke"] * args.smoke
        subprocess.run(command, cwd=tmp, env=env, check=True)
        with open(out) as f:
            upstream = json.load(f)
    worst = defaultdict(float)
    print(
        f"{'case':30s} {'loss (ours)':>12s} {'|Δ loss|':>9s} {'|Δ grad|':>9s} {'|Δ metric|':>10s}  upstream-only metrics"
    )
    for name, over in cases.items():
        ours, theirs = run_case(GRPOTrainer, {**BASE, **over}, upstream=False), upstream[name]
        d_loss = abs(ours["loss"] - theirs["loss"])
        d_grad = (torch.tensor(ours["grad"]) - torch.tensor(theirs["grad"])).abs().max().item()
        if theirs["entropy_grad"] is not None or ours["entropy_grad"] is not None:
            d_ent = (torch.tensor(ours["entropy_grad"]) - torch.tensor(theirs["entropy_grad"])).abs().max().item()
            d_grad = max(d_grad, d_ent)
        shared = set(ours["metrics"]) & set(theirs["metrics"])
        d_metric = max([abs(ours["metrics"][k] - theirs["metrics"][k]) for k in shared] or [0.0])
        only = sorted(set(theirs["metrics"]) - set(ours["metrics"]))
        for key, value in (("loss", d_loss), ("grad", d_grad), ("metric", d_metric)):
            worst[key] = max(worst[key], value)
        print(f"{name:30s} {ours['loss']:+12.6f} {d_loss:9.1e} {d_grad:9.1e} {d_metric:10.1e}  {', '.join(only)}")
    print(f"largest differences: loss {worst['loss']:.1e}, gradient {worst['grad']:.1e}, metric {worst['metric']:.1e}")


if __name__ == "__main__":
    sys.exit(main())
