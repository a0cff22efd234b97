# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Trainer callbacks: *when* the reference model is synced with the policy (`SyncRefModelCallback`) and *when* the
reward models are refreshed (`RewardModelRefreshCallback`); TRL 1.16's rich progress display
(`RichProgressCallback`) and completion logging to wandb/Comet (`LogCompletionsCallback`)."""

import math
from contextlib import nullcontext

from accelerate.utils import gather_object
from torch import nn
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import has_length
from transformers.utils import is_rich_available, logging

from ..data_utils import maybe_apply_chat_template
from ..models.utils import unwrap_model_for_generation
from ..reference.ref_sync import ReferenceSync, pair_for_sync, sync_reference_model


logger = logging.get_logger(__name__)


class SyncRefModelCallback(TrainerCallback):
    """Moves the reference model towards the policy during training: π_ref ← α·π_θ + (1 − α)·π_ref.

    With `ref_model_sync_strategy="steps"` (default) the sync runs at the end of every `ref_model_sync_steps`-th
    optimizer step (after the optimizer update; micro-batches of gradient accumulation do not count); with
    `"epoch"` it runs at the end of the optimizer step that completes each epoch (an epoch cut short by `max_steps`
    does not sync). Either way it runs before that step's checkpoint is saved, and `on_train_begin` warns when the
    schedule leaves no sync in the run. α is `ref_model_mixup_alpha`. α = 1 is Algorithm 1 of DeepSeekMath
    (arXiv 2402.03300); 0 < α < 1 is the soft update of TR-DPO (arXiv 2404.09656). How the tensors are mixed
    (float32 maths, one rounding, fused kernels; local ZeRO-3 partitions and FSDP2 shards mixed without communication)
    is `trl.reference.ref_sync`'s job. `num_syncs` is also the reference's version: [`GRPOTrainer`] rescores buffered
    reference log-probs computed at an older one before their loss.

    [`GRPOTrainer`] registers exactly one instance when `sync_ref_model=True`; you do not need to add it.

    Args:
        ref_model (`torch.nn.Module` or `None`):
            The reference model to update in place. `None` for a PEFT policy whose reference is its frozen `"ref"`
            adapter (see `add_reference_adapter`): then only adapter tensors are mixed.
        accelerator (`accelerate.Accelerator`, *optional*):
            Used to unwrap the policy (DDP and friends) before syncing.

    Attributes:
        num_syncs (`int`): syncs done so far in this run.
        last_sync_step (`int`): optimizer step of the last sync (0 before the first).
    """

    def __init__(self, ref_model: nn.Module | None, accelerator=None):
        self.ref_model = ref_model
        self.accelerator = accelerator
        self.num_syncs = 0
        self.last_sync_step = 0
        self._sync: ReferenceSync | None = None  # the pairing, matched by name and validated once
        # a block in which the reference is in memory and may be written (`ReferenceModel.loaded`: an
        # offloaded reference, `offload_ref_model`)
        self.reference_loaded = lambda write: nullcontext()

    @classmethod
    def attach(cls, callback_handler, ref_model: nn.Module | None, accelerator=None) -> "SyncRefModelCallback":
        """The one sync callback of a trainer: the first `SyncRefModelCallback` already in `callback_handler` (a
        user-supplied one), bound to `ref_model` and `accelerator`, or a new one added at the end."""
        existing = [cb for cb in callback_handler.callbacks if isinstance(cb, cls)]
        if existing:
            existing[0].ref_model, existing[0].accelerator = ref_model, accelerator
            existing[0]._sync = None  # paired again with this trainer's models at the first sync
            return existing[0]
        callback = cls(ref_model=ref_model, accelerator=accelerator)
        callback_handler.add_callback(callback)
        return callback

    def sync(self, args: TrainingArguments, state: TrainerState, model: nn.Module) -> None:
        """Sync now, whatever the schedule says."""
        if self._sync is None:
            unwrap = self.accelerator.unwrap_model if self.accelerator is not None else (lambda m: m)
            reference = unwrap(self.ref_model) if self.ref_model is not None else None  # None: PEFT "ref" adapter
            self._sync = pair_for_sync(unwrap(model), reference)  # DDP / DeepSpeed engines -> modules
        with self.reference_loaded(write=True):
            self._sync(args.ref_model_mixup_alpha)
        self.num_syncs += 1
        self.last_sync_step = state.global_step

    @staticmethod
    def sync_target_model(model: nn.Module, target_model: nn.Module, alpha: float) -> None:
        """One sync of `target_model` towards `model` (TRL's name): `trl.sync_reference_model(model, target_model, alpha)`."""
        sync_reference_model(model, target_model, alpha)

    def metrics(self, global_step: int) -> dict[str, int]:
        """What the trainer logs at optimizer step `global_step`: `ref_model/num_syncs` and
        `ref_model/steps_since_sync`."""
        return {"ref_model/num_syncs": self.num_syncs, "ref_model/steps_since_sync": global_step - self.last_sync_step}

    def state_dict(self) -> dict[str, int]:
        """Counters to store in a checkpoint next to the reference weights."""
        return {"num_syncs": self.num_syncs, "last_sync_step": self.last_sync_step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.num_syncs, self.last_sync_step = int(state["num_syncs"]), int(state["last_sync_step"])

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        """Warn when the schedule leaves no sync in this run (the reference then stays the initial model)."""
        steps = state.max_steps
        if getattr(args, "ref_model_sync_strategy", "steps") == "steps":
            tau = args.ref_model_sync_steps
            if steps > 0 and steps // tau == state.global_step // tau:
                logger.warning(
                    f"ref_model_sync_steps={tau} but the run ends at optimizer step {steps} (now at "
                    f"{state.global_step}): no sync will happen, so the reference stays where it is, as with "
                    f"sync_ref_model=False. Set ref_model_sync_steps to at most {max(steps - state.global_step, 1)}."
                )
            return
        dataloader = kwargs.get("train_dataloader")
        batches = len(dataloader) if dataloader is not None and has_length(dataloader) else None
        if batches and steps > 0 and steps < math.ceil(batches / args.gradient_accumulation_steps):
            logger.warning(
                f"ref_model_sync_strategy='epoch' but the run ends at optimizer step {steps}, before its first epoch "
                f"ends ({math.ceil(batches / args.gradient_accumulation_steps)} steps): no sync will happen. Raise "
                "max_steps, or sync by steps (ref_model_sync_strategy='steps')."
            )

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model=None, **kwargs):
        """Sync at the end of every τ-th optimizer step, or (per-epoch strategy) of the step that completes an epoch.

        Both run before the `Trainer` saves a checkpoint for that step, so the checkpoint holds the synced reference.
        An epoch is complete when `state.epoch` is a whole number: `Trainer` sets it to `epoch + (micro-batch + 1) /
        micro-batches per epoch` before this call.
        """
        if getattr(args, "ref_model_sync_strategy", "steps") == "steps":
            if state.global_step % args.ref_model_sync_steps == 0:
                self.sync(args, state, model)
        elif state.epoch is not None and float(state.epoch).is_integer() and state.global_step > self.last_sync_step:
            self.sync(args, state, model)


class RewardModelRefreshCallback(TrainerCallback):
    """Trains the reward models further every `reward_model_update_steps` optimizer steps (Algorithm 1, line 12, of
    DeepSeekMath, arXiv 2402.03300): on the policy's completions since the previous update plus replayed earlier ones.

    What is trained and how (labels, replay buffer, losses, optimizer) is `trl.trainer.reward_model_refresh`'s job;
    this callback only decides when. [`GRPOTrainer`] registers one when `reward_model_update_steps` is set, placed
    before any [`SyncRefModelCallback`] (see `register`), so that a step that does both follows Algorithm 1's
    order: reward-model update, then π_ref ← π_θ.

    Args:
        refresh (`RewardModelRefresh`): the trainer's refresher; `refresh.update(global_step)` runs one update.
    """

    def __init__(self, refresh):
        self.refresh = refresh

    def register(self, callback_handler) -> None:
        """Insert this callback just before the first `SyncRefModelCallback` of `callback_handler` (at the end when
        there is none): callbacks run in list order, so the update precedes the reference sync at a shared step."""
        callbacks = callback_handler.callbacks
        sync = [i for i, callback in enumerate(callbacks) if isinstance(callback, SyncRefModelCallback)]
        callbacks.insert(sync[0] if sync else len(callbacks), self)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        steps = getattr(args, "reward_model_update_steps", None)
        if steps and state.global_step % steps == 0:
            self.refresh.update(state.global_step)


class RichProgressCallback(TrainerCallback):
    """Shows training progress with [rich](https://github.com/Textualize/rich) instead of tqdm: one live panel with a
    bar of optimizer steps (`state.max_steps` in all), a bar of evaluation batches while an evaluation runs, and a
    table of the latest logged values grouped by their prefix (`rewards/...`, `completions/...`, ...).

    Usage: `GRPOTrainer(..., args=GRPOConfig(..., disable_tqdm=True), callbacks=[RichProgressCallback()])`.
    `disable_tqdm=True` removes transformers' own tqdm bars (it then prints each log dict as a line instead).
    Only the main process (`state.is_world_process_zero`) draws anything.

    Attributes (`None` outside training, as in TRL): `training_bar` and `evaluation_bar` (`rich.progress.Progress`),
    `training_task` and `evaluation_task` (their task ids), `rich_group` (the `rich.live.Live` display),
    `rich_console`, `training_status` (the status line of the latest logs), `current_step` (the step the training
    bar shows).

    Raises:
        ImportError: at construction if `rich` is not installed.

    TRL compatibility: TRL 1.16's constructor (no arguments), attributes and display.
    """

    # TRL's attributes, all `None` while no training is drawn.
    _DISPLAY_ATTRIBUTES = (
        "training_bar",
        "evaluation_bar",
        "training_task",
        "evaluation_task",
        "rich_group",
        "rich_console",
        "training_status",
        "current_step",
    )

    def __init__(self):
        if not is_rich_available():
            raise ImportError("RichProgressCallback requires the `rich` extra: install it with `pip install rich`.")
        self._forget_display()

    def _forget_display(self):
        for name in self._DISPLAY_ATTRIBUTES:
            setattr(self, name, None)

    def _draws(self, state) -> bool:
        """Whether there is a display to update: on the main process, between `on_train_begin` and `on_train_end`."""
        return state.is_world_process_zero and self.rich_group is not None

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        from rich.console import Console, Group
        from rich.live import Live
        from rich.panel import Panel
        from rich.progress import Progress

        console = Console()
        training, evaluation = Progress(console=console), Progress(console=console)
        status = console.status("Nothing to log yet ...")
        self.rich_console, self.training_bar, self.evaluation_bar, self.training_status = (
            console,
            training,
            evaluation,
            status,
        )
        self.training_task = training.add_task("[blue]Training  ", total=state.max_steps)
        self.current_step = 0
        self.rich_group = Live(Panel(Group(training, evaluation, status)), console=console)
        self.rich_group.start()

    def on_step_end(self, args, state, control, **kwargs):
        if self._draws(state):
            # An absolute position: a resumed run starts at its checkpoint's step.
            self.training_bar.update(self.training_task, completed=state.global_step, update=True)
            self.current_step = state.global_step

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if not (self._draws(state) and has_length(eval_dataloader)):
            return
        if self.evaluation_task is None:
            self.evaluation_task = self.evaluation_bar.add_task("[blue]Evaluation", total=len(eval_dataloader))
        self.evaluation_bar.update(self.evaluation_task, advance=1, update=True)

    def on_evaluate(self, args, state, control, **kwargs):
        """The evaluation is over (also `on_predict`): its bar goes away until the next one."""
        if self._draws(state) and self.evaluation_task is not None:
            self.evaluation_bar.remove_task(self.evaluation_task)
            self.evaluation_task = None

    on_predict = on_evaluate

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._draws(state):
            self.training_status.update(logs_panel(state.global_step, logs or {}))

    def on_train_end(self, args, state, control, **kwargs):
        if self._draws(state):
            self.rich_group.stop()
            self._forget_display()


def logs_panel(step: int, logs: dict):
    """What `RichProgressCallback` shows of one log: a panel titled `Step <step>` holding, side by side, one
    two-column table (metric, value) per key prefix: `rewards/accuracy/mean` goes to the table titled `rewards` as
    `accuracy/mean`; keys without a `/` share one untitled table. Tables come in the order their first key was
    logged; numbers are shown with 3 decimals."""
    from rich.columns import Columns
    from rich.panel import Panel
    from rich.table import Table

    rows_by_prefix: dict[str | None, list[tuple[str, object]]] = {}
    for key, value in logs.items():
        prefix, slash, rest = key.partition("/")
        rows_by_prefix.setdefault(prefix if slash else None, []).append((rest if slash else key, value))
    tables = []
    for prefix, rows in rows_by_prefix.items():
        table = Table(title=f"[bold blue]{prefix}[/]" if prefix else None, header_style="bold magenta", box=None)
        table.add_column("Metric", justify="left", no_wrap=True)
        table.add_column("Value", justify="right")
        for name, value in rows:
            table.add_row(name, f"{value:.3f}" if isinstance(value, (int, float)) else str(value))
        tables.append(Panel(table, border_style="cyan", padding=(0, 1)))
    title = f"[bold green]Step {step}[/bold green]"
    return Panel(Columns(tables, equal=False, expand=True), title=title, border_style="green")


class LogCompletionsCallback(TrainerCallback):
    """Every `freq` optimizer steps, generates a completion for each of the first `num_prompts` prompts of the
    trainer's evaluation dataset and logs all rows so far as one table, `completions` (columns `step`, `prompt`,
    `completion`), to Weights & Biases and/or Comet, whichever of `"wandb"` / `"comet_ml"` is in `args.report_to`.

    Usage: `trainer.add_callback(LogCompletionsCallback(trainer, GenerationConfig(max_new_tokens=64), num_prompts=8))`.

    Args:
        trainer (`transformers.Trainer`): the trainer it is attached to; its `eval_dataset` (a `datasets.Dataset`)
            needs a `"prompt"` column of text or of chat messages (rendered with `maybe_apply_chat_template`).
        generation_config (`transformers.GenerationConfig`, *optional*): passed to `model.generate`; by default the
            model's own `generation_config`.
        num_prompts (`int`, *optional*): how many prompts (the first ones); by default the whole evaluation dataset.
        freq (`int`, *optional*): log every `freq` optimizer steps; by default every `state.eval_steps` steps
            (`args.eval_steps`, transformers' default 500 when it is unset).

    Prompts are split between processes, generated `args.per_device_eval_batch_size` at a time, left-padded, and
    decoded without special tokens; the main process logs the gathered rows. The table grows: every log holds all
    earlier rows too, and `step` is a string, as in TRL. `self.table` keeps the rows (`[step, prompt, completion]`).

    Raises:
        ValueError: at construction if the trainer has no evaluation dataset.

    TRL compatibility: TRL 1.16's signature and table. Differences: the tokenizer's `padding_side` and the model's
    train/eval mode are restored after generating (TRL leaves the tokenizer left-padded and generates in training
    mode, so with dropout on).
    """

    def __init__(self, trainer, generation_config=None, num_prompts: int | None = None, freq: int | None = None):
        if trainer.eval_dataset is None:
            raise ValueError(
                "Trainer must have an evaluation dataset to use the LogCompletionsCallback: pass `eval_dataset` to "
                "the trainer."
            )
        self.trainer = trainer
        self.generation_config = generation_config
        self.freq = freq
        self.eval_dataset = trainer.eval_dataset
        if num_prompts is not None:
            self.eval_dataset = self.eval_dataset.select(range(num_prompts))
        self.table: list[list[str]] = []
        self._last_logged_step = -1

    def _generate(self, prompts: list[str], tokenizer, batch_size: int) -> list[str]:
        """Completions (text, special tokens dropped) of `prompts`, `batch_size` at a time."""
        accelerator = self.trainer.accelerator
        completions = []
        padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
        try:
            gather = self.trainer.args.ds3_gather_for_generation  # the trainer's own memory/speed choice
            with unwrap_model_for_generation(self.trainer.model_wrapped, accelerator, gather) as model:
                was_training = model.training
                model.eval()
                try:
                    for start in range(0, len(prompts), batch_size):
                        batch = tokenizer(
                            prompts[start : start + batch_size], return_tensors="pt", padding=True, truncation=True
                        ).to(model.device)
                        output = model.generate(**batch, generation_config=self.generation_config)
                        new_tokens = output[:, batch["input_ids"].shape[1] :]
                        completions += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
                finally:
                    model.train(was_training)
        finally:
            tokenizer.padding_side = padding_side
        return completions

    def on_step_end(self, args, state, control, **kwargs):
        freq = self.freq or state.eval_steps
        if state.global_step == self._last_logged_step or state.global_step % freq != 0:
            return
        tokenizer = kwargs["processing_class"]
        accelerator = self.trainer.accelerator
        with accelerator.split_between_processes(list(self.eval_dataset["prompt"])) as local_prompts:
            local_prompts = [maybe_apply_chat_template({"prompt": p}, tokenizer)["prompt"] for p in local_prompts]
            local_completions = self._generate(local_prompts, tokenizer, args.per_device_eval_batch_size)
        prompts, completions = gather_object(local_prompts), gather_object(local_completions)
        if accelerator.is_main_process:
            self.table += [[str(state.global_step), p, c] for p, c in zip(prompts, completions, strict=True)]
            self._report(args.report_to)
        self._last_logged_step = state.global_step

    def _report(self, report_to: list[str]):
        """Send the whole table to the reporters among wandb and comet_ml (no-op for the others)."""
        import pandas as pd

        table = pd.DataFrame(self.table, columns=["step", "prompt", "completion"])
        if "wandb" in report_to:
            import wandb

            wandb.log({"completions": table})
        if "comet_ml" in report_to:
            import comet_ml

            experiment = comet_ml.get_running_experiment()
            if experiment is not None:
                experiment.log_table(tabular_data=table, filename="completions.csv")
