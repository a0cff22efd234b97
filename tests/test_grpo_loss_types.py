# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The loss side of GRPOTrainer end to end: every loss_type / importance-sampling level / mask trains on the tiny
model, the `entropy` metric counts valid tokens only at the sampling temperature, top-entropy masking, the entropy
bonus, the float32 LM head and the MoE router loss. The formulas themselves are tested in test_grpo_losses.py."""

import math

import pytest
import torch
from transformers import AutoTokenizer, Qwen2MoeConfig, Qwen2MoeForCausalLM, TrainerState

from trl import GRPOConfig, GRPOTrainer
from trl.scoring.router_loss import router_aux_loss_settings
from trl.trainer.entropy_control import EntropyCoefficient


def first_token_reward(completion_ids, **kwargs):
    return [float(ids[0] % 5) for ids in completion_ids]


def train(tiny_lm_path, dataset, grpo_kwargs, model=None, processing_class=None, **overrides):
    # Two optimizer steps on one generation batch: the second step trains off-policy (ratio ≠ 1).
    kwargs = {**grpo_kwargs, "gradient_accumulation_steps": 1, "steps_per_generation": 2, "max_steps": 2}
    trainer = GRPOTrainer(
        model if model is not None else tiny_lm_path,
        first_token_reward,
        args=GRPOConfig(**{**kwargs, **overrides}),
        train_dataset=dataset,
        processing_class=processing_class,
    )
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    changed = any(not torch.equal(before[name], p) for name, p in trainer.model.named_parameters())
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    return trainer, logs, changed


# grpo, bnpo, dr_grpo and dapo train in test_grpo_trainer.py; here the new loss types and options.
CASES = {
    "gspo": dict(loss_type="grpo", importance_sampling_level="sequence"),
    "luspo": dict(loss_type="luspo", importance_sampling_level="sequence"),
    "cispo": dict(loss_type="cispo", epsilon_high=5.0),
    "sapo": dict(loss_type="sapo"),
    "vespo": dict(loss_type="vespo"),
    "dapo_delta_off_policy_mask": dict(loss_type="dapo", delta=1.5, off_policy_mask_threshold=0.0),
    "top_entropy_and_bonus": dict(loss_type="bnpo", top_entropy_quantile=0.2, entropy_coef=0.01),
}
METRICS = {
    "cispo": ["cispo_clip_ratio"],
    "vespo": ["vespo/phi_seq_mean"],
    "sapo": [],
    "top_entropy_and_bonus": ["clip_ratio/region_mean", "policy_loss", "entropy_coef"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_loss_setting_trains(case, tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    trainer, logs, changed = train(tiny_lm_path, arithmetic_dataset, grpo_kwargs, **CASES[case])
    assert len(logs) == 2 and changed
    for entry in logs:
        assert math.isfinite(entry["loss"]) and entry["kl"] >= 0.0 and entry["entropy"] > 0.0
        for name in METRICS.get(case, ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]):
            assert math.isfinite(entry[name]), name
    assert ("clip_ratio/region_mean" in logs[0]) == (case not in ("cispo", "sapo", "vespo"))
    if case == "top_entropy_and_bonus":
        assert logs[-1]["entropy_coef"] == 0.01


# ---------------------------------------------------------------- one compute_loss call on a hand-made batch


@pytest.fixture
def loss_trainer(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    def make(**overrides):
        args = GRPOConfig(**{**grpo_kwargs, "beta": 0.0, **overrides})
        trainer = GRPOTrainer(tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset)
        trainer.model.train()  # metrics of a training step
        return trainer

    return make


def hand_made_batch(trainer):
    """Two prompts (one left-padded) and two completions of length 3 and 1 (then padding, which must not count)."""
    pad = trainer.processing_class.pad_token_id
    return {
        "prompt_ids": torch.tensor([[pad, 11, 12], [21, 22, 23]]),
        "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
        "completion_ids": torch.tensor([[31, 32, 33, pad], [41, pad, pad, pad]]),
        "completion_mask": torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]),
        "advantages": torch.tensor([1.0, -2.0]),
        "num_items_in_batch": torch.tensor(4.0),
    }


def reference_entropies(trainer, batch, temperature=None):
    """Entropy of softmax(logits / temperature) at each completion position, straight from the model's logits."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        logits = trainer.model(
            input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
        ).logits
    logits = logits[:, -5:-1].double() / (temperature or trainer.args.temperature)
    return torch.distributions.Categorical(logits=logits).entropy()


def test_entropy_metric_counts_valid_tokens_at_the_sampling_temperature(loss_trainer):
    trainer = loss_trainer(temperature=0.7)
    with torch.no_grad():  # sharpen the random model (tied head) so that entropies differ between positions
        trainer.model.get_output_embeddings().weight.mul_(4.0)
    batch = hand_made_batch(trainer)
    trainer.compute_loss(trainer.model, batch)
    logged = trainer._metrics["train"]["entropy"][-1]
    entropies = reference_entropies(trainer, batch)
    valid = batch["completion_mask"].bool()
    assert logged == pytest.approx(entropies[valid].mean().item(), rel=1e-5)
    assert abs(logged - entropies.mean().item()) > 0.05  # padding would change it
    at_one = reference_entropies(trainer, batch, temperature=1.0)
    assert abs(logged - at_one[valid].mean().item()) > 0.05  # and so would the temperature


def test_top_entropy_quantile_zero_trains_only_the_highest_entropy_token(loss_trainer):
    trainer = loss_trainer(top_entropy_quantile=0.0)
    batch = hand_made_batch(trainer)
    loss = trainer.compute_loss(trainer.model, batch)
    entropies = reference_entropies(trainer, batch).masked_fill(~batch["completion_mask"].bool(), -1.0)
    row = entropies.max(dim=1).values.argmax().item()
    # On-policy ρ = 1: the kept token's loss is −Â of its row; "dapo" divides the sum by the 4 valid tokens.
    assert loss.item() == pytest.approx(-batch["advantages"][row].item() / 4.0, rel=1e-6)
    everything = loss_trainer().compute_loss(trainer.model, batch)
    assert everything.item() == pytest.approx((-1.0 * 3 + 2.0 * 1) / 4.0, rel=1e-6)


def test_entropy_bonus_subtracts_the_mean_entropy(loss_trainer):
    batch = hand_made_batch(loss_trainer())
    trainer = loss_trainer(entropy_coef=0.5, loss_type="grpo")
    loss = trainer.compute_loss(trainer.model, batch)
    entropy = reference_entropies(trainer, batch)[batch["completion_mask"].bool()].mean().item()
    policy = (-1.0 + 2.0) / 2  # grpo: per-sequence means −1 and +2, then their mean
    assert trainer._metrics["train"]["policy_loss"][-1] == pytest.approx(policy, rel=1e-6)
    assert loss.item() == pytest.approx(policy - 0.5 * entropy, rel=1e-5)


def test_policy_loss_and_entropy_coef_metrics_as_trl_logs_them(loss_trainer):
    """With the entropy bonus, TRL logs a token-sum type's (dapo, cispo, vespo) `policy_loss` in training as the
    micro-batch's share of the step, i.e. divided by the accumulation steps, and `entropy_coef` only in training."""
    trainer = loss_trainer(entropy_coef=0.5, loss_type="dapo")
    trainer.current_gradient_accumulation_steps = 4  # what Trainer sets inside its training loop
    batch = hand_made_batch(trainer)
    dapo = (-1.0 * 3 + 2.0 * 1) / 4.0  # the sum of the per-token losses over num_items_in_batch = 4
    trainer.compute_loss(trainer.model, batch)
    assert trainer._metrics["train"]["policy_loss"] == [pytest.approx(dapo / 4, rel=1e-6)]
    assert trainer._metrics["train"]["entropy_coef"] == [0.5]
    trainer.model.eval()
    trainer.compute_loss(trainer.model, batch)
    assert trainer._metrics["eval"]["policy_loss"] == [pytest.approx(dapo, rel=1e-6)]
    assert "entropy_coef" not in trainer._metrics["eval"]


# ---------------------------------------------------------------- float32 LM head, MoE router loss


def test_cast_lm_head_to_fp32_with_tied_embeddings(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    kwargs = dict(cast_lm_head_to_fp32=True, model_init_kwargs={"dtype": "bfloat16"})
    trainer, logs, changed = train(tiny_lm_path, arithmetic_dataset, grpo_kwargs, **kwargs)
    assert changed and all(math.isfinite(entry["loss"]) for entry in logs)
    for model in (trainer.model, trainer.ref_model):
        assert model.get_output_embeddings().weight.dtype == torch.float32  # tied: the embedding too
        assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16  # the rest is untouched
        ids = torch.tensor([[5, 6, 7]])
        assert model.get_input_embeddings()(ids).dtype == torch.bfloat16
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert model(input_ids=ids).logits.dtype == torch.float32


def test_cast_lm_head_to_fp32_rejects_a_peft_adapter_on_the_lm_head(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    from peft import LoraConfig

    peft_config = LoraConfig(r=2, target_modules=["q_proj", "lm_head"], task_type="CAUSAL_LM")
    args = GRPOConfig(**{**grpo_kwargs, "cast_lm_head_to_fp32": True})
    with pytest.raises(
        ValueError, match="Applying a PEFT adapter to `lm_head` is not supported with cast_lm_head_to_fp32=True"
    ):
        GRPOTrainer(
            tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset, peft_config=peft_config
        )


def tiny_moe(tiny_lm_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_path)
    torch.manual_seed(0)
    config = Qwen2MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        router_aux_loss_coef=0.02,
    )
    return Qwen2MoeForCausalLM(config), tokenizer


@pytest.mark.parametrize("coef, expected", [(None, 0.02), (0.0, 0.0)])
def test_moe_router_aux_loss(coef, expected, tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    model, tokenizer = tiny_moe(tiny_lm_path)
    trainer, logs, changed = train(
        tiny_lm_path, arithmetic_dataset, grpo_kwargs, model, tokenizer, router_aux_loss_coef=coef, max_steps=1
    )
    assert trainer.router_aux_loss_coef == expected and trainer.aux_loss_enabled == (expected != 0.0)
    assert changed and math.isfinite(logs[0]["loss"])
    # Qwen2-MoE's load-balancing loss is num_experts · Σ f_e·P_e ≥ 1 (1 for a perfectly balanced router).
    assert ("aux_loss" in logs[0]) == (expected != 0.0)
    if expected:
        assert logs[0]["aux_loss"] >= 1.0 - 1e-6


def test_router_aux_loss_is_added_with_its_weight(loss_trainer, monkeypatch):
    """loss = policy term + router_aux_loss_coef · aux_loss (transformers' Trainer then divides the whole loss by the
    accumulation steps, as TRL divides each term); `aux_loss` is logged as is."""
    import trl.trainer.grpo_trainer as module
    from trl.scoring.grpo_scoring import Scores

    trainer = loss_trainer()
    batch = hand_made_batch(trainer)
    logps = torch.zeros(2, 4, requires_grad=True)
    aux = torch.tensor(1.25, requires_grad=True)
    monkeypatch.setattr(module, "score_completions", lambda *args, **kwargs: Scores(logps, torch.ones(2, 4), aux))
    trainer.router_aux_loss_coef, trainer.aux_loss_enabled = 0.02, True
    loss = trainer.compute_loss(trainer.model, batch)
    dapo = (-1.0 * 3 + 2.0 * 1) / 4.0  # on-policy ρ = 1: −Â per valid token over num_items_in_batch = 4
    assert loss.item() == pytest.approx(dapo + 0.02 * 1.25, rel=1e-6)
    loss.backward()
    assert aux.grad.item() == pytest.approx(0.02)
    assert trainer._metrics["train"]["aux_loss"] == [1.25]


def test_router_aux_loss_settings(tiny_lm_path):
    model, _ = tiny_moe(tiny_lm_path)
    assert router_aux_loss_settings(model, None) == (0.02, True)  # the model config's value
    assert router_aux_loss_settings(model, 0.5) == (0.5, True)
    assert router_aux_loss_settings(model, 0.0) == (0.0, False)


def test_router_aux_loss_on_a_dense_model_raises(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    args = GRPOConfig(**{**grpo_kwargs, "router_aux_loss_coef": 0.1})
    with pytest.raises(ValueError, match="router_aux_loss_coef=0.1, but .* is not a Mixture-of-Experts model"):
        GRPOTrainer(tiny_lm_path, first_token_reward, args=args, train_dataset=arithmetic_dataset)


def test_trl_default_precision_and_checkpointing_train_on_cpu(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """TRL's defaults (bf16=None → True, gradient_checkpointing=True) train with use_cpu=True (bf16 autocast)."""
    overrides = {k: v for k, v in grpo_kwargs.items() if k not in ("bf16", "gradient_checkpointing")}
    trainer, logs, changed = train(tiny_lm_path, arithmetic_dataset, overrides, max_steps=1)
    assert (trainer.args.bf16, trainer.args.gradient_checkpointing) == (True, True)
    assert changed and math.isfinite(logs[0]["loss"]) and math.isfinite(logs[0]["entropy"])


# ---------------------------------------------------------------- adaptive entropy control


def test_entropy_coefficient_updates_by_hand():
    control = EntropyCoefficient(0.1, adaptive=True, coef_min=0.0, coef_max=0.11, coef_delta=0.005, target=1.0)
    assert control.enabled and control.applied() == 0.0  # nothing measured yet: no bonus
    mask = torch.tensor([[1, 1, 0]])
    # Two micro-batches of one step: entropies 0.5, 1.0 and 2.0 over valid tokens → mean 3.5 / 3 > 1: coef down.
    control.observe(torch.tensor([[0.5, 1.0, 9.0]]), mask, end_of_step=False)
    control.observe(torch.tensor([[2.0, 9.0, 9.0]]), torch.tensor([[1, 0, 0]]), end_of_step=True)
    assert control.last_entropy == pytest.approx(3.5 / 3) and control.coef == pytest.approx(0.095)
    assert control.applied() == 0.0  # last entropy above the target
    control.observe(torch.tensor([[0.5, 0.5, 9.0]]), mask, end_of_step=True)  # mean 0.5 ≤ 1: up, capped at 0.11
    control.observe(torch.tensor([[0.5, 0.5, 9.0]]), mask, end_of_step=True)
    control.observe(torch.tensor([[0.5, 0.5, 9.0]]), mask, end_of_step=True)
    assert control.coef == pytest.approx(0.11) and control.applied() == pytest.approx(0.11)
    fixed = EntropyCoefficient(0.3)
    fixed.observe(torch.ones(1, 3), mask, end_of_step=True)
    assert (fixed.enabled, fixed.applied(), fixed.coef) == (True, 0.3, 0.3)
    assert not EntropyCoefficient(0.0).enabled


def test_entropy_bonus_uses_the_coefficient_before_the_step_updates_it():
    control = EntropyCoefficient(0.1, adaptive=True, coef_min=0.0, coef_max=1.0, coef_delta=0.05, target=1.0)
    control.last_entropy = 0.5  # the last step was below the target: the bonus is on at 0.1
    entropies, mask = torch.tensor([[0.2, 0.4, 9.0]], requires_grad=True), torch.tensor([[1, 1, 0]])
    loss, coef = control.add_bonus(torch.tensor(2.0), entropies, mask, training=True, end_of_step=False)
    assert loss.item() == pytest.approx(2.0 - 0.1 * 0.3) and coef is None
    loss.backward()
    assert entropies.grad[0].tolist() == pytest.approx([-0.05, -0.05, 0.0])  # −coef / tokens on the valid ones
    loss, coef = control.add_bonus(torch.tensor(2.0), entropies, mask, training=True, end_of_step=True)
    assert loss.item() == pytest.approx(2.0 - 0.1 * 0.3)  # this step's bonus: the old coefficient
    assert coef == pytest.approx(0.15) == control.coef  # mean entropy 0.3 ≤ 1: up by delta, logged
    evaluation = control.add_bonus(torch.tensor(1.0), entropies, mask, training=False, end_of_step=True)
    assert evaluation[0].item() == pytest.approx(1.0 - 0.15 * 0.3) and evaluation[1] is None
    assert control.coef == pytest.approx(0.15)  # evaluation never moves the coefficient


def test_entropy_coefficient_state_is_restored_on_resume():
    control = EntropyCoefficient(0.1, adaptive=True)
    control.coef, control.last_entropy = 0.42, 0.05
    state = TrainerState(stateful_callbacks=[control])  # what a checkpoint's trainer_state.json holds
    state.global_step = 7
    resumed = EntropyCoefficient(0.1, adaptive=True)
    resumed.on_train_begin(None, state, None)
    assert (resumed.coef, resumed.last_entropy) == (0.42, 0.05)


def test_adaptive_entropy_trains_and_logs_the_coefficient(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    # The random model's entropy (~log V ≈ 5.9 nats) is far below a target of 100: the coefficient rises every step.
    kwargs = dict(use_adaptive_entropy=True, entropy_coef=0.0, entropy_coef_delta=0.01, entropy_target=100.0)
    trainer, logs, changed = train(tiny_lm_path, arithmetic_dataset, grpo_kwargs, **kwargs)
    assert changed
    assert [entry["entropy_coef"] for entry in logs] == pytest.approx([0.01, 0.02])
    assert trainer.entropy_control.last_entropy == pytest.approx(logs[-1]["entropy"], rel=1e-5)


def test_adaptive_entropy_resumes_with_restore_callback_states(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """With `restore_callback_states_from_checkpoint=True`, Trainer replaces the coefficient callback by a restored
    copy; the loss must use that copy (else it would restart from `entropy_coef` on resume)."""
    kwargs = dict(use_adaptive_entropy=True, entropy_coef=0.0, entropy_coef_delta=0.01, entropy_target=100.0)
    kwargs.update(restore_callback_states_from_checkpoint=True, save_strategy="steps", save_steps=1)
    full, _, _ = train(tiny_lm_path, arithmetic_dataset, grpo_kwargs, **kwargs)
    assert full.entropy_control.coef == pytest.approx(0.02)
    resumed = GRPOTrainer(
        tiny_lm_path,
        first_token_reward,
        args=GRPOConfig(
            **{**grpo_kwargs, "gradient_accumulation_steps": 1, "steps_per_generation": 2, "max_steps": 2, **kwargs}
        ),
        train_dataset=arithmetic_dataset,
    )
    resumed.train(resume_from_checkpoint=f"{grpo_kwargs['output_dir']}/checkpoint-1")
    assert resumed.entropy_control in resumed.callback_handler.callbacks
    assert resumed.entropy_control.coef == pytest.approx(0.02)
