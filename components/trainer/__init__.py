"""Trainer: Annotations + Vocabulary -> Model, with one custom `tf.distribute` training loop.

The same loop runs under every strategy (`train.strategy`: `default`,
`mirrored`, `multi_worker`) and for both attention kinds (Xu et al. 2015,
section 4). Keras 3's `model.fit` is not used because it fails under
`MultiWorkerMirroredStrategy` (keras#20585). Every `tf.function` here traces
with autograph off: the model's loops are explicit `tf.while_loop`s, and
autograph would re-read the model's source files at trace time.

One job per module:

| module | job |
|---|---|
| `stage` | the stage entry `run(ctx)` (no TensorFlow at import; may train in a child process) |
| `worker` | `python -m components.trainer`: multi-worker workers and child processes |
| `phases` | `train`: the run's setup, the cross-entropy phase, then SCST, then the export |
| `loop` | one phase: the epochs, validation, best model, early stopping, resume |
| `scst`, `scst_step` | the self-critical phase (`train.objective=scst`) and its step |
| `train_data` | the input pipeline: batches, length buckets, the cache, validation images |
| `distribute` | the `tf.distribute` strategies and the cluster role |
| `step` | the distributed step: loss re-weighting, all-reduce, clipping, update |
| `model_setup` | the model, learning-rate schedule and optimizer from the config |
| `validation` | validation loss, BLEU-4, attention maps, the best-model rule |
| `checkpointing` | loop state, checkpoints, atomic model saves, history, the work-folder lock |
| `sync` | the chief's values on every worker |
| `summaries` | TensorBoard summaries |
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
from components.trainer.stage import run
from components.trainer.worker import main

__all__ = ["run", "main"]
