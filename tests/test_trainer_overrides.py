# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Subclasses written for TRL 1.16's GRPOTrainer: every overridable method of the table in docs/source/grpo_trainer.md
is called by the trainer's own steps (an override takes effect), the config attributes TRL keeps on the trainer read
the config, and overriding a TRL method this trainer never calls is an error, not a silent no-op."""

import re
from collections import Counter

import pytest
import torch

from trl import GRPOConfig, GRPOTrainer
from trl.trainer.trl_compat import CONFIG_ATTRIBUTES, DERIVED_ATTRIBUTES, UNCALLED_TRL_METHODS


def first_token_reward(completion_ids, **kwargs):
    return [float(ids[0] % 5) for ids in completion_ids]


# The methods of the docs' table "Overridable trainer methods", each with TRL 1.16's signature.
OVERRIDABLE = (
    "_prepare_inputs",
    "_generate_and_score_completions",
    "_generate",
    "_tokenize_prompts",
    "_generate_single_turn",
    "_calculate_rewards",
    "_get_per_token_logps_and_entropies",
    "compute_loss",
    "_compute_loss",
    "get_high_entropy_mask",
    "get_off_policy_mask",
    "_log_completion_extra",
    "_log_metric",
)


class CountingTrainer(GRPOTrainer):
    """Every overridable method counted, then delegated to GRPOTrainer's, with TRL 1.16's arguments."""

    calls: Counter

    def _prepare_inputs(self, generation_batch):
        self.calls["_prepare_inputs"] += 1
        return super()._prepare_inputs(generation_batch)

    def _generate_and_score_completions(self, inputs):
        self.calls["_generate_and_score_completions"] += 1
        return super()._generate_and_score_completions(inputs)

    def _generate(self, prompts):
        self.calls["_generate"] += 1
        return super()._generate(prompts)

    def _tokenize_prompts(self, prompts):
        self.calls["_tokenize_prompts"] += 1
        return super()._tokenize_prompts(prompts)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations):
        self.calls["_generate_single_turn"] += 1
        return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self.calls["_calculate_rewards"] += 1
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        self.calls["_get_per_token_logps_and_entropies"] += 1
        return super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.calls["compute_loss"] += 1
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _compute_loss(self, model, inputs):
        self.calls["_compute_loss"] += 1
        return super()._compute_loss(model, inputs)

    def get_high_entropy_mask(self, entropies, mask, threshold):
        self.calls["get_high_entropy_mask"] += 1
        return super().get_high_entropy_mask(entropies, mask, threshold)

    @staticmethod
    def get_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold):
        CountingTrainer.static_calls["get_off_policy_mask"] += 1
        return GRPOTrainer.get_off_policy_mask(
            advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold
        )

    def _log_completion_extra(self, column, values):
        self.calls["_log_completion_extra"] += 1
        return super()._log_completion_extra(column, values)

    def _log_metric(self, name, value):
        self.calls["_log_metric"] += 1
        return super()._log_metric(name, value)


def logging_reward(completion_ids, log_extra, log_metric, **kwargs):
    log_extra("first_id", [ids[0] for ids in completion_ids])
    log_metric("mean_first_id", sum(ids[0] for ids in completion_ids) / len(completion_ids))
    return first_token_reward(completion_ids)


def test_every_overridable_method_is_called(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    assert set(OVERRIDABLE) == {name for name in vars(CountingTrainer) if not name.startswith("__")} - {
        "calls",
        "static_calls",
    }
    args = GRPOConfig(
        **{**grpo_kwargs, "top_entropy_quantile": 0.5, "off_policy_mask_threshold": 0.5, "log_completions": True}
    )
    CountingTrainer.static_calls = Counter()
    trainer = CountingTrainer(tiny_lm_path, logging_reward, args=args, train_dataset=arithmetic_dataset)
    trainer.calls = Counter()
    trainer.train()
    calls = trainer.calls + CountingTrainer.static_calls
    assert set(calls) == set(OVERRIDABLE)
    # 1 optimizer step = 2 micro-batches of one generation batch: generated once, 2 losses
    assert calls["_generate"] == calls["_calculate_rewards"] == 1
    assert calls["_prepare_inputs"] == calls["compute_loss"] == calls["_compute_loss"] == 2
    assert calls["get_high_entropy_mask"] == calls["get_off_policy_mask"] == 2
    assert calls["_get_per_token_logps_and_entropies"] == 2 + 2  # a reference pass per micro-batch, one per loss
    assert trainer.state.log_history[0]["mean_first_id"] >= 0


class FixedCompletionTrainer(GRPOTrainer):
    """`_generate` replaced: every completion is the ids [7, 8] (no stop token: truncated)."""

    def _generate(self, prompts):
        prompt_ids, _, _ = self._tokenize_prompts(prompts)
        completion_ids = [[7, 8] for _ in prompts]
        completions = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        return prompt_ids, completion_ids, None, completions, None, {}, None, []


def test_generate_override_is_what_the_loss_sees(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    args = GRPOConfig(**{**grpo_kwargs, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1})
    trainer = FixedCompletionTrainer(tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset)
    trainer.model.train()
    batch = trainer._generate_and_score_completions([arithmetic_dataset[i] for i in (0, 0, 0, 0)])
    assert batch["completion_ids"].tolist() == [[7, 8]] * 4
    assert batch["completion_mask"].tolist() == [[1, 1]] * 4
    assert batch["advantages"].tolist() == [0.0] * 4  # equal rewards within the group


class NoEntropyTokensTrainer(GRPOTrainer):
    def get_high_entropy_mask(self, entropies, mask, threshold):
        return torch.zeros_like(mask, dtype=torch.bool)


class DropAllTrainer(GRPOTrainer):
    @staticmethod
    def get_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold):
        return torch.zeros_like(advantages, dtype=per_token_logps.dtype)


@pytest.mark.parametrize(
    "trainer_class, setting",
    [(NoEntropyTokensTrainer, "top_entropy_quantile"), (DropAllTrainer, "off_policy_mask_threshold")],
)
def test_mask_overrides_reach_the_loss(tiny_lm_path, arithmetic_dataset, grpo_kwargs, trainer_class, setting):
    """A mask that drops every token leaves no policy loss: with beta = 0 the loss and every gradient are 0."""
    value = {"top_entropy_quantile": 0.5, "off_policy_mask_threshold": 0.5}[setting]
    args = GRPOConfig(**{**grpo_kwargs, "beta": 0.0, setting: value})
    trainer = trainer_class(tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset)
    trainer.model.train()
    batch = trainer._generate_and_score_completions([arithmetic_dataset[i // 4] for i in range(8)])
    assert batch["advantages"].abs().sum() > 0  # there was something to learn
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is None or p.grad.abs().max().item() == 0.0 for p in trainer.model.parameters())


def test_rewards_override_sets_the_advantages(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    class RankRewards(GRPOTrainer):
        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            return torch.arange(len(prompts), dtype=torch.float32).unsqueeze(1)

    trainer = RankRewards(
        tiny_lm_path, first_token_reward, args=GRPOConfig(**grpo_kwargs), train_dataset=arithmetic_dataset
    )
    trainer.model.train()
    batch = trainer._generate_and_score_completions([arithmetic_dataset[0]] * 4)
    expected = torch.tensor([0.0, 1.0, 2.0, 3.0])
    expected = (expected - expected.mean()) / expected.std()  # TRL's scale_rewards="group": unbiased std
    assert torch.allclose(batch["advantages"], expected, atol=1e-4)


def test_config_attributes_and_entropy_coefficient(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    args = GRPOConfig(**{**grpo_kwargs, "epsilon": 0.3, "epsilon_high": 0.4, "top_k": 7, "entropy_coef": 0.01})
    trainer = GRPOTrainer(tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset)
    assert (trainer.epsilon_low, trainer.epsilon_high, trainer.top_k) == (0.3, 0.4, 7)
    for name, field in CONFIG_ATTRIBUTES.items():
        if name not in DERIVED_ATTRIBUTES:
            assert getattr(trainer, name) == getattr(args, field)
    with pytest.raises(AttributeError, match=re.escape("set `args.epsilon` (GRPOConfig)")):
        trainer.epsilon_low = 0.1
    with pytest.raises(AttributeError, match=re.escape("set `args.beta` (0.0: no reference model)")):
        trainer.ref_model = None
    assert trainer.ref_model is trainer.reference.model
    # the two TRL derives: epsilon_high falls back to epsilon, chat_template_kwargs to {}
    defaults = GRPOTrainer(
        tiny_lm_path, first_token_reward, args=GRPOConfig(**grpo_kwargs), train_dataset=arithmetic_dataset
    )
    assert defaults.args.epsilon_high is None and defaults.args.chat_template_kwargs is None
    assert defaults.epsilon_high == defaults.epsilon_low == 0.2 and defaults.chat_template_kwargs == {}
    assert trainer.entropy_coef == 0.01 and trainer.use_adaptive_entropy is False
    trainer.entropy_coef = 0.02  # as a subclass scheduling it would: the loss uses the new value
    assert trainer.entropy_control.applied() == 0.02


@pytest.mark.parametrize("method", sorted(UNCALLED_TRL_METHODS))
def test_override_of_an_uncalled_trl_method_is_an_error(tiny_lm_path, arithmetic_dataset, grpo_kwargs, method):
    subclass = type("MyTrainer", (GRPOTrainer,), {method: lambda self, *a, **k: None})
    grandchild = type("Child", (subclass,), {})
    for cls in (subclass, grandchild):
        with pytest.raises(TypeError, match=f"MyTrainer overrides `{method}`.*silently ignored"):
            cls(tiny_lm_path, first_token_reward, args=GRPOConfig(**grpo_kwargs), train_dataset=arithmetic_dataset)


def test_a_subclass_loss_gets_entropies_with_a_gradient(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """TRL's entropies carry a gradient; ours skip it when only our own loss uses them and the bonus is off."""

    class EntropyOnlyLoss(GRPOTrainer):
        def _compute_loss(self, model, inputs):
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
            mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
            _, entropies, _ = self._get_per_token_logps_and_entropies(
                model, ids, mask, inputs["completion_ids"].size(1), compute_entropy=True
            )
            return -entropies.mean()

    args = GRPOConfig(**{**grpo_kwargs, "beta": 0.0})
    for trainer_class, expect_grad in ((EntropyOnlyLoss, True), (GRPOTrainer, False)):
        trainer = trainer_class(tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset)
        trainer.model.train()
        batch = trainer._generate_and_score_completions([arithmetic_dataset[i // 4] for i in range(8)])
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        _, entropies, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 4, compute_entropy=True)
        assert entropies.requires_grad is expect_grad
    trainer = EntropyOnlyLoss(tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset)
    trainer.model.train()
    batch = trainer._generate_and_score_completions([arithmetic_dataset[i // 4] for i in range(8)])
    trainer.compute_loss(trainer.model, batch).backward()
    assert max(p.grad.abs().max().item() for p in trainer.model.parameters() if p.grad is not None) > 0
