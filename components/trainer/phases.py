"""The Trainer's orchestrator: the cross-entropy phase, then (`train.objective=scst`) the self-critical one.

`train` sets up the run (strategy, precision, work-folder lock, inputs),
runs `loop.TrainingLoop` for cross-entropy training (unless SCST starts from
`train.init_model`), hands its best model to `scst.run_scst`, and exports the
last phase's model. The phases never call each other: `loop` knows nothing
of SCST, and `scst` gets its start model and history from here.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Mapping

from components.contract import config as config_lib
from components.contract import precision as precision_lib
from components.contract import stage_log
from components.trainer import checkpointing, distribute
from components.trainer.export import export
from components.trainer.loop import LoopSetup, TrainingLoop, read_inputs


def train(annotations_uri: str, vocabulary_uri: str, config, output_uri: str,
          work_dir: str, *, annotations_properties: Mapping | None = None,
          vocabulary_properties: Mapping | None = None,
          log: Callable[[str], None] = stage_log.logger("Trainer")) -> dict:
    """Trains the captioner with the custom distributed loop and writes the Model folder.

    Args:
      annotations_uri: the Annotations artifact folder (`train/`, `val/` TFRecords).
      vocabulary_uri: the Vocabulary artifact folder (`vocab.txt`).
      config: the validated `PipelineConfig` (its `model` and `train` sections are used).
      output_uri: the Model folder to fill (the chief's; other workers of a
        multi-worker job write temporary folders and delete them).
      work_dir: checkpoints, logs and `best.keras` that survive a crash; a
        re-run with the same folder resumes.
      annotations_properties, vocabulary_properties: the artifacts'
        properties (`grid_shape`, `num_records`, `size`), read from the
        files when missing.
      log: one line of progress text.
    Returns:
      `{"model": {"counts": ..., "properties": ...}}`; properties carry
      `steps`, `examples_seen`, `wall_seconds`, `best_metric`, `best_epoch`,
      `vocab_size`, `grid_shape`, `attention`, `is_chief`, `history`, ...
    """
    started = time.time()
    # Before any other TF op: logical CPU devices and collective ops.
    strategy = distribute.make_strategy(config.train)
    chosen = precision_lib.resolve(config.train.mixed_precision)
    # From here on the config names the policy actually used.
    config = config_lib.replace_section(config, "train", mixed_precision=chosen.policy)
    role = (distribute.cluster_role() if distribute.is_multi_worker(strategy)
            else distribute.ClusterRole())
    import keras
    os.makedirs(work_dir, exist_ok=True)
    lock = checkpointing.lock_work_dir(work_dir) if role.is_chief else None
    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(config.train.mixed_precision)
    try:
        inputs = read_inputs(strategy, role, config, annotations_uri, vocabulary_uri,
                             annotations_properties=annotations_properties or {},
                             vocabulary_properties=vocabulary_properties or {})
        setup = LoopSetup(strategy, role, config, inputs, work_dir, log, started=started,
                          precision=chosen)
        return export(_run_phases(setup, annotations_uri, output_uri))
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)
        if lock is not None:
            lock.close()


def _run_phases(setup: LoopSetup, annotations_uri: str, output_uri: str):
    """Cross-entropy, then SCST when asked: the last phase's `TrainedRun`."""
    tcfg = setup.config.train
    if tcfg.objective == "scst" and tcfg.init_model:
        from components.trainer import scst
        from components.trainer.model_setup import start_file
        return scst.run_scst(setup, annotations_uri=annotations_uri, output_uri=output_uri,
                             start=start_file(tcfg.init_model),
                             history=scst.start_history(tcfg.init_model, setup.work_dir))
    loop = TrainingLoop(setup)
    stop_reason = loop.run()
    loop.say(f"stopped at step {int(loop.state.step.numpy())}: {stop_reason}")
    if tcfg.objective == "xe":
        return loop.trained_run(output_uri)
    from components.trainer import scst
    loop.release_inputs()
    start = loop.best_path
    if not os.path.exists(start) and setup.role.is_chief:  # no validation split: the final weights
        start = os.path.join(setup.work_dir, "xe_final.keras")
        checkpointing.atomic_save(loop.model, start)
    return scst.run_scst(setup, annotations_uri=annotations_uri, output_uri=output_uri,
                         start=start, history=checkpointing.read_history(setup.work_dir),
                         xe_stop_reason=stop_reason)
