# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`GRPOTrainer`: Group Relative Policy Optimization (arXiv 2402.03300) with iterative reference-model syncing.

The trainer orchestrates one step as data: prompts → G completions each → rewards → group advantages →
policy/old/reference log-probs → clipped loss with a KL penalty. The maths lives in `grpo_losses`, the reward
pipeline in `grpo_rewards`, the reference syncing in `ref_sync` and `callbacks`.
"""

import json
import os
import time
from collections import defaultdict
from collections.abc import Callable, Sized
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from accelerate.utils import gather, gather_object
from datasets import Dataset, IterableDataset
from torch import nn
from torch.utils.data import Sampler
from transformers import (
    AutoModelForCausalLM,
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
from .callbacks import RewardModelRefreshCallback, SyncRefModelCallback
from .entropy_control import EntropyCoefficient
from .grpo_checkpoint import (  # noqa: F401 (file names re-exported for tests and users)
    GENERATION_BUFFER_FILE,
    REF_ADAPTER_FILE,
    REF_MODEL_FILE,
    REF_SYNC_STATE_FILE,
    load_generation_buffer,
    load_reference_state,
    reference_tensors,
    save_generation_buffer,
    save_reference_state,
)
from .grpo_config import GRPOConfig
from .grpo_generation import sample_completions
from .grpo_inputs import (
    derived_seed,
    ends_with_stop,
    shuffle_and_split,
    shuffle_seed,
    split_tensor_dict,  # noqa: F401 (re-exported)
    stop_token_ids,
    tokenize_prompts,
)
from .grpo_losses import (
    POLICY_LOSS_FIELDS,
    aggregate_loss,
    completion_mask,
    high_entropy_mask,
    importance_weighted_kl,
    kl_k3,
    masked_mean,
    pad_to_multiple,
    per_token_policy_loss,
)
from .grpo_metrics import (
    completion_length_metrics,
    loss_metrics,
    reward_std,
    window_mean,
)
from .grpo_rewards import (
    RewardEventLoop,
    RewardFunc,
    RewardLogHooks,
    aggregate_rewards,
    call_reward_funcs,
    completions_table,
    is_async_reward_func,
    load_reward_funcs,
    reward_metrics,
    zero_std_fraction,
)
from .grpo_scoring import (
    cast_lm_head_to_fp32,
    gather_valid_entropies,
    router_aux_loss_settings,
    score_completions,
)
from .ref_sync import REFERENCE_ADAPTER, add_reference_adapter
from .reward_model_refresh import RewardModelRefresh


logger = logging.get_logger(__name__)


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


def _identity(features):
    return features


def _model_init_kwargs(args: GRPOConfig) -> dict[str, Any]:
    kwargs = args.model_init_kwargs or {}
    kwargs = dict(json.loads(kwargs) if isinstance(kwargs, str) else kwargs)
    kwargs.setdefault("trust_remote_code", args.trust_remote_code)
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
            Callables `f(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, **columns) ->
            list[float | None]`, plain or `async` (awaited together), functions, `functools.partial`s or callable
            objects (see `trl.trainer.grpo_rewards`), or sequence-classification reward models (a path or a
            `PreTrainedModel`; the first logit is the reward). Required.
        args ([`GRPOConfig`], *optional*):
            Configuration; defaults to `GRPOConfig("<model name>-GRPO")`.
        train_dataset, eval_dataset ([`~datasets.Dataset`]):
            `train_dataset` is required. Both must have a `"prompt"` column: text (standard) or a list of messages
            (conversational, rendered with the tokenizer's chat template and `args.chat_template_kwargs`;
            completions then reach reward functions as messages).
        processing_class ([`~transformers.PreTrainedTokenizerBase`], *optional*):
            Tokenizer of the policy; loaded from the model's path when omitted. Prompts are left-padded.
        reward_processing_classes (tokenizer or list of them, *optional*):
            Tokenizers for the reward models (aligned with `reward_funcs`); loaded from each model's path when
            omitted.
        callbacks (`list[TrainerCallback]`, *optional*):
            Extra callbacks.
        optimizers (`tuple`, *optional*):
            `(optimizer, lr_scheduler)`, as in [`~transformers.Trainer`].
        quantization_config (`transformers.BitsAndBytesConfig`, *optional*):
            Passed to `from_pretrained` when `model` is a path (e.g. 4-bit QLoRA with `peft_config`), as in TRL.
        peft_config ([`~peft.PeftConfig`], *optional*):
            Train a PEFT adapter instead of the whole model.
        tools, rollout_func, environment_factory (*optional*):
            TRL's tool-calling and custom-rollout arguments. Not supported here: anything but `None` raises a
            `ValueError`.
        reward_model_label_func (`Callable`, *optional*):
            Labels for training the reward models when `reward_model_update_steps` is set: called like a reward
            function, it returns one label (or `None`: not used) per completion. A `ValueError` is raised when only
            one of the two is given, or when `reward_funcs` holds no sequence-classification model to train.

    Raises:
        ValueError: without reward functions or `train_dataset`, for reward weights or processing classes that do not
            match the reward functions, a dataset without `"prompt"`, or an eval batch that is not divisible by
            `num_generations_eval` (or `num_generations`).
    """

    _tag_names = ["trl", "grpo", "iterative-grpo"]

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: RewardFunc | list[RewardFunc] | None = None,
        args: GRPOConfig | None = None,
        train_dataset: Dataset | IterableDataset | None = None,
        eval_dataset: Dataset | IterableDataset | dict[str, Dataset] | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        reward_processing_classes: PreTrainedTokenizerBase | list[PreTrainedTokenizerBase] | None = None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple = (None, None),
        quantization_config=None,
        peft_config=None,
        tools: list[Callable] | None = None,
        rollout_func: Callable | None = None,
        environment_factory: Callable | dict[str, Callable] | None = None,
        reward_model_label_func: Callable[..., list[float | None]] | None = None,
    ):
        unsupported = {"tools": tools, "rollout_func": rollout_func, "environment_factory": environment_factory}
        for name, value in unsupported.items():  # TRL's tool-calling and custom-rollout arguments
            if value is not None:
                raise ValueError(
                    f"`{name}` (tool calling / custom rollouts) is not supported by this package: leave it None."
                )
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = GRPOConfig(f"{os.path.basename(str(name).rstrip('/')) or 'model'}-GRPO")

        # Policy
        if quantization_config is not None and not isinstance(model, str):
            raise ValueError(
                "quantization_config applies when `model` is a path; quantize an instantiated model yourself."
            )
        if isinstance(model, str):
            quantization = {"quantization_config": quantization_config} if quantization_config is not None else {}
            model = AutoModelForCausalLM.from_pretrained(model, **_model_init_kwargs(args), **quantization)
        elif args.model_init_kwargs:
            raise ValueError("model_init_kwargs only apply when `model` is a path; you passed an instantiated model.")
        given_peft_model = hasattr(model, "peft_config")
        if peft_config is not None:
            from peft import get_peft_model

            if args.gradient_checkpointing:  # frozen embeddings: let checkpointed blocks still see a grad input
                model.enable_input_require_grads()
            model = get_peft_model(model, peft_config)
        if processing_class is None:  # same revision as the model (model_init_kwargs only apply to a path)
            processing_class = AutoTokenizer.from_pretrained(
                model.config._name_or_path,
                revision=_model_init_kwargs(args).get("revision"),
                trust_remote_code=args.trust_remote_code,
            )
        if processing_class.pad_token is None:
            processing_class.pad_token = processing_class.eos_token

        # Rewards (async functions share one event loop, owned by the trainer)
        self.reward_funcs, self.reward_func_names, self.reward_processing_classes, self.reward_weights = (
            load_reward_funcs(reward_funcs, reward_processing_classes, args.reward_weights, _model_init_kwargs(args))
        )
        self._reward_loop = RewardEventLoop() if any(map(is_async_reward_func, self.reward_funcs)) else None
        self._reward_hooks = RewardLogHooks()
        if train_dataset is None:
            raise ValueError("GRPOTrainer needs a `train_dataset` (with a 'prompt' column) to sample prompts from.")

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
        self._reference_file = REF_MODEL_FILE if self.ref_model is not None else REF_ADAPTER_FILE
        for m in (model, self.ref_model):
            if m is not None and args.disable_dropout:
                disable_dropout_in_model(m)
            if m is not None and args.cast_lm_head_to_fp32:
                cast_lm_head_to_fp32(m)
        self.router_aux_loss_coef, self.aux_loss_enabled = router_aux_loss_settings(model, args.router_aux_loss_coef)
        self.entropy_control = EntropyCoefficient.from_config(args)

        self.num_generations = args.num_generations
        self.num_generations_eval = args.num_generations_eval or args.num_generations
        self.num_iterations = args.num_iterations
        self.max_prompt_length = args.max_prompt_length
        self.max_completion_length = args.max_completion_length
        self.loss_type = args.loss_type
        self.policy_loss_kwargs = {name: getattr(args, name) for name in POLICY_LOSS_FIELDS}
        # A completion ends at the tokenizer's EOS or at any EOS of the model's generation config (end-of-turn...).
        model_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.eos_token_ids = stop_token_ids(processing_class.eos_token_id, model_eos)
        generation_kwargs = dict(
            max_new_tokens=args.max_completion_length,
            do_sample=True,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            pad_token_id=processing_class.pad_token_id,
            eos_token_id=self.eos_token_ids,
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
        self._eval_batches = 0  # eval generation batches so far in this evaluation (seeds their sampling)
        self._step_time = 0.0  # seconds spent in training_step since the last optimizer step

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
            and (args.per_device_eval_batch_size * self.accelerator.num_processes) % self.num_generations_eval
        ):
            raise ValueError(
                f"The global eval batch ({args.per_device_eval_batch_size} × {self.accelerator.num_processes} "
                f"processes) must be divisible by num_generations_eval ({self.num_generations_eval}; when unset, "
                "num_generations): change per_device_eval_batch_size or num_generations_eval."
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
        self.reward_model_refresh = RewardModelRefresh.for_trainer(self, reward_model_label_func)  # None: frozen
        if self.reward_model_refresh is not None:  # registered before the sync: update, then reset the reference
            RewardModelRefreshCallback(self.reward_model_refresh).register(self.callback_handler)
        self.add_callback(self.entropy_control)

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

    def _get_eval_sampler(self, eval_dataset) -> Sampler:  # seeded shuffle: TRL's eval prompt order
        return RepeatSampler(eval_dataset, mini_repeat_count=self.num_generations_eval, seed=self.args.seed)

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, **kwargs):
        self._step, self._buffered_inputs = None, None
        checkpoint = (
            get_last_checkpoint(self.args.output_dir) if resume_from_checkpoint is True else resume_from_checkpoint
        )
        if checkpoint:
            if self.sync_callback is not None:
                self._load_reference_state(checkpoint)
            rank, world, device = (
                self.accelerator.process_index,
                self.accelerator.num_processes,
                self.accelerator.device,
            )
            saved = load_generation_buffer(checkpoint, rank, device, world)
            self._step, self._buffered_inputs = saved or (None, None)
            if self.reward_model_refresh is not None:
                self.reward_model_refresh.load(checkpoint)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)

    # ---- checkpoints: the synced reference and the cut generation batch travel with the policy ----

    def _reference_tensors(self) -> dict[str, torch.Tensor]:
        ref_model = self.accelerator.unwrap_model(self.ref_model) if self.ref_model is not None else None
        return reference_tensors(ref_model, self.accelerator.unwrap_model(self.model), self.ref_adapter)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self._buffered_inputs is not None and self._step % (self.args.steps_per_generation * self.num_iterations):
            rank, world = self.accelerator.process_index, self.accelerator.num_processes
            save_generation_buffer(folder, rank, self._step, self._buffered_inputs, world)
        if self.reward_model_refresh is not None:
            self.reward_model_refresh.save(folder, self.args.should_save)
        if self.sync_callback is not None:
            state, file = self.sync_callback.state_dict(), self._reference_file
            save_reference_state(self._reference_tensors(), folder, file, state, self.args.should_save)

    def _load_callback_state(self) -> None:
        # With `restore_callback_states_from_checkpoint`, Trainer swaps in a new EntropyCoefficient: use that one.
        super()._load_callback_state()
        restored = [cb for cb in self.callback_handler.callbacks if isinstance(cb, EntropyCoefficient)]
        self.entropy_control = restored[0] if restored else self.entropy_control

    def _load_reference_state(self, checkpoint: str) -> None:
        state = load_reference_state(self._reference_tensors(), checkpoint, self._reference_file)
        if state is not None:
            self.sync_callback.load_state_dict(state)

    def _prepare_inputs(self, generation_batch: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Return the micro-batch to train on: generate for a new generation batch, else slice the buffered one."""
        if not self.model.training:
            return self._generate_and_score_completions(generation_batch)
        if self._step is None:  # fresh start or resume: micro-steps already done
            self._step = self.state.global_step * self.args.gradient_accumulation_steps
        steps_per_generation = self.args.steps_per_generation
        if self._step % (steps_per_generation * self.num_iterations) == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            seed = shuffle_seed(self.args.seed, self._step, self.accelerator.process_index)
            self._buffered_inputs = shuffle_and_split(batch, steps_per_generation, seed)
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
        """Log-probs of the last `logits_to_keep` tokens of `input_ids` under `model`, at `temperature` (see
        `grpo_scoring.score_completions`).

        Args:
            input_ids, attention_mask: `(N, P + L)` prompt + completion.
            logits_to_keep: L.
            batch_size: rows per forward pass (all at once when `None`).

        Returns:
            `(N, L)` float32 tensor.
        """
        share = self.args.shared_prefix_scoring
        return score_completions(
            model, input_ids, attention_mask, logits_to_keep, self.temperature, batch_size, share_prefix=share
        ).per_token_logps

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

        The position is the micro-step for training, and (optimizer step, batch index within the evaluation) for
        evaluation. Completions then depend on where training is, not on what consumed random numbers before, so a run
        resumed from a checkpoint samples (and evaluates) exactly what the uninterrupted run did, and no two
        generation batches share draws.
        """
        if mode == "train":
            micro_step = (
                self._step
                if self._step is not None
                else self.state.global_step * self.args.gradient_accumulation_steps
            )
            position = [micro_step]
        else:
            position, self._eval_batches = [self.state.global_step, self._eval_batches], self._eval_batches + 1
        seed = derived_seed(self.args.seed, int(mode == "eval"), *position, self.accelerator.process_index)
        device = self.accelerator.device
        devices = [device] if device.type != "cpu" else []
        with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
            torch.manual_seed(seed)
            yield

    def evaluate(self, *args, **kwargs):
        self._eval_batches = 0  # eval sampling is seeded by (optimizer step, batch index): resume-proof
        return super().evaluate(*args, **kwargs)

    def _calculate_rewards(
        self, inputs: list[dict], prompts: list, completions: list, completion_ids: list
    ) -> torch.Tensor:
        """`(N, F)` float32 rewards of this process's completions, NaN where a function returned `None`."""
        columns = {k: [x[k] for x in inputs] for k in inputs[0] if k not in ("prompt", "completion", "completion_ids")}
        return call_reward_funcs(
            self.reward_funcs,
            self.reward_func_names,
            self.reward_processing_classes,
            prompts,
            completions,
            completion_ids,
            {**columns, "trainer_state": self.state, **self._reward_hooks.kwargs()},
            self.args.chat_template_kwargs,
            self.accelerator.device,
            self._reward_loop,
        )

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
        prompt_ids, prompt_mask, truncated = tokenize_prompts(
            tokenizer, prompts, self.max_prompt_length, args.chat_template_kwargs
        )
        multiple, pad_id = args.pad_to_multiple_of, tokenizer.pad_token_id
        prompt_ids = pad_to_multiple(prompt_ids.to(device), multiple, pad_id, side="left")
        prompt_mask = pad_to_multiple(prompt_mask.to(device), multiple, 0, side="left")

        with unwrap_model_for_generation(
            self.model_wrapped, self.accelerator, args.ds3_gather_for_generation
        ) as policy:
            with torch.no_grad(), self._sampling_rng(mode):
                completion_ids = sample_completions(
                    policy, prompt_ids, prompt_mask, self.generation_config, args.generation_implementation
                )
        full_mask = completion_mask(completion_ids, self.eos_token_ids)  # the tokens of each completion
        terminated = ends_with_stop(completion_ids, full_mask, [*self.eos_token_ids, tokenizer.pad_token_id])
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
        completion_ids, mask = pad_to_multiple(completion_ids, multiple, pad_id), pad_to_multiple(mask, multiple, 0)
        if self.reward_model_refresh is not None and mode == "train":  # labelled examples for the next update
            self.reward_model_refresh.collect(inputs, prompts, completions, completion_ids_list, self.state)

        # Rewards and advantages over the global batch (a group may straddle processes), then this process's slice.
        rewards_per_func = gather(self._calculate_rewards(inputs, prompts, completions, completion_ids_list))
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        weights, aggregation = self.reward_weights.to(device), args.multi_objective_aggregation
        advantages, rewards, valid = aggregate_rewards(
            rewards_per_func, weights, group_size, args.scale_rewards, aggregation
        )
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
        if mode == "train":  # cumulative prompt + completion tokens, saved with the trainer state
            self.state.num_input_tokens_seen += gather(prompt_mask.sum() + full_mask.sum()).sum().item()
        metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        if self.max_prompt_length is not None:
            metrics["prompts/truncated_ratio"].append(gather(truncated.to(device)).float().mean().item())
        for key, value in completion_length_metrics(gather(full_mask.sum(1)), gather(terminated)).items():
            metrics[key].append(value)
        extra_columns, hook_metrics = self._reward_hooks.pop(
            len(prompts), gather_object, lambda t: gather(t.to(device)).cpu()
        )
        for key, value in reward_metrics(rewards_per_func, self.reward_func_names, rewards).items():
            metrics[key].append(value)
        for key, value in hook_metrics.items():
            metrics[key].append(value)
        scored = torch.where(valid, rewards, torch.full_like(rewards, float("nan")))
        metrics["reward_std"].append(reward_std(scored))
        zero_std = zero_std_fraction(rewards_per_func, weights, group_size, args.scale_rewards, aggregation)
        metrics["frac_reward_zero_std"].append(zero_std)
        if args.log_completions and mode == "train":  # printed at training logs: never an eval batch
            prompts_all, completions_all = gather_object(prompts), gather_object(completions_text)
            table = {"prompt": prompts_all, "completion": completions_all, "reward": rewards.tolist(), **extra_columns}
            table = completions_table({**table, "advantage": advantages.tolist()}, args.log_unique_prompts)
            self._last_completions = table if self.accelerator.is_main_process else {}
        return output

    # ---- loss ----

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """GRPO loss of one micro-batch: `loss_type`'s policy term + beta × k3 KL, normalised as `loss_type` says.

        Raises:
            ValueError: if `return_outputs` is requested (GRPO has no model outputs to return).
        """
        if return_outputs:
            raise ValueError("GRPOTrainer.compute_loss does not return outputs.")
        mode = "train" if self.model.training else "eval"
        completion_ids, mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], mask], dim=1)
        bonus = self.entropy_control.enabled  # the entropies need a gradient only for the entropy bonus
        per_token_logps, entropies, aux_loss = score_completions(
            model,
            input_ids,
            attention_mask,
            mask.size(1),
            self.temperature,
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            entropy_grad=bonus,
            share_prefix=self.args.shared_prefix_scoring,
        )
        old_per_token_logps = inputs.get("old_per_token_logps")
        if old_per_token_logps is None:
            old_per_token_logps = per_token_logps.detach()
        args, metrics = self.args, self._metrics[mode]
        entropy_mask = None  # the top-ρ entropy quantile over all processes' valid tokens
        if args.top_entropy_quantile < 1.0:
            gather_all = partial(gather_valid_entropies, self.accelerator)
            entropy_mask = high_entropy_mask(entropies.detach(), mask, args.top_entropy_quantile, gather_all)
        policy = per_token_policy_loss(
            per_token_logps, old_per_token_logps, inputs["advantages"], mask, entropy_mask, **self.policy_loss_kwargs
        )
        per_token_loss = policy.per_token_loss
        if self.beta != 0.0:
            per_token_kl = kl_k3(per_token_logps, inputs["ref_per_token_logps"])
            if args.use_bias_correction_kl:
                per_token_kl = importance_weighted_kl(per_token_kl, policy.ratio)
            per_token_loss = per_token_loss + self.beta * per_token_kl
        loss = aggregate_loss(
            per_token_loss, mask, self.loss_type, self.max_completion_length, inputs["num_items_in_batch"]
        )
        if self.entropy_control.enabled:  # entropy bonus: the mean entropy of the tokens the policy loss acts on
            # As TRL logs it: the token-sum types' value is this micro-batch's share of the step (÷ accumulation)
            token_sum = mode == "train" and self.loss_type in ("dapo", "cispo", "vespo")
            share = self.current_gradient_accumulation_steps if token_sum else 1
            metrics["policy_loss"].append(gather(loss.detach() / share).nanmean().item())
            bonus_mask, end_of_step = mask if entropy_mask is None else entropy_mask, self.accelerator.sync_gradients
            loss = loss - self.entropy_control.applied() * masked_mean(entropies, bonus_mask)
            if mode == "train":
                self.entropy_control.observe(entropies, bonus_mask, end_of_step, self.accelerator.reduce)
            if end_of_step and mode == "train":  # the coefficient of optimizer steps: never an eval metric
                metrics["entropy_coef"].append(self.entropy_control.coef)
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss
            metrics["aux_loss"].append(gather(aux_loss.detach()).mean().item())
        logged = {"kl": per_token_kl} if self.beta != 0.0 else {}
        for key, value in loss_metrics({**logged, "entropy": entropies, **policy.metrics}, mask, gather).items():
            metrics[key].append(value)
        return loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        start = time.perf_counter()
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._step_time += time.perf_counter() - start
        if self._step % self.args.gradient_accumulation_steps == 0:  # `step_time`: seconds per optimizer step
            self._metrics["train"]["step_time"].append(self._step_time)
            self._step_time = 0.0
        return loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs).mean().detach()
        return loss, None, None

    # ---- logging ----

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        metrics = {key: window_mean(values) for key, values in self._metrics[mode].items() if values}
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
        for column in self._last_completions:
            table.add_column(column)
        rows = list(zip(*self._last_completions.values()))
        for row in rows[: self.args.num_completions_to_print or len(rows)]:
            table.add_row(*(f"{value:.3f}" if isinstance(value, float) else str(value) for value in row))
        Console().print(table)
