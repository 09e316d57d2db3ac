"""Preprocess (Apache Beam): encoder inference over every image, tokenized captions, vocabulary.

The pipeline (one Beam job, every split):

    Examples/<split>/*.tfrecord
      -> ReadAll -> Parse -> Tokenize (vocabulary side input) -> Decode ---------> dead letters
      -> RunInference(KerasModelHandler, batched) -> ToExample -> Partition(split)
      -> WriteTFRecordShards  <annotations>/<split>/annotations-SSSSS-of-NNNNN.tfrecord
         (num_shards=0: each bundle writes its own size-bounded shards, nothing grouped)

    Examples/train/*.tfrecord -> ReadAll -> Words -> CombineGlobally(WordCounts)
      -> vocabulary (side input above) + vocab.txt, counts.json

The train split is read twice (once for the word counts) so that no stage
has to hold the raw images while the vocabulary is being counted: the main
branch then streams from read to write in one fused stage.

Record formats: docs/ARTIFACTS.md; running on other runners: docs/beam.md.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import sys
import time
from typing import Iterable, Mapping, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from components.preprocess import beam_utils
from components.contract import schema
from models import text

NAMESPACE = "Preprocess"
INFERENCE_NAMESPACE = "Preprocess/RunInference"  # RunInference's own metrics
DEAD_LETTERS = "dead_letters"
SHARD_TEMPLATE = "-SSSSS-of-NNNNN"
# TF's op context in error messages: "[[{{node ..}}]]", "{{function_node ..}}", "[Op:..]".
_OP_NODE = re.compile(r"\[\[.*?\]\]|\{\{.*?\}\}|\[Op:.*?\]", re.S)
# Modules whose registered Keras layers an `encoder.keras` may use.
ENCODER_MODULES = ("models.encoder",)


# ----------------------------------------------------------------------------- vocabulary

class WordCounts(beam.CombineFn):
    """Counts words over lists of words (one list per image): a `Counter` accumulator."""

    def create_accumulator(self):
        return collections.Counter()

    def add_input(self, accumulator, words):
        accumulator.update(words)
        return accumulator

    def merge_accumulators(self, accumulators):
        accumulators = iter(accumulators)
        merged = next(accumulators)
        for acc in accumulators:
            merged.update(acc)
        return merged

    def extract_output(self, accumulator):
        return dict(accumulator)


def build_vocabulary(counts: Mapping[str, int], min_count: int = 1,
                     max_size: int = 0) -> list[str]:
    """The vocabulary: reserved tokens, then words by descending count.

    Args:
      counts: word -> count over the train captions.
      min_count: drop words seen fewer times.
      max_size: the most tokens in total, reserved ones included (<= 0: no limit).
    Returns:
      Tokens; the id of a token is its index. Ties are broken by the word,
      so the result does not depend on the order the counts arrived in.
    """
    words = sorted(((w, c) for w, c in counts.items()
                    if c >= min_count and w not in text.RESERVED),
                   key=lambda wc: (-wc[1], wc[0]))
    tokens = list(text.RESERVED) + [w for w, _ in words]
    if max_size > 0:
        tokens = tokens[:max(max_size, len(text.RESERVED))]
    return tokens


def _caption_words(record: bytes) -> list[str]:
    """All normalized words of one serialized Example's captions."""
    import tensorflow as tf
    example = tf.train.Example.FromString(record)
    words: list[str] = []
    for caption in schema.example_captions(example.features.feature):
        words += text.normalize(caption)
    return words


def _vocabulary_tables(counts: Mapping[str, int], min_count: int, max_size: int) -> dict:
    tokens = build_vocabulary(counts, min_count, max_size)
    return {"tokens": tokens, "counts": dict(counts)}


def _write_vocabulary(tables: dict, vocabulary_uri: str) -> int:
    """Writes `vocab.txt` and `counts.json` (inside the pipeline, so it works on remote runners)."""
    tokens = tables["tokens"]
    beam_utils.write_text(beam_utils.join(vocabulary_uri, schema.VOCAB_FILE),
                          schema.vocabulary_text(tokens))
    counts = dict(sorted(tables["counts"].items(), key=lambda wc: (-wc[1], wc[0])))
    beam_utils.write_text(beam_utils.join(vocabulary_uri, schema.COUNTS_FILE),
                          json.dumps(counts, ensure_ascii=False, indent=0))
    return len(tokens)


# ----------------------------------------------------------------------------- main branch

def _split_of(path: str) -> str:
    """The split of an Examples shard: the name of its folder."""
    return os.path.basename(os.path.dirname(path.rstrip("/")))


class ParseExample(beam.DoFn):
    """(path, serialized Example) -> a record dict; unparseable records -> dead letters."""

    def setup(self):
        import tensorflow as tf
        self._example_cls = tf.train.Example
        self._seen = {s: Metrics.counter(NAMESPACE, f"{s}_seen") for s in schema.SPLITS}
        self._dead = {s: Metrics.counter(NAMESPACE, f"{s}_dead_lettered")
                      for s in schema.SPLITS}

    def process(self, item):
        path, record = item
        split = _split_of(path)
        if split not in self._seen:
            self._seen[split] = Metrics.counter(NAMESPACE, f"{split}_seen")
            self._dead[split] = Metrics.counter(NAMESPACE, f"{split}_dead_lettered")
        self._seen[split].inc()
        image_id = ""
        try:
            example = self._example_cls.FromString(record)
            feature = example.features.feature
            image_id, encoded = schema.example_image(feature)
            if not image_id:
                raise ValueError(f"record without {schema.IMAGE_ID}")
            if not encoded:
                raise ValueError(f"record without {schema.IMAGE_ENCODED}")
        except Exception as e:  # a corrupt record must not stop the job
            self._dead[split].inc()
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, schema.dead_letter(
                image_id, f"unparseable record in {os.path.basename(path)}: "
                          f"{type(e).__name__}: {e}", split, path))
            return
        objects = {k: v for k, v in feature.items() if k.startswith(schema.OBJECTS_PREFIX)}
        extra = b""
        if objects:
            import tensorflow as tf
            features = tf.train.Features()
            for k, v in objects.items():
                features.feature[k].CopyFrom(v)
            extra = features.SerializeToString()
        yield {"id": image_id, "split": split, "image": encoded,
               "captions": schema.example_captions(feature), "objects": extra}


class Tokenize(beam.DoFn):
    """Adds `tokens` (all captions concatenated) and `lengths` using the vocabulary side input."""

    def __init__(self, max_caption_length: int):
        self.max_caption_length = max_caption_length
        self._table_id = None
        self._word_to_id: dict[str, int] = {}

    def process(self, record: dict, vocabulary: dict):
        if self._table_id != id(vocabulary):
            # The side input is the same object for every element of a bundle.
            self._word_to_id = {w: i for i, w in enumerate(vocabulary["tokens"])}
            self._table_id = id(vocabulary)
        tokens: list[int] = []
        lengths: list[int] = []
        for caption in record["captions"]:
            ids = text.encode(text.normalize(caption), self._word_to_id,
                              self.max_caption_length)
            tokens += ids
            lengths.append(len(ids))
        yield {**record, "tokens": tokens, "lengths": lengths}


class DecodeImage(beam.DoFn):
    """record -> (record without bytes, `(S, S, 3)` float32 image); failures -> dead letters.

    Uses `models.image_ops.decode_and_resize`, the one image preprocessing of
    the project (EncoderTrainer and the serving graph use it too), traced
    once per DoFn instance.
    """

    def __init__(self, image_size: int):
        self.image_size = image_size

    def setup(self):
        import tensorflow as tf
        from models.image_ops import decode_and_resize
        size = self.image_size
        self._decode = tf.function(lambda b: decode_and_resize(b, size),
                                   input_signature=[tf.TensorSpec([], tf.string)])
        self._errors = (tf.errors.OpError, ValueError)
        self._micros = Metrics.distribution(NAMESPACE, "decode_micros")
        self._dead = {s: Metrics.counter(NAMESPACE, f"{s}_dead_lettered")
                      for s in schema.SPLITS}

    def process(self, record: dict):
        start = time.perf_counter()
        meta = {k: v for k, v in record.items() if k != "image"}
        split = record["split"]
        try:
            image = self._decode(record["image"]).numpy()  # (S, S, 3)
        except self._errors as e:
            reason = getattr(e, "message", None) or str(e)
            reason = " ".join(_OP_NODE.sub("", reason).split())[:300]
            self._dead.setdefault(split, Metrics.counter(NAMESPACE, f"{split}_dead_lettered"))
            self._dead[split].inc()
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, schema.dead_letter(
                record["id"], f"undecodable image: {type(e).__name__}: {reason}", split))
            return
        self._micros.update(int((time.perf_counter() - start) * 1e6))
        yield meta, image


class ToExample(beam.DoFn):
    """(record, `(H, W, D)` float16 grid) -> (split, serialized annotations Example)."""

    def __init__(self, grid_shape: Sequence[int]):
        self.grid_shape = [int(v) for v in grid_shape]

    def setup(self):
        self._accepted = {s: Metrics.counter(NAMESPACE, f"{s}_accepted")
                          for s in schema.SPLITS}
        self._micros = Metrics.distribution(NAMESPACE, "serialize_micros")
        self._progress = beam_utils.ProgressLog(NAMESPACE, "images encoded")

    def process(self, item):
        start = time.perf_counter()
        record, grid = item
        if list(grid.shape) != self.grid_shape:
            raise ValueError(f"encoder output {list(grid.shape)} for {record['id']}, "
                             f"expected grid_shape {self.grid_shape}")
        example = schema.encode_annotations(record["id"], grid, record["tokens"],
                                            record["lengths"], record["captions"],
                                            record["objects"])
        split = record["split"]
        self._accepted.setdefault(split, Metrics.counter(NAMESPACE, f"{split}_accepted"))
        self._accepted[split].inc()
        self._micros.update(int((time.perf_counter() - start) * 1e6))
        self._progress.add()
        yield split, example.SerializeToString()


def build_pipeline(p: beam.Pipeline, *, files: Mapping[str, Sequence[str]], encoder_path: str,
                   image_size: int, grid_shape: Sequence[int], config,
                   annotations_uri: str, vocabulary_uri: str,
                   large_model: bool = False) -> None:
    """Adds the Preprocess transforms to `p`.

    Args:
      p: the pipeline.
      files: split -> Examples TFRecord files (`train` must have some).
      encoder_path: the `encoder.keras` file.
      image_size: the encoder's input side S.
      grid_shape: the encoder's output `[H, W, D]`.
      config: `PreprocessConfig`.
      annotations_uri, vocabulary_uri: output folders.
      large_model: share one encoder across worker processes.
    """
    from apache_beam.io.tfrecordio import ReadAllFromTFRecord
    from apache_beam.ml.inference.base import KeyedModelHandler, RunInference

    splits = [s for s in files if files[s]]
    all_files = [f for s in splits for f in files[s]]

    # Vocabulary: train captions only.
    tables = (
        p
        | "ListTrainFiles" >> beam.Create(list(files.get("train", [])))
        | "ReadTrain" >> ReadAllFromTFRecord()
        | "TrainWords" >> beam.Map(_caption_words)
        | "CountWords" >> beam.CombineGlobally(WordCounts())
        | "BuildVocabulary" >> beam.Map(_vocabulary_tables, config.vocab_min_count,
                                        config.vocab_max_size))
    _ = tables | "WriteVocabulary" >> beam.Map(_write_vocabulary, vocabulary_uri)

    # Annotations: every split.
    parsed = (
        p
        | "ListExampleFiles" >> beam.Create(all_files)
        | "ReadExamples" >> ReadAllFromTFRecord(with_filename=True)
        | "Parse" >> beam.ParDo(ParseExample()).with_outputs(DEAD_LETTERS, main="records"))
    decoded = (
        parsed.records
        | "Tokenize" >> beam.ParDo(Tokenize(config.max_caption_length),
                                   vocabulary=beam.pvalue.AsSingleton(tables))
        | "Decode" >> beam.ParDo(DecodeImage(image_size)).with_outputs(
            DEAD_LETTERS, main="images"))
    handler = KeyedModelHandler(beam_utils.KerasModelHandler(
        encoder_path, input_shape=(image_size, image_size, 3), output_dtype="float16",
        min_batch_size=config.min_batch_size, max_batch_size=config.max_batch_size,
        large_model=large_model, metrics_namespace=INFERENCE_NAMESPACE,
        custom_modules=ENCODER_MODULES))
    encoded = (
        decoded.images
        | "Encode" >> RunInference(handler)
        | "ToExample" >> beam.ParDo(ToExample(grid_shape)))
    by_split = encoded | "BySplit" >> beam.Partition(
        lambda item, n: splits.index(item[0]), len(splits))
    for split, part in zip(splits, by_split):
        _ = (part
             | f"Values[{split}]" >> beam.Values()
             | f"Write[{split}]" >> beam_utils.WriteTFRecordShards(
                 beam_utils.join(annotations_uri, split, schema.ANNOTATIONS_PREFIX),
                 file_name_suffix=".tfrecord", num_shards=config.num_shards,
                 max_shard_bytes=config.max_shard_mb * 2 ** 20,
                 shard_name_template=SHARD_TEMPLATE))

    _ = ((parsed[DEAD_LETTERS], decoded[DEAD_LETTERS])
         | "DeadLetters" >> beam.Flatten()
         | "DeadLetterJson" >> beam.Map(schema.dead_letter_line)
         | "WriteDeadLetters" >> beam.io.WriteToText(
             beam_utils.join(annotations_uri, schema.DEAD_LETTERS_FILE),
             shard_name_template="", num_shards=1))


# ----------------------------------------------------------------------------- driver

def _count_records(files: Iterable[str]) -> int:
    import tensorflow as tf
    return sum(int(tf.data.TFRecordDataset(f).reduce(np.int64(0), lambda n, _: n + 1))
               for f in files)


def _grid_shape(encoder_path: str, properties: Mapping) -> list[int]:
    if properties.get(schema.GRID_SHAPE):
        return [int(v) for v in properties[schema.GRID_SHAPE]]
    import importlib

    import keras
    for module in ENCODER_MODULES:
        importlib.import_module(module)
    local, tmp = beam_utils._local_copy(encoder_path)
    try:
        model = keras.saving.load_model(local, compile=False)
    finally:
        if tmp:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
    return [int(v) for v in model.output_shape[1:]]


def _wait(result):
    """The final state of a job that already finished (the in-process DirectRunner), else None."""
    from apache_beam.runners.runner import PipelineState
    return result.state if PipelineState.is_terminal(result.state) else None


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_preprocess(examples_uri: str, encoder_uri: str, config, annotations_uri: str,
                   vocabulary_uri: str, *, image_size: int,
                   grid_shape: Sequence[int] | None = None,
                   encoder_properties: Mapping | None = None,
                   examples_counts: Mapping | None = None,
                   beam_args: Sequence[str] = (), large_model: bool = False,
                   job_name: str | None = None) -> dict:
    """Runs the encoder over every image and writes annotation grids and the vocabulary.

    One record per image: the `L x D` grid as float16 bytes, every tokenized
    reference caption, and the reference texts for evaluation (paper section
    3.1.1: the annotation vectors `a_i` come from a convolutional layer). Images
    that fail to decode go to `<annotations>/dead_letters.jsonl` with the reason.

    Args:
      examples_uri: the Examples artifact folder.
      encoder_uri: the Encoder artifact folder (`encoder.keras`).
      config: `PreprocessConfig`.
      annotations_uri, vocabulary_uri: output artifact folders.
      image_size: the encoder's input side S.
      grid_shape: the encoder's `[H, W, D]` (read from the model if None).
      encoder_properties: the Encoder artifact's properties (for grid_shape).
      examples_counts: the Examples artifact's counts (a cross-check only).
      beam_args: extra Beam options, appended last.
      large_model: share one encoder copy across worker processes.
      job_name: Beam job name.
    Returns:
      `{"annotations": {"counts", "properties"}, "vocabulary": {"counts", "properties"}}`.
    """
    files = {s: beam_utils.match_files(beam_utils.join(examples_uri, s, "*.tfrecord"))
             for s in schema.SPLITS}
    if not files["train"]:
        raise RuntimeError(f"{examples_uri} has no train split: the vocabulary is built "
                           "from the train captions")
    encoder_path = beam_utils.join(encoder_uri, schema.ENCODER_FILE)
    grid_shape = list(grid_shape or _grid_shape(encoder_path, encoder_properties or {}))
    splits = [s for s in schema.SPLITS if files[s]]
    runner = beam_utils.flag_value(list(beam_args), "runner") or config.runner
    _log(f"[{NAMESPACE}] runner {beam_utils.runner_name(runner)}, image size {image_size}, "
         f"grid {grid_shape}, splits {splits}, batch {config.min_batch_size}-"
         f"{config.max_batch_size}")
    start = time.time()
    with beam_utils.pipeline_options(
            config.runner, beam_args, direct_num_workers=config.direct_num_workers,
            direct_running_mode=config.direct_running_mode, job_name=job_name) as options:
        p = beam.Pipeline(options=options)
        build_pipeline(p, files=files, encoder_path=encoder_path, image_size=image_size,
                       grid_shape=grid_shape, config=config,
                       annotations_uri=annotations_uri, vocabulary_uri=vocabulary_uri,
                       large_model=large_model)
        total = (sum(int(examples_counts.get(s) or 0) for s in splits)
                 if examples_counts else None) or None
        in_process = (beam_utils.runner_name(runner) == "DirectRunner"
                      and config.direct_running_mode != "multi_processing")
        with (beam_utils.local_progress_bar(NAMESPACE, total, "img") if in_process
              else contextlib.nullcontext()):
            result = p.run()
            state = _wait(result)

        def report():
            c = beam_utils.counters(result, NAMESPACE) or {}
            seen = sum(v for k, v in c.items() if k.endswith("_seen"))
            done = sum(v for k, v in c.items() if k.endswith("_accepted"))
            return f"[{NAMESPACE}] {seen} images read, {done} encoded" if seen else None

        if state is None:
            state = beam_utils.wait_with_progress(result, report, log=_log)
        if state != "DONE":
            raise RuntimeError(f"Preprocess Beam job ended in state {state}")
        # Queried before the block ends: a local job service stops with it.
        metrics = beam_utils.counters(result, NAMESPACE)
        distributions = {**beam_utils.distributions(result, NAMESPACE),
                         **beam_utils.distributions(result, INFERENCE_NAMESPACE)}
    seconds = time.time() - start

    # Counts from the Beam counters; runners that report none get them from the files.
    out_files = {s: beam_utils.match_files(
        beam_utils.join(annotations_uri, s, f"{schema.ANNOTATIONS_PREFIX}-*.tfrecord")) for s in splits}
    per_split = {}
    for s in schema.SPLITS:
        if metrics is not None:
            seen = metrics.get(f"{s}_seen", 0)
            accepted = metrics.get(f"{s}_accepted", 0)
            dead = metrics.get(f"{s}_dead_lettered", 0)
        else:
            accepted = _count_records(out_files.get(s, []))
            dead = None
            seen = None
        per_split[s] = {"seen": seen, "accepted": accepted, "dead_lettered": dead}
    dead_path = beam_utils.join(annotations_uri, schema.DEAD_LETTERS_FILE)
    if metrics is None:
        _log(f"[{NAMESPACE}] the runner reported no counters; counting the written files")
        dead_lines = {}
        import tensorflow as tf
        if tf.io.gfile.exists(dead_path):
            with tf.io.gfile.GFile(dead_path) as f:
                for line in f:
                    if line.strip():
                        s = json.loads(line)["split"]
                        dead_lines[s] = dead_lines.get(s, 0) + 1
        for s, row in per_split.items():
            row["dead_lettered"] = dead_lines.get(s, 0)
            row["seen"] = row["accepted"] + row["dead_lettered"]
    for s, row in per_split.items():
        if row["accepted"] + row["dead_lettered"] != row["seen"]:
            raise RuntimeError(f"Preprocess lost records in split {s}: seen {row['seen']}, "
                               f"accepted {row['accepted']}, dead-lettered {row['dead_lettered']}")
        if examples_counts and s in examples_counts and examples_counts[s] != row["seen"]:
            _log(f"[{NAMESPACE}] warning: split {s} has {examples_counts[s]} Examples "
                 f"by their artifact counts but {row['seen']} were read")
    counts = {
        "seen": sum(r["seen"] for r in per_split.values()),
        "accepted": sum(r["accepted"] for r in per_split.values()),
        "rejected": sum(r["dead_lettered"] for r in per_split.values()),
        **{s: per_split[s]["accepted"] for s in schema.SPLITS},
    }
    import tensorflow as tf
    vocab_size = (len(schema.read_vocabulary(vocabulary_uri)) if tf.io.gfile.exists(
        beam_utils.join(vocabulary_uri, schema.VOCAB_FILE)) else 0)
    if vocab_size < len(text.RESERVED):
        raise RuntimeError(f"Preprocess wrote no vocabulary to {vocabulary_uri}")
    # Per-stage time: decode/serialize per image (micros), inference per batch
    # (micros), model loading (millis).
    timings = {k: {"count": int(v["count"]), "sum": int(v["sum"]), "mean": round(v["mean"], 1)}
               for k, v in distributions.items()}
    _log(f"[{NAMESPACE}] done in {seconds:.1f}s ({counts['accepted'] / max(seconds, 1e-9):.1f} "
         f"img/s): seen {counts['seen']}, accepted {counts['accepted']}, dead-lettered "
         f"{counts['rejected']}; train/val/test = {counts['train']}/{counts['val']}/"
         f"{counts['test']}; vocabulary {vocab_size}")
    annotations = {
        "counts": counts,
        "properties": {
            schema.GRID_SHAPE: grid_shape,
            "image_size": int(image_size),
            "splits": splits,
            "num_records": {s: per_split[s]["accepted"] for s in splits},
            "split_counts": per_split,
            "num_shards": {s: len(out_files[s]) for s in splits},
            "dead_letters": schema.DEAD_LETTERS_FILE,
            "vocab_size": vocab_size,
            "runner": beam_utils.runner_name(runner),
            "seconds": round(seconds, 2),
            "timings": timings,
        },
    }
    vocabulary = {
        "counts": {"vocab_size": vocab_size},
        "properties": {"size": vocab_size, "path": schema.VOCAB_FILE, "counts_path": schema.COUNTS_FILE,
                       "min_count": config.vocab_min_count, "max_size": config.vocab_max_size},
    }
    return {"annotations": annotations, "vocabulary": vocabulary}


def run(ctx) -> dict:
    """The Preprocess stage: Examples + Encoder -> Annotations + Vocabulary.

    Returns:
      `{"annotations": {...}, "vocabulary": {...}}` (counts and properties).
    """
    examples = ctx.inputs["examples"]
    encoder = ctx.inputs["encoder"]
    image_size = int(encoder.properties.get("image_size") or ctx.config.encoder.image_size)
    results = run_preprocess(
        examples.uri, encoder.uri, ctx.config.preprocess,
        ctx.outputs["annotations"], ctx.outputs["vocabulary"],
        image_size=image_size, encoder_properties=encoder.properties,
        examples_counts=examples.counts, beam_args=ctx.beam_args,
        job_name=f"preprocess-{ctx.execution_id}")
    props = results["annotations"]["properties"]
    props["has_boxes"] = bool(examples.properties.get("has_boxes", False))
    props["source"] = examples.properties.get("source", "")
    if results["annotations"]["counts"]["accepted"] == 0:
        raise RuntimeError("Preprocess encoded no image: see "
                           f"{os.path.join(ctx.outputs['annotations'], schema.DEAD_LETTERS_FILE)}")
    return results
