"""The training loop of one phase: epochs of distributed steps, validation, best model, early stopping.

One loop for every strategy: `strategy.run` of the step (components/trainer/step.py)
on batches from `distribute_datasets_from_function` (components/trainer/train_data.py).
Each epoch ends with validation on the chief, the best-model save, the
early-stopping check and a checkpoint; checkpoints also go out every
`train.checkpoint_every` steps. A re-run with the same work folder restores
the latest checkpoint and skips the batches of the epoch already trained.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
import time
from typing import Any, Callable, Mapping

from components.trainer import distribute
from components.contract import schema
from components.contract import precision as precision_lib
from components.trainer import checkpointing, summaries
from components.trainer.export import TrainedRun
from components.trainer.sync import broadcast_from_chief, chief_values
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


@dataclasses.dataclass
class TrainInputs:
    """The data side of a run: vocabulary, grid, train batches, validation images, step counts."""
    vocab_size: int
    id_to_word: list
    grid_shape: list
    data: Any            # train_data.TrainData
    eval_set: Any        # train_data.EvalSet
    steps_per_epoch: int
    total_steps: int


def read_inputs(strategy, role, config, annotations_uri: str, vocabulary_uri: str, *,
                annotations_properties: Mapping,
                vocabulary_properties: Mapping) -> TrainInputs:
    """Reads the artifacts and sizes the run.

    Args:
      strategy: the `tf.distribute.Strategy`.
      role: this process' `distribute.ClusterRole`.
      config: the `PipelineConfig`.
      annotations_uri, vocabulary_uri: the input artifact folders.
      annotations_properties, vocabulary_properties: their properties.
    Returns:
      The `TrainInputs`.
    Raises:
      ValueError, RuntimeError: a batch that the replicas cannot share, a
        missing train split, or one with fewer images than a global batch.
    """
    import keras
    from components.trainer import train_data
    tcfg = config.train
    replicas = strategy.num_replicas_in_sync
    if tcfg.batch_size % replicas:
        raise ValueError(f"train.batch_size={tcfg.batch_size} must be a multiple of the "
                         f"{replicas} replicas of train.strategy={tcfg.strategy}")
    keras.utils.set_random_seed(tcfg.seed)
    id_to_word = schema.read_vocabulary(vocabulary_uri)
    vocab_size = schema.vocabulary_size(vocabulary_uri, vocabulary_properties)
    grid_shape = schema.annotations_grid_shape(annotations_uri, annotations_properties)
    train_files = schema.split_files(annotations_uri, "train")
    if not train_files:
        raise RuntimeError(f"{annotations_uri} has no train split (train/*.tfrecord)")
    data = train_data.TrainData(
        train_files, grid_shape,
        num_records=(annotations_properties.get("num_records") or {}).get("train"),
        global_batch_size=tcfg.batch_size, seed=tcfg.seed,
        shuffle_buffer=tcfg.shuffle_buffer, cache=tcfg.cache,
        cache_budget_mb=tcfg.cache_budget_mb,
        bucket_by_length=tcfg.bucket_by_length,
        dtype=keras.mixed_precision.global_policy().compute_dtype,
        pad_multiple=8 if tcfg.jit_compile else 1)
    steps_per_epoch = data.steps_per_epoch(
        role.num_workers if distribute.is_multi_worker(strategy) else 1)
    if steps_per_epoch == 0:
        raise RuntimeError(f"the train split has {data.num_records} images, fewer than one "
                           f"global batch of {tcfg.batch_size} per worker: lower "
                           "train.batch_size")
    total_steps = steps_per_epoch * tcfg.epochs
    if tcfg.max_steps > 0:
        total_steps = min(total_steps, tcfg.max_steps)
    eval_set = train_data.load_eval_set(schema.split_files(annotations_uri, "val"),
                                        grid_shape, tcfg.val_examples, id_to_word)
    return TrainInputs(vocab_size=vocab_size, id_to_word=id_to_word, grid_shape=grid_shape,
                       data=data, eval_set=eval_set, steps_per_epoch=steps_per_epoch,
                       total_steps=total_steps)


@dataclasses.dataclass
class LoopSetup:
    """What every phase of a training run shares.

    Attributes:
      strategy: the `tf.distribute.Strategy`.
      role: this process' `distribute.ClusterRole`.
      config: the `PipelineConfig`.
      inputs: from `read_inputs`.
      work_dir: checkpoints, logs, history and `best.keras`.
      log: one line of progress text (only the chief's lines are shown).
      started: when the run began (default: now).
      precision: the resolved `components.contract.precision.Precision` (default: the config's
        policy, as set).
    """
    strategy: Any
    role: Any
    config: Any
    inputs: TrainInputs
    work_dir: str
    log: Callable[[str], None]
    started: float | None = None
    precision: precision_lib.Precision | None = None


class TrainingLoop:
    """One training phase's model, optimizer, checkpoints and loop state.

    Args:
      setup: the run's `LoopSetup`.
    """

    def __init__(self, setup: LoopSetup):
        self.strategy, self.role, self.config = setup.strategy, setup.role, setup.config
        self.precision = setup.precision or precision_lib.resolve(
            setup.config.train.mixed_precision)
        self.inputs, self.work_dir, self.log = setup.inputs, setup.work_dir, setup.log
        self.tcfg = setup.config.train
        self.chief = setup.role.is_chief
        self.say = setup.log if self.chief else (lambda line: None)
        self.multi_worker = distribute.is_multi_worker(setup.strategy)
        self.final: dict = {}           # the last step's results
        self._step_fn = self._iterator = None
        self._iterator_end = 0          # the first epoch the iterator does not hold
        self._phase_settings()
        self._announce()
        self.token_normalizer = self._token_normalizer()
        self._build()
        self._open_outputs()
        self.timing = Timing(started=setup.started or time.time())

    def _phase_settings(self) -> None:
        """What differs between the cross-entropy and the self-critical phase (`components.trainer.scst`)."""
        self.phase = "xe"
        self.epochs = self.tcfg.epochs
        self.total_steps = self.inputs.total_steps
        self.metric = self.tcfg.early_stopping_metric
        self.phase_dir = self.work_dir              # checkpoints, history, best.keras
        self.logs_dir = os.path.join(self.work_dir, schema.LOGS_DIR)

    def _announce(self) -> None:
        tcfg, role, inputs = self.tcfg, self.role, self.inputs
        if not self.chief:
            self.log(f"{role.task_type}:{role.task_id} of {role.num_workers} workers: "
                     "training with the chief; saves go to temporary folders")
        self.say(f"strategy {tcfg.strategy} "
                 f"({self.strategy.num_replicas_in_sync} replica(s)"
                 + (f", {role.num_workers} workers, task {role.task_type}:{role.task_id}"
                    if self.multi_worker else "")
                 + f"), {inputs.data.num_records} train images, {inputs.steps_per_epoch} "
                   f"steps/epoch x {tcfg.epochs} epochs (at most {inputs.total_steps} steps), "
                   f"{len(inputs.eval_set)} val images, attention {self.config.model.attention}"
                   f", vocabulary {inputs.vocab_size}, grid {inputs.grid_shape}, "
                   f"precision {self.precision.policy} ({self.precision.requested}: "
                   f"{self.precision.reason})")
        self.say(f"train split {inputs.data.cache_reason}")

    def _build(self) -> None:
        """Model, optimizer, state and checkpoints; restores the latest checkpoint."""
        import tensorflow as tf
        from components.trainer.model_setup import build_model, make_optimizer
        with self.strategy.scope():
            self.model = build_model(self.config.model, self.inputs.vocab_size,
                                     self.inputs.grid_shape, seed=self.tcfg.seed,
                                     steps_per_epoch=self.inputs.steps_per_epoch)
            self.optimizer = self._make_optimizer()
            self.optimizer.build(self.model.trainable_variables)
        self._initialize_weights()
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

    def _make_optimizer(self):
        from components.trainer.model_setup import make_optimizer
        return make_optimizer(self.tcfg, self.total_steps)

    def _initialize_weights(self) -> None:
        """Cross-entropy training starts from the initializers (or `train.init_model`)."""
        if self.tcfg.init_model:
            from components.trainer.model_setup import load_weights
            source = load_weights(self.model, self.tcfg.init_model)
            self.say(f"starting from the weights of {source}")

    def _open_outputs(self) -> None:
        """TensorBoard writer, validator and the best-model rule."""
        import tensorflow as tf
        self.writer = (summaries.file_writer(self.logs_dir) if self.chief
                       else tf.summary.create_noop_writer())
        eval_set = self.inputs.eval_set
        self.validator = Validator(self.model, eval_set, self.inputs.id_to_word) \
            if len(eval_set) else None
        self.best_path = os.path.join(self.phase_dir, schema.BEST_MODEL_FILE)
        # Hard attention's expected-alpha warmup trains a soft model: its
        # epochs are not candidates for the best (hard) model.
        self.selection_start = (self.model.expected_alpha_warmup
                                if self.model.attention == "hard" else 0)

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
                   desc="Trainer" if self.phase == "xe" else f"Trainer ({self.phase})",
                   file=sys.stderr, mininterval=1.0,
                   disable=not self.chief, dynamic_ncols=True)
        stop_reason = "finished" if int(state.finished.numpy()) else ""
        if stop_reason:
            self.say(f"training finished in an earlier attempt; exporting its final state")
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
        return stop_reason

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
        tcfg, state, inputs = self.tcfg, self.state, self.inputs
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
            self._step_fn = self._make_step(dist.element_spec)
        self._iterator = iter(dist)

    def _make_step(self, element_spec):
        from components.trainer.step import make_train_step
        tcfg = self.tcfg
        return make_train_step(
            self.strategy, self.model, self.optimizer, clip_norm=tcfg.clip_norm,
            global_batch_size=tcfg.batch_size, element_spec=element_spec,
            jit_compile=tcfg.jit_compile, token_normalizer=self.token_normalizer)

    def _token_normalizer(self) -> float | None:
        """Under `bucket_by_length`: the expected tokens of a global batch (else None).

        Bucketed batches hold captions of similar lengths. Dividing each batch's
        summed token losses by its own token count would give a token of a
        short caption several times the weight of a token of a long one; a
        constant keeps every token's weight the same, as in shuffled batches.
        """
        if not self.tcfg.bucket_by_length or self.phase != "xe":
            return None   # (self-critical batches are not bucketed)
        mean_tokens = self.inputs.data.mean_caption_tokens()
        normalizer = mean_tokens * self.tcfg.batch_size
        self.say(f"bucket_by_length: token losses divided by {normalizer:.0f} "
                 f"({self.tcfg.batch_size} captions x {mean_tokens:.2f} tokens on average)")
        return normalizer

    def _call_step(self, batch) -> dict:
        """One distributed step on `batch`: its results as floats."""
        return {k: float(v) for k, v in self._step_fn(batch).items()}

    def _write_summaries(self, step: int, out: dict) -> None:
        summaries.write_step_summaries(
            self.writer, step, out, self.optimizer,
            hard=self.model.attention in ("hard", "glimpse"), located=self.model.located,
            throughput=self.timing.throughput(), wait_fraction=self.timing.wait_fraction())

    def _train_step(self, bar) -> None:
        """One step, its counters, progress, summaries and periodic checkpoint."""
        tcfg, state, timing = self.tcfg, self.state, self.timing
        t0 = time.time()
        batch = next(self._iterator)
        t1 = time.time()
        out = self._call_step(batch)
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
            self._write_summaries(step, out)
        if step % max(1, tcfg.checkpoint_every) == 0:
            state.train_seconds.assign_add(timing.lap())
            self.save_checkpoint()

    def _end_epoch(self, epoch: int, epoch_start: float) -> str:
        """Validation, best model, history, early stopping, checkpoint; returns a stop reason."""
        tcfg, state = self.tcfg, self.state
        row = {"epoch": epoch, "step": int(state.step.numpy()),
               "seconds": round(time.time() - epoch_start, 2),
               "train_loss": self.final.get("loss")}
        if self.validator is not None:
            metrics = self._validate()
            row.update(metrics)
            note = self._select_best(metrics[self.metric], epoch)
            self.say(f"epoch {epoch + 1}: loss {row['train_loss'] or float('nan'):.4f}, "
                     + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()) + note)
        if self.chief:
            checkpointing.append_history(self.phase_dir, row)
        self.writer.flush()  # the epoch's curves reach `captioner tensorboard` now
        state.epoch.assign_add(1)
        state.step_in_epoch.assign(0)
        stop_reason = ""
        if self.validator is not None and int(state.bad_epochs.numpy()) >= tcfg.patience:
            stop_reason = (f"early stopping: {self.metric} did not improve "
                           f"for {tcfg.patience} epochs")
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
        if improved(metric, value, float(state.best_metric.numpy())):
            state.best_metric.assign(value)
            state.best_epoch.assign(epoch)
            state.bad_epochs.assign(0)
            target = distribute.write_dir(self.best_path, self.role)
            checkpointing.atomic_save(self.model, target)
            distribute.cleanup(target, self.role)
        else:
            state.bad_epochs.assign_add(1)
        return (f" (best {metric} {float(state.best_metric.numpy()):.4f} "
                f"at epoch {int(state.best_epoch.numpy()) + 1})")

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
                summaries.summary_scalar(f"val/{k}", v, step)
            if self.chief:
                images = self.validator.attention_images(self.inputs.grid_shape)
                for i, (caption, image) in enumerate(images):
                    summaries.summary_image(f"attention/val_{i}", image, step)
                    summaries.summary_text(f"attention/val_{i}_caption", caption, step)
        return metrics

    def trained_run(self, output_uri: str) -> TrainedRun:
        """What `export` needs from this (finished) run."""
        return TrainedRun(
            config=self.config, strategy=self.strategy, role=self.role, model=self.model,
            state=self.state, checkpoint=self.checkpoint, writer=self.writer,
            work_dir=self.work_dir, output_uri=output_uri,
            vocab_size=self.inputs.vocab_size, grid_shape=self.inputs.grid_shape,
            train_examples=int(self.inputs.data.num_records),
            val_examples=len(self.inputs.eval_set), resumed_from=self.resumed_from,
            timing=self.timing, log=self.log, final=self.final, precision=self.precision,
            best_path=self.best_path, metric=self.metric)
