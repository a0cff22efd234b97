# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`GRPOTrainer`: Group Relative Policy Optimization (arXiv 2402.03300) with iterative reference-model syncing.

The trainer orchestrates one step as data: prompts → G completions each → rewards → group advantages →
policy/old/reference log-probs → clipped loss with a KL penalty. The maths lives in `grpo_losses`, the reference
syncing in `ref_sync` and `callbacks`.
"""

import json
import os
from collections import defaultdict
from collections.abc import Callable, Sized
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather, gather_object
from datasets import Dataset, IterableDataset
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils.data import Sampler
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Trainer,
    TrainerCallback,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
from transformers.utils import logging

from ..models.utils import (
    create_reference_model,
    disable_dropout_in_model,
    prepare_inference_model,
    unwrap_model_for_generation,
    use_adapter,
)
from .callbacks import SyncRefModelCallback
from .grpo_config import GRPOConfig
from .grpo_generation import sample_completions
from .grpo_losses import (
    aggregate_loss,
    clipped_surrogate,
    combine_rewards,
    completion_mask,
    group_advantages,
    group_reward_std,
    importance_weighted_kl,
    kl_k3,
    masked_mean,
    selective_log_softmax,
)
from .ref_sync import REFERENCE_ADAPTER, add_reference_adapter, gathered_tensor, named_float_tensors


logger = logging.get_logger(__name__)

REF_MODEL_FILE = "ref_model.safetensors"  # full fine-tuning: the synced reference's weights
REF_ADAPTER_FILE = "ref_adapter.safetensors"  # PEFT: the reference adapter's tensors
REF_SYNC_STATE_FILE = "ref_sync_state.json"  # sync counters
GENERATION_BUFFER_FILE = "generation_buffer_rank{rank}.pt"  # the rest of a generation batch cut by a checkpoint


RewardFunc = str | PreTrainedModel | Callable[..., list[float | None]]


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


def is_conversational(example: dict[str, Any]) -> bool:
    """True when the example's `"prompt"` is a list of `{"role", "content"}` messages."""
    prompt = example.get("prompt")
    return isinstance(prompt, list) and len(prompt) > 0 and isinstance(prompt[0], dict) and "role" in prompt[0]


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


def _identity(features):
    return features


def _model_init_kwargs(args: GRPOConfig) -> dict[str, Any]:
    kwargs = args.model_init_kwargs or {}
    kwargs = dict(json.loads(kwargs) if isinstance(kwargs, str) else kwargs)
    dtype = kwargs.pop("torch_dtype", kwargs.get("dtype"))
    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    if dtype is not None:
        kwargs["dtype"] = dtype
    return kwargs


class GRPOTrainer(Trainer):
    """Trainer for Group Relative Policy Optimization (GRPO, DeepSeekMath, arXiv 2402.03300), with iterative GRPO.

    For each prompt, `num_generations` completions are sampled and scored; each completion's advantage is its
    reward relative to its group; the policy is trained with the clipped surrogate plus `beta` × the k3 KL to a
    reference model. With `sync_ref_model=True` the reference is moved towards the policy every
    `ref_model_sync_steps` optimizer steps by `ref_model_mixup_alpha` (Algorithm 1 of arXiv 2402.03300; TR-DPO,
    arXiv 2404.09656) through one registered [`SyncRefModelCallback`].

    Args:
        model (`str` or `PreTrainedModel`):
            The policy: a path (or hub id) loaded with `AutoModelForCausalLM.from_pretrained(model,
            **args.model_init_kwargs)`, or a causal LM.
        reward_funcs (`RewardFunc` or `list[RewardFunc]`):
            Callables `f(prompts, completions, completion_ids, trainer_state, **columns) -> list[float | None]`
            (every other dataset column arrives as a list aligned with the completions; `None` means "does not
            apply"), or sequence-classification reward models (a path or a `PreTrainedModel`; the first logit is
            the reward).
        args ([`GRPOConfig`], *optional*):
            Configuration; defaults to `GRPOConfig("<model name>-GRPO")`.
        train_dataset, eval_dataset ([`~datasets.Dataset`]):
            Must have a `"prompt"` column: text (standard) or a list of messages (conversational, rendered with
            the tokenizer's chat template; completions then reach reward functions as messages).
        processing_class ([`~transformers.PreTrainedTokenizerBase`], *optional*):
            Tokenizer of the policy; loaded from the model's path when omitted. Prompts are left-padded.
        reward_processing_classes (tokenizer or list of them, *optional*):
            Tokenizers for the reward models (aligned with `reward_funcs`); loaded from each model's path when
            omitted.
        callbacks (`list[TrainerCallback]`, *optional*):
            Extra callbacks.
        optimizers (`tuple`, *optional*):
            `(optimizer, lr_scheduler)`, as in [`~transformers.Trainer`].
        peft_config ([`~peft.PeftConfig`], *optional*):
            Train a PEFT adapter instead of the whole model.

    Raises:
        ValueError: for reward weights that do not match the reward functions, a dataset without `"prompt"`, or an
            eval batch that is not divisible by `num_generations`.
    """

    _tag_names = ["trl", "grpo", "iterative-grpo"]

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: RewardFunc | list[RewardFunc],
        args: GRPOConfig | None = None,
        train_dataset: Dataset | IterableDataset | None = None,
        eval_dataset: Dataset | IterableDataset | dict[str, Dataset] | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        reward_processing_classes: PreTrainedTokenizerBase | list[PreTrainedTokenizerBase] | None = None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple = (None, None),
        peft_config=None,
    ):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = GRPOConfig(f"{os.path.basename(str(name).rstrip('/')) or 'model'}-GRPO")

        # Policy
        if isinstance(model, str):
            model = AutoModelForCausalLM.from_pretrained(model, **_model_init_kwargs(args))
        elif args.model_init_kwargs:
            raise ValueError("model_init_kwargs only apply when `model` is a path; you passed an instantiated model.")
        given_peft_model = hasattr(model, "peft_config")
        if peft_config is not None:
            from peft import get_peft_model

            if args.gradient_checkpointing:  # frozen embeddings: let checkpointed blocks still see a grad input
                model.enable_input_require_grads()
            model = get_peft_model(model, peft_config)
        if processing_class is None:
            processing_class = AutoTokenizer.from_pretrained(model.config._name_or_path)
        if processing_class.pad_token is None:
            processing_class.pad_token = processing_class.eos_token

        # Rewards
        if not isinstance(reward_funcs, list):
            reward_funcs = [reward_funcs]
        reward_funcs = [
            AutoModelForSequenceClassification.from_pretrained(f, num_labels=1, **_model_init_kwargs(args))
            if isinstance(f, str)
            else f
            for f in reward_funcs
        ]
        self.reward_funcs = reward_funcs
        self.reward_func_names = [
            f.config._name_or_path.rstrip("/").split("/")[-1] if isinstance(f, nn.Module) else f.__name__
            for f in reward_funcs
        ]
        if args.reward_weights is not None and len(args.reward_weights) != len(reward_funcs):
            raise ValueError(
                f"reward_weights has {len(args.reward_weights)} entries but there are {len(reward_funcs)} reward "
                "functions: give one weight per reward function."
            )
        self.reward_weights = torch.tensor(args.reward_weights or [1.0] * len(reward_funcs), dtype=torch.float32)
        if not isinstance(reward_processing_classes, list):
            reward_processing_classes = [reward_processing_classes] * len(reward_funcs)
        if len(reward_processing_classes) != len(reward_funcs):
            raise ValueError("reward_processing_classes must have one entry per reward function.")
        for i, (func, tokenizer) in enumerate(zip(reward_funcs, reward_processing_classes)):
            if isinstance(func, PreTrainedModel):
                if tokenizer is None:
                    tokenizer = AutoTokenizer.from_pretrained(func.config._name_or_path)
                if tokenizer.pad_token is None:
                    tokenizer.pad_token = tokenizer.eos_token
                func.config.pad_token_id = tokenizer.pad_token_id
                reward_processing_classes[i] = tokenizer
        self.reward_processing_classes = reward_processing_classes

        for name, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            columns = getattr(dataset, "column_names", None)
            if isinstance(columns, list) and "prompt" not in columns:
                raise ValueError(f"{name} needs a 'prompt' column; it has {columns}.")

        # Reference model. Full fine-tuning: a frozen copy. PEFT: the shared base weights plus a frozen copy of the
        # policy adapter when syncing or starting from a given (possibly trained) adapter, else the base model with
        # adapters disabled. None when beta == 0.
        self.beta = args.beta
        self.is_peft_model = hasattr(model, "peft_config")
        self.ref_model, self.ref_adapter = None, None
        if args.beta != 0.0 and not self.is_peft_model:
            self.ref_model = create_reference_model(model)
        elif args.beta != 0.0 and (args.sync_ref_model or given_peft_model):
            add_reference_adapter(model, REFERENCE_ADAPTER)
            self.ref_adapter = REFERENCE_ADAPTER
        if args.disable_dropout:
            for m in (model, self.ref_model):
                if m is not None:
                    disable_dropout_in_model(m)

        self.num_generations = args.num_generations
        self.num_iterations = args.num_iterations
        self.max_prompt_length = args.max_prompt_length
        self.max_completion_length = args.max_completion_length
        self.loss_type = args.loss_type
        self.epsilon_low = args.epsilon
        self.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
        generation_kwargs = dict(
            max_new_tokens=args.max_completion_length,
            do_sample=True,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            pad_token_id=processing_class.pad_token_id,
            eos_token_id=processing_class.eos_token_id,
            bos_token_id=processing_class.bos_token_id,
            cache_implementation=args.cache_implementation,
            disable_compile=True,
        )
        self.generation_config = GenerationConfig(**{**generation_kwargs, **(args.generation_kwargs or {})})
        self.temperature = self.generation_config.temperature  # log-probs use the sampling temperature
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._last_completions: dict[str, list] = {}
        self._buffered_inputs: list[dict[str, Any]] | None = None
        self._step: int | None = None
        self._eval_generations = 0  # eval generation batches so far (seeds their sampling)
        self._total_train_tokens = 0  # prompt + completion tokens seen in training, all processes

        super().__init__(
            model=model,
            args=args,
            data_collator=_identity,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        # Losses are means over the micro-batch: let Trainer divide by the accumulation steps.
        self.model_accepts_loss_kwargs = False
        # One dataloader item = one local generation batch (see RepeatSampler).
        self._train_batch_size = args.per_device_train_batch_size * args.steps_per_generation
        if (
            eval_dataset is not None
            and (args.per_device_eval_batch_size * self.accelerator.num_processes) % self.num_generations
        ):
            raise ValueError(
                f"The global eval batch ({args.per_device_eval_batch_size} × {self.accelerator.num_processes} "
                f"processes) must be divisible by num_generations ({self.num_generations}): change "
                "per_device_eval_batch_size."
            )

        if self.ref_model is not None:
            self.ref_model = prepare_inference_model(self.ref_model, self.accelerator)
        for i, func in enumerate(self.reward_funcs):
            if isinstance(func, PreTrainedModel):
                func.eval().requires_grad_(False)
                self.reward_funcs[i] = prepare_inference_model(func, self.accelerator)

        self.sync_callback: SyncRefModelCallback | None = None
        if args.sync_ref_model:
            existing = [cb for cb in self.callback_handler.callbacks if isinstance(cb, SyncRefModelCallback)]
            if existing:  # a user-supplied one is bound to our reference instead of adding a second one
                self.sync_callback = existing[0]
                self.sync_callback.ref_model, self.sync_callback.accelerator = self.ref_model, self.accelerator
            else:
                self.sync_callback = SyncRefModelCallback(ref_model=self.ref_model, accelerator=self.accelerator)
                self.add_callback(self.sync_callback)

    # ---- data ----

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = ["prompt"]

    def _get_train_sampler(self, train_dataset=None) -> Sampler:
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return RepeatSampler(
            dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.args.shuffle_dataset,
            seed=self.args.seed,
        )

    def _get_eval_sampler(self, eval_dataset) -> Sampler:
        return RepeatSampler(eval_dataset, mini_repeat_count=self.num_generations, shuffle=False, seed=self.args.seed)

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, **kwargs):
        self._step, self._buffered_inputs = None, None
        checkpoint = (
            get_last_checkpoint(self.args.output_dir) if resume_from_checkpoint is True else resume_from_checkpoint
        )
        if checkpoint:
            if self.sync_callback is not None:
                self._load_reference_state(checkpoint)
            self._load_generation_buffer(checkpoint)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)

    # ---- checkpoints: the synced reference travels with the policy ----

    def _reference_tensors(self) -> dict[str, torch.Tensor]:
        """The reference's own tensors by name (this rank's view): the reference model's parameters and floating
        buffers, or the parameters of the PEFT reference adapter."""
        if self.ref_model is not None:
            return dict(named_float_tensors(self.accelerator.unwrap_model(self.ref_model)))
        policy = self.accelerator.unwrap_model(self.model)
        return {name: p for name, p in policy.named_parameters() if self.ref_adapter in name.split(".")}

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        self._save_generation_buffer(folder)
        if self.sync_callback is None:
            return
        # Sharded references (ZeRO-3, FSDP2) are gathered one tensor at a time; every rank takes part.
        state = {}
        for name, tensor in self._reference_tensors().items():
            with gathered_tensor(tensor, modify=False) as full:
                if self.args.should_save:
                    state[name] = full.detach().to("cpu", copy=True).contiguous()
        if not self.args.should_save:
            return
        save_file(state, os.path.join(folder, REF_MODEL_FILE if self.ref_model is not None else REF_ADAPTER_FILE))
        with open(os.path.join(folder, REF_SYNC_STATE_FILE), "w") as f:
            json.dump(self.sync_callback.state_dict(), f)

    def _generation_buffer_file(self, folder: str) -> str:
        return os.path.join(folder, GENERATION_BUFFER_FILE.format(rank=self.accelerator.process_index))

    def _save_generation_buffer(self, folder: str) -> None:
        """A checkpoint inside a generation batch keeps the rest of that batch (this process's slices), so that a
        resumed run trains on the same completions, advantages and old log-probs as the uninterrupted one."""
        if self._buffered_inputs is None or self._step % (self.args.steps_per_generation * self.num_iterations) == 0:
            return
        os.makedirs(folder, exist_ok=True)
        torch.save({"step": self._step, "inputs": self._buffered_inputs}, self._generation_buffer_file(folder))

    def _load_generation_buffer(self, checkpoint: str) -> None:
        path = self._generation_buffer_file(checkpoint)
        if os.path.exists(path):
            saved = torch.load(path, map_location=self.accelerator.device, weights_only=True)
            self._step, self._buffered_inputs = saved["step"], saved["inputs"]

    def _load_reference_state(self, checkpoint: str) -> None:
        """Restore the synced reference (and the sync counters) saved in `checkpoint`; warn when there is none.

        Raises:
            ValueError: if the saved tensors do not match the reference's names.
        """
        weights = os.path.join(checkpoint, REF_MODEL_FILE if self.ref_model is not None else REF_ADAPTER_FILE)
        if not os.path.exists(weights):
            logger.warning(
                f"Checkpoint {checkpoint} has no synced reference model ({os.path.basename(weights)}): the reference "
                "restarts from the initial model, so the KL anchor jumps back to where training began. Checkpoints "
                "written by this version with sync_ref_model=True include it."
            )
            return
        saved, tensors = load_file(weights), self._reference_tensors()
        if set(saved) != set(tensors):
            raise ValueError(
                f"{weights} does not match the reference model: {sorted(set(saved) ^ set(tensors))[:5]} differ."
            )
        with torch.no_grad():
            for name, tensor in tensors.items():
                with gathered_tensor(tensor, modify=True) as full:
                    full.copy_(saved[name])
        with open(os.path.join(checkpoint, REF_SYNC_STATE_FILE)) as f:
            self.sync_callback.load_state_dict(json.load(f))

    def _prepare_inputs(self, generation_batch: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Return the micro-batch to train on: generate for a new generation batch, else slice the buffered one."""
        if not self.model.training:
            return self._generate_and_score_completions(generation_batch)
        if self._step is None:  # fresh start or resume: micro-steps already done
            self._step = self.state.global_step * self.args.gradient_accumulation_steps
        steps_per_generation = self.args.steps_per_generation
        if self._step % (steps_per_generation * self.num_iterations) == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            self._buffered_inputs = split_tensor_dict(batch, steps_per_generation)
        inputs = self._buffered_inputs[self._step % steps_per_generation]
        self._step += 1
        return inputs

    # ---- generation and scoring ----

    def _get_per_token_logps(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
    ) -> torch.Tensor:
        """Log-probs of the last `logits_to_keep` tokens of `input_ids` under `model`, at `temperature`.

        Position ids come from the attention mask, so left padding does not change the result.

        Args:
            input_ids, attention_mask: `(N, P + L)` prompt + completion.
            logits_to_keep: L.
            batch_size: rows per forward pass (all at once when `None`).

        Returns:
            `(N, L)` float32 tensor.
        """
        batch_size = batch_size or input_ids.size(0)
        out = []
        for start in range(0, input_ids.size(0), batch_size):
            ids = input_ids[start : start + batch_size]
            mask = attention_mask[start : start + batch_size]
            position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=position_ids,
                logits_to_keep=logits_to_keep + 1,
                use_cache=False,
            ).logits
            logits = logits[:, :-1, :] / self.temperature
            out.append(selective_log_softmax(logits, ids[:, -logits_to_keep:]))
        return torch.cat(out, dim=0)

    def _ref_per_token_logps(self, input_ids, attention_mask, logits_to_keep, batch_size) -> torch.Tensor:
        if self.ref_model is not None:
            return self._get_per_token_logps(self.ref_model, input_ids, attention_mask, logits_to_keep, batch_size)
        peft_model = self.accelerator.unwrap_model(self.model)
        context = use_adapter(peft_model, self.ref_adapter) if self.ref_adapter else peft_model.disable_adapter()
        with context:
            return self._get_per_token_logps(self.model, input_ids, attention_mask, logits_to_keep, batch_size)

    @contextmanager
    def _sampling_rng(self, mode: str):
        """Seed sampling from (seed, mode, position, process) and leave the global RNG stream untouched.

        The position is the micro-step for training and a running count of eval batches for evaluation. Completions
        then depend on where training is, not on what consumed random numbers before, so a run resumed from a
        checkpoint samples exactly what the uninterrupted run sampled, and no two generation batches share draws.
        """
        if mode == "train":
            position = (
                self._step
                if self._step is not None
                else self.state.global_step * self.args.gradient_accumulation_steps
            )
        else:
            position, self._eval_generations = self._eval_generations, self._eval_generations + 1
        entropy = [self.args.seed, int(mode == "eval"), position, self.accelerator.process_index]
        seed = int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] >> 1)
        device = self.accelerator.device
        devices = [device] if device.type != "cpu" else []
        with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
            torch.manual_seed(seed)
            yield

    def _calculate_rewards(
        self, inputs: list[dict], prompts: list, completions: list, completion_ids: list[list[int]]
    ) -> torch.Tensor:
        """`(N, F)` float32 rewards, NaN where a function returned `None`.

        Raises:
            ValueError: if a reward function returns a number of rewards different from the number of completions.
        """
        device = self.accelerator.device
        rewards = torch.zeros(len(prompts), len(self.reward_funcs), device=device)
        columns = {
            key: [example[key] for example in inputs]
            for key in inputs[0]
            if key not in ("prompt", "completion", "completion_ids")
        }
        for i, (func, name, tokenizer) in enumerate(
            zip(self.reward_funcs, self.reward_func_names, self.reward_processing_classes)
        ):
            if isinstance(func, nn.Module):
                if is_conversational(inputs[0]):
                    texts = [
                        tokenizer.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)
                    ]
                else:
                    texts = [p + c for p, c in zip(prompts, completions)]
                encoded = tokenizer(
                    text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False
                ).to(device)
                with torch.no_grad():
                    rewards[:, i] = func(**encoded).logits[:, 0].float()
                continue
            values = func(
                prompts=prompts,
                completions=completions,
                completion_ids=completion_ids,
                trainer_state=self.state,
                **columns,
            )
            if values is None or len(values) != len(prompts):
                got = "None" if values is None else len(values)
                raise ValueError(
                    f"Reward function {name!r} returned {got} rewards for {len(prompts)} completions; it must return one float (or None) per completion."
                )
            rewards[:, i] = torch.tensor(
                [float("nan") if v is None else float(v) for v in values], dtype=torch.float32, device=device
            )
        return rewards

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """Generate G completions per prompt, score them and compute everything the loss needs.

        Returns a dict of `prompt_ids`/`prompt_mask` `(N, P)`, `completion_ids`/`completion_mask` `(N, L)`,
        `advantages` `(N,)`, optionally `old_per_token_logps`/`ref_per_token_logps` `(N, L)`, and
        `num_items_in_batch` (scalar, the DAPO normaliser).
        """
        args, device = self.args, self.accelerator.device
        mode = "train" if self.model.training else "eval"
        tokenizer = self.processing_class
        prompts = [example["prompt"] for example in inputs]
        conversational = is_conversational(inputs[0])
        prompts_text = [
            tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) if conversational else p
            for p in prompts
        ]
        encoded = tokenizer(
            text=prompts_text, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
        )
        prompt_ids, prompt_mask = encoded["input_ids"].to(device), encoded["attention_mask"].to(device)
        if self.max_prompt_length is not None:
            prompt_ids, prompt_mask = (
                prompt_ids[:, -self.max_prompt_length :],
                prompt_mask[:, -self.max_prompt_length :],
            )

        with unwrap_model_for_generation(
            self.model_wrapped, self.accelerator, args.ds3_gather_for_generation
        ) as policy:
            with torch.no_grad(), self._sampling_rng(mode):
                completion_ids = sample_completions(
                    policy, prompt_ids, prompt_mask, self.generation_config, args.generation_implementation
                )
        eos_ids = self.generation_config.eos_token_id
        full_mask = completion_mask(completion_ids, eos_ids)  # the tokens of each completion
        terminated = torch.isin(completion_ids, torch.as_tensor(eos_ids, device=device).reshape(-1)).any(dim=1)
        mask = (
            full_mask * terminated.unsqueeze(1).long() if args.mask_truncated_completions else full_mask
        )  # loss mask
        completion_ids_list = [ids[m.bool()].tolist() for ids, m in zip(completion_ids, full_mask)]
        completions_text = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        completions = (
            [[{"role": "assistant", "content": text}] for text in completions_text]
            if conversational
            else completions_text
        )

        # Rewards and advantages over the global batch (a group may straddle processes), then this process's slice.
        rewards_per_func = gather(self._calculate_rewards(inputs, prompts, completions, completion_ids_list))
        rewards, valid = combine_rewards(rewards_per_func, self.reward_weights.to(device))
        advantages = group_advantages(rewards, self.num_generations, args.scale_rewards, valid)
        n_local = len(prompts)
        process_slice = slice(self.accelerator.process_index * n_local, (self.accelerator.process_index + 1) * n_local)

        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        batch_size = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
        # The data is stale (needs the sampling policy's log-probs) when its generation batch spans optimizer steps.
        stale = args.gradient_accumulation_steps % (args.steps_per_generation * self.num_iterations) != 0
        output = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": mask,
            "advantages": advantages[process_slice],
        }
        with torch.no_grad():
            if stale and mode == "train":
                output["old_per_token_logps"] = self._get_per_token_logps(
                    self.model, input_ids, attention_mask, logits_to_keep, batch_size
                )
            if self.beta != 0.0:
                output["ref_per_token_logps"] = self._ref_per_token_logps(
                    input_ids, attention_mask, logits_to_keep, batch_size
                )
        total_tokens = gather(mask.sum()).sum().float()
        micro_batches = args.steps_per_generation if mode == "train" else 1
        output["num_items_in_batch"] = total_tokens / (self.accelerator.num_processes * micro_batches)

        # Metrics
        metrics = self._metrics[mode]
        lengths = gather(full_mask.sum(1)).float()
        all_terminated = gather(terminated)
        if mode == "train":
            self._total_train_tokens += gather(prompt_mask.sum() + full_mask.sum()).sum().item()
            metrics["num_tokens"] = [self._total_train_tokens]  # cumulative, like TRL
        metrics["completions/mean_length"].append(lengths.mean().item())
        metrics["completions/min_length"].append(lengths.min().item())
        metrics["completions/max_length"].append(lengths.max().item())
        metrics["completions/clipped_ratio"].append(1.0 - all_terminated.float().mean().item())
        for i, name in enumerate(self.reward_func_names):
            column = rewards_per_func[:, i]
            column = column[~torch.isnan(column)]
            metrics[f"rewards/{name}/mean"].append(column.mean().item() if column.numel() else float("nan"))
            metrics[f"rewards/{name}/std"].append(column.std().item() if column.numel() > 1 else float("nan"))
        group_std = group_reward_std(rewards, self.num_generations, valid)
        metrics["reward"].append(rewards[valid].mean().item() if valid.any() else float("nan"))
        metrics["reward_std"].append(group_std.mean().item())
        metrics["frac_reward_zero_std"].append((group_std == 0).float().mean().item())
        if args.log_completions and self.accelerator.is_main_process:
            self._last_completions = {
                "prompt": gather_object(prompts_text),
                "completion": gather_object(completions_text),
                "reward": rewards.tolist(),
                "advantage": advantages.tolist(),
            }
        elif args.log_completions:
            gather_object(prompts_text), gather_object(completions_text)
        return output

    # ---- loss ----

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """GRPO loss of one micro-batch: clipped surrogate + beta × k3 KL, reduced as `loss_type` says.

        Raises:
            ValueError: if `return_outputs` is requested (GRPO has no model outputs to return).
        """
        if return_outputs:
            raise ValueError("GRPOTrainer.compute_loss does not return outputs.")
        mode = "train" if self.model.training else "eval"
        completion_ids, mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], mask], dim=1)
        per_token_logps = self._get_per_token_logps(model, input_ids, attention_mask, completion_ids.size(1))
        old_per_token_logps = inputs.get("old_per_token_logps")
        if old_per_token_logps is None:
            old_per_token_logps = per_token_logps.detach()
        per_token_loss, low, high = clipped_surrogate(
            per_token_logps, old_per_token_logps, inputs["advantages"], self.epsilon_low, self.epsilon_high
        )
        metrics = self._metrics[mode]
        if self.beta != 0.0:
            per_token_kl = kl_k3(per_token_logps, inputs["ref_per_token_logps"])
            if self.args.use_bias_correction_kl:
                per_token_kl = importance_weighted_kl(per_token_kl, per_token_logps, old_per_token_logps)
            per_token_loss = per_token_loss + self.beta * per_token_kl
            metrics["kl"].append(gather(masked_mean(per_token_kl.detach(), mask)).nanmean().item())
        loss = aggregate_loss(
            per_token_loss, mask, self.loss_type, self.max_completion_length, inputs["num_items_in_batch"]
        )
        low_ratio, high_ratio = masked_mean(low.float(), mask), masked_mean(high.float(), mask)
        metrics["clip_ratio/low_mean"].append(gather(low_ratio).mean().item())
        metrics["clip_ratio/high_mean"].append(gather(high_ratio).mean().item())
        metrics["clip_ratio/region_mean"].append(gather(low_ratio + high_ratio).mean().item())
        return loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs).mean().detach()
        return loss, None, None

    # ---- logging ----

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        metrics = {key: sum(values) / len(values) for key, values in self._metrics[mode].items() if values}
        if mode == "eval":
            metrics = {f"eval_{key}": value for key, value in metrics.items()}
        elif self.sync_callback is not None:
            metrics["ref_model/num_syncs"] = self.sync_callback.num_syncs
            metrics["ref_model/steps_since_sync"] = self.state.global_step - self.sync_callback.last_sync_step
        super().log({**logs, **metrics}, start_time)
        self._metrics[mode].clear()
        if (
            mode == "train"
            and self.args.log_completions
            and self._last_completions
            and self.accelerator.is_main_process
        ):
            self._print_completions()

    def _print_completions(self) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"Completions at step {self.state.global_step}", show_lines=True)
        for column in ("prompt", "completion", "reward", "advantage"):
            table.add_column(column)
        rows = list(zip(*(self._last_completions[c] for c in ("prompt", "completion", "reward", "advantage"))))
        for prompt, completion, reward, advantage in rows[: self.args.num_completions_to_print or len(rows)]:
            table.add_row(str(prompt), str(completion), f"{reward:.3f}", f"{advantage:.3f}")
        Console().print(table)
