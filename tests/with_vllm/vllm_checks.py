# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""What the colocate and server tests share: chat prompts, transformers' greedy completions and log-probs to compare
vLLM's with, a trainer that samples with vLLM, and the check run after every weight push."""

import weakref

import torch
from conftest import length_reward, real_grpo_kwargs
from transformers import TrainerCallback

from trl import GRPOConfig, GRPOTrainer
from trl.generation.vllm_utils import sampling_settings
from trl.tasks import SUM_QUESTION, make_arithmetic_dataset


GREEDY_TOKENS = 12
# vLLM's float32 log-probs against transformers' for the same tokens and weights (2.5e-5 seen at most)
LOGPROB_TOLERANCE = 1e-4
EOS = 2  # SmolLM2's <|im_end|>


def sum_questions(n: int = 8):
    return make_arithmetic_dataset(n, seed=0, conversational=True, template=SUM_QUESTION)


def chat_prompt(tokenizer, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(ids["input_ids"])


# `SamplingParams` keyword arguments as the trainer makes them (`vllm_utils.sampling_settings` of a default config:
# temperature 1, top-k off, `GREEDY_TOKENS` tokens, stop at `<|im_end|>`). Built once, at import: a `GRPOConfig` made
# while a trainer runs resets accelerate's state under it (transformers' `TrainingArguments._setup_devices`).
DEFAULT_SAMPLING = sampling_settings(
    GRPOConfig(output_dir="unused", max_completion_length=GREEDY_TOKENS, use_cpu=True, report_to="none"), [EOS]
)


def settings(**overrides) -> dict:
    """`DEFAULT_SAMPLING` with `overrides`."""
    return {**DEFAULT_SAMPLING, **overrides}


@torch.no_grad()
def transformers_greedy(model, prompt: list[int], max_tokens: int = GREEDY_TOKENS) -> list[int]:
    """transformers' greedy completion, cut after the first EOS (kept, as vLLM returns it)."""
    ids = torch.tensor([prompt])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_tokens,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )[0, len(prompt) :].tolist()
    return out[: out.index(EOS) + 1] if EOS in out else out


def vllm_greedy(generator, prompt: list[int]) -> list[int]:
    return generator.generate([prompt], settings(temperature=0.0), [0])[0][0]


@torch.no_grad()
def logprob_error(model, rows, ids, logps, temperature: float) -> float:
    """Largest |vLLM's log-prob − transformers' log_softmax(logits / temperature)| of the same sampled tokens."""
    worst = 0.0
    for prompt, completion, served in zip(rows, ids, logps):
        assert len(served) == len(completion) > 0
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
        expected = (logits / temperature).log_softmax(-1).gather(1, torch.tensor(completion)[:, None])[:, 0]
        worst = max(worst, (expected - torch.tensor(served)).abs().max().item())
    return worst


class GreedyAfterEachPush(TrainerCallback):
    """Wraps the trainer's `sync_weights`: after every push, vLLM's greedy completion of a chat prompt equals
    transformers' from the trainer's current policy (a PEFT policy generates with its adapter), and vLLM's sampled
    log-probs equal the policy's; records the optimizer step of each push. Holds the trainer by a weak reference: with
    a strong one (a cycle through the wrapped method) the trainers of earlier tests were never freed, ~4 GB each."""

    def __init__(self, trainer, tokenizer):
        self.pushed_at = []
        self.prompt = chat_prompt(tokenizer, "What is 12 + 30? Answer with the number only.")
        sync, trainer_ref = trainer.vllm_generation.sync_weights, weakref.ref(trainer)

        def checked(model, version):
            pushed = sync(model, version)
            trainer = trainer_ref()
            if pushed:
                policy = trainer.accelerator.unwrap_model(trainer.model)
                generator = trainer.vllm_generation.generator
                assert vllm_greedy(generator, self.prompt) == transformers_greedy(policy, self.prompt)
                rows = [self.prompt] * 2
                ids, logps = generator.generate(rows, settings(max_tokens=8), [7, 8])
                assert logprob_error(policy, rows, ids, logps, 1.0) < LOGPROB_TOLERANCE
                self.pushed_at.append(trainer.state.global_step)
            return pushed

        trainer.vllm_generation.sync_weights = checked


def vllm_trainer(model_path, output_dir, vllm_mode: str, peft_config=None, **overrides) -> GRPOTrainer:
    """GRPO on SmolLM2 with `use_vllm=True`, a sync after every step, learning rate 1e-4 (greedy completions change
    within a few steps), chat prompts "What is a + b?"."""
    kwargs = real_grpo_kwargs(
        str(output_dir),
        use_vllm=True,
        vllm_mode=vllm_mode,
        vllm_max_model_length=256,
        learning_rate=1e-4,
        sync_ref_model=True,
        ref_model_sync_steps=1,
        **overrides,
    )
    return GRPOTrainer(
        model_path, length_reward, args=GRPOConfig(**kwargs), train_dataset=sum_questions(), peft_config=peft_config
    )


def logged(trainer, key) -> list:
    return [h[key] for h in trainer.state.log_history if key in h]


def losses(trainer) -> list[tuple]:
    return [(h["step"], h["loss"], h.get("kl")) for h in trainer.state.log_history if "loss" in h]


def trl_grpo_flags(model_path, output_dir, vllm_mode: str, *extra: str) -> list[str]:
    """`trl grpo` flags as a TRL 1.16 user writes them, with `--use_vllm`: SmolLM2, the sum questions as a JSON-lines
    file, 2 steps with a hard sync after each."""
    data = str(output_dir) + ".jsonl"
    sum_questions().to_json(data)
    flags = [
        "--model_name_or_path",
        str(model_path),
        "--dataset_name",
        data,
        "--reward_funcs",
        "conftest:length_reward",
    ]
    flags += ["--use_vllm", "true", "--vllm_mode", vllm_mode, "--vllm_max_model_length", "256", *extra]
    flags += ["--sync_ref_model", "true", "--ref_model_sync_steps", "1", "--beta", "0.04", "--max_steps", "2"]
    flags += ["--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "8"]
    flags += ["--use_cpu", "true", "--bf16", "false", "--gradient_checkpointing", "false", "--report_to", "none"]
    return flags + ["--save_strategy", "no", "--logging_steps", "1", "--output_dir", str(output_dir)]
