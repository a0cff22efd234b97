# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""A Python with TRL 1.16.0 (the behaviour reference) next to this package, for tests that compare the two.

The venv sees this environment's packages (`--system-site-packages`: torch, transformers, accelerate, datasets, ...)
and holds only `trl==1.16.0` itself (`--no-deps`), so building it takes seconds and both sides run the same
libraries. Run its scripts with `-P` from a folder outside this repository, or `import trl` finds ours.
"""

import os
import subprocess
import sys
import tempfile

import pytest


UPSTREAM_TRL_VERSION = "1.16.0"
UPSTREAM_VENV = os.environ.get("TRL_UPSTREAM_VENV", os.path.join(tempfile.gettempdir(), "trl-upstream-tests"))


def upstream_env(**extra: str) -> dict[str, str]:
    """The environment to run the venv's python in: this one without `PYTHONPATH` (with this repository on it,
    `import trl` would find ours even under `-P`), plus `extra`."""
    return {**{key: value for key, value in os.environ.items() if key != "PYTHONPATH"}, **extra}


def upstream_trl_python() -> str:
    """Path of the venv's python with `trl==1.16.0`, built on first use (needs the package index once).

    Raises:
        RuntimeError: if the venv cannot be built (with pip's output).
    """
    python = os.path.join(UPSTREAM_VENV, "bin", "python")
    check = [python, "-P", "-c", f"import trl, sys; sys.exit(trl.__version__ != {UPSTREAM_TRL_VERSION!r})"]
    if os.path.exists(python) and subprocess.run(check, cwd=tempfile.gettempdir(), env=upstream_env()).returncode == 0:
        return python
    steps = [
        [sys.executable, "-m", "venv", "--system-site-packages", UPSTREAM_VENV],
        # --ignore-installed: this package (1.16.0+iterative...) satisfies `trl==1.16.0` under PEP 440's local-version
        # rule, so pip would otherwise keep ours from the system site-packages and install nothing
        [python, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", f"trl=={UPSTREAM_TRL_VERSION}"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(
                f"Could not build the TRL {UPSTREAM_TRL_VERSION} venv ({' '.join(step)}):\n{done.stderr}"
            )
    return python


def upstream_trl_python_or_skip() -> str:
    """`upstream_trl_python()`, or skip the calling test (or fixture) when the venv cannot be built, e.g. offline
    without the package index. Not on CI (the environment variable `CI` is set): CI has the index, so there a venv
    that cannot be built is an error, not a skip.
    """
    try:
        return upstream_trl_python()
    except RuntimeError as error:
        if "CI" in os.environ:
            raise
        reason = str(error).strip().splitlines()
        pytest.skip(
            "skipped without the package index (set CI to make this an error): "
            + " ".join(line.strip() for line in reason[:1] + reason[-1:])
        )


def run_upstream_script(script: str, *args: str, timeout: int = 240):
    """Run `script` (Python source) with TRL 1.16's python (`upstream_trl_python_or_skip`), offline, from a folder
    outside this repository, with `args` as its `sys.argv[1:]`, and return the JSON value its last printed line holds.

    Raises:
        AssertionError: if the script exits non-zero (with its stderr).
    """
    import json

    done = subprocess.run(
        [upstream_trl_python_or_skip(), "-P", "-c", script, *args],
        cwd=tempfile.gettempdir(),  # not this repository: `import trl` must find TRL 1.16
        env=upstream_env(HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1"),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
