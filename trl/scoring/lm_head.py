# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The LM head's side of scoring: a tied input embedding's row gradient (`sparse_tied_embedding_grad`), the float32
head (`cast_lm_head_to_fp32`), the head's input captured instead of its logits (`head_input_captured`) and when that
applies (`chunked_logprobs_blocker`), and a pass's log-probs read from its logits or that input (`LogprobReader`)."""

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from accelerate.utils import extract_model_from_parallel
from torch import nn

from ..reference.layouts import PLAIN, tensor_layout
from ..trainer.grpo_losses import selective_log_softmax
from .chunked_logprobs import head_logprobs
from .prefix_sharing import text_config
from .weight_grads import TiedGradSink, tied_lookups


def tied_input_embedding(model: nn.Module) -> nn.Embedding | None:
    """`model`'s input embedding when its weight is also the LM head's, trains, and is a plain (unsharded) tensor:
    the case where `sparse_tied_embedding_grad` applies; else `None`."""
    model = extract_model_from_parallel(model)  # DDP and similar wrappers; a PEFT model forwards these getters
    get_input, get_output = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    if get_input is None or get_output is None:
        return None
    embedding, head = get_input(), get_output()
    if not isinstance(embedding, nn.Embedding) or embedding.sparse or embedding.max_norm is not None:
        return None
    if embedding.scale_grad_by_freq or "forward" in vars(embedding):
        return None
    weight = embedding.weight
    if getattr(head, "weight", None) is not weight or not weight.requires_grad or tensor_layout(weight) != PLAIN:
        return None
    return embedding


@contextmanager
def sparse_tied_embedding_grad(model: nn.Module, sink_of=lambda: None):
    """Forward passes inside this block give a tied input embedding (`tied_input_embedding`) a gradient of its
    looked-up rows only; yields the embedding, or `None` (a no-op) where it does not apply.

    The input embedding's dense backward writes a `(V, H)` zero tensor with the rows of the looked-up tokens added
    in, once per forward pass, and autograd then adds each of those to the LM head's dense `(V, H)` gradient of the
    same weight: ~113 MB written and read twice per pass for SmolLM2-135M's 49,152 × 576 float32 embedding. Here the
    embedding looks up through `weight_grads.tied_lookups`: with a `TiedGradSink` from `sink_of()` (the block-wise
    LM head of `chunked_logprobs` takes part), its rows are added in place into the head's gradient before autograd
    gets the sum; without one, it returns them as a sparse tensor, which autograd adds into the head's dense
    gradient. An embedding subclass with a forward of its own (Gemma's scaled embedding) keeps that forward and gets
    `nn.Embedding`'s sparse gradient instead (for a float32 weight only: its rows' repeats are summed in the weight's
    dtype). Either way the weight's gradient is dense (what the optimizer and
    gradient clipping read) and equals the plain one up to the order of float additions. The forward (or the flag)
    is restored when the block ends. Nothing changes for an untied or frozen embedding, a sharded weight, an
    embedding with `max_norm` or `scale_grad_by_freq`, or without gradients.
    """
    embedding = tied_input_embedding(model) if torch.is_grad_enabled() else None
    if embedding is None:
        yield None
        return
    if type(embedding).forward is not nn.Embedding.forward:
        # A subclass with its own forward (Gemma's scaled embedding) gets nn.Embedding's sparse gradient inside that
        # forward. Its rows' repeats are summed in the weight's dtype: for a bf16 weight the dense gradient is more
        # accurate (2.29e-2 against 2.43e-2 relative error to float64 measured on a tiny Gemma 2), so it runs there.
        if embedding.weight.dtype != torch.float32:
            yield None
            return
        embedding.sparse = True
        try:
            yield embedding
        finally:
            embedding.sparse = False
        return
    with tied_lookups(embedding, sink_of):
        yield embedding


def cast_lm_head_to_fp32(model: nn.Module) -> None:
    """Keep the LM head's weights in float32 and compute the logits in float32 (ScaleRL, arXiv 2510.13786), in place.

    The hidden states are cast to float32 before the projection, with autocast off, so mixed precision does not
    round the logits back. With tied embeddings the shared weight becomes float32 too, and the embedding output is
    cast back to the model's dtype so the rest of the network is unchanged.

    Raises:
        ValueError: if the LM head carries a PEFT adapter.
    """
    head = model.get_output_embeddings()
    if hasattr(head, "base_layer"):  # a PEFT tuner layer
        raise ValueError(
            "Applying a PEFT adapter to `lm_head` is not supported with cast_lm_head_to_fp32=True: remove 'lm_head' "
            "from the adapter's target_modules, or set cast_lm_head_to_fp32=False."
        )
    dtype = head.weight.dtype
    head.float()

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        with torch.autocast(hidden_states.device.type, enabled=False):
            return nn.functional.linear(hidden_states.float(), head.weight, head.bias)

    head.forward = forward
    head.float32_head = True  # what `chunked_logprobs.head_logprobs` must compute the same way
    embedding = model.get_input_embeddings()
    if embedding.weight is head.weight and dtype != torch.float32:
        embedding.register_forward_hook(lambda module, args, output: output.to(dtype))


# Text-config fields of models whose causal-LM forward changes the LM head's output before returning it (softcapping:
# Gemma 2/3, RecurrentGemma, xLSTM; a scale: Cohere, Falcon-H1, Granite, MiniCPM3, HyperCLOVA X; a vocabulary cut to
# `unpadded_vocab_size`), and model types that mask some logits (Chameleon's image tokens): `chunked_logprobs` runs
# plain for them.
_LOGIT_TRANSFORM_FIELDS = (
    "final_logit_softcapping",
    "logits_soft_cap",
    "output_logit_soft_cap",
    "logit_scale",
    "output_multiplier",
    "lm_head_multiplier",
    "logits_scaling",
    "unpadded_vocab_size",
)
_LOGIT_MASKING_MODEL_TYPES = ("chameleon",)


def chunked_logprobs_blocker(model: nn.Module) -> str | None:
    """Why `score_completions(..., chunked_logprobs=True)` computes `model`'s log-probs from its logits after all, or
    `None`: an LM head that is not a plain `nn.Linear` (a subclass with its own forward such as a quantised layer, a
    PEFT adapter on it, an accelerate offload hook, a forward replaced by anyone but `cast_lm_head_to_fp32`), a
    sharded head weight (ZeRO-3, FSDP2), an FSDP1 or static-graph DDP wrapper (their backward hooks hang on the
    model's outputs, which the loss does not read on this path), or a model that transforms the logits after the
    head (`_LOGIT_TRANSFORM_FIELDS` set to anything but `None` or 1, `_LOGIT_MASKING_MODEL_TYPES`)."""
    if type(model).__name__ == "FullyShardedDataParallel" or getattr(model, "static_graph", False):
        static = " with static_graph=True" if getattr(model, "static_graph", False) else ""
        return f"a {type(model).__name__} wrapper{static}"
    unwrapped = extract_model_from_parallel(model)
    head = unwrapped.get_output_embeddings() if hasattr(unwrapped, "get_output_embeddings") else None
    own_forward = head is not None and "forward" in vars(head) and not getattr(head, "float32_head", False)
    if not isinstance(head, nn.Linear) or hasattr(head, "base_layer"):  # PEFT tuner layers are not nn.Linear
        return f"an LM head of type {type(head).__name__}"
    if type(head).forward is not nn.Linear.forward or own_forward or hasattr(head, "_hf_hook"):
        return f"an LM head of type {type(head).__name__} with a forward of its own"
    if tensor_layout(head.weight) != PLAIN:
        return "a sharded LM head weight"
    config = text_config(unwrapped)
    if getattr(config, "model_type", None) in _LOGIT_MASKING_MODEL_TYPES:
        return f"model type {config.model_type!r} (it masks logits after the head)"
    for name in _LOGIT_TRANSFORM_FIELDS:
        if getattr(config, name, None) not in (None, 1, 1.0):
            return f"{name}={getattr(config, name)!r} in the model config"
    return None


@contextmanager
def head_input_captured(model: nn.Module):
    """Inside this block `model`'s LM head records its input and the dtype its product would have run in (autocast's
    when autocast is on around the head, as inside an accelerate-prepared forward; float32 for a head kept in float32
    by `cast_lm_head_to_fp32`; else the weight's), as `((rows, kept positions, H), dtype)` appended to the yielded
    list, and returns a `(rows, 0, V)` tensor instead of logits: no logits are computed, and the weight stays in the
    forward's graph (DDP's unused-parameter search still finds it). Its forward is restored when the block ends."""
    head = extract_model_from_parallel(model).get_output_embeddings()
    captured = []
    own_forward = head.__dict__.get("forward")  # an instance forward (`cast_lm_head_to_fp32`'s), put back after

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        device_type = hidden_states.device.type
        if getattr(head, "float32_head", False):
            dtype = torch.float32
        elif torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
        else:
            dtype = head.weight.dtype
        captured.append((hidden_states, dtype))
        return hidden_states[..., :0, :1] * head.weight[:, 0]  # (rows, 0, V), nothing cast or multiplied

    head.forward = forward
    try:
        yield captured
    finally:
        if own_forward is None:
            del head.forward
        else:
            head.forward = own_forward


@dataclass
class LogprobReader:
    """How a scoring pass's log-probs and entropies are read from its outputs: from the logits the model returned
    (`head` `None`), or with `chunked_logprobs` from the LM head's input that `head_input_captured` recorded into
    `captured` (`chunked_logprobs.head_logprobs`, a block of positions at a time; `head` is the model's LM head).
    `sink` is the current pass's `TiedGradSink` (the tied weight's gradient, summed in place with the lookups'), or
    `None`; `one_forward`: the call makes one forward before the backward (a kept head block)."""

    model_name: str
    temperature: float
    compute_entropy: bool
    entropy_grad: bool
    head: nn.Linear | None
    one_forward: bool
    captured: list | None = None
    sink: TiedGradSink | None = None

    def __call__(self, outputs, targets: torch.Tensor, source=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(log-probs, entropies or None)` of `targets` `(rows, W)` from a pass that kept W + 1 positions, or with
        `source` `(M,)`, of `targets` `(1, M)` predicted by those flat positions of a packed pass."""
        if self.head is None:
            logits = _kept(outputs.logits, source)  # divided by the temperature in float32, as on every path
            out = selective_log_softmax(
                logits, targets, 2**28, self.compute_entropy, self.entropy_grad, temperature=self.temperature
            )
            return out if self.compute_entropy else (out, None)
        if not self.captured:  # the head's input at the W + 1 kept positions; the last one predicts nothing
            raise RuntimeError(
                f"{self.model_name} did not call its LM head in the forward pass; set `chunked_logprobs=False`."
            )
        hidden, head_dtype = self.captured[-1]  # the pass's last head call (a prompt pass may have made one too)
        self.captured.clear()
        logp, entropy = head_logprobs(
            _kept(hidden, source),
            self.head.weight,
            self.head.bias,
            targets,
            self.temperature,
            self.compute_entropy,
            head_dtype,
            grad_sink=self.sink,
            keep_block=self.one_forward,
        )
        return logp, (entropy if self.entropy_grad else entropy.detach()) if self.compute_entropy else None


def _kept(x: torch.Tensor, source: torch.Tensor | None) -> torch.Tensor:
    """The positions of `x` `(rows, W + 1, D)` or of a packed pass's `(R, W, D)` that predict the targets: `(rows, W,
    D)`, all but the last; with `source` `(M,)`, those flat positions `(1, M, D)`."""
    return x[:, :-1, :] if source is None else x.reshape(-1, x.size(-1)).index_select(0, source)[None]
