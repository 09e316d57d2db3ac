"""Trainer: Annotations + Vocabulary -> Model, with one custom `tf.distribute` training loop.

The same loop runs under every strategy (`train.strategy`: `default`,
`mirrored`, `multi_worker`) and for both attention kinds (Xu et al. 2015,
section 4): `strategy.run` of a `tf.function` step on batches from
`distribute_datasets_from_function` (components/train_data.py). Keras 3's
`model.fit` is not used because it fails under `MultiWorkerMirroredStrategy`
(keras#20585). Every `tf.function` here traces with autograph off: the
model's loops are explicit `tf.while_loop`s, and autograph would re-read the
model's source files at trace time.

Per step, on every replica: the model's loss terms (`compute_loss_terms`),
re-weighted so that the token terms are means over the GLOBAL number of
target tokens and the attention penalty a mean over the GLOBAL batch (the
sum over replicas is then exactly the single-device loss of the global
batch); gradients are summed over replicas, clipped by their global norm
(`train.clip_norm`) and applied; the hard-attention REINFORCE baseline moves
with the mean reward of all replicas.

Fault tolerance: `tf.train.CheckpointManager` checkpoints (model, optimizer,
step, epoch, step within the epoch, early-stopping state; the baseline is a
model weight) go to `ctx.work_dir` every `train.checkpoint_every` steps and at
the end of every epoch. A re-run after a crash or kill restores the latest
one and skips the batches of the epoch already trained ("resuming from step
N"). TensorBoard logs and `best.keras` live there too, and are copied into
the `Model` artifact at the end. A lock file keeps a second trainer out of
the same folder, and a child trainer exits when its pipeline process dies.

Process model: `mirrored` over logical CPU devices and `multi_worker` need
settings made before TensorFlow runs its first op; when an earlier stage of
the same pipeline process already started TensorFlow, `run` trains in a
child process (`python -m components.trainer`) instead. Under `multi_worker`
only the chief runs the pipeline stage and publishes the artifact; the other
workers run `python -m components.trainer` (docs/multi_worker.md), save into
temporary folders and delete them.

Output (docs/ARTIFACTS.md): `model.keras` (final weights), `best.keras`
(best validation score), `checkpoints/` (the final checkpoint), `logs/`
(TensorBoard: loss terms, learning rate, gradient norm, attention entropy,
the REINFORCE baseline, throughput, validation metrics, attention maps of
two validation images), `model_config.json`. Summaries go through
`tf.summary.write` with TensorBoard's plugin metadata, so writing them does
not need the `tensorboard` package.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Mapping

import numpy as np

from components import distribute

LOG = "[Trainer]"
CHECKPOINTS = "checkpoints"
LOGS = "logs"
HISTORY = "history.jsonl"
METRICS = ("val_loss", "bleu4")
# Validation images whose attention maps go to TensorBoard.
ATTENTION_IMAGES = 2
ATTENTION_TILE = 64
# Epochs chained into one input dataset (building one costs ~0.15 s).
EPOCHS_PER_DATASET = 8
# Smallest validation improvement that resets the early-stopping patience.
MIN_DELTA = 1e-4


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- inputs


def read_vocabulary(vocabulary_uri: str) -> list[str]:
    """The tokens of `<vocabulary>/vocab.txt`; a token's id is its line number."""
    import tensorflow as tf
    with tf.io.gfile.GFile(os.path.join(vocabulary_uri, "vocab.txt")) as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def vocabulary_size(vocabulary_uri: str, properties: Mapping | None = None) -> int:
    """`properties["size"]` of the Vocabulary artifact, or the lines of `vocab.txt`."""
    if properties and properties.get("size"):
        return int(properties["size"])
    return len(read_vocabulary(vocabulary_uri))


def annotations_grid_shape(annotations_uri: str, properties: Mapping | None = None) -> list[int]:
    """`[H, W, D]` from the artifact's properties or the first train record."""
    if properties and properties.get("grid_shape"):
        return [int(v) for v in properties["grid_shape"]]
    import tensorflow as tf
    from components import train_data
    files = train_data.split_files(annotations_uri, "train")
    for record in tf.data.TFRecordDataset(files[:1]).take(1):
        ex = tf.io.parse_single_example(
            record, {"grid_shape": tf.io.FixedLenFeature([3], tf.int64)})
        return [int(v) for v in ex["grid_shape"].numpy()]
    raise RuntimeError(f"{annotations_uri} has no train records")


# ----------------------------------------------------------------------------- model


def build_model(model_config, vocab_size: int, grid_shape, seed: int | None = None,
                steps_per_epoch: int = 0):
    """A built `ShowAttendTell` from the `ModelConfig` fields (in the current dtype policy).

    Args:
      model_config: `components.config.ModelConfig`.
      vocab_size: tokens in the vocabulary, reserved ones included.
      grid_shape: `[H, W, D]` of the annotations.
      seed: seeds the model's sampler, dropout and coin flips.
      steps_per_epoch: turns `expected_alpha_warmup_epochs` into the model's
        minibatch count, so the warmup keeps its meaning at any data size.
    """
    from models.show_attend_tell import ShowAttendTell
    h, w, d = (int(v) for v in grid_shape)
    kwargs = dataclasses.asdict(model_config)
    warmup_epochs = kwargs.pop("expected_alpha_warmup_epochs")
    kwargs["expected_alpha_warmup"] = round(warmup_epochs * steps_per_epoch)
    model = ShowAttendTell(vocab_size, seed=seed, **kwargs)
    model.build((None, h * w, d))
    return model


def learning_rate_schedule(train_config, total_steps: int):
    """`train.learning_rate` constant or cosine-decayed to 0, after `warmup_steps` linear warmup."""
    import keras
    cfg = train_config
    if cfg.lr_schedule not in ("constant", "cosine"):
        raise ValueError(f"train.lr_schedule must be constant or cosine, got {cfg.lr_schedule!r}")
    if cfg.lr_schedule == "constant" and cfg.warmup_steps <= 0:
        return cfg.learning_rate
    warmup = max(0, cfg.warmup_steps)
    decay_steps = max(1, total_steps - warmup)
    # alpha = 1: the "decayed" rate stays at the peak, i.e. warmup then constant.
    alpha = 1.0 if cfg.lr_schedule == "constant" else 0.0
    if warmup:
        return keras.optimizers.schedules.CosineDecay(
            0.0, decay_steps, alpha=alpha, warmup_target=cfg.learning_rate,
            warmup_steps=warmup)
    return keras.optimizers.schedules.CosineDecay(cfg.learning_rate, decay_steps, alpha=alpha)


def make_optimizer(train_config, total_steps: int):
    """Adam or RMSProp (paper section 4.3) on the schedule; loss scaling for mixed_float16."""
    import keras
    lr = learning_rate_schedule(train_config, total_steps)
    if train_config.optimizer == "adam":
        optimizer = keras.optimizers.Adam(lr)
    elif train_config.optimizer == "rmsprop":
        optimizer = keras.optimizers.RMSprop(lr)
    else:
        raise ValueError(f"train.optimizer must be adam or rmsprop, got {train_config.optimizer!r}")
    if train_config.mixed_precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


# ----------------------------------------------------------------------------- the step


SUM_KEYS = ("loss", "nll_sum", "num_tokens", "penalty_sum", "entropy_sum", "examples")
MEAN_KEYS = ("grad_norm", "baseline", "reward", "reinforce_term", "used_expected_alpha",
             "loss_scale")


def make_train_step(strategy, model, optimizer, clip_norm: float, global_batch_size: int,
                    element_spec, jit_compile: bool = False) -> Callable:
    """The distributed training step: `step(per_replica_batch) -> dict of float scalars`.

    On each replica: loss terms from `model.compute_loss_terms`; the token
    terms are re-weighted by `local tokens / global tokens` and the batch-mean
    attention penalty by `local batch / global batch`, so the replicas' losses
    sum to the loss of the global batch. Gradients are summed over replicas,
    clipped by their global norm, then applied. (Keras' own `global_clipnorm`
    would clip each replica's partial gradient before its all-reduce, which
    is not the norm of the global gradient; with `clip_norm <= 0` the
    gradients go straight to Keras' all-reduce.)

    Args:
      strategy: the `tf.distribute.Strategy` the model was built under.
      model: a built `ShowAttendTell`.
      optimizer: a Keras optimizer (maybe a `LossScaleOptimizer`) built on
        `model.trainable_variables`.
      clip_norm: global-norm clipping (<= 0: off).
      global_batch_size: examples per step over all replicas.
      element_spec: the distributed dataset's `element_spec` (one trace).
      jit_compile: XLA-compile the forward and backward pass of each replica.
    Returns:
      A `tf.function`; its result holds `SUM_KEYS` summed and `MEAN_KEYS`
      averaged over replicas.
    """
    import keras
    import tensorflow as tf
    from models.text import PAD_ID

    variables = model.trainable_variables
    replicas = strategy.num_replicas_in_sync
    hard = model.attention == "hard"
    loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    summed_here = replicas > 1 and clip_norm > 0
    SUM = tf.distribute.ReduceOp.SUM

    def gradients(annotations, tokens, global_tokens):
        with tf.GradientTape() as tape:
            terms = model.compute_loss_terms(annotations, tokens, training=True,
                                             update_baseline=False)
            local_tokens = tf.maximum(terms["num_tokens"], 1.0)
            local_batch = tf.cast(tf.shape(tokens)[0], tf.float32)
            token_part = terms["loss"] - terms["attention_penalty"]
            loss = (token_part * (local_tokens / tf.maximum(global_tokens, 1.0))
                    + terms["attention_penalty"] * (local_batch / global_batch_size))
            scaled = optimizer.scale_loss(loss) if loss_scaled else loss
        grads = tape.gradient(scaled, variables)
        grads = [tf.convert_to_tensor(g) if g is not None else tf.zeros_like(v)
                 for g, v in zip(grads, variables)]
        out = {"loss": loss, "nll_sum": tf.reduce_sum(terms["example_nll"]),
               "num_tokens": terms["num_tokens"],
               "penalty_sum": tf.reduce_sum(terms["example_penalty"]),
               "entropy_sum": terms["attention_entropy"] * local_tokens,
               "examples": local_batch}
        for key in ("baseline", "reward", "reinforce_term", "used_expected_alpha"):
            out[key] = terms[key] if key in terms else tf.zeros((), tf.float32)
        return grads, out

    if jit_compile:
        gradients = tf.function(gradients, jit_compile=True, autograph=False)

    def replica_step(batch):
        ctx = tf.distribute.get_replica_context()
        tokens = tf.cast(batch["tokens"], tf.int32)
        local_tokens = tf.reduce_sum(tf.cast(tf.not_equal(tokens[:, 1:], PAD_ID), tf.float32))
        global_tokens = ctx.all_reduce(SUM, local_tokens) if replicas > 1 else local_tokens
        grads, out = gradients(batch["annotations"], tokens, global_tokens)
        if hard:
            # Mean-aggregated variables: every replica ends with the mean update.
            model.update_baseline(out["reward"], skip=out["used_expected_alpha"] > 0.5)
        scale = tf.cast(optimizer.dynamic_scale, tf.float32) if loss_scaled else None
        if summed_here:
            grads = ctx.all_reduce(SUM, grads)
        if scale is not None:
            grads = [g / tf.cast(scale, g.dtype) for g in grads]
        if clip_norm > 0:
            grads, norm = tf.clip_by_global_norm(grads, clip_norm)
        else:
            norm = tf.linalg.global_norm(grads)
        if scale is not None:  # the LossScaleOptimizer unscales (and checks) them again
            grads = [g * tf.cast(scale, g.dtype) for g in grads]
        if summed_here:
            # Keras' apply_gradients sums over the replicas once more (a second,
            # cheap all-reduce of identical values): pre-divide. Exact for 2^k replicas.
            grads = [g / replicas for g in grads]
        optimizer.apply_gradients(zip(grads, variables))
        out["grad_norm"] = tf.cast(norm, tf.float32)
        out["loss_scale"] = scale if scale is not None else tf.ones((), tf.float32)
        return (tf.stack([tf.cast(out[k], tf.float32) for k in SUM_KEYS]),
                tf.stack([tf.cast(out[k], tf.float32) for k in MEAN_KEYS]))

    @tf.function(input_signature=[element_spec], autograph=False)
    def step(batch):
        sums, means = strategy.run(replica_step, args=(batch,))
        sums = strategy.reduce(SUM, sums, axis=None)
        means = strategy.reduce(tf.distribute.ReduceOp.MEAN, means, axis=None)
        out = {k: sums[i] for i, k in enumerate(SUM_KEYS)}
        out.update({k: means[i] for i, k in enumerate(MEAN_KEYS)})
        return out

    return step


# ----------------------------------------------------------------------------- validation


class Validator:
    """Validation metrics on a held-in-memory `EvalSet` (the chief computes them).

    `val_loss`: per-token NLL of every (image, reference caption) pair, no
    dropout, expected attention. `bleu4`: corpus BLEU-4 (coco-caption
    `Bleu`, whitespace tokens) of greedy captions against all references.
    """

    def __init__(self, model, eval_set, id_to_word, batch_size: int = 128):
        import tensorflow as tf
        from models.decoding import greedy_decode
        self.model = model
        self.eval_set = eval_set
        self.id_to_word = list(id_to_word)
        self.batch_size = max(1, batch_size)
        self.pair_index, self.pair_tokens = eval_set.pairs()
        # Longest reference (words + <end>) plus slack.
        self.max_length = int(max(self.pair_tokens.shape[1] - 1, 1)) + 2

        regions, dim = eval_set.annotations.shape[1:]
        grids = tf.TensorSpec([None, regions, dim], tf.float32)

        @tf.function(input_signature=[grids, tf.TensorSpec([None, None], tf.int32)],
                     autograph=False)
        def loss_sums(annotations, tokens):
            terms = model.compute_loss_terms(annotations, tokens, training=False)
            return tf.reduce_sum(terms["example_nll"]), terms["num_tokens"]

        @tf.function(input_signature=[grids], autograph=False)
        def decode(annotations):
            return greedy_decode(model, annotations, self.max_length)

        self._loss_sums, self._decode = loss_sums, decode

    def val_loss(self) -> float:
        """Per-token negative log-likelihood over every reference caption."""
        nll, tokens = 0.0, 0.0
        grids = self.eval_set.annotations
        for start in range(0, len(self.pair_index), self.batch_size):
            rows = slice(start, start + self.batch_size)
            s, n = self._loss_sums(grids[self.pair_index[rows]], self.pair_tokens[rows])
            nll += float(s)
            tokens += float(n)
        return nll / max(tokens, 1.0)

    def greedy(self, annotations) -> dict:
        return {k: v.numpy() for k, v in self._decode(annotations).items()}

    def captions(self) -> list[str]:
        """Greedy captions of every validation image."""
        from models.text import decode
        out = []
        grids = self.eval_set.annotations
        for start in range(0, len(grids), self.batch_size):
            result = self.greedy(grids[start:start + self.batch_size])
            out += [decode(row, self.id_to_word) for row in result["tokens"]]
        return out

    def bleu4(self) -> float:
        """Corpus BLEU-4 of greedy captions (whitespace tokenization, no Java)."""
        from pycocoevalcap.bleu.bleu import Bleu
        hyps = self.captions()
        gts = {i: list(refs) for i, refs in enumerate(self.eval_set.references)}
        res = {i: [h if h else "<unk>"] for i, h in enumerate(hyps)}
        score, _ = Bleu(4).compute_score(gts, res, verbose=0)
        return float(score[3])

    def attention_images(self, grid_shape, count: int = ATTENTION_IMAGES):
        """[(caption, (1, tile, tile * words, 1) float32 image)] for the first images.

        Each word's alpha is reshaped to H x W, scaled to its maximum and
        upsampled (nearest) to a tile; the tiles of a caption form one strip.
        """
        import tensorflow as tf
        from models.text import decode
        h, w, _ = (int(v) for v in grid_shape)
        grids = self.eval_set.annotations[:count]
        if len(grids) == 0:
            return []
        result = self.greedy(grids)
        images = []
        for row in range(len(grids)):
            n = max(int(result["lengths"][row]), 1)
            alpha = result["attention"][row, :n].reshape(n, h, w, 1)
            alpha = alpha / np.maximum(alpha.max(axis=(1, 2, 3), keepdims=True), 1e-9)
            tiles = tf.image.resize(alpha, (ATTENTION_TILE, ATTENTION_TILE), method="nearest")
            strip = tf.concat(tf.unstack(tiles), axis=1)[None]   # (1, tile, tile * n, 1)
            images.append((decode(result["tokens"][row], self.id_to_word), strip))
        return images


# ----------------------------------------------------------------------------- helpers


def _atomic_save(model, path: str) -> None:
    """Saves a `.keras` file next to `path`, then renames it into place."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".tmp-{os.getpid()}-{name}")
    model.save(tmp)
    os.replace(tmp, path)


def _read_history(path: str) -> list[dict]:
    """Epoch records, the last one per epoch (a killed run may have written one twice)."""
    if not os.path.exists(path):
        return []
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a kill
                    continue
                rows[row["epoch"]] = row
    return [rows[k] for k in sorted(rows)]


def weights_digest(model) -> str:
    """sha256 of every weight's bytes: equal digests mean bit-identical models (workers in sync)."""
    import hashlib
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()


def _improved(metric: str, value: float, best: float) -> bool:
    """Better by more than `MIN_DELTA` (relative for the loss, absolute for BLEU)."""
    if math.isnan(best):
        return True
    if metric == "val_loss":
        return value < best - MIN_DELTA * abs(best)
    return value > best + MIN_DELTA


def _broadcast_from_chief(strategy, variables) -> None:
    """Gives every worker the chief's values (after the chief alone restored a checkpoint).

    Values travel as float64 through one all-reduce to which only global
    replica 0 (the chief's first device) contributes: exact for float32/16,
    int64 steps below 2^53 and the uint32 seed-generator states.
    """
    import tensorflow as tf
    tensors = [v if isinstance(v, tf.Variable) else v.value for v in variables]

    def fn():
        ctx = tf.distribute.get_replica_context()
        first = tf.cast(tf.equal(ctx.replica_id_in_sync_group, 0), tf.float64)
        vals = [tf.cast(tf.convert_to_tensor(t), tf.float64) * first for t in tensors]
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, vals)

    reduced = strategy.run(tf.function(fn, autograph=False))
    for var, value in zip(tensors, reduced):
        local = strategy.experimental_local_results(value)[0]
        var.assign(tf.cast(local, var.dtype))


def _chief_values(strategy, values: Mapping[str, float]) -> dict:
    """The chief's `values` on every worker (one all-reduce; see `_broadcast_from_chief`)."""
    import tensorflow as tf
    names = sorted(values)
    vector = tf.constant([values[k] for k in names], tf.float64)

    def fn():
        ctx = tf.distribute.get_replica_context()
        return vector * tf.cast(tf.equal(ctx.replica_id_in_sync_group, 0), tf.float64)

    per_replica = strategy.run(tf.function(fn, autograph=False))
    reduced = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
    return {k: float(v) for k, v in zip(names, reduced.numpy())}


class _State:
    """Training-loop counters saved in every checkpoint (plain variables)."""

    def __init__(self):
        import tensorflow as tf
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.step_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name="step_in_epoch")
        self.best_metric = tf.Variable(float("nan"), dtype=tf.float64, trainable=False,
                                       name="best_metric")
        self.best_epoch = tf.Variable(-1, dtype=tf.int64, trainable=False, name="best_epoch")
        self.bad_epochs = tf.Variable(0, dtype=tf.int64, trainable=False, name="bad_epochs")
        self.finished = tf.Variable(0, dtype=tf.int64, trainable=False, name="finished")
        self.train_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False,
                                         name="train_seconds")

    def variables(self) -> dict:
        return {k: v for k, v in vars(self).items()}


# ----------------------------------------------------------------------------- training


def train(annotations_uri: str, vocabulary_uri: str, config, output_uri: str,
          work_dir: str, *, annotations_properties: Mapping | None = None,
          vocabulary_properties: Mapping | None = None,
          log: Callable[[str], None] = _log) -> dict:
    """Trains the captioner with the custom distributed loop and writes the Model folder.

    Args:
      annotations_uri: the Annotations artifact folder (`train/`, `val/` TFRecords).
      vocabulary_uri: the Vocabulary artifact folder (`vocab.txt`).
      config: the `PipelineConfig` (its `model` and `train` sections are used).
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
    tcfg = config.train
    if tcfg.early_stopping_metric not in METRICS:
        raise ValueError(f"train.early_stopping_metric must be one of {METRICS}, "
                         f"got {tcfg.early_stopping_metric!r}")
    if tcfg.mixed_precision not in ("float32", "mixed_float16", "mixed_bfloat16"):
        raise ValueError("train.mixed_precision must be float32, mixed_float16 or "
                         f"mixed_bfloat16, got {tcfg.mixed_precision!r}")
    started = time.time()
    # Before any other TF op: logical CPU devices and collective ops.
    strategy = distribute.make_strategy(tcfg)
    role = (distribute.cluster_role() if distribute.is_multi_worker(strategy)
            else distribute.ClusterRole())
    import keras
    os.makedirs(work_dir, exist_ok=True)
    lock = _lock_work_dir(work_dir) if role.is_chief else None
    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(tcfg.mixed_precision)
    try:
        return _train(strategy, role, annotations_uri, vocabulary_uri, config, output_uri,
                      work_dir, annotations_properties or {}, vocabulary_properties or {},
                      log, started)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)
        if lock is not None:
            lock.close()


def _lock_work_dir(work_dir: str):
    """An exclusive lock on `<work_dir>/.lock` (released when the process dies).

    Raises:
      RuntimeError: another live process trains in the same folder.
    """
    import fcntl
    f = open(os.path.join(work_dir, ".lock"), "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        owner = f.read().strip() or "?"
        f.close()
        raise RuntimeError(f"another Trainer (pid {owner}) is training in {work_dir}; "
                           "wait for it or stop it") from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def _train(strategy, role, annotations_uri, vocabulary_uri, config, output_uri, work_dir,
           annotations_properties, vocabulary_properties, log, started) -> dict:
    import keras
    import tensorflow as tf
    from tqdm import tqdm
    from components import train_data

    tcfg, mcfg = config.train, config.model
    chief = role.is_chief
    say = log if chief else (lambda line: None)
    multi_worker = distribute.is_multi_worker(strategy)
    replicas = strategy.num_replicas_in_sync
    if tcfg.batch_size % replicas:
        raise ValueError(f"train.batch_size={tcfg.batch_size} must be a multiple of the "
                         f"{replicas} replicas of train.strategy={tcfg.strategy}")
    keras.utils.set_random_seed(tcfg.seed)

    vocab_size = vocabulary_size(vocabulary_uri, vocabulary_properties)
    id_to_word = read_vocabulary(vocabulary_uri)
    grid_shape = annotations_grid_shape(annotations_uri, annotations_properties)
    train_files = train_data.split_files(annotations_uri, "train")
    if not train_files:
        raise RuntimeError(f"{annotations_uri} has no train split (train/*.tfrecord)")
    num_records = (annotations_properties.get("num_records") or {}).get("train")
    compute_dtype = keras.mixed_precision.global_policy().compute_dtype
    data = train_data.TrainData(
        train_files, grid_shape, num_records=num_records, global_batch_size=tcfg.batch_size,
        seed=tcfg.seed, shuffle_buffer=tcfg.shuffle_buffer, cache=tcfg.cache,
        bucket_by_length=tcfg.bucket_by_length, dtype=compute_dtype,
        pad_multiple=8 if tcfg.jit_compile else 1)
    pipelines = role.num_workers if multi_worker else 1
    steps_per_epoch = data.steps_per_epoch(pipelines)
    if steps_per_epoch == 0:
        raise RuntimeError(f"the train split has {data.num_records} images, fewer than one "
                           f"global batch of {tcfg.batch_size} per worker: lower "
                           "train.batch_size")
    total_steps = steps_per_epoch * tcfg.epochs
    if tcfg.max_steps > 0:
        total_steps = min(total_steps, tcfg.max_steps)
    eval_set = train_data.load_eval_set(train_data.split_files(annotations_uri, "val"),
                                        grid_shape, tcfg.val_examples, id_to_word)
    if not chief:
        log(f"{LOG} {role.task_type}:{role.task_id} of {role.num_workers} workers: training "
            "with the chief; saves go to temporary folders")
    say(f"{LOG} strategy {tcfg.strategy} ({replicas} replica(s)"
        + (f", {role.num_workers} workers, task {role.task_type}:{role.task_id}"
           if multi_worker else "")
        + f"), {data.num_records} train images, {steps_per_epoch} steps/epoch x "
          f"{tcfg.epochs} epochs (at most {total_steps} steps), {len(eval_set)} val images, "
          f"attention {mcfg.attention}, vocabulary {vocab_size}, grid {grid_shape}, "
          f"{tcfg.mixed_precision}")

    with strategy.scope():
        model = build_model(mcfg, vocab_size, grid_shape, seed=tcfg.seed,
                            steps_per_epoch=steps_per_epoch)
        optimizer = make_optimizer(tcfg, total_steps)
        optimizer.build(model.trainable_variables)
    state = _State()
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, **state.variables())

    os.makedirs(work_dir, exist_ok=True)
    if chief:  # model files a killed attempt left half-written (see _atomic_save)
        for stale in glob.glob(os.path.join(glob.escape(work_dir), ".tmp-*.keras")):
            os.remove(stale)
    ckpt_dir = os.path.join(work_dir, CHECKPOINTS)
    my_ckpt_dir = distribute.write_dir(ckpt_dir, role)
    manager = tf.train.CheckpointManager(checkpoint, my_ckpt_dir,
                                         max_to_keep=max(1, tcfg.keep_checkpoints))
    resumed_from = 0
    if chief and manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        resumed_from = int(state.step.numpy())
        log(f"{LOG} resuming from step {resumed_from} (epoch {int(state.epoch.numpy())}, "
            f"step {int(state.step_in_epoch.numpy())} of it): {manager.latest_checkpoint}")
    if multi_worker:
        # Only the chief reads checkpoints; it hands its state to the others.
        _broadcast_from_chief(strategy, list(model.weights) + list(optimizer.variables)
                              + list(state.variables().values()))
        resumed_from = int(state.step.numpy())

    def save_checkpoint():
        manager.save(checkpoint_number=int(state.step.numpy()))
        if not chief:
            distribute.cleanup(my_ckpt_dir, role)

    logs_dir = os.path.join(work_dir, LOGS)
    writer = (tf.summary.create_file_writer(logs_dir) if chief
              else tf.summary.create_noop_writer())
    history_path = os.path.join(work_dir, HISTORY)
    validator = Validator(model, eval_set, id_to_word) if len(eval_set) else None
    metric_name = tcfg.early_stopping_metric
    best_path = os.path.join(work_dir, "best.keras")
    selection_start = (model.expected_alpha_warmup if model.attention == "hard" else 0)

    def validate() -> dict:
        names = ["val_loss"] + (["bleu4"] if metric_name == "bleu4" else [])
        if chief:
            metrics = {"val_loss": validator.val_loss()}
            if metric_name == "bleu4":
                metrics["bleu4"] = validator.bleu4()
        else:  # the chief's numbers decide; the weights are the same everywhere
            metrics = {k: 0.0 for k in names}
        if multi_worker:  # one early-stopping decision for all workers
            metrics = _chief_values(strategy, metrics)
        step = int(state.step.numpy())
        with writer.as_default():
            for k, v in metrics.items():
                summary_scalar(f"val/{k}", v, step)
            if chief:
                for i, (caption, image) in enumerate(validator.attention_images(grid_shape)):
                    summary_image(f"attention/val_{i}", image, step)
                    summary_text(f"attention/val_{i}_caption", caption, step)
        return metrics

    step_fn = iterator = None
    iterator_end = 0
    bar = tqdm(total=total_steps, initial=min(resumed_from, total_steps), unit="step",
               desc="Trainer", file=sys.stderr, mininterval=1.0, disable=not chief,
               dynamic_ncols=True)
    run_start = time.time()
    wait_seconds = step_seconds = 0.0
    run_examples = 0
    traced = False
    last = {}
    stop_reason = "finished" if int(state.finished.numpy()) else ""
    if stop_reason:
        say(f"{LOG} training finished in an earlier attempt; exporting its final state")
    try:
        while not stop_reason:
            epoch = int(state.epoch.numpy())
            if epoch >= tcfg.epochs:
                stop_reason = f"{tcfg.epochs} epochs"
                break
            if int(state.step.numpy()) >= total_steps:
                stop_reason = f"max_steps={tcfg.max_steps}"
                break
            if iterator is None or epoch >= iterator_end:
                # One dataset for the next few epochs: prefetching crosses their ends.
                skip = int(state.step_in_epoch.numpy())
                needed = -(-(total_steps - int(state.step.numpy()) + skip) // steps_per_epoch)
                group = max(1, min(EPOCHS_PER_DATASET, tcfg.epochs - epoch, needed))
                iterator_end = epoch + group
                dist = strategy.distribute_datasets_from_function(
                    lambda ctx, e=epoch, s=skip, n=group: data.dataset(e, ctx, skip_steps=s,
                                                                       epochs=n))
                if step_fn is None:
                    step_fn = make_train_step(strategy, model, optimizer, tcfg.clip_norm,
                                              tcfg.batch_size, dist.element_spec,
                                              jit_compile=tcfg.jit_compile)
                iterator = iter(dist)
            epoch_start = time.time()
            for _ in range(int(state.step_in_epoch.numpy()), steps_per_epoch):
                if int(state.step.numpy()) >= total_steps:
                    break
                t0 = time.time()
                batch = next(iterator)
                t1 = time.time()
                out = {k: float(v) for k, v in step_fn(batch).items()}
                t2 = time.time()
                if traced:  # the first call traces the step: not a throughput sample
                    wait_seconds += t1 - t0
                    step_seconds += t2 - t0
                    run_examples += tcfg.batch_size
                traced = True
                state.step.assign_add(1)
                state.step_in_epoch.assign_add(1)
                step = int(state.step.numpy())
                last = out
                # (Under mixed_float16 a non-finite step is skipped and the loss scale shrinks.)
                if not math.isfinite(out["loss"]) and tcfg.mixed_precision != "mixed_float16":
                    raise FloatingPointError(f"loss is {out['loss']} at step {step}: lower "
                                             "train.learning_rate or train.clip_norm")
                bar.update(1)
                throughput = run_examples / step_seconds if step_seconds else 0.0
                bar.set_postfix(loss=f"{out['loss']:.3f}", ex_s=f"{throughput:.0f}",
                                refresh=False)
                if step % max(1, tcfg.log_every) == 0 or step == 1:
                    _write_step_summaries(writer, step, out, optimizer, model, throughput,
                                          wait_seconds / max(step_seconds, 1e-9))
                if step % max(1, tcfg.checkpoint_every) == 0:
                    state.train_seconds.assign_add(time.time() - run_start)
                    run_start = time.time()
                    save_checkpoint()
            if int(state.step_in_epoch.numpy()) < steps_per_epoch:
                stop_reason = f"max_steps={tcfg.max_steps}"
                break  # max_steps inside the epoch: no validation of a partial epoch
            # End of the epoch: validation, best model, early stopping, checkpoint.
            row = {"epoch": epoch, "step": int(state.step.numpy()),
                   "seconds": round(time.time() - epoch_start, 2),
                   "train_loss": last.get("loss")}
            if validator is not None:
                metrics = validate()
                row.update(metrics)
                value = metrics[metric_name]
                # Hard attention's expected-alpha warmup trains a soft model: its
                # epochs are not candidates for the best (hard) model.
                in_warmup = int(state.step.numpy()) <= selection_start
                if in_warmup:
                    pass
                elif _improved(metric_name, value, float(state.best_metric.numpy())):
                    state.best_metric.assign(value)
                    state.best_epoch.assign(epoch)
                    state.bad_epochs.assign(0)
                    target = distribute.write_dir(best_path, role)
                    _atomic_save(model, target)
                    distribute.cleanup(target, role)
                else:
                    state.bad_epochs.assign_add(1)
                say(f"{LOG} epoch {epoch}: loss {row['train_loss'] or float('nan'):.4f}, "
                    + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
                    + (" (expected-alpha warmup: not a best-model candidate)" if in_warmup
                       else f" (best {metric_name} {float(state.best_metric.numpy()):.4f} "
                            f"at epoch {int(state.best_epoch.numpy())})"))
            if chief:
                with open(history_path, "a") as f:
                    f.write(json.dumps(row) + "\n")
            state.epoch.assign_add(1)
            state.step_in_epoch.assign(0)
            if validator is not None and int(state.bad_epochs.numpy()) >= tcfg.patience:
                stop_reason = (f"early stopping: {metric_name} did not improve for "
                               f"{tcfg.patience} epochs")
            state.train_seconds.assign_add(time.time() - run_start)
            run_start = time.time()
            if stop_reason:
                state.finished.assign(1)
            save_checkpoint()
        if not int(state.finished.numpy()):
            state.finished.assign(1)
            state.train_seconds.assign_add(time.time() - run_start)
            run_start = time.time()
            save_checkpoint()
    finally:
        bar.close()
        writer.flush()
    say(f"{LOG} stopped at step {int(state.step.numpy())}: {stop_reason}")
    return _export(strategy, role, model, state, checkpoint, writer, config,
                   output_uri, work_dir, vocab_size, grid_shape, data, eval_set, best_path,
                   resumed_from, run_examples, wait_seconds, step_seconds, last, started, log)


def _scalar_value(value) -> float:
    """A Python float from a tensor, a (distributed or Keras) variable or a number."""
    import tensorflow as tf
    if hasattr(value, "value") and not isinstance(value, tf.Variable):
        value = value.value  # a Keras variable
    return float(tf.convert_to_tensor(value).numpy())


def _summary_metadata(plugin: str):
    from tensorflow.core.framework import summary_pb2
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin))


def summary_scalar(tag: str, value, step: int) -> None:
    """A TensorBoard scalar through `tf.summary.write` (the `tensorboard` package is optional)."""
    import tensorflow as tf
    tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step,
                     metadata=_summary_metadata("scalars"))


def summary_image(tag: str, image, step: int) -> None:
    """A TensorBoard image from a (1, H, W, 1|3) float image in [0, 1] (PNG-encoded)."""
    import tensorflow as tf
    pixels = tf.cast(tf.round(tf.clip_by_value(image[0], 0.0, 1.0) * 255.0), tf.uint8)
    height, width = int(pixels.shape[0]), int(pixels.shape[1])
    tensor = tf.stack([tf.constant(str(width)), tf.constant(str(height)),
                       tf.image.encode_png(pixels)])
    tf.summary.write(tag, tensor, step=step, metadata=_summary_metadata("images"))


def summary_text(tag: str, text: str, step: int) -> None:
    """A TensorBoard text entry."""
    import tensorflow as tf
    tf.summary.write(tag, tf.constant(text), step=step, metadata=_summary_metadata("text"))


def _write_step_summaries(writer, step, out, optimizer, model, throughput, wait_fraction):
    tokens = max(out["num_tokens"], 1.0)
    values = {
        "train/loss": out["loss"],
        "train/nll": out["nll_sum"] / tokens,
        "train/attention_penalty": out["penalty_sum"] / max(out["examples"], 1.0),
        "train/attention_entropy": out["entropy_sum"] / tokens,
        "train/grad_norm": out["grad_norm"],
        "train/learning_rate": _scalar_value(optimizer.learning_rate),
        "train/examples_per_second": throughput,
        "train/input_wait_fraction": wait_fraction,
    }
    if model.attention == "hard":
        for key in ("baseline", "reward", "reinforce_term", "used_expected_alpha"):
            values[f"train/{key}"] = out[key]
    if out["loss_scale"] != 1.0:
        values["train/loss_scale"] = out["loss_scale"]
    with writer.as_default():
        for tag, value in values.items():
            summary_scalar(tag, value, step)


def _export(strategy, role, model, state, checkpoint, writer, config, output_uri,
            work_dir, vocab_size, grid_shape, data, eval_set, best_path, resumed_from,
            run_examples, wait_seconds, step_seconds, last, started, log) -> dict:
    """Writes model.keras, best.keras, checkpoints/, logs/, model_config.json (chief only)."""
    import tensorflow as tf
    tcfg, mcfg = config.train, config.model
    chief = role.is_chief
    out_dir = output_uri if chief else distribute.write_dir(
        os.path.join(work_dir, "model"), role)
    os.makedirs(out_dir, exist_ok=True)
    model_path = os.path.join(out_dir, "model.keras")
    _atomic_save(model, model_path)
    export_manager = tf.train.CheckpointManager(checkpoint, os.path.join(out_dir, CHECKPOINTS),
                                                max_to_keep=1)
    export_manager.save(checkpoint_number=int(state.step.numpy()))
    if chief:
        if os.path.exists(best_path):
            shutil.copy2(best_path, os.path.join(out_dir, "best.keras"))
        else:  # no validation split: the final weights are the best known
            shutil.copy2(model_path, os.path.join(out_dir, "best.keras"))
        writer.close()
        logs_dir = os.path.join(work_dir, LOGS)
        if os.path.isdir(logs_dir):
            shutil.copytree(logs_dir, os.path.join(out_dir, LOGS), dirs_exist_ok=True)
        else:
            os.makedirs(os.path.join(out_dir, LOGS), exist_ok=True)
        with open(os.path.join(out_dir, "model_config.json"), "w") as f:
            json.dump({"model": dataclasses.asdict(mcfg), "vocab_size": vocab_size,
                       "grid_shape": list(grid_shape),
                       "mixed_precision": tcfg.mixed_precision}, f, indent=2, sort_keys=True)
    else:
        distribute.cleanup(out_dir, role)
    best_metric = float(state.best_metric.numpy())
    steps = int(state.step.numpy())
    history = _read_history(os.path.join(work_dir, HISTORY)) if chief else []
    properties: dict[str, Any] = {
        "steps": steps,
        "examples_seen": steps * tcfg.batch_size,
        "wall_seconds": round(time.time() - started, 2),
        "train_seconds_total": round(float(state.train_seconds.numpy()), 2),
        "best_metric": None if math.isnan(best_metric) else best_metric,
        "best_metric_name": tcfg.early_stopping_metric,
        "best_epoch": int(state.best_epoch.numpy()),
        "epochs": int(state.epoch.numpy()),
        "vocab_size": int(vocab_size),
        "grid_shape": [int(v) for v in grid_shape],
        "attention": mcfg.attention,
        "strategy": tcfg.strategy,
        "replicas": int(strategy.num_replicas_in_sync),
        "workers": role.num_workers,
        "is_chief": chief,
        "resumed_from_step": resumed_from,
        "examples_per_second": round(run_examples / step_seconds, 2) if step_seconds else None,
        "input_wait_fraction": round(wait_seconds / step_seconds, 4) if step_seconds else None,
        "final_loss": last.get("loss"),
        "history": history,
        "mixed_precision": tcfg.mixed_precision,
        "weights_digest": weights_digest(model),
    }
    if mcfg.attention == "hard":
        properties["baseline"] = _scalar_value(model.reinforce_baseline)
    counts = {"train_examples": int(data.num_records), "steps": steps,
              "val_examples": len(eval_set)}
    if chief:
        log(f"{LOG} wrote {output_uri}: {steps} steps, best {tcfg.early_stopping_metric} "
            f"{properties['best_metric']} at epoch {properties['best_epoch']}")
    else:
        log(f"{LOG} {role.task_type}:{role.task_id} done after {steps} steps "
            f"(weights {properties['weights_digest'][:12]})")
    return {"model": {"counts": counts, "properties": properties}}


# ----------------------------------------------------------------------------- the stage


def _worker_command(ctx, config_path: str) -> str:
    return (f"TF_CONFIG='<this worker>' python -m components.trainer "
            f"--annotations {ctx.inputs['annotations'].uri} "
            f"--vocabulary {ctx.inputs['vocabulary'].uri} --config-json {config_path}")


def run(ctx) -> dict:
    """The Trainer stage: Annotations + Vocabulary -> Model (see the module docstring).

    Trains in this process, or in a child process when the strategy needs a
    fresh TensorFlow runtime (logical CPU devices, multi-worker collectives)
    and an earlier stage already started TensorFlow here.

    Returns:
      `{"model": {"counts": {...}, "properties": {...}}}`.
    """
    from components import config as config_lib
    tcfg = ctx.config.train
    annotations, vocabulary = ctx.inputs["annotations"], ctx.inputs["vocabulary"]
    out = ctx.outputs["model"]
    os.makedirs(ctx.work_dir, exist_ok=True)
    config_path = os.path.join(ctx.work_dir, "config.json")
    with open(config_path, "w") as f:
        json.dump(config_lib.to_dict(ctx.config), f, indent=2, sort_keys=True)
    if tcfg.strategy == "multi_worker":
        role = distribute.cluster_role()
        if not role.is_chief:
            raise distribute.StrategyError(
                f"this process is {role.task_type}:{role.task_id} of a multi_worker job; only "
                "the chief runs the Trainer stage and publishes the Model. Start this worker "
                "with: " + _worker_command(ctx, config_path))
        _log(f"{LOG} multi_worker chief: start every other worker with\n  "
             + _worker_command(ctx, config_path))
    if distribute.needs_fresh_process(tcfg):
        _log(f"{LOG} TensorFlow already runs in this process; training in a child process "
             f"(train.strategy={tcfg.strategy}, cpu_logical_devices={tcfg.cpu_logical_devices})")
        return _run_child(annotations, vocabulary, config_path, out, ctx.work_dir)
    return train(annotations.uri, vocabulary.uri, ctx.config, out, ctx.work_dir,
                 annotations_properties=annotations.properties,
                 vocabulary_properties=vocabulary.properties)


def _run_child(annotations, vocabulary, config_path, output_uri, work_dir) -> dict:
    """Runs `python -m components.trainer` and returns its result."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    fd, result_path = tempfile.mkstemp(prefix="trainer-result-", suffix=".json", dir=work_dir)
    os.close(fd)
    env = dict(os.environ)
    env["PYTHONPATH"] = package_root + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "components.trainer", "--annotations", annotations.uri,
           "--vocabulary", vocabulary.uri, "--config-json", config_path,
           "--output", output_uri, "--work-dir", work_dir, "--result", result_path,
           "--parent-pid", str(os.getpid())]
    proc = subprocess.Popen(cmd, env=env, cwd=package_root)
    try:
        code = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    try:
        if code != 0:
            raise RuntimeError(f"the Trainer child process failed with exit code {code} "
                               "(its messages are above)")
        with open(result_path) as f:
            return json.load(f)
    finally:
        os.remove(result_path)


def _exit_with_parent(parent_pid: int, interval: float = 1.0) -> None:
    """Ends this child process soon after its parent dies (a killed pipeline leaves no trainer)."""
    import threading

    def watch():
        while True:
            if os.getppid() != parent_pid:
                os._exit(3)
            time.sleep(interval)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv=None) -> int:
    """`python -m components.trainer`: train from artifact folders (workers, child processes).

    Every worker of a multi-worker job runs this with its own `TF_CONFIG`
    (the chief may run the pipeline's Trainer stage instead).
    """
    from components import config as config_lib
    from components.artifacts import Artifact, ArtifactError
    p = argparse.ArgumentParser(prog="python -m components.trainer", description=main.__doc__)
    p.add_argument("--annotations", required=True, help="Annotations artifact folder")
    p.add_argument("--vocabulary", required=True, help="Vocabulary artifact folder")
    p.add_argument("--config", default="", help="a config .py file (for a named config, "
                   "pass the JSON of `captioner config --config NAME` as --config-json)")
    p.add_argument("--config-json", default="", help="a resolved config (written by the stage)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    p.add_argument("--output", default="", help="Model folder (the chief's; default "
                   "<work-dir>/model)")
    p.add_argument("--work-dir", default="", help="checkpoints/logs folder (default: the "
                   "config JSON's folder, else ./trainer_work)")
    p.add_argument("--result", default="", help="write the result JSON here")
    p.add_argument("--parent-pid", type=int, default=0,
                   help="exit when this process (the pipeline's) is gone")
    args = p.parse_args(argv)
    if args.parent_pid:
        _exit_with_parent(args.parent_pid)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.config_json:
        with open(args.config_json) as f:
            config = config_lib.from_dict(json.load(f))
        config = config_lib.apply_overrides(config, args.overrides)
    elif args.config.endswith(".py"):
        config = config_lib.load_config_file(args.config, args.overrides)
    else:
        p.error("give --config-json (e.g. `captioner config --config tiny --set ... > "
                "config.json`) or --config PATH.py")
    work_dir = args.work_dir or (os.path.dirname(os.path.abspath(args.config_json))
                                 if args.config_json else os.path.abspath("trainer_work"))
    output = args.output or os.path.join(work_dir, "model")

    def props(uri):
        try:
            return dict(Artifact.load(uri).properties)
        except ArtifactError:
            return {}

    result = train(args.annotations, args.vocabulary, config, output, work_dir,
                   annotations_properties=props(args.annotations),
                   vocabulary_properties=props(args.vocabulary))
    if args.result:
        tmp = args.result + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, default=str)
        os.replace(tmp, args.result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
