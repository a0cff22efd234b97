# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Worker for tests/test_distributed.py, started with `torchrun --nproc_per_node 2` (gloo, CPU), or for `fsdp2` with
`accelerate launch --config_file trl/accelerate_configs/fsdp2.yaml --num_processes 2 --mixed_precision no`.

    prefix_sharing_worker.py MODE MODEL_DIR OUT_DIR      MODE in {ddp, zero2, zero3, fsdp2, ddp_diverge}

Each rank trains the same 2 GRPO steps twice from the same seed, with `shared_prefix=False` and then `True`,
at the default sharing threshold (`MIN_SHARED_PREFIX_TOKENS`, not patched): the prompts have 24 tokens. In
`ddp_diverge` (DDP) rank 1 reads 12-token prompts instead, below the threshold, so rank 0 shares its prompts and rank 1
scores plain in the same steps: the ranks decide differently, and their collectives must still match; there, a third of
the vocabulary stops a completion (`generation_kwargs`), so completions of different lengths share packed rows on
rank 0 (`shared_prefix`'s packed rows, a 4-D mask) while rank 1 runs padded rows. It records
the logged loss, entropy and gradient norm of every step, the per-token log-probs of every scoring pass
(reference and training passes), and how many scoring passes shared their prompts (calls of `shared_prefix_cache`
that returned a cache, or forwards over packed rows that hold their prompt), with and without gradients, and the
lines the scoring logged about passes that did not share or pack. It writes them to
`OUT_DIR/<mode>_rank<r>.json`. `zero3` (DeepSpeed ZeRO-3) and `fsdp2` (accelerate's FSDP2 plugin, kept on CPU
processes by `fsdp2_trainer_worker.enable_fsdp_on_cpu`) share in packed rows only: their parameters rule out the prompt
cache.
"""

import os
import sys


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from sync_worker import finish  # noqa: E402


STEPS = 2
# 8 two-digit numbers: 24 tokens with the tiny arithmetic tokenizer, above the 17 that sharing needs
PROMPTS = ["+".join(str(10 + (7 * i + 3 * j) % 90) for j in range(8)) + "=" for i in range(16)]
SHORT_PROMPTS = [prompt.split("+", 4)[-1] for prompt in PROMPTS]  # the last 4 numbers: 12 tokens, below the 17


def digits_reward(completions, **kwargs):  # varied rewards: non-zero advantages, a real gradient
    return [sum(c.isdigit() for c in text) + 0.1 * len(text) for text in completions]


def train(model_dir: str, out_dir: str, mode: str, share: bool) -> dict:
    from datasets import Dataset

    from trl import GRPOConfig, GRPOTrainer
    from trl.scoring import grpo_scoring, scoring_plan
    from trl.trainer import grpo_trainer

    extra = {}
    if mode in ("zero2", "zero3"):
        extra["deepspeed"] = {
            "zero_optimization": {"stage": int(mode[-1])},
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto",
            "gradient_clipping": "auto",
        }
    if mode == "ddp_diverge":  # a third of the vocabulary stops a completion: lengths vary, so rows pack
        from transformers import AutoConfig

        extra["generation_kwargs"] = {
            "eos_token_id": list(range(AutoConfig.from_pretrained(model_dir).vocab_size // 3))
        }
    rank = int(os.environ.get("RANK", "0"))
    prompts = SHORT_PROMPTS if mode == "ddp_diverge" and rank == 1 else PROMPTS
    args = GRPOConfig(
        output_dir=os.path.join(out_dir, f"{mode}_{share}"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=STEPS,
        learning_rate=5e-2,
        beta=0.1,  # a reference pass without gradients
        shared_prefix=share,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
        seed=0,
        **extra,
    )  # gradient checkpointing as GRPOConfig defaults it (TRL: on), so the cache is kept in checkpointed layers

    shared = {"with_gradients": 0, "without_gradients": 0}
    make_cache, score = scoring_plan.shared_prefix_cache, grpo_trainer.score_completions
    pack, packed, inline, plans = scoring_plan.pack_completions, [0], [0], []
    packed_mask, plain_logs, log_info = scoring_plan.packed_attention_mask, [], scoring_plan.logger.info

    def counting_packs(*a, **k):  # passes with at least one row that holds two completions
        plan = pack(*a, **k)
        if plan is not None and plan.input_ids.size(0) < a[0].size(0):
            packed[0] += 1
        plans.append(plan)
        return plan

    def counting_masks(model, mask):  # called for the packed rows a pass does run on
        if any(plan is not None and plan.inline and plan.attention_mask is mask for plan in plans):
            # a shared pass without a cache: rows that start with their prompt
            shared["with_gradients" if torch.is_grad_enabled() else "without_gradients"] += 1
            inline[0] += 1
        return packed_mask(model, mask)

    def recording_info(message, *a, **k):
        if str(message).startswith(("shared_prefix:", "shared_prefix (packed rows):")):
            plain_logs.append(str(message))
        return log_info(message, *a, **k)

    logps: list[list] = []

    def counting_cache(*a, **k):
        cache = make_cache(*a, **k)
        if cache is not None:
            shared["with_gradients" if torch.is_grad_enabled() else "without_gradients"] += 1
        return cache

    def recording_score(*a, **k):
        scores = score(*a, **k)
        logps.append(scores.per_token_logps.detach().float().tolist())
        return scores

    scoring_plan.shared_prefix_cache = counting_cache
    grpo_trainer.score_completions = recording_score
    scoring_plan.pack_completions = counting_packs
    scoring_plan.packed_attention_mask = counting_masks
    scoring_plan.logger.info = recording_info
    scoring_plan._LOGGED_BLOCKERS.clear()
    try:
        trainer = GRPOTrainer(
            model=model_dir,
            reward_funcs=digits_reward,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
        )
        prompt_tokens = len(trainer.processing_class(prompts[0], add_special_tokens=False)["input_ids"])
        trainer.train()
    finally:
        scoring_plan.shared_prefix_cache = make_cache
        grpo_trainer.score_completions = score
        scoring_plan.pack_completions = pack
        scoring_plan.packed_attention_mask = packed_mask
        scoring_plan.logger.info = log_info
    history = [log for log in trainer.state.log_history if "grad_norm" in log]
    return {
        "steps": [{k: log[k] for k in ("loss", "entropy", "grad_norm")} for log in history],
        "logps": logps,
        "shared": shared,
        "packed_passes": packed[0],
        "inline_passes": inline[0],
        "plain_pass_logs": plain_logs,
        "prompt_tokens": prompt_tokens,
        "threshold": grpo_scoring.MIN_SHARED_PREFIX_TOKENS,
        "policy_type": type(trainer.model_wrapped).__name__,
    }


def main() -> None:
    mode, model_dir, out_dir = sys.argv[1:4]
    if mode in ("zero2", "zero3"):  # DeepSpeed's comm layer must know the world before the trainer builds its engine
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    if mode == "fsdp2":
        from fsdp2_trainer_worker import enable_fsdp_on_cpu

        enable_fsdp_on_cpu()
    result = {str(share): train(model_dir, out_dir, mode, share) for share in (False, True)}
    finish(mode, out_dir, result)


if __name__ == "__main__":
    main()
