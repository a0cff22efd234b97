# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""What goes into generation and into the loss, as TRL 1.16 builds it: the order prompts are drawn in, prompt token
ids, the seeds of sampling and shuffling, the tokens that stop a completion, the dataset columns reward functions
receive, and the shuffled micro-batches of a generation batch."""

import copy
import math
from collections.abc import Iterator, Sized
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from datasets import IterableDataset
from torch.utils.data import IterableDataset as TorchIterableDataset
from torch.utils.data import Sampler
from transformers import PreTrainedTokenizerBase
from transformers.utils import logging

from ..data_utils import is_prefill, prompt_template_flags


logger = logging.get_logger(__name__)


def derived_seed(*entropy: int) -> int:
    """A 63-bit seed that depends on every number in `entropy` (e.g. seed, purpose, step, process), well mixed."""
    return int(np.random.SeedSequence(list(entropy)).generate_state(1, dtype=np.uint64)[0] >> 1)


def shuffle_seed(seed: int, step: int, process_index: int) -> int:
    """Seed of the micro-batch shuffle of the generation batch made at micro-step `step` on a process."""
    return derived_seed(seed, 2, step, process_index)  # 0 and 1 seed train and eval sampling


@contextmanager
def sampling_rng(
    seed: int, evaluation: bool, position: list[int], process_index: int, device: torch.device
) -> Iterator[None]:
    """Run the block with the torch RNG (CPU and `device`) seeded from (seed, train/eval, position, process), and
    leave the global RNG streams as they were.

    The position is the micro-step for training, and (optimizer step, batch index within the evaluation) for
    evaluation. Completions then depend on where training is, not on what consumed random numbers before, so a run
    resumed from a checkpoint samples (and evaluates) exactly what the uninterrupted run did, and no two generation
    batches share draws.
    """
    devices = [device] if device.type != "cpu" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
        torch.manual_seed(derived_seed(seed, int(evaluation), *position, process_index))
        yield


def micro_steps_done(global_step: int, gradient_accumulation_steps: int, batches_per_epoch: int | None) -> int:
    """Micro-batches the `Trainer` has trained on after `global_step` optimizer steps.

    `Trainer` cuts every epoch into accumulation windows of `gradient_accumulation_steps` micro-batches, the last one
    shorter when the epoch's `batches_per_epoch` is not a multiple of it, and resumes at the start of an epoch's
    `global_step % updates_per_epoch`-th window. `batches_per_epoch=None` (an iterable dataset: no epochs) gives
    `global_step × gradient_accumulation_steps`.

    Example: 3 micro-batches per epoch and 2 per window make windows of 2, 1, 2, 1: 2 optimizer steps are 3
    micro-batches.
    """
    if batches_per_epoch is None:
        return global_step * gradient_accumulation_steps
    updates_per_epoch = max(math.ceil(batches_per_epoch / gradient_accumulation_steps), 1)
    epochs, updates = divmod(global_step, updates_per_epoch)
    return epochs * batches_per_epoch + updates * gradient_accumulation_steps


class RepeatSampler(Sampler):
    """Yields dataset indices so that each prompt appears G times in a row and each generation batch is re-read.

    Order: shuffle the indices (seeded per epoch), cut them into chunks of `batch_size` unique prompts (dropping
    an incomplete last chunk), and yield each chunk `repeat_count` times, each index `mini_repeat_count` times in a
    row. With `mini_repeat_count = num_generations`, `batch_size = generation_batch_size / num_generations` and
    `repeat_count = num_iterations × steps_per_generation`, every micro-batch the `Trainer` asks for belongs to one
    generation batch, which the trainer generates once and then slices.
    """

    def __init__(
        self,
        data_source: Sized,
        mini_repeat_count: int,
        batch_size: int = 1,
        repeat_count: int = 1,
        shuffle: bool = True,
        seed: int = 0,
    ):
        self.num_samples = len(data_source)
        self.mini_repeat_count = mini_repeat_count
        self.batch_size = batch_size
        self.repeat_count = repeat_count
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=generator).tolist()
        else:
            order = list(range(self.num_samples))
        for start in range(0, self.num_samples - self.batch_size + 1, self.batch_size):
            chunk = order[start : start + self.batch_size]
            for _ in range(self.repeat_count):
                for index in chunk:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        return (self.num_samples // self.batch_size) * self.batch_size * self.mini_repeat_count * self.repeat_count


def reward_columns(inputs: list[dict[str, Any]]) -> dict[str, list]:
    """The dataset columns of a batch that reward (and label) functions receive as keyword arguments, one list per
    column: every key of the examples except `prompt`, `completion` and `completion_ids`."""
    return {k: [x[k] for x in inputs] for k in inputs[0] if k not in ("prompt", "completion", "completion_ids")}


def stop_token_ids(tokenizer_eos_token_id: int | None, model_eos_token_id: int | list[int] | None) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS, then each id of the model's
    `generation_config.eos_token_id` (instruct models list several, e.g. an end-of-turn token)."""
    if model_eos_token_id is None:
        ids = []
    else:
        ids = [model_eos_token_id] if isinstance(model_eos_token_id, int) else list(model_eos_token_id)
    if tokenizer_eos_token_id is not None and tokenizer_eos_token_id not in ids:
        ids = [tokenizer_eos_token_id, *ids]
    return ids


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, prompts: list[list[dict]], kwargs: dict[str, Any]) -> list:
    """Token ids of B conversational prompts rendered with the chat template: a prompt that ends with an assistant
    message (a prefill, `data_utils.is_prefill`) is continued (`continue_final_message=True`, no generation prompt),
    so its ids end with the prefill's text; the others get the generation prompt, in one batched call as before.
    Each prefill is rendered on its own so that an error names it.

    Raises:
        ValueError: if the chat template cannot continue a prefill (transformers' message, with the prompt's index).
    """
    ids = [None] * len(prompts)
    opened = [i for i, prompt in enumerate(prompts) if not is_prefill(prompt)]
    if opened:
        encoded = tokenizer.apply_chat_template(
            [prompts[i] for i in opened],
            tokenize=True,
            return_dict=True,
            **prompt_template_flags(prompts[opened[0]]),
            **kwargs,
        )
        for i, row in zip(opened, encoded["input_ids"]):
            ids[i] = list(row)
    for i, prompt in enumerate(prompts):
        if ids[i] is not None:
            continue
        try:
            encoded = tokenizer.apply_chat_template(
                [prompt], tokenize=True, return_dict=True, **prompt_template_flags(prompt), **kwargs
            )
        except ValueError as error:
            raise ValueError(
                f"Prompt {i} of the batch ends with an assistant message (a prefill, which the model continues), but "
                f"the chat template could not render it with continue_final_message=True: {error}"
            ) from error
        ids[i] = list(encoded["input_ids"][0])
    return ids


def tokenize_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list,
    max_prompt_length: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[list[list[int]], torch.Tensor]:
    """Token ids of a batch of prompts, as TRL 1.16 tokenizes them except for prefills (unpadded:
    `grpo_generation.left_pad` pads).

    Standard (text) prompts go through `tokenizer(text)`, which adds the tokenizer's special tokens (the BOS of
    Llama-style tokenizers). Conversational prompts (lists of messages) go through `apply_chat_template` with the
    generation prompt, which adds only what the template writes (a BOS, a default system turn...); a prompt whose
    last message is from `assistant` is a prefill, continued instead (see `chat_prompt_ids`; TRL 1.16 opens a new
    assistant turn after it). With
    `max_prompt_length`, longer prompts keep their last `max_prompt_length` tokens and a warning counts them.

    Args:
        tokenizer: the policy's tokenizer, with a pad token.
        prompts: B texts or B lists of `{"role", "content"}` messages.
        max_prompt_length: optional cut (TRL 1.16 has none).
        chat_template_kwargs: extra keyword arguments for the chat template (e.g. `{"enable_thinking": False}`).

    Returns:
        `(prompt_ids, truncated)`: B lists of token ids, and a `(B,)` bool tensor of the prompts that were cut.
    """
    conversational = isinstance(prompts[0], list)
    if conversational:
        ids = chat_prompt_ids(tokenizer, prompts, chat_template_kwargs or {})
    else:
        ids = [list(row) for row in tokenizer(text=prompts)["input_ids"]]
    truncated = torch.tensor([max_prompt_length is not None and len(row) > max_prompt_length for row in ids])
    if truncated.any():
        logger.warning(
            f"max_prompt_length={max_prompt_length} cut {int(truncated.sum())} of {len(ids)} prompts in this batch "
            f"(longest: {max(len(row) for row in ids)} tokens) to their last {max_prompt_length} tokens; set "
            "max_prompt_length=None to keep prompts whole."
        )
        ids = [row[-max_prompt_length:] for row in ids]
    return ids, truncated


def split_tensor_dict(batch: dict[str, Any], num_chunks: int) -> list[dict[str, Any]]:
    """Split every tensor with a batch dimension into `num_chunks` equal parts; scalars and `None` are shared."""
    chunks = [{} for _ in range(num_chunks)]
    for key, value in batch.items():
        parts = (
            value.chunk(num_chunks) if isinstance(value, torch.Tensor) and value.dim() > 0 else [value] * num_chunks
        )
        for chunk, part in zip(chunks, parts):
            chunk[key] = part
    return chunks


def micro_batch_rows(rows: int, num_chunks: int, seed: int) -> list[torch.Tensor]:
    """The rows of a generation batch of `rows` rows that each micro-batch of `shuffle_and_split(batch, num_chunks,
    seed)` holds, in that micro-batch's order: `num_chunks` int64 CPU tensors of `rows / num_chunks` indices."""
    return list(torch.randperm(rows, generator=torch.Generator().manual_seed(seed)).chunk(num_chunks))


def by_passes(
    score, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, passes
) -> torch.Tensor:
    """Per-token scores of every row, one call per group of rows: `score(input_ids, attention_mask, logits_to_keep,
    batch_size)` → `(n, L)` runs once for each index tensor of `passes` (together they hold each row once) on those
    rows in that order, all in one pass (`batch_size` = n), and the results are put back in row order.

    Args:
        score: e.g. `GRPOTrainer._ref_per_token_logps`.
        input_ids, attention_mask: `(N, P + L)`.
        logits_to_keep: L.
        passes: int64 index tensors (on any device).

    Returns:
        `(N, L)` float32 tensor.
    """
    out = torch.empty(input_ids.size(0), logits_to_keep, dtype=torch.float32, device=input_ids.device)
    for rows in passes:
        rows = rows.to(input_ids.device)
        out[rows] = score(input_ids[rows], attention_mask[rows], logits_to_keep, rows.numel())
    return out


def shuffle_and_split(batch: dict[str, Any], num_chunks: int, seed: int) -> list[dict[str, Any]]:
    """Shuffle the rows of a generation batch (one permutation for every tensor) and cut it into micro-batches.

    As in TRL, micro-batches mix completions of different groups; this changes the gradient of per-micro-batch
    normalisations such as `loss_type="bnpo"`. The permutation is `torch.randperm` under a generator seeded with
    `seed`, so a run (and a resumed run) shuffles the same way every time.

    Args:
        batch: tensors with the same first dimension N (scalars and `None` are shared by every micro-batch).
        num_chunks: number of micro-batches; must divide N.
        seed: seed of the permutation.

    Returns:
        `num_chunks` dicts with the same keys.
    """
    rows = next(v.size(0) for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    order = torch.cat(micro_batch_rows(rows, num_chunks, seed))
    shuffled = {
        key: value[order.to(value.device)] if isinstance(value, torch.Tensor) and value.dim() > 0 else value
        for key, value in batch.items()
    }
    return split_tensor_dict(shuffled, num_chunks)


def check_prompt_datasets(train_dataset, eval_dataset=None) -> None:
    """Raise a `ValueError` unless there is a `train_dataset` and every dataset with known columns has `"prompt"`.

    `eval_dataset` may be a dict of named datasets (each is checked). A stream whose columns are unknown until it is
    read (`IterableDataset.column_names` is `None`, e.g. `IterableDataset.from_generator`) is not read here: a
    missing `"prompt"` then shows up as a `KeyError` at its first batch.
    """
    if train_dataset is None:
        raise ValueError(
            "`train_dataset` is required: GRPOTrainer samples its prompts from it (a dataset with a 'prompt' column)."
        )
    named = [("train_dataset", train_dataset)]
    if isinstance(eval_dataset, dict):
        named += [(f"eval_dataset[{key!r}]", dataset) for key, dataset in eval_dataset.items()]
    else:
        named.append(("eval_dataset", eval_dataset))
    for name, dataset in named:
        columns = getattr(dataset, "column_names", None)
        if isinstance(columns, list) and "prompt" not in columns:
            raise ValueError(f"{name} needs a 'prompt' column; it has {columns}.")


def prompts_per_generation_batch(args) -> int:
    """Distinct prompts in one training generation batch: `generation_batch_size / num_generations`."""
    return args.generation_batch_size // args.num_generations


def prompt_count(count: int) -> str:
    """`count` in words: "1 prompt", "3 prompts"."""
    return f"{count} prompt" if count == 1 else f"{count} prompts"


def too_few_train_prompts_message(name: str, count: str, args) -> str:
    """What a user sees when `name` holds `count` (e.g. "1 prompt"), fewer than one generation batch needs."""
    return (
        f"{name} has {count}, but one generation batch needs {prompts_per_generation_batch(args)} distinct "
        f"prompts (generation_batch_size {args.generation_batch_size} = per_device_train_batch_size "
        f"{args.per_device_train_batch_size} × {args.world_size} processes × steps_per_generation "
        f"{args.steps_per_generation}, divided by num_generations {args.num_generations}), so training would take "
        "no step. Add prompts, or lower per_device_train_batch_size or steps_per_generation (generation_batch_size), "
        "or raise num_generations."
    )


def check_prompt_counts(args, train_dataset, eval_dataset=None) -> None:
    """Raise a `ValueError` for a dataset too small to give one batch, before anything is generated.

    Only datasets with a length are checked (a `datasets.IterableDataset` has none: `train_stream` and
    `eval_stream` raise the same error when the stream ends before its first batch).

    - `train_dataset` must hold at least one generation batch of distinct prompts (`generation_batch_size /
      num_generations`): `RepeatSampler` drops an incomplete batch, so fewer prompts give no training step.
    - Each eval dataset (a dict of named ones included) must hold a prompt; with `dataloader_drop_last=True`, at
      least one eval batch of prompts (`per_device_eval_batch_size × num_processes / num_generations_eval`), as the
      incomplete batch is dropped. Without it a smaller eval dataset is evaluated whole in one partial batch.
    """
    if isinstance(train_dataset, Sized) and not isinstance(train_dataset, IterableDataset):
        if len(train_dataset) < prompts_per_generation_batch(args):
            raise ValueError(too_few_train_prompts_message("train_dataset", prompt_count(len(train_dataset)), args))
    named = list(eval_dataset.items()) if isinstance(eval_dataset, dict) else [(None, eval_dataset)]
    eval_rows = args.per_device_eval_batch_size * args.world_size
    num_generations_eval = args.num_generations_eval or args.num_generations
    for key, dataset in named:
        if not isinstance(dataset, Sized) or isinstance(dataset, IterableDataset):
            continue
        name = "eval_dataset" if key is None else f"eval_dataset[{key!r}]"
        if len(dataset) == 0:
            raise ValueError(
                f"{name} has 0 prompts: evaluation would generate nothing. Add prompts, or pass no {name}."
            )
        if args.dataloader_drop_last and eval_rows % num_generations_eval == 0:
            needed = eval_rows // num_generations_eval
            if len(dataset) < needed:
                raise ValueError(
                    f"{name} has {prompt_count(len(dataset))}, but one eval batch needs {needed} "
                    f"(per_device_eval_batch_size {args.per_device_eval_batch_size} × {args.world_size} processes / "
                    f"num_generations_eval {num_generations_eval}) and dataloader_drop_last=True drops an incomplete "
                    "batch, so evaluation would generate nothing. Add prompts, lower per_device_eval_batch_size, "
                    "raise num_generations_eval, or set dataloader_drop_last=False."
                )


def check_eval_batch(per_device_eval_batch_size: int, num_processes: int, num_generations_eval: int) -> None:
    """Raise a `ValueError` unless the global eval batch holds whole groups of `num_generations_eval` completions."""
    if (per_device_eval_batch_size * num_processes) % num_generations_eval:
        raise ValueError(
            f"The global eval batch ({per_device_eval_batch_size} × {num_processes} processes) must be divisible by "
            f"the number of generations used for evaluation ({num_generations_eval}) (num_generations_eval, or "
            "num_generations when unset): change per_device_eval_batch_size or num_generations_eval."
        )


# ---- streams: a `datasets.IterableDataset` cannot take a sampler, so the stream itself is put in RepeatSampler's order

STREAM_DISPATCH_PHRASE = "Iterable datasets require `dispatch_batches=False`"
STREAM_WORKERS_PHRASE = "Iterable datasets require `dataloader_num_workers=0`"
STREAM_MAX_STEPS_PHRASE = "max_steps has to be specified"


def is_stream(dataset) -> bool:
    """Whether `dataset` (or, for a dict of named datasets, any of them) is a `datasets.IterableDataset`."""
    if isinstance(dataset, dict):
        return any(is_stream(member) for member in dataset.values())
    return isinstance(dataset, IterableDataset)


def repeat_iterable_dataset(
    dataset: IterableDataset, mini_repeat_count: int, batch_size: int = 1, repeat_count: int = 1
) -> IterableDataset:
    """The rows of a stream in the order `RepeatSampler(shuffle=False)` gives the same rows of a map-style dataset.

    The stream is read `batch_size` rows at a time (one chunk: the unique prompts of a generation batch); each chunk
    is yielded `repeat_count` times, each row `mini_repeat_count` times in a row. As in `RepeatSampler`, a last
    chunk with fewer than `batch_size` rows is dropped, so every generation batch is whole, and the stream ends
    there (the `Trainer` starts the next epoch from the beginning; `set_epoch` reaches an upstream
    `IterableDataset.shuffle`, which reshuffles). Shuffling is the caller's: `dataset.shuffle(seed)` first (a
    buffered shuffle, not `RepeatSampler`'s full permutation, so the shuffled orders differ). Repeated rows are
    copies: a reward function that edits a row changes no other.

    Example: rows 0…6, `mini_repeat_count=2, batch_size=3, repeat_count=2` gives
    0 0 1 1 2 2 0 0 1 1 2 2 3 3 4 4 5 5 3 3 4 4 5 5 (row 6 is dropped).
    """

    def repeat_chunk(chunk: dict[str, list]) -> dict[str, list]:
        columns = list(chunk)
        rows = list(zip(*chunk.values()))
        out = [row for _ in range(repeat_count) for row in rows for _ in range(mini_repeat_count)]
        return {column: [copy.deepcopy(row[i]) for row in out] for i, column in enumerate(columns)}

    return dataset.map(repeat_chunk, batched=True, batch_size=batch_size, drop_last_batch=True)


class WholeStream(TorchIterableDataset):
    """A stream that every process reads whole, so that accelerate cuts each global batch into one contiguous slice
    per process (`IterableDatasetShard`), the layout `BatchSamplerShard` gives `RepeatSampler`'s batches.

    Handed a `datasets.IterableDataset` with at least as many file shards as processes, accelerate would instead
    give each process its own shards, and each would assemble generation batches from its own prompts: with
    `num_iterations × steps_per_generation > 1` the repeats of a chunk then land on different steps of a process
    and prompts are skipped. `set_epoch` is passed on (an upstream `shuffle` reshuffles per epoch). With
    `empty_message`, a pass that yields no row raises a `ValueError` with it (a stream too small for one batch).
    """

    def __init__(self, dataset: IterableDataset, empty_message: str | None = None):
        self.dataset = dataset
        self.empty_message = empty_message  # a `ValueError` when a pass over the stream yields no row

    def __iter__(self):
        rows = 0
        for rows, row in enumerate(self.dataset, 1):
            yield row
        if rows == 0 and self.empty_message is not None:
            raise ValueError(self.empty_message)

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)


def check_stream_settings(args, train_dataset, eval_dataset=None) -> None:
    """TRL 1.16's settings for `IterableDataset`s, checked (and set) on `args` before the `Trainer` builds its
    accelerator.

    - With any stream (train or eval), `accelerator_config.dispatch_batches` must be `False`: `True` raises a
      `ValueError`; unset (`None`, where accelerate would dispatch a stream) becomes `False`. Dispatching collates
      every batch on process 0 and concatenates the columns as tensors, which fails on the text `"prompt"`.
    - A train stream is read by one loader process: `dataloader_num_workers` other than 0 is set to 0 with a
      warning (workers would each read a share of the stream and interleave their rows, splitting the groups of
      `num_generations`); `dataloader_persistent_workers` and `dataloader_prefetch_factor`, which need workers, are
      reset with it. Map-style datasets keep their workers.
    - A train stream has no length: `max_steps` must be set (as `Trainer` requires; raised here with the number
      of rows a step reads).

    Raises:
        ValueError: for `dispatch_batches=True` with a stream, or a train stream without `max_steps`.
    """
    if not (is_stream(train_dataset) or is_stream(eval_dataset)):
        return
    config = args.accelerator_config
    if config.dispatch_batches:
        raise ValueError(
            f"{STREAM_DISPATCH_PHRASE}, but it is set to `True` in `accelerator_config`: set it to `False` (or leave "
            "it unset). Each process then reads the stream and keeps its own slice of every generation batch, as "
            "with a map-style dataset; with dispatching, process 0 collates the batches and the text 'prompt' "
            "column cannot be concatenated."
        )
    config.dispatch_batches = False
    if not isinstance(train_dataset, IterableDataset):
        return
    if args.max_steps <= 0:
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        raise ValueError(
            f"The train_dataset is an IterableDataset, which has no length, so {STREAM_MAX_STEPS_PHRASE} (the "
            "total number of steps bounds the training loop and the learning rate schedule). Set "
            f"GRPOConfig(max_steps=...) (`--max_steps` on the command line): each optimizer step trains on {per_step} completions per process "
            f"(per_device_train_batch_size × gradient_accumulation_steps, {args.num_generations} per prompt); a "
            "stream that ends before max_steps is read again from its start."
        )
    if args.dataloader_num_workers != 0:
        logger.warning(
            f"{STREAM_WORKERS_PHRASE}: training reads the stream in the main process, so dataloader_num_workers="
            f"{args.dataloader_num_workers} becomes 0 (dataloader_persistent_workers becomes False and "
            "dataloader_prefetch_factor None, as they need workers). Several workers would each read part of the "
            "stream and interleave their rows, splitting the num_generations rows of a prompt; a map-style "
            "`Dataset` keeps its workers."
        )
        args.dataloader_num_workers = 0
        args.dataloader_persistent_workers = False
        args.dataloader_prefetch_factor = None


@contextmanager
def single_process_loading(args) -> Iterator[None]:
    """Within the block, `args` asks for no loader workers (an eval stream's loader); restored afterwards."""
    names = ("dataloader_num_workers", "dataloader_persistent_workers", "dataloader_prefetch_factor")
    saved = {name: getattr(args, name) for name in names}
    args.dataloader_num_workers, args.dataloader_persistent_workers, args.dataloader_prefetch_factor = 0, False, None
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(args, name, value)


def prompt_order(args, num_generations: int) -> dict[str, int]:
    """How training reads prompts, as keyword arguments of `RepeatSampler` and `repeat_iterable_dataset`: each prompt
    `num_generations` times in a row, `generation_batch_size / num_generations` prompts per generation batch, and
    each generation batch read `num_iterations × steps_per_generation` times (once per micro-batch it serves)."""
    return {
        "mini_repeat_count": num_generations,
        "batch_size": args.generation_batch_size // num_generations,
        "repeat_count": args.num_iterations * args.steps_per_generation,
    }


def data_order_seed(args) -> int:
    """The seed of the prompt order (the train and eval samplers' permutations, the streams' shuffle buffers):
    `data_seed` when set, else `seed`. It is a config value, so every process draws the same global order."""
    return args.seed if args.data_seed is None else args.data_seed


def train_sampler(dataset: Sized, args, num_generations: int) -> RepeatSampler:
    """The sampler of a map-style train dataset: `prompt_order`, shuffled with `data_order_seed` when
    `shuffle_dataset`."""
    order = prompt_order(args, num_generations)
    return RepeatSampler(dataset, **order, shuffle=args.shuffle_dataset, seed=data_order_seed(args))


def eval_sampler(dataset: Sized, args, num_generations_eval: int) -> RepeatSampler:
    """The sampler of a map-style eval dataset: every prompt `num_generations_eval` times in a row, in TRL's seeded
    order (a permutation with `data_order_seed`, the same at every evaluation)."""
    return RepeatSampler(dataset, mini_repeat_count=num_generations_eval, seed=data_order_seed(args))


def train_stream(dataset: IterableDataset, args, num_generations: int) -> WholeStream:
    """A train stream in `prompt_order` (after a buffered shuffle with `data_order_seed` when `shuffle_dataset`),
    read whole by every process, which keeps its slice of each batch.

    Raises:
        ValueError: when reading, if the stream ends before one generation batch is full.
    """
    dataset = dataset.shuffle(seed=data_order_seed(args)) if args.shuffle_dataset else dataset
    too_small = too_few_train_prompts_message(
        "train_dataset (a stream)", f"fewer than {prompts_per_generation_batch(args)} prompts", args
    )
    return WholeStream(repeat_iterable_dataset(dataset, **prompt_order(args, num_generations)), too_small)


def eval_stream(dataset: IterableDataset, args, dataloader_config, num_generations_eval: int) -> WholeStream:
    """An eval stream (one given to `evaluate` only is checked here, `check_stream_settings`), with accelerate's
    `dataloader_config.dispatch_batches` off, shuffled (buffered, `data_order_seed`) and each prompt repeated
    `num_generations_eval` times in a row, read whole by every process.

    Raises:
        ValueError: for `accelerator_config.dispatch_batches=True`; when reading, for a stream with no prompt.
    """
    check_stream_settings(args, None, dataset)
    dataloader_config.dispatch_batches = False
    empty = "eval_dataset (a stream) has 0 prompts: evaluation would generate nothing. Add prompts."
    shuffled = dataset.shuffle(seed=data_order_seed(args))
    return WholeStream(repeat_iterable_dataset(shuffled, num_generations_eval), empty)
