# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""GRPOTrainer end to end on a tiny random Qwen2 (CPU, a few steps): reference model, reward contract, log-probs,
metrics, num_iterations, errors. Reference *syncing* during training is covered in test_callbacks.py."""

import statistics

import pytest
import torch
from conftest import tiny_grpo_kwargs
from transformers import AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback, TrainerState

from trl import GRPOConfig, GRPOTrainer
from trl.tasks import closeness_reward, make_arithmetic_dataset
from trl.trainer.grpo_inputs import shuffle_seed


def first_token_reward(completion_ids, **kwargs):
    """Varies within groups even for a random model (the arithmetic rewards are all 0 there)."""
    return [float(ids[0] % 5) for ids in completion_ids]


def last_log_with(trainer, key):
    return [entry for entry in trainer.state.log_history if key in entry][-1]


def shuffle_order(trainer, rows, step=0):
    """The permutation the trainer applied to the generation batch made at micro-step `step` (one process)."""
    return torch.randperm(rows, generator=torch.Generator().manual_seed(shuffle_seed(trainer.args.seed, step, 0)))


def unshuffled(trainer, key, step=0):
    """`key` of the buffered micro-batches, put back in generation order."""
    shuffled = torch.cat([chunk[key] for chunk in trainer._buffered_inputs])
    restored = torch.empty_like(shuffled)
    restored[shuffle_order(trainer, shuffled.size(0), step)] = shuffled
    return restored


class Recording:
    """A reward function that records every call and returns `fn(**kwargs)`."""

    def __init__(self, name, fn=first_token_reward):
        self.__name__ = name
        self.fn = fn
        self.calls = []

    def __call__(self, **kwargs):
        values = self.fn(**kwargs)
        self.calls.append({**kwargs, "returned": values})
        return values


# ---------------------------------------------------------------- a soft-sync run shared by several tests


@pytest.fixture(scope="module")
def soft_sync_run(tiny_lm_path, _arithmetic_dataset, tmp_path_factory):
    overrides = dict(
        max_steps=4, sync_ref_model=True, ref_model_sync_steps=2, ref_model_mixup_alpha=0.5, reward_weights=[1.0, 0.5]
    )
    args = GRPOConfig(**{**tiny_grpo_kwargs(str(tmp_path_factory.mktemp("soft"))), **overrides})
    trainer = GRPOTrainer(
        tiny_lm_path, [first_token_reward, closeness_reward], args=args, train_dataset=_arithmetic_dataset
    )
    trainer.train()
    return trainer


EXPECTED_METRICS = [
    "reward",
    "reward_std",
    "rewards/first_token_reward/mean",
    "rewards/first_token_reward/std",
    "rewards/closeness_reward/mean",
    "rewards/closeness_reward/std",
    "kl",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "frac_reward_zero_std",
    "ref_model/num_syncs",
    "num_tokens",
    "loss",
    "grad_norm",
]


def test_logged_metrics(soft_sync_run):
    logs = [entry for entry in soft_sync_run.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in logs] == [1, 2, 3, 4]
    for entry in logs:
        missing = [key for key in EXPECTED_METRICS if key not in entry]
        assert not missing, (entry["step"], missing)
        assert entry["ref_model/num_syncs"] == entry["step"] // 2
        assert (
            1
            <= entry["completions/min_length"]
            <= entry["completions/mean_length"]
            <= entry["completions/max_length"]
            <= 4
        )
        assert 0.0 <= entry["completions/clipped_ratio"] <= 1.0
        assert 0.0 <= entry["frac_reward_zero_std"] <= 1.0
        # One generation per optimizer step, all rewards valid: reward = Σ w_f · mean_f.
        weighted = entry["rewards/first_token_reward/mean"] + 0.5 * entry["rewards/closeness_reward/mean"]
        assert entry["reward"] == pytest.approx(weighted, rel=1e-5, abs=1e-6)
        # On-policy (num_iterations 1, steps_per_generation == gradient_accumulation_steps): the ratio is exactly 1.
        assert entry["clip_ratio/low_mean"] == entry["clip_ratio/high_mean"] == entry["clip_ratio/region_mean"] == 0.0
        assert entry["kl"] >= 0.0
    # Step 1: the reference is a copy of the policy that generated and is trained (no update yet) → KL exactly 0.
    assert logs[0]["kl"] == 0.0
    assert logs[1]["kl"] > 0.0  # second generation comes from the updated policy
    assert soft_sync_run.sync_callback.num_syncs == 2


def test_reference_is_frozen_and_outside_the_optimizer(soft_sync_run):
    trainer = soft_sync_run
    ref_params = list(trainer.ref_model.parameters())
    assert ref_params and all(not p.requires_grad for p in ref_params)
    assert all(p.grad is None for p in ref_params)
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    optimized_storage = {p.data_ptr() for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimized  # the policy is in there
    assert not any(id(p) in optimized for p in ref_params)
    assert not any(p.data_ptr() in optimized_storage for p in ref_params)  # no shared storage with the policy
    assert trainer.ref_model is not trainer.model


def test_on_policy_batches_carry_no_old_logps(soft_sync_run):
    chunk = soft_sync_run._buffered_inputs[0]
    assert "old_per_token_logps" not in chunk
    assert chunk["ref_per_token_logps"].shape == chunk["completion_ids"].shape


def test_beta_zero_loads_no_reference_and_logs_no_kl(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    trainer = GRPOTrainer(
        tiny_lm_path,
        first_token_reward,
        args=GRPOConfig(**{**grpo_kwargs, "beta": 0.0}),
        train_dataset=arithmetic_dataset,
    )
    assert trainer.ref_model is None and trainer.sync_callback is None
    trainer.train()
    assert "kl" not in trainer.state.log_history[0]
    assert "ref_per_token_logps" not in trainer._buffered_inputs[0]


def test_sync_ref_model_with_beta_zero_raises(grpo_kwargs):
    with pytest.raises(
        ValueError,
        match="`sync_ref_model=True` while `beta=0.0` has nothing to sync: beta=0.0 loads no reference model",
    ):
        GRPOConfig(**{**grpo_kwargs, "beta": 0.0, "sync_ref_model": True})


def test_peft_sync_mixes_a_frozen_reference_adapter(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """PEFT: the reference is base + a frozen "ref" adapter; a hard sync copies the policy adapter bit for bit."""
    from peft import LoraConfig

    peft_config = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = GRPOConfig(
        **{
            **grpo_kwargs,
            "max_steps": 3,
            "sync_ref_model": True,
            "ref_model_sync_steps": 2,
            "ref_model_mixup_alpha": 1.0,
        }
    )
    trainer = GRPOTrainer(
        tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset, peft_config=peft_config
    )
    assert trainer.ref_model is None and trainer.reference.adapter == "ref"

    def adapter(name):
        return {
            k.replace(f".{name}.", ".<a>."): p.detach().clone()
            for k, p in trainer.model.named_parameters()
            if name in k.split(".")
        }

    policy0, ref0 = adapter("default"), adapter("ref")
    assert policy0.keys() == ref0.keys() and len(ref0) == 8  # 2 layers × (q, v) × (A, B)
    assert all(torch.equal(policy0[k], ref0[k]) for k in ref0)
    ref_params = [p for k, p in trainer.model.named_parameters() if "ref" in k.split(".")]
    assert not any(p.requires_grad for p in ref_params)
    records = {}

    class Recorder(TrainerCallback):  # added last: runs after the sync in on_step_end
        def on_step_end(self, args, state, control, **kwargs):
            records[state.global_step] = (adapter("default"), adapter("ref"))

    trainer.add_callback(Recorder())
    trainer.train()
    policy1, ref1 = records[1]
    assert all(torch.equal(ref1[k], ref0[k]) for k in ref0)  # step 1: no sync
    assert not all(torch.equal(policy1[k], ref1[k]) for k in ref1)
    policy2, ref2 = records[2]
    assert all(torch.equal(policy2[k], ref2[k]) for k in ref2)  # step 2: bitwise copy of the policy adapter
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert not any(id(p) in optimized for p in ref_params)
    policy3, ref3 = adapter("default"), adapter("ref")
    assert trainer.sync_callback.num_syncs == 1 and trainer.sync_callback.last_sync_step == 2
    # Synced at step 2, then the policy adapter moved on at step 3 while the reference stayed.
    assert not all(torch.equal(policy3[k], ref3[k]) for k in ref3)
    assert all(torch.equal(ref3[k], ref2[k]) for k in ref3)


def test_reward_weights_length_mismatch_raises(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    with pytest.raises(
        ValueError, match=r"Number of reward weights \(3\) must match number of reward functions \(2\)"
    ):
        GRPOTrainer(
            tiny_lm_path,
            [first_token_reward, closeness_reward],
            args=GRPOConfig(**grpo_kwargs, reward_weights=[1.0, 1.0, 1.0]),
            train_dataset=arithmetic_dataset,
        )


def test_dataset_without_prompt_column_raises(tiny_lm_path, grpo_kwargs):
    dataset = make_arithmetic_dataset(8).rename_column("prompt", "question")
    with pytest.raises(ValueError, match=r"train_dataset needs a 'prompt' column; it has \['question', 'answer'\]"):
        GRPOTrainer(tiny_lm_path, first_token_reward, args=GRPOConfig(**grpo_kwargs), train_dataset=dataset)


# ---------------------------------------------------------------- the reward-function contract


def test_reward_function_receives_aligned_columns(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    dataset = arithmetic_dataset.add_column("idx", list(range(len(arithmetic_dataset))))
    reward = Recording(
        "idx_reward",
        lambda completion_ids, idx, **kw: [float(i) + (ids[0] % 3) for i, ids in zip(idx, completion_ids)],
    )
    trainer = GRPOTrainer(tiny_lm_path, reward, args=GRPOConfig(**grpo_kwargs), train_dataset=dataset)
    trainer.train()
    assert len(reward.calls) == 1  # one generation batch per optimizer step (steps_per_generation = 2 = grad. acc.)
    call = reward.calls[0]
    n = 8  # per_device 4 × steps_per_generation 2
    for key in ("prompts", "completions", "completion_ids", "answer", "idx"):
        assert len(call[key]) == n, key
    assert isinstance(call["trainer_state"], TrainerState)
    idx = call["idx"]
    for g in range(n // 4):  # each prompt repeated num_generations = 4 times in a row
        assert len(set(idx[4 * g : 4 * g + 4])) == 1
    assert len(set(idx)) == 2
    for i in range(n):
        row = dataset[idx[i]]
        assert call["prompts"][i] == row["prompt"]
        assert call["answer"][i] == row["answer"]
    tokenizer = trainer.processing_class
    for text, ids in zip(call["completions"], call["completion_ids"]):
        assert isinstance(text, str)
        # cut at the first stop token (kept), or at max_completion_length = 4
        assert not set(ids[:-1]) & set(trainer.eos_token_ids)
        assert len(ids) == 4 or ids[-1] in trainer.eos_token_ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    # The numbers that come back are what gets logged.
    log = last_log_with(trainer, "rewards/idx_reward/mean")
    assert log["rewards/idx_reward/mean"] == pytest.approx(statistics.fmean(call["returned"]), rel=1e-6)
    assert log["rewards/idx_reward/std"] == pytest.approx(statistics.stdev(call["returned"]), rel=1e-5)


def test_reward_function_wrong_length_raises_with_its_name(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    def short_reward(completions, **kwargs):
        return [0.0] * (len(completions) - 1)

    trainer = GRPOTrainer(
        tiny_lm_path,
        [first_token_reward, short_reward],
        args=GRPOConfig(**grpo_kwargs),
        train_dataset=arithmetic_dataset,
    )
    with pytest.raises(ValueError, match="Reward function 'short_reward' returned 7 rewards, but 8 were expected"):
        trainer.train()


def test_none_rewards_are_left_out_of_the_group(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    def sometimes_none(completion_ids, **kwargs):
        return [None if i % 4 == 1 else float(ids[0] % 5) for i, ids in enumerate(completion_ids)]

    reward = Recording("sometimes_none", sometimes_none)
    trainer = GRPOTrainer(tiny_lm_path, reward, args=GRPOConfig(**grpo_kwargs), train_dataset=arithmetic_dataset)
    trainer.train()
    values = reward.calls[0]["returned"]
    advantages = unshuffled(trainer, "advantages").tolist()
    assert len(advantages) == len(values) == 8
    for g in range(2):
        group = values[4 * g : 4 * g + 4]
        valid = [v for v in group if v is not None]
        mean, std = statistics.fmean(valid), statistics.stdev(valid)
        for i, v in enumerate(group):
            if v is None:
                assert advantages[4 * g + i] == 0.0
            else:
                assert advantages[4 * g + i] == pytest.approx((v - mean) / (std + 1e-4), rel=1e-5, abs=1e-6)
    log = last_log_with(trainer, "rewards/sometimes_none/mean")
    assert log["rewards/sometimes_none/mean"] == pytest.approx(
        statistics.fmean([v for v in values if v is not None]), rel=1e-6
    )


def test_conversational_prompts_and_completions_are_messages(tiny_lm_path, grpo_kwargs):
    dataset = make_arithmetic_dataset(16, conversational=True)
    dataset = dataset.add_column("idx", list(range(len(dataset))))
    reward = Recording("chat_reward")
    trainer = GRPOTrainer(tiny_lm_path, reward, args=GRPOConfig(**grpo_kwargs), train_dataset=dataset)
    trainer.train()
    call = reward.calls[0]
    tokenizer = trainer.processing_class
    assert len(call["prompts"]) == len(call["completions"]) == 8
    for prompt, completion, ids, idx in zip(call["prompts"], call["completions"], call["completion_ids"], call["idx"]):
        assert prompt == dataset[idx]["prompt"]  # the messages themselves, not the rendered chat template
        assert isinstance(prompt, list) and prompt == [{"role": "user", "content": prompt[0]["content"]}]
        assert isinstance(completion, list) and len(completion) == 1
        assert completion == [{"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}]
    # The policy was prompted with the chat template (generation prompt included).
    rendered = tokenizer.apply_chat_template(call["prompts"][0], tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n") and call["prompts"][0][0]["content"] in rendered
    prompt_ids, prompt_mask = unshuffled(trainer, "prompt_ids")[0], unshuffled(trainer, "prompt_mask")[0]
    expected_ids = tokenizer(rendered, add_special_tokens=False)["input_ids"][-grpo_kwargs["max_prompt_length"] :]
    assert prompt_ids[prompt_mask.bool()].tolist() == expected_ids  # the last max_prompt_length tokens


def test_reward_model_given_as_a_path(tiny_lm_path, tiny_rm_path, arithmetic_dataset, grpo_kwargs):
    recorder = Recording("recorder", lambda completions, **kw: [0.0] * len(completions))
    trainer = GRPOTrainer(
        tiny_lm_path, [tiny_rm_path, recorder], args=GRPOConfig(**grpo_kwargs), train_dataset=arithmetic_dataset
    )
    assert trainer.reward_func_names == ["tiny-rm", "recorder"]
    trainer.train()
    log = last_log_with(trainer, "rewards/tiny-rm/mean")
    assert "rewards/tiny-rm/std" in log
    # Recompute the reward model's scores on the same texts: first logit of prompt + completion.
    call = recorder.calls[0]
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_rm_path).eval()
    rm_tokenizer = AutoTokenizer.from_pretrained(tiny_rm_path)
    texts = [p + c for p, c in zip(call["prompts"], call["completions"])]
    encoded = rm_tokenizer(
        text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False
    )
    with torch.no_grad():
        scores = rm(**encoded).logits[:, 0]
    assert log["rewards/tiny-rm/mean"] == pytest.approx(scores.mean().item(), abs=1e-5)
    assert all(not p.requires_grad for p in trainer.reward_funcs[0].parameters())


# ---------------------------------------------------------------- log-probs


def test_per_token_logps_do_not_depend_on_left_padding(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    trainer = GRPOTrainer(
        tiny_lm_path, first_token_reward, args=GRPOConfig(**grpo_kwargs), train_dataset=arithmetic_dataset
    )
    tokenizer, pad = trainer.processing_class, trainer.processing_class.pad_token_id
    prompts = ["3+4=", "The quick brown fox jumps over 12+5="]
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    assert len(prompt_ids[0]) < len(prompt_ids[1])
    completion = torch.randint(3, len(tokenizer) - 3, (2, 5))

    def batch(extra):
        width = max(len(p) for p in prompt_ids) + extra
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids])
        mask = (
            torch.arange(width).unsqueeze(0) >= (width - torch.tensor([len(p) for p in prompt_ids])).unsqueeze(1)
        ).long()
        return torch.cat([ids, completion], 1), torch.cat([mask, torch.ones_like(completion)], 1)

    with torch.no_grad():
        base = trainer._get_per_token_logps_and_entropies(trainer.model, *batch(0), logits_to_keep=5)[0]
        padded = trainer._get_per_token_logps_and_entropies(trainer.model, *batch(3), logits_to_keep=5)[0]
        alone = trainer._get_per_token_logps_and_entropies(
            trainer.model, *(t[:1, -(len(prompt_ids[0]) + 5) :] for t in batch(0)), logits_to_keep=5
        )[0]
        one_by_one = trainer._get_per_token_logps_and_entropies(
            trainer.model, *batch(3), logits_to_keep=5, batch_size=1
        )[0]
    assert base.shape == (2, 5) and torch.isfinite(base).all() and (base < 0).all()
    assert (base - padded).abs().max().item() < 1e-5
    assert (base[:1] - alone).abs().max().item() < 1e-5  # the short prompt with no padding at all
    assert (padded - one_by_one).abs().max().item() < 1e-5
    # Cross-check one token against a plain forward pass without any padding.
    ids = torch.tensor([prompt_ids[1]])
    full = torch.cat([ids, completion[1:]], 1)
    with torch.no_grad():
        logits = trainer.model(input_ids=full).logits[0, -6:-1] / trainer.temperature
    expected = torch.log_softmax(logits.float(), -1).gather(-1, completion[1].unsqueeze(-1)).squeeze(-1)
    assert (base[1] - expected).abs().max().item() < 1e-5


# ---------------------------------------------------------------- num_iterations > 1 and stale generation batches


def test_num_iterations_two_uses_old_logps(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    args = GRPOConfig(**{**grpo_kwargs, "max_steps": 2, "num_iterations": 2})
    trainer = GRPOTrainer(tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset)
    generations, micro_steps = [], []
    generate, compute_loss = trainer._generate_and_score_completions, trainer.compute_loss

    def logps_now(inputs):
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        with torch.no_grad():
            return trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, mask, inputs["completion_ids"].size(1), args.per_device_train_batch_size
            )[0]

    def recording_generate(inputs):
        output = generate(inputs)
        generations.append((output, logps_now(output)))
        return output

    def recording_compute_loss(model, inputs, **kwargs):
        micro_steps.append((inputs["old_per_token_logps"], logps_now(inputs), inputs["completion_mask"]))
        return compute_loss(model, inputs, **kwargs)

    trainer._generate_and_score_completions = recording_generate
    trainer.compute_loss = recording_compute_loss
    trainer.train()

    # 2 optimizer steps × 2 micro-batches = 4 micro-steps, all from ONE generation batch (2 iterations over it).
    assert len(generations) == 1 and len(micro_steps) == 4
    output, logps_at_generation = generations[0]
    old, mask = output["old_per_token_logps"], output["completion_mask"]
    assert old.shape == output["completion_ids"].shape == (8, output["completion_ids"].size(1))
    assert torch.isfinite(old).all() and (old[mask.bool()] < 0).all()
    torch.testing.assert_close(old, logps_at_generation, rtol=0, atol=1e-6)
    # Iteration 1 (optimizer step 1): the policy has not moved yet, ratio ≈ 1. Iteration 2: it has moved.
    for k, (old_chunk, now, chunk_mask) in enumerate(micro_steps):
        diff = ((now - old_chunk).abs() * chunk_mask).max().item()
        if k < 2:
            assert diff < 1e-5, (k, diff)
        else:
            assert diff > 1e-4, (k, diff)
    old = old[shuffle_order(trainer, 8)]  # micro-batches are slices of the shuffled generation batch
    torch.testing.assert_close(micro_steps[2][0], old[:4], rtol=0, atol=0)
    torch.testing.assert_close(micro_steps[3][0], old[4:], rtol=0, atol=0)
    # DAPO normaliser: active tokens of the generation batch / steps_per_generation.
    assert output["num_items_in_batch"].item() == mask.sum().item() / 2


@pytest.mark.parametrize(
    "precision",
    ["fp32", "bf16 autocast", "bf16 weights", "bf16 autocast, checkpointing", "bf16, accelerator defaults"],
)
def test_first_iteration_ratio_is_exactly_one(tiny_lm_path, grpo_kwargs, precision):
    # π_θ_old's log-probs are computed on the rows of each micro-batch, in its order and with the training pass's
    # layout (prompts long enough for shared-prefix packed scoring), so the first iteration's ratio is 1 to the bit,
    # in bf16 as in fp32. When the old log-probs came from per_device_train_batch_size rows of the unshuffled
    # generation batch, the first iteration's log-probs differed from them by up to 4.8e-7 (fp32), 1.5e-5 (bf16
    # autocast) and 1.9e-5 (bf16 weights) here.
    from datasets import Dataset

    prompts = [" + ".join(str((7 * i + j) % 10) for j in range(12)) + " =" for i in range(16)]
    precisions = {
        "fp32": {},
        "bf16 autocast": {"bf16": True},
        "bf16 weights": {"model_init_kwargs": {"dtype": "bfloat16"}},
        "bf16 autocast, checkpointing": {"bf16": True, "gradient_checkpointing": True},  # TRL's defaults
        "bf16, accelerator defaults": {"bf16": True, "shared_prefix": False, "chunked_logprobs": False},
    }
    overrides = {"max_prompt_length": None, "max_completion_length": 6, "num_iterations": 2, **precisions[precision]}
    args = GRPOConfig(**{**grpo_kwargs, **overrides})
    trainer = GRPOTrainer(
        tiny_lm_path, first_token_reward, args=args, train_dataset=Dataset.from_dict({"prompt": prompts})
    )
    assert args.shared_prefix == args.chunked_logprobs == ("accelerator" not in precision)  # the CPU defaults
    passes, score = [], trainer._get_per_token_logps_and_entropies

    def recording_score(model, *pass_args, compute_entropy=False, **kwargs):
        out = score(model, *pass_args, compute_entropy=compute_entropy, **kwargs)
        if compute_entropy:  # the training forward
            passes.append(out[0].detach())
        return out

    old, compute_loss = [], trainer.compute_loss

    def recording_compute_loss(model, inputs, **kwargs):
        old.append(inputs["old_per_token_logps"])
        return compute_loss(model, inputs, **kwargs)

    trainer._get_per_token_logps_and_entropies = recording_score
    trainer.compute_loss = recording_compute_loss
    trainer.train()
    assert len(passes) == len(old) == 2  # both micro-batches of the first iteration, before the first update
    for new, before in zip(passes, old):
        assert torch.equal(new, before)


def test_generation_batch_spanning_optimizer_steps_gets_old_logps(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    args = GRPOConfig(**{**grpo_kwargs, "gradient_accumulation_steps": 1, "steps_per_generation": 2})
    trainer = GRPOTrainer(tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset)
    trainer.model.train()
    rows = [arithmetic_dataset[i] for i in (0, 1) for _ in range(4)]
    output = trainer._generate_and_score_completions(rows)
    assert output["old_per_token_logps"].shape == output["completion_ids"].shape
    assert output["num_items_in_batch"].item() == output["completion_mask"].sum().item() / 2
    assert output["advantages"].shape == (8,)


# ---------------------------------------------------------------- sampling seeds, evaluation, generation settings


def _recording_generation(trainer):
    """Wrap `generate` to record every batch of completion ids it returns."""
    batches, generate = [], trainer._generate_and_score_completions

    def recording(inputs):
        output = generate(inputs)
        batches.append((trainer.model.training, output["completion_ids"].clone()))
        return output

    trainer._generate_and_score_completions = recording
    return batches


def test_each_generation_batch_gets_its_own_sampling_noise(tiny_lm_path, grpo_kwargs):
    from datasets import Dataset

    same_prompt = Dataset.from_dict({"prompt": ["1+1="] * 64})
    args = GRPOConfig(**{**grpo_kwargs, "gradient_accumulation_steps": 1, "max_steps": 3, "learning_rate": 1e-12})
    trainer = GRPOTrainer(
        tiny_lm_path,
        first_token_reward,
        args=args,
        train_dataset=same_prompt,
        eval_dataset=same_prompt.select(range(8)),
    )
    batches = _recording_generation(trainer)
    trainer.train()
    trainer.evaluate()
    train = [ids for training, ids in batches if training]
    evals = [ids for training, ids in batches if not training]
    assert len(train) == 3 and len(evals) == 4  # 8 eval prompts × 4 generations / 8 per eval batch
    # Same prompts, (practically) the same policy: only the sampling noise can tell the batches apart.
    everything = train + evals
    for i in range(len(everything)):
        for j in range(i + 1, len(everything)):
            assert not torch.equal(everything[i], everything[j]), (i, j)


def test_evaluate_reports_eval_metrics(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    args = GRPOConfig(**{**grpo_kwargs, "per_device_eval_batch_size": 8})
    trainer = GRPOTrainer(
        tiny_lm_path,
        first_token_reward,
        args=args,
        train_dataset=arithmetic_dataset,
        eval_dataset=arithmetic_dataset.select(range(4)),
    )
    assert torch.isfinite(torch.tensor(trainer.evaluate()["eval_loss"]))
    logged = trainer.state.log_history[-1]  # as in TRL, the GRPO metrics go to the logs
    assert logged["eval_kl"] == 0.0  # policy == reference before any training
    assert 0.0 <= logged["eval_reward"] <= 4.0  # first_token_reward is in {0, ..., 4}
    assert "reward" not in logged and "eval_completions/mean_length" in logged


def test_eval_batch_not_divisible_by_num_generations_raises(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    args = GRPOConfig(**{**grpo_kwargs, "per_device_eval_batch_size": 6})
    with pytest.raises(
        ValueError,
        match=r"global eval batch \(6 × 1 processes\) must be divisible by the number of generations used for "
        r"evaluation \(4\) \(num_generations_eval, ",
    ):
        GRPOTrainer(
            tiny_lm_path,
            first_token_reward,
            args=args,
            train_dataset=arithmetic_dataset,
            eval_dataset=arithmetic_dataset,
        )


def test_generation_kwargs_override_the_named_fields(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    args = GRPOConfig(
        **{
            **grpo_kwargs,
            "temperature": 1.0,
            "generation_kwargs": {"max_new_tokens": 2, "top_p": 0.9, "temperature": 0.7},
        }
    )
    trainer = GRPOTrainer(tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset)
    config = trainer.generation_config
    assert (config.max_new_tokens, config.top_p, config.temperature) == (2, 0.9, 0.7)
    assert trainer.temperature == 0.7  # the training log-probs use the sampling temperature
    batches = _recording_generation(trainer)
    trainer.train()
    assert all(ids.size(1) <= 2 for _, ids in batches)


def test_mask_truncated_completions_leaves_only_terminated_ones(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    args = GRPOConfig(**{**grpo_kwargs, "mask_truncated_completions": True})
    trainer = GRPOTrainer(tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset)
    eos = trainer.processing_class.eos_token_id
    completions = torch.tensor([[5, eos, eos, eos], [5, 6, 7, 8], [eos, eos, eos, eos], [9, 9, eos, eos]] * 2)

    def fixed_generate(input_ids, attention_mask, generation_config, **kwargs):  # kwargs: the shared-prefix cache
        return torch.cat([input_ids, completions], dim=1)

    trainer.model.generate = fixed_generate
    trainer.model.train()
    output = trainer._generate_and_score_completions([arithmetic_dataset[i] for i in (0, 1) for _ in range(4)])
    expected = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]] * 2)
    assert torch.equal(output["completion_mask"], expected)
    assert output["num_items_in_batch"].item() == expected.sum().item() / 2  # steps_per_generation = 2


def test_clip_ratio_is_logged_when_the_policy_moves_off_the_data(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    args = GRPOConfig(
        **{
            **grpo_kwargs,
            "max_steps": 2,
            "num_iterations": 2,
            "gradient_accumulation_steps": 1,
            "steps_per_generation": 1,
            "learning_rate": 5e-2,
            "logging_steps": 1,
        }
    )
    trainer = GRPOTrainer(tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "clip_ratio/region_mean" in h]
    assert logs[0]["clip_ratio/region_mean"] == 0.0  # first pass: on-policy, ratio = 1
    assert logs[1]["clip_ratio/region_mean"] > 0.0  # second pass over the same batch: the ratio left [0.8, 1.2]
    assert logs[1]["clip_ratio/region_mean"] == pytest.approx(
        logs[1]["clip_ratio/low_mean"] + logs[1]["clip_ratio/high_mean"]
    )
