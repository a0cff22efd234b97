# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The default performance path (`shared_prefix=True`, `chunked_logprobs=True`) against the all-plain one (TRL's
computation) on SmolLM2-135M-Instruct in bf16 (weights and autocast): log-probs and entropies, gradients against a
float32 reference, a few GRPO steps, and reference syncs. This is the evidence for turning those paths on for CUDA.

    python -m pytest -m slow -s tests/slow/test_gpu_default_path.py                          # CUDA (~1.5 min)
    TRL_SLOW_TESTS_ON_CPU=1 python -m pytest -m slow -s tests/slow/test_gpu_default_path.py  # the CPU, smaller

The CPU run is for developing these tests: still bf16, fewer rows, tokens and steps. Every path is set explicitly
in both configurations (the fields' defaults depend on the device). Each test prints a table of what it measured
and, with `$OUT` set, writes it to `$OUT/gpu_default_path/<test>.json`.
"""

import copy
import json
import math
import os

import pytest
import torch
from conftest import real_grpo_kwargs
from sync_checks import (
    BATCH,
    COMPLETION_TOKENS,
    DEVICE,
    GENERATIONS,
    ON_CPU,
    TAU,
    SyncChecker,
    differing,
    length_reward,
    prompt_dataset,
    sampled_chat_batch,
    tied,
    ulps,
    whole_parameters,
)

from trl import GRPOConfig, GRPOTrainer
from trl.scoring.grpo_scoring import Scores, score_completions


pytestmark = pytest.mark.slow

# The five performance fields, each set: the default path (on for the CPU today, to be turned on for CUDA) and the
# plain path (TRL's computation). `inverse_cdf_sampling` acts on CPU generation only; it is off in both so that the
# CPU run draws its tokens with `torch.multinomial` as CUDA does, and a seed gives both runs the same draws.
DEFAULT_PATH = dict(
    shared_prefix=True,
    chunked_logprobs=True,
    inverse_cdf_sampling=False,
    recompute_elementwise_activations=False,
    offload_ref_model=False,
)
PLAIN_PATH = {**DEFAULT_PATH, "shared_prefix": False, "chunked_logprobs": False}
# What `GRPOTrainer._get_per_token_logps_and_entropies` passes to `score_completions` for each path on the CPU (the
# tied embedding's row gradient is part of the candidate default path; the trainer uses it in CPU runs only, see
# `trl/trainer/device_defaults.py`, so on CUDA the training runs below have it off on both paths).
TRAINER_FLAGS = dict(grouped_kv_attention=True, packed=True)
DEFAULT_FLAGS = dict(TRAINER_FLAGS, share_prefix=True, chunked_logprobs=True, sparse_embedding_grad=True)
PLAIN_FLAGS = dict(TRAINER_FLAGS, share_prefix=False, chunked_logprobs=False, sparse_embedding_grad=False)

# Scoring batch: distinct chat prompts (38-39 tokens with the template), each repeated GROUP times, sampled
# completions of LENGTH tokens, some cut shorter by their mask. Training: TRAIN_STEPS optimizer steps.
if ON_CPU:
    NUM_PROMPTS, GROUP, LENGTH, TRAIN_STEPS = 2, 4, 16, 2
else:
    NUM_PROMPTS, GROUP, LENGTH, TRAIN_STEPS = 4, 8, 48, 4
LEARNING_RATE = 1e-4  # an Adam step of ~1e-4 moves most bf16 weights by about an ulp: both paths train

# Tolerances (see each test): the default path's log-prob error may be this many times the plain path's own
# batch-to-row noise (each row scored alone against the batch), plus an absolute floor in nats for a device whose
# kernels give a row the same bits alone and in a batch; its gradients' relative error against float32 at most
# GRAD_RATIO times the plain path's, plus GRAD_FLOOR (about one bf16 rounding of the gradient itself), over the
# whole model and for the tied embedding, and at most TENSOR_RATIO times for any one tensor.
NOISE_MULTIPLE, LOGP_FLOOR = 3.0, 0.02
GRAD_RATIO, GRAD_FLOOR, TENSOR_RATIO = 1.5, 4e-3, 5.0


def write_evidence(name: str, rows: list[dict], **extra) -> None:
    """Print `rows` (dicts with the same keys) as a markdown table and, with `$OUT` set, write them and `extra` to
    `$OUT/gpu_default_path/<name>.json`."""
    keys = list(rows[0])
    cell = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    print(f"\n{name} ({device}, torch {torch.__version__}, bf16)")
    print("| " + " | ".join(keys) + " |")
    print("|" + "|".join("---" for _ in keys) + "|")
    for row in rows:
        print("| " + " | ".join(cell(row[k]) for k in keys) + " |")
    for key, value in extra.items():
        print(f"{key}: {value}")
    if os.environ.get("OUT"):
        folder = os.path.join(os.environ["OUT"], "gpu_default_path")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{name}.json"), "w") as f:
            json.dump({"device": device, "torch": torch.__version__, "rows": rows, **extra}, f, indent=1)


def autocast():
    """bf16 autocast, as a `bf16=True` trainer runs its forward passes."""
    return torch.autocast(DEVICE, dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def scoring_batch(smollm2_path):
    """(bf16 model on DEVICE, input ids, attention mask, completion mask): NUM_PROMPTS distinct left-padded chat
    prompts each repeated GROUP times, then LENGTH sampled tokens, of which every third row keeps fewer (by mask)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.bfloat16).to(DEVICE)
    ids, prompt_ids, prompt_mask = sampled_chat_batch(model, tokenizer, NUM_PROMPTS, GROUP, LENGTH)
    assert prompt_ids.size(1) > 17 and not prompt_mask.all()  # long enough to share; one prompt is left-padded
    completion_mask = torch.ones_like(ids[:, prompt_ids.size(1) :])
    for row in range(0, ids.size(0), 3):  # ended early, at varied lengths
        completion_mask[row, LENGTH // 4 + row % (LENGTH // 2) :] = 0
    return model, ids, torch.cat([prompt_mask, completion_mask], 1), completion_mask


def score(model, ids, mask, flags) -> Scores:
    return score_completions(model, ids, mask, LENGTH, 0.9, compute_entropy=True, **flags)


def token_errors(actual: torch.Tensor, expected: torch.Tensor, completion_mask: torch.Tensor) -> tuple[float, float]:
    """(max, mean) absolute difference over the valid completion tokens."""
    diff = (actual.float() - expected.float()).abs()[completion_mask.bool()]
    return diff.max().item(), diff.mean().item()


def rows_alone(model, ids, mask, flags) -> Scores:
    """Each row scored by itself, as if it were the only row: without the left padding its batch gave it."""
    alone = []
    for row in range(ids.size(0)):
        start = int((mask[row, : ids.size(1) - LENGTH] == 0).sum())  # left padding
        alone.append(score(model, ids[row : row + 1, start:], mask[row : row + 1, start:], flags))
    return Scores(*(torch.cat([getattr(s, field) for s in alone]) for field in ("per_token_logps", "entropies")), None)


def test_logprobs_and_entropies_within_batch_noise(scoring_batch):
    """The default path's per-token log-probs and entropies differ from the plain path's by no more than
    NOISE_MULTIPLE times the plain path's own batch-to-row noise (each row scored alone, unpadded, against the
    batch), plus LOGP_FLOOR: bf16 rounds differently with the shapes of a pass, and the default path is another
    layout (the prompts once, the completions on their cache or packed end to end)."""
    model, ids, mask, completion_mask = scoring_batch
    model.eval()
    with torch.no_grad(), autocast():
        plain = score(model, ids, mask, PLAIN_FLAGS)
        alone = rows_alone(model, ids, mask, PLAIN_FLAGS)
        default = score(model, ids, mask, DEFAULT_FLAGS)
    rows, measured = [], {}
    for what in ("per_token_logps", "entropies"):
        reference = getattr(plain, what)
        for label, other in (("plain: row alone vs batch", alone), ("default vs plain", default)):
            worst, mean = token_errors(getattr(other, what), reference, completion_mask)
            measured[what, label] = worst, mean
            rows.append({"quantity": what, "comparison": label, "max |Δ|": worst, "mean |Δ|": mean})
    write_evidence(
        "logprobs", rows, rows_scored=ids.size(0), completion_tokens=int(completion_mask.sum()), width=ids.size(1)
    )
    assert torch.isfinite(plain.per_token_logps).all() and (plain.per_token_logps <= 0).all()
    assert (default.per_token_logps[completion_mask == 0] == 0).all()  # masked positions read 0 on both paths
    for what in ("per_token_logps", "entropies"):
        noise, error = measured[what, "plain: row alone vs batch"], measured[what, "default vs plain"]
        for i, statistic in enumerate(("max", "mean")):
            bound = NOISE_MULTIPLE * noise[i] + LOGP_FLOOR
            assert error[i] <= bound, f"{what}: {statistic} |Δ| {error[i]:.4g} > {bound:.4g} (noise {noise[i]:.4g})"


def gradients(model, ids, mask, completion_mask, flags, cast: bool) -> dict[str, torch.Tensor]:
    """float32 copies of every parameter's gradient of Σ advantage_row · log-prob / tokens, with advantages fixed
    by a seed (a GRPO-shaped objective)."""
    advantages = torch.randn(ids.size(0), 1, generator=torch.Generator().manual_seed(1)).to(ids.device)
    model.zero_grad(set_to_none=True)
    with autocast() if cast else torch.autocast(DEVICE, enabled=False):
        logps = score(model, ids, mask, flags).per_token_logps
    ((logps * advantages * completion_mask).sum() / completion_mask.sum()).backward()
    return {name: p.grad.float().clone() for name, p in model.named_parameters()}


def test_gradients_as_close_to_float32_as_plain(scoring_batch):
    """Relative errors (‖g − g₃₂‖ / ‖g₃₂‖) of the bf16 gradients against a float32 gradient of the same weights: the
    default path's at most GRAD_RATIO × the plain path's plus GRAD_FLOOR over all parameters together and for the
    tied embedding (one tensor, gradient from the lookups and the LM head); per parameter, the median ratio at most
    1.25 and none above TENSOR_RATIO × plain + GRAD_FLOOR. A single tensor's error is the sum of many rounding errors
    of either sign: on 8 rows its ratio between the two paths ranged from 0.3 to 3.3 on the CPU (the norms' small
    gradients cancel most), while a wrong gradient would be off by ~100 %."""
    model, ids, mask, completion_mask = scoring_batch
    model.train()
    reference_model = copy.deepcopy(model).float()  # the bf16 weights, exactly, in float32
    fp32_flags = dict(PLAIN_FLAGS, sparse_embedding_grad=False)  # autograd's own dense embedding gradient
    reference = gradients(reference_model, ids, mask, completion_mask, fp32_flags, cast=False)
    del reference_model
    results = {
        label: gradients(model, ids, mask, completion_mask, flags, cast=True)
        for label, flags in (("plain", PLAIN_FLAGS), ("default", DEFAULT_FLAGS))
    }
    model.zero_grad(set_to_none=True)
    assert tied(model) and results["plain"].keys() == reference.keys() == results["default"].keys()
    errors = {
        label: {name: ((grads[name] - g).norm() / g.norm()).item() for name, g in reference.items()}
        for label, grads in results.items()
    }
    reference_norm = torch.stack([g.norm() for g in reference.values()]).norm()
    overall = {
        label: (torch.stack([(grads[n] - g).norm() for n, g in reference.items()]).norm() / reference_norm).item()
        for label, grads in results.items()
    }
    embedding = next(n for n, p in model.named_parameters() if p is model.get_input_embeddings().weight)
    ratios = {name: errors["default"][name] / errors["plain"][name] for name in reference}
    ordered = sorted(ratios.values())
    quantiles = {f"ratio_q{q}": ordered[min(len(ordered) - 1, int(q * len(ordered) / 100))] for q in (10, 50, 90, 100)}
    worst = max(ratios, key=ratios.get)
    by_plain = sorted(reference, key=errors["plain"].get)
    rows = [{"parameter": "all together", "plain rel. err": overall["plain"], "default rel. err": overall["default"]}]
    rows += [
        {"parameter": f"{label} ({name})", "plain rel. err": errors["plain"][name], "default rel. err": e}
        for label, name in (
            ("tied embedding", embedding),
            ("worst default/plain", worst),
            ("median plain", by_plain[len(by_plain) // 2]),
            ("largest plain", by_plain[-1]),
        )
        for e in [errors["default"][name]]
    ]
    write_evidence("gradients", rows, parameters=len(reference), **quantiles)
    assert all(g.norm() > 0 for g in reference.values())  # every tensor gets a gradient (the objective reaches all)
    assert max(errors["plain"].values()) < 0.75, errors["plain"]  # bf16 is nearer float32 than a wrong gradient
    assert overall["default"] <= GRAD_RATIO * overall["plain"] + GRAD_FLOOR, overall
    assert errors["default"][embedding] <= GRAD_RATIO * errors["plain"][embedding] + GRAD_FLOOR
    assert quantiles["ratio_q50"] <= 1.25, quantiles
    too_far = {
        name: (errors["default"][name], errors["plain"][name])
        for name in reference
        if errors["default"][name] > TENSOR_RATIO * errors["plain"][name] + GRAD_FLOOR
    }
    assert not too_far, too_far


class RecordingTrainer(GRPOTrainer):
    """A trainer that keeps each generation call's (prompt ids, completion ids), or with `replay` samples nothing and
    hands back another run's completions call by call (after checking that the prompts are the same)."""

    def __init__(self, *args, replay=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls, self.replay = [], replay

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        if self.replay is None:
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        else:
            recorded_prompts, completion_ids = self.replay[len(self.calls)]
            assert recorded_prompts == prompt_ids  # the same seed gives the same prompt order
            logprobs = None
        self.calls.append((prompt_ids, completion_ids))
        return completion_ids, logprobs


def bf16_config(output_dir, path: dict, **overrides) -> GRPOConfig:
    """A bf16 GRPOConfig (weights and autocast) for SmolLM2 on DEVICE with the given performance `path`: BATCH
    completions (GENERATIONS per prompt) of at most COMPLETION_TOKENS tokens, TRAIN_STEPS steps, seed 0."""
    kwargs = real_grpo_kwargs(
        str(output_dir),
        use_cpu=ON_CPU,
        bf16=True,
        model_init_kwargs={"dtype": "bfloat16"},
        per_device_train_batch_size=BATCH,
        num_generations=GENERATIONS,
        max_completion_length=COMPLETION_TOKENS,
        learning_rate=LEARNING_RATE,
        max_steps=TRAIN_STEPS,
    )
    return GRPOConfig(**{**kwargs, **path, **overrides})


def logged(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if "loss" in h]


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def test_training_steps_match_plain(smollm2_path, tmp_path):
    """TRAIN_STEPS GRPO steps in bf16, same seed, three runs: the plain path (its completions recorded), the default
    path scoring and training on the plain run's completions, and the default path sampling its own.

    On the same completions the rewards are equal, and so is the loss's policy term (one optimization pass per
    generation: the ratio is exactly 1), so the losses differ by β × the logged KL's difference (to float rounding).
    Step 1 (same weights) is tight: entropy within 1 %, gradient norm within 3 %, KL at most 2e-3 (the policy's and
    the reference's passes over the same weights differ by bf16 rounding only). Later steps compare loosely (entropy
    5 %, gradient norm 15 %, KL 30 % + 1e-3): from the first update on, the two runs' bf16 weights differ by
    rounding, and Adam scales a rounding difference in a small gradient coordinate up to a whole step. Sampling its
    own completions, the default path draws the same random numbers from the same seed (the prefix cache only
    changes the prompt's float bits), so at step 1 at least 3 in 4 rows must start with the plain run's first token,
    and its entropy be within 25 %."""
    dataset = prompt_dataset()
    runs = {}
    for label, path, replay in (
        ("plain", PLAIN_PATH, None),
        ("default, plain's completions", DEFAULT_PATH, "plain"),
        ("default, own sampling", DEFAULT_PATH, None),
    ):
        trainer = RecordingTrainer(
            model=smollm2_path,
            reward_funcs=length_reward,
            args=bf16_config(tmp_path / str(len(runs)), path),
            train_dataset=dataset,
            replay=None if replay is None else runs[replay].calls,
        )
        trainer.train()
        runs[label] = trainer
    plain = runs["plain"]
    first = [(ids[0] if ids else None) for ids in plain.calls[0][1]]
    own_first = [(ids[0] if ids else None) for ids in runs["default, own sampling"].calls[0][1]]
    first_token_agreement = sum(a == b for a, b in zip(first, own_first)) / len(first)
    keys = ("loss", "grad_norm", "entropy", "kl", "reward")
    rows = [
        {"run": label, "step": step + 1, **{key: logged(trainer, key)[step] for key in keys}}
        for label, trainer in runs.items()
        for step in range(TRAIN_STEPS)
    ]
    write_evidence("training", rows, first_token_agreement_step1=first_token_agreement)

    for trainer in runs.values():
        assert len(logged(trainer, "loss")) == TRAIN_STEPS
        assert all(math.isfinite(logged(trainer, key)[s]) for key in keys for s in range(TRAIN_STEPS))
        assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    forced = runs["default, plain's completions"]
    assert [c[1] for c in forced.calls] == [c[1] for c in plain.calls]  # replayed exactly
    assert logged(forced, "reward") == logged(plain, "reward")
    beta = plain.args.beta
    for step in range(TRAIN_STEPS):
        tight = step == 0
        values = {key: (logged(forced, key)[step], logged(plain, key)[step]) for key in keys}
        loss, grad_norm, entropy, kl = (values[key] for key in ("loss", "grad_norm", "entropy", "kl"))
        where = (step + 1, values)
        assert abs((loss[0] - loss[1]) - beta * (kl[0] - kl[1])) <= 1e-6 + 1e-4 * abs(loss[1]), where
        assert relative(*grad_norm) <= (0.03 if tight else 0.15), where
        assert relative(*entropy) <= (0.01 if tight else 0.05), where
        assert (max(kl) <= 2e-3) if tight else (abs(kl[0] - kl[1]) <= 0.3 * kl[1] + 1e-3), where
    assert first_token_agreement >= 0.75, (first, own_first)
    assert relative(logged(runs["default, own sampling"], "entropy")[0], logged(plain, "entropy")[0]) <= 0.25


class HandFormulaChecker(SyncChecker):
    """A `SyncChecker` that also compares, at every sync, each reference tensor with round_to_dtype(fp32((1 − α)·ref
    + α·policy)) computed here from the snapshots taken right before the sync (`hand_differing`, `hand_max_ulps`)."""

    def on_step_end(self, args, state, control, **kwargs):
        policy, before = self._policy, self._reference
        super().on_step_end(args, state, control, **kwargs)
        if policy is None:  # not a sync step
            return
        after, alpha = self._reference, self.alpha
        hand = {
            name: ((1 - alpha) * ref.float() + alpha * policy[name].float()).to(ref.dtype)
            for name, ref in before.items()
        }
        self.records[-1]["hand_differing"] = differing(after, hand)
        self.records[-1]["hand_max_ulps"] = max(ulps(after[name], hand[name]) for name in hand)
        self.records[-1]["after_differing_policy"] = differing(after, policy)


@pytest.mark.parametrize("alpha", [1.0, 0.5], ids=["hard", "soft"])
def test_sync_exact_in_bf16(smollm2_path, tmp_path, alpha):
    """bf16 on the default path, a sync every TAU steps: after each sync every reference tensor is, bitwise,
    round_to_bf16(fp32((1 − α)·ref + α·policy)) of the snapshots taken right before it (with α = 1: the policy's
    bits); at α = 0.5 the float32 mix of two bf16 numbers is exact, so any rounding order gives these bits. Between
    syncs the reference does not change, and each sync had work to do (at least half the tensors differed)."""
    holder = {}
    unwrap = lambda model: holder["t"].accelerator.unwrap_model(model)  # noqa: E731
    checker = HandFormulaChecker(
        lambda: whole_parameters(unwrap(holder["t"].model)),
        lambda: whole_parameters(unwrap(holder["t"].ref_model)),
        alpha,
    )
    args = bf16_config(
        tmp_path, DEFAULT_PATH, sync_ref_model=True, ref_model_sync_steps=TAU, ref_model_mixup_alpha=alpha
    )
    trainer = GRPOTrainer(
        model=smollm2_path,
        reward_funcs=length_reward,
        args=args,
        train_dataset=prompt_dataset(),
        callbacks=[checker.before],
    )
    holder["t"] = trainer
    trainer.add_callback(checker)
    trainer.train()
    records = checker.records
    columns = ("step", "tensors", "differing_before", "changed_by_formula", "hand_differing", "hand_max_ulps")
    rows = [{key: r.get(key, "-") for key in columns} for r in records]
    name = f"sync_alpha_{alpha}"
    write_evidence(name, rows, moved=checker.moved, num_syncs=trainer.sync_callback.num_syncs)

    reference = unwrap(trainer.ref_model)
    assert {p.dtype for p in reference.parameters()} == {torch.bfloat16} and tied(reference)
    assert checker.initial_equal
    assert [r["step"] for r in records] == list(range(1, TRAIN_STEPS + 1))
    assert trainer.sync_callback.num_syncs == TRAIN_STEPS // TAU >= 1
    for r in records:
        assert r["untouched_in_step"], r
        if r["step"] % TAU:
            assert r["untouched_by_sync"], r
            continue
        assert r["differing_before"] >= 0.5 * r["tensors"], r  # a sync that does nothing would pass the rest
        assert r["hand_differing"] == 0 and r["hand_max_ulps"] == 0, r
        assert r["max_ulps"] == 0, r  # torch.lerp in float32, rounded once, gives the same bits
        if alpha == 1.0:
            assert r["after_differing_policy"] == 0, r
        else:
            assert r["changed_by_formula"] >= 0.5 * r["differing_before"], r
