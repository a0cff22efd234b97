# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The trainer's default scoring path in bf16 on the CPU against the plain path (TRL's one forward and log-softmax),
on several architectures: log-probs, entropies, a GRPO loss and every parameter's gradient, within tolerances set by
the plain path's own noise, which each case measures."""

import copy
from contextlib import nullcontext

import pytest
import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
)

from trl.scoring import grpo_scoring
from trl.scoring.grpo_scoring import score_completions
from trl.scoring.lm_head import tied_input_embedding
from trl.scoring.router_loss import router_aux_loss_settings
from trl.trainer.grpo_losses import aggregate_loss, masked_mean, per_token_policy_loss


TEMPERATURE = 0.7
VOCAB = 512
NUM_GENERATIONS = 4
# what `GRPOTrainer._get_per_token_logps_and_entropies` asks for with the config's defaults (shared_prefix=True,
# chunked_logprobs=True, recompute_elementwise_activations=False); the plain path is every one of them off
DEFAULT_PATH = dict(
    share_prefix=True, packed=True, chunked_logprobs=True, sparse_embedding_grad=True, grouped_kv_attention=True
)
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
# name: (config class, model class, config fields)
ARCHITECTURES = {
    "llama_tied": (LlamaConfig, LlamaForCausalLM, dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "llama_untied": (LlamaConfig, LlamaForCausalLM, dict(num_key_value_heads=4, tie_word_embeddings=False)),
    "qwen2_gqa_tied": (Qwen2Config, Qwen2ForCausalLM, dict(num_key_value_heads=1, tie_word_embeddings=True)),
    # a window shorter than the sequences (prompt 27 + completion 10), so that it acts
    "mistral_sliding_window": (
        MistralConfig,
        MistralForCausalLM,
        dict(num_key_value_heads=2, sliding_window=12, tie_word_embeddings=False),
    ),
    # logit and attention softcapping, sliding-window layers, a scaled (tied) embedding
    "gemma2_softcapping": (
        Gemma2Config,
        Gemma2ForCausalLM,
        dict(num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=12),
    ),
    "qwen2_moe": (
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        dict(
            num_key_value_heads=2,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            tie_word_embeddings=False,
        ),
    ),
}
# case: (architecture, weights' dtype, bf16 autocast around the passes)
CASES = {name: (name, torch.bfloat16, False) for name in ARCHITECTURES}
CASES["llama_tied_fp32_bf16_autocast"] = ("llama_tied", torch.float32, True)

# What the default path does for each architecture: the layout of its pass without and with gradients, block-wise
# log-probs, a tied embedding the row gradient may apply to (Gemma2's scaled bf16 embedding keeps its dense one).
# - Llama, Qwen2: packed rows that start with their prompt (`pack_completions`' estimate picks "inline" here).
# - Mistral with a sliding window, Gemma2 (sliding-window layers): the prompts' cache would not be plain full
#   attention, so every pass runs plain (logged once at INFO); Gemma2's logit softcapping also keeps the log-probs on its
#   logits (logged at INFO by `scoring_plan`, as is its model type, not packable).
# - Qwen2-MoE: a model type not packable (logged), so its completions run padded on the prompts' cache; the training
#   pass returns the router loss (as the trainer asks with the config's `router_aux_loss_coef`), which covers every
#   token of one pass: plain (logged).
EXPECTED_PATHS = {
    "llama_tied": ("inline", "inline", True, True),
    "llama_untied": ("inline", "inline", True, False),
    "qwen2_gqa_tied": ("inline", "inline", True, True),
    "mistral_sliding_window": ("plain", "plain", True, False),
    "gemma2_softcapping": ("plain", "plain", False, True),
    "qwen2_moe": ("padded cache", "plain", True, False),
    "llama_tied_fp32_bf16_autocast": ("inline", "inline", True, True),
}


def build_model(architecture: str, dtype: torch.dtype, seed: int = 0):
    config_class, model_class, fields = ARCHITECTURES[architecture]
    torch.manual_seed(seed)
    return model_class(config_class(**COMMON, **fields)).to(dtype).train()


def grpo_batch(seed: int = 0, num_generations: int = NUM_GENERATIONS, completion_length: int = 10):
    """3 distinct prompts of 22, 27 and 19 tokens (left-padded to 27; their tokens drawn from 32 ids, as a chat
    template and digits repeat), each repeated `num_generations` times, then completions of 2 to `completion_length`
    tokens (every third row whole), right-padded. Returns `(input_ids, attention_mask, completion_length)`."""
    g = torch.Generator().manual_seed(seed)
    prompt_lengths = (22, 27, 19)
    width = max(prompt_lengths)
    prompts, prompt_mask = [], []
    for length in prompt_lengths:
        ids = torch.randint(3, 35, (width,), generator=g).masked_fill(torch.arange(width) < width - length, 0)
        prompts += [ids] * num_generations
        prompt_mask += [torch.arange(width) >= width - length] * num_generations
    n = len(prompts)
    lengths = torch.randint(2, completion_length + 1, (n,), generator=g)
    lengths[::3] = completion_length
    completion_mask = torch.arange(completion_length) < lengths[:, None]
    completions = torch.randint(3, VOCAB, (n, completion_length), generator=g).masked_fill(~completion_mask, 0)
    ids = torch.cat([torch.stack(prompts), completions], 1)
    mask = torch.cat([torch.stack(prompt_mask), completion_mask], 1).long()
    return ids, mask, completion_length


def score(model, ids, mask, length, default, compute_aux_loss=False):
    """`score_completions` on the default path or the plain one, with entropies (carrying a gradient, as with the
    entropy bonus)."""
    paths = DEFAULT_PATH if default else {}
    return score_completions(
        model, ids, mask, length, TEMPERATURE, None, True, compute_aux_loss, entropy_grad=True, **paths
    )


def loss_and_grads(model, ids, mask, length, advantages, default, precision):
    """A GRPO loss on-policy (DAPO token sum at ratio 1), an entropy bonus and, for a MoE, the router loss weighted
    as the trainer does; returns `(loss, log-probs, entropies, {name: float64 gradient})`."""
    coef, aux_loss = router_aux_loss_settings(model, None)
    model.zero_grad(set_to_none=True)
    with precision:
        scores = score(model, ids, mask, length, default, aux_loss)
        completion_mask = mask[:, -length:]
        logps = scores.per_token_logps
        policy = per_token_policy_loss(logps, logps.detach(), advantages, completion_mask, loss_type="dapo")
        loss = aggregate_loss(policy.per_token_loss, completion_mask, "dapo", num_items_in_batch=completion_mask.sum())
        loss = loss - 0.1 * masked_mean(scores.entropies, completion_mask)
        if aux_loss:
            loss = loss + coef * scores.aux_loss
    loss.backward()
    grads = {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), logps.detach(), scores.entropies.detach(), grads


def groups_alone(model, ids, mask, length, num_generations, precision):
    """Plain log-probs and entropies of each prompt's rows scored without the other prompts' rows, their common left
    padding cut."""
    logps, entropies = [], []
    with torch.no_grad(), precision:
        for start in range(0, ids.size(0), num_generations):
            rows = slice(start, start + num_generations)
            first = int(mask[start].argmax())  # the first attended position of the group's prompt
            scores = score(model, ids[rows, first:], mask[rows, first:], length, default=False)
            logps.append(scores.per_token_logps)
            entropies.append(scores.entropies)
    return torch.cat(logps), torch.cat(entropies)


def measure(case: str, model_seed: int = 0, batch_seed: int = 0) -> dict:
    """Everything the tests of `case` compare: the plain and default paths' log-probs, entropies, losses and
    gradients, those of a higher-precision copy of the model (the reference), the plain scores of each prompt's rows
    alone, the largest tempered logit, and the layouts the default path's passes took."""
    architecture, dtype, autocast = CASES[case]
    model = build_model(architecture, dtype, model_seed)
    # Gemma2's eager attention takes its softmax in float32, where float64's mask value becomes -inf: the padded
    # positions' rows turn NaN, and every row through their values (NaN × 0). Its reference is float32 (~1e-7
    # relative, far below bf16's ~1e-2).
    reference = copy.deepcopy(model).to(torch.float32 if architecture == "gemma2_softcapping" else torch.float64)
    if hasattr(reference, "set_experts_implementation"):  # transformers' grouped_mm experts take no float64
        reference.set_experts_implementation("eager")
    ids, mask, length = grpo_batch(batch_seed)
    advantages = torch.randn(ids.size(0), generator=torch.Generator().manual_seed(batch_seed + 1))
    precision = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext()
    m = {"valid": mask[:, -length:].bool(), "tied": tied_input_embedding(model) is not None}
    m["reference"] = loss_and_grads(reference, ids, mask, length, advantages, False, nullcontext())
    m["plain"] = loss_and_grads(model, ids, mask, length, advantages, False, precision)
    m["alone"] = groups_alone(model, ids, mask, length, NUM_GENERATIONS, precision)
    layouts, chunked = [], []
    plan_scoring, pass_layout = grpo_scoring.plan_scoring, grpo_scoring.pass_layout

    def spied_plan(*args, **kwargs):
        plan = plan_scoring(*args, **kwargs)
        chunked.append(plan.chunked)
        return plan

    def spied_layout(*args, **kwargs):
        layout = pass_layout(*args, **kwargs)
        layouts.append(layout.kind)
        return layout

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grpo_scoring, "plan_scoring", spied_plan)
        patch.setattr(grpo_scoring, "pass_layout", spied_layout)
        with torch.no_grad(), precision:  # the old/reference log-prob pass
            scores = score(model, ids, mask, length, default=True)
        m["default_no_grad"] = (None, scores.per_token_logps, scores.entropies, None)
        m["default"] = loss_and_grads(model, ids, mask, length, advantages, True, precision)
    m["paths"] = (*layouts, all(chunked))
    with torch.no_grad(), precision:
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -length - 1 : -1][m["valid"]]
    tempered = logits.float() / TEMPERATURE
    m["max_logit"] = tempered.abs().max().item()
    return m


@pytest.fixture(scope="module", params=list(CASES))
def measured(request):
    """`measure(case)`, once per case for all its tests, on one thread: these matrices are tiny, and two threads that
    contend with other processes for two busy cores ran the file 4x slower (32 s against 8 s). Every path and the
    reference are measured the same way (the numbers quoted here came out the same on two threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return request.param, measure(request.param)
    finally:
        torch.set_num_threads(threads)


def largest(a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor) -> float:
    return (a - b)[valid].abs().max().item()


def test_default_path_engages_as_expected(measured):
    case, m = measured
    no_grad, with_grad, chunked, tied = EXPECTED_PATHS[case]
    assert m["paths"] == (no_grad, with_grad, chunked)
    assert m["tied"] == tied


def test_logprobs_and_entropies_within_the_plain_paths_noise(measured):
    case, m = measured
    valid = m["valid"]
    _, plain_logps, plain_entropies, _ = m["plain"]
    _, ref_logps, ref_entropies, _ = m["reference"]
    alone_logps, alone_entropies = m["alone"]
    # The plain path's own noise, two ways: the same rows scored in another batch (each prompt's rows without the
    # others, without the left padding they had), and its distance to the reference. (A row alone but as wide as the
    # batch is bitwise the same: the CPU kernels compute a row the same in any batch; the layout, here the padded
    # keys each query skips, is what moves bf16's roundings, as the default path's layouts do.)
    noise_logps = max(largest(plain_logps, alone_logps, valid), largest(plain_logps, ref_logps, valid))
    noise_entropies = max(
        largest(plain_entropies, alone_entropies, valid), largest(plain_entropies, ref_entropies, valid)
    )
    assert 0 < noise_logps < 0.05 and 0 < noise_entropies < 0.005  # bf16 rounds, and not wildly
    # Log-probs also get a floor: half a bf16 ulp (2^-9 relative) of the largest tempered logit, by which two layouts
    # may round a logit apart (moving that token's log-prob, and the log-sum-exp, by as much): 1.8e-3 to 4.5e-3 here.
    floor = 2**-9 * m["max_logit"]
    for label, (_, default_logps, default_entropies, _) in (
        ("no gradient", m["default_no_grad"]),
        ("gradient", m["default"]),
    ):
        assert (default_logps[~valid] == 0).all() and (default_entropies[~valid] == 0).all()
        # No farther from the reference than twice the plain path's distance: measured over 6 seeds per case, up to
        # 1.56x for log-probs and 1.45x for entropies (most often below 1; Gemma2: 1, every path plain there).
        assert largest(default_logps, ref_logps, valid) <= 2 * largest(plain_logps, ref_logps, valid), label
        assert largest(default_entropies, ref_entropies, valid) <= 2 * largest(
            plain_entropies, ref_entropies, valid
        ), label
        # Then within 3x the plain path's noise of the plain values (|d − p| <= |d − ref| + |ref − p|). Measured,
        # |default − plain| / max(noise, floor) <= 1.17 for log-probs and |default − plain| / noise <= 1.61 for
        # entropies (both the MoE's pass on the prompts' cache; 0 for Gemma2).
        assert largest(default_logps, plain_logps, valid) <= 3 * max(noise_logps, floor), label
        assert largest(default_entropies, plain_entropies, valid) <= 3 * noise_entropies, label


def test_loss_and_gradients_no_less_accurate_than_the_plain_path(measured):
    case, m = measured
    _, _, _, ref_grads = m["reference"]
    plain_loss, _, plain_entropies, plain_grads = m["plain"]
    default_loss, _, default_entropies, default_grads = m["default"]
    # the loss: its policy term is the same value in every path (ratio 1), so the two differ by the entropy bonus's
    # 0.1 × mean entropy (the MoE's router loss comes from the same plain forward in both), plus float32's rounding
    # of sums near 0.5 (2^-22: 4 ulps)
    bonus = 0.1 * largest(default_entropies, plain_entropies, m["valid"])
    assert abs(default_loss - plain_loss) <= bonus + 2**-22, (default_loss, plain_loss)
    # Every parameter's gradient against the reference's, ‖g − g_ref‖ / ‖g_ref‖: measured over 6 seeds per case, the
    # plain path's 3e-3 to 2e-2 (a routing flip in the MoE: up to 0.17), and the default path's at most 1.58x that
    # (the biases of Qwen2's q/k/v projections, layer norms: 1.1 to 1.6; the embeddings 0.8 to 1.0). Allowed: 1.5x,
    # plus 2^-9, half a bf16 ulp: the relative rounding of a gradient stored in bf16 alone, by which a path may land
    # off without being less accurate.
    assert ref_grads.keys() == plain_grads.keys() == default_grads.keys()
    for name, ref in ref_grads.items():
        assert ref.norm() > 0, name
        plain_error = ((plain_grads[name] - ref).norm() / ref.norm()).item()
        default_error = ((default_grads[name] - ref).norm() / ref.norm()).item()
        assert 0 < plain_error < 0.25, (name, plain_error)
        assert default_error <= 1.5 * plain_error + 2**-9, (name, default_error, plain_error)
