# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""What the slow suite (`test_grpo_slow.py`) shares: its run settings for CUDA and for the CPU, prompts, reward, and
`SyncChecker`, which watches the reference around every optimizer step. Run as a script it is the ZeRO-3 run of the
suite, in a process of its own so that DeepSpeed's global ZeRO-3 flag dies with it:

    python tests/slow/sync_checks.py MODEL_DIR OUT_DIR      (with MASTER_ADDR/PORT, RANK=0, WORLD_SIZE=1 set)

It writes `OUT_DIR/zero3.json`, which the test asserts on.
"""

import json
import os
import sys

import torch
from transformers import TrainerCallback


TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [TESTS, os.path.join(TESTS, "distributed_workers")]  # also when run as a script
from conftest import length_reward, real_grpo_kwargs  # noqa: E402, F401  (the reward is re-exported to the tests)
from sync_worker import full_state  # noqa: E402  (gathers ZeRO-3 parameters; plain tensors are cloned)


ON_CPU = os.environ.get("TRL_SLOW_TESTS_ON_CPU") == "1" or not torch.cuda.is_available()
DEVICE = "cpu" if ON_CPU else "cuda"
TAU = 2  # ref_model_sync_steps
if ON_CPU:  # fp32, one prompt of 4 completions per step: the same checks in ~4 minutes on 2 cores
    STEPS, BATCH, GENERATIONS, COMPLETION_TOKENS, LEARNING_RATE = 4, 4, 4, 8, 1e-5
else:  # bf16 weights and autocast, 4 prompts of 4 completions per step
    STEPS, BATCH, GENERATIONS, COMPLETION_TOKENS, LEARNING_RATE = 6, 16, 4, 32, 1e-4
SHORT_STEPS = 2 if ON_CPU else STEPS  # LoRA, gradient checkpointing, ZeRO-3: one sync on the CPU (step 2)
# Share of the tensors that must have moved: all in fp32; in bf16 an Adam step of lr = 1e-4 is below half an ulp of
# the larger weights (the norms), which then keep their value for a few steps.
MIN_MOVED = 1.0 if ON_CPU else 0.8

PROMPTS = [
    "Write a haiku about the sea.",
    "Name three animals that live in a forest.",
    "Describe the colour blue to a child.",
    "Invent a name for a new planet.",
    "Tell me a fun fact about space.",
    "Suggest a title for a mystery novel.",
    "What should I cook for dinner tonight?",
    "Give me one tip for learning to draw.",
    "Describe a rainy afternoon in a city.",
    "Write the first line of a fairy tale.",
    "What is a good name for a pet turtle?",
    "Explain why people enjoy music.",
    "Describe the taste of a lemon.",
    "Invent a new holiday and say how to celebrate it.",
    "Write a short slogan for a bicycle shop.",
    "What would you pack for a trip to the mountains?",
]


def conversations(texts: list[str]) -> list[list[dict[str, str]]]:
    """One user message per text: SmolLM2's chat template then adds its default system prompt (~38 tokens in all)."""
    return [[{"role": "user", "content": text}] for text in texts]


def sampled_chat_batch(model, tokenizer, num_prompts: int, group: int, length: int):
    """`(ids, prompt_ids, prompt_mask)` on `model`'s device: the first `num_prompts` of `PROMPTS` in the chat
    template, left-padded (`tokenizer` pads on the left), each repeated `group` times, then `length` tokens sampled
    after each (seed 0): `ids` `(num_prompts × group, P + length)`, the prompts' ids and mask
    `(num_prompts × group, P)`."""
    prompts = tokenizer.apply_chat_template(
        conversations(PROMPTS[:num_prompts]),
        add_generation_prompt=True,
        padding=True,
        return_tensors="pt",
        return_dict=True,
    )
    prompt_ids = prompts["input_ids"].repeat_interleave(group, 0).to(model.device)
    prompt_mask = prompts["attention_mask"].repeat_interleave(group, 0).to(model.device)
    torch.manual_seed(0)
    with torch.no_grad():
        ids = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            max_new_tokens=length,
            min_new_tokens=length,
            do_sample=True,
            pad_token_id=tokenizer.eos_token_id,
        )
    return ids, prompt_ids, prompt_mask


def prompt_dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": conversations(PROMPTS * 2)})


def slow_config(output_dir: str, **overrides):
    """The GRPOConfig of every slow run: STEPS steps, a sync every TAU, bf16 on CUDA, fp32 with `use_cpu` here."""
    from trl import GRPOConfig

    precision = {} if ON_CPU else dict(use_cpu=False, bf16=True, model_init_kwargs={"dtype": "bfloat16"})
    sync = dict(sync_ref_model=True, ref_model_sync_steps=TAU, max_steps=STEPS)
    sizes = dict(per_device_train_batch_size=BATCH, num_generations=GENERATIONS, learning_rate=LEARNING_RATE)
    kwargs = real_grpo_kwargs(output_dir, max_completion_length=COMPLETION_TOKENS, **sizes, **sync, **precision)
    return GRPOConfig(**{**kwargs, **overrides})


def whole_parameters(model) -> dict[str, torch.Tensor]:
    """Copies of every parameter of `model`, whole (ZeRO-3 partitions gathered), by name; a tied tensor once."""
    names = dict(model.named_parameters())
    return {name: tensor for name, tensor in full_state(model).items() if name in names}


def ulps(actual: torch.Tensor, expected: torch.Tensor) -> int:
    """Largest distance in units in the last place between two tensors of one float dtype (0: equal; ±0 count as
    equal). The bit patterns, read as sign and magnitude, are mapped onto one ordered integer line."""
    as_int, bits = {
        torch.float32: (torch.int32, 31),
        torch.bfloat16: (torch.int16, 15),
        torch.float16: (torch.int16, 15),
    }[actual.dtype]

    def ordered(t: torch.Tensor) -> torch.Tensor:
        i = t.view(as_int).long()
        return torch.where(i < 0, -(i & ((1 << bits) - 1)), i)

    return int((ordered(actual) - ordered(expected)).abs().max())


def differing(a: dict, b: dict) -> int:
    """How many tensors of `a` differ from the same-named tensors of `b` in at least one element."""
    assert a.keys() == b.keys()
    return sum(not torch.equal(a[name], b[name]) for name in a)


class SyncChecker(TrainerCallback):
    """Watches the reference at the end of every optimizer step and writes one record per step into `records`.

    Pass `checker.before` in `callbacks=` (it runs before the trainer's sync callback, which is added after the
    given ones) and add the checker itself with `trainer.add_callback` (it runs after the sync). `policy_tensors()`
    and `reference_tensors()` return whole (gathered) copies keyed by the same names. A step's record holds:

    - `untouched_in_step`: the reference at the end of the step, before the sync, is bitwise what the previous step
      (or the start) left: training never writes into it.
    - steps that are not sync steps: `untouched_by_sync`, the sync callback left it alone.
    - sync steps: `differing_before` (tensors in which policy and reference differed right before the sync, so a
      sync that does nothing cannot pass), `changed_by_formula` (tensors the formula changes) and `max_ulps` between
      the reference after the sync and round(lerp_fp32(reference, policy, α)) in the reference's dtype.
    """

    def __init__(self, policy_tensors, reference_tensors, alpha: float, tau: int = TAU):
        self.policy_tensors, self.reference_tensors = policy_tensors, reference_tensors
        self.alpha, self.tau = alpha, tau
        self.records: list[dict] = []
        self.before = _BeforeSync(self)
        self.initial_policy: dict | None = None
        self.initial_equal: bool | None = None
        self.moved: int | None = None
        self._reference = self._policy = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.initial_policy, self._reference = self.policy_tensors(), self.reference_tensors()
        self.initial_equal = differing(self.initial_policy, self._reference) == 0

    def _before_sync(self, step: int) -> None:
        reference = self.reference_tensors()
        untouched = differing(reference, self._reference) == 0
        record = {"step": step, "tensors": len(reference), "untouched_in_step": untouched}
        self.records.append(record)
        if step % self.tau == 0:
            self._policy = self.policy_tensors()
            record["differing_before"] = differing(self._policy, self._reference)

    def on_step_end(self, args, state, control, **kwargs):
        record, reference = self.records[-1], self.reference_tensors()
        assert record["step"] == state.global_step
        if state.global_step % self.tau:
            record["untouched_by_sync"] = differing(reference, self._reference) == 0
        else:
            expected = {
                name: torch.lerp(ref.float(), self._policy[name].float(), self.alpha).to(ref.dtype)
                for name, ref in self._reference.items()
            }
            record["changed_by_formula"] = differing(expected, self._reference)
            record["max_ulps"] = max(ulps(reference[name], expected[name]) for name in expected)
            self._policy = None
        self._reference = reference

    def on_train_end(self, args, state, control, **kwargs):
        self.moved = differing(self.policy_tensors(), self.initial_policy)
        self.initial_policy = None


class _BeforeSync(TrainerCallback):
    def __init__(self, checker: SyncChecker):
        self.checker = checker

    def on_step_end(self, args, state, control, **kwargs):
        self.checker._before_sync(state.global_step)


def check_records(checker_or_result, alpha: float, steps: int = STEPS) -> None:
    """Assert what a SyncChecker saw (the checker or the dict `summary` made of it) over a run of `steps` steps."""
    result = summary(checker_or_result) if isinstance(checker_or_result, SyncChecker) else checker_or_result
    records, tensors = result["records"], result["records"][0]["tensors"]
    assert result["initial_equal"]  # the reference starts as a bitwise copy of the policy
    assert result["moved"] >= MIN_MOVED * tensors, result["moved"]  # training moved the policy
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    bitwise = ON_CPU or alpha == 1.0  # CUDA kernels may round the soft mix differently: 1 ulp of slack there
    for r in records:
        assert r["untouched_in_step"], r  # only the sync writes into the reference
        if r["step"] % TAU:
            assert r["untouched_by_sync"], r  # no sync between sync steps
        else:
            assert r["differing_before"] >= MIN_MOVED * tensors, r  # a sync that does nothing would fail below
            assert r["changed_by_formula"] >= MIN_MOVED * tensors, r
            assert r["max_ulps"] <= (0 if bitwise else 1), r  # reference == round(lerp_fp32(ref, policy, α))


def summary(checker: SyncChecker) -> dict:
    return {"records": checker.records, "initial_equal": checker.initial_equal, "moved": checker.moved}


def tied(model) -> bool:
    """Are the input embeddings and the LM head one tensor?"""
    return model.get_input_embeddings().weight is model.get_output_embeddings().weight


def zero3_run(model_dir: str, out_dir: str) -> dict:
    """GRPO under DeepSpeed ZeRO-3 on one process, SHORT_STEPS steps, α = 1, checked by a SyncChecker on gathered
    tensors."""
    from trl import GRPOTrainer
    from trl.reference.layouts import partitioning

    ds_config = {
        "zero_optimization": {"stage": 3},
        "bf16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
    }
    holder = {}
    unwrap = lambda model: holder["t"].accelerator.unwrap_model(model)  # noqa: E731
    checker = SyncChecker(
        lambda: whole_parameters(unwrap(holder["t"].model_wrapped)),
        lambda: whole_parameters(unwrap(holder["t"].ref_model)),
        1.0,
    )
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=length_reward,
        args=slow_config(
            os.path.join(out_dir, "run"), deepspeed=ds_config, ref_model_mixup_alpha=1.0, max_steps=SHORT_STEPS
        ),
        train_dataset=prompt_dataset(),
        callbacks=[checker.before],
    )
    holder["t"] = trainer
    trainer.add_callback(checker)
    trainer.train()
    policy, reference = unwrap(trainer.model_wrapped), unwrap(trainer.ref_model)
    pol, ref = dict(policy.named_parameters()), dict(reference.named_parameters())
    pairing = trainer.sync_callback._sync
    same_partitioning = pol.keys() == ref.keys() and all(partitioning(pol[n]) == partitioning(ref[n]) for n in ref)
    policy_state, reference_state = whole_parameters(policy), whole_parameters(reference)
    return {
        **summary(checker),
        "engine": type(trainer.model_wrapped).__name__,
        "policy_partitioned": all(hasattr(p, "ds_id") for p in pol.values()),
        "reference_partitioned": all(hasattr(p, "ds_id") for p in ref.values()),
        "same_partitioning": same_partitioning,
        "local_pairs": len(pairing.local) if pairing is not None else None,  # None: no sync ever paired the models
        "fallback_pairs": len(pairing.fallback) if pairing is not None else None,
        "num_syncs": trainer.sync_callback.num_syncs,
        "tied": [tied(policy), tied(reference)],
        "final_differing": differing(policy_state, reference_state),
        "final_tensors": len(reference_state),
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "frac_reward_zero_std": [h["frac_reward_zero_std"] for h in trainer.state.log_history if "loss" in h],
    }


if __name__ == "__main__":
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    result = zero3_run(model_dir, out_dir)
    with open(os.path.join(out_dir, "zero3.json"), "w") as f:
        json.dump(result, f)
