# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`offload_ref_model`: the reference's weights in a mapped file, out of the process's memory between uses, with
the same training bit for bit (sync, checkpoint and resume included)."""

import os
import platform
import tempfile
import weakref

import pytest
import torch
from test_iterative_grpo import _interrupt_at, lora_config, make_trainer
from transformers import AutoModelForCausalLM, TrainerCallback

from trl import GRPOConfig
from trl.models.tiny import build_tiny_causal_lm
from trl.reference.ref_offload import OffloadedReference
from trl.tasks import arithmetic_corpus


pytestmark = pytest.mark.skipif(platform.system() != "Linux", reason="madvise: Linux only")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_causal_lm(str(tmp_path_factory.mktemp("offload_model")), corpus=arithmetic_corpus())


def resident_kib(start: int, length: int) -> int:
    """KiB of `[start, start + length)` resident in this process, from /proc/self/smaps (the mappings it overlaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and len(line.split()) >= 5 and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < start + length and start < hi
            elif inside and head == "Rss:":
                total += int(line.split()[1])
    return total


def test_weights_keep_their_bits_and_leave_memory(model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(model_dir, tie_word_embeddings=True).requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert model.lm_head.weight is model.model.embed_tokens.weight
    offload = OffloadedReference(model, str(tmp_path / "out"))
    assert os.listdir(tmp_path / "out") == []  # unlinked at once
    start, end = offload.storage.data_ptr(), offload.storage.data_ptr() + offload.storage.numel()

    def in_file(p):
        return start <= p.data_ptr() < end

    assert all(in_file(p) and p.data_ptr() % 4096 == 0 for p in model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied: one copy in the file
    assert offload.nbytes >= sum(p.numel() * 4 for p in model.parameters()) > 300_000
    assert resident_kib(start, offload.nbytes) == 0
    after = model.state_dict()  # read between uses: the pages fault in again
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert resident_kib(start, offload.nbytes) * 1024 >= 0.9 * offload.nbytes

    with offload.loaded():  # private copies, read with preadv; the pages resident since the read above are dropped
        assert not any(in_file(p) for p in model.parameters())
        assert resident_kib(start, offload.nbytes) == 0
        copies = [weakref.ref(p.data.untyped_storage()) for p in model.parameters()]
        assert all(torch.equal(model.state_dict()[k], before[k]) for k in before)
        with torch.no_grad():
            model.lm_head.weight.add_(1.0)  # lost: the block does not write back
    assert all(in_file(p) for p in model.parameters()) and resident_kib(start, offload.nbytes) == 0
    assert all(copy() is None for copy in copies)  # the private copies are freed
    assert torch.equal(model.lm_head.weight, before["lm_head.weight"])
    with offload.loaded(write=True):
        with offload.loaded():  # nested: joins the outer block
            with torch.no_grad():
                model.lm_head.weight.add_(1.0)
        assert not in_file(model.lm_head.weight)
    assert resident_kib(start, offload.nbytes) == 0  # written back with pwritev: the data is the file's
    assert torch.equal(model.model.embed_tokens.weight, before["lm_head.weight"] + 1.0)


def test_refuses_what_it_cannot_offload(model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with pytest.raises(ValueError, match="must not require gradients"):
        OffloadedReference(model, str(tmp_path))
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(model.config).requires_grad_(False)
    with pytest.raises(ValueError, match="plain CPU tensors; this one has Tensor parameters on meta"):
        OffloadedReference(meta, str(tmp_path))
    with pytest.raises(ValueError, match="offload_ref_model=True needs a reference model: set beta > 0"):
        GRPOConfig(output_dir=str(tmp_path), offload_ref_model=True, beta=0.0, use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="needs a separate reference model; with a PEFT policy"):
        make_trainer(model_dir, tmp_path, peft_config=lora_config(), offload_ref_model=True)


def offload_state(trainer) -> tuple[int, bool]:
    """KiB of the reference's file resident, and whether the reference's parameters are the file's views."""
    offload = trainer.reference.offload
    views = all(p.data_ptr() == v.data_ptr() for p, v in zip(offload.params, offload.views))
    return resident_kib(offload.storage.data_ptr(), offload.nbytes), views


class Resident(TrainerCallback):
    """`offload_state` after each optimizer step's callbacks (the sync included) and after each checkpoint save."""

    def __init__(self, trainer):
        self.trainer, self.states = trainer, []

    def on_step_end(self, args, state, control, **kwargs):
        self.states.append(("step", *offload_state(self.trainer)))

    def on_save(self, args, state, control, **kwargs):
        self.states.append(("save", *offload_state(self.trainer)))


def test_training_sync_checkpoint_and_resume_are_bitwise_the_same(model_dir, tmp_path):
    # a sync every 2 steps: step 1's end sees what its log-prob pass left (a sync would drop resident pages)
    common = dict(ref_model_mixup_alpha=0.5, ref_model_sync_steps=2, max_steps=4)
    plain = make_trainer(model_dir, tmp_path / "plain", **common)
    plain.train()

    run = make_trainer(
        model_dir, tmp_path / "b", offload_ref_model=True, save_strategy="steps", save_steps=2, **common
    )
    resident = Resident(run)
    run.add_callback(_interrupt_at(2))
    run.add_callback(resident)  # after the sync callback
    run.train()
    # every step read the reference (its log-prob pass), step 2 wrote it (the sync), then the checkpoint saved it:
    # none of the file became resident, and the private copies were gone again
    assert resident.states == [("step", 0, True), ("step", 0, True), ("save", 0, True)]
    resumed = make_trainer(model_dir, tmp_path / "b", offload_ref_model=True, **common)
    resumed._load_reference_state(str(tmp_path / "b" / "checkpoint-2"))  # the restore, as `train` runs it
    assert offload_state(resumed) == (0, True)
    resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-2"))
    assert offload_state(resumed) == (0, True)

    policy, other = dict(plain.model.named_parameters()), dict(resumed.model.named_parameters())
    assert all(torch.equal(policy[k], other[k]) for k in policy)
    ref_plain, ref_resumed = plain.reference.tensors(plain.model), resumed.reference.tensors(resumed.model)
    assert all(torch.equal(ref_plain[k], ref_resumed[k]) for k in ref_plain)
    losses = [h["loss"] for h in plain.state.log_history if "loss" in h]
    assert losses == [h["loss"] for h in resumed.state.log_history if "loss" in h] and len(losses) == 4
    # the KL was not zero: the reference was read and mattered
    assert any(h["kl"] > 0 for h in plain.state.log_history if "kl" in h)


def test_a_failed_write_back_keeps_the_values(model_dir, tmp_path, monkeypatch):
    from trl.reference import ref_offload

    model = AutoModelForCausalLM.from_pretrained(model_dir, tie_word_embeddings=False).requires_grad_(False)
    offload = OffloadedReference(model, str(tmp_path))
    assert offload.params[-1] is model.lm_head.weight  # written after the failing third tensor
    expected = model.lm_head.weight.detach().clone() + 1.0
    real_pwrite, calls = ref_offload._pwrite, []

    def failing_once(fd, tensor, offset):
        calls.append(offset)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real_pwrite(fd, tensor, offset)

    monkeypatch.setattr(ref_offload, "_pwrite", failing_once)
    with pytest.raises(OSError, match="No space left"):
        with offload.loaded(write=True):
            with torch.no_grad():
                model.lm_head.weight.add_(1.0)
    # nothing was pointed back: every parameter is still its private copy, with the new values
    assert not any(p.data_ptr() == v.data_ptr() for p, v in zip(offload.params, offload.views))
    assert torch.equal(model.lm_head.weight, expected)
    assert not torch.equal(offload.views[-1], expected)  # the file still holds the old values
    with offload.loaded():  # joins the copies (no re-read of the stale file) and writes them at its end
        assert torch.equal(model.lm_head.weight, expected)
    assert len(calls) == 3 + len(offload.params)  # the failed write-back, then all of it again
    assert all(p.data_ptr() == v.data_ptr() for p, v in zip(offload.params, offload.views))
    assert torch.equal(offload.views[-1], expected) and torch.equal(model.lm_head.weight, expected)
    with torch.no_grad():
        model.lm_head.weight.data = model.lm_head.weight.data.double()  # a cast between uses
    with pytest.raises(RuntimeError, match="no longer matches its slot in the offload file"):
        with offload.loaded():
            pass


@pytest.mark.parametrize(
    "field, keyword",
    [
        ("shared_prefix", "share_prefix"),
        ("chunked_logprobs", "chunked_logprobs"),
        ("recompute_elementwise_activations", "recompute_elementwise_activations"),
    ],
)
def test_the_trainer_passes_its_scoring_fields(model_dir, tmp_path, monkeypatch, field, keyword):
    from trl.trainer import grpo_trainer

    seen, score = [], grpo_trainer.score_completions
    monkeypatch.setattr(grpo_trainer, "score_completions", lambda *a, **k: seen.append(k[keyword]) or score(*a, **k))
    for value in (True, False):
        trainer = make_trainer(model_dir, tmp_path / str(value), max_steps=1, **{field: value})
        trainer.train()
        assert set(seen) == {value}  # the reference pass and the loss
        seen.clear()


def test_file_system_type_and_the_ram_warning(model_dir, tmp_path, monkeypatch, caplog):
    import logging

    from trl.reference import ref_offload

    assert ref_offload.file_system_type("/proc") == "proc"
    if os.path.isdir("/dev/shm") and ref_offload.file_system_type("/dev/shm") == "tmpfs":
        with tempfile.TemporaryDirectory(dir="/dev/shm") as folder:
            assert ref_offload.file_system_type(folder) == "tmpfs"
    monkeypatch.setattr(ref_offload, "file_system_type", lambda path: "tmpfs")
    model = AutoModelForCausalLM.from_pretrained(model_dir).requires_grad_(False)
    with caplog.at_level(logging.WARNING):
        OffloadedReference(model, str(tmp_path))
    assert "is on tmpfs, whose pages are RAM; the reference saves no memory there" in caplog.text
