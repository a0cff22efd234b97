# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""trl/trainer/grpo_inputs.py: prompt token ids as TRL 1.16 builds them for every common tokenizer family, stop
tokens, the seeded micro-batch shuffle (and what it does to `loss_type="bnpo"`), and the trainer using them."""

import logging

import pytest
import torch
from datasets import Dataset
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from trl import GRPOConfig, GRPOTrainer
from trl.data_utils import is_conversational
from trl.generation.grpo_generation import completion_id_lists, left_pad, pad_completions
from trl.trainer.grpo_inputs import (
    RepeatSampler,
    derived_seed,
    micro_steps_done,
    reward_columns,
    sampling_rng,
    shuffle_and_split,
    shuffle_seed,
    split_tensor_dict,
    stop_token_ids,
    tokenize_prompts,
)
from trl.trainer.grpo_losses import aggregate_loss, completion_mask


# ---------------------------------------------------------------- tokenizers of each family, built locally

WORDS = ["1+1=", "2+3=", "What", "is", "?", "You", "are", "a", "helpful", "assistant", ".", "Be", "brief", "user"]
WORDS += ["system", "model", "<start_of_turn>", "<end_of_turn>", "<|start_header_id|>", "<|end_header_id|>"]
WORDS += ["<|eot_id|>", "<|im_start|>", "<|im_end|>", "\n", "\n\n", " ", "assistant.", "2+3"]
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
QWEN_TEMPLATE = (  # a default system turn when the conversation has none
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}"
    "\n{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def build_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """`llama`: BOS added to text, template writes BOS, no pad token (EOS pads). `qwen`: no BOS, default system turn.
    `gemma`: BOS added to text and written by the template. `bos_eos`: BOS and EOS added to text, Llama-3 template."""
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {w: i for i, w in enumerate(specials + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s+|\S+"), behavior="isolated")
    bos, eos = vocab["<s>"], vocab["</s>"]
    if family in ("llama", "gemma"):
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    elif family == "bos_eos":
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", bos), ("</s>", eos)]
        )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None if family == "qwen" else "<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token=None if family == "llama" else "<pad>",
        chat_template={"llama": LLAMA3_TEMPLATE, "qwen": QWEN_TEMPLATE, "gemma": GEMMA_TEMPLATE}.get(
            family, LLAMA3_TEMPLATE
        ),
        additional_special_tokens=[w for w in WORDS if w.startswith("<")],
    )
    if tokenizer.pad_token is None:  # as the trainer does
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


STANDARD = ["1+1=", "What is 2+3= ?"]
CHATS = [
    [{"role": "user", "content": "1+1="}],
    [{"role": "system", "content": "Be brief ."}, {"role": "user", "content": "What is 2+3= ?"}],
]
QUESTION = ["What", " ", "is", " ", "2+3=", " ", "?"]
LLAMA3_CHAT = [
    ["<s>", "<|start_header_id|>", "user", "<|end_header_id|>", "\n\n", "1+1=", "<|eot_id|>"]
    + ["<|start_header_id|>", "assistant", "<|end_header_id|>", "\n\n"],
    ["<s>", "<|start_header_id|>", "system", "<|end_header_id|>", "\n\n", "Be", " ", "brief", " ", ".", "<|eot_id|>"]
    + ["<|start_header_id|>", "user", "<|end_header_id|>", "\n\n", *QUESTION, "<|eot_id|>"]
    + ["<|start_header_id|>", "assistant", "<|end_header_id|>", "\n\n"],
]
# Produced by TRL 1.16.0's own code path (GRPOTrainer._tokenize_prompts, then left padding) on these tokenizers.
UPSTREAM_TOKENS = {
    "llama/standard": [["<s>", "1+1="], ["<s>", *QUESTION]],
    "llama/chat": LLAMA3_CHAT,
    "qwen/standard": [["1+1="], QUESTION],
    "qwen/chat": [
        ["<|im_start|>", "system", "\n", "You", " ", "are", " ", "a", " ", "helpful", " ", "assistant.", "<|im_end|>"]
        + ["\n", "<|im_start|>", "user", "\n", "1+1=", "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"],
        ["<|im_start|>", "system", "\n", "Be", " ", "brief", " ", ".", "<|im_end|>", "\n", "<|im_start|>", "user"]
        + ["\n", *QUESTION, "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"],
    ],
    "gemma/standard": [["<s>", "1+1="], ["<s>", *QUESTION]],
    "gemma/chat": [
        ["<s>", "<start_of_turn>", "user", "\n", "1+1=", "<end_of_turn>", "\n", "<start_of_turn>", "model", "\n"],
        ["<s>", "<start_of_turn>", "system", "\n", "Be", " ", "brief", " ", ".", "<end_of_turn>", "\n"]
        + ["<start_of_turn>", "user", "\n", *QUESTION, "<end_of_turn>", "\n", "<start_of_turn>", "model", "\n"],
    ],
    "bos_eos/standard": [["<s>", "1+1=", "</s>"], ["<s>", *QUESTION, "</s>"]],
    "bos_eos/chat": LLAMA3_CHAT,  # the template's text gets no extra special tokens
}


@pytest.mark.parametrize("case", sorted(UPSTREAM_TOKENS))
def test_prompt_ids_match_trl_for_every_tokenizer_family(case):
    family, kind = case.split("/")
    tokenizer = build_tokenizer(family)
    ids, truncated = tokenize_prompts(tokenizer, STANDARD if kind == "standard" else CHATS)
    prompt_ids, prompt_mask = left_pad(ids, tokenizer.pad_token_id)
    expected = [tokenizer.convert_tokens_to_ids(tokens) for tokens in UPSTREAM_TOKENS[case]]
    width = max(map(len, expected))
    assert prompt_ids.tolist() == [[tokenizer.pad_token_id] * (width - len(row)) + row for row in expected]
    assert prompt_mask.tolist() == [[0] * (width - len(row)) + [1] * len(row) for row in expected]
    assert prompt_ids.dtype == prompt_mask.dtype == torch.long
    assert truncated.tolist() == [False, False]


def test_max_prompt_length_keeps_the_last_tokens_and_warns_with_counts(caplog):
    tokenizer = build_tokenizer("llama")
    with caplog.at_level(logging.WARNING, logger="trl.trainer.grpo_inputs"):
        ids, truncated = tokenize_prompts(tokenizer, STANDARD, max_prompt_length=3)
    prompt_ids, prompt_mask = left_pad(ids, tokenizer.pad_token_id)
    assert truncated.tolist() == [False, True]
    assert prompt_ids.tolist() == [[2, 1, 4], tokenizer.convert_tokens_to_ids(QUESTION[-3:])]  # pad = EOS = 2
    assert prompt_mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert "max_prompt_length=3 cut 1 of 2 prompts in this batch (longest: 8 tokens)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl.trainer.grpo_inputs"):
        tokenize_prompts(tokenizer, STANDARD, max_prompt_length=8)
    assert caplog.text == ""


# ---------------------------------------------------------------- stopping


def test_stop_token_ids_add_every_model_eos_after_the_tokenizers():
    assert stop_token_ids(2, [2, 1]) == [2, 1]
    assert stop_token_ids(2, [7, 1]) == [2, 7, 1]
    assert stop_token_ids(2, 1) == [2, 1]
    assert stop_token_ids(2, 2) == [2]
    assert stop_token_ids(2, None) == [2]


def test_mask_is_cut_at_any_stop_token_and_truncation_is_read_from_the_last_token():
    ids = torch.tensor([[5, 1, 0, 0], [5, 6, 2, 0], [5, 6, 7, 8], [5, 6, 7, 0]])  # pad = 0
    mask = completion_mask(ids, stop_token_ids(2, [2, 1]))
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
    # Like TRL, a completion whose last token is the pad token counts as ended.
    lists = completion_id_lists(ids, stop_token_ids(2, [2, 1]))
    assert lists == [[5, 1], [5, 6, 2], [5, 6, 7, 8], [5, 6, 7, 0]]
    padded = pad_completions(lists, 0, [2, 1, 0], mask_truncated_completions=True)
    assert padded.terminated.tolist() == [True, True, False, True]
    assert padded.full_mask.tolist() == mask.tolist() and padded.completion_ids.tolist() == ids.tolist()
    assert padded.mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]]


def test_trainer_stops_at_the_model_generation_config_eos(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """With every token but the tokenizer's EOS listed in `generation_config.eos_token_id`, TRL stops after one
    token: so must we (we used to stop only at the tokenizer's EOS)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path)
    tokenizer_eos = 0  # <|endoftext|> of the tiny tokenizer
    model.generation_config.eos_token_id = [i for i in range(model.config.vocab_size) if i != tokenizer_eos]
    trainer = GRPOTrainer(
        model,
        lambda completions, **kw: [0.0] * len(completions),
        args=GRPOConfig(**grpo_kwargs),
        train_dataset=arithmetic_dataset,
    )
    assert trainer.processing_class.eos_token_id == tokenizer_eos
    assert trainer.eos_token_ids[:2] == [0, 1] and len(trainer.eos_token_ids) == model.config.vocab_size
    assert trainer.generation_config.eos_token_id == trainer.eos_token_ids
    trainer.model.train()
    output = trainer._generate_and_score_completions([arithmetic_dataset[0]] * 4)
    assert output["completion_ids"].shape == (4, 1) and output["completion_mask"].tolist() == [[1]] * 4
    metrics = {key: values[-1] for key, values in trainer._metrics["train"].items()}
    assert metrics["completions/max_length"] == metrics["completions/mean_terminated_length"] == 1.0
    assert metrics["completions/clipped_ratio"] == 0.0


# ---------------------------------------------------------------- micro-batches


def test_shuffle_and_split_permutes_every_tensor_in_unison_and_is_seeded():
    batch = {"a": torch.arange(8), "b": torch.arange(16).view(8, 2), "n": torch.tensor(3.0), "none": None}
    chunks = shuffle_and_split(batch, 2, seed=123)
    order = torch.randperm(8, generator=torch.Generator().manual_seed(123))
    assert torch.cat([c["a"] for c in chunks]).tolist() == order.tolist()
    assert torch.equal(torch.cat([c["b"] for c in chunks]), batch["b"][order])
    assert all(c["n"].item() == 3.0 and c["none"] is None for c in chunks)
    again = shuffle_and_split(batch, 2, seed=123)
    assert all(torch.equal(x["b"], y["b"]) for x, y in zip(chunks, again))
    assert [c["a"].tolist() for c in split_tensor_dict(batch, 2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert shuffle_seed(0, 4, 1) == derived_seed(0, 2, 4, 1) != shuffle_seed(0, 4, 0)


def bnpo_group_weights(micro_batches: list[dict], gradient_accumulation_steps: int) -> list[float]:
    """Share of the gradient of a per-token loss of 1 that each group gets under `loss_type="bnpo"`: the derivative
    of Σ_mb aggregate_loss(mb) / GA with respect to every token, summed per group."""
    weights = torch.zeros(2)
    for mb in micro_batches:
        per_token = torch.ones(mb["mask"].shape, requires_grad=True)
        (aggregate_loss(per_token, mb["mask"], "bnpo") / gradient_accumulation_steps).backward()
        for g in range(2):
            weights[g] += per_token.grad[mb["group"] == g].sum()
    return weights.tolist()


def test_bnpo_micro_batches_mix_groups_as_in_trl():
    """Two groups of 4 completions, 2 and 8 tokens long; gradient accumulation = steps_per_generation = 2."""
    lengths = torch.tensor([2] * 4 + [8] * 4)
    batch = {"mask": (torch.arange(8).unsqueeze(0) < lengths.unsqueeze(1)).long(), "group": torch.arange(8) // 4}
    # Groups kept together (what we did): one micro-batch per group, each gets half of the gradient.
    assert bnpo_group_weights(split_tensor_dict(batch, 2), 2) == pytest.approx([0.5, 0.5])
    # Two completions of each group per micro-batch: 4 + 16 tokens each, the short group gets 8 / 40.
    seed = next(
        s
        for s in range(100)
        if sorted(torch.randperm(8, generator=torch.Generator().manual_seed(s))[:4] // 4) == [0, 0, 1, 1]
    )
    assert bnpo_group_weights(shuffle_and_split(batch, 2, seed), 2) == pytest.approx([0.2, 0.8])
    # TRL shuffles uniformly; over seeds the short group's weight averages the hypergeometric mix of the splits
    # (k short completions in the first micro-batch, P(k) = C(4,k)·C(4,4-k)/70): ≈ 0.233, not 0.5.
    split_weight = {0: 0.5, 1: 0.5 * 2 / 26 + 0.5 * 6 / 14, 2: 0.2, 3: 0.5 * 2 / 26 + 0.5 * 6 / 14, 4: 0.5}
    expected = sum(split_weight[k] * p for k, p in zip(range(5), (1 / 70, 16 / 70, 36 / 70, 16 / 70, 1 / 70)))
    assert expected == pytest.approx(0.2327, abs=1e-4)
    mean = sum(bnpo_group_weights(shuffle_and_split(batch, 2, s), 2)[0] for s in range(400)) / 400
    assert mean == pytest.approx(expected, abs=0.01)


def test_trainer_micro_batches_are_the_seeded_shuffle_of_the_generation_batch(
    tiny_lm_path, arithmetic_dataset, grpo_kwargs
):
    args = GRPOConfig(**{**grpo_kwargs, "gradient_accumulation_steps": 2})
    zero = lambda completions, **kw: [0.0] * len(completions)  # noqa: E731
    trainer = GRPOTrainer(tiny_lm_path, zero, args=args, train_dataset=arithmetic_dataset)
    generated = {"row": torch.arange(8), "num_items_in_batch": torch.tensor(5.0)}
    trainer._generate_and_score_completions = lambda inputs: generated
    trainer.model.train()
    first, second = trainer._prepare_inputs(None), trainer._prepare_inputs(None)
    order = torch.randperm(8, generator=torch.Generator().manual_seed(shuffle_seed(args.seed, 0, 0)))
    assert torch.cat([first["row"], second["row"]]).tolist() == order.tolist()
    assert first["num_items_in_batch"].item() == 5.0
    assert trainer._step == 2


def test_repeat_sampler_repeats_each_prompt_and_each_generation_batch():
    sampler = RepeatSampler(range(5), mini_repeat_count=2, batch_size=2, repeat_count=3, shuffle=False)
    chunk = [0, 0, 1, 1]
    assert list(sampler) == chunk * 3 + [2, 2, 3, 3] * 3  # prompt 4 is an incomplete chunk: dropped
    assert len(sampler) == 24
    shuffled = RepeatSampler(range(6), mini_repeat_count=1, batch_size=3, seed=5)
    order = torch.randperm(6, generator=torch.Generator().manual_seed(5)).tolist()
    assert list(shuffled) == order
    shuffled.set_epoch(1)  # each epoch its own seeded order
    assert list(shuffled) == torch.randperm(6, generator=torch.Generator().manual_seed(6)).tolist() != order


@pytest.mark.parametrize(
    "global_step, accumulation, batches, expected",
    [
        (2, 2, 3, 3),  # epoch of 3 micro-batches in windows 2, 1: two optimizer steps are one epoch
        (3, 2, 3, 5),  # then the first window of epoch 2
        (4, 2, 3, 6),
        (3, 2, 4, 6),  # windows that divide the epoch: global_step × accumulation
        (5, 4, 1, 5),  # one micro-batch per epoch: one per step
        (3, 2, None, 6),  # no epochs (iterable dataset)
    ],
)
def test_micro_steps_done_cuts_windows_at_epoch_ends(global_step, accumulation, batches, expected):
    assert micro_steps_done(global_step, accumulation, batches) == expected


def test_sampling_rng_seeds_from_the_position_and_leaves_the_global_stream_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    cpu = torch.device("cpu")
    with sampling_rng(0, False, [4], 1, cpu):
        first = torch.rand(3)
    with sampling_rng(0, False, [4], 1, cpu):
        assert torch.equal(torch.rand(3), first)  # same position, same draws
    with sampling_rng(0, True, [4], 1, cpu):
        assert not torch.equal(torch.rand(3), first)  # evaluation has its own stream
    torch.manual_seed(derived_seed(0, 0, 4, 1))
    assert torch.equal(torch.rand(3), first)
    torch.manual_seed(123)
    with sampling_rng(0, False, [5], 0, cpu):
        torch.rand(100)
    assert torch.equal(torch.rand(3), expected_next)  # the block consumed nothing of the global stream


def test_reward_columns_and_conversational_prompts():
    batch = [{"prompt": "1+1=", "answer": 2, "completion": "x"}, {"prompt": "2+2=", "answer": 4, "completion": "y"}]
    assert reward_columns(batch) == {"answer": [2, 4]}
    assert not is_conversational(batch[0])
    assert is_conversational({"prompt": [{"role": "user", "content": "hi"}]})
    assert not is_conversational({"prompt": []})


# ---------------------------------------------------------------- datasets too small for one batch; data_seed


def constant_reward(completions, **kwargs) -> list[float]:
    return [0.0] * len(completions)


def test_train_dataset_smaller_than_a_generation_batch_raises_at_init(tiny_lm_path, grpo_kwargs):
    """Before any generation: with 8 completions per generation batch (4 × 1 process × 2 steps) of 4 per prompt,
    one prompt (or none) cannot fill a batch; `RepeatSampler` would drop it and training would take no step."""
    args = GRPOConfig(**grpo_kwargs)
    batch = (
        "one generation batch needs 2 distinct prompts (generation_batch_size 8 = per_device_train_batch_size 4 × 1 "
        "processes × steps_per_generation 2, divided by num_generations 4), so training would take no step. Add "
        "prompts, or lower per_device_train_batch_size or steps_per_generation (generation_batch_size), or raise "
        "num_generations."
    )
    for prompts, count in ((["1+1="], "1 prompt"), ([], "0 prompts")):
        dataset = Dataset.from_dict({"prompt": prompts})
        with pytest.raises(ValueError) as error:
            GRPOTrainer(tiny_lm_path, constant_reward, args=args, train_dataset=dataset)
        assert str(error.value) == f"train_dataset has {count}, but {batch}"
    two = Dataset.from_dict({"prompt": ["1+1=", "2+2="]})
    assert len(GRPOTrainer(tiny_lm_path, constant_reward, args=args, train_dataset=two).get_train_dataloader()) == 2


def test_eval_dataset_too_small_for_one_eval_batch_raises(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """An empty eval dataset raises (at init, or when given to `evaluate`); a smaller one than an eval batch (8 × 1
    process / 4 = 2 prompts) only with `dataloader_drop_last=True`, which would drop its only, incomplete batch."""
    one, empty = Dataset.from_dict({"prompt": ["1+1="]}), Dataset.from_dict({"prompt": []})
    args = GRPOConfig(**grpo_kwargs)
    with pytest.raises(ValueError) as error:
        GRPOTrainer(tiny_lm_path, constant_reward, args=args, train_dataset=arithmetic_dataset, eval_dataset=empty)
    empty_message = (
        "eval_dataset has 0 prompts: evaluation would generate nothing. Add prompts, or pass no eval_dataset."
    )
    assert str(error.value) == empty_message
    trainer = GRPOTrainer(tiny_lm_path, constant_reward, args=args, train_dataset=arithmetic_dataset, eval_dataset=one)
    assert [len(batch) for batch in trainer.get_eval_dataloader()] == [4]  # one partial batch: the prompt × 4
    with pytest.raises(ValueError) as error:
        trainer.evaluate(eval_dataset=empty)  # given to evaluate() only
    assert str(error.value) == empty_message
    args = GRPOConfig(**grpo_kwargs, dataloader_drop_last=True)
    with pytest.raises(ValueError) as error:
        GRPOTrainer(
            tiny_lm_path, constant_reward, args=args, train_dataset=arithmetic_dataset, eval_dataset={"small": one}
        )
    assert str(error.value) == (
        "eval_dataset['small'] has 1 prompt, but one eval batch needs 2 (per_device_eval_batch_size 8 × 1 processes "
        "/ num_generations_eval 4) and dataloader_drop_last=True drops an incomplete batch, so evaluation would "
        "generate nothing. Add prompts, lower per_device_eval_batch_size, raise num_generations_eval, or set "
        "dataloader_drop_last=False."
    )


def _loader_prompts(loader) -> list[str]:
    return [row["prompt"] for batch in loader for row in batch]


def test_data_seed_alone_decides_the_train_and_eval_prompt_order(tiny_lm_path, arithmetic_dataset, grpo_kwargs):
    """What the trainer reads (its train and eval dataloaders) with `data_seed` set depends on it and not on `seed`;
    unset, the order is `seed`'s, as before `data_seed` was read (TRL 1.16 never reads it)."""
    prompts = arithmetic_dataset["prompt"]

    def orders(seed, data_seed):
        args = GRPOConfig(**{**grpo_kwargs, "seed": seed, "beta": 0.0}, data_seed=data_seed)
        trainer = GRPOTrainer(
            tiny_lm_path, constant_reward, args=args, train_dataset=arithmetic_dataset, eval_dataset=arithmetic_dataset
        )
        return _loader_prompts(trainer.get_train_dataloader()), _loader_prompts(trainer.get_eval_dataloader())

    def expected(seed):  # 2 prompts per generation batch, each read by 2 micro-steps; eval: every prompt once
        train = RepeatSampler(range(64), mini_repeat_count=4, batch_size=2, repeat_count=2, seed=seed)
        evaluation = RepeatSampler(range(64), mini_repeat_count=4, seed=seed)
        return [prompts[i] for i in train], [prompts[i] for i in evaluation]

    assert orders(seed=7, data_seed=None) == expected(7)
    assert orders(seed=0, data_seed=1) == orders(seed=5, data_seed=1) == expected(1)
    assert orders(seed=0, data_seed=2) == expected(2)
    assert expected(1)[0][:8] != expected(2)[0][:8] and expected(1)[1][:8] != expected(2)[1][:8]
