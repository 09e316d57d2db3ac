"""Preprocess's Beam pipeline: encoder inference over every image, tokenized captions, vocabulary.

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
import json
import os
import re
import time
from typing import Mapping, Sequence

import apache_beam as beam
from apache_beam.metrics import Metrics

from components.beam import beam_utils
from components.contract import schema
from models import text

NAMESPACE = "Preprocess"
INFERENCE_NAMESPACE = "Preprocess/RunInference"  # RunInference's own metrics
DEAD_LETTERS = "dead_letters"
# Counters of the vocabulary branch: train records read, words counted.
VOCABULARY_RECORDS, VOCABULARY_WORDS = "vocabulary_records", "vocabulary_words"
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
    """All normalized words of one serialized Example's captions (counted for the guard)."""
    import tensorflow as tf
    example = tf.train.Example.FromString(record)
    words: list[str] = []
    for caption in schema.example_captions(example.features.feature):
        words += text.normalize(caption)
    Metrics.counter(NAMESPACE, VOCABULARY_RECORDS).inc()
    Metrics.counter(NAMESPACE, VOCABULARY_WORDS).inc(len(words))
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


def build_pipeline(p: beam.Pipeline, job, files: Mapping[str, Sequence[str]], encoder_path: str,
                   grid_shape: Sequence[int]) -> None:
    """Adds the Preprocess transforms to `p`.

    Args:
      p: the pipeline.
      job: the `components.preprocess.stage.PreprocessJob` (its config,
        image size and output folders).
      files: split -> Examples TFRecord files (`train` must have some).
      encoder_path: the `encoder.keras` file.
      grid_shape: the encoder's output `[H, W, D]`.
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
        | "BuildVocabulary" >> beam.Map(_vocabulary_tables, job.config.vocab_min_count,
                                        job.config.vocab_max_size))
    _ = tables | "WriteVocabulary" >> beam.Map(_write_vocabulary, job.vocabulary_uri)

    # Annotations: every split.
    parsed = (
        p
        | "ListExampleFiles" >> beam.Create(all_files)
        | "ReadExamples" >> ReadAllFromTFRecord(with_filename=True)
        | "Parse" >> beam.ParDo(ParseExample()).with_outputs(DEAD_LETTERS, main="records"))
    decoded = (
        parsed.records
        | "Tokenize" >> beam.ParDo(Tokenize(job.config.max_caption_length),
                                   vocabulary=beam.pvalue.AsSingleton(tables))
        | "Decode" >> beam.ParDo(DecodeImage(job.image_size)).with_outputs(
            DEAD_LETTERS, main="images"))
    handler = KeyedModelHandler(beam_utils.KerasModelHandler(
        encoder_path, input_shape=(job.image_size, job.image_size, 3), output_dtype="float16",
        min_batch_size=job.config.min_batch_size, max_batch_size=job.config.max_batch_size,
        metrics_namespace=INFERENCE_NAMESPACE,
        custom_modules=ENCODER_MODULES))
    encoded = (
        decoded.images
        | "Encode" >> RunInference(handler)
        | "ToExample" >> beam.ParDo(ToExample(grid_shape)))
    by_split = encoded | "BySplit" >> beam.Partition(
        lambda item, n: splits.index(item[0]), len(splits))
    for split, part in zip(splits, by_split, strict=True):
        _ = (part
             | f"Values[{split}]" >> beam.Values()
             | f"Write[{split}]" >> beam_utils.WriteTFRecordShards(
                 beam_utils.join(job.annotations_uri, split, schema.ANNOTATIONS_PREFIX),
                 file_name_suffix=".tfrecord", num_shards=job.config.num_shards,
                 max_shard_bytes=job.config.max_shard_mb * 2 ** 20,
                 shard_name_template=SHARD_TEMPLATE))

    _ = ((parsed[DEAD_LETTERS], decoded[DEAD_LETTERS])
         | "DeadLetters" >> beam.Flatten()
         | "DeadLetterJson" >> beam.Map(schema.dead_letter_line)
         | "WriteDeadLetters" >> beam.io.WriteToText(
             beam_utils.join(job.annotations_uri, schema.DEAD_LETTERS_FILE),
             shard_name_template="", num_shards=1))
