"""EncoderTrainer: the annotation CNN, trained on caption words when no ImageNet weights exist.

For `encoder.kind = small_cnn` with `encoder.train = true`, the small CNN is
trained as a multi-label word-presence classifier (which caption words occur
for an image) until its held-out mean average precision stops improving
(`StopRule`: no gain above `encoder.min_delta` for `encoder.patience`
epochs); the best epoch's weights are kept and its conv grid becomes the
annotation layer. `encoder.max_epochs` is a safety bound: a run that reaches
it while val mAP is still rising says so in its log and in the Encoder's
`stopped` property. For `keras_app` encoders the
stage only materializes the model (ImageNet weights, a local file, or none),
so that Preprocess and the Pusher share one saved encoder.

Training streams the images from the Examples TFRecords (a shuffle buffer of
`encoder.shuffle_buffer` encoded records, decoded in the input pipeline), so
its memory does not grow with the number of images. The small CNN trains in
`encoder.mixed_precision` (`auto`: bfloat16 where the hardware has it
natively, 1.55x faster per step on an AVX512-BF16 CPU) and is saved in
float32, so that Preprocess and serving compute the same annotations on any
host.

Each epoch's TensorBoard scalars (`encoder/loss`, `encoder/val_map`,
`encoder/best_val_map`, `encoder/learning_rate`, `encoder/epoch_seconds`,
step = epoch) go to `<work_dir>/logs` while it trains (`captioner
tensorboard` shows them as `EncoderTrainer/running-<fp>`) and into the
Encoder's `logs/` at the end.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import sys
import time

import numpy as np
from tqdm import tqdm

from components.contract import precision as precision_lib
from components.contract import schema, stage_log, summary_writer
from models import text as text_lib

# Words that say nothing about what is in a region.
_log = stage_log.logger("EncoderTrainer")
STOPWORDS = frozenset("a an the is are of on in with to there this image picture and at".split())


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """Average precision of one label column (labels in {0, 1})."""
    order = np.argsort(-scores, kind="stable")
    hits = labels[order].astype(np.float64)
    if hits.sum() == 0:
        return float("nan")
    precision = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    return float((precision * hits).sum() / hits.sum())


def mean_average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mean AP over the words that occur at least once in `labels`."""
    aps = [average_precision(scores[:, j], labels[:, j]) for j in range(labels.shape[1])]
    aps = [a for a in aps if not np.isnan(a)]
    return float(np.mean(aps)) if aps else 0.0


def caption_words(captions) -> set[str]:
    """The normalized words of one image's captions (bytes or str), as a set."""
    words: set[str] = set()
    for c in captions:
        if isinstance(c, bytes):
            c = c.decode("utf-8")
        if c:
            words.update(text_lib.normalize(c))
    return words


def _caption_records(files, limit: int = 0):
    """A dataset of each record's captions only (`[n]` tf.string), in file order."""
    import tensorflow as tf
    spec = {schema.CAPTIONS: tf.io.VarLenFeature(tf.string)}
    ds = tf.data.TFRecordDataset(files)
    if limit > 0:
        ds = ds.take(limit)
    return ds.map(lambda r: tf.sparse.to_dense(tf.io.parse_single_example(r, spec)[schema.CAPTIONS]),
                  num_parallel_calls=tf.data.AUTOTUNE).batch(256)


def word_frequencies(files) -> tuple[collections.Counter, int]:
    """Streams a split's captions: (images per non-stopword word, number of images)."""
    freq: collections.Counter = collections.Counter()
    n = 0
    for batch in _caption_records(files).as_numpy_iterator():
        for caps in batch:
            freq.update(w for w in caption_words(caps) if w not in STOPWORDS)
            n += 1
    return freq, n


def word_targets(word_sets, index: dict) -> np.ndarray:
    """Multi-hot `(N, K)` float32 targets."""
    y = np.zeros((len(word_sets), len(index)), np.float32)
    for i, ws in enumerate(word_sets):
        for w in ws:
            j = index.get(w)
            if j is not None:
                y[i, j] = 1.0
    return y


def image_word_dataset(files, index: dict, image_size: int, *, shuffle_buffer: int = 0,
                       seed: int = 0, limit: int = 0):
    """Streams `(image, targets)` from Examples TFRecords: nothing is held but the buffers.

    Records are shuffled while still serialized (a buffer of encoded images,
    not of decoded ones), then decoded and resized with the project's one
    image preprocessing, rounded to uint8 values, and given their multi-hot
    word targets.

    Args:
      files: the split's TFRecord files (read in order).
      index: word -> target column.
      image_size: the encoder's input side S.
      shuffle_buffer: records in the shuffle buffer (0: no shuffling).
      seed: the shuffle seed (a new order every epoch).
      limit: read at most this many records (0: all).
    Returns:
      A dataset of `(S, S, 3)` float32 images and `(K,)` float32 targets.
    """
    import tensorflow as tf

    from models.image_ops import decode_and_resize
    spec = schema.example_image_spec()
    k = len(index)

    def targets(captions):
        return word_targets([caption_words(captions)], index)[0]

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        image = tf.cast(tf.round(decode_and_resize(ex[schema.IMAGE_ENCODED], image_size)), tf.uint8)
        y = tf.numpy_function(targets, [tf.sparse.to_dense(ex[schema.CAPTIONS])], tf.float32,
                              stateful=False)
        return tf.cast(image, tf.float32), tf.ensure_shape(y, [k])

    ds = tf.data.TFRecordDataset(files)
    if limit > 0:
        ds = ds.take(limit)
    if shuffle_buffer > 0:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def _StepBar(bar):
    """A Keras callback advancing `bar` (a tqdm) by one step per train batch, loss shown."""
    import keras

    class StepBar(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            bar.update(1)
            if logs and "loss" in logs:
                bar.set_postfix(loss=f"{float(logs['loss']):.4f}", refresh=False)

    return StepBar()


def train_word_encoder(train_ds, val_ds, val_y: np.ndarray, config, log=_log,
                       steps_per_epoch: int | None = None, policy: str = "float32",
                       logs_dir: str | None = None):
    """Trains the small CNN on word presence until val mAP stops improving.

    Args:
      train_ds: batched `(images, targets)` (one epoch per iteration).
      val_ds: batched `(images, targets)` of the held-out images, in `val_y` order.
      val_y: `(N_val, K)` targets of `val_ds`, for the mean average precision.
      config: `EncoderConfig`.
      log: one line of progress text.
      steps_per_epoch: batches per epoch, for the progress bar (None: unknown).
      policy: the Keras dtype policy to train in; the returned backbone is
        float32 whatever it is.
      logs_dir: where each epoch's TensorBoard scalars go (None: nowhere).
    Returns:
      (trained backbone, best val mAP, epochs run, history list, the `StopRule`
      that ended training).
    """
    import keras

    from models.encoder import small_cnn_backbone, word_classifier
    keras.utils.set_random_seed(0)
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        backbone = small_cnn_backbone(config.image_size, config.width, config.grid_size)
        model = word_classifier(backbone, val_y.shape[1])
    finally:
        keras.mixed_precision.set_global_policy(previous)
    model.compile(optimizer=keras.optimizers.Adam(config.learning_rate),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    val_images = val_ds.map(lambda x, y: x)
    writer = summary_writer.file_writer(logs_dir) if logs_dir else None
    try:
        best, best_weights, epoch, history, rule = _fit_epochs(
            model, backbone, train_ds, (val_images, val_y), config, log, steps_per_epoch, writer)
    finally:
        if writer is not None:
            writer.close()
    if best_weights is not None:
        backbone.set_weights(best_weights)
    if backbone.dtype_policy.name != "float32":
        # The same variables (float32 under mixed precision) in a float32 model.
        float_backbone = small_cnn_backbone(config.image_size, config.width, config.grid_size)
        float_backbone.set_weights(backbone.get_weights())
        backbone = float_backbone
    return backbone, best, epoch, history, rule


@dataclasses.dataclass
class StopRule:
    """When the EncoderTrainer stops: val mAP's patience, with `max_epochs` as a safety bound.

    An epoch improves when its val mAP beats the best so far by more than
    `min_delta`; training stops after `patience` epochs in a row without
    improvement, or at `max_epochs`, whichever comes first. Reaching
    `max_epochs` while the last epoch still improved means the bound, not the
    data, ended training: `update` then says so, with the last epoch's gain.

    Attributes:
      patience: epochs without improvement before stopping (at least 1).
      min_delta: smallest val mAP gain over the best that counts.
      max_epochs: the epoch bound.
      best: the best val mAP so far (-1 before the first epoch).
      bad: epochs since the last improvement.
      best_epoch: the epoch of `best` (0 before the first).
      stopped: why training stopped (`""` while it goes on): `patience` or
        `max_epochs`.
      still_rising: whether it stopped at `max_epochs` with the last epoch a
        new best.
    """
    patience: int
    min_delta: float
    max_epochs: int
    best: float = -1.0
    bad: int = 0
    best_epoch: int = 0
    stopped: str = ""
    still_rising: bool = False
    _last: float | None = None

    def update(self, epoch: int, value: float) -> tuple[bool, str]:
        """Records epoch `epoch`'s (1-based) val mAP.

        Returns:
          (whether it is a new best, the line to log if training stops now, else "").
        """
        improved = value > self.best + self.min_delta
        gain = (f"{value - self._last:+.4f} in the last epoch" if self._last is not None
                else f"{value:.4f} after its only epoch")
        self._last = value
        if improved:
            self.best, self.bad, self.best_epoch = value, 0, epoch
        else:
            self.bad += 1
        if self.bad >= max(1, self.patience):
            self.stopped = "patience"
            return improved, (f"val mAP stopped improving: best {self.best:.4f} at epoch "
                              f"{self.best_epoch}, no gain above encoder.min_delta="
                              f"{self.min_delta:g} in the {self.bad} "
                              f"epoch{'' if self.bad == 1 else 's'} since")
        if epoch >= self.max_epochs:
            self.stopped = "max_epochs"
            if improved:
                self.still_rising = True
                return improved, (f"stopped at encoder.max_epochs={self.max_epochs} while val mAP "
                                  f"was still rising ({gain}); raise encoder.max_epochs")
            return improved, (f"stopped at encoder.max_epochs={self.max_epochs} before patience "
                              f"ran out: best val mAP {self.best:.4f} at epoch {self.best_epoch}, "
                              f"{self.bad} of encoder.patience={self.patience} epochs without a "
                              "gain since; raise encoder.max_epochs to let patience decide")
        return improved, ""


def _fit_epochs(model, backbone, train_ds, val, config, log, steps_per_epoch, writer):
    """The epochs of `train_word_encoder`: (best mAP, its weights, epochs, history, `StopRule`).

    `val` is `(val images dataset, their targets)`.
    """
    val_images, val_y = val
    rule = StopRule(config.patience, config.min_delta, config.max_epochs)
    best_weights, history = None, []
    epoch = 0
    for epoch in range(1, config.max_epochs + 1):
        start = time.time()
        # shuffle=False: the dataset shuffles itself (Keras would warn otherwise).
        with tqdm(total=steps_per_epoch, desc=f"EncoderTrainer epoch {epoch}",
                  unit="step", file=sys.stderr, leave=False) as bar:
            fit = model.fit(train_ds, epochs=1, verbose=0, shuffle=False,
                            callbacks=[_StepBar(bar)])
        scores = model.predict(val_images, verbose=0)
        val_map = mean_average_precision(scores, val_y)
        history.append({"epoch": epoch, "loss": float(fit.history["loss"][-1]),
                        "val_map": val_map, "seconds": round(time.time() - start, 1)})
        log(f"epoch {epoch}: loss {history[-1]['loss']:.4f} "
            f"val mAP {val_map:.4f} ({history[-1]['seconds']}s)")
        improved, stop_line = rule.update(epoch, val_map)
        if improved:
            best_weights = [w.copy() for w in backbone.get_weights()]
        if writer is not None:
            summary_writer.write_scalars(writer, {
                "encoder/loss": history[-1]["loss"], "encoder/val_map": val_map,
                "encoder/best_val_map": rule.best,
                "encoder/learning_rate": model.optimizer.learning_rate,
                "encoder/epoch_seconds": history[-1]["seconds"]}, epoch)
            writer.flush()  # one point per epoch: show it now, not at the next timed flush
        if stop_line:
            log(stop_line)
            break
    return rule.best, best_weights, epoch, history, rule


def train_from_examples(examples_uri: str, config, log=_log,
                        logs_dir: str | None = None) -> tuple:
    """Trains the small CNN on an Examples artifact, streaming every image from disk.

    Memory does not grow with the number of images: one pass counts the
    train words (a `Counter`), training reads the TFRecords through a
    shuffle buffer of `config.shuffle_buffer` encoded records, and the
    held-out mAP uses at most `config.val_images` val images (their scores
    and targets are the only per-image arrays kept).

    Args:
      examples_uri: the Examples artifact folder.
      config: `EncoderConfig`.
      log: one line of progress text.
      logs_dir: where each epoch's TensorBoard scalars go (None: nowhere).
    Returns:
      (backbone, properties, counts, words).
    """
    train_files = schema.split_files(examples_uri, "train")
    val_files = schema.split_files(examples_uri, "val")
    freq, n_train = word_frequencies(train_files)
    val_sets = [caption_words(caps) for batch in _caption_records(
        val_files, config.val_images).as_numpy_iterator() for caps in batch]
    if n_train == 0 or not val_sets:
        raise RuntimeError("EncoderTrainer needs train and val images; "
                           "check data.val_fraction and the ExampleGen counts")
    words = sorted(w for w, c in freq.items() if c >= 2)
    index = {w: i for i, w in enumerate(words)}
    val_y = word_targets(val_sets, index)
    # Chance level: a scorer that ranks at random gets each word's prevalence.
    chance = float(np.mean([val_y[:, j].mean() for j in range(len(words))
                            if val_y[:, j].sum() > 0]))
    log(f"{n_train} train images streamed from disk (shuffle buffer "
        f"{min(n_train, config.shuffle_buffer)} records), {len(val_sets)} val images, "
        f"{len(words)} words")
    train_ds = (image_word_dataset(train_files, index, config.image_size,
                                   shuffle_buffer=min(n_train, config.shuffle_buffer), seed=0)
                .batch(config.batch_size).prefetch(2))
    val_ds = (image_word_dataset(val_files, index, config.image_size, limit=len(val_sets))
              .batch(256).prefetch(2))
    chosen = precision_lib.resolve(config.mixed_precision)
    log(f"precision {chosen.policy} ({chosen.requested}: {chosen.reason})")
    backbone, val_map, epochs, history, rule = train_word_encoder(
        train_ds, val_ds, val_y, config, log,
        steps_per_epoch=-(-n_train // config.batch_size), policy=chosen.policy,
        logs_dir=logs_dir)
    properties = {"val_map": val_map, "chance_map": chance, "epochs": epochs,
                  "stopped": rule.stopped, "still_rising": rule.still_rising,
                  "history": history, "words": words, **chosen.as_properties()}
    counts = {"encoder_train_images": int(n_train), "encoder_val_images": len(val_sets),
              "encoder_words": len(words)}
    return backbone, properties, counts, words


def run(ctx) -> dict:
    """Builds (and for the small CNN, trains) the encoder; writes the `Encoder` artifact."""
    from models.encoder import build_encoder
    cfg = ctx.config.encoder
    out = ctx.outputs["encoder"]
    log = ctx.log
    properties: dict = {"kind": cfg.kind, "image_size": cfg.image_size,
                        "coord_channels": cfg.coord_channels}
    counts: dict = {}
    backbone = None
    if cfg.kind == "small_cnn" and cfg.train:
        logs_dir = os.path.join(ctx.work_dir, schema.LOGS_DIR)
        # Training never resumes: an earlier attempt's curves would overlap
        # this one's epochs.
        shutil.rmtree(logs_dir, ignore_errors=True)
        backbone, trained, counts, words = train_from_examples(
            ctx.inputs["examples"].uri, cfg, log, logs_dir=logs_dir)
        shutil.copytree(logs_dir, os.path.join(out, schema.LOGS_DIR))
        properties.update(trained)
        with open(os.path.join(out, "words.txt"), "w") as f:
            f.write("\n".join(words) + "\n")
    encoder = build_encoder(cfg.kind, application=cfg.application, layer=cfg.layer,
                            weights=cfg.weights, image_size=cfg.image_size, width=cfg.width,
                            grid_size=cfg.grid_size, coord_channels=cfg.coord_channels,
                            backbone=backbone)
    h, w, d = (int(v) for v in encoder.output_shape[1:])
    properties[schema.GRID_SHAPE] = [h, w, d]
    encoder.save(os.path.join(out, schema.ENCODER_FILE))
    log(f"encoder {cfg.kind}: grid {h}x{w}x{d}"
        + (f", val mAP {properties['val_map']:.4f} (chance {properties['chance_map']:.4f})"
           if "val_map" in properties else ""))
    return {"encoder": {"counts": counts, "properties": properties}}
