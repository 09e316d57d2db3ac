"""EncoderTrainer: the annotation CNN, trained on caption words when no ImageNet weights exist.

For `encoder.kind = small_cnn` with `encoder.train = true`, the small CNN is
trained as a multi-label word-presence classifier (which caption words occur
for an image) until its held-out mean average precision stops improving; its
conv grid then becomes the annotation layer. For `keras_app` encoders the
stage only materializes the model (ImageNet weights, a local file, or none),
so that Preprocess and the Pusher share one saved encoder.

The small CNN trains in `encoder.mixed_precision` (`auto`: bfloat16 where the
hardware has it natively, 1.55x faster per step on an AVX512-BF16 CPU) and is
saved in float32, so that Preprocess and serving compute the same
annotations on any host.
"""
from __future__ import annotations

import collections
import os
import sys
import time

import numpy as np
from tqdm import tqdm

from components import precision as precision_lib
from components import schema
from models import text as text_lib

# Words that say nothing about what is in a region.
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


def load_split(examples_uri: str, split: str, image_size: int, desc: str):
    """Decoded images (uint8) and their caption word sets for one split."""
    import tensorflow as tf
    from models.image_ops import decode_and_resize
    files = schema.split_files(examples_uri, split)
    if not files:
        return np.zeros((0, image_size, image_size, 3), np.uint8), []
    spec = schema.example_image_spec()

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        image = tf.cast(tf.round(decode_and_resize(ex[schema.IMAGE_ENCODED], image_size)),
                        tf.uint8)
        return image, tf.sparse.to_dense(ex[schema.CAPTIONS])

    ds = (tf.data.TFRecordDataset(files).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
          .batch(256).prefetch(2))
    images, words = [], []
    for batch_images, batch_caps in tqdm(ds.as_numpy_iterator(), desc=desc, unit="batch",
                                         file=sys.stderr, mininterval=1.0):
        images.append(batch_images)
        for caps in batch_caps:
            ws = set()
            for c in caps:
                if c:
                    ws.update(text_lib.normalize(c.decode("utf-8")))
            words.append(ws)
    return np.concatenate(images), words


def word_targets(word_sets, index: dict) -> np.ndarray:
    """Multi-hot `(N, K)` float32 targets."""
    y = np.zeros((len(word_sets), len(index)), np.float32)
    for i, ws in enumerate(word_sets):
        for w in ws:
            j = index.get(w)
            if j is not None:
                y[i, j] = 1.0
    return y


def train_word_encoder(train_x, train_y, val_x, val_y, config, log=print,
                       policy: str = "float32"):
    """Trains the small CNN on word presence until val mAP stops improving.

    Args:
      train_x, val_x: (N, S, S, 3) uint8 images.
      train_y, val_y: (N, words) {0, 1} word-presence targets.
      config: the `EncoderConfig`.
      log: one line of progress text.
      policy: the Keras dtype policy to train in; the returned backbone is
        float32 whatever it is.
    Returns:
      (trained backbone, best val mAP, epochs run, history list).
    """
    import keras
    import tensorflow as tf
    from models.encoder import small_cnn_backbone, word_classifier
    keras.utils.set_random_seed(0)
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        backbone = small_cnn_backbone(config.image_size, config.width, config.grid_size)
        model = word_classifier(backbone, train_y.shape[1])
    finally:
        keras.mixed_precision.set_global_policy(previous)
    model.compile(optimizer=keras.optimizers.Adam(config.learning_rate),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    train_ds = (tf.data.Dataset.from_tensor_slices((train_x, train_y))
                .shuffle(min(len(train_x), 10000), seed=0, reshuffle_each_iteration=True)
                .map(lambda x, y: (tf.cast(x, tf.float32), y))
                .batch(config.batch_size).prefetch(2))
    best, best_weights, bad, history = -1.0, None, 0, []
    epoch = 0
    for epoch in range(1, config.max_epochs + 1):
        start = time.time()
        fit = model.fit(train_ds, epochs=1, verbose=1 if sys.stderr.isatty() else 0)
        scores = model.predict(val_x.astype(np.float32), batch_size=256, verbose=0)
        val_map = mean_average_precision(scores, val_y)
        history.append({"epoch": epoch, "loss": float(fit.history["loss"][-1]),
                        "val_map": val_map, "seconds": round(time.time() - start, 1)})
        log(f"[EncoderTrainer] epoch {epoch}: loss {history[-1]['loss']:.4f} "
            f"val mAP {val_map:.4f} ({history[-1]['seconds']}s)")
        if val_map > best + config.min_delta:
            best, bad = val_map, 0
            best_weights = [w.copy() for w in backbone.get_weights()]
        else:
            bad += 1
            if bad >= config.patience:
                log(f"[EncoderTrainer] val mAP stopped improving: best {best:.4f}")
                break
    if best_weights is not None:
        backbone.set_weights(best_weights)
    if backbone.dtype_policy.name != "float32":
        # The same variables (float32 under mixed precision) in a float32 model.
        float_backbone = small_cnn_backbone(config.image_size, config.width, config.grid_size)
        float_backbone.set_weights(backbone.get_weights())
        backbone = float_backbone
    return backbone, best, epoch, history


def run(ctx) -> dict:
    """Builds (and for the small CNN, trains) the encoder; writes the `Encoder` artifact."""
    from models.encoder import build_encoder
    cfg = ctx.config.encoder
    out = ctx.outputs["encoder"]
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    properties: dict = {"kind": cfg.kind, "image_size": cfg.image_size,
                        "coord_channels": cfg.coord_channels}
    counts: dict = {}
    backbone = None
    if cfg.kind == "small_cnn" and cfg.train:
        examples = ctx.inputs["examples"].uri
        train_x, train_words = load_split(examples, "train", cfg.image_size, "load train")
        val_x, val_words = load_split(examples, "val", cfg.image_size, "load val")
        if len(train_x) == 0 or len(val_x) == 0:
            raise RuntimeError("EncoderTrainer needs train and val images; "
                               "check data.val_fraction and the ExampleGen counts")
        freq = collections.Counter(w for ws in train_words for w in ws if w not in STOPWORDS)
        words = sorted(w for w, c in freq.items() if c >= 2)
        index = {w: i for i, w in enumerate(words)}
        train_y, val_y = word_targets(train_words, index), word_targets(val_words, index)
        # Chance level: a scorer that ranks at random gets each word's prevalence.
        chance = float(np.mean([val_y[:, j].mean() for j in range(len(words))
                                if val_y[:, j].sum() > 0]))
        chosen = precision_lib.resolve(cfg.mixed_precision)
        log(f"[EncoderTrainer] precision {chosen.policy} ({chosen.requested}: {chosen.reason})")
        backbone, val_map, epochs, history = train_word_encoder(
            train_x, train_y, val_x, val_y, cfg, log, policy=chosen.policy)
        properties.update({"val_map": val_map, "chance_map": chance, "epochs": epochs,
                           "history": history, "words": words, **chosen.as_properties()})
        counts = {"encoder_train_images": int(len(train_x)), "encoder_val_images": int(len(val_x)),
                  "encoder_words": len(words)}
        with open(os.path.join(out, "words.txt"), "w") as f:
            f.write("\n".join(words) + "\n")
    encoder = build_encoder(cfg.kind, application=cfg.application, layer=cfg.layer,
                            weights=cfg.weights, image_size=cfg.image_size, width=cfg.width,
                            grid_size=cfg.grid_size, coord_channels=cfg.coord_channels,
                            backbone=backbone)
    h, w, d = (int(v) for v in encoder.output_shape[1:])
    properties[schema.GRID_SHAPE] = [h, w, d]
    encoder.save(os.path.join(out, schema.ENCODER_FILE))
    log(f"[EncoderTrainer] encoder {cfg.kind}: grid {h}x{w}x{d}"
        + (f", val mAP {properties['val_map']:.4f} (chance {properties['chance_map']:.4f})"
           if "val_map" in properties else ""))
    return {"encoder": {"counts": counts, "properties": properties}}
