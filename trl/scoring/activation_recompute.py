# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Element-wise activations recomputed in the backward instead of kept from the forward.

A decoder layer of a Llama-style model keeps, for every token, its RMSNorms' normalised inputs and outputs and its
SwiGLU MLP's `act(gate)` and `act(gate) * up` for the backward, besides the matrix products' outputs. On SmolLM2-135M
these are 5,376 of the 11,712 float32 numbers a layer saves per token. They cost a few element-wise operations to
rebuild from what is kept anyway (the norm's input; the gate and up projections), where the matrix products cannot be
rebuilt cheaply. Inside `recomputed_activations(model)`, for the modules of `model` only:

- an RMSNorm module (a class whose name ends in `RMSNorm`, without submodules, whose tensors are its own registered
  parameters) saves only its input and parameters; its backward reruns its forward on them and differentiates that
  (`_Recomputed`);
- a SwiGLU MLP (a forward that is exactly `return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))`,
  as in Llama, Mistral, Qwen2/3; an `act_fn` without parameters) saves the gate and up projections only, and
  `act_fn(gate) * up` the same way;
- the outputs of both, which the next projections save as their input, are replaced in the saved tensors by a recipe
  (`torch.autograd.graph.saved_tensors_hooks`) and rebuilt from those inputs when the backward unpacks them.

Every value the backward reads is recomputed by the same operations on the same inputs, so the forward (and the
loss) is bitwise that of the plain pass; the gradients equal it to float rounding, because autograd then adds the
contributions of a norm's output to its input's gradient in another order (tested on a tiny Llama and on SmolLM2).
The cost is the element-wise operations once more. While saved-tensor hooks are active, autograd does not check
saved tensors for in-place changes itself, so the hooks do: a tensor the backward reads that changed in place after
the forward is a `RuntimeError`, as in a plain pass. A second-order backward (`create_graph=True`) is refused.
"""

import ast
import contextvars
import functools
import inspect
import textwrap
import threading
import types
import weakref
from contextlib import contextmanager

import torch
from torch import nn

from ..reference.layouts import PLAIN, parameter_layouts


# The recipes of the pass under way in this context (None outside `recomputed_activations`).
_RECIPES = contextvars.ContextVar("recomputed_activations", default=None)
_SWIGLU = "self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))"
# class → the wrapper of its own `forward` (None: not an RMSNorm or SwiGLU MLP class); the classes stay untouched
_WRAPPERS: "weakref.WeakKeyDictionary[type, object]" = weakref.WeakKeyDictionary()
# module → [open `recomputed_activations` blocks over it, all threads together; the bound wrapper set on it]
_SCOPED: dict[nn.Module, list] = {}
_SCOPE_LOCK = threading.Lock()
_FIELD = "set `recompute_elementwise_activations=False`"


def _no_second_order() -> None:
    if torch.is_grad_enabled():
        raise RuntimeError(f"Recomputed activations have no second-order gradients; {_FIELD} to differentiate twice.")


def _check_versions(tensors, versions) -> None:
    if any(t._version != v for t, v in zip(tensors, versions)):
        raise RuntimeError(
            "A tensor that the backward reads (kept for it, or one a recomputed activation is rebuilt from) was "
            f"modified in place after the forward, so its gradient would be wrong; do not modify it, or {_FIELD}."
        )


@contextmanager
def _parameters_swapped(module: nn.Module, tensors: dict[str, torch.Tensor]):
    """`module` reads `tensors` in place of its own parameters of those names inside the block."""
    if not tensors:
        yield
        return
    own = {name: module._parameters[name] for name in tensors}
    module._parameters.update(tensors)
    try:
        yield
    finally:
        module._parameters.update(own)


class _Recomputed(torch.autograd.Function):
    """`forward(module, *inputs)` (the original forward of an RMSNorm module or `_act_mul`), saving only `inputs` and
    the module's parameters `names` (passed after the inputs so that they get their gradients); the backward reruns
    it on detached copies of them, with gradients, and differentiates it."""

    @staticmethod
    def forward(ctx, forward, module, names, n_inputs, *tensors):
        ctx.forward, ctx.module, ctx.names, ctx.n_inputs = forward, module, names, n_inputs
        ctx.save_for_backward(*tensors)
        return forward(module, *tensors[:n_inputs])

    @staticmethod
    def backward(ctx, grad):
        _no_second_order()
        needs = ctx.needs_input_grad[4:]
        tensors = [t.detach().requires_grad_(need) for t, need in zip(ctx.saved_tensors, needs)]
        # detached copies: the parameters' own hooks see their gradient once, when autograd hands it on
        with torch.enable_grad(), _parameters_swapped(ctx.module, dict(zip(ctx.names, tensors[ctx.n_inputs :]))):
            token = _RECIPES.set(None)  # the rerun is the plain forward, also inside a block
            try:
                out = ctx.forward(ctx.module, *tensors[: ctx.n_inputs])
            finally:
                _RECIPES.reset(token)
        wrt = [t for t, need in zip(tensors, needs) if need]
        grads = iter(torch.autograd.grad(out, wrt, grad, allow_unused=True) if wrt else ())
        return (None, None, None, None, *(next(grads) if need else None for need in needs))


class _Recipe:
    """A saved tensor left out of the graph: `forward(module, *inputs)` rebuilds the tensor it is a view of (from
    inputs and parameters unchanged since it was made), the view is reapplied."""

    __slots__ = ("forward", "module", "inputs", "read", "versions", "geometry")

    def __init__(self, forward, module, inputs, read, versions, geometry):
        self.forward, self.module, self.inputs, self.geometry = forward, module, inputs, geometry
        self.read, self.versions = read, versions

    def __call__(self) -> torch.Tensor:
        _no_second_order()
        _check_versions(self.read, self.versions)
        token = _RECIPES.set(None)
        try:
            with torch.no_grad():
                base = self.forward(self.module, *self.inputs)
        finally:
            _RECIPES.reset(token)
        return base.as_strided(*self.geometry)


class _Kept:
    """A saved tensor kept as is, with its version when saved (autograd's own check is off under the hooks)."""

    __slots__ = ("tensor", "version")

    def __init__(self, tensor):
        self.tensor, self.version = tensor, tensor._version

    def __call__(self) -> torch.Tensor:
        _check_versions((self.tensor,), (self.version,))
        return self.tensor


def _plain(t: torch.Tensor) -> bool:
    return type(t) in (torch.Tensor, nn.Parameter) and t.layout == torch.strided


class _Recipes:
    """The recomputable tensors of one pass: storage address → (the tensor, alive while its storage is, how to rebuild
    it, the tensors that reads and their versions when it was made)."""

    def __init__(self):
        self.by_storage: dict[int, tuple] = {}

    def add(self, out: torch.Tensor, forward, module, inputs, read) -> None:
        # only a tensor that owns its whole storage from offset 0: any view of it is then its storage's geometry
        if not _plain(out) or not out.is_contiguous() or out.storage_offset():
            return
        if out.untyped_storage().nbytes() != out.nbytes:
            return
        versions = tuple(t._version for t in read)
        entry = (weakref.ref(out), out._version, forward, module, tuple(inputs), tuple(read), versions)
        self.by_storage[out.untyped_storage().data_ptr()] = entry

    def pack(self, t: torch.Tensor):
        if not _plain(t):
            return t  # e.g. a wrapper subclass without a storage of its own: autograd's own rules apply
        entry = self.by_storage.get(t.untyped_storage().data_ptr())
        if entry is not None:
            ref, version, forward, module, inputs, read, versions = entry
            base = ref()
            # not freed and reused, not changed since
            if base is not None and base.dtype == t.dtype and t._version == version:
                return _Recipe(forward, module, inputs, read, versions, (t.size(), t.stride(), t.storage_offset()))
        return _Kept(t)

    @staticmethod
    def unpack(packed):
        return packed() if isinstance(packed, (_Recipe, _Kept)) else packed


def _records(first: torch.Tensor, *others: torch.Tensor) -> bool:
    """Whether autograd records an operation on these tensors here, outside autocast (whose casts the backward's
    rerun would not repeat; a wrapper then calls the original forward)."""
    if not torch.is_grad_enabled() or torch.is_autocast_enabled(first.device.type):
        return False
    return first.requires_grad or any(t.requires_grad for t in others)


def _own_tensors_only(module: nn.Module) -> bool:
    """No submodules, and every tensor it holds is one of its registered parameters or buffers (not, e.g., FSDP's
    views of a flat parameter, or a parametrization's computed weight)."""
    if next(module.children(), None) is not None:
        return False
    return not any(isinstance(value, torch.Tensor) for value in vars(module).values())


def _norm_forward(original):
    @functools.wraps(original)
    def forward(self, hidden_states, *args, **kwargs):
        recipes = _RECIPES.get()
        if recipes is None or args or kwargs or not _own_tensors_only(self):
            return original(self, hidden_states, *args, **kwargs)
        names, params = zip(*self._parameters.items()) if self._parameters else ((), ())
        if not _records(hidden_states, *params) or not all(_plain(p) for p in (hidden_states, *params)):
            return original(self, hidden_states)
        out = _Recomputed.apply(original, self, names, 1, hidden_states, *params)
        recipes.add(out, original, self, (hidden_states,), (hidden_states, *params))
        return out

    return forward


def _act_mul(act_fn, gate, up):
    return act_fn(gate) * up


def _swiglu_forward(original):
    @functools.wraps(original)
    def forward(self, x):
        recipes = _RECIPES.get()
        act_fn = self.act_fn
        stateless = not isinstance(act_fn, nn.Module) or next(act_fn.parameters(), None) is None
        if recipes is None or not stateless or not _records(x, *self.parameters()):
            return original(self, x)
        gate, up = self.gate_proj(x), self.up_proj(x)
        if not _records(gate, up) or not (_plain(gate) and _plain(up)):
            return self.down_proj(_act_mul(act_fn, gate, up))
        hidden = _Recomputed.apply(_act_mul, act_fn, (), 2, gate, up)
        recipes.add(hidden, _act_mul, act_fn, (gate, up), (gate, up))
        return self.down_proj(hidden)

    return forward


def _is_swiglu(function) -> bool:
    """Whether `function`'s body is `return <_SWIGLU>` or `y = <_SWIGLU>; return y` (a docstring aside): nothing
    else that the wrapper would skip (a dropout, a cast)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return False
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.FunctionDef) else []
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    pattern = ast.dump(ast.parse(_SWIGLU, mode="eval").body)
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        return ast.dump(body[0].value) == pattern
    if len(body) == 2 and isinstance(body[0], ast.Assign) and isinstance(body[1], ast.Return):
        (target,), result = body[0].targets, body[1].value
        same_name = isinstance(target, ast.Name) and isinstance(result, ast.Name) and target.id == result.id
        return same_name and ast.dump(body[0].value) == pattern
    return False


def _wrapper(cls: type):
    """The wrapper of the forward that `cls` defines itself, when it is an RMSNorm or SwiGLU MLP class, else None;
    made once per class, never installed on the class."""
    if cls not in _WRAPPERS:
        forward, wrapper = cls.__dict__.get("forward"), None
        if forward is not None and cls.__name__.endswith("RMSNorm"):
            wrapper = _norm_forward(forward)
        elif forward is not None and _is_swiglu(forward):
            wrapper = _swiglu_forward(forward)
        _WRAPPERS[cls] = wrapper
    return _WRAPPERS[cls]


def recompute_activations_applies(model: nn.Module) -> bool:
    """Whether `recomputed_activations(model)` changes a pass of `model`: its parameters are plain tensors (a ZeRO-3,
    FSDP or FSDP2 shard would have to be gathered again in the backward; a tensor subclass may have no storage) and
    it has an RMSNorm or SwiGLU MLP module. Changes nothing."""
    if parameter_layouts(model) - {PLAIN} or not all(_plain(p) for p in model.parameters()):
        return False
    if any(type(m).__name__ == "FullyShardedDataParallel" for m in model.modules()):
        return False
    return any(_wrapper(type(m)) is not None for m in model.modules())


@contextmanager
def recomputed_activations(model: nn.Module):
    """Inside the block (in this thread), the RMSNorms and SwiGLU MLPs of `model` (one that
    `recompute_activations_applies` accepted) keep only their inputs for the backward, as the module docstring says.
    Each such module gets the wrapper as its own `forward` attribute while a block over it is open (the last to close
    deletes it); its class, and every module outside `model` (a reward model, another copy), are untouched, and a
    module that already has a `forward` attribute of someone else's (an offload hook's) is left as it is. Outside
    the block's thread and for a module the module docstring excludes, the wrapper calls the class's forward.
    Gradient checkpointing that reruns a layer outside the block would see other saved tensors: the caller leaves it
    out then (`grouped_kv_attention.recomputes_in_backward`)."""
    scoped = []
    with _SCOPE_LOCK:
        for module in model.modules():
            wrapper = _wrapper(type(module))
            if wrapper is None:
                continue
            entry = _SCOPED.get(module)
            if entry is None:
                if "forward" in vars(module):
                    continue
                entry = _SCOPED[module] = [0, types.MethodType(wrapper, module)]
                module.forward = entry[1]
            entry[0] += 1
            scoped.append(module)
    recipes = _Recipes()
    token = _RECIPES.set(recipes)
    try:
        with torch.autograd.graph.saved_tensors_hooks(recipes.pack, recipes.unpack):
            yield
    finally:
        _RECIPES.reset(token)
        recipes.by_storage.clear()
        with _SCOPE_LOCK:
            for module in scoped:
                entry = _SCOPED[module]
                entry[0] -= 1
                if not entry[0]:
                    del _SCOPED[module]
                    if vars(module).get("forward") is entry[1]:
                        del vars(module)["forward"]
