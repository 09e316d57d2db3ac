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
from typing import Any

from components.contract import schema
from components.trainer import checkpointing, distribute
from components.trainer.averaging import averaged_weights
from components.trainer.phase import LoopSetup, PhaseOutcome
from components.trainer.summaries import scalar_value


@dataclasses.dataclass(frozen=True)
class TrainedRun:
    """What the export reads from a finished training run.

    Attributes:
      setup: the run's `phase.LoopSetup` (strategy, role, config, inputs,
        work folder, log, precision).
      outcome: the last phase's `phase.PhaseOutcome` (model, state,
        checkpoint, writer, timing, best model, history, properties).
      output_uri: the Model folder (the chief's).
    """
    setup: LoopSetup
    outcome: PhaseOutcome
    output_uri: str


def export(run: TrainedRun) -> dict:
    """Writes the Model folder (chief) and returns the artifact's counts and properties.

    Args:
      run: the finished run.
    Returns:
      `{"model": {"counts": {...}, "properties": {...}}}`.
    """
    setup, role = run.setup, run.setup.role
    _write_files(run)
    properties = _properties(run)
    steps = properties["steps"]
    counts = {"train_examples": int(setup.inputs.data.num_records), "steps": steps,
              "val_examples": len(setup.inputs.eval_set)}
    if role.is_chief:
        # No path: the output folder is renamed when the runner publishes it.
        best = properties["best_metric"]
        setup.log(f"model written: {steps} steps"
                  + (f", best {run.outcome.metric} {best:.4f} at epoch "
                     f"{properties['best_epoch'] + 1}" if best is not None else ""))
    else:
        setup.log(f"{role.task_type}:{role.task_id} done after {steps} steps "
                  f"(weights {properties['weights_digest'][:12]})")
    return {"model": {"counts": counts, "properties": properties}}


def _write_files(run: TrainedRun) -> None:
    """model.keras and the final checkpoint (every worker); best.keras, logs, config (chief)."""
    import tensorflow as tf
    setup, outcome = run.setup, run.outcome
    role, chief = setup.role, setup.role.is_chief
    out_dir = run.output_uri if chief else distribute.write_dir(
        os.path.join(setup.work_dir, "model"), role)
    os.makedirs(out_dir, exist_ok=True)
    model_path = os.path.join(out_dir, schema.MODEL_FILE)
    with averaged_weights(outcome.model, outcome.optimizer):  # the weight average, if kept
        checkpointing.atomic_save(outcome.model, model_path)
    manager = tf.train.CheckpointManager(
        outcome.checkpoint, os.path.join(out_dir, schema.CHECKPOINTS_DIR), max_to_keep=1)
    manager.save(checkpoint_number=int(outcome.state.step.numpy()))
    if not chief:
        distribute.cleanup(out_dir, role)
        return
    # Without a validation split the final weights are the best known.
    shutil.copy2(outcome.best_path if os.path.exists(outcome.best_path) else model_path,
                 os.path.join(out_dir, schema.BEST_MODEL_FILE))
    outcome.writer.close()
    logs_dir = os.path.join(setup.work_dir, schema.LOGS_DIR)
    if os.path.isdir(logs_dir):
        shutil.copytree(logs_dir, os.path.join(out_dir, schema.LOGS_DIR), dirs_exist_ok=True)
    else:
        os.makedirs(os.path.join(out_dir, schema.LOGS_DIR), exist_ok=True)
    # The epochs' validation (train.init_model=<this folder> checks convergence on it).
    with open(os.path.join(out_dir, checkpointing.HISTORY), "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in outcome.history)
    tcfg, mcfg = setup.config.train, setup.config.model
    with open(os.path.join(out_dir, schema.MODEL_CONFIG_FILE), "w") as f:
        json.dump({"model": dataclasses.asdict(mcfg), "vocab_size": setup.inputs.vocab_size,
                   schema.GRID_SHAPE: list(setup.inputs.grid_shape),
                   "mixed_precision": tcfg.mixed_precision}, f, indent=2, sort_keys=True)


def _properties(run: TrainedRun) -> dict:
    """The Model artifact's properties (see `phases.train`)."""
    setup, outcome = run.setup, run.outcome
    tcfg, mcfg = setup.config.train, setup.config.model
    state, timing, role, model = outcome.state, outcome.timing, setup.role, outcome.model
    best_metric = float(state.best_metric.numpy())
    steps = int(state.step.numpy())
    step_seconds = timing.step_seconds
    properties: dict[str, Any] = {
        "steps": steps,
        "examples_seen": steps * tcfg.batch_size,
        "wall_seconds": round(time.time() - timing.started, 2),
        "train_seconds_total": round(float(state.train_seconds.numpy()), 2),
        "best_metric": None if math.isnan(best_metric) else best_metric,
        "best_metric_name": outcome.metric,
        "objective": tcfg.objective,
        "best_epoch": int(state.best_epoch.numpy()),
        "epochs": int(state.epoch.numpy()),
        "vocab_size": int(setup.inputs.vocab_size),
        schema.GRID_SHAPE: [int(v) for v in setup.inputs.grid_shape],
        "attention": mcfg.attention,
        "strategy": tcfg.strategy,
        "replicas": int(setup.strategy.num_replicas_in_sync),
        "workers": role.num_workers,
        "is_chief": role.is_chief,
        "resumed_from_step": outcome.resumed_from,
        "examples_per_second": (round(timing.examples / step_seconds, 2)
                                if step_seconds else None),
        "input_wait_fraction": (round(timing.wait_seconds / step_seconds, 4)
                                if step_seconds else None),
        "final_loss": outcome.final.get("loss"),
        "history": list(outcome.history) if role.is_chief else [],
        **setup.precision.as_properties(),
        "weights_digest": checkpointing.weights_digest(model),
    }
    if mcfg.attention in ("hard", "glimpse"):
        properties["baseline"] = scalar_value(model.reward_baseline)
    if model.located:
        properties["guard_rate"] = model.guard_rate()
    properties.update(outcome.properties)
    return properties
