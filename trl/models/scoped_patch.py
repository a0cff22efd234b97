# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Replacing a library function only while a block that needs it is open, and putting back exactly the object found
on entry (another library's patch included), for the speed-ups that work through a library's own switch."""

import contextvars
import threading
from collections.abc import Callable
from contextlib import contextmanager


class ScopedPatch:
    """`owner.<name>` replaced by `replacement` while any `block()` is open, in any thread.

    The outermost block records the object installed on entry (`entry`) and installs `replacement`; the last block to
    close puts that same object back, unless someone else replaced the attribute meanwhile (then theirs stays).
    `active()` says whether the calling context is inside a block: the replacement serves its own threads and hands
    every other call to `entry`, which is kept after the blocks close, so that a reference to the replacement taken
    while a block was open (or a call racing the close in another thread) still reaches it. An owner without the
    attribute is left alone (the blocks then change nothing, and `entry` stays `None`).

    Args:
        owner (`Callable[[], object]`): returns the module or object that holds the function (called when the
            outermost block opens, so that the owner's import can wait until then).
        name (`str`): the attribute replaced.
        replacement (`Callable`): what is installed while a block is open.
    """

    def __init__(self, owner: Callable[[], object], name: str, replacement: Callable):
        self.owner, self.name, self.replacement = owner, name, replacement
        self.entry = None  # the object installed when the last outermost block opened
        self._blocks = 0
        self._lock = threading.Lock()
        self._inside = contextvars.ContextVar(f"{name}_patched", default=False)

    def active(self) -> bool:
        """Whether the calling context (thread or task) is inside a block."""
        return self._inside.get()

    @contextmanager
    def block(self):
        with self._lock:
            if not self._blocks:
                owner = self.owner()
                self.entry = getattr(owner, self.name, None)
                if self.entry is not None:
                    setattr(owner, self.name, self.replacement)
            self._blocks += 1
        token = self._inside.set(True)
        try:
            yield
        finally:
            self._inside.reset(token)
            with self._lock:
                self._blocks -= 1
                owner = self.owner()
                if not self._blocks and self.entry is not None and getattr(owner, self.name, None) is self.replacement:
                    setattr(owner, self.name, self.entry)
