# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The generation paths sample from the distribution plain `generate` samples from (trl/generation/grpo_generation.py)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from trl import GRPOConfig, GRPOTrainer
from trl.generation.grpo_generation import sample_completions
from trl.scoring.prefix_sharing import shared_prefix_cache, unique_prompt_rows


@pytest.fixture(scope="module")
def lm(tiny_lm_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_path)
    return model, tokenizer


def _prompts(tokenizer, texts, repeats):
    """Left-padded prompts of different lengths, each repeated `repeats` times in a row (as GRPO batches them)."""
    encoded = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    return encoded["input_ids"].repeat_interleave(repeats, 0), encoded["attention_mask"].repeat_interleave(repeats, 0)


def _config(tokenizer, max_new_tokens, **sampling):
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        disable_compile=True,
        **{"temperature": 1.0, "top_p": 1.0, "top_k": 0, **sampling},
    )


def test_unique_prompt_rows_numbers_prompts_by_first_appearance():
    ids = torch.tensor([[0, 5], [0, 6], [0, 5], [7, 8], [0, 6]])
    mask = torch.tensor([[0, 1], [0, 1], [0, 1], [1, 1], [0, 1]])
    first, inverse = unique_prompt_rows(ids, mask)
    assert first.tolist() == [0, 1, 3]
    assert inverse.tolist() == [0, 1, 0, 2, 1]
    same_ids_other_mask = unique_prompt_rows(torch.tensor([[0, 5], [0, 5]]), torch.tensor([[0, 1], [1, 1]]))
    assert same_ids_other_mask[0].tolist() == [0, 1]


def test_shared_prefix_cache_is_the_unshared_cache(lm):
    model, tokenizer = lm
    ids, mask = _prompts(tokenizer, ["1+2=", "13+4+5="], repeats=3)
    with torch.no_grad():
        shared = shared_prefix_cache(model, ids, mask)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        full = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=position_ids[:, :-1]).cache
    assert shared.get_seq_length() == ids.size(1) - 1
    real = mask[:, :-1].bool()  # padded positions hold keys nobody attends to
    for layer_shared, layer_full in zip(shared.layers, full.layers):
        for a, b in ((layer_shared.keys, layer_full.keys), (layer_shared.values, layer_full.values)):
            assert a.shape == b.shape
            torch.testing.assert_close(a.transpose(1, 2)[real], b.transpose(1, 2)[real], atol=1e-5, rtol=1e-5)


def test_shared_prefix_cache_is_none_when_there_is_nothing_to_share(lm):
    model, tokenizer = lm
    ids, mask = _prompts(tokenizer, ["1+2=", "13+4="], repeats=1)
    assert shared_prefix_cache(model, ids, mask) is None  # all prompts distinct
    assert shared_prefix_cache(model, ids[:, -1:].repeat(2, 1), mask[:, -1:].repeat(2, 1)) is None  # one token
    right_padded = torch.tensor([[1, 1, 0], [1, 1, 0]])
    assert shared_prefix_cache(model, ids[:1, :3].repeat(2, 1), right_padded) is None


def test_prompt_tuning_generates_as_generate_does(lm):
    """PEFT prompt tuning prepends virtual tokens to every forward: no shared prefix, the tokens of plain generate."""
    peft = pytest.importorskip("peft")
    model, tokenizer = lm
    tuned = peft.get_peft_model(model, peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3))
    ids, mask = _prompts(tokenizer, ["1+2=", "13+4="], repeats=3)
    assert shared_prefix_cache(tuned, ids, mask) is None
    config = GenerationConfig(max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    shared = sample_completions(tuned, ids, mask, config, "shared_prefix")
    plain = sample_completions(tuned, ids, mask, config, "generate")
    assert torch.equal(shared, plain)


@pytest.mark.parametrize("mixed", [False, True], ids=["PeftModel", "PeftMixedModel"])
def test_lora_under_bf16_autocast_prefills_as_generate_does(tiny_lm_path, mixed):
    """A LoRA policy as the trainer generates with it under `bf16=True`: the PEFT model's forward under bf16 autocast,
    as `accelerator.prepare` wraps it and `unwrap_model` keeps it (the trainer-level runs, with accelerate's own
    wrapper, are in test_mixed_precision.py). PEFT's `generate` runs the base model's forward, outside the
    wrapper, in float32: the shared prompt cache is computed by that forward too (`generation_forward_model`), so its
    keys and values are float32 like the decode steps' (a bf16 cache made SDPA fail on mixed query/value dtypes) and
    greedy decoding gives plain `generate`'s tokens."""
    peft = pytest.importorskip("peft")
    from trl.generation.grpo_generation import generation_forward_model

    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_path)
    torch.manual_seed(0)
    lora = peft.LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    policy = peft.get_peft_model(model, lora, mixed=mixed)
    policy.forward = torch.autocast("cpu", dtype=torch.bfloat16)(policy.forward)
    assert generation_forward_model(policy) is model  # the transformers model, the adapters in its layers
    assert generation_forward_model(torch.compile(policy)) is model  # compiled: `generate` runs uncompiled
    assert generation_forward_model(model) is model
    ids, mask = _prompts(tokenizer, ["1+2=3 and 13+4+5=", "7+8=15, 13+4="], repeats=3)
    with torch.no_grad():
        cache = shared_prefix_cache(generation_forward_model(policy), ids, mask)
    assert (
        {layer.keys.dtype for layer in cache.layers}
        == {layer.values.dtype for layer in cache.layers}
        == {torch.float32}
    )
    config = GenerationConfig(max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    shared = sample_completions(policy, ids, mask, config, "shared_prefix")
    assert torch.equal(shared, sample_completions(policy, ids, mask, config, "generate"))


def test_alora_generates_as_generate_does(tiny_lm_path):
    """aLoRA applies its adapter only from the invocation tokens on, offsets that PEFT's forward and `generate`
    compute from each call's ids: a prompt pass on the base model would skip them, so generation runs plain."""
    peft = pytest.importorskip("peft")
    from trl.generation.grpo_generation import shared_prefix_blocker

    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_path)
    invocation = tokenizer("+4", add_special_tokens=False)["input_ids"]
    torch.manual_seed(0)
    lora = peft.LoraConfig(
        task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "v_proj"], alora_invocation_tokens=invocation
    )
    policy = peft.get_peft_model(model, lora)
    for name, parameter in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=3.0)  # an adapter that changes the tokens
    ids, mask = _prompts(tokenizer, ["1+2=3 and 13+4+5=", "7+8=15, 13+4="], repeats=3)
    config = GenerationConfig(max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert shared_prefix_blocker(policy, ids, mask, config) == "an aLoRA adapter (alora_invocation_tokens)"
    shared = sample_completions(policy, ids, mask, config, "shared_prefix")
    assert torch.equal(shared, sample_completions(policy, ids, mask, config, "generate"))
    with policy.disable_adapter():
        assert not torch.equal(shared, sample_completions(policy, ids, mask, config, "generate"))


def _expected_first_token_probs(model, ids, mask, temperature=1.0, top_k=0, top_p=1.0, min_p=None, penalty=1.0):
    """The first-token distribution written out by hand: repetition penalty, temperature, top-k, top-p, min-p (the
    order `generate` applies them in), for every row."""
    with torch.no_grad():
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits[:, -1].float()
    if penalty != 1.0:
        seen = torch.gather(logits, 1, ids)
        logits = logits.scatter(1, ids, torch.where(seen < 0, seen * penalty, seen / penalty))
    probs = (logits / temperature).softmax(-1)
    # each filter sees the renormalised survivors of the previous ones
    if top_k:
        probs = _renormalised(probs, probs >= probs.topk(top_k, dim=-1).values[:, -1:])
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the strictly more likely tokens
        probs = _renormalised(probs, torch.zeros_like(probs, dtype=torch.bool).scatter(1, order, before < top_p))
    if min_p is not None:
        probs = _renormalised(probs, probs >= min_p * probs.max(-1, keepdim=True).values)
    return probs


def _renormalised(probs, keep):
    probs = torch.where(keep, probs, 0.0)
    return probs / probs.sum(-1, keepdim=True)


@pytest.mark.parametrize(
    "sampling",
    [
        dict(temperature=0.7),
        dict(top_k=5),
        dict(top_p=0.3),
        dict(min_p=0.3),
        dict(repetition_penalty=3.0),
        dict(temperature=1.5, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.3),
    ],
)
@pytest.mark.parametrize("implementation", ["shared_prefix", "generate"])
def test_first_token_frequencies_match_the_sampling_distribution(lm, sampling, implementation):
    model, tokenizer = lm
    n = 3000
    ids, mask = _prompts(tokenizer, ["1+2=", "13+4+5="], repeats=n)
    torch.manual_seed(0)
    with torch.no_grad():
        first = sample_completions(model, ids, mask, _config(tokenizer, 1, **sampling), implementation)[:, 0]
    names = {"repetition_penalty": "penalty"}
    expected = _expected_first_token_probs(
        model, ids[::n], mask[::n], **{names.get(k, k): v for k, v in sampling.items()}
    )
    for prompt in range(2):
        counts = torch.bincount(first[prompt * n : (prompt + 1) * n], minlength=expected.size(1)).double()
        p = expected[prompt].double()
        assert counts[p == 0].sum() == 0, "a filtered-out token was sampled"
        tolerance = 5 * (n * p * (1 - p)).sqrt() + 2  # 5 standard deviations of a binomial count
        assert ((counts - n * p).abs() <= tolerance).all(), (counts - n * p).abs().max()


@pytest.mark.parametrize(
    "sampling", [dict(temperature=0.7, top_k=10), dict(top_p=0.8, min_p=0.05, repetition_penalty=1.5)]
)
def test_shared_prefix_draws_the_same_tokens_as_generate_with_several_eos_ids(lm, sampling, monkeypatch):
    import trl.generation.grpo_generation as module
    from trl.scoring.prefix_sharing import _PreallocatedLayer

    caches, make_cache = [], module.shared_prefix_cache
    monkeypatch.setattr(
        module, "shared_prefix_cache", lambda *a, **k: caches.append(make_cache(*a, **k)) or caches[-1]
    )
    model, tokenizer = lm
    ids, mask = _prompts(tokenizer, ["1+2=", "13+4+5=", "7"], repeats=8)
    config = _config(tokenizer, 8, **sampling)
    with torch.no_grad():  # the likeliest next tokens, so that some rows stop early
        frequent = model(input_ids=ids, attention_mask=mask).logits[:, -1].topk(2).indices.unique().tolist()
    config.eos_token_id = [tokenizer.eos_token_id, *frequent]  # stop on any of them (several eos ids)
    outputs = {}
    for implementation in ("generate", "shared_prefix"):
        torch.manual_seed(1)
        with torch.no_grad():
            outputs[implementation] = sample_completions(model, ids, mask, config, implementation)
    assert torch.equal(outputs["generate"], outputs["shared_prefix"])  # same draws: the same tokens
    completions = outputs["shared_prefix"]
    # ... from a cache whose every step was written in place into buffers with room for 8 positions
    (cache,) = caches
    for layer in cache.layers:
        assert type(layer) is _PreallocatedLayer and layer.buffers[0].size(-2) == ids.size(1) - 1 + 8
        assert layer.keys.data_ptr() == layer.buffers[0].data_ptr()
        assert layer.get_seq_length() == ids.size(1) - 1 + completions.size(1)
    is_eos = torch.isin(completions, torch.tensor(config.eos_token_id))
    ended = is_eos.any(1)
    assert ended.any() and completions.size(1) <= 8
    after_eos = is_eos.long().cumsum(1) - is_eos.long() > 0  # positions after a row's first EOS
    assert (completions[after_eos] == tokenizer.pad_token_id).all()


def test_shared_prefix_falls_back_to_generate_without_a_cache(lm, monkeypatch):
    """`use_cache=False` (e.g. from `generation_kwargs`): nothing to share, so the same draws as plain `generate`
    (a shared cache would be read next to the whole re-fed prefix), and no prefill is run."""
    import trl.generation.grpo_generation as module

    model, tokenizer = lm
    ids, mask = _prompts(tokenizer, ["1+2=", "13+4+5="], repeats=4)
    config = _config(tokenizer, 6)
    config.use_cache = False
    outputs = {}
    for implementation in ("generate", "shared_prefix"):
        torch.manual_seed(3)
        outputs[implementation] = sample_completions(model, ids, mask, config, implementation)
    assert torch.equal(outputs["generate"], outputs["shared_prefix"])
    monkeypatch.setattr(
        module, "shared_prefix_cache", lambda *args, **kwargs: pytest.fail("prefilled without a cache")
    )
    sample_completions(model, ids, mask, config, "shared_prefix")


def test_sample_completions_restores_training_mode_and_rejects_unknown_paths(lm):
    model, tokenizer = lm
    ids, mask = _prompts(tokenizer, ["1+2="], repeats=2)
    model.train()
    with torch.no_grad():
        sample_completions(model, ids, mask, _config(tokenizer, 2), "shared_prefix")
    assert model.training
    model.eval()
    with pytest.raises(ValueError, match=r"implementation must be one of \('shared_prefix', 'generate'\)"):
        sample_completions(model, ids, mask, _config(tokenizer, 2), "vllm")


def test_generation_fields(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    args = GRPOConfig(**grpo_kwargs)
    assert (args.shared_prefix, args.cache_implementation) == (True, None)
    args = GRPOConfig(**{**grpo_kwargs, "cache_implementation": "static"})
    zero = lambda completions, **kw: [0.0] * len(completions)  # noqa: E731
    trainer = GRPOTrainer(tiny_lm_path, zero, args=args, train_dataset=arithmetic_dataset)
    assert trainer.generation_config.cache_implementation == "static"


def test_grpo_generation_config_maps_the_sampling_fields_and_lets_generation_kwargs_override(tiny_lm_path):
    from transformers import AutoTokenizer

    from trl import GRPOConfig
    from trl.generation.grpo_generation import grpo_generation_config

    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_path)
    args = GRPOConfig(
        "unused", max_completion_length=7, temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, repetition_penalty=1.2,
        generation_kwargs={"top_k": 3, "num_beams": 2}, report_to="none", use_cpu=True, bf16=False,
    )  # fmt: skip
    config = grpo_generation_config(args, tokenizer, [tokenizer.eos_token_id, 7])
    assert (config.max_new_tokens, config.do_sample, config.temperature, config.top_p) == (7, True, 0.7, 0.9)
    assert (config.min_p, config.repetition_penalty, config.top_k, config.num_beams) == (0.1, 1.2, 3, 2)
    assert config.eos_token_id == [tokenizer.eos_token_id, 7] and config.pad_token_id == tokenizer.pad_token_id
    assert config.disable_compile is True and config.cache_implementation is None


def _sampled_twice(model, ids, mask, config, seed=0):
    """Both implementations from the same RNG state."""
    outputs = {}
    for implementation in ("generate", "shared_prefix"):
        torch.manual_seed(seed)
        with torch.no_grad():
            outputs[implementation] = sample_completions(model, ids, mask, config, implementation)
    return outputs["generate"], outputs["shared_prefix"]


@pytest.mark.parametrize(
    "options, blocker",
    [
        (dict(num_beams=2, do_sample=False), "generation mode beam_search"),
        (dict(num_beams=2, do_sample=True), "generation mode beam_sample"),
        (dict(num_return_sequences=2), "num_return_sequences > 1"),
        (dict(return_dict_in_generate=True, output_scores=True), None),  # shares; `generate` returns an output object
    ],
)
def test_generation_options_give_the_ids_of_plain_generate(lm, options, blocker):
    """`generation_kwargs` go to `generate` as they are: beam search (and sampling beams) and several sequences per
    prompt expand the batch, so the shared-prefix path hands them to plain `generate`; the ids are the same."""
    model, tokenizer = lm
    ids, mask = _prompts(tokenizer, ["1+2=", "13+4+5="], repeats=3)
    config = _config(tokenizer, 5)
    config.update(**options)
    plain, shared = _sampled_twice(model, ids, mask, config)
    assert plain.size(0) == ids.size(0) * (config.num_return_sequences or 1) and plain.size(1) <= 5
    assert torch.equal(shared, plain)
    from trl.generation.grpo_generation import shared_prefix_blocker

    assert shared_prefix_blocker(model, ids, mask, config) == blocker


@pytest.mark.parametrize(
    "model_defaults, blocker",
    [
        ({"cache_implementation": "static"}, "cache_implementation='static'"),
        ({"cache_implementation": "dynamic"}, "cache_implementation='dynamic'"),
        ({"cache_implementation": "hybrid"}, None),  # transformers 5.x drops a "hybrid" default: shares
        ({"num_beams": 2, "do_sample": False}, "generation mode beam_search"),  # our config leaves num_beams unset
    ],
)
def test_the_models_own_generation_config_decides_the_path(tiny_lm_path, tmp_path, model_defaults, blocker):
    """`generate` fills what our `GenerationConfig` leaves unset from the model's generation_config.json (here saved
    and loaded back): a `cache_implementation` there would clash with a given cache, and `num_beams` there is beam
    search. No error, and the ids of plain `generate`."""
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    for key, value in model_defaults.items():
        setattr(model.generation_config, key, value)
    model.save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert all(getattr(model.generation_config, k) == v for k, v in model_defaults.items())
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_path)
    ids, mask = _prompts(tokenizer, ["1+2=", "13+4+5="], repeats=3)
    config = GenerationConfig(
        max_new_tokens=5,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        disable_compile=True,
        temperature=1.0,
        top_k=0,
    )
    if "do_sample" not in model_defaults:  # sampling, unless the model's defaults ask for greedy beams
        config.do_sample = True
    plain, shared = _sampled_twice(model, ids, mask, config)
    assert torch.equal(shared, plain)
    from trl.generation.grpo_generation import effective_generation_config, shared_prefix_blocker

    assert shared_prefix_blocker(model, ids, mask, config) == blocker
    assert config.cache_implementation is None and config.num_beams is None  # ours is left as it was
    if "cache_implementation" in model_defaults:
        expected = (
            None if model_defaults["cache_implementation"] == "hybrid" else model_defaults["cache_implementation"]
        )
        assert effective_generation_config(model, config).cache_implementation == expected


def test_the_trainer_passes_its_cpu_decoding_fields(tiny_lm_path, arithmetic_dataset, grpo_kwargs, monkeypatch):
    from trl.trainer import grpo_trainer

    seen, sample = [], grpo_trainer.sample_completions

    def spy(*a, **k):
        seen.append((a[-1], k["packed_weights"], k["inverse_cdf"]))
        return sample(*a, **k)

    monkeypatch.setattr(grpo_trainer, "sample_completions", spy)
    zero = lambda completions, **kw: [0.0] * len(completions)  # noqa: E731
    for shared, inverse_cdf in ((True, True), (False, True), (True, False)):
        fields = dict(shared_prefix=shared, inverse_cdf_sampling=inverse_cdf, max_steps=1)
        args = GRPOConfig(**{**grpo_kwargs, **fields})
        GRPOTrainer(tiny_lm_path, zero, args=args, train_dataset=arithmetic_dataset).train()
        # MKL-packed decoding weights are no field: always asked for (they act on the CPU only, same logits)
        assert seen == [("shared_prefix" if shared else "generate", True, inverse_cdf)]
        seen.clear()
