# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The vLLM importance-sampling correction (`trl.trainer.importance_sampling`) against hand-computed ratios and
metrics, for the four modes with and without bounds, NaN log-probs, masks and padding."""

import math
import re

import pytest
import torch

from trl.trainer.importance_sampling import (
    IMPORTANCE_SAMPLING_MODES,
    importance_sampling_metrics,
    vllm_importance_sampling_ratio,
)


LN2 = math.log(2.0)
NAN = float("nan")


def _batch():
    """3 completions × 3 tokens, built from the log-ratios d = old − sampling:
    row 0: d = (ln 2, ln 2, ln 1/4), all valid        → tokens 2, 2, 1/4; sequence exp(0) = 1
    row 1: d = (ln 4, NaN, ln 8), the last masked out → tokens 4, 1, 1;   sequence 4 (NaN and padding count as 0)
    row 2: d = (ln 1/2, ln 1/2, −inf), last masked    → tokens 1/2, 1/2, 1; sequence 1/4
    """
    sampling = torch.tensor([[-1.0, -1.0, -2.0], [-3.0, NAN, -1.0], [-0.5, -0.5, -7.0]])
    d = torch.tensor([[LN2, LN2, -2 * LN2], [2 * LN2, 0.0, 3 * LN2], [-LN2, -LN2, 0.0]])
    old = sampling + d
    old[1, 1] = -1.0  # the trainer scored it; vLLM did not (NaN)
    old[2, 2] = float("-inf")  # padding may hold anything
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0]])
    return old, sampling, mask


# mode, clip_min, clip_max → expected ratio (rows as in `_batch`)
EXPECTED = [
    ("token_truncate", 0.3, 3.0, [[2, 2, 0.3], [3, 1, 1], [0.5, 0.5, 1]]),
    ("token_mask", 0.3, 3.0, [[2, 2, 0], [0, 1, 1], [0.5, 0.5, 1]]),
    ("sequence_truncate", 0.3, 3.0, [[1], [3], [0.3]]),
    ("sequence_mask", 0.3, 3.0, [[1], [0], [0]]),
    # TRL's defaults: no lower bound, C_max = 3
    ("token_truncate", None, 3.0, [[2, 2, 0.25], [3, 1, 1], [0.5, 0.5, 1]]),
    ("token_mask", None, 3.0, [[2, 2, 0.25], [0, 1, 1], [0.5, 0.5, 1]]),
    ("sequence_truncate", None, 3.0, [[1], [3], [0.25]]),
    ("sequence_mask", None, 3.0, [[1], [0], [0.25]]),
    # only a lower bound
    ("token_truncate", 0.3, None, [[2, 2, 0.3], [4, 1, 1], [0.5, 0.5, 1]]),
    ("token_mask", 0.3, None, [[2, 2, 0], [4, 1, 1], [0.5, 0.5, 1]]),
    ("sequence_truncate", 0.3, None, [[1], [4], [0.3]]),
    ("sequence_mask", 0.3, None, [[1], [4], [0]]),
    # no bound at all: the raw ratios
    ("token_truncate", None, None, [[2, 2, 0.25], [4, 1, 1], [0.5, 0.5, 1]]),
    ("token_mask", None, None, [[2, 2, 0.25], [4, 1, 1], [0.5, 0.5, 1]]),
    ("sequence_truncate", None, None, [[1], [4], [0.25]]),
    ("sequence_mask", None, None, [[1], [4], [0.25]]),
]


@pytest.mark.parametrize("mode, clip_min, clip_max, expected", EXPECTED)
def test_ratio_equals_the_hand_computation(mode, clip_min, clip_max, expected):
    old, sampling, mask = _batch()
    ratio = vllm_importance_sampling_ratio(old, sampling, mask, mode, clip_min=clip_min, clip_max=clip_max)
    assert ratio.dtype == torch.float32
    assert tuple(ratio.shape) == ((3, 1) if mode.startswith("sequence") else (3, 3))
    torch.testing.assert_close(ratio, torch.tensor(expected, dtype=torch.float32), rtol=1e-6, atol=1e-6)


def test_defaults_are_trls_and_the_ratio_carries_no_gradient():
    old, sampling, mask = _batch()
    old.requires_grad_(True)
    ratio = vllm_importance_sampling_ratio(old, sampling, mask, "sequence_mask")  # clip_min None, clip_max 3.0
    assert not ratio.requires_grad and ratio.grad_fn is None
    torch.testing.assert_close(ratio, torch.tensor([[1.0], [0.0], [0.25]]))


def test_mask_bounds_are_inclusive_and_float_masks_work():
    logps = torch.tensor([[-1.0, -2.0]])
    for mask in (torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool)):
        for mode in ("token_mask", "sequence_mask"):
            ratio = vllm_importance_sampling_ratio(logps, logps.clone(), mask, mode, clip_min=1.0, clip_max=1.0)
            assert ratio.eq(1.0).all(), (mode, mask.dtype)  # exactly 1 = both bounds: kept


def test_a_sequence_ratio_is_a_sum_over_tokens_not_a_mean():
    sampling = torch.zeros(1, 4)
    old = torch.full((1, 4), LN2)
    ratio = vllm_importance_sampling_ratio(old, sampling, torch.ones(1, 4), "sequence_truncate", clip_max=None)
    torch.testing.assert_close(ratio, torch.tensor([[16.0]]))  # 2⁴, not 2


def test_an_unknown_mode_names_the_four():
    old, sampling, mask = _batch()
    message = (
        "Unknown vLLM importance sampling mode: 'token'. It must be one of 'token_truncate', 'token_mask', "
        "'sequence_truncate' or 'sequence_mask'."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        vllm_importance_sampling_ratio(old, sampling, mask, "token")
    ratio = vllm_importance_sampling_ratio(old, sampling, mask, "token_mask")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        importance_sampling_metrics(old, sampling, mask, ratio, "token")
    assert IMPORTANCE_SAMPLING_MODES == ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError) as info:
        vllm_importance_sampling_ratio(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), "token_mask")
    assert str(info.value) == (
        "old_per_token_logps, sampling_per_token_logps and mask must have the same (N, L) shape (got (2, 3), "
        "(2, 4) and (2, 3))."
    )
    with pytest.raises(
        ValueError, match=re.escape("ratio must have shape (2, 1) for mode 'sequence_mask' (got (2, 3)).")
    ):
        importance_sampling_metrics(
            torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3), "sequence_mask"
        )


# |d| over the valid, non-NaN tokens: ln 2, ln 2, 2 ln 2 (row 0), 2 ln 2 (row 1), ln 2, ln 2 (row 2)
LOGP_DIFFERENCE = {"mean": 8 * LN2 / 6, "max": 2 * LN2}


@pytest.mark.parametrize(
    "mode, ratio_metrics",
    [
        # token modes: over the 7 masked tokens (the NaN one counts with ratio 1)
        ("token_mask", {"min": 0.0, "mean": 6.0 / 7.0, "max": 2.0}),  # 2, 2, 0, 0, 1, 0.5, 0.5
        ("token_truncate", {"min": 0.3, "mean": 9.3 / 7.0, "max": 3.0}),  # 2, 2, 0.3, 3, 1, 0.5, 0.5
        # sequence modes: over the 3 sequences
        ("sequence_mask", {"min": 0.0, "mean": 1.0 / 3.0, "max": 1.0}),  # 1, 0, 0
        ("sequence_truncate", {"min": 0.3, "mean": 4.3 / 3.0, "max": 3.0}),  # 1, 3, 0.3
    ],
)
def test_metrics_equal_the_hand_computation(mode, ratio_metrics):
    old, sampling, mask = _batch()
    ratio = vllm_importance_sampling_ratio(old, sampling, mask, mode, clip_min=0.3, clip_max=3.0)
    metrics = importance_sampling_metrics(old, sampling, mask, ratio, mode)
    expected = {f"sampling/sampling_logp_difference/{k}": v for k, v in LOGP_DIFFERENCE.items()}
    expected |= {f"sampling/importance_sampling_ratio/{k}": v for k, v in ratio_metrics.items()}
    assert set(metrics) == set(expected)
    for name, value in metrics.items():
        assert value.shape == () and value.dtype == torch.float32, name
        assert value.item() == pytest.approx(expected[name], rel=1e-6, abs=1e-6), name


def test_metrics_of_nothing_are_zero():
    empty = torch.zeros(0, 3)
    for mode in IMPORTANCE_SAMPLING_MODES:
        ratio = vllm_importance_sampling_ratio(empty, empty, empty, mode)
        assert tuple(ratio.shape) == ((0, 1) if mode.startswith("sequence") else (0, 3))
        metrics = importance_sampling_metrics(empty, empty, empty, ratio, mode)
        assert {name: value.item() for name, value in metrics.items()} == dict.fromkeys(metrics, 0.0)
    # no valid token: no difference to average; token modes have no ratio either, sequence modes have exp(0) = 1
    logps, mask = torch.full((2, 2), NAN), torch.zeros(2, 2)
    token = importance_sampling_metrics(logps, logps, mask, torch.ones(2, 2), "token_mask")
    assert {name: value.item() for name, value in token.items()} == dict.fromkeys(token, 0.0)
    ratio = vllm_importance_sampling_ratio(logps, logps, mask, "sequence_mask")
    torch.testing.assert_close(ratio, torch.ones(2, 1))
    sequence = importance_sampling_metrics(logps, logps, mask, ratio, "sequence_mask")
    assert [value.item() for value in sequence.values()] == [0.0, 0.0, 1.0, 1.0, 1.0]


def test_metrics_are_reduced_over_processes_as_trl_logs_them():
    from trl.trainer.importance_sampling import reduced_over_processes

    other = {  # what a second process computed
        "sampling/sampling_logp_difference/mean": 0.5,
        "sampling/sampling_logp_difference/max": 0.25,
        "sampling/importance_sampling_ratio/min": 0.5,
        "sampling/importance_sampling_ratio/mean": 2.0,
        "sampling/importance_sampling_ratio/max": 4.0,
    }
    ours = {
        "sampling/sampling_logp_difference/mean": 0.25,
        "sampling/sampling_logp_difference/max": 1.0,
        "sampling/importance_sampling_ratio/min": 0.75,
        "sampling/importance_sampling_ratio/mean": 1.0,
        "sampling/importance_sampling_ratio/max": 3.0,
    }

    names = iter(ours)  # gathered in the order of the metrics

    def gather(value):  # two processes: ours, then the other's
        return torch.tensor([value.item(), other[next(names)]])

    reduced = reduced_over_processes({k: torch.tensor(v) for k, v in ours.items()}, gather)
    assert reduced == {
        "sampling/sampling_logp_difference/mean": 0.375,
        "sampling/sampling_logp_difference/max": 1.0,
        "sampling/importance_sampling_ratio/min": 0.5,
        "sampling/importance_sampling_ratio/mean": 1.5,
        "sampling/importance_sampling_ratio/max": 4.0,
    }
