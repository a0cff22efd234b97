# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`vllm_mode="colocate"`: a vLLM engine inside the training process samples the completions, and takes the policy's
weights through vLLM's public `reload_weights`."""

import time
from collections.abc import Iterable

import torch
from transformers.utils import logging

from .vllm_utils import CPU_ENVIRONMENT, environment, require_vllm, sampling_params
from .vllm_worker_ext import WORKER_EXTENSION


logger = logging.get_logger(__name__)


class ColocateEngine:
    """An in-process `vllm.LLM` on the trainer's device (the `VLLMGenerator` protocol of `vllm_utils`).

    The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` while it is built: a separate engine
    process could not take weights as tensors); when training runs on several processes, each engine uses their
    torch.distributed run (`distributed_executor_backend="external_launcher"`; measured with 2 gloo processes on the
    CPU), and alone it starts a one-process group of its own; with `logprobs_mode="processed_logprobs"` (the log-probs of the
    distribution sampled from, after the temperature), the weight-loading worker extension of `vllm_worker_ext` and, on
    the CPU, `enforce_eager=True` (without it vLLM compiles
    the model for minutes) and vLLM's OpenMP threads left unbound (they share the cores with training). Environment
    variables are set only while the engine is built, and only those the user has not set.

    Args:
        model: the folder (or hub id) vLLM loads, holding the policy's architecture and tokenizer.
        dtype: the policy's parameter dtype (`torch.float32`, `torch.bfloat16`, ...), so that pushed weights keep their
            bits.
        max_model_len: `vllm_max_model_length` (`None`: the model's own).
        gpu_memory_utilization: `vllm_gpu_memory_utilization` (ignored on the CPU).
        enable_sleep_mode: `vllm_enable_sleep_mode`.
        model_impl: `vllm_model_impl` (`"vllm"` or `"transformers"`).
        max_num_seqs: the most rows one `generate` call sends.
        seed: the engine's seed (each request also carries its own).
        device: the trainer's device; `"cpu"` selects the CPU settings above.
        tensor_parallel_size: `vllm_tensor_parallel_size`; `GRPOConfig` refuses more than 1 in colocate mode (one engine
            per training process), so this is 1.
        trust_remote_code: `GRPOConfig.trust_remote_code`, as the policy was loaded.

    Raises:
        ImportError: from `require_vllm` (no vLLM, or an older one).
    """

    def __init__(
        self,
        model: str,
        dtype: torch.dtype,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.3,
        enable_sleep_mode: bool = False,
        model_impl: str = "vllm",
        max_num_seqs: int = 64,
        seed: int = 0,
        device: str = "cpu",
        tensor_parallel_size: int = 1,
        trust_remote_code: bool = False,
    ):
        self.vllm = require_vllm()
        cpu = device == "cpu"
        # several training processes: each engine joins the torch.distributed run they already share (vLLM's
        # "external_launcher") instead of starting one of its own
        launched = torch.distributed.is_available() and torch.distributed.is_initialized()
        launched = launched and torch.distributed.get_world_size() > 1
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        if cpu:
            env.update(CPU_ENVIRONMENT)
        start = time.perf_counter()
        with environment(env):
            self.llm = self.vllm.LLM(
                model=model,
                dtype=str(dtype).removeprefix("torch."),
                max_model_len=max_model_len,
                gpu_memory_utilization=gpu_memory_utilization,
                enable_sleep_mode=enable_sleep_mode,
                model_impl=model_impl,
                max_num_seqs=max_num_seqs,
                seed=seed,
                tensor_parallel_size=tensor_parallel_size,
                trust_remote_code=trust_remote_code,
                enforce_eager=cpu,
                logprobs_mode="processed_logprobs",
                worker_extension_cls=WORKER_EXTENSION,
                distributed_executor_backend="external_launcher" if launched else None,
            )
        logger.info(f"vLLM colocate engine for {model} ready in {time.perf_counter() - start:.1f} s.")

    def generate(
        self, prompt_ids: list[list[int]], sampling: dict, seeds: list[int]
    ) -> tuple[list[list[int]], list[list[float]]]:
        """One completion per row of `prompt_ids` (row i with `SamplingParams(**sampling, seed=seeds[i])`): token ids
        as sampled (ending with the stop token when one ended it) and the processed log-prob of each."""
        prompts = [{"prompt_token_ids": list(ids)} for ids in prompt_ids]
        params = [sampling_params(self.vllm, sampling, seed) for seed in seeds]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        completions, logprobs = [], []
        for output in outputs:
            sample = output.outputs[0]
            ids = list(sample.token_ids)
            completions.append(ids)
            logprobs.append([float(step[token].logprob) for step, token in zip(sample.logprobs, ids)])
        return completions, logprobs

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load `weights` (checkpoint names, full tensors) in one `reload_weights` call, so that the parts of a fused
        layer (q/k/v, gate/up) arrive together, tie again what the reload untied (an LM head tied to the embedding:
        `vllm_worker_ext.WeightReceiver.reload_checkpoint_weights`), then clear the prefix cache (its keys and values belong to the old
        weights). Returns the number of tensors loaded.

        Raises:
            RuntimeError: when vLLM refuses the weights; the engine is then unusable (vLLM has already taken apart the
                layers it was reloading), so training must stop.
        """
        count = 0

        def counted():
            nonlocal count
            for name, tensor in weights:
                count += 1
                yield name, tensor

        try:
            # `reload_weights`, then a tied LM head pointed at the new embedding again (see `WeightReceiver`)
            self.llm.collective_rpc("reload_checkpoint_weights", kwargs={"weights": counted()})
        except Exception as error:
            raise RuntimeError(
                f"vLLM could not load the policy's weights ({error}); the colocated engine is unusable now."
            ) from error
        self.llm.reset_prefix_cache()
        return count

    def close(self) -> None:
        """Drop the engine (vLLM keeps part of its memory until the process ends)."""
        self.llm = None
