# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Keeping a CPU reference model's weights out of the process's resident memory between its uses: they live in an
unlinked file, mapped shared, and are read into private copies only while the trainer uses them
(`offload_ref_model=True`)."""

import ctypes
import mmap
import os
import platform
import re
import tempfile
import weakref
from contextlib import contextmanager

import torch
from torch import nn
from transformers.utils import logging

from ..models.cpu_memory import libc


logger = logging.get_logger(__name__)

MADV_DONTNEED = 4  # Linux madvise(2): drop the range's page-table entries; a shared file mapping keeps its data
# file systems whose pages are RAM: a file there saves nothing
_RAM_FILE_SYSTEMS = {"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"}


class OffloadedReference:
    """The parameters of `model` (a frozen reference on the CPU) kept in one file in `directory`, mapped shared, and
    copied into ordinary memory only while the trainer uses them ([`loaded`]).

    Between uses every parameter is a view into a `torch.from_file(..., shared=True)` byte storage (same dtype, shape
    and bits) whose pages are not resident: the data is in the kernel's page cache (written back to the file when
    dirty) or, after the kernel reclaimed it under memory pressure, on the disk. Anything that reads or writes the
    reference then (a user's callback) still sees the right values: the pages fault in again. Inside [`loaded`] the
    parameters are private copies in the process's heap, the memory that the policy's freed gradients and
    activations left there: the reference and the policy's backward take turns in it. The file is unlinked at once:
    the mapping keeps it alive until the process ends, and on a local file system nothing is left after a crash (NFS
    keeps a `.nfs*` file until the mapping goes). A warning says when `directory` is on a RAM file system. Tied
    parameters stay tied (`model.parameters()` yields each once and both modules hold the same `Parameter`).
    Buffers stay where they are. The pages of the views that something reads between uses stay resident until the
    next [`loaded`] drops them.

    Args:
        model: the reference; its parameters must be plain CPU tensors that take no gradient.
        directory: where the file is created (made if missing); a disk, not a RAM file system (`tmpfs`), where the
            pages would still occupy RAM.

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
        for p in self.params:  # each tensor starts on a page: aligned for any dtype and for madvise
            offsets.append(total)
            total += -(-p.numel() * p.element_size() // page) * page
        os.makedirs(directory, exist_ok=True)
        if (kind := file_system_type(directory)) in _RAM_FILE_SYSTEMS:
            logger.warning(
                f"offload_ref_model=True: {directory} is on {kind}, whose pages are RAM; the reference saves no "
                "memory there. Point output_dir at a disk."
            )
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
        self._depth, self._write, self._copies = 0, False, False

    @contextmanager
    def loaded(self, write: bool = False):
        """Inside the block the parameters are private copies in ordinary memory, read from the file with `preadv`
        (no page of the mapping becomes resident); afterwards they are the file's views again and the copies are
        freed. `write=True` writes the copies back into the file at the end (`pwritev`; a sync, a checkpoint's
        restore); without it, changes made inside the block are lost, so pass it for anything that writes. Nested
        blocks join the outermost one (which then writes back if any of them asked to). Pages of the mapping that
        became resident between uses (something read the views) are dropped on entry. If writing back fails, the
        parameters stay the private copies, with their values, and the next block's end writes them again.

        Raises:
            RuntimeError: when a parameter no longer matches its slot in the file (it was replaced, cast or resized
                since the offload).
            OSError: when a read, a write or `madvise` fails.
        """
        self._depth += 1
        try:
            if not self._copies:
                self._check(lambda p, view: p.data.data_ptr() == view.data_ptr())
                _madvise(self.storage, MADV_DONTNEED)
                copies = [
                    _pread(self._fd, torch.empty_like(view), offset) for view, offset in zip(self.views, self.offsets)
                ]
                try:
                    for p, copy in zip(self.params, copies):
                        p.data = copy
                except BaseException:  # interrupted half-way: all back to the file's views
                    for p, view in zip(self.params, self.views):
                        p.data = view
                    raise
                self._copies = True
        except BaseException:
            self._depth -= 1
            raise
        self._write |= write
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._check(lambda p, view: (p.dtype, p.shape, p.device) == (view.dtype, view.shape, view.device))
                if self._write:  # all written before any parameter is pointed back: a failure loses nothing
                    for p, offset in zip(self.params, self.offsets):
                        _pwrite(self._fd, p.data.contiguous(), offset)
                for p, view in zip(self.params, self.views):
                    p.data = view
                self._copies, self._write = False, False

    def _check(self, matches) -> None:
        for i, (p, view) in enumerate(zip(self.params, self.views)):
            if not matches(p, view):
                raise RuntimeError(
                    f"offload_ref_model: reference parameter {i} ({tuple(p.shape)}, {p.dtype}, {p.device}) no longer "
                    f"matches its slot in the offload file ({tuple(view.shape)}, {view.dtype}, cpu); do not replace, "
                    "cast or move the reference's parameters while it is offloaded."
                )


def file_system_type(path: str) -> str | None:
    """The type of the file system that holds `path`: the `/proc/self/mountinfo` entry whose device (`major:minor`) is
    `path`'s, else the one with the longest mount point above it (octal escapes such as `\\040` decoded); `None`
    when the table cannot be read."""
    path, by_device, best, kind = os.path.realpath(path), None, "", None
    try:
        device = os.stat(path).st_dev
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                major, minor = (int(x) for x in fields[2].split(":"))
                mount_point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4])
                fs_type = fields[fields.index("-") + 1]
                if os.makedev(major, minor) == device:
                    by_device = fs_type
                inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, kind = mount_point, fs_type
    except (OSError, ValueError, IndexError):
        return None
    return by_device or kind


def _bytes(tensor: torch.Tensor):
    """A writable buffer over a contiguous tensor's bytes (numpy's, which `os.preadv`/`os.pwritev` take)."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def _pread(fd: int, tensor: torch.Tensor, offset: int) -> torch.Tensor:
    """Fill the contiguous `tensor` with its bytes at `offset` of file `fd`; returns it."""
    return _transfer(os.preadv, fd, tensor, offset)


def _pwrite(fd: int, tensor: torch.Tensor, offset: int) -> None:
    """Write the contiguous `tensor`'s bytes at `offset` of file `fd`."""
    _transfer(os.pwritev, fd, tensor, offset)


def _transfer(io, fd: int, tensor: torch.Tensor, offset: int) -> torch.Tensor:
    """Move all of `tensor`'s bytes with `io` (`os.preadv` or `os.pwritev`) at `offset` of `fd`, however many calls
    that takes; an end of file or a write that stops is an `OSError`."""
    buffer, done = _bytes(tensor), 0
    while done < buffer.nbytes:
        n = io(fd, [buffer[done:]], offset + done)
        if n <= 0:
            raise OSError(
                f"{io.__name__} on the offloaded reference's file stopped {buffer.nbytes - done} bytes short"
            )
        done += n
    return tensor


def _madvise(tensor: torch.Tensor, advice: int) -> None:
    """`madvise(advice)` over the whole pages of `tensor`'s memory (it starts on a page boundary)."""
    madvise = libc().madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if madvise(tensor.data_ptr(), tensor.numel() * tensor.element_size(), advice) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"madvise on the offloaded reference failed: {os.strerror(errno)}")
