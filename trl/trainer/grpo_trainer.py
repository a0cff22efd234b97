# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`GRPOTrainer`: Group Relative Policy Optimization (arXiv 2402.03300) with iterative reference-model syncing.

The trainer orchestrates one step as data: prompts → G completions each → rewards → group advantages →
policy/old/reference log-probs → clipped loss with a KL penalty. Inputs and seeds live in `grpo_inputs`, the reward
pipeline in `grpo_rewards`, the maths in `grpo_losses`, metrics in `grpo_metrics` (all in `trl/trainer/`); sampling in
`trl/generation/`, log-probs in `trl/scoring/`; the reference (sync, offload, its checkpoint part) in
`trl/reference/`, *when* it syncs in `callbacks`.
"""

import os
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from accelerate.utils import gather, gather_object
from datasets import Dataset, IterableDataset
from torch.utils.data import Sampler
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, has_length
from transformers.utils import logging

from ..data_utils import is_conversational
from ..generation.grpo_generation import (
    completion_id_lists,
    decode_completion_lists,
    grpo_generation_config,
    grpo_generation_kwargs,
    left_pad,
    pad_completions,
    sample_completions,
)
from ..generation.vllm_generation import PolicyVersion, build_vllm_generation, padded_logprobs
from ..generation.vllm_utils import sampling_settings
from ..models.cpu_memory import RetainFreedMemoryCallback, retain_freed_memory_requested
from ..models.utils import (
    check_distributed_setup,
    disable_dropout_in_model,
    load_policy,
    load_tokenizer,
    model_init_kwargs,
    prepare_reward_models,
    unwrap_model_for_generation,
)
from ..reference.ref_checkpoint import SyncReferenceAtResume
from ..reference.reference_model import ReferenceModel
from ..scoring.grpo_scoring import score_completions
from ..scoring.lm_head import cast_lm_head_to_fp32
from ..scoring.router_loss import router_aux_loss_settings
from .callbacks import RewardModelRefreshCallback, SyncRefModelCallback
from .device_defaults import tied_row_gradient
from .entropy_control import EntropyCoefficient
from .grpo_checkpoint import GenerationBuffer, add_missing_callback_states
from .grpo_config import GRPOConfig
from .grpo_inputs import (
    by_passes,
    check_eval_batch,
    check_prompt_counts,
    check_prompt_datasets,
    check_stream_settings,
    eval_sampler,
    eval_stream,
    micro_steps_done,
    reward_columns,
    sampling_rng,
    single_process_loading,
    stop_token_ids,
    tokenize_prompts,
    train_sampler,
    train_stream,
)
from .grpo_losses import (
    POLICY_LOSS_FIELDS,
    aggregate_loss,
    importance_weighted_kl,
    kl_k3,
    per_token_policy_loss,
)
from .grpo_metrics import (
    batch_completions_table,
    check_metric_for_best_model,
    generation_batch_metrics,
    loss_metrics,
    print_completions_table,
    window_mean,
)
from .grpo_rewards import (
    RewardEventLoop,
    RewardFunc,
    RewardLogHooks,
    aggregate_rewards,
    call_reward_funcs,
    check_reward_columns,
    is_async_reward_func,
    load_reward_funcs,
    raise_on_every_process,
    weighted_rewards,
)
from .importance_sampling import importance_sampling_metrics, reduced_over_processes, vllm_importance_sampling_ratio
from .reward_model_refresh import RewardModelRefresh
from .trl_compat import (
    TRLTrainerSurface,
    check_argument_types,
    check_overrides,
    check_unsupported_arguments,
    default_config,
)


logger = logging.get_logger(__name__)


def _identity(features):
    return features


class GRPOTrainer(TRLTrainerSurface, Trainer):
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
        train_dataset, eval_dataset ([`~datasets.Dataset`] or [`~datasets.IterableDataset`]):
            `train_dataset` is required (`eval_dataset` may also be a dict of them). Both must have a `"prompt"`
            column: text (standard) or a list of messages (conversational, rendered with the tokenizer's chat
            template and `args.chat_template_kwargs`; completions then reach reward functions as messages). A stream
            (`IterableDataset`) is read in `RepeatSampler`'s order (see `grpo_inputs.repeat_iterable_dataset`), needs
            `max_steps` for training, and is read with `dispatch_batches=False` and no loader workers, as in TRL.
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
        TypeError: for a `processing_class`, `peft_config` or `train_dataset` of the wrong type (TRL 1.16's checks,
            `trl_compat.check_argument_types`).
        ValueError: without reward functions or `train_dataset`, for `quantization_config` given twice or a
            `PeftModel` with a `peft_config`, for reward weights or processing classes that do not
            match the reward functions, a dataset without `"prompt"`, or an eval batch that is not divisible by
            `num_generations_eval` (or `num_generations`); for a stream with `dispatch_batches=True` or a train stream
            without `max_steps`; for a dataset with a length too small for one batch: a `train_dataset` with fewer
            prompts than one generation batch needs (`generation_batch_size / num_generations`), an empty eval
            dataset, or, with `dataloader_drop_last=True`, one smaller than an eval batch (a stream raises the same
            when it is read and ends before its first batch).
        TypeError: if the class overrides a TRL 1.16 method that this trainer never calls (`trl_compat`).
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
        check_overrides(type(self), GRPOTrainer)
        check_unsupported_arguments(tools=tools, rollout_func=rollout_func, environment_factory=environment_factory)
        args = default_config(model) if args is None else args
        check_argument_types(model, args, train_dataset, processing_class, quantization_config, peft_config)
        given_path = model if isinstance(model, str) and quantization_config is None else None  # vLLM may load it
        model, given_peft_model = load_policy(model, args, quantization_config, peft_config)
        processing_class = load_tokenizer(model, args, processing_class)

        # Rewards (async functions share one event loop, owned by the trainer)
        self.reward_funcs, self.reward_func_names, self.reward_processing_classes, self.reward_weights = (
            load_reward_funcs(reward_funcs, reward_processing_classes, args.reward_weights, model_init_kwargs(args))
        )
        self._reward_loop = RewardEventLoop() if any(map(is_async_reward_func, self.reward_funcs)) else None
        self._reward_hooks = RewardLogHooks()
        check_prompt_datasets(train_dataset, eval_dataset)
        check_prompt_counts(args, train_dataset, eval_dataset)  # before any generation
        check_reward_columns(self.reward_funcs, self.reward_func_names, train_dataset, eval_dataset)
        check_stream_settings(args, train_dataset, eval_dataset)  # before the accelerator is built
        check_metric_for_best_model(args, eval_dataset)

        # Reference model: a frozen copy, a frozen adapter of a PEFT policy, or none (see `ReferenceModel`)
        self.beta = args.beta
        self.is_peft_model = hasattr(model, "peft_config")
        self.reference = ReferenceModel(model, args, given_peft_model)
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
        # TRL's `generation_kwargs`: kept for subclasses that read it; sampling uses `generation_config`, as in TRL
        self.generation_kwargs = grpo_generation_kwargs(args, processing_class, self.eos_token_ids)
        self.generation_config = grpo_generation_config(args, processing_class, self.eos_token_ids)
        self.temperature = self.generation_config.temperature  # log-probs use the sampling temperature
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._last_completions: dict[str, list] = {}
        # the training generation batch as micro-batches, and the micro-step (TRL's `_buffered_inputs` and `_step`)
        self.generation_buffer = GenerationBuffer(args.steps_per_generation, args.num_iterations)
        self._eval_batches = 0  # eval generation batches so far in this evaluation (seeds their sampling)
        self._eval_metric_prefix = "eval"  # the running `evaluate`'s metric_key_prefix, named in the GRPO eval metrics
        self._current_train_step_time = 0.0  # seconds spent in training_step since the last optimizer step
        self._training_layout = False  # set while `_old_per_token_logps` scores
        self.policy_version = PolicyVersion()  # optimizer steps and loads: vLLM gets the policy when it changed

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
        check_distributed_setup(self.accelerator)
        if retain_freed_memory_requested() and self.accelerator.device.type == "cpu":
            # opt-in and process-wide (glibc), so applied when training starts, not here: freed tensors' memory is
            # reused instead of faulted in again, and AdamW's moments are allocated before the first step's temporaries
            self.add_callback(RetainFreedMemoryCallback())
        # Losses are means over the micro-batch: let Trainer divide by the accumulation steps.
        self.model_accepts_loss_kwargs = False
        # One dataloader item = one local generation batch (see RepeatSampler).
        self._train_batch_size = args.per_device_train_batch_size * args.steps_per_generation
        if eval_dataset is not None:
            check_eval_batch(
                args.per_device_eval_batch_size, self.accelerator.num_processes, self.num_generations_eval
            )

        self.reference.prepare(self.accelerator)
        prepare_reward_models(self.reward_funcs, self.accelerator)
        # vLLM samples the completions (`use_vllm`): an engine per process, or the main process's server client.
        self.vllm_generation = None
        if args.use_vllm:
            self.vllm_sampling = sampling_settings(args, self.eos_token_ids)
            policy = self.accelerator.unwrap_model(self.model)
            self.vllm_generation = build_vllm_generation(args, policy, processing_class, given_path, self.accelerator)
            self.add_callback(self.policy_version)

        self.sync_callback: SyncRefModelCallback | None = None  # a user-supplied one is bound, else one is added
        if args.sync_ref_model:
            self.sync_callback = SyncRefModelCallback.attach(self.callback_handler, self.ref_model, self.accelerator)
            self.reference.follow(self.sync_callback)
        self.reward_model_refresh = RewardModelRefresh.for_trainer(self, reward_model_label_func)  # None: frozen
        if self.reward_model_refresh is not None:  # registered before the sync: update, then reset the reference
            RewardModelRefreshCallback(self.reward_model_refresh).register(self.callback_handler)
        self.add_callback(self.entropy_control)

    # ---- data ----

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = ["prompt"]

    def _get_train_sampler(self, train_dataset=None) -> Sampler:  # see `grpo_inputs.prompt_order`
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return train_sampler(dataset, self.args, self.num_generations)

    def _get_eval_sampler(self, eval_dataset) -> Sampler:  # seeded shuffle: TRL's eval prompt order
        return eval_sampler(eval_dataset, self.args, self.num_generations_eval)

    def get_train_dataloader(self):
        """One item = one local generation batch (`_train_batch_size` rows). A map-style dataset gets `RepeatSampler`;
        a stream is put in the same order (`grpo_inputs.train_stream`)."""
        dataset = self.train_dataset
        if isinstance(dataset, IterableDataset):
            dataset = train_stream(dataset, self.args, self.num_generations)
        return self._get_dataloader(dataset, "Training", self._train_batch_size, self._get_train_sampler, True)

    def get_eval_dataloader(self, eval_dataset: str | Dataset | IterableDataset | None = None):
        """As `Trainer`'s for a map-style dataset; a stream is shuffled (buffered, `data_seed` or `seed`) and each
        prompt repeated `num_generations_eval` times in a row, read without loader workers.

        Raises:
            ValueError: for a stream with `accelerator_config.dispatch_batches=True`; for a dataset too small for one
                eval batch (`grpo_inputs.check_prompt_counts`; a stream when it is read).
        """
        named = isinstance(eval_dataset, str)
        dataset = self.eval_dataset[eval_dataset] if named else eval_dataset
        dataset = self.eval_dataset if dataset is None else dataset
        if not isinstance(dataset, IterableDataset):
            check_prompt_counts(self.args, None, dataset)  # also a dataset given to `evaluate` only
            return super().get_eval_dataloader(eval_dataset)
        stream = eval_stream(dataset, self.args, self.accelerator.dataloader_config, self.num_generations_eval)
        with single_process_loading(self.args):
            return self._get_dataloader(stream, "Evaluation", self.args.eval_batch_size)

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, **kwargs):
        self.generation_buffer.reset()
        checkpoint = (
            get_last_checkpoint(self.args.output_dir) if resume_from_checkpoint is True else resume_from_checkpoint
        )
        self.callback_handler.remove_callback(SyncReferenceAtResume)  # a previous call's, if any
        if checkpoint:
            self.policy_version.bump()  # the checkpoint's weights: vLLM gets them before it samples again
            if self.sync_callback is not None:
                self._load_reference_state(checkpoint)
            self.generation_buffer.load(checkpoint, self.accelerator)
            if self.reward_model_refresh is not None:
                self.reward_model_refresh.load(checkpoint)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)

    # ---- checkpoints: the synced reference and the cut generation batch travel with the policy ----

    def _save_checkpoint(self, model, trial):
        # A state resumed from a checkpoint without some callback's entry (TRL's: no EntropyCoefficient) gets one.
        add_missing_callback_states(self.state.stateful_callbacks, self.callback_handler.callbacks)
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        self.generation_buffer.save(folder, self.accelerator)
        if self.reward_model_refresh is not None:
            self.reward_model_refresh.save(folder, self.args.should_save)
        if self.sync_callback is not None:
            self.reference.save(folder, self.model, self.args.should_save)

    def _load_best_model(self):
        super()._load_best_model()
        self.policy_version.bump()  # the best checkpoint's weights: vLLM gets them before it samples again

    def _load_callback_state(self) -> None:
        # With `restore_callback_states_from_checkpoint`, Trainer swaps in a new EntropyCoefficient: use that one.
        super()._load_callback_state()
        restored = [cb for cb in self.callback_handler.callbacks if isinstance(cb, EntropyCoefficient)]
        self.entropy_control = restored[0] if restored else self.entropy_control

    def _load_reference_state(self, checkpoint: str) -> None:
        """The reference and its sync counters as `checkpoint` holds them (see `ReferenceModel.restore`)."""
        resume_sync = self.reference.restore(checkpoint, self.model)
        if resume_sync is not None:  # a checkpoint without the reference (TRL's): one sync once the policy is loaded
            self.add_callback(resume_sync)

    # ---- one step: prompts → completions → rewards → advantages → log-probs → loss ----

    def _micro_steps_done(self) -> int:
        """Micro-batches trained after `state.global_step` optimizer steps (see `grpo_inputs.micro_steps_done`)."""
        dataloader = self.callback_handler.train_dataloader
        batches = len(dataloader) if dataloader is not None and has_length(dataloader) else None
        return micro_steps_done(self.state.global_step, self.args.gradient_accumulation_steps, batches)

    def _prepare_inputs(self, generation_batch: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Return the micro-batch to train on: generate for a new generation batch, else slice the buffered one."""
        if not self.model.training:
            return self._generate_and_score_completions(generation_batch)
        buffer = self.generation_buffer
        if buffer.step is None:  # fresh start or resume: micro-steps already done
            buffer.step = self._micro_steps_done()
        if buffer.needs_batch():
            batch = self._generate_and_score_completions(generation_batch)
            buffer.fill(batch, self.args.seed, self.accelerator.process_index)
        # a micro-batch buffered before a reference sync is scored again under the synced reference
        return buffer.next_micro_batch(partial(self.reference.with_current_version, score=self._ref_per_token_logps))

    def _sampling_rng(self, mode: str):
        """Seed this generation batch's sampling from where training is (see `grpo_inputs.sampling_rng`): the
        micro-step in training, (optimizer step, batch index within the evaluation) in evaluation."""
        if mode == "train":
            step = self.generation_buffer.step
            position = [step if step is not None else self._micro_steps_done()]
        else:
            position, self._eval_batches = [self.state.global_step, self._eval_batches], self._eval_batches + 1
        process, device = self.accelerator.process_index, self.accelerator.device
        return sampling_rng(self.args.seed, mode == "eval", position, process, device)

    def evaluate(
        self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"
    ) -> dict[str, float | None]:
        """transformers' `evaluate`, whose returned metrics also hold the GRPO ones (`eval_reward`, ...), so that
        `metric_for_best_model` can name them; they take `metric_key_prefix` (`eval_<name>_reward` for a named eval
        dataset, `test_reward` for `metric_key_prefix="test"`) and cover this evaluation only."""
        self._eval_batches = 0  # eval sampling is seeded by (optimizer step, batch index): resume-proof
        self._metrics["eval"].clear()  # nothing from an interrupted evaluation or a `predict` call
        outer_prefix, self._eval_metric_prefix = self._eval_metric_prefix, metric_key_prefix
        try:
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        finally:
            self._eval_metric_prefix = outer_prefix

    def _tokenize_prompts(self, prompts: list) -> tuple[list[list[int]], None, dict]:
        """TRL 1.16's prompt tokenisation step: `(prompt_ids, images, multimodal_fields)`, with `prompt_ids` one list
        of token ids per prompt (no padding; texts through the tokenizer, messages through its chat template with
        `chat_template_kwargs`, see `grpo_inputs.tokenize_prompts`), `images` `None` and `multimodal_fields` `{}`
        (no vision models here). With `max_prompt_length`, prompts keep their last tokens and the cut rows are
        recorded for the `prompts/truncated_ratio` metric."""
        ids, self._prompts_truncated = tokenize_prompts(
            self.processing_class, prompts, self.max_prompt_length, self.args.chat_template_kwargs
        )
        return ids, None, {}

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL 1.16's sampling step: one completion per row of `prompt_ids` (N lists of ids; each prompt already
        repeated `num_generations` times) with the policy's `generate` (see `grpo_generation.sample_completions`),
        seeded by the position in training. Returns `(completion_ids, logprobs)`: N lists of ids cut after the first
        stop token, and `None` (no sampler log-probs without vLLM).

        Raises:
            ValueError: if `images`, `multimodal_fields` or `has_tool_images` are given (no vision models or tools
                here).
        """
        if images is not None or multimodal_fields or has_tool_images:
            raise ValueError("Images and multimodal prompt fields are not supported here (no vision models).")
        args, device = self.args, self.accelerator.device
        mode = "train" if self.model.training else "eval"
        if self.vllm_generation is not None:
            return self._generate_with_vllm(prompt_ids, mode)
        pad_id = self.processing_class.pad_token_id
        ids, mask = left_pad(prompt_ids, pad_id, device, args.pad_to_multiple_of)
        with unwrap_model_for_generation(
            self.model_wrapped, self.accelerator, args.ds3_gather_for_generation
        ) as policy:
            with torch.no_grad(), self._sampling_rng(mode):
                completion_ids = sample_completions(
                    policy,
                    ids,
                    mask,
                    self.generation_config,
                    "shared_prefix" if args.shared_prefix else "generate",
                    packed_weights=True,  # CPU only, the same logits to the bit
                    inverse_cdf=args.inverse_cdf_sampling,
                )
        return completion_id_lists(completion_ids, self.eos_token_ids), None

    def _generate_with_vllm(self, prompt_ids: list[list[int]], mode: str) -> tuple[list[list[int]], list[list[float]]]:
        """`_generate_single_turn` with vLLM: the policy's weights pushed first if they changed since vLLM got them
        (an optimizer step, a checkpoint load), then one completion per row, each with its own seed drawn from where
        training is (`_sampling_rng`), so a resumed run samples what the uninterrupted one did. Returns the completion
        ids (cut after the first stop token) and vLLM's log-prob of each of their tokens."""
        with self._sampling_rng(mode):
            seeds = torch.randint(0, 2**31 - 1, (len(prompt_ids),)).tolist()
        policy = self.accelerator.unwrap_model(self.model)
        self.vllm_generation.sync_weights(policy, self.policy_version.value)
        return self.vllm_generation.generate(prompt_ids, self.vllm_sampling, seeds)

    def _generate(self, prompts: list):
        """TRL 1.16's generation step for a batch of N prompts (texts or message lists): `_tokenize_prompts`, then
        `_generate_single_turn`, then decoding.

        Returns TRL's 8-tuple `(prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images,
        tool_images)`: N lists of prompt ids, N lists of completion ids (up to and including the first stop token),
        `None` (no tools), the N completions as reward functions receive them (texts, or
        `[{"role": "assistant", "content": text}]` for conversational prompts), `None`, `{}`, `None` and `[]`.
        """
        mode = "train" if self.model.training else "eval"
        prompt_ids, images, multimodal_fields = self._tokenize_prompts(prompts)
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        completion_ids, logprobs = self._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations)
        completions = decode_completion_lists(
            completion_ids, self.processing_class, is_conversational({"prompt": prompts[0]})
        )
        return prompt_ids, completion_ids, None, completions, logprobs, {}, images, []

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """Generate G completions per prompt, score them and compute everything the loss needs.

        Returns a dict of `prompt_ids`/`prompt_mask` `(N, P)`, `completion_ids`/`completion_mask` `(N, L)`,
        `advantages` `(N,)`, optionally `old_per_token_logps`/`ref_per_token_logps` `(N, L)`, and
        `num_items_in_batch` (scalar, the DAPO normaliser).
        """
        args, device = self.args, self.accelerator.device
        mode = "train" if self.model.training else "eval"
        multiple, pad_id = args.pad_to_multiple_of, self.processing_class.pad_token_id
        # prompts → token lists → completions (see `_generate`), then padded as the loss reads them
        prompts = [example["prompt"] for example in inputs]
        self._prompts_truncated = None
        prompt_id_lists, completion_id_list, _, completions, sampling_logps, _, _, _ = self._generate(prompts)
        truncated = self._prompts_truncated  # set by `_tokenize_prompts` (None if an override did not)
        prompt_ids, prompt_mask = left_pad(prompt_id_lists, pad_id, device, multiple)
        end_ids = [*self.eos_token_ids, pad_id]
        masked = args.mask_truncated_completions
        sampled = pad_completions(completion_id_list, pad_id, end_ids, masked, device, multiple)
        completion_ids, full_mask, mask = sampled.completion_ids, sampled.full_mask, sampled.mask
        if self.reward_model_refresh is not None and mode == "train":  # labelled examples for the next update
            self.reward_model_refresh.collect(inputs, prompts, completions, completion_id_list, self.state)

        # → rewards and advantages over the global batch (a group may straddle processes), then this process's slice
        rewards_per_func = gather(self._calculate_rewards(inputs, prompts, completions, completion_id_list))
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        weights, aggregation = self.reward_weights.to(device), args.multi_objective_aggregation
        scored = aggregate_rewards(rewards_per_func, weights, group_size, args.scale_rewards, aggregation)
        n_local, rank = len(prompts), self.accelerator.process_index
        output = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": mask,
            "advantages": scored.advantages[rank * n_local : (rank + 1) * n_local],
        }

        # → old-policy (when the batch spans optimizer steps) and reference log-probs
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, mask], dim=1)
        stale = args.gradient_accumulation_steps % (args.steps_per_generation * self.num_iterations) != 0
        completion_width = mask.size(1)
        # vLLM's sampling log-probs, against which the policy's at generation time weight each token (TRL 1.16)
        correct = sampling_logps is not None and args.vllm_importance_sampling_correction
        if mode == "train":  # each pass over the rows of one micro-batch the loss will read, in its order
            rank, rows = self.accelerator.process_index, input_ids.size(0)
            passes = self.generation_buffer.micro_batch_rows(rows, args.seed, rank)
        else:
            passes = list(torch.arange(input_ids.size(0)).split(args.per_device_eval_batch_size))
        with torch.no_grad():
            if (stale and mode == "train") or correct:
                old_per_token_logps = by_passes(
                    self._old_per_token_logps, input_ids, attention_mask, completion_width, passes
                )
                if stale and mode == "train":
                    output["old_per_token_logps"] = old_per_token_logps
            if sampling_logps is not None:
                output["sampling_per_token_logps"] = padded_logprobs(sampling_logps, completion_width, device)
            if correct:
                self._importance_sampling(output, old_per_token_logps, mask, mode)
            if self.beta != 0.0:
                with self.reference.loaded():  # an offloaded reference is read in once for all the passes
                    output["ref_per_token_logps"] = by_passes(
                        self._ref_per_token_logps, input_ids, attention_mask, completion_width, passes
                    )
                output["ref_version"] = self.reference.version
        total_tokens = gather(mask.sum()).sum().float()
        micro_batches = args.steps_per_generation if mode == "train" else 1
        output["num_items_in_batch"] = total_tokens / (self.accelerator.num_processes * micro_batches)

        # Metrics and the completions table, over all processes
        metrics = self._metrics[mode]
        if mode == "train":  # cumulative prompt + completion tokens, saved with the trainer state
            self.state.num_input_tokens_seen += gather(prompt_mask.sum() + full_mask.sum()).sum().item()
        metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        extra_columns, hook_metrics = self._reward_hooks.pop(
            n_local, gather_object, lambda t: gather(t.to(device)).cpu()
        )
        batch = generation_batch_metrics(
            completion_lengths=gather(full_mask.sum(1)),
            terminated=gather(sampled.terminated),
            rewards_per_func=rewards_per_func,
            reward_names=self.reward_func_names,
            rewards=scored.rewards,
            frac_zero_std=scored.frac_reward_zero_std,
            truncated=gather(truncated.to(device)) if truncated is not None and self.max_prompt_length else None,
            hook_metrics=hook_metrics,
        )
        for key, value in batch:  # (name, value) pairs: a `log_metric` name may repeat a built-in one
            metrics[key].append(value)
        if args.log_completions and mode == "train":  # printed at training logs: never an eval batch
            columns = (prompts, completions, scored.rewards, scored.advantages, extra_columns)
            table = batch_completions_table(*columns, args.log_unique_prompts, gather_object)
            self._last_completions = table if self.accelerator.is_main_process else {}
        return output

    def _importance_sampling(self, output: dict, old_per_token_logps: torch.Tensor, mask: torch.Tensor, mode: str):
        """Put TRL 1.16's vLLM importance-sampling weights in `output` (`importance_sampling_ratio`: `(N, L)` for the
        token modes, `(N, 1)` for the sequence modes; see `importance_sampling.vllm_importance_sampling_ratio`) and log
        their metrics over all processes (means averaged, the max of maxima, the min of minima)."""
        args, sampling = self.args, output["sampling_per_token_logps"]
        ratio = vllm_importance_sampling_ratio(
            old_per_token_logps,
            sampling,
            mask,
            args.vllm_importance_sampling_mode,
            args.vllm_importance_sampling_clip_min,
            args.vllm_importance_sampling_clip_max,
        )
        output["importance_sampling_ratio"] = ratio
        metrics = importance_sampling_metrics(
            old_per_token_logps, sampling, mask, ratio, args.vllm_importance_sampling_mode
        )
        for key, value in reduced_over_processes(metrics, gather).items():
            self._metrics[mode][key].append(value)

    def _calculate_rewards(
        self, inputs: list[dict], prompts: list, completions: list, completion_ids_list: list
    ) -> torch.Tensor:
        """`(N, F)` float32 rewards of this process's completions, NaN where a function returned `None`. A reward
        error (a wrong output, a non-finite reward, one that overflows float32, alone or times its weight) is raised on
        every process together (see `grpo_rewards.raise_on_every_process`)."""
        with raise_on_every_process(self.accelerator.num_processes, gather_object):
            rewards = call_reward_funcs(
                self.reward_funcs,
                self.reward_func_names,
                self.reward_processing_classes,
                prompts,
                completions,
                completion_ids_list,
                {**reward_columns(inputs), "trainer_state": self.state, **self._log_hooks()},
                self.args.chat_template_kwargs,
                self.accelerator.device,
                self._reward_loop,
            )
            weighted_rewards(rewards, self.reward_weights, self.reward_func_names)  # names the overflowing ones
        return rewards

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal_inputs,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """`(per_token_logps, entropies, aux_loss)` of the last `logits_to_keep` (L) tokens of the `(N, P + L)`
        `input_ids` under `model` at the sampling temperature, `batch_size` rows per forward (see
        `grpo_scoring.score_completions`): `(N, L)` float32 log-probs, `(N, L)` float32 entropies (with a gradient when
        the entropy bonus is on or a subclass overrides the loss) or `None`, and the MoE router loss (scalar) or
        `None`, as in TRL 1.16.

        Raises:
            ValueError: for TRL's vision inputs (`pixel_values`, `image_grid_thw`, ...) that are not `None`.
        """
        given = sorted(name for name, value in multimodal_inputs.items() if value is not None)
        if given:
            raise ValueError(f"Vision inputs {given} are not supported here (no vision models).")
        # The trainer's own loss needs the entropies' gradient only for the entropy bonus (saving its backward
        # otherwise); a subclass's loss may use them in its own terms, so there they always carry one (as in TRL).
        own_loss = type(self)._compute_loss is GRPOTrainer._compute_loss
        own_loss = own_loss and type(self).compute_loss is GRPOTrainer.compute_loss
        scores = score_completions(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            self.temperature,
            batch_size,
            compute_entropy=compute_entropy,
            compute_aux_loss=compute_aux_loss,
            entropy_grad=compute_entropy and (self.entropy_control.enabled or not own_loss),
            share_prefix=self.args.shared_prefix,
            sparse_embedding_grad=tied_row_gradient(input_ids.device.type),  # CPU runs only: see device_defaults
            chunked_logprobs=self.args.chunked_logprobs,
            grouped_kv_attention=True,  # CPU only, the same log-probs to the bit
            recompute_elementwise_activations=self.args.recompute_elementwise_activations,
            packed=True,
            training_layout=self._training_layout,  # the old log-probs' pass (`_old_per_token_logps`)
        )
        return scores.per_token_logps, scores.entropies, scores.aux_loss

    def _old_per_token_logps(self, input_ids, attention_mask, logits_to_keep, batch_size) -> torch.Tensor:
        """`(N, L)` log-probs of the policy at generation time (π_θ_old), computed as the training forward will compute
        π_θ's over the same rows (`_compute_loss`: one pass, the router loss when it has one, the layout of a pass with
        gradients), so that the ratio π_θ / π_θ_old is exactly 1, in bf16 too, until the weights change."""
        self._training_layout = True
        try:
            return self._get_per_token_logps_and_entropies(
                self.model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size,
                compute_aux_loss=self.aux_loss_enabled,
            )[0]
        finally:
            self._training_layout = False

    def _ref_per_token_logps(self, input_ids, attention_mask, logits_to_keep, batch_size) -> torch.Tensor:
        """`(N, L)` reference log-probs: `_get_per_token_logps_and_entropies` of the reference's model."""
        with self.reference.scoring(self.model) as model:
            return self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size
            )[0]

    # ---- loss ----

    def _compute_loss(self, model, inputs):
        """GRPO loss of one micro-batch: `loss_type`'s policy term + beta × k3 KL, normalised as `loss_type` says."""
        args, mode = self.args, "train" if self.model.training else "eval"
        metrics = self._metrics[mode]
        completion_ids, mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], mask], dim=1)
        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            mask.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
        )
        old_per_token_logps = inputs.get("old_per_token_logps")
        if old_per_token_logps is None:
            old_per_token_logps = per_token_logps.detach()
        entropy_mask = None  # the top-ρ entropy quantile over all processes' valid tokens
        if args.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - args.top_entropy_quantile)
        token_mask = entropy_mask
        if args.off_policy_mask_threshold is not None:  # completions dropped by off-policy sequence masking
            advantages = inputs["advantages"]
            keep = self.get_off_policy_mask(
                advantages=advantages.unsqueeze(1) if advantages.dim() == 1 else advantages,
                per_token_logps=per_token_logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", old_per_token_logps),
                mask=mask,
                off_policy_threshold=args.off_policy_mask_threshold,
            )
            token_mask = keep if token_mask is None else token_mask * keep
        policy = per_token_policy_loss(
            per_token_logps, old_per_token_logps, inputs["advantages"], mask, token_mask, **self.policy_loss_kwargs
        )
        per_token_loss = policy.per_token_loss
        if "importance_sampling_ratio" in inputs:  # vLLM's sampling corrected (TRL 1.16), before the KL term
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        if self.beta != 0.0:
            per_token_kl = kl_k3(per_token_logps, inputs["ref_per_token_logps"])
            if args.use_bias_correction_kl:
                per_token_kl = importance_weighted_kl(per_token_kl, policy.ratio)
            per_token_loss = per_token_loss + self.beta * per_token_kl
        loss = aggregate_loss(
            per_token_loss, mask, self.loss_type, self.max_completion_length, inputs["num_items_in_batch"]
        )
        if self.entropy_control.enabled:  # entropy bonus over the tokens the policy loss acts on
            # the current accumulation window's size (set by Trainer's loop; the configured one before any training)
            steps = getattr(self, "current_gradient_accumulation_steps", args.gradient_accumulation_steps)
            bonus_mask = mask if entropy_mask is None else entropy_mask
            loss = self.entropy_control.add_logged_bonus(
                loss, entropies, bonus_mask, metrics, self.loss_type, mode == "train", steps, self.accelerator
            )
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
        self._current_train_step_time += time.perf_counter() - start
        if self.accelerator.sync_gradients:  # the window's last micro-batch: `step_time` is per optimizer step
            self._metrics["train"]["step_time"].append(self._current_train_step_time)
            self._current_train_step_time = 0.0
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
            metrics = {f"{self._eval_metric_prefix}_{key}": value for key, value in metrics.items()}
        elif self.sync_callback is not None:
            metrics.update(self.sync_callback.metrics(self.state.global_step))
        logs.update(metrics)  # in place, as transformers adds "epoch": `evaluate` returns this dict
        super().log(logs, start_time)
        self._metrics[mode].clear()
        printable = self.args.log_completions and self._last_completions and self.accelerator.is_main_process
        if mode == "train" and printable:
            print_completions_table(self._last_completions, self.state.global_step, self.args.num_completions_to_print)
