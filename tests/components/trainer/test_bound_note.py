"""The Trainer says when its bound, not its metric, ended training.

A run that stops at `train.epochs` (`train.scst_epochs`, `train.max_steps`)
while its last validated epoch was still its best logs one line naming the
key to raise; early stopping, or a bound reached after the metric levelled
off, logs none. The loop's best-model rule and note are driven on a loop
with only the state they read (no model, no data), then once on a real run.
"""
from __future__ import annotations

import os

from components import trainer
from components.trainer import checkpointing
from components.trainer.loop import TrainingLoop
from components.trainer.phase import Phase
from pipeline.config import ModelConfig, PipelineConfig, TrainConfig
from pipeline.runner import StageContext
from tests.components import trainer_worker


def _loop(metric="val_loss", epochs=30, max_steps=0, epochs_key="train.epochs",
          min_delta=1e-4) -> TrainingLoop:
    loop = object.__new__(TrainingLoop)   # only the state the best-model rule and note read
    loop.phase = Phase(name="xe", folder="", inputs=None, make_optimizer=lambda: None,
                       init_weights=lambda model, chief, say: None,
                       make_step=lambda *args: None, announce=(),
                       write_summaries=lambda *a, **k: None, progress="Trainer",
                       stopped="stopped", epochs=epochs, total_steps=1, metric=metric,
                       patience=3, first_candidate=lambda model: 0, epochs_key=epochs_key)
    loop.state, loop.validator, loop.selection_start = checkpointing.TrainState(), object(), 0
    loop.epochs, loop.metric, loop._last_gain = epochs, metric, None
    loop.tcfg = TrainConfig(epochs=epochs, max_steps=max_steps, min_delta=min_delta)
    loop._save_best = lambda: None
    return loop


def _epochs(loop: TrainingLoop, values) -> None:
    """Validates one epoch per value, as `_end_epoch` does."""
    for value in values:
        epoch = int(loop.state.epoch.numpy())
        loop.state.step.assign_add(1)
        loop._select_best(value, epoch)
        loop.state.epoch.assign_add(1)


def test_a_bound_reached_while_the_metric_improves_is_named():
    loop = _loop(epochs=3)
    _epochs(loop, [0.50, 0.40, 0.35])
    assert loop._bound_note("3 epochs") == (
        "stopped at train.epochs=3 while val_loss was still improving (-0.0500 in the last "
        "epoch); raise train.epochs")


def test_no_note_when_the_metric_had_levelled_off_or_early_stopping_ended_it():
    loop = _loop(epochs=4)
    _epochs(loop, [0.50, 0.40, 0.41, 0.42])
    assert loop._bound_note("4 epochs") == ""
    assert loop._bound_note("early stopping: val_loss did not improve for 3 epochs") == ""
    assert loop._bound_note("finished") == ""


def test_min_delta_decides_which_gains_count():
    # val_loss: relative to the best; bleu4 and cider: absolute.
    loose = _loop(min_delta=0.05)
    _epochs(loose, [1.00, 0.96, 0.90, 0.89])      # -4% does not count, -10% does, -1% does not
    assert int(loose.state.best_epoch.numpy()) == 2 and int(loose.state.bad_epochs.numpy()) == 1
    assert float(loose.state.best_metric.numpy()) == 0.90
    cider = _loop(metric="cider", min_delta=0.02)
    _epochs(cider, [0.50, 0.51, 0.53, 0.54])     # +0.01 no, +0.03 yes, +0.01 no
    assert int(cider.state.best_epoch.numpy()) == 2 and int(cider.state.bad_epochs.numpy()) == 1
    default = _loop()
    _epochs(default, [1.00, 0.99995, 0.9])         # below the default 1e-4 relative: no gain
    assert int(default.state.best_epoch.numpy()) == 2 and int(default.state.bad_epochs.numpy()) == 0


def test_scst_and_max_steps_name_their_own_keys():
    scst = _loop(metric="cider", epochs=2, epochs_key="train.scst_epochs")
    _epochs(scst, [0.80, 0.85])
    assert scst._bound_note("2 epochs") == (
        "stopped at train.scst_epochs=2 while cider was still improving (+0.0500 in the last "
        "epoch); raise train.scst_epochs")
    steps = _loop(epochs=30, max_steps=40)
    _epochs(steps, [0.5])
    assert steps._bound_note("max_steps=40") == (
        "stopped at train.max_steps=40 while val_loss was still improving; raise "
        "train.max_steps")     # one epoch: no earlier value to measure a gain from


def test_a_trainer_stopped_by_its_epochs_while_improving_logs_it(tmp_path, capfd):
    annotations, vocabulary = trainer_worker.write_tiny_artifacts(str(tmp_path / "source"))
    from components.contract.artifacts import Artifact
    config = PipelineConfig(
        model=ModelConfig(embedding_dim=8, hidden_dim=16, attention_dim=8, dropout=0.0),
        train=TrainConfig(batch_size=8, epochs=2, learning_rate=1e-2, checkpoint_every=100,
                          val_examples=4, log_every=100, shuffle_buffer=64, patience=10,
                          mixed_precision="float32"))
    out = tmp_path / "out" / "model"
    os.makedirs(out)
    ctx = StageContext(stage="Trainer", config=config,
                       inputs={"annotations": Artifact.load(annotations, "Annotations"),
                               "vocabulary": Artifact.load(vocabulary, "Vocabulary")},
                       outputs={"model": str(out)}, work_dir=str(tmp_path / "work"),
                       root=str(tmp_path), execution_id=1)
    props = trainer.run(ctx)["model"]["properties"]
    log = capfd.readouterr().err
    losses = [row["val_loss"] for row in props["history"]]
    assert props["best_epoch"] == 1 and losses[1] < losses[0], props["history"]
    assert (f"stopped at train.epochs=2 while val_loss was still improving "
            f"({losses[1] - losses[0]:+.4f} in the last epoch); raise train.epochs") in log
