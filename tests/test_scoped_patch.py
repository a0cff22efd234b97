# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""trl/models/scoped_patch.py: a function replaced only while a block is open, and the very object found on entry put
back, across nested blocks and threads."""

import threading
import types

from trl.models.scoped_patch import ScopedPatch


def original(x):
    return ("original", x)


def make(owner):
    def replacement(x):
        return ("inside", x) if patch.active() else patch.entry(x)

    patch = ScopedPatch(lambda: owner, "function", replacement)
    return patch, replacement


def test_installed_inside_and_the_entry_object_put_back():
    owner = types.SimpleNamespace(function=original)
    patch, replacement = make(owner)
    assert owner.function is original and patch.entry is None and not patch.active()
    with patch.block():
        assert owner.function is replacement and patch.entry is original and patch.active()
        assert owner.function(1) == ("inside", 1)
        with patch.block():  # nested: still installed, and still so after the inner block closes
            assert owner.function is replacement
        assert owner.function is replacement and patch.active()
        kept = owner.function  # a reference taken inside a block
    assert owner.function is original and not patch.active()
    assert kept(4) == ("original", 4)  # still reaches the entry once the blocks are closed


def test_another_thread_gets_the_entry_while_a_block_is_open():
    owner = types.SimpleNamespace(function=original)
    patch, _ = make(owner)
    seen = []
    with patch.block():
        thread = threading.Thread(target=lambda: seen.append(owner.function(2)))
        thread.start()
        thread.join()
        seen.append(owner.function(3))
    assert seen == [("original", 2), ("inside", 3)]


def test_a_patch_installed_by_someone_else_before_the_block_is_what_comes_back():
    owner = types.SimpleNamespace(function=original)
    patch, _ = make(owner)

    def theirs(x):
        return ("theirs", x)

    owner.function = theirs
    with patch.block():
        assert patch.entry is theirs
    assert owner.function is theirs


def test_a_patch_installed_by_someone_else_inside_the_block_stays():
    owner = types.SimpleNamespace(function=original)
    patch, _ = make(owner)

    def theirs(x):
        return ("theirs", x)

    with patch.block():
        owner.function = theirs  # e.g. a library imported during the block
    assert owner.function is theirs


def test_an_owner_without_the_attribute_is_left_alone():
    owner = types.SimpleNamespace()
    patch, _ = make(owner)
    with patch.block():
        assert not hasattr(owner, "function") and patch.entry is None
    assert not hasattr(owner, "function")
