# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Training and evaluating from a `datasets.IterableDataset` (a stream) and with loader workers: the stream's order
against `RepeatSampler`'s, stream runs against map-style runs (same prompts per step, same final weights), and
TRL 1.16's checks on `dispatch_batches`, `dataloader_num_workers` and `max_steps`. Two processes: test_distributed.py."""

import json
import logging
import subprocess
import tempfile

import pytest
import torch
from conftest import tiny_grpo_kwargs
from datasets import Dataset, IterableDataset
from transformers import AutoModelForCausalLM
from upstream_venv import upstream_env, upstream_trl_python_or_skip

from trl import GRPOConfig, GRPOTrainer
from trl.trainer.grpo_inputs import (
    STREAM_DISPATCH_PHRASE,
    STREAM_MAX_STEPS_PHRASE,
    STREAM_WORKERS_PHRASE,
    RepeatSampler,
    check_prompt_datasets,
    eval_stream,
    repeat_iterable_dataset,
    train_stream,
)


PROMPTS = [f"{a}+{b}=" for a in range(4) for b in range(4)]  # 16 prompts: 4 generation batches of 4 (with G=2)
ds = Dataset.from_dict({"prompt": PROMPTS})


class PromptRecorder:
    """A reward function recording the prompts of every call (one call per generation batch)."""

    __name__ = "recorder"

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completion_ids, **kwargs):
        self.calls.append(list(prompts))
        return [float(ids[0] % 5) for ids in completion_ids]


def stream(prompts=PROMPTS, num_shards=1) -> IterableDataset:
    return Dataset.from_dict({"prompt": prompts, "index": list(range(len(prompts)))}).to_iterable_dataset(num_shards)


def config(tmp_path, **overrides) -> GRPOConfig:
    """2 completions per prompt, 4 rows per micro-batch, 2 micro-batches per step and per generation batch."""
    kwargs = dict(per_device_train_batch_size=4, num_generations=2, per_device_eval_batch_size=4, max_steps=2)
    return GRPOConfig(**{**tiny_grpo_kwargs(str(tmp_path / "out")), **kwargs, **overrides})


def train(model, train_dataset, args, eval_dataset=None):
    recorder = PromptRecorder()
    trainer = GRPOTrainer(model, recorder, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset)
    trainer.train()
    return trainer, recorder


def parameters(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


# ---------------------------------------------------------------- the stream's order


def test_repeat_iterable_dataset_gives_repeat_samplers_order():
    rows = [{"prompt": f"p{i}", "i": i} for i in range(7)]
    repeated = repeat_iterable_dataset(
        Dataset.from_list(rows).to_iterable_dataset(), mini_repeat_count=2, batch_size=3, repeat_count=2
    )
    order = [row["i"] for row in repeated]
    assert order == [0, 0, 1, 1, 2, 2] * 2 + [3, 3, 4, 4, 5, 5] * 2  # row 6: an incomplete chunk, dropped
    sampler = RepeatSampler(rows, mini_repeat_count=2, batch_size=3, repeat_count=2, shuffle=False)
    assert order == list(sampler) and len(order) == len(sampler)
    assert [row["prompt"] for row in repeated] == [f"p{i}" for i in order]


def test_repeat_iterable_dataset_on_a_stream_without_known_columns():
    def rows():
        yield from ({"prompt": [{"role": "user", "content": f"q{i}"}]} for i in range(5))

    source = IterableDataset.from_generator(rows)
    assert source.column_names is None
    repeated = list(repeat_iterable_dataset(source, mini_repeat_count=3, batch_size=2))
    assert [row["prompt"][0]["content"] for row in repeated] == ["q0"] * 3 + ["q1"] * 3 + ["q2"] * 3 + ["q3"] * 3
    repeated[0]["prompt"][0]["content"] = "edited"  # repeats are copies
    assert repeated[1]["prompt"][0]["content"] == "q0"
    assert list(repeat_iterable_dataset(source, mini_repeat_count=2, batch_size=6)) == []  # shorter than a chunk


def test_shuffled_stream_is_reshuffled_per_epoch():
    shuffled = repeat_iterable_dataset(stream().shuffle(seed=0), mini_repeat_count=2, batch_size=4)
    first = [row["index"] for row in shuffled]
    assert first[::2] == first[1::2] and sorted(first[::2]) == list(range(16))
    assert first[::2] == [row["index"] for row in stream().shuffle(seed=0)]
    shuffled.set_epoch(1)
    second = [row["index"] for row in shuffled]
    assert sorted(second) == sorted(first) and second != first


# ---------------------------------------------------------------- training from a stream


@pytest.fixture(scope="module")
def map_style_run(tiny_lm_path, tmp_path_factory):
    args = config(tmp_path_factory.mktemp("map"), shuffle_dataset=False, max_steps=3)
    trainer, recorder = train(tiny_lm_path, ds, args)
    weights = parameters(trainer)
    initial = AutoModelForCausalLM.from_pretrained(tiny_lm_path).state_dict()
    assert not all(torch.equal(initial[name], value) for name, value in weights.items())  # training moved them
    return weights, recorder.calls


def test_training_from_a_stream_equals_the_map_style_run(tiny_lm_path, tmp_path, map_style_run):
    """3 steps (a generation batch of 4 prompts every step, 12 of the 16 prompts): each prompt's 2 completions in
    one group, the same prompts at every step, and bitwise the same final weights as the map-style run."""
    weights, prompts = map_style_run
    assert prompts == [[p for p in PROMPTS[4 * k : 4 * k + 4] for _ in range(2)] for k in range(3)]
    args = config(tmp_path, shuffle_dataset=False, max_steps=3)
    trainer, recorder = train(tiny_lm_path, stream(), args)
    assert recorder.calls == prompts
    assert all(torch.equal(weights[name], value) for name, value in parameters(trainer).items())


def test_stream_with_num_iterations_and_a_generation_batch_spanning_steps(tiny_lm_path, tmp_path):
    """num_iterations=2, steps_per_generation=4 (> gradient_accumulation_steps=2): a chunk is repeated 8 times in
    the stream; the trainer generates once per 8 micro-batches, then reads the next chunk, as map-style does."""
    extra = dict(shuffle_dataset=False, num_iterations=2, steps_per_generation=4, max_steps=5)
    runs = [train(tiny_lm_path, data, config(tmp_path / str(i), **extra)) for i, data in enumerate((ds, stream()))]
    expected = [[p for p in PROMPTS[8 * k : 8 * k + 8] for _ in range(2)] for k in range(2)]
    assert runs[0][1].calls == runs[1][1].calls == expected  # 5 steps = 10 micro-batches: 2 generation batches
    weights = [parameters(trainer) for trainer, _ in runs]
    assert all(torch.equal(weights[0][name], value) for name, value in weights[1].items())


def test_shuffled_stream_trains_on_its_buffered_shuffle(tiny_lm_path, tmp_path):
    args = config(tmp_path, shuffle_dataset=True)
    _, recorder = train(tiny_lm_path, stream(), args)
    shuffled = [row["prompt"] for row in stream().shuffle(seed=args.seed)]
    assert recorder.calls == [[p for p in shuffled[4 * k : 4 * k + 4] for _ in range(2)] for k in range(2)]


UPSTREAM_SCRIPT = """
import json, sys
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

calls = []
def recorder(prompts, completion_ids, **kwargs):
    calls.append(list(prompts))
    return [float(ids[0] % 5) for ids in completion_ids]

prompts = [f"{a}+{b}=" for a in range(4) for b in range(4)]
stream = Dataset.from_dict({"prompt": prompts, "index": list(range(16))}).to_iterable_dataset()
args = GRPOConfig(**json.loads(sys.argv[2]))
trainer = GRPOTrainer(sys.argv[1], recorder, args=args, train_dataset=stream)
trainer.train()
settings = [trainer.args.dataloader_num_workers, trainer.args.accelerator_config.dispatch_batches]
print("RESULT", json.dumps({"calls": calls, "settings": settings}))
"""


@pytest.mark.parity
def test_stream_trains_on_the_prompts_trl_trains_on(tiny_lm_path, tmp_path):
    """TRL 1.16 and this trainer, from the same shuffled stream with 2 loader workers asked for: both read it with
    none, and train on the same prompts, in the same groups, at each of 3 steps."""
    python = upstream_trl_python_or_skip()
    overrides = dict(shuffle_dataset=True, max_steps=3, dataloader_num_workers=2)
    kwargs = {k: v for k, v in config(tmp_path, **overrides).to_dict().items() if k in UPSTREAM_FIELDS}
    kwargs.update(output_dir=str(tmp_path / "upstream"), **overrides)
    script = tmp_path / "upstream_stream.py"
    script.write_text(UPSTREAM_SCRIPT)
    command = [python, "-P", str(script), tiny_lm_path, json.dumps(kwargs)]
    done = subprocess.run(
        command, cwd=tempfile.gettempdir(), env=upstream_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    upstream = json.loads(done.stdout.split("RESULT ")[-1])
    trainer, recorder = train(tiny_lm_path, stream(), config(tmp_path, **overrides))
    assert upstream["settings"] == [trainer.args.dataloader_num_workers, False] == [0, False]
    assert recorder.calls == upstream["calls"] and len(recorder.calls) == 3


UPSTREAM_FIELDS = (  # the tiny config's fields that TRL 1.16's GRPOConfig has, and that differ from its defaults
    "use_cpu bf16 gradient_checkpointing beta report_to save_strategy logging_steps disable_tqdm "
    "per_device_train_batch_size num_generations max_completion_length gradient_accumulation_steps learning_rate seed"
).split()


def test_stream_shorter_than_max_steps_is_read_again(tiny_lm_path, tmp_path):
    """6 prompts: one generation batch of 4 per epoch (the last 2 are dropped), so steps 1 and 2 both train on it."""
    _, recorder = train(tiny_lm_path, stream(PROMPTS[:6]), config(tmp_path, shuffle_dataset=False))
    assert recorder.calls == [[p for p in PROMPTS[:4] for _ in range(2)]] * 2


# ---------------------------------------------------------------- settings checks


def test_prompt_column_check_reads_each_named_eval_dataset_and_skips_unknown_columns():
    no_prompt = Dataset.from_dict({"text": ["x"]}).to_iterable_dataset()
    with pytest.raises(ValueError, match=r"^eval_dataset\['b'\] needs a 'prompt' column; it has \['text'\]\.$"):
        check_prompt_datasets(ds, {"a": stream(), "b": no_prompt})
    check_prompt_datasets(IterableDataset.from_generator(lambda: iter([{"text": "x"}])))  # columns unknown: unread


def test_dispatch_batches_true_with_a_stream_raises(tiny_lm_path, tmp_path):
    args = config(tmp_path, accelerator_config={"dispatch_batches": True})
    with pytest.raises(ValueError) as error:
        GRPOTrainer(tiny_lm_path, PromptRecorder(), args=args, train_dataset=stream())
    assert str(error.value).startswith(f"{STREAM_DISPATCH_PHRASE}, but it is set to `True` in `accelerator_config`")
    eval_only = config(tmp_path, accelerator_config={"dispatch_batches": True})  # an eval stream is enough
    with pytest.raises(ValueError, match=STREAM_DISPATCH_PHRASE):
        GRPOTrainer(tiny_lm_path, PromptRecorder(), args=eval_only, train_dataset=ds, eval_dataset={"s": stream()})


def test_dispatch_batches_unset_becomes_false_and_workers_are_forced_to_zero(tiny_lm_path, tmp_path, caplog):
    args = config(tmp_path, dataloader_num_workers=2, dataloader_persistent_workers=True, dataloader_prefetch_factor=2)
    assert args.accelerator_config.dispatch_batches is None
    with caplog.at_level(logging.WARNING, logger="trl.trainer.grpo_inputs"):
        trainer = GRPOTrainer(tiny_lm_path, PromptRecorder(), args=args, train_dataset=stream())
    assert (
        f"{STREAM_WORKERS_PHRASE}: training reads the stream in the main process, so dataloader_num_workers=2 "
        in caplog.text
    )
    assert trainer.args.accelerator_config.dispatch_batches is False
    assert trainer.accelerator.dataloader_config.dispatch_batches is False
    assert (args.dataloader_num_workers, args.dataloader_persistent_workers, args.dataloader_prefetch_factor) == (
        0,
        False,
        None,
    )
    assert trainer.get_train_dataloader().num_workers == 0


def test_map_style_keeps_its_settings(tiny_lm_path, tmp_path, caplog):
    args = config(tmp_path, dataloader_num_workers=2)
    with caplog.at_level(logging.WARNING, logger="trl.trainer.grpo_inputs"):
        trainer = GRPOTrainer(tiny_lm_path, PromptRecorder(), args=args, train_dataset=ds)
    assert STREAM_WORKERS_PHRASE not in caplog.text
    assert trainer.args.dataloader_num_workers == 2 and trainer.args.accelerator_config.dispatch_batches is None


def test_stream_without_max_steps_raises(tiny_lm_path, tmp_path):
    with pytest.raises(ValueError) as error:
        GRPOTrainer(tiny_lm_path, PromptRecorder(), args=config(tmp_path, max_steps=-1), train_dataset=stream())
    message = str(error.value)
    assert f"IterableDataset, which has no length, so {STREAM_MAX_STEPS_PHRASE}" in message
    assert (
        "Set GRPOConfig(max_steps=...) (`--max_steps` on the command line): each optimizer step trains on 8 completions per process"
        in message
    )


def no_rows():
    yield from ()


def test_stream_too_small_for_one_batch_raises_at_its_first_batch(tiny_lm_path, tmp_path):
    """A stream has no length to check at init: 3 prompts, when a generation batch needs 4 (8 completions / 2),
    raise when the stream is first read, before anything is generated; an empty eval stream likewise."""
    recorder = PromptRecorder()
    trainer = GRPOTrainer(tiny_lm_path, recorder, args=config(tmp_path), train_dataset=stream(PROMPTS[:3]))
    with pytest.raises(ValueError) as error:
        trainer.train()
    assert str(error.value) == (
        "train_dataset (a stream) has fewer than 4 prompts, but one generation batch needs 4 distinct prompts "
        "(generation_batch_size 8 = per_device_train_batch_size 4 × 1 processes × steps_per_generation 2, divided "
        "by num_generations 2), so training would take no step. Add prompts, or lower per_device_train_batch_size "
        "or steps_per_generation (generation_batch_size), or raise num_generations."
    )
    with pytest.raises(ValueError) as error:
        trainer.evaluate(eval_dataset=IterableDataset.from_generator(no_rows))
    assert str(error.value) == "eval_dataset (a stream) has 0 prompts: evaluation would generate nothing. Add prompts."
    assert recorder.calls == []


def test_data_seed_alone_decides_the_order_of_streams(tmp_path):
    """The train and eval streams' shuffle buffers are seeded with `data_seed` when it is set, else `seed`."""

    def orders(seed, data_seed):
        args = config(tmp_path, seed=seed, data_seed=data_seed)
        train_rows = [row["index"] for row in train_stream(stream(), args, num_generations=2)]
        loader_config = type("DataLoaderConfig", (), {"dispatch_batches": None})()
        eval_rows = [row["index"] for row in eval_stream(stream(), args, loader_config, num_generations_eval=2)]
        return train_rows, eval_rows

    def expected(seed):  # each generation batch of 4 prompts read by 2 micro-steps; eval: each prompt once
        shuffled = [row["index"] for row in stream().shuffle(seed=seed)]
        train_rows = [i for k in range(4) for _ in range(2) for i in shuffled[4 * k : 4 * k + 4] for _ in range(2)]
        return train_rows, [i for i in shuffled for _ in range(2)]

    assert orders(seed=3, data_seed=None) == expected(3)
    assert orders(seed=0, data_seed=1) == orders(seed=5, data_seed=1) == expected(1) != expected(2)
    assert orders(seed=0, data_seed=2) == expected(2)


def test_map_style_with_loader_workers_trains_on_the_same_prompts(tiny_lm_path, tmp_path, map_style_run):
    weights, prompts = map_style_run
    args = config(tmp_path, shuffle_dataset=False, max_steps=3, dataloader_num_workers=2)
    trainer, recorder = train(tiny_lm_path, ds, args)
    assert trainer.get_train_dataloader().num_workers == 2
    assert recorder.calls == prompts
    assert all(torch.equal(weights[name], value) for name, value in parameters(trainer).items())


# ---------------------------------------------------------------- evaluation from a stream


def test_evaluation_from_a_stream(tiny_lm_path, tmp_path):
    """Every eval prompt once, its 2 completions side by side, in the order of the stream's seeded buffered
    shuffle (TRL's; the map-style eval order is a full permutation); by name in a dict too, and without workers
    for the eval loader only."""
    eval_prompts = PROMPTS[:8]
    args = config(tmp_path, shuffle_dataset=False, max_steps=1, dataloader_num_workers=2)
    recorder = PromptRecorder()
    trainer = GRPOTrainer(
        tiny_lm_path,
        recorder,
        args=args,
        train_dataset=ds,
        eval_dataset={"stream": stream(eval_prompts), "map": Dataset.from_dict({"prompt": eval_prompts})},
    )
    assert trainer.accelerator.dataloader_config.dispatch_batches is False  # an eval stream is enough
    loader = trainer.get_eval_dataloader("stream")
    assert loader.num_workers == 0 and trainer.args.dataloader_num_workers == 2
    metrics = trainer.evaluate()
    shuffled = [row["prompt"] for row in stream(eval_prompts).shuffle(seed=args.seed)]
    expected = [[p for p in shuffled[2 * k : 2 * k + 2] for _ in range(2)] for k in range(4)]
    stream_calls, map_calls = recorder.calls[:4], recorder.calls[4:]
    assert stream_calls == expected
    assert sorted(sum(map_calls, [])) == sorted(sum(expected, [])) and len(map_calls) == 4
    assert {"eval_stream_loss", "eval_map_loss"} <= set(metrics)
    recorder.calls.clear()
    trainer.evaluate(eval_dataset=stream(eval_prompts))  # a stream given to evaluate() only
    assert recorder.calls == expected
