"""Trainer: Annotations + Vocabulary -> Model, with one custom `tf.distribute` training loop.

The same loop runs under every strategy (`train.strategy`: `default`,
`mirrored`, `multi_worker`) and for both attention kinds (Xu et al. 2015,
section 4). Keras 3's `model.fit` is not used because it fails under
`MultiWorkerMirroredStrategy` (keras#20585). Every `tf.function` here traces
with autograph off: the model's loops are explicit `tf.while_loop`s, and
autograph would re-read the model's source files at trace time.

A training phase is a value, not a subclass: `phase.Phase` holds what the
phase computes (optimizer, start weights, step), what it logs (announcement,
step summaries) and when it stops (epochs, steps, metric, patience, best-model
candidates). The one `loop.TrainingLoop` runs any `Phase`; `phases` composes
the cross-entropy phase, then the self-critical one, each started from the
`Handoff` (best model, history) of the one before.

One job per module:

| module | job |
|---|---|
| `stage` | how the Trainer starts: the stage entry `run(ctx)` (no TensorFlow at import; may train in a child process) and `python -m components.trainer` (`main`: multi-worker workers, child processes) |
| `phases` | `train`: the run's setup, the phases composed (cross-entropy, then SCST), the export |
| `phase` | the values the loop runs on: `LoopSetup`, `Phase`, `Handoff`, `PhaseOutcome` |
| `loop` | the one `TrainingLoop`: a phase's epochs, validation, best model, early stopping, resume |
| `cross_entropy` | the cross-entropy phase as a `Phase` value |
| `scst` | the self-critical phase as a `Phase` value (`train.objective=scst`), and its start checks |
| `step` | the distributed cross-entropy step: loss re-weighting, all-reduce, clipping, update |
| `scst_step` | the distributed self-critical step: sampling, CIDEr-D reward, policy loss |
| `train_data` | the data: batches, length buckets, the cache, validation images, the run's sizes |
| `distribute` | the `tf.distribute` strategies, the cluster role, the chief's values on every worker |
| `model_setup` | the model, learning-rate schedule and optimizer from the config |
| `fused_adam` | `FusedAdam`: Adam with TensorFlow's fused update kernel |
| `validation` | validation loss, BLEU-4, CIDEr-D, attention maps, the best-model rule |
| `checkpointing` | loop state, checkpoints, atomic model saves, history, the work-folder lock |
| `summaries` | TensorBoard summaries of each phase |
| `timing` | throughput and input wait |
| `export` | the Model artifact's files and properties |

Fault tolerance: checkpoints (model, optimizer, step, epoch, step within the
epoch, early-stopping state; the REINFORCE baseline is a model weight) go to
the stage's work folder every `train.checkpoint_every` steps and at the end
of every epoch. A re-run after a crash or kill restores the latest one and
skips the batches of the epoch already trained ("resuming from step N").
TensorBoard logs and `best.keras` live there too, and are copied into the
`Model` artifact at the end. A lock file keeps a second trainer out of the
same folder, and a child trainer exits when its pipeline process dies.

Output (docs/ARTIFACTS.md): `model.keras` (final weights), `best.keras`
(best validation score), `checkpoints/` (the final checkpoint), `logs/`
(TensorBoard: loss terms, learning rate, gradient norm, attention entropy,
the REINFORCE baseline, throughput, validation metrics, attention maps of
two validation images), `model_config.json`.
"""
from components.trainer.stage import main, run

__all__ = ["run", "main"]
