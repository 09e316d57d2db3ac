"""The one training loop: runs a `Phase` value's epochs of distributed steps, validation, best model, early stopping, resume.

One loop for every strategy and every phase (components/trainer/phase.py):
`strategy.run` of the phase's step on batches from
`distribute_datasets_from_function` (components/trainer/train_data.py).
Each epoch ends with validation on the chief, the best-model save, the
early-stopping check and a checkpoint; checkpoints also go out every
`train.checkpoint_every` steps. A re-run with the same work folder restores
the latest checkpoint of the phase and skips the batches of the epoch
already trained. The loop has no subclasses: what differs between phases is
in their `Phase` values.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time

from components.contract import schema
from components.trainer import checkpointing, distribute
from components.trainer.averaging import averaged_weights
from components.trainer.distribute import broadcast_from_chief, chief_values
from components.trainer.phase import Handoff, LoopSetup, Phase, PhaseOutcome
from components.trainer.summaries import summary_image, summary_scalar, summary_text
from components.trainer.timing import Timing
from components.trainer.validation import Validator, improved

# Epochs chained into one input dataset (building one costs ~0.15 s). Enough for
# every config's whole run: replacing a finished dataset's iterator stalled the
# Trainer for 8-37 s after the data stages had run in the same process, even with
# the old one torn down on a daemon thread (`release_in_background`).
EPOCHS_PER_DATASET = 64


def release_in_background(iterator) -> None:
    """Drops the last reference to a finished input iterator on a daemon thread.

    Tearing down a tf.data iterator of several epochs (each with its
    shuffle buffer) blocked the Trainer for 8-37 s in a process that had
    run the data stages first (`captioner demo`, float32, 2 cores); on its
    own thread the teardown overlaps the next steps.
    """
    if iterator is None:
        return
    holder = [iterator]
    del iterator
    threading.Thread(target=holder.clear, name="release-input-iterator", daemon=True).start()


class TrainingLoop:
    """One phase's model, optimizer, checkpoints and loop state.

    Args:
      setup: the run's `LoopSetup`.
      phase: the `Phase` to run.
    """

    def __init__(self, setup: LoopSetup, phase: Phase):
        self.phase = phase
        self.strategy, self.role, self.config = setup.strategy, setup.role, setup.config
        self.inputs, self.work_dir, self.log = phase.inputs, setup.work_dir, setup.log
        self.tcfg = setup.config.train
        self.chief = setup.role.is_chief
        self.say = setup.say
        self.multi_worker = distribute.is_multi_worker(setup.strategy)
        self.final: dict = {}           # the last step's results
        self._last_gain: float | None = None  # the metric's change in an epoch that improved it
        self._step_fn = self._iterator = None
        self._iterator_end = 0          # the first epoch the iterator does not hold
        self.epochs, self.total_steps, self.metric = phase.epochs, phase.total_steps, phase.metric
        self.phase_dir = phase.phase_dir(setup.work_dir)   # checkpoints, history, best.keras
        os.makedirs(self.phase_dir, exist_ok=True)
        for line in phase.announce:
            self.log(line)
        self._build()
        self._open_outputs()
        self.timing = Timing(started=setup.started or time.time())
        # The chief's restored state, which every worker now holds, decides.
        if phase.start_competes and self.resumed_from == 0:
            phase.on_start_scored(self._start_as_best())

    def _build(self) -> None:
        """Model, optimizer, state and checkpoints; restores the latest checkpoint."""
        import tensorflow as tf

        from components.trainer.model_setup import build_model
        with self.strategy.scope():
            self.model = build_model(self.config.model, self.inputs.vocab_size,
                                     self.inputs.grid_shape, seed=self.tcfg.seed,
                                     steps_per_epoch=self.inputs.steps_per_epoch)
            self.optimizer = self.phase.make_optimizer()
            self.optimizer.build(self.model.trainable_variables)
        self.phase.init_weights(self.model, self.chief, self.say)
        self.state = checkpointing.TrainState()
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                              **self.state.variables())
        if self.chief:
            checkpointing.remove_stale_saves(self.phase_dir)
        self._ckpt_dir = distribute.write_dir(
            os.path.join(self.phase_dir, schema.CHECKPOINTS_DIR), self.role)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, self._ckpt_dir, max_to_keep=max(1, self.tcfg.keep_checkpoints))
        self.resumed_from = 0
        if self.chief and self.manager.latest_checkpoint:
            latest = self.manager.latest_checkpoint
            self.checkpoint.restore(latest).assert_existing_objects_matched()
            self.resumed_from = int(self.state.step.numpy())
            # Logs count epochs from 1 (the state counts from 0), as EncoderTrainer does.
            self.log(f"resuming from step {self.resumed_from} (epoch "
                     f"{int(self.state.epoch.numpy()) + 1}, step "
                     f"{int(self.state.step_in_epoch.numpy())} of it): {latest}")
        if self.multi_worker:
            # Only the chief reads checkpoints; it hands its state to the others.
            broadcast_from_chief(self.strategy, list(self.model.weights)
                                 + list(self.optimizer.variables)
                                 + list(self.state.variables().values()))
            self.resumed_from = int(self.state.step.numpy())

    def _open_outputs(self) -> None:
        """TensorBoard writer, validator and the best-model rule."""
        import tensorflow as tf

        from components.trainer.summaries import file_writer
        self.writer = (file_writer(self.phase.logs_dir(self.work_dir)) if self.chief
                       else tf.summary.create_noop_writer())
        eval_set = self.inputs.eval_set
        self.validator = Validator(self.model, eval_set, self.inputs.id_to_word) \
            if len(eval_set) else None
        self.best_path = os.path.join(self.phase_dir, schema.BEST_MODEL_FILE)
        self.selection_start = self.phase.first_candidate(self.model)

    def _start_as_best(self) -> float | None:
        """Makes the start model the best so far (epoch -1), scored by the phase's metric.

        An epoch then replaces it only by beating its score: a phase that
        does not help exports the model it started from.

        Returns:
          The start model's score (None without a validation split).
        """
        if self.validator is None:
            return None
        score = self.validator.metric(self.metric) if self.chief else 0.0
        if self.multi_worker:
            score = chief_values(self.strategy, {self.metric: score})[self.metric]
        self.state.best_metric.assign(score)
        self.state.best_epoch.assign(-1)
        self._save_best()
        return score

    # ------------------------------------------------------------------ loop

    def release_inputs(self) -> None:
        """Closes the TensorBoard writer and frees the input pipeline (and its cache)."""
        self.writer.close()
        self._iterator = None

    def save_checkpoint(self) -> None:
        """A checkpoint at the current step (other workers: into a temporary folder)."""
        self.manager.save(checkpoint_number=int(self.state.step.numpy()))
        if not self.chief:
            distribute.cleanup(self._ckpt_dir, self.role)

    def run(self) -> str:
        """Trains until the epochs, `max_steps` or early stopping end it; returns why."""
        from tqdm import tqdm
        state, total = self.state, self.total_steps
        bar = tqdm(total=total, initial=min(self.resumed_from, total), unit="step",
                   desc=self.phase.progress, file=sys.stderr, mininterval=1.0,
                   disable=not self.chief, dynamic_ncols=True)
        stop_reason = "finished" if int(state.finished.numpy()) else ""
        if stop_reason:
            self.say("training finished in an earlier attempt; exporting its final state")
        try:
            while not stop_reason:
                stop_reason = self._run_epoch(bar)
            if not int(state.finished.numpy()):
                state.finished.assign(1)
                state.train_seconds.assign_add(self.timing.lap())
                self.save_checkpoint()
        finally:
            bar.close()
            self.writer.flush()
        self.say(f"{self.phase.stopped} at step {int(state.step.numpy())}: {stop_reason}")
        note = self._bound_note(stop_reason)
        if note:
            self.say(note)
        return stop_reason

    def _bound_note(self, stop_reason: str) -> str:
        """The line saying a bound ended a run whose last validated epoch was its best ("": else)."""
        state = self.state
        if self.validator is None or not (stop_reason == f"{self.epochs} epochs"
                                          or stop_reason.startswith("max_steps=")):
            return ""
        last = int(state.epoch.numpy()) - 1
        if last < 0 or int(state.best_epoch.numpy()) != last:
            return ""
        key = ("train.max_steps" if stop_reason.startswith("max_steps=")
               else self.phase.epochs_key)
        value = self.tcfg.max_steps if key == "train.max_steps" else self.epochs
        gain = (f" ({self._last_gain:+.4f} in the last epoch)" if self._last_gain is not None
                else "")
        return (f"stopped at {key}={value} while {self.metric} was still improving{gain}; "
                f"raise {key}")

    def _run_epoch(self, bar) -> str:
        """Trains (the rest of) the current epoch; returns a stop reason or ""."""
        tcfg, state = self.tcfg, self.state
        epoch = int(state.epoch.numpy())
        if epoch >= self.epochs:
            return f"{self.epochs} epochs"
        if int(state.step.numpy()) >= self.total_steps:
            return f"max_steps={tcfg.max_steps}"
        self._ensure_iterator(epoch)
        epoch_start = time.time()
        for _ in range(int(state.step_in_epoch.numpy()), self.inputs.steps_per_epoch):
            if int(state.step.numpy()) >= self.total_steps:
                break
            self._train_step(bar)
        if int(state.step_in_epoch.numpy()) < self.inputs.steps_per_epoch:
            return f"max_steps={tcfg.max_steps}"  # no validation of a partial epoch
        return self._end_epoch(epoch, epoch_start)

    def _ensure_iterator(self, epoch: int) -> None:
        """An iterator over the next few epochs (prefetching crosses their ends)."""
        if self._iterator is not None and epoch < self._iterator_end:
            return
        state, inputs = self.state, self.inputs
        skip = int(state.step_in_epoch.numpy())
        needed = -(-(self.total_steps - int(state.step.numpy()) + skip)
                   // inputs.steps_per_epoch)
        group = max(1, min(EPOCHS_PER_DATASET, self.epochs - epoch, needed))
        self._iterator_end = epoch + group
        data = inputs.data
        release_in_background(self._iterator)
        self._iterator = None
        dist = self.strategy.distribute_datasets_from_function(
            lambda ctx, e=epoch, s=skip, n=group: data.dataset(e, ctx, skip_steps=s, epochs=n))
        if self._step_fn is None:
            self._step_fn = self.phase.make_step(self.strategy, self.model, self.optimizer,
                                                 dist.element_spec)
        self._iterator = iter(dist)

    def _train_step(self, bar) -> None:
        """One step, its counters, progress, summaries and periodic checkpoint."""
        tcfg, state, timing = self.tcfg, self.state, self.timing
        t0 = time.time()
        batch = next(self._iterator)
        t1 = time.time()
        out = self._step_fn(batch, int(state.step.numpy()))
        timing.record(t0, t1, time.time(), tcfg.batch_size)
        state.step.assign_add(1)
        state.step_in_epoch.assign_add(1)
        step = int(state.step.numpy())
        self.final = out
        # (Under mixed_float16 a non-finite step is skipped and the loss scale shrinks.)
        if not math.isfinite(out["loss"]) and tcfg.mixed_precision != "mixed_float16":
            raise FloatingPointError(f"loss is {out['loss']} at step {step}: lower "
                                     "train.learning_rate or train.clip_norm")
        bar.update(1)
        bar.set_postfix(loss=f"{out['loss']:.3f}", ex_s=f"{timing.throughput():.0f}",
                        refresh=False)
        if step % max(1, tcfg.log_every) == 0 or step == 1:
            self.phase.write_summaries(self.writer, step, out, model=self.model,
                                       optimizer=self.optimizer, timing=timing)
        if step % max(1, tcfg.checkpoint_every) == 0:
            state.train_seconds.assign_add(timing.lap())
            self.save_checkpoint()

    def _end_epoch(self, epoch: int, epoch_start: float) -> str:
        """Validation, best model, history, early stopping, checkpoint; returns a stop reason."""
        state, patience = self.state, self.phase.patience
        row = {"epoch": epoch, "step": int(state.step.numpy()),
               "seconds": round(time.time() - epoch_start, 2),
               "train_loss": self.final.get("loss")}
        if self.validator is not None:
            with averaged_weights(self.model, self.optimizer):  # the average, if one is kept
                metrics = self._validate()
                note = self._select_best(metrics[self.metric], epoch)
            row.update(metrics)
            self.say(f"epoch {epoch + 1}: loss {row['train_loss'] or float('nan'):.4f}, "
                     + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()) + note)
        if self.chief:
            checkpointing.append_history(self.phase_dir, row)
        self.writer.flush()  # the epoch's curves reach `captioner tensorboard` now
        state.epoch.assign_add(1)
        state.step_in_epoch.assign(0)
        stop_reason = ""
        if self.validator is not None and patience > 0 and int(state.bad_epochs.numpy()) >= patience:
            stop_reason = (f"early stopping: {self.metric} did not improve "
                           f"by more than train.min_delta={self.tcfg.min_delta:g}"
                           f"{' (relative)' if self.metric == 'val_loss' else ''} "
                           f"for {patience} epochs")
        state.train_seconds.assign_add(self.timing.lap())
        if stop_reason:
            state.finished.assign(1)
        self.save_checkpoint()
        return stop_reason

    def _select_best(self, value: float, epoch: int) -> str:
        """Saves `best.keras` on a new best, counts bad epochs; returns the log note."""
        state, metric = self.state, self.metric
        if int(state.step.numpy()) <= self.selection_start:
            return " (expected-alpha warmup: not a best-model candidate)"
        if improved(metric, value, float(state.best_metric.numpy()), self.tcfg.min_delta):
            previous = float(state.best_metric.numpy())
            self._last_gain = None if math.isnan(previous) else value - previous
            state.best_metric.assign(value)
            state.best_epoch.assign(epoch)
            state.bad_epochs.assign(0)
            self._save_best()
        elif self.phase.start_competes and int(state.best_epoch.numpy()) < 0:
            # Still the start model: a phase's first epochs may score below it (a
            # fresh optimizer), so patience counts from the first epoch that beats it.
            return (f" (the start's {metric} {float(state.best_metric.numpy()):.4f} not yet "
                    "beaten" + ("; patience counts from the first epoch that beats it)"
                                if self.phase.patience > 0 else ")"))
        else:
            state.bad_epochs.assign_add(1)
        return (f" (best {metric} {float(state.best_metric.numpy()):.4f} "
                f"at epoch {int(state.best_epoch.numpy()) + 1})")

    def _save_best(self) -> None:
        """The current weights as `best.keras` (other workers: a temporary copy, deleted)."""
        target = distribute.write_dir(self.best_path, self.role)
        checkpointing.atomic_save(self.model, target)
        distribute.cleanup(target, self.role)

    def _validate(self) -> dict:
        """The chief's validation metrics (on every worker), written to TensorBoard."""
        names = ["val_loss"] + ([self.metric] if self.metric != "val_loss" else [])
        if self.chief:
            metrics = {name: self.validator.metric(name) for name in names}
        else:  # the chief's numbers decide; the weights are the same everywhere
            metrics = {k: 0.0 for k in names}
        if self.multi_worker:  # one early-stopping decision for all workers
            metrics = chief_values(self.strategy, metrics)
        step = int(self.state.step.numpy())
        with self.writer.as_default():
            for k, v in metrics.items():
                summary_scalar(f"val/{k}", v, step)
            if self.chief:
                images = self.validator.attention_images(self.inputs.grid_shape)
                for i, (caption, image) in enumerate(images):
                    summary_image(f"attention/val_{i}", image, step)
                    summary_text(f"attention/val_{i}_caption", caption, step)
        return metrics

    # ------------------------------------------------------------------ after the run

    def handoff(self, stop_reason: str) -> Handoff:
        """What the next phase starts from: the best model (else the final weights), the history."""
        start = self.best_path
        if not os.path.exists(start) and self.chief:  # no validation split: the final weights
            start = os.path.join(self.phase_dir, f"{self.phase.name}_final.keras")
            with averaged_weights(self.model, self.optimizer):
                checkpointing.atomic_save(self.model, start)
        return Handoff(start=start, history=tuple(self.history()), stop_reason=stop_reason)

    def history(self) -> list[dict]:
        """The run's epoch rows: the earlier phases', then this one's (tagged)."""
        return self.phase.history(checkpointing.read_history(self.phase_dir))

    def outcome(self) -> PhaseOutcome:
        """What `export` needs from this (finished) phase."""
        return PhaseOutcome(
            model=self.model, optimizer=self.optimizer, state=self.state,
            checkpoint=self.checkpoint, writer=self.writer, timing=self.timing, resumed_from=self.resumed_from, final=self.final,
            best_path=self.best_path, metric=self.metric, history=self.history(),
            properties=self.phase.properties(self.state, self.final))
