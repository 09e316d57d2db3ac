"""The Model artifact: model.keras, best.keras, checkpoints/, logs/, model_config.json.

Only the chief publishes; the other workers of a multi-worker job write the
same files into temporary folders (their saves take part in collective ops)
and delete them.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from typing import Any, Callable

from components.trainer import distribute
from components.contract import schema
from components.trainer import checkpointing
from components.trainer.summaries import scalar_value
from components.trainer.timing import Timing


@dataclasses.dataclass
class TrainedRun:
    """What the export reads from a finished training run.

    Attributes:
      config: the `PipelineConfig`.
      strategy: the `tf.distribute.Strategy`.
      role: this process' `distribute.ClusterRole`.
      model: the trained `ShowAttendTell`.
      state: its `checkpointing.TrainState`.
      checkpoint: the `tf.train.Checkpoint` of model, optimizer and state.
      writer: the TensorBoard writer (closed here on the chief).
      work_dir: the folder of checkpoints, logs, history and `best.keras`.
      output_uri: the Model folder (the chief's).
      vocab_size: tokens in the vocabulary.
      grid_shape: `[H, W, D]`.
      train_examples: images in the train split.
      val_examples: images validated on.
      resumed_from: the step this attempt started from.
      timing: this attempt's step timing.
      log: one line of progress text.
      final: the last step's results.
      precision: the resolved `components.contract.precision.Precision`.
      best_path: the best model of the run (default `<work_dir>/best.keras`).
      metric: the validation metric that chose it.
      history: the epoch rows (default: `<work_dir>/history.jsonl`).
      extra: more properties (the self-critical phase's).
    """
    config: Any
    strategy: Any
    role: Any
    model: Any
    state: Any
    checkpoint: Any
    writer: Any
    work_dir: str
    output_uri: str
    vocab_size: int
    grid_shape: list
    train_examples: int
    val_examples: int
    resumed_from: int
    timing: Timing
    log: Callable[[str], None]
    final: dict = dataclasses.field(default_factory=dict)
    precision: Any = None   # precision.Precision: the policy used and why
    best_path: str = ""
    metric: str = ""
    history: list | None = None
    extra: dict = dataclasses.field(default_factory=dict)

    def best_file(self) -> str:
        return self.best_path or os.path.join(self.work_dir, schema.BEST_MODEL_FILE)

    def metric_name(self) -> str:
        return self.metric or self.config.train.early_stopping_metric

    def epoch_rows(self) -> list:
        if self.history is not None:
            return list(self.history)
        return checkpointing.read_history(self.work_dir)


def export(run: TrainedRun) -> dict:
    """Writes the Model folder (chief) and returns the artifact's counts and properties.

    Args:
      run: the finished run.
    Returns:
      `{"model": {"counts": {...}, "properties": {...}}}`.
    """
    _write_files(run)
    properties = _properties(run)
    steps = properties["steps"]
    counts = {"train_examples": int(run.train_examples), "steps": steps,
              "val_examples": int(run.val_examples)}
    if run.role.is_chief:
        # No path: the output folder is renamed when the runner publishes it.
        best = properties["best_metric"]
        run.log(f"model written: {steps} steps"
                + (f", best {run.metric_name()} {best:.4f} at epoch "
                   f"{properties['best_epoch'] + 1}" if best is not None else ""))
    else:
        run.log(f"{run.role.task_type}:{run.role.task_id} done after {steps} steps "
                f"(weights {properties['weights_digest'][:12]})")
    return {"model": {"counts": counts, "properties": properties}}


def _write_files(run: TrainedRun) -> None:
    """model.keras and the final checkpoint (every worker); best.keras, logs, config (chief)."""
    import tensorflow as tf
    chief = run.role.is_chief
    out_dir = run.output_uri if chief else distribute.write_dir(
        os.path.join(run.work_dir, "model"), run.role)
    os.makedirs(out_dir, exist_ok=True)
    model_path = os.path.join(out_dir, schema.MODEL_FILE)
    checkpointing.atomic_save(run.model, model_path)
    manager = tf.train.CheckpointManager(
        run.checkpoint, os.path.join(out_dir, schema.CHECKPOINTS_DIR), max_to_keep=1)
    manager.save(checkpoint_number=int(run.state.step.numpy()))
    if not chief:
        distribute.cleanup(out_dir, run.role)
        return
    best_path = run.best_file()
    # Without a validation split the final weights are the best known.
    shutil.copy2(best_path if os.path.exists(best_path) else model_path,
                 os.path.join(out_dir, schema.BEST_MODEL_FILE))
    run.writer.close()
    logs_dir = os.path.join(run.work_dir, schema.LOGS_DIR)
    if os.path.isdir(logs_dir):
        shutil.copytree(logs_dir, os.path.join(out_dir, schema.LOGS_DIR), dirs_exist_ok=True)
    else:
        os.makedirs(os.path.join(out_dir, schema.LOGS_DIR), exist_ok=True)
    # The epochs' validation (train.init_model=<this folder> checks convergence on it).
    with open(os.path.join(out_dir, checkpointing.HISTORY), "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in run.epoch_rows())
    tcfg, mcfg = run.config.train, run.config.model
    with open(os.path.join(out_dir, schema.MODEL_CONFIG_FILE), "w") as f:
        json.dump({"model": dataclasses.asdict(mcfg), "vocab_size": run.vocab_size,
                   schema.GRID_SHAPE: list(run.grid_shape),
                   "mixed_precision": tcfg.mixed_precision}, f, indent=2, sort_keys=True)


def _precision_properties(run: TrainedRun) -> dict:
    """`mixed_precision` (the policy used) and, when known, what was asked and why."""
    if run.precision is None:
        return {"mixed_precision": run.config.train.mixed_precision}
    return run.precision.as_properties()


def _properties(run: TrainedRun) -> dict:
    """The Model artifact's properties (see `train`)."""
    tcfg, mcfg = run.config.train, run.config.model
    state, timing, role = run.state, run.timing, run.role
    best_metric = float(state.best_metric.numpy())
    steps = int(state.step.numpy())
    step_seconds = timing.step_seconds
    properties: dict[str, Any] = {
        "steps": steps,
        "examples_seen": steps * tcfg.batch_size,
        "wall_seconds": round(time.time() - timing.started, 2),
        "train_seconds_total": round(float(state.train_seconds.numpy()), 2),
        "best_metric": None if math.isnan(best_metric) else best_metric,
        "best_metric_name": run.metric_name(),
        "objective": tcfg.objective,
        "best_epoch": int(state.best_epoch.numpy()),
        "epochs": int(state.epoch.numpy()),
        "vocab_size": int(run.vocab_size),
        schema.GRID_SHAPE: [int(v) for v in run.grid_shape],
        "attention": mcfg.attention,
        "strategy": tcfg.strategy,
        "replicas": int(run.strategy.num_replicas_in_sync),
        "workers": role.num_workers,
        "is_chief": role.is_chief,
        "resumed_from_step": run.resumed_from,
        "examples_per_second": (round(timing.examples / step_seconds, 2)
                                if step_seconds else None),
        "input_wait_fraction": (round(timing.wait_seconds / step_seconds, 4)
                                if step_seconds else None),
        "final_loss": run.final.get("loss"),
        "history": run.epoch_rows() if role.is_chief else [],
        **_precision_properties(run),
        "weights_digest": checkpointing.weights_digest(run.model),
    }
    if mcfg.attention in ("hard", "glimpse"):
        properties["baseline"] = scalar_value(run.model.reward_baseline)
    if run.model.located:
        properties["guard_rate"] = run.model.guard_rate()
    properties.update(run.extra)
    return properties
