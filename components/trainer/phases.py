"""The Trainer's orchestrator: sets up the run, composes its phases (cross-entropy, then SCST when asked), exports the last.

`train` sets up the run (strategy, precision, work-folder lock, inputs);
`_run_phases` runs each phase's `Phase` value (components/trainer/phase.py)
in the one `loop.TrainingLoop`: cross-entropy training
(components/trainer/cross_entropy.py; skipped when SCST starts from
`train.init_model`), then, for `train.objective=scst`, the self-critical
phase (components/trainer/scst.py) from the cross-entropy phase's `Handoff`
(its best model and history). The last phase's outcome is exported
(components/trainer/export.py). The phases never call each other.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Callable, Mapping

from components.contract import config as config_lib
from components.contract import precision as precision_lib
from components.contract import stage_log
from components.trainer import checkpointing, cross_entropy, distribute
from components.trainer.export import TrainedRun, export
from components.trainer.loop import TrainingLoop
from components.trainer.phase import LoopSetup


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
        from components.trainer.train_data import read_inputs
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


def _run_phases(setup: LoopSetup, annotations_uri: str, output_uri: str) -> TrainedRun:
    """Cross-entropy, then SCST when asked, each from the one before: the last phase's `TrainedRun`."""
    tcfg = setup.config.train
    phases = [cross_entropy.cross_entropy_phase]
    handoff = None
    if tcfg.objective == "scst":
        from components.trainer import scst
        phases.append(functools.partial(scst.scst_phase, annotations_uri=annotations_uri))
        if tcfg.init_model:  # from a cross-entropy Model trained elsewhere
            phases = phases[1:]
            handoff = scst.start_from_model(tcfg.init_model, setup.work_dir)
    for i, make_phase in enumerate(phases):
        loop = TrainingLoop(setup, make_phase(setup, handoff))
        stop_reason = loop.run()
        if i + 1 < len(phases):
            loop.release_inputs()
            handoff = loop.handoff(stop_reason)
    return TrainedRun(setup=setup, outcome=loop.outcome(), output_uri=output_uri)
