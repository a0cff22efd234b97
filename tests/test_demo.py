# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Smoke run of the offline demo (examples/iterative_grpo_demo.py) with few steps."""

import importlib.util
import json
import os

import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_demo():
    spec = importlib.util.spec_from_file_location(
        "iterative_grpo_demo", os.path.join(ROOT, "examples", "iterative_grpo_demo.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_runs_and_reports(tmp_path):
    pytest.importorskip("matplotlib")
    demo = _load_demo()
    summary = demo.main(["--output_dir", str(tmp_path), "--max_steps", "6", "--sync_steps", "2"])
    assert summary["steps"] == 6
    assert summary["num_syncs"] == 3  # after steps 2, 4 and 6
    assert 0.0 <= summary["initial_reward"] <= 2.0 and 0.0 <= summary["final_reward"] <= 2.0
    assert summary["final_kl"] >= 0.0
    with open(tmp_path / "reward_kl.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "summary.json").read_text())["num_syncs"] == 3
    lines = (tmp_path / "prompts.jsonl").read_text().splitlines()
    assert len(lines) == 1000 and set(json.loads(lines[0])) == {"prompt", "answer"}
