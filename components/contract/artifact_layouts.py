"""What each artifact type holds, as data: docs/ARTIFACTS.md is rendered from it (`make docs`).

The file names and record features themselves are `components.contract.schema`'s.
"""
from __future__ import annotations

import dataclasses

from components.contract.schema import (
    ANNOTATION_FEATURES,
    ANNOTATIONS_PREFIX,
    BEST_MODEL_FILE,
    CHECKPOINTS_DIR,
    COUNTS_FILE,
    DEAD_LETTERS_FILE,
    ENCODER_FILE,
    EXAMPLE_FEATURES,
    EXAMPLES_PREFIX,
    EXPORT_RECORD,
    GRID_SHAPE,
    HISTORY_FILE,
    LOGS_DIR,
    MODEL_CONFIG_FILE,
    MODEL_FILE,
    SAVED_MODEL_DIR,
    SPLITS,
    VOCAB_FILE,
)


@dataclasses.dataclass(frozen=True)
class ArtifactLayout:
    """What one artifact type holds (docs/ARTIFACTS.md is rendered from these).

    Attributes:
      type: the artifact type (`Examples`, ...).
      producer: the stage that writes it.
      files: `(path under the artifact folder, meaning)` pairs.
      features: the `Feature`s of its records (TFRecord artifacts).
      notes: more text (markdown).
    """
    type: str
    producer: str
    files: tuple
    features: tuple = ()
    notes: str = ""


def _shards(prefix: str) -> str:
    return f"<split>/{prefix}-SSSSS-of-NNNNN.tfrecord"


ARTIFACT_LAYOUTS = (
    ArtifactLayout(
        "Examples", "ExampleGen",
        ((_shards(EXAMPLES_PREFIX), "one `tf.train.Example` per image, `split` in "
          + ", ".join(f"`{s}`" for s in SPLITS) + " (features below)"),
         (DEAD_LETTERS_FILE, "one JSON object per rejected input (see Dead letters)")),
        EXAMPLE_FEATURES,
        "`counts`: `seen`, `accepted`, `rejected`, one count per split, and "
        "`dead_letter_reasons` (reason kind -> count)."),
    ArtifactLayout(
        "Encoder", "EncoderTrainer",
        ((ENCODER_FILE, "a Keras model from `uint8`/`float32` images `(batch, S, S, 3)` "
          "(already resized, values 0..255) to the annotation grid `(batch, H, W, D)`"),
         ("words.txt", "trained small CNN only: its target words, one per line"),
         (LOGS_DIR + "/", "trained small CNN only: TensorBoard scalars per epoch "
          "(`encoder/loss`, `encoder/val_map`, `encoder/best_val_map`, "
          "`encoder/learning_rate`, `encoder/epoch_seconds`)")),
        notes=f"`properties`: `image_size`, `{GRID_SHAPE}` `[H, W, D]`, `val_map` (held-out "
              "word-presence mean average precision), `epochs`; `stopped`: what ended "
              "training (`patience`, or `max_epochs`, the bound) and `still_rising`: whether "
              "the bound did while val mAP was still improving; `mixed_precision`, "
              "`mixed_precision_requested`, `mixed_precision_reason`: the policy the small "
              "CNN trained in and why (the saved model computes in float32)."),
    ArtifactLayout(
        "Annotations", "Preprocess",
        ((_shards(ANNOTATIONS_PREFIX), "one `tf.train.Example` per image (features below)"),
         (DEAD_LETTERS_FILE, "images that failed to parse or decode (see Dead letters)")),
        ANNOTATION_FEATURES,
        "The number of shards per split follows the data (each at most "
        "`preprocess.max_shard_mb`) unless `preprocess.num_shards` fixes it; readers take "
        f"every shard of a split folder. `properties`: `{GRID_SHAPE}`, `num_records` and "
        "`num_shards` (per split). Parsed by "
        "`components.contract.schema.parse_annotations` (tf.data) and `decode_annotations` (NumPy)."),
    ArtifactLayout(
        "Vocabulary", "Preprocess",
        ((VOCAB_FILE, "one token per line, the id is the line number (no blank lines); ids "
          "0-3 are `<pad>`, `<start>`, `<end>`, `<unk>`"),
         (COUNTS_FILE, "word -> count over the train split")),
        notes="Tokenization (`models/text.py`): lowercase, punctuation stripped, split on "
              "whitespace."),
    ArtifactLayout(
        "Model", "Trainer",
        ((MODEL_FILE, "the final weights (their moving average under `train.scst_average_epochs`)"),
         (BEST_MODEL_FILE, "the best validation score's weights; the Evaluator and Pusher "
          f"use it (`model_file`: `{BEST_MODEL_FILE}`, else `{MODEL_FILE}`)"),
         (CHECKPOINTS_DIR + "/", "the final `tf.train.CheckpointManager` checkpoint"),
         (LOGS_DIR + "/", "TensorBoard logs"),
         (MODEL_CONFIG_FILE, "the `model` config section, vocabulary size, grid shape and "
          "mixed-precision policy"),
         (HISTORY_FILE, "one validation row per epoch (`\"phase\": \"scst\"` on the "
          "self-critical epochs); `train.init_model` checks convergence on it")),
        notes="Both `.keras` files compute in float32 whatever the training policy (the "
              "same float32 variables), so the Evaluator and the Pusher's SavedModel decode at "
              "full speed on hosts without native bfloat16. "
              "`properties` include `mixed_precision` (the Keras policy trained in, "
              "`train.mixed_precision=auto` resolved), `mixed_precision_requested` and "
              "`mixed_precision_reason`; `objective`, and with `train.objective=scst` a `scst` "
              "record (start model, epochs, best validation CIDEr, samples, baseline)."),
    ArtifactLayout(
        "ServingModel", "Exporter",
        ((SAVED_MODEL_DIR + "/", "the TF Serving SavedModel: `serving_default` (image bytes) and "
          "`caption_annotations` signatures, `assets.extra/tf_serving_warmup_requests`, and "
          f"`{EXPORT_RECORD}` (the fingerprints of the model, encoder and vocabulary it was "
          "exported from, the decoding, the infra validation report, and `encoder_gflops`, the "
          "encoder's GFLOPs per image, by which `captioner serve` sizes TensorFlow's thread "
          "pools; TF Serving ignores it)"),),
        notes="`properties`: `digest` (sha256 over the SavedModel folder's relative paths and "
              "bytes: the Evaluator records the digest it scored and the Pusher publishes only "
              "those bytes), `decoding` (`beam_size`, `max_length`, `length_normalization`, "
              "from `eval.*`), `infra_validation` (`ok`, `reason`, ops used, TensorFlow "
              "versions), `model_uri`, `encoder_uri`, `vocabulary_uri`, `image_size`, "
              f"`{GRID_SHAPE}`."),
    ArtifactLayout(
        "Evaluation", "Evaluator",
        (("metrics.json", "the coco-caption metrics, the end-of-caption check "
                          "(`dangling_endings`, `dangling_ending_rate`, `empty_captions`) and, "
                          "where boxes exist, grounding; the baseline's metrics and the "
                          "comparison rows"),
         ("captions.jsonl", "one caption per test image, as `serving_default` returned it, "
                            "with its score and references"),
         ("baseline_captions.jsonl", "the same for the baseline (when there is one)"),
         ("figures/index.html", "attention figures (PNGs beside it)"),
         ("report.html", "the whole Evaluation as one self-contained page (verdict, metrics, "
                         "the comparison, grounding, dangling endings, the figures embedded); "
                         "`captioner inspect` prints its path")),
        notes="`properties`: the `metrics`, the `decoding` and `export_digest` of the "
              "ServingModel they were measured on (the Pusher publishes only that digest), "
              "`baseline` (its ServingModel, digest and metrics, measured in the same run on "
              "the same images) and `comparison` (see Blessing). The runner resolves the "
              "baseline, the last pushed ServingModel, from the metadata store (see "
              "[ARCHITECTURE.md](ARCHITECTURE.md#the-dag-and-its-resolver))."),
    ArtifactLayout(
        "Blessing", "Evaluator",
        (("BLESSED", "present when blessed, else `NOT_BLESSED`; its text gives the reasons"),
         ("blessing.json", "the verdict and its reasons, `thresholds`, `change_thresholds`, "
                           "the `bootstrap` settings and the `comparison` rows: per metric "
                           "candidate, baseline, difference, relative difference, their 95% "
                           "intervals, the threshold and the verdict"))),
    ArtifactLayout(
        "PushedModel", "Pusher", (),
        notes="`<serving_dir>/<model_name>/<version>/`: a byte-for-byte copy of the "
              "ServingModel's SavedModel that the Evaluation scored (same `digest`), "
              "`<serving_dir>/models.config`, `<serving_dir>/batching_parameters.txt`; the "
              "artifact records the version, path, `digest` and `decoding`. A Pusher re-run "
              "after a crash finds the same digest in the newest version and reuses it."),
)
