# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Model helpers: loading the policy and its tokenizer, building a frozen reference model, switching dropout off,
unwrapping a policy for generation, placing frozen models (reference, reward models) next to the policy under
accelerate / DeepSpeed, and naming a PEFT adapter's parameters."""

import copy
import json
import os
import weakref
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

from .gguf import dense_gguf_kwargs, drop_dequantized_gguf_quantizer


logger = logging.get_logger(__name__)

# Where the transformer blocks of common architectures live; `{layer}` is the block index.
LAYER_PATTERNS = (
    "transformer.h.{layer}",
    "model.decoder.layers.{layer}",
    "gpt_neox.layers.{layer}",
    "model.layers.{layer}",
)


class PathNotFoundError(FileNotFoundError):
    """A model, tokenizer or dataset named by a string that is neither an existing local path nor loadable from the
    Hugging Face Hub. A `FileNotFoundError` (so an `OSError`, like the loaders' own errors)."""


def one_line(error: BaseException, *, with_type: bool = False, first_only: bool = False) -> str:
    """An error's message on one line (the error's type name when the message is empty).

    A multi-line message (a heading and `- item` lines, as `GRPOConfig` raises) becomes `heading: item item`
    (`item; item` when an item does not end with a period). `first_only=True` keeps only the first non-empty line
    (the gist of a loader's error, without its advice lines); `with_type=True` prefixes `"<ErrorType>: "`.
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    head, items = lines[0], [] if first_only else [line[2:] if line.startswith("- ") else line for line in lines[1:]]
    if items:
        separator = " " if all(item.endswith(".") for item in items) else "; "
        head = (head.rstrip(":") + ": " if head.endswith(":") else head + " ") + separator.join(items)
    return f"{type(error).__name__}: {head}" if with_type else head


@contextmanager
def explain_missing_path(path: Any, what: str = "Model"):
    """Re-raise a loading error of `path` as a [`PathNotFoundError`] that says the path does not exist.

    `from_pretrained` and `load_dataset` treat a string that is not a local path as a Hub id, so a mistyped local
    path fails with a Hub error (`We couldn't connect to 'https://huggingface.co'`, `Repo id must be in the form
    ...`). Inside this block, an `OSError` (what transformers and datasets raise) raised while `path` does not exist locally becomes
    `"<what> '<path>' is not an existing local folder (or file) and could not be loaded from the Hugging Face Hub
    (<original error's first line>)"`, chained to the original. Any other error, or any error for a path that
    exists, is raised unchanged; nothing changes when loading succeeds (Hub ids still load when online).
    """
    try:
        yield
    except OSError as error:
        if not isinstance(path, str) or os.path.exists(path) or isinstance(error, PathNotFoundError):
            raise
        raise PathNotFoundError(
            f"{what} {path!r} is not an existing local folder (or file) and could not be loaded from the Hugging "
            f"Face Hub ({one_line(error, with_type=True, first_only=True)})"
        ) from error


def model_init_kwargs(args) -> dict[str, Any]:
    """The keyword arguments for `from_pretrained` from a config's `model_init_kwargs` (a dict or its JSON string)
    and `trust_remote_code`; a `dtype` (or TRL's older `torch_dtype`) given by name becomes a `torch.dtype`."""
    kwargs = args.model_init_kwargs or {}
    kwargs = dict(json.loads(kwargs) if isinstance(kwargs, str) else kwargs)
    kwargs.setdefault("trust_remote_code", args.trust_remote_code)
    dtype = kwargs.pop("torch_dtype", kwargs.get("dtype"))
    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    if dtype is not None:
        kwargs["dtype"] = dtype
    return kwargs


def load_policy(
    model: str | PreTrainedModel, args, quantization_config=None, peft_config=None
) -> tuple[PreTrainedModel, bool]:
    """The policy to train: `model` loaded when it is a path (with `model_init_kwargs(args)` and
    `quantization_config`), then wrapped with a new PEFT adapter when `peft_config` is given. A GGUF checkpoint
    (`gguf_file` in `model_init_kwargs`) is loaded as dense, trainable weights.

    Returns:
        `(policy, given_peft_model)`: `given_peft_model` is whether `model` already was a PEFT model (its adapter,
        possibly trained, then serves as the initial reference).

    Raises:
        ValueError: if `quantization_config` or `args.model_init_kwargs` is given with an instantiated model.
        PathNotFoundError: if `model` is a string that is not an existing local path and could not be loaded from
            the Hub either.
    """
    if quantization_config is not None and not isinstance(model, str):
        raise ValueError(
            "You passed `quantization_config` to the trainer, but your model is already instantiated: "
            "quantization_config applies when `model` is a path; quantize an instantiated model yourself."
        )
    if isinstance(model, str):
        quantization = {"quantization_config": quantization_config} if quantization_config is not None else {}
        init_kwargs = dense_gguf_kwargs({**model_init_kwargs(args), **quantization})
        with explain_missing_path(model, "Model"):
            loaded = AutoModelForCausalLM.from_pretrained(model, **init_kwargs)
        model = drop_dequantized_gguf_quantizer(loaded)
    elif args.model_init_kwargs:
        raise ValueError(
            "You passed `model_init_kwargs` to the `GRPOConfig`, but your model is already instantiated: "
            "model_init_kwargs only apply when `model` is a path; drop them or pass the path."
        )
    else:  # a model the user loaded dense from a GGUF file is still marked quantized, which Trainer refuses
        model = drop_dequantized_gguf_quantizer(model)
    keep_4bit_layout_for_training(model)
    given_peft_model = hasattr(model, "peft_config")
    if peft_config is not None:
        from peft import get_peft_model

        if args.gradient_checkpointing:  # frozen embeddings: let checkpointed blocks still see a grad input
            model.enable_input_require_grads()
        model = get_peft_model(model, peft_config)
    return model, given_peft_model


def keep_4bit_layout_for_training(model: nn.Module) -> int:
    """Stop bitsandbytes from repacking `model`'s 4-bit weights for its CPU inference kernel; returns how many layers
    were told.

    On a CPU with AVX512-BF16, bitsandbytes 0.50's `Linear4bit` repacks its weight in place into another layout the
    first time it runs in eval mode without gradients (GRPO's generation), and a later training forward on that
    layout fails (`result += bias` on a tensor autograd tracks). The policy trains, so it keeps the layout it was
    loaded in (`support_avx512bf16_for_cpu = False` on each such layer); other CPUs and GPUs are not affected.
    """
    layers = [m for m in model.modules() if getattr(m, "support_avx512bf16_for_cpu", False)]
    for layer in layers:
        layer.support_avx512bf16_for_cpu = False
    return len(layers)


def load_tokenizer(model: PreTrainedModel, args, tokenizer: PreTrainedTokenizerBase | None = None):
    """`tokenizer`, or the one saved with `model`, with its EOS as pad token when it has none.

    The saved one is read from where the model was: the same revision and, for a GGUF checkpoint, the same
    `gguf_file` (from `args.model_init_kwargs`, which apply to a path only).

    Raises:
        ValueError: if no `tokenizer` is given and the model has no `config._name_or_path` to load one from.
        PathNotFoundError: if the tokenizer is to be loaded from a path that does not exist (a model built in memory
            and saved nowhere) and is no Hub id either.
    """
    if tokenizer is None:
        init_kwargs = model_init_kwargs(args)
        location = {key: init_kwargs[key] for key in ("revision", "gguf_file", "subfolder") if key in init_kwargs}
        path = model.config._name_or_path
        if not path:
            raise ValueError(
                "The model was not loaded from a path (its `config._name_or_path` is empty), so there is no saved "
                "tokenizer to load: pass `processing_class`."
            )
        with explain_missing_path(path, "Tokenizer"):
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=args.trust_remote_code, **location)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def create_reference_model(
    model: nn.Module,
    num_shared_layers: int | None = None,
    pattern: str | None = None,
    *,
    from_pretrained_kwargs: dict[str, Any] | None = None,
) -> nn.Module:
    """A frozen copy of `model` to serve as the reference model π_ref, optionally sharing its first layers.

    The copy has the same parameter names, shapes, dtypes and devices, is in eval mode, and none of its parameters
    requires a gradient (so it can never enter an optimizer).

    With `num_shared_layers=k`, every parameter that comes before the first parameter of block k (the embeddings
    and blocks 0 … k−1) is shared: the reference points at the policy's storage (no second copy in memory), and
    the policy's own copies are frozen, so both stay at their initial values. The rest of the copy is a separate,
    frozen copy. A reference sync leaves shared tensors as they are (mixing a tensor with itself).

    A DeepSpeed ZeRO-3 model is partitioned as it is loaded (each rank holds one slice of every parameter) and
    cannot be deep-copied; its reference is loaded again from `model.config._name_or_path`, with the same config,
    dtype and `from_pretrained_kwargs` (the policy's: revision, `gguf_file`, ...), so it is partitioned the same
    way. That is the policy's initial weights: pass the policy as a path (or save it first) when it was modified
    in memory.

    Args:
        model: a `transformers.PreTrainedModel` (or any `nn.Module`), not wrapped by DDP/DeepSpeed.
        num_shared_layers: number of leading blocks to share with the policy (and freeze in it); `None` shares
            nothing.
        pattern: name prefix of a block with a `{layer}` placeholder, e.g. `"transformer.h.{layer}"`; found among
            `LAYER_PATTERNS` when `None`. Only used with `num_shared_layers`.
        from_pretrained_kwargs: the keyword arguments the policy was loaded with (`model_init_kwargs`); only used
            to load a ZeRO-3 reference again.

    Returns:
        The reference model.

    Raises:
        ValueError: if `model` is ZeRO-3 partitioned and has no `config._name_or_path` to load from, if layers are
            to be shared with a ZeRO-3 partitioned model, or if no parameter name contains the block pattern.
    """
    partitioned = any(hasattr(p, "ds_id") for p in model.parameters())
    if partitioned and num_shared_layers is not None:
        raise ValueError(
            "create_reference_model cannot share layers (num_shared_layers) with a ZeRO-3 partitioned model: leave "
            "num_shared_layers unset."
        )
    if partitioned:
        path = getattr(getattr(model, "config", None), "_name_or_path", None)
        if not path or not hasattr(type(model), "from_pretrained"):
            raise ValueError(
                "create_reference_model cannot copy a ZeRO-3 partitioned model and this one has no "
                "`config._name_or_path` to load the reference from; pass the policy as a path."
            )
        kwargs = dense_gguf_kwargs({**(from_pretrained_kwargs or {}), "config": model.config, "dtype": model.dtype})
        reference = drop_dequantized_gguf_quantizer(type(model).from_pretrained(path, **kwargs))
    else:
        reference = copy.deepcopy(model)
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    if num_shared_layers is not None:
        _share_leading_parameters(model, reference, num_shared_layers, pattern)
    return reference.eval()


def _share_leading_parameters(model: nn.Module, reference: nn.Module, num_shared_layers: int, pattern: str | None):
    """Point `reference`'s parameters before block `num_shared_layers` at `model`'s storage and freeze them in
    `model` (see `create_reference_model`)."""
    names = [name for name, _ in model.named_parameters()]
    candidates = [pattern] if pattern is not None else LAYER_PATTERNS
    first_unshared = next(
        (name for c in candidates for name in names if c.format(layer=num_shared_layers) in name), None
    )
    if first_unshared is None:
        tried = " or ".join(repr(c.format(layer=num_shared_layers)) for c in candidates)
        raise ValueError(
            f"No parameter name contains {tried}, so the first {num_shared_layers} layers cannot be shared: pass "
            "`pattern`, the name prefix of a block with a `{layer}` placeholder, e.g. 'transformer.h.{layer}'."
        )
    for name in names[: names.index(first_unshared)]:
        shared = model.get_parameter(name)
        shared.requires_grad_(False)
        reference.get_parameter(name).data = shared.data


def disable_dropout_in_model(model: nn.Module) -> None:
    """Set `p = 0` in every `torch.nn.Dropout` module of `model`, in place."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


@contextmanager
def unwrap_model_for_generation(model: nn.Module, accelerator, gather_deepspeed3_params: bool = True):
    """Yield the bare policy for `generate`, with its sharded weights gathered once for the duration if asked.

    Args:
        model: the policy as wrapped by `accelerator.prepare` (DDP, DeepSpeed engine, FSDP2 module, ...).
        accelerator: the `accelerate.Accelerator` that wrapped it.
        gather_deepspeed3_params: under ZeRO-3 and FSDP2, gather all weights once (fast generation, full-model
            memory on every rank) instead of letting every forward, i.e. every decode step, gather them layer by
            layer (see `fsdp2_gathered`).
    """
    unwrapped = accelerator.unwrap_model(model)
    deepspeed_plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if not gather_deepspeed3_params:
        yield unwrapped
    elif deepspeed_plugin is not None and deepspeed_plugin.zero_stage == 3:
        with zero3_gathered(model):
            yield unwrapped
    else:
        with fsdp2_gathered(unwrapped):
            yield unwrapped


# The modules of ZeRO-3 engines inside `zero3_gathered` right now: whole weights and no DeepSpeed hooks.
_ZERO3_GATHERED = weakref.WeakSet()
# What `zero3_gathered` uses of DeepSpeed's ZeRO-3 parameter manager (`DeepSpeedZeRoOffload`) to swap its hooks.
_ZERO3_HOOK_API = ("_remove_module_hooks", "setup_zero_stage3_hooks", "forward_hooks", "backward_hooks")


def zero3_hooks_removed(model: nn.Module) -> bool:
    """Whether `model` (an engine's module) is inside `zero3_gathered`: its weights are whole and its forwards run
    without DeepSpeed's hooks, so they neither fetch nor release anything (shared-prefix generation can run)."""
    return model in _ZERO3_GATHERED


@contextmanager
def zero3_gathered(engine: nn.Module):
    """Gather every ZeRO-3 parameter of a DeepSpeed `engine` once for the block, with DeepSpeed's module hooks out of
    the way, and put the hooks back before the parameters are partitioned again on exit (also when the block raises).

    `deepspeed.zero.GatheredParameters` alone gathers the weights, but the forward hooks DeepSpeed installed on every
    submodule stay active: each forward inside the block fetches and releases every layer again (so `generate` would
    gather per layer at every decode step). Without the hooks the forwards read the gathered weights as plain tensors
    and issue no collective, so a rank may run a forward the others do not (the prompt pass of shared-prefix
    generation, decided per rank). The hooks come back as DeepSpeed set them up, with each module's `ds_id` as it
    was; DeepSpeed then re-records its prefetch trace at the next forward. The hooks stay in place (every forward
    gathers, as before) for an engine whose ZeRO-3 parameter manager lacks the DeepSpeed internals used here
    (`_ZERO3_HOOK_API`, present in DeepSpeed 0.19) and under DeepCompile, which manages the gathering itself.
    """
    import deepspeed
    from deepspeed.runtime.zero import parameter_offload

    optimizer = getattr(engine, "optimizer", None)  # the ZeRO-3 optimizer, or the parameter manager itself
    if isinstance(optimizer, parameter_offload.DeepSpeedZeRoOffload):
        offload = optimizer
    else:
        offload = getattr(optimizer, "parameter_offload", None)
    deepcompile = getattr(engine, "is_deepcompile_active", lambda: False)()
    swap = offload is not None and not deepcompile and all(hasattr(offload, name) for name in _ZERO3_HOOK_API)
    with deepspeed.zero.GatheredParameters(list(engine.parameters())):
        if not swap:
            yield engine
            return
        ids = {module: module.ds_id for module in engine.module.modules() if hasattr(module, "ds_id")}
        stack = list(parameter_offload.FWD_MODULE_STACK)
        removed = False
        try:
            offload._remove_module_hooks()
            removed = True
            offload.forward_hooks, offload.backward_hooks = [], []  # handles already removed
            _ZERO3_GATHERED.add(engine.module)
            yield engine
        finally:
            _ZERO3_GATHERED.discard(engine.module)
            try:
                if removed:
                    offload.setup_zero_stage3_hooks()  # every module hook again, as the engine set them up
                    for module, ds_id in ids.items():  # setup numbers the modules on from a process-wide counter
                        module.ds_id = ds_id
            finally:
                # setup also pushes the engine's module on DeepSpeed's module stack, which its hooks scan
                parameter_offload.FWD_MODULE_STACK[:] = stack


def fsdp2_modules(model: nn.Module) -> list:
    """One `fully_shard`-ed module of `model` per FSDP2 state, outermost (the root) first; `[]` when there are none.

    `fully_shard([a, b])` gives several modules one state (accelerate 1.15 shards a model's embedding, final norm and
    LM head together, and the root module's state holds no parameters of its own)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        return []
    modules, states = [], set()
    for module in model.modules():
        if isinstance(module, FSDPModule) and id(module._get_fsdp_state()) not in states:
            states.add(id(module._get_fsdp_state()))
            modules.append(module)
    return modules


# The private FSDP2 state that `fsdp2_gathered` reads to restore each module's reshard-after-forward setting.
_FSDP2_STATE_ATTRIBUTES = ("_lazy_init", "_auto_reshard_after_forward", "_fsdp_param_groups")


@contextmanager
def fsdp2_gathered(model: nn.Module):
    """Keep every FSDP2 (`fully_shard`) module of `model` unsharded for the block: one all-gather per parameter
    group on entry, none in the block's forwards, and the shards alone again on exit (a no-op without FSDP2).

    FSDP2 all-gathers a module's parameters at each forward and, with `reshard_after_forward` (accelerate's
    default), frees them after it, so `generate` would gather every layer again at every decode step (TRL 1.16 does
    so). Here the modules stop resharding after forward for the block and each module's own setting (FSDP2 gives the
    root `False`) is restored on exit, also when the block or a gather raises. That setting has no public getter:
    when this torch version lacks the private attributes read for it (`_FSDP2_STATE_ATTRIBUTES`), the block runs as
    FSDP2 would anyway (every forward gathers).
    """
    modules = fsdp2_modules(model)
    states = [module._get_fsdp_state() for module in modules]
    if not all(hasattr(state, name) for state in states for name in _FSDP2_STATE_ATTRIBUTES):
        yield model
        return
    if states:
        states[0]._lazy_init()  # FSDP2 decides the root's setting at the root's first forward: decide it now
    changed = []
    try:
        for module, state in zip(modules, states):
            mesh_infos = [group.post_forward_mesh_info for group in state._fsdp_param_groups]
            changed.append((module, state, state._auto_reshard_after_forward, mesh_infos))
            module.set_reshard_after_forward(False, recurse=False)
            module.unshard()
        yield model
    finally:
        for module, state, auto, mesh_infos in changed:
            state._auto_reshard_after_forward = auto
            for group, mesh_info in zip(state._fsdp_param_groups, mesh_infos):
                group.post_forward_mesh_info = mesh_info
            module.reshard()


def check_distributed_setup(accelerator) -> None:
    """Refuse a launch whose processes would each train alone, and warn when accelerate drops FSDP on CPU processes.

    `accelerate launch` (or `torchrun`) with several processes on a machine without GPUs and without `use_cpu`
    leaves accelerate with no distributed setup at all: every process trains its own copy on the whole dataset and
    they write the same output folder, with no error (measured with accelerate 1.15). With `use_cpu`, accelerate runs
    CPU processes with gloo as DDP and ignores an FSDP config (it enables FSDP for GPU-like devices only); the main
    process says so once.

    Raises:
        ValueError: if the environment says `WORLD_SIZE` > 1 but `accelerator.num_processes` is 1.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and accelerator.num_processes == 1:
        raise ValueError(
            f"{world_size} processes were launched (WORLD_SIZE={world_size}) but accelerate set this one up alone "
            f"(distributed_type {accelerator.distributed_type.value}), so each process would train its own copy on "
            "the whole dataset. On a machine without GPUs set `use_cpu=True` in the GRPOConfig (`--use_cpu` on the "
            "`trl grpo` command line) to train the processes together with gloo (`accelerate launch --cpu` and "
            "`use_cpu: true` in an accelerate config start one process only); with GPUs, check that each process "
            "sees one (CUDA_VISIBLE_DEVICES)."
        )
    fsdp_asked = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if fsdp_asked and accelerator.distributed_type.value == "MULTI_CPU" and accelerator.is_main_process:
        logger.warning(
            "FSDP was asked for (ACCELERATE_USE_FSDP=true) but accelerate does not shard on CPU processes: this run "
            "is DDP, with the whole policy and reference on every process."
        )


def prepare_inference_model(model: nn.Module, accelerator) -> nn.Module:
    """Place a frozen model (reference or reward model) for inference under `accelerator`: no optimizer, no DDP.

    Under DeepSpeed the model becomes an inference engine with the policy's ZeRO settings (see `prepare_deepspeed`);
    under FSDP2 it is sharded with `fully_shard` like the policy (same wrapping policy and mesh), so a reference
    can be synced shard by shard.
    """
    if getattr(accelerator.state, "deepspeed_plugin", None) is not None:
        return prepare_deepspeed(model, accelerator)
    if getattr(accelerator, "is_fsdp2", False):
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model

        return fsdp2_prepare_model(accelerator, model).eval()
    return accelerator.prepare_model(model, evaluation_mode=True)


def prepare_reward_models(reward_funcs: list, accelerator) -> None:
    """Freeze the reward models among `reward_funcs` (eval mode, no gradients) and place each for inference under
    `accelerator` (see `prepare_inference_model`), in place; other reward functions are left as they are."""
    for i, func in enumerate(reward_funcs):
        if isinstance(func, PreTrainedModel):
            func.eval().requires_grad_(False)
            reward_funcs[i] = prepare_inference_model(func, accelerator)


def adapter_parameters(model: nn.Module, adapter: str) -> dict[str, nn.Parameter]:
    """The parameters of PEFT adapter `adapter`, by their full names: those whose name has a component equal to the
    adapter's name (e.g. `...lora_A.default.weight` for `"default"`). Not detached, so ZeRO-3 attributes survive."""
    return {name: p for name, p in model.named_parameters() if adapter in name.split(".")}


@contextmanager
def use_adapter(model: nn.Module, name: str):
    """Run a PEFT model with adapter `name` active (frozen) inside the block; the previous adapter is active and
    trainable again afterwards, and `name` stays frozen."""
    previous = model.active_adapter
    model.set_adapter(name, inference_mode=True)
    try:
        yield model
    finally:
        model.set_adapter(previous)


def _inference_deepspeed_config(config: dict, hidden_size: int | None) -> dict:
    """The policy's DeepSpeed config turned into an inference one: same ZeRO stage and precision, no optimizer.

    Under ZeRO-3 the partitioning (one slice of every parameter per rank) depends only on the parameter sizes and
    the world size, so the reference's partitions line up with the policy's and can be mixed locally. No parameter
    is kept gathered between forwards (`stage3_param_persistence_threshold = 0`) and there is no ZeRO++ secondary
    partition (`zero_hpz_partition_size = 1`), so a sync that writes the partitions is seen by the next forward. ZeRO-1/2 only shard optimizer state and gradients: without an
    optimizer they are plain replicas, so the stage is set to 0.
    """
    config = copy.deepcopy(config)
    for key in ("optimizer", "scheduler"):
        config.pop(key, None)
    zero = config.setdefault("zero_optimization", {})
    stage = zero.get("stage", 0)
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
        zero["zero_hpz_partition_size"] = 1  # no ZeRO++ secondary copies, which a local sync would leave stale
        zero.pop("offload_optimizer", None)
        for key in ("reduce_bucket_size", "stage3_prefetch_bucket_size"):
            if zero.get(key) == "auto":
                zero[key] = int(0.9 * hidden_size * hidden_size) if hidden_size else 5e7
    else:
        config["zero_optimization"] = {"stage": 0}
    # Batch sizes mean nothing without an optimizer, but DeepSpeed checks them: keep them consistent.
    if "auto" in (
        config.get("train_micro_batch_size_per_gpu"),
        config.get("gradient_accumulation_steps"),
        config.get("train_batch_size"),
    ):
        for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
            config.pop(key, None)
        config["train_micro_batch_size_per_gpu"] = 1
    if config.get("gradient_clipping") == "auto":
        config.pop("gradient_clipping")
    return config


def prepare_deepspeed(model: nn.Module, accelerator) -> nn.Module:
    """Wrap a frozen model in a DeepSpeed inference engine with the ZeRO settings of the policy's `accelerator`.

    The engine has no optimizer (the model never trains); under ZeRO-3 its parameters are partitioned exactly like
    the policy's, which is what lets `trl.reference.ref_sync` mix the two shard by shard without communication.

    Args:
        model: the model to wrap (already partitioned by `deepspeed.zero.Init` when loaded under ZeRO-3, or not).
        accelerator: the `accelerate.Accelerator` whose `deepspeed_plugin` configures the policy.

    Returns:
        The `DeepSpeedEngine`, in eval mode.
    """
    import deepspeed

    hidden_size = getattr(getattr(model, "config", None), "hidden_size", None)
    config = _inference_deepspeed_config(accelerator.state.deepspeed_plugin.deepspeed_config, hidden_size)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    engine, *_ = deepspeed.initialize(model=model, config=config)
    engine.eval()  # DeepSpeedEngine.eval() returns None
    return engine
