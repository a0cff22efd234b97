# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Prefills: a conversational prompt whose last message is the assistant's is continued, not answered in a new turn,
by the trainer's tokenisation, the reward models' rendering and `trl grpo` (issue 43)."""

import json
import sys

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from trl import GRPOConfig, GRPOTrainer
from trl.scripts.grpo import run as grpo_run
from trl.trainer.grpo_inputs import tokenize_prompts
from trl.trainer.grpo_rewards import reward_model_inputs
from trl.trainer.reward_model_refresh import score_examples


QUESTION = {"role": "user", "content": "What is 3 + 4?"}
PREFILL = [QUESTION, {"role": "assistant", "content": "The answer is"}]
PLAIN = [QUESTION]
# The tiny tokenizer's ChatML template (trl/models/tiny.py), rendered by hand.
USER_TURN = "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n"
PREFILL_TEXT = USER_TURN + "<|im_start|>assistant\nThe answer is"  # left open: the model writes the next token
PLAIN_TEXT = USER_TURN + "<|im_start|>assistant\n"  # the generation prompt


@pytest.fixture(scope="module")
def tokenizer(tiny_lm_path):
    return AutoTokenizer.from_pretrained(tiny_lm_path)


def test_prefill_helpers():
    from trl.data_utils import conversation_with_completion, is_prefill, prompt_template_flags

    assert is_prefill(PREFILL) and not is_prefill(PLAIN)
    assert not is_prefill("The answer is") and not is_prefill([])
    assert prompt_template_flags(PREFILL) == {"add_generation_prompt": False, "continue_final_message": True}
    assert prompt_template_flags(PLAIN) == {"add_generation_prompt": True, "continue_final_message": False}
    completion = [{"role": "assistant", "content": " 7."}]
    assert conversation_with_completion(PREFILL, completion) == [
        QUESTION,
        {"role": "assistant", "content": "The answer is 7."},
    ]
    assert conversation_with_completion(PLAIN, completion) == [QUESTION, *completion]
    assert PREFILL[-1] == {"role": "assistant", "content": "The answer is"}  # not modified


def test_prompt_ids_of_a_mixed_batch_continue_each_prefill(tokenizer):
    """A prefilled prompt's ids end with the prefill's text (before: `<|im_end|>` and a new assistant header after
    it); the other prompts of the batch still get the generation prompt."""
    ids, truncated = tokenize_prompts(tokenizer, [PLAIN, PREFILL, PLAIN, PREFILL])
    assert [tokenizer.decode(row) for row in ids] == [PLAIN_TEXT, PREFILL_TEXT, PLAIN_TEXT, PREFILL_TEXT]
    assert ids[1] == tokenizer(PREFILL_TEXT, add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer(PLAIN_TEXT, add_special_tokens=False)["input_ids"]
    assert truncated.tolist() == [False] * 4
    only_prefills, _ = tokenize_prompts(tokenizer, [PREFILL, PREFILL])
    assert only_prefills == [ids[1], ids[1]]


def test_a_template_that_cannot_continue_names_the_prompt(tiny_lm_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_path)
    # A template that drops assistant messages: the prefill is nowhere in the rendered text.
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}"
    )
    with pytest.raises(ValueError) as raised:
        tokenize_prompts(tokenizer, [PLAIN, PREFILL])
    assert str(raised.value).startswith(
        "Prompt 1 of the batch ends with an assistant message (a prefill, which the model continues), but the chat "
        "template could not render it with continue_final_message=True: continue_final_message is set but the final "
        "message does not appear in the chat"
    )


def test_reward_model_reads_the_prefill_once_in_the_continued_turn(tokenizer, tiny_rm_path):
    completions = [[{"role": "assistant", "content": " 7."}], [{"role": "assistant", "content": "7."}]]
    encoded = reward_model_inputs(tokenizer, [PREFILL, PLAIN], completions)
    texts = [tokenizer.decode(row[mask.bool()]) for row, mask in zip(encoded["input_ids"], encoded["attention_mask"])]
    prefilled = USER_TURN + "<|im_start|>assistant\nThe answer is 7.<|im_end|>\n"
    plain = USER_TURN + "<|im_start|>assistant\n7.<|im_end|>\n"
    assert texts == [prefilled, plain]
    # The reward-model refresh trains on the same inputs: its score is the model's on the merged turn.
    model = AutoModelForSequenceClassification.from_pretrained(tiny_rm_path).eval()
    with torch.no_grad():
        scores = score_examples(model, tokenizer, [{"prompt": PREFILL, "completion": completions[0]}])
        expected = model(**tokenizer(prefilled, return_tensors="pt", add_special_tokens=False)).logits[0, 0]
    assert scores.tolist() == [expected.item()]


def _recording_reward(store: dict):
    def reward(prompts, completions, completion_ids, **kwargs):
        store.update(prompts=prompts, completions=completions, completion_ids=completion_ids)
        return [0.0] * len(completions)

    return reward


def test_trainer_generates_after_the_prefill_and_rewards_see_the_new_text(tiny_lm_path, grpo_kwargs):
    store = {}
    dataset = Dataset.from_list([{"prompt": PREFILL}, {"prompt": PLAIN}])
    trainer = GRPOTrainer(
        AutoModelForCausalLM.from_pretrained(tiny_lm_path),
        _recording_reward(store),
        args=GRPOConfig(**{**grpo_kwargs, "max_prompt_length": None}),
        train_dataset=dataset,
    )
    tokenizer = trainer.processing_class
    trainer.model.train()
    inputs = [dataset[0]] * 2 + [dataset[1]] * 2
    output = trainer._generate_and_score_completions(inputs)
    prompts = [tokenizer.decode(row[mask.bool()]) for row, mask in zip(output["prompt_ids"], output["prompt_mask"])]
    assert prompts == [PREFILL_TEXT, PREFILL_TEXT, PLAIN_TEXT, PLAIN_TEXT]
    # Reward functions get the prompt as given (prefill included) and, as the completion, only what the model added.
    assert store["prompts"] == [PREFILL, PREFILL, PLAIN, PLAIN]
    new_texts = tokenizer.batch_decode(store["completion_ids"], skip_special_tokens=True)
    assert store["completions"] == [[{"role": "assistant", "content": text}] for text in new_texts]
    assert all(text for text in new_texts)


def test_trl_grpo_continues_prefills(tmp_path, tiny_lm_path, monkeypatch):
    data = tmp_path / "prefills.jsonl"
    data.write_text("".join(json.dumps({"prompt": PREFILL}) + "\n" for _ in range(4)))
    (tmp_path / "prefill_rewards.py").write_text(
        "SEEN = []\n\n\ndef record(prompts, completions, completion_ids, **kwargs):\n"
        "    SEEN.append((prompts, completions, completion_ids))\n    return [0.0] * len(completions)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "prefill_rewards", raising=False)
    trainer = grpo_run(
        [
            *("--model_name_or_path", tiny_lm_path, "--dataset_name", str(data)),
            *("--reward_funcs", "prefill_rewards:record", "--output_dir", str(tmp_path / "out")),
            *("--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "3"),
            *("--max_steps", "1", "--use_cpu", "true", "--bf16", "false", "--gradient_checkpointing", "false"),
            *("--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true"),
        ]
    )
    assert trainer.state.global_step == 1
    tokenizer = trainer.processing_class
    prompt_ids, _, _ = trainer._tokenize_prompts([PREFILL])
    assert tokenizer.decode(prompt_ids[0]) == PREFILL_TEXT
    (prompts, completions, completion_ids), *_ = sys.modules["prefill_rewards"].SEEN
    assert prompts == [PREFILL] * 4
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    assert completions == [[{"role": "assistant", "content": text}] for text in texts]
