# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The offline demo (examples/iterative_grpo_demo.py), shortened: what it reports, and that the skill is learnt."""

import importlib.util
import json
import os

import pytest
from conftest import load_demo


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACCURACY = "rewards/accuracy_reward/mean"


def test_demo_runs_and_reports(tmp_path):
    pytest.importorskip("matplotlib")
    summary = load_demo().main(["--output_dir", str(tmp_path), "--max_steps", "9", "--sync_steps", "3"])
    synced, fixed = summary["iterative"], summary["fixed"]
    assert summary["chance_accuracy"] == 0.1 and summary["beta"] == 0.5
    assert synced["steps"] == fixed["steps"] == 9
    assert synced["num_syncs"] == 3 and fixed["num_syncs"] == 0  # after steps 3, 6 and 9
    assert synced["history"]["step"] == list(range(1, 10))
    # Same model, prompts and seed: the two runs are identical up to the first sync that follows an update, then
    # their references differ. The first rewarded completion of this seed comes at step 5: until then every group's
    # advantages are exactly 0, the policy gets no gradient and stays the reference (KL 0), so the sync after step 3
    # changes nothing, the one after step 6 is the first that moves the synced reference, and step 7 first differs.
    assert synced["history"][ACCURACY][:6] == fixed["history"][ACCURACY][:6]
    assert synced["history"]["kl"][:6] == fixed["history"]["kl"][:6]
    assert synced["history"]["kl"][0] < 1e-6  # policy == reference at the first step (up to rounding)
    assert synced["history"]["kl"][6] != fixed["history"]["kl"][6]
    for run in (synced, fixed):
        assert 0.0 <= run["initial_accuracy"] <= 1.0 and run["final_reward"] == run["final_accuracy"]
    with open(tmp_path / "reward_kl.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "summary.json").read_text())["iterative"]["num_syncs"] == 3
    rows = [json.loads(line) for line in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert len(rows) == 1000 and set(rows[0]) == {"prompt", "answer"}
    assert all(row["prompt"] == row["answer"] + "=" for row in rows)


def test_reproduction_grid_and_table(tmp_path):
    """benchmarks/reproduce_cold_start.py, shortened: one run per (arm, correction), the table row by row."""
    spec = importlib.util.spec_from_file_location(
        "reproduce_cold_start", os.path.join(ROOT, "benchmarks", "reproduce_cold_start.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["--output_dir", str(tmp_path), "--plot", "", "--workers", "1", "--seeds", "0", "--arms", "fixed", "hard"]
    results = module.main(
        argv + ["--betas", "0.5", "--corrections", "true", "false", "--max_steps", "2", "--sync_steps", "1"]
    )
    runs = results["runs"]
    assert [(r["arm"], r["correction"]) for r in runs] == [
        ("fixed", True),
        ("hard", True),
        ("fixed", False),
        ("hard", False),
    ]
    assert [r["num_syncs"] for r in runs] == [0, 2, 0, 2] and all(r["steps"] == [1, 2] for r in runs)
    # Identical until the first sync (after step 1), whatever the correction: ρ = 1 in value on-policy.
    assert len({r["rewards/accuracy_reward/mean"][0] for r in runs}) == 1 and len({r["kl"][0] for r in runs}) == 1
    rows = results["table"].splitlines()
    assert rows[0] == "| β | KL correction | arm | final accuracy (n=1) | final KL | accuracy per seed |"
    assert [row.split(" | ")[:3] for row in rows[2:6]] == [
        ["| 0.5", "on", "fixed reference"],
        ["| 0.5", "on", "hard sync (α=1, τ=1)"],
        ["| 0.5", "off", "fixed reference"],
        ["| 0.5", "off", "hard sync (α=1, τ=1)"],
    ]
    assert rows[-1].endswith("a policy that ignores the prompt scores at most 0.10.")
