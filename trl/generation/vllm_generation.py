# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Sampling with vLLM for `GRPOTrainer` (`use_vllm=True`): the generator of `vllm_mode`, where its model comes from, and
when the policy's weights are pushed to it (before a generation that follows a change of the weights, and only then)."""

import os
import shutil
import tempfile

import torch
from accelerate.utils import broadcast_object_list, gather_object
from transformers import TrainerCallback
from transformers.utils import logging

from ..models.utils import model_init_kwargs
from .weight_sync import check_vllm_weight_names, vllm_weight_shapes, vllm_weights


logger = logging.get_logger(__name__)


# `from_pretrained` keyword arguments that load the same weights vLLM reads from the folder (anything else, e.g. a
# `revision` or `subfolder`, sends the engine to a saved copy of the policy instead)
SAME_WEIGHTS_KWARGS = {
    "dtype",
    "torch_dtype",
    "attn_implementation",
    "device_map",
    "low_cpu_mem_usage",
    "trust_remote_code",
}


def engine_model_source(
    model, processing_class, given_path: str | None, model_init_kwargs: dict
) -> tuple[str, bool, bool]:
    """Where a colocated vLLM engine loads the policy from, whether what it loads is the policy's weights, and whether
    that folder is a temporary copy (deleted once the engine is built).

    The path the trainer loaded the policy from, when it was given as a path and loaded plainly (no GGUF file, no
    quantization, no `from_pretrained` argument beyond `SAME_WEIGHTS_KWARGS`), holds exactly the policy: the engine
    starts in sync, and the first push waits for the first change. A model given as an object is loaded from its
    `name_or_path` folder (the base model's for a PEFT model) when there is one, and gets the policy's weights before
    its first generation. Otherwise the policy (its base model) is saved with its tokenizer to a temporary folder,
    which then holds it.

    Returns:
        `(path or hub id, in_sync, temporary)`. A PEFT policy is never in sync at the start (its adapter is merged
        into what vLLM serves), so it is pushed before the first generation.
    """
    peft = hasattr(model, "peft_config")
    base = model.get_base_model() if peft else model
    plain_load = set(model_init_kwargs) <= SAME_WEIGHTS_KWARGS
    if given_path is not None and plain_load:
        return given_path, not peft, False
    source = getattr(base, "name_or_path", "") or ""
    if given_path is None and os.path.isfile(os.path.join(source, "config.json")):
        return source, False, False
    folder = tempfile.mkdtemp(prefix="trl-vllm-model-")
    base.save_pretrained(folder)
    processing_class.save_pretrained(folder)
    return folder, not peft, True


class PolicyVersion(TrainerCallback):
    """Counts the changes of the policy's weights: every optimizer step (`on_optimizer_step`) and every load of
    weights into it (`bump`: a checkpoint resumed from, the best model loaded at the end). It is never reset, so a
    second `train()` call, whose `global_step` starts again, still sees its changes."""

    def __init__(self):
        self.value = 0

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.value += 1

    def bump(self) -> None:
        self.value += 1


class VLLMGeneration:
    """The policy's completions sampled by vLLM, in `vllm_mode`.

    - `"colocate"`: every process has its own in-process engine (`vllm_colocate.ColocateEngine`) and samples its own
      rows.
    - `"server"`: the main process talks to a `trl vllm-serve` server (`vllm_client.VLLMServerClient`), sending every
      process's rows and handing each its completions.

    The weights vLLM holds are tagged with the policy's version (`PolicyVersion`: optimizer steps and loads), and
    `sync_weights` pushes only when the version changed since the last push. `pushes` counts them. TRL 1.16's
    attributes are there too: `llm` (the colocated `vllm.LLM`, else `None`) and `vllm_client` (the server client on
    the main process, else `None`).

    Args:
        generator: the `VLLMGenerator` of this process (`None` on the processes that do not talk to a server).
        model: the policy (unwrapped; ZeRO-3 or FSDP2 parameters stay sharded), whose checkpoint names and shapes
            every push is checked against before anything is sent.
        accelerator: the trainer's accelerator.
        colocate: whether every process has a generator.
        in_sync: whether the generator already holds the policy's weights at version 0.
    """

    def __init__(self, generator, model, accelerator, colocate: bool, in_sync: bool):
        self.generator = generator
        self.accelerator = accelerator
        self.colocate = colocate
        self.llm = generator.llm if colocate else None
        self.vllm_client = None if colocate else generator
        self.version = 0 if in_sync else None
        self.pushes = 0
        self.expected_shapes = vllm_weight_shapes(model)

    def sync_weights(self, model, version: int) -> bool:
        """Push the policy's weights if `version` differs from the one vLLM holds; return whether it pushed. Every
        process must call it (gathering sharded weights is collective).

        Raises:
            ValueError: when the policy's checkpoint names or shapes differ from those vLLM was built with (before
                anything is sent).
            RuntimeError: when vLLM fails to load them.
        """
        if version == self.version:
            return False
        check_vllm_weight_names(list(vllm_weight_shapes(model).items()), self.expected_shapes)
        weights = vllm_weights(model, self.accelerator)
        if self.generator is not None:
            sent = self.generator.load_weights(weights)
            logger.info(f"Pushed {sent} tensors of the policy (version {version}) to vLLM.")
        else:
            for _ in weights:  # take part in the gathers of sharded weights; the main process sends them
                pass
        self.version = version
        self.pushes += 1
        return True

    def generate(
        self, prompt_ids: list[list[int]], sampling: dict, seeds: list[int]
    ) -> tuple[list[list[int]], list[list[float]]]:
        """This process's completions and their log-probs (see `VLLMGenerator.generate`)."""
        if self.colocate:
            return self.generator.generate(prompt_ids, sampling, seeds)
        rows = gather_object([(list(ids), seed) for ids, seed in zip(prompt_ids, seeds)])
        counts = gather_object([len(prompt_ids)])
        result = [None]
        if self.generator is not None:
            result = [self.generator.generate([ids for ids, _ in rows], sampling, [seed for _, seed in rows])]
        if self.accelerator.num_processes > 1:
            result = broadcast_object_list(result, from_process=0)
        completions, logprobs = result[0]
        start = sum(counts[: self.accelerator.process_index])
        end = start + len(prompt_ids)
        return completions[start:end], logprobs[start:end]

    def close(self) -> None:
        if self.generator is not None:
            self.generator.close()


def padded_logprobs(logprobs: list[list[float]], width: int, device) -> torch.Tensor:
    """`(N, width)` float32 tensor of N log-prob lists, right-padded with 0.0 (the completions' padding is masked)."""
    out = torch.zeros(len(logprobs), width, dtype=torch.float32)
    for row, values in enumerate(logprobs):
        out[row, : len(values)] = torch.tensor(values[:width], dtype=torch.float32)
    return out.to(device)


def build_vllm_generation(args, model, processing_class, given_path: str | None, accelerator) -> VLLMGeneration:
    """The `VLLMGeneration` a [`GRPOConfig`] with `use_vllm=True` asks for, on this process.

    Colocate: an engine per process on its device, loaded from `engine_model_source`, in the policy's dtype, with room
    for one generation batch of rows (training or evaluation, whichever is larger). Server: the main process connects to
    `vllm_server_base_url` (or `http://vllm_server_host:vllm_server_port`) and waits up to `vllm_server_timeout`
    seconds for it; the server's weights are replaced by the policy's before the first generation.

    Raises:
        ValueError: for a quantized policy.
        ImportError: colocate without vLLM (`vllm_utils.require_vllm`).
        ConnectionError: server mode, when the server does not answer within `vllm_server_timeout` (the message names
            its URL).
    """
    base = model.get_base_model() if hasattr(model, "peft_config") else model
    if getattr(base, "is_quantized", False):
        raise ValueError(
            "use_vllm=True with a quantized policy (quantization_config, load_in_4bit/8bit) is not supported here: "
            "vLLM would get the packed quantized tensors. Load the policy unquantized, or set use_vllm=False."
        )
    if args.vllm_mode == "colocate":
        from .vllm_colocate import ColocateEngine

        path, in_sync, temporary = engine_model_source(model, processing_class, given_path, model_init_kwargs(args))
        rows = max(args.generation_batch_size // accelerator.num_processes, args.per_device_eval_batch_size)
        engine = ColocateEngine(
            path,
            dtype=next(model.parameters()).dtype,
            max_model_len=args.vllm_max_model_length,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            enable_sleep_mode=args.vllm_enable_sleep_mode,
            model_impl=args.vllm_model_impl,
            max_num_seqs=rows,
            seed=args.seed + accelerator.process_index,
            device=accelerator.device.type,
            tensor_parallel_size=args.vllm_tensor_parallel_size,
            trust_remote_code=args.trust_remote_code,
        )
        if temporary:  # vLLM has read the weights and the tokenizer
            shutil.rmtree(path, ignore_errors=True)
        return VLLMGeneration(engine, model, accelerator, colocate=True, in_sync=in_sync)
    client = None
    if accelerator.is_main_process:
        from .vllm_client import VLLMServerClient

        client = VLLMServerClient(
            base_url=args.vllm_server_base_url,
            host=args.vllm_server_host,
            port=args.vllm_server_port,
            group_port=args.vllm_group_port,
            timeout=args.vllm_server_timeout,
        )
        client.wait_until_healthy()
    accelerator.wait_for_everyone()
    return VLLMGeneration(client, model, accelerator, colocate=False, in_sync=False)
