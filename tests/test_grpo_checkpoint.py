# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""trl/trainer/grpo_checkpoint.py: the cut generation batch saved with a checkpoint, and when it is not reused; the
saved reference of earlier versions (with derived buffers) and the reference of a checkpoint that has none."""

import json
import logging
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from trl import GRPOConfig, GRPOTrainer
from trl.reference.ref_checkpoint import (
    REF_ADAPTER_FILE,
    REF_MODEL_FILE,
    REF_SYNC_STATE_FILE,
    SyncReferenceAtResume,
    checkpoint_sync_settings,
    load_reference_state,
    reference_state_without_file,
)
from trl.reference.ref_sync import non_persistent_buffer_names
from trl.trainer.grpo_checkpoint import (
    GENERATION_BUFFER_FILE,
    GenerationBuffer,
    load_generation_buffer,
    save_generation_buffer,
)
from trl.trainer.grpo_inputs import shuffle_and_split, shuffle_seed


def test_generation_buffer_round_trip_and_other_world_size(tmp_path, caplog):
    inputs = [{"advantages": torch.tensor([0.5, -0.5])}, {"advantages": torch.tensor([1.0, -1.0])}]
    save_generation_buffer(str(tmp_path), 0, 3, inputs, num_processes=1)
    step, loaded = load_generation_buffer(str(tmp_path), 0, torch.device("cpu"), num_processes=1)
    assert step == 3 and [b["advantages"].tolist() for b in loaded] == [[0.5, -0.5], [1.0, -1.0]]
    # Resumed on 2 processes: rank 1 has no file, so rank 0 must not use its own either (else rank 1 would generate
    # alone and wait in a collective forever).
    assert load_generation_buffer(str(tmp_path), 1, torch.device("cpu"), num_processes=2) is None
    with caplog.at_level(logging.WARNING, logger="trl.trainer.grpo_checkpoint"):
        assert load_generation_buffer(str(tmp_path), 0, torch.device("cpu"), num_processes=2) is None
    path = tmp_path / GENERATION_BUFFER_FILE.format(rank=0)
    assert f"{path} was saved by 1 processes and this run has 2" in caplog.text
    # A buffer from before the process count was saved is used as it is.
    torch.save({"step": 1, "inputs": inputs}, path)
    assert load_generation_buffer(str(tmp_path), 0, torch.device("cpu"), num_processes=2)[0] == 1


def test_generation_buffer_trains_each_micro_batch_num_iterations_times_and_saves_only_a_cut_batch(tmp_path):
    accelerator = SimpleNamespace(process_index=0, num_processes=1, device=torch.device("cpu"))
    buffer = GenerationBuffer(steps_per_generation=2, num_iterations=2)  # a batch every 4 micro-steps
    batch = {"advantages": torch.arange(4.0), "num_items_in_batch": torch.tensor(8.0)}
    buffer.step = 4
    assert buffer.needs_batch()  # nothing buffered yet
    buffer.fill(batch, seed=7, process_index=0)
    expected = shuffle_and_split(batch, 2, shuffle_seed(7, 4, 0))
    first, second = (micro_batch["advantages"].tolist() for micro_batch in expected)
    seen = [buffer.next_micro_batch(lambda inputs: inputs)["advantages"].tolist() for _ in range(3)]
    assert seen == [first, second, first] and sorted(first + second) == [0.0, 1.0, 2.0, 3.0]
    assert buffer.step == 7 and not buffer.needs_batch()
    buffer.save(str(tmp_path), accelerator)  # micro-step 7 cuts the batch of micro-steps 4..7
    resumed = GenerationBuffer(2, 2)
    resumed.load(str(tmp_path), accelerator)
    assert resumed.step == 7 and resumed.inputs[1]["advantages"].tolist() == second
    # `refresh` replaces the buffered micro-batch (a reference sync's new log-probs are kept)
    assert resumed.next_micro_batch(lambda inputs: {**inputs, "ref_version": 1})["ref_version"] == 1
    assert resumed.inputs[1]["ref_version"] == 1 and resumed.step == 8 and resumed.needs_batch()
    boundary = tmp_path / "boundary"
    resumed.save(str(boundary), accelerator)  # at a batch boundary nothing is saved
    assert not boundary.exists()
    resumed.reset()
    assert resumed.step is None and resumed.inputs is None


def _write_reference(folder, tensors, sync_state=None):
    save_file({k: v.detach().clone().contiguous() for k, v in tensors.items()}, str(folder / REF_MODEL_FILE))
    (folder / REF_SYNC_STATE_FILE).write_text(json.dumps(sync_state or {"num_syncs": 1, "last_sync_step": 2}))


def test_reference_files_of_earlier_versions_with_non_persistent_buffers_load(tiny_lm_path, tmp_path):
    """Earlier versions also saved non-persistent (derived) buffers such as rotary `inv_freq`: skipped on load;
    any other missing or unexpected name is still an error."""
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path)
    derived = non_persistent_buffer_names(model)
    assert "model.rotary_emb.inv_freq" in derived
    tensors = dict(model.named_parameters())
    tensors.update((n, b) for n, b in model.named_buffers() if n not in derived and b.is_floating_point())
    saved = {k: torch.full_like(v, 0.25) for k, v in tensors.items()}
    inv_freq = model.get_buffer("model.rotary_emb.inv_freq").clone()
    _write_reference(tmp_path, {**saved, "model.rotary_emb.inv_freq": torch.zeros_like(inv_freq)})

    assert load_reference_state(tensors, str(tmp_path), REF_MODEL_FILE, derived) == {
        "num_syncs": 1,
        "last_sync_step": 2,
    }
    assert all(torch.equal(tensors[k], saved[k]) for k in tensors)
    assert torch.equal(model.get_buffer("model.rotary_emb.inv_freq"), inv_freq)  # derived: not overwritten
    with pytest.raises(ValueError, match=r"unexpected \['model.rotary_emb.inv_freq'\]"):
        load_reference_state(tensors, str(tmp_path), REF_MODEL_FILE)  # not declared ignorable
    _write_reference(tmp_path, {**saved, "model.rotary_emb.inv_freq": inv_freq, "extra.weight": inv_freq})
    with pytest.raises(ValueError, match=r"missing \[\], unexpected \['extra.weight'\]"):
        load_reference_state(tensors, str(tmp_path), REF_MODEL_FILE, derived)
    _write_reference(tmp_path, {k: v for k, v in saved.items() if k != "lm_head.weight" and "layers.0.mlp" not in k})
    with pytest.raises(ValueError, match=r"missing \['model.layers.0.mlp"):
        load_reference_state(tensors, str(tmp_path), REF_MODEL_FILE, derived)


def test_trainer_loads_a_reference_file_with_a_saved_inv_freq(tiny_lm_path, arithmetic_dataset, grpo_kwargs, tmp_path):
    args = GRPOConfig(**{**grpo_kwargs, "sync_ref_model": True})
    trainer = GRPOTrainer(
        tiny_lm_path, lambda completions, **kw: [0.0] * len(completions), args=args, train_dataset=arithmetic_dataset
    )
    reference = trainer.reference.tensors(trainer.model)
    saved = {k: torch.full_like(v, 0.5) for k, v in reference.items()}
    inv_freq = trainer.ref_model.get_buffer("model.rotary_emb.inv_freq").clone()
    _write_reference(tmp_path, {**saved, "model.rotary_emb.inv_freq": inv_freq + 1})
    trainer._load_reference_state(str(tmp_path))
    assert all(torch.equal(reference[k], saved[k]) for k in reference if k != "model.rotary_emb.inv_freq")
    # The saved (derived) inv_freq is skipped: the live buffer keeps the value computed from the config.
    assert torch.equal(trainer.ref_model.get_buffer("model.rotary_emb.inv_freq"), inv_freq)
    assert trainer.sync_callback.state_dict() == {"num_syncs": 1, "last_sync_step": 2}


def _args(alpha=1.0, strategy="steps", every=2):
    return SimpleNamespace(
        sync_ref_model=True,
        beta=0.04,
        ref_model_mixup_alpha=alpha,
        ref_model_sync_strategy=strategy,
        ref_model_sync_steps=every,
    )


HEAD = (
    "Checkpoint {checkpoint} has no synced reference model (ref_model.safetensors), as in checkpoints written by TRL, "
    "which does not save its reference; checkpoints written by this package with sync_ref_model=True include it. "
)
ASSUMED = (
    "Its training_args.bin could not be read, so the run that wrote it is assumed to have synced with this run's "
    "settings ({settings}). "
)
READ = "Its training_args.bin gives the settings of the run that wrote it ({settings}). "
TAIL = (
    " TRL's own resume re-creates the reference from the initial model instead, so its KL anchor jumps back to where "
    "training began."
)
STEPS_2_ALPHA_1 = "sync_ref_model=True, ref_model_sync_steps=2, ref_model_mixup_alpha=1.0, beta=0.04"


def _warning_of(caplog, checkpoint, file_name, args):
    """`reference_state_without_file`'s result and the one warning it logged."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl.reference.ref_checkpoint"):
        result = reference_state_without_file(str(checkpoint), file_name, args)
    messages = [r.getMessage() for r in caplog.records if r.name == "trl.reference.ref_checkpoint"]
    assert len(messages) == 1, messages
    return result, messages[0]


@pytest.mark.parametrize(
    ("step", "epoch", "args", "expected", "resume_alpha", "says"),
    [
        (
            1,
            0.1,
            _args(),
            (0, 0),
            None,
            ASSUMED.format(settings=STEPS_2_ALPHA_1) + "No reference sync (every 2 steps) had run by step 1, so the "
            "reference is the initial model, exactly as in the uninterrupted run.",
        ),
        (
            4,
            0.5,
            _args(),
            (2, 4),
            1.0,
            ASSUMED.format(settings=STEPS_2_ALPHA_1) + "2 reference sync(s) (every 2 steps) had run by step 4, so the "
            "reference starts from the policy's weights at the checkpoint (one sync with alpha=1); this is exactly "
            "the uninterrupted run's reference (synced at step 4)." + TAIL,
        ),
        (
            5,
            0.6,
            _args(),
            (2, 4),
            1.0,
            ASSUMED.format(settings=STEPS_2_ALPHA_1) + "2 reference sync(s) (every 2 steps) had run by step 5, so the "
            "reference starts from the policy's weights at the checkpoint (one sync with alpha=1); the uninterrupted "
            "run's reference was the policy at step 4, which the checkpoint does not hold: this is the nearest state "
            "it does." + TAIL,
        ),
        (
            5,
            0.6,
            _args(alpha=0.6),
            (2, 4),
            0.6,
            ASSUMED.format(
                settings="sync_ref_model=True, ref_model_sync_steps=2, ref_model_mixup_alpha=0.6, beta=0.04"
            )
            + "2 reference sync(s) (every 2 steps) had run by step 5, so the reference starts from the initial model "
            "synced once with the policy's weights at the checkpoint (alpha=0.6); an approximation: the uninterrupted "
            "run's reference mixed the policies of all 2 earlier syncs, which the checkpoint does not hold." + TAIL,
        ),
        (
            12,
            1.5,
            _args(strategy="epoch"),
            (1, 8),  # 8 steps per epoch: the last sync closed epoch 1, at step 8
            1.0,
            ASSUMED.format(
                settings="sync_ref_model=True, ref_model_sync_strategy='epoch', ref_model_mixup_alpha=1.0, beta=0.04"
            )
            + "1 reference sync(s) (at the end of every epoch) had run by step 12, so the reference starts from the "
            "policy's weights at the checkpoint (one sync with alpha=1); the uninterrupted run's reference was the "
            "policy at step 8, which the checkpoint does not hold: this is the nearest state it does." + TAIL,
        ),
        (
            16,
            2.0,
            _args(strategy="epoch"),
            (2, 16),
            1.0,
            ASSUMED.format(
                settings="sync_ref_model=True, ref_model_sync_strategy='epoch', ref_model_mixup_alpha=1.0, beta=0.04"
            )
            + "2 reference sync(s) (at the end of every epoch) had run by step 16, so the reference starts from the "
            "policy's weights at the checkpoint (one sync with alpha=1); this is exactly the uninterrupted run's "
            "reference (synced at step 16)." + TAIL,
        ),
        (
            6,
            0.75,
            _args(strategy="epoch"),
            (0, 0),
            None,
            ASSUMED.format(
                settings="sync_ref_model=True, ref_model_sync_strategy='epoch', ref_model_mixup_alpha=1.0, beta=0.04"
            )
            + "No reference sync (at the end of every epoch) had run by step 6, so the reference is the initial "
            "model, exactly as in the uninterrupted run.",
        ),
    ],
    ids=[
        "before-first-sync",
        "at-sync-step",
        "between-syncs",
        "soft-alpha",
        "mid-epoch",
        "at-epoch-end",
        "first-epoch",
    ],
)
def test_reference_without_file(tmp_path, caplog, step, epoch, args, expected, resume_alpha, says):
    """A checkpoint without a reference whose training_args.bin cannot be read (absent here): the run is assumed to
    have synced with this run's settings; the counters at its step and what the reference starts from."""
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": epoch}))
    assert load_reference_state({}, str(tmp_path), REF_MODEL_FILE) is None
    (state, alpha), message = _warning_of(caplog, tmp_path, REF_MODEL_FILE, args)
    assert (state["num_syncs"], state["last_sync_step"]) == expected and alpha == resume_alpha
    assert message == HEAD.format(checkpoint=tmp_path) + says


def _trl_checkpoint(folder, step, epoch, training_args=None, **config):
    """A fake TRL checkpoint: trainer_state.json without an EntropyCoefficient entry and training_args.bin pickled from
    a GRPOConfig (the class TRL's pickle resolves to here) stripped of the fields TRL's GRPOConfig lacks."""
    folder.mkdir(exist_ok=True)
    state = {"global_step": step, "epoch": epoch, "stateful_callbacks": {"TrainerControl": {}}}
    (folder / "trainer_state.json").write_text(json.dumps(state))
    if training_args is not None:
        (folder / "training_args.bin").write_bytes(training_args)
        return
    args = GRPOConfig(output_dir=str(folder), use_cpu=True, report_to="none", **config)
    del args.__dict__["ref_model_sync_strategy"]  # TRL 1.16 has no per-epoch sync
    torch.save(args, folder / "training_args.bin")


def test_checkpoint_sync_settings_reads_a_trl_config_without_post_init(tmp_path, monkeypatch):
    _trl_checkpoint(tmp_path, 4, 0.5, beta=0.1, sync_ref_model=True, ref_model_sync_steps=3, ref_model_mixup_alpha=0.5)
    monkeypatch.setattr(GRPOConfig, "__post_init__", lambda self: pytest.fail("__post_init__ ran on unpickling"))
    assert checkpoint_sync_settings(str(tmp_path)) == {
        "sync_ref_model": True,
        "ref_model_sync_steps": 3,
        "ref_model_mixup_alpha": 0.5,
        "beta": 0.1,
        "ref_model_sync_strategy": "steps",
    }
    (tmp_path / "training_args.bin").write_bytes(b"not a pickle")
    assert checkpoint_sync_settings(str(tmp_path)) is None
    (tmp_path / "training_args.bin").unlink()
    assert checkpoint_sync_settings(str(tmp_path)) is None


@pytest.mark.parametrize(
    ("config", "step", "args", "expected", "resume_alpha", "says"),
    [
        (
            dict(beta=0.1, sync_ref_model=False, ref_model_sync_steps=2, ref_model_mixup_alpha=1.0),
            4,
            _args(),
            (0, 0),
            None,
            READ.format(settings="sync_ref_model=False, ref_model_sync_steps=2, ref_model_mixup_alpha=1.0, beta=0.1")
            + "That run never synced its reference (sync_ref_model=False), so it stayed the initial model: the "
            "reference starts from the initial model, exactly as in the uninterrupted run; this run syncs it from "
            "here on.",
        ),
        (
            dict(beta=0.0, sync_ref_model=False),
            4,
            _args(),
            (0, 0),
            None,
            READ.format(settings="sync_ref_model=False, ref_model_sync_steps=512, ref_model_mixup_alpha=0.6, beta=0.0")
            + "That run had no reference model (beta=0.0), so nothing was synced: the reference starts from the "
            "initial model.",
        ),
        (
            # τ = 3 and α = 0.5 in the TRL run; this run has τ = 2, α = 1 and even syncs per epoch
            dict(beta=0.1, sync_ref_model=True, ref_model_sync_steps=3, ref_model_mixup_alpha=0.5),
            7,
            _args(strategy="epoch"),
            (2, 6),
            0.5,
            READ.format(settings="sync_ref_model=True, ref_model_sync_steps=3, ref_model_mixup_alpha=0.5, beta=0.1")
            + "2 reference sync(s) (every 3 steps) had run by step 7, so the reference starts from the initial model "
            "synced once with the policy's weights at the checkpoint (alpha=0.5); an approximation: the "
            "uninterrupted run's reference mixed the policies of all 2 earlier syncs, which the checkpoint does not "
            "hold." + TAIL,
        ),
        (
            dict(beta=0.1, sync_ref_model=True, ref_model_sync_steps=3, ref_model_mixup_alpha=1.0),
            6,
            _args(alpha=0.6),
            (2, 6),
            1.0,
            READ.format(settings="sync_ref_model=True, ref_model_sync_steps=3, ref_model_mixup_alpha=1.0, beta=0.1")
            + "2 reference sync(s) (every 3 steps) had run by step 6, so the reference starts from the policy's "
            "weights at the checkpoint (one sync with alpha=1); this is exactly the uninterrupted run's reference "
            "(synced at step 6)." + TAIL,
        ),
        (
            dict(beta=0.1, sync_ref_model=True, ref_model_sync_steps=8, ref_model_mixup_alpha=1.0),
            6,
            _args(),
            (0, 0),
            None,
            READ.format(settings="sync_ref_model=True, ref_model_sync_steps=8, ref_model_mixup_alpha=1.0, beta=0.1")
            + "No reference sync (every 8 steps) had run by step 6, so the reference is the initial model, exactly "
            "as in the uninterrupted run.",
        ),
    ],
    ids=["trl-without-sync", "trl-without-reference", "trl-other-tau-and-alpha", "trl-hard-sync", "trl-before-sync"],
)
def test_reference_without_file_uses_the_trl_runs_settings(
    tmp_path, caplog, config, step, args, expected, resume_alpha, says
):
    """The syncs of a TRL checkpoint are counted with the settings its training_args.bin holds, not this run's."""
    checkpoint = tmp_path / f"checkpoint-{step}"
    _trl_checkpoint(checkpoint, step, step / 8, **config)
    (state, alpha), message = _warning_of(caplog, checkpoint, REF_MODEL_FILE, args)
    assert (state["num_syncs"], state["last_sync_step"]) == expected and alpha == resume_alpha
    assert message == HEAD.format(checkpoint=checkpoint) + says


def test_reference_without_file_with_an_unreadable_training_args_assumes_this_run(tmp_path, caplog):
    _trl_checkpoint(tmp_path, 4, 0.5, training_args=b"\x80\x04garbage")
    (state, alpha), message = _warning_of(caplog, tmp_path, REF_MODEL_FILE, _args())
    assert state == {"num_syncs": 2, "last_sync_step": 4} and alpha == 1.0
    assert message.startswith(HEAD.format(checkpoint=tmp_path) + ASSUMED.format(settings=STEPS_2_ALPHA_1))


def test_trainer_resuming_a_trl_checkpoint_syncs_with_its_settings(
    tiny_lm_path, arithmetic_dataset, grpo_kwargs, tmp_path
):
    """`_load_reference_state`: counters from the TRL run's settings, and the resume sync (if any) with its α."""
    args = GRPOConfig(
        **{**grpo_kwargs, "sync_ref_model": True, "ref_model_sync_steps": 2, "ref_model_mixup_alpha": 1.0}
    )
    trainer = GRPOTrainer(
        tiny_lm_path, lambda completions, **kw: [0.0] * len(completions), args=args, train_dataset=arithmetic_dataset
    )
    without_sync = tmp_path / "without-sync"
    _trl_checkpoint(without_sync, 4, 0.5, beta=0.1, sync_ref_model=False)
    trainer._load_reference_state(str(without_sync))
    assert trainer.sync_callback.state_dict() == {"num_syncs": 0, "last_sync_step": 0}
    assert not [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, SyncReferenceAtResume)]

    soft = tmp_path / "soft"
    _trl_checkpoint(soft, 7, 0.875, beta=0.1, sync_ref_model=True, ref_model_sync_steps=3, ref_model_mixup_alpha=0.5)
    trainer._load_reference_state(str(soft))
    assert trainer.sync_callback.state_dict() == {"num_syncs": 2, "last_sync_step": 6}
    (resume,) = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, SyncReferenceAtResume)]
    assert resume.alpha == 0.5 and resume.sync_callback is trainer.sync_callback


def test_sync_at_resume_uses_its_alpha_and_keeps_the_counters():
    class Recorder:
        def __init__(self):
            self.alphas, self.counters = [], {"num_syncs": 2, "last_sync_step": 6}

        def state_dict(self):
            return dict(self.counters)

        def load_state_dict(self, state):
            self.counters = dict(state)

        def sync(self, args, state, model):
            self.alphas.append(args.ref_model_mixup_alpha)
            self.counters = {"num_syncs": 3, "last_sync_step": state.global_step}

    run_args, state = SimpleNamespace(ref_model_mixup_alpha=1.0), SimpleNamespace(global_step=7)
    for alpha, used in ((0.5, 0.5), (None, 1.0)):
        recorder = Recorder()
        callback = SyncReferenceAtResume(recorder, alpha)
        callback.on_train_begin(run_args, state, None, model=object())
        callback.on_train_begin(run_args, state, None, model=object())  # once only
        assert recorder.alphas == [used] and recorder.counters == {"num_syncs": 2, "last_sync_step": 6}


@pytest.mark.parametrize(
    ("file_name", "stateful_callbacks", "says"),
    [
        (
            REF_MODEL_FILE,
            {"EntropyCoefficient": {}, "TrainerControl": {}},
            "written by this package with sync_ref_model=False, whose reference stayed the initial model",
        ),
        (
            REF_ADAPTER_FILE,
            {"TrainerControl": {}},
            "TRL cannot sync the reference of a PEFT model, so the run that "
            "wrote it kept the initial reference: the reference adapter starts as a copy of the initial adapter.",
        ),
    ],
    ids=["ours-without-sync", "trl-peft"],
)
def test_reference_without_file_from_a_run_that_never_synced(tmp_path, caplog, file_name, stateful_callbacks, says):
    state = {"global_step": 4, "epoch": 0.5, "stateful_callbacks": stateful_callbacks}
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    with caplog.at_level(logging.WARNING, logger="trl.reference.ref_checkpoint"):
        assert reference_state_without_file(str(tmp_path), file_name, _args()) == (
            {"num_syncs": 0, "last_sync_step": 0},
            None,
        )
    assert f"Checkpoint {tmp_path} has no synced reference model ({file_name})" in caplog.text and says in caplog.text
