# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Keeping a CPU reference model's weights out of the process's resident memory between its uses: they live in a
file-backed shared memory mapping whose pages are dropped after each use (`offload_ref_model=True`)."""

import ctypes
import ctypes.util
import mmap
import os
import platform
import tempfile
import weakref
from contextlib import contextmanager

import torch
from torch import nn


MADV_DONTNEED = 4  # Linux madvise(2): drop the range's page-table entries; a shared file mapping keeps its data


class OffloadedReference:
    """The parameters of `model` (a frozen reference on the CPU) kept in one file in `directory`, mapped shared, and
    copied into ordinary memory only while the trainer uses them ([`loaded`]).

    Between uses every parameter is a view into a `torch.from_file(..., shared=True)` byte storage (same dtype, shape
    and bits) whose pages are not resident: the data is in the kernel's page cache (written back to the file when
    dirty) or, after the kernel reclaimed it under memory pressure, on the disk. Anything that reads or writes the
    reference then (a user's callback) still sees the right values: the pages fault in again. Inside [`loaded`] the
    parameters are private copies in the process's heap, the memory that the policy's freed gradients and
    activations left there: the reference and the policy's backward take turns in it. The file is unlinked at once:
    the mapping keeps it alive until the process ends, and nothing is left on disk after a crash. Tied parameters
    stay tied (`model.parameters()` yields each once and both modules hold the same `Parameter`). Buffers stay where
    they are.

    Args:
        model: the reference; its parameters must be plain CPU tensors that take no gradient.
        directory: where the file is created (made if missing); a disk, not a RAM file system (`tmpfs`), or the pages
            that leave the process still occupy RAM.

    Raises:
        ValueError: when a parameter is not a plain CPU tensor (an accelerator, DeepSpeed ZeRO-3, a DTensor) or
            requires a gradient, or outside Linux (madvise).
    """

    def __init__(self, model: nn.Module, directory: str):
        if platform.system() != "Linux":
            raise ValueError("offload_ref_model=True needs Linux (madvise); set offload_ref_model=False.")
        self.params = list(model.parameters())
        for p in self.params:
            if type(p.data) is not torch.Tensor or p.device.type != "cpu" or hasattr(p, "ds_id"):
                raise ValueError(
                    "offload_ref_model=True offloads a reference held as plain CPU tensors; this one has "
                    f"{type(p.data).__name__} parameters on {p.device} (an accelerator, DeepSpeed ZeRO-3 or FSDP2). "
                    "Set offload_ref_model=False."
                )
            if p.requires_grad:
                raise ValueError("offload_ref_model=True: the reference's parameters must not require gradients.")
        page = mmap.PAGESIZE
        offsets, total = [], 0
        for p in self.params:  # each tensor on its own pages, so that it can be dropped alone
            offsets.append(total)
            total += -(-p.numel() * p.element_size() // page) * page
        os.makedirs(directory, exist_ok=True)
        self._fd, path = tempfile.mkstemp(prefix="reference-offload-", suffix=".bin", dir=directory)
        weakref.finalize(self, os.close, self._fd)
        try:
            os.ftruncate(self._fd, max(total, page))
            self.storage = torch.from_file(path, shared=True, size=max(total, page), dtype=torch.uint8)
        finally:
            os.unlink(path)
        self.offsets, self.views = offsets, []
        for p, offset in zip(self.params, offsets):
            _pwrite(self._fd, p.data.contiguous(), offset)
            view = self.storage[offset : offset + p.numel() * p.element_size()].view(p.dtype).view(p.shape)
            p.data = view
            self.views.append(view)
        self.nbytes = total
        self._depth, self._write = 0, False

    @contextmanager
    def loaded(self, write: bool = False):
        """Inside the block the parameters are private copies in ordinary memory, read from the file with `preadv`
        (no page of the mapping becomes resident); afterwards they are the file's views again. `write=True` writes
        the copies back into the file at the end (`pwritev`; a sync, a checkpoint's restore); without it, changes
        made inside the block are lost, so pass it for anything that writes. Nested blocks join the outermost one
        (which then writes back if any of them asked to). Pages of the mapping that became resident between uses
        are dropped on entry.

        Raises:
            OSError: when a read, a write or `madvise` fails.
        """
        self._write |= write
        self._depth += 1
        if self._depth == 1:
            _madvise(self.storage, MADV_DONTNEED)
            for p, offset in zip(self.params, self.offsets):
                p.data = _pread(self._fd, torch.empty_like(p.data), offset)
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                for p, view, offset in zip(self.params, self.views, self.offsets):
                    if self._write:
                        _pwrite(self._fd, p.data, offset)
                    p.data = view
                self._write = False


def _bytes(tensor: torch.Tensor):
    """A writable buffer over a contiguous tensor's bytes (numpy's, which `os.preadv`/`os.pwritev` take)."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def _pread(fd: int, tensor: torch.Tensor, offset: int) -> torch.Tensor:
    """Fill the contiguous `tensor` with its bytes at `offset` of file `fd`; returns it."""
    buffer, done = _bytes(tensor), 0
    while done < buffer.nbytes:
        n = os.preadv(fd, [buffer[done:]], offset + done)
        if n <= 0:
            raise OSError(f"the offloaded reference's file ended {buffer.nbytes - done} bytes early")
        done += n
    return tensor


def _pwrite(fd: int, tensor: torch.Tensor, offset: int) -> None:
    """Write the contiguous `tensor`'s bytes at `offset` of file `fd`."""
    buffer, done = _bytes(tensor), 0
    while done < buffer.nbytes:
        done += os.pwritev(fd, [buffer[done:]], offset + done)


def _madvise(tensor: torch.Tensor, advice: int) -> None:
    """`madvise(advice)` over the whole pages of `tensor`'s memory (it starts on a page boundary)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.madvise(tensor.data_ptr(), tensor.numel() * tensor.element_size(), advice) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"madvise on the offloaded reference failed: {os.strerror(errno)}")
