# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The vLLM side of the server's weight transfer: a worker extension (`--worker-extension-cls
trl.generation.vllm_worker_ext.WeightReceiver`) whose methods the trainer calls through vLLM's dev-mode
`/collective_rpc` endpoint (`VLLM_SERVER_DEV_MODE=1`), every argument a string.

The transfer group holds the trainer (rank 0, the root of every broadcast) and each vLLM worker (rank 1 + the
worker's rank, so `world_size = 1 + tensor_parallel_size`). Its TCPStore is served by the worker of rank 0 on the
server's host at `group_port`; the trainer connects to it. The group is gloo when the worker's device is the CPU
and NCCL when it is a CUDA device (the NCCL path is not tested here: this machine has no GPU).

Every worker receives every full (unsharded) tensor, announced by a small header broadcast before it, and hands the lot to vLLM's public
`reload_weights(weights_iterator=...)` in one call, so that vLLM's loaders shard them and fused modules (q/k/v,
gate/up) receive all their parts together.
"""

import json
from collections.abc import Iterable
from datetime import timedelta

import torch
import torch.distributed as dist


class WeightReceiver:
    """Mixed into each vLLM worker (which provides `self.device`, `self.rank`, `self.get_model` and
    `self.reload_weights`)."""

    _weight_group = None
    _weight_group_device = None
    _weight_store = None

    def weight_transfer_backend(self) -> str:
        """`"nccl"` when this worker runs on a CUDA device, else `"gloo"`: the backend the trainer must open."""
        return "nccl" if torch.device(self.device).type == "cuda" else "gloo"

    def init_weight_group(self, host: str, port: str, world_size: str, timeout: str = "240") -> str:
        """Join the transfer group as rank `1 + self.rank`. The worker of rank 0 serves the TCPStore on `port`
        (listening on every interface; `host` is the address the trainer uses for it). Returns `"rank R of W (backend)"`.
        Raises ValueError when `world_size` is not 1 + the number of workers reached (a data-parallel server)."""
        self.close_weight_group()
        world, rank = int(world_size), 1 + int(self.rank)
        if rank >= world:
            raise ValueError(f"worker rank {rank} does not fit a transfer group of {world} (1 trainer + workers)")
        wait = timedelta(seconds=float(timeout))
        store = dist.TCPStore(host, int(port), world, is_master=(rank == 1), timeout=wait, wait_for_workers=False)
        device = torch.device(self.device)
        self._weight_store = store  # the rank-1 worker serves it: keep it alive with the group
        if device.type == "cuda":
            # Untested here (no GPU): a plain NCCL process group over the same store, bound to this worker's device.
            options = dist.ProcessGroupNCCL.Options()
            self._weight_group = dist.ProcessGroupNCCL(store, rank, world, options)
        else:
            self._weight_group = dist.ProcessGroupGloo(store, rank, world, wait)
        self._weight_group_device = device
        return f"rank {rank} of {world} ({self.weight_transfer_backend()})"

    def _receive(self, shape, dtype) -> torch.Tensor:
        tensor = torch.empty(shape, dtype=dtype, device=self._weight_group_device)
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self._weight_group.broadcast([tensor], options).wait()
        return tensor

    def received_weights(self):
        """Yield `(name, tensor)` as rank 0 broadcasts them: per tensor, an int64 header length, the header (UTF-8
        JSON `[name, shape, dtype]`, dtype named as in `torch.float32` without the prefix), then the tensor. A
        length of 0 ends the stream; -1 (the trainer failed while iterating its weights) raises RuntimeError."""
        while True:
            length = int(self._receive((1,), torch.int64).item())
            if length == 0:
                return
            if length < 0:
                raise RuntimeError("the trainer aborted the weight push")
            name, shape, dtype = json.loads(bytes(self._receive((length,), torch.uint8).cpu().tolist()).decode())
            yield name, self._receive(shape, getattr(torch, dtype))

    def receive_weights(self) -> str:
        """Load the streamed weights (`received_weights`) with one `reload_weights(weights_iterator=...)` call.
        Returns `"loaded N"`. Raises RuntimeError without a group."""
        if self._weight_group is None:
            raise RuntimeError("no weight-transfer group: call init_weight_group first")
        stream = self.received_weights()
        count = 0

        def counted():
            nonlocal count
            for item in stream:
                count += 1
                yield item

        self.reload_checkpoint_weights(counted())
        left = sum(1 for _ in stream)  # keeps the group in step if vLLM stopped early
        if left:
            raise RuntimeError(f"vLLM's reload_weights left {left} of {count + left} tensors unread")
        return f"loaded {count}"

    def reload_checkpoint_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """`self.reload_weights(weights_iterator=weights)`, then tie again the parameters that were tied before and
        that the reload untied; returns the number of tensors read.

        vLLM 0.32's layer-wise reload gives a layer that received no weight its previous tensors back; a tied
        `lm_head` (whose checkpoint entry vLLM skips) thus keeps the old embedding matrix while `embed_tokens` gets
        the new one (on the CPU, its GEMM kernel packed from the old one stays, even when the parameter is shared).
        Each tied parameter that was not pushed is pointed again at the tied copy that was (the member whose name
        was among the pushed names), and its module's `quant_method.process_weights_after_loading` runs again. A tied
        group none of whose names was pushed (while others were) raises RuntimeError.
        An in-process engine can call this method through `collective_rpc` too."""
        model = self.get_model()
        groups = {}
        for module_name, module in model.named_modules(remove_duplicate=False):
            for attr, parameter in module.named_parameters(recurse=False):
                name = f"{module_name}.{attr}" if module_name else attr
                groups.setdefault(id(parameter), []).append((name, module, attr))
        tied = [members for members in groups.values() if len(members) > 1]
        pushed = set()

        def recorded():
            for name, tensor in weights:
                pushed.add(name)
                yield name, tensor

        self.reload_weights(weights_iterator=recorded())
        for members in tied:
            current = [getattr(module, attr) for _, module, attr in members]
            loaded = [parameter for (name, _, _), parameter in zip(members, current) if name in pushed]
            if not loaded and pushed:  # e.g. a model whose vLLM names differ from its checkpoint's
                names = ", ".join(name for name, _, _ in members)
                raise RuntimeError(
                    f"vLLM's tied parameters {names} got no pushed tensor under any of these names: they may now hold "
                    "different weights, so the engine cannot be trusted (restart it)."
                )
            if not loaded:
                continue
            for name, module, attr in members:
                if name in pushed:
                    continue
                setattr(module, attr, loaded[0])
                # Kernels prepared from the old tensor (the CPU build's packed GEMM of `lm_head`) are rebuilt.
                method = getattr(module, "quant_method", None)
                if method is not None and hasattr(method, "process_weights_after_loading"):
                    method.process_weights_after_loading(module)
        return len(pushed)

    def close_weight_group(self) -> str:
        """Drop the transfer group (the trainer closes its side). Returns `"closed"`."""
        self._weight_group = self._weight_group_device = self._weight_store = None
        return "closed"


# What vLLM's `worker_extension_cls` names: the colocated engine's and `trl vllm-serve`'s workers load pushes with it.
WORKER_EXTENSION = f"{WeightReceiver.__module__}.{WeightReceiver.__qualname__}"
