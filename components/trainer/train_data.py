"""The Trainer's data: the tf.data input pipeline over Annotations TFRecords, validation images, the run's sizes.

One epoch, per input pipeline (one per worker):

    <annotations>/train/*.tfrecord -> interleave(TFRecordDataset, parallel) -> parse
      -> [cache]                        parsed records, float16 grids, every caption
      -> shuffle(seed of the epoch)     the same order on every worker
      -> shard(workers)                 a disjoint share per worker
      -> pick one caption               stateless random, seeded by (seed, epoch, image)
      -> [sort by length in windows]    `bucket_by_length`
      -> padded_batch(per-replica batch, drop_remainder) -> take(steps)
    epoch e0 + epoch e0+1 + ... (concatenate) -> skip(resume) -> prefetch

Every input pipeline yields exactly `steps_per_epoch * replicas_per_pipeline`
equally sized batches, so the workers of a multi-worker job run the same
number of steps and no replica ever gets an empty batch. The caching comes
before the caption choice, so every epoch draws a fresh reference caption for
each image. Record format: docs/ARTIFACTS.md. `read_inputs` reads the
artifacts into a `TrainInputs` (vocabulary, grid, train batches, validation
images, steps per epoch) for every phase of a run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from components.contract import schema
from components.contract.config.values import CHOICES
from components.contract.object_words import object_words
from models.text import PAD_ID

# Batches of one length-sorted window (bucket_by_length), per replica.
BUCKET_WINDOW_BATCHES = 8
# What a cached parsed record holds beyond its float16 grid: every caption's
# tokens and lengths, the tensors' own headers (measured: ~1-2 KB).
CACHE_RECORD_OVERHEAD_BYTES = 2048
CACHE_SETTINGS = CHOICES["train.cache"]


def cache_plan(setting, num_records: int, grid_shape: Sequence[int],
               budget_mb: int) -> tuple[bool, str]:
    """Whether to keep the parsed split in memory, and why (for the log).

    Args:
      setting: `train.cache`: "auto", "true" or "false" (or a bool).
      num_records: images in the split.
      grid_shape: `[H, W, D]`; cached grids are float16.
      budget_mb: `train.cache_budget_mb`, the most memory "auto" may use.
    Returns:
      `(cache, reason)`.
    Raises:
      ValueError: an unknown setting.
    """
    setting = str(setting).strip().lower()
    if setting not in CACHE_SETTINGS:
        raise ValueError(f"train.cache must be one of {', '.join(CACHE_SETTINGS)}, "
                         f"got {setting!r}")
    estimate_mb = num_records * (2 * int(np.prod(grid_shape)) + CACHE_RECORD_OVERHEAD_BYTES) / 2**20
    size = f"{num_records} images x {list(grid_shape)} float16 ~ {estimate_mb:,.0f} MB"
    if setting != "auto":
        return setting == "true", f"train.cache={setting} ({size})"
    if estimate_mb <= budget_mb:
        return True, f"cached in memory: {size} fits train.cache_budget_mb={budget_mb}"
    return False, (f"streamed from disk (parallel reads, prefetch): {size} exceeds "
                   f"train.cache_budget_mb={budget_mb}")


def _read(files: Sequence[str], parallel_reads: int) -> tf.data.Dataset:
    """Serialized records, files read in parallel, in a deterministic interleaved order."""
    files_ds = tf.data.Dataset.from_tensor_slices(list(files))
    return files_ds.interleave(
        tf.data.TFRecordDataset, cycle_length=max(1, min(len(files), parallel_reads)),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def pick_caption(index, record, seed: int, epoch, references: bool = False):
    """One of the image's captions, drawn with a stateless op seeded by (seed, epoch, index).

    Args:
      index: the image's position in the split (int64 scalar).
      record: from `schema.parse_annotations`.
      seed: `train.seed`.
      epoch: int or int64 scalar.
      references: also return every caption of the image.
    Returns:
      dict: `annotations` (L, D) float16, `tokens` (n,) int32 one caption;
      with `references`, `references` (R, T) int32, every caption, PAD-padded;
      the record's `object_*` entries as they are.
    """
    key = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])
    key = tf.random.experimental.stateless_fold_in(key, tf.cast(index, tf.int64))
    lengths = record["lengths"]
    k = tf.random.stateless_uniform([], seed=key, minval=0, maxval=tf.size(lengths),
                                    dtype=tf.int32)
    start = tf.reduce_sum(lengths[:k])
    out = {"annotations": record["annotations"],
           "tokens": record["tokens"][start:start + lengths[k]],
           **{key: value for key, value in record.items() if key.startswith("object_")}}
    if references:
        out["references"] = tf.RaggedTensor.from_row_lengths(
            record["tokens"], lengths).to_tensor(default_value=PAD_ID)
    return out


# The `object_words` of padding (no word id is negative).
NO_WORD = -1
# The attribute names of `schema.parse_object_features`, in `schema.OBJECT_ATTRIBUTES` order.
_OBJECT_ATTRIBUTES = tuple(key[len(schema.OBJECTS_PREFIX):] for key in schema.OBJECT_ATTRIBUTES)


def object_word_ids(objects, word_ids: Mapping[str, int]) -> np.ndarray:
    """(M, W) int32: the vocabulary ids of the words naming each object, `NO_WORD`-padded.

    Args:
      objects: M object dicts (`components.contract.object_words.object_words`).
      word_ids: word -> id (words outside it are dropped).
    Returns:
      One row per object (W >= 1).
    """
    rows = [[word_ids[w] for w in object_words(o) if w in word_ids] for o in objects]
    out = np.full((len(rows), max([1] + [len(r) for r in rows])), NO_WORD, np.int32)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def with_objects(serialized, record: dict, word_ids: Mapping[str, int]) -> dict:
    """`record` with the boxes and naming words of the record's objects (tf.data).

    Adds `object_boxes` (M, 4) float32 (`ymin, xmin, ymax, xmax`) and
    `object_words` (M, W) int32 (`object_word_ids`); M = 0 without boxes.
    """
    parsed = schema.parse_object_features(serialized)

    def ids(count, *columns):
        objects = [{name: column[i].decode() for name, column
                    in zip(_OBJECT_ATTRIBUTES, columns, strict=True)
                    if i < len(column) and column[i]} for i in range(int(count))]
        return object_word_ids(objects, word_ids)

    words = tf.numpy_function(ids, [tf.shape(parsed["bbox"])[0],
                                    *(parsed[name] for name in _OBJECT_ATTRIBUTES)],
                              tf.int32, stateful=False)
    words.set_shape([None, None])
    return dict(record, object_boxes=parsed["bbox"], object_words=words)


def _pad_time(batch, multiple: int):
    """Pads the token time axis up to a multiple of `multiple` (fewer XLA shapes)."""
    tokens = batch["tokens"]
    steps = tf.shape(tokens)[1]
    padded = (steps + multiple - 1) // multiple * multiple
    batch = dict(batch)
    batch["tokens"] = tf.pad(tokens, [[0, 0], [0, padded - steps]], constant_values=PAD_ID)
    return batch


@dataclass
class TrainData:
    """Builds the per-epoch training datasets of one Annotations split.

    Args:
      files: the split's TFRecord shards.
      grid_shape: `[H, W, D]`.
      num_records: images in the split (counted from the files if None).
      global_batch_size: examples per step over all replicas.
      seed: `train.seed`; shuffling and caption choice derive from it and the epoch.
      shuffle_buffer: `train.shuffle_buffer` (capped at the split size).
      cache: keep the parsed records in memory after the first epoch:
        "auto" (when they fit `cache_budget_mb`), "true"/"false", or a bool.
      cache_budget_mb: the memory "auto" may use for the cache.
      bucket_by_length: sort windows of `BUCKET_WINDOW_BATCHES` batches by
        caption length before batching, then shuffle the batches.
      dtype: the annotations' dtype in the batches (the compute dtype).
      pad_multiple: pad the time axis to a multiple of this (1 = the batch max).
      parallel_reads: files read at once.
      references: batches also hold `references` (b, R, T'), every caption
        of each image (self-critical training scores samples against them).
      word_ids: word -> id; when set, batches also hold `object_boxes`
        (b, M, 4) and `object_words` (b, M, W) (`with_objects`; padded
        with empty boxes and `NO_WORD`), for the self-critical box term.
    """
    files: Sequence[str]
    grid_shape: Sequence[int]
    num_records: int | None = None
    global_batch_size: int = 64
    seed: int = 0
    shuffle_buffer: int = 2048
    cache: bool | str = True
    cache_budget_mb: int = 4096
    bucket_by_length: bool = False
    dtype: str = "float32"
    pad_multiple: int = 1
    parallel_reads: int = 8
    references: bool = False
    word_ids: Mapping[str, int] | None = None

    def __post_init__(self):
        if not self.files:
            raise ValueError("no TFRecord files to train on")
        self._source = None
        if self.num_records is None:
            self.num_records = int(_read(self.files, self.parallel_reads)
                                   .reduce(np.int64(0), lambda n, _: n + 1))
        self.cached, self.cache_reason = cache_plan(
            self.cache, self.num_records, self.grid_shape, self.cache_budget_mb)

    def source(self) -> tf.data.Dataset:
        """`(index, parsed record)` in file order; cached when `cached` (built once)."""
        if self._source is None:
            grid, word_ids = list(self.grid_shape), self.word_ids

            def parse(serialized):
                record = schema.parse_annotations(serialized, grid)
                return record if word_ids is None else with_objects(serialized, record, word_ids)

            ds = _read(self.files, self.parallel_reads).map(
                parse, num_parallel_calls=tf.data.AUTOTUNE)
            ds = ds.enumerate()
            if self.cached:
                ds = ds.cache()
            self._source = ds
        return self._source

    def mean_caption_tokens(self, sample: int = 2048) -> float:
        """Mean predicted tokens per caption (`<start>` excluded) over the first `sample` images.

        Reads only the captions of the first shards, whatever the cache.
        """
        ds = _read(self.files, self.parallel_reads).take(sample).map(
            lambda r: schema.parse_caption_tokens(r)["lengths"],
            num_parallel_calls=tf.data.AUTOTUNE)
        total = count = 0
        for lengths in ds.as_numpy_iterator():
            total += int(np.sum(np.maximum(lengths - 1, 0)))
            count += int(lengths.size)
        return total / count if count else 1.0

    def steps_per_epoch(self, num_input_pipelines: int = 1) -> int:
        """Steps of one epoch: every pipeline has `num_records // pipelines` images."""
        per_pipeline = self.num_records // num_input_pipelines
        return per_pipeline // (self.global_batch_size // num_input_pipelines)

    def dataset(self, epoch: int, input_context: tf.distribute.InputContext | None = None,
                skip_steps: int = 0, epochs: int = 1) -> tf.data.Dataset:
        """This input pipeline's batches of `epochs` epochs from `epoch` on.

        One dataset (and one iterator) runs through the epochs, so that
        prefetching goes on across epoch boundaries; every epoch yields
        exactly `steps_per_epoch` steps' batches. (The epochs are chained with
        `concatenate`: each has its own Python-int seeds, since
        `Dataset.shuffle` cannot take a seed tensor computed in a `flat_map`
        when the global seed is 0.)

        Args:
          epoch: the first epoch (each epoch index seeds its shuffle and
            caption choice, so epoch `e` is the same whatever the start).
          input_context: from `distribute_datasets_from_function` (None = one
            pipeline, one replica).
          skip_steps: steps of the first epoch already trained (resuming).
          epochs: how many epochs.
        Returns:
          A dataset of `{"annotations": (b, L, D), "tokens": (b, T)}` with
          `b` the per-replica batch, `T` the longest caption of the batch
          (and `references` (b, R, T') when `references` is set).
        """
        pipelines = input_context.num_input_pipelines if input_context else 1
        pipeline_id = input_context.input_pipeline_id if input_context else 0
        replicas = input_context.num_replicas_in_sync if input_context else 1
        if self.global_batch_size % replicas:
            raise ValueError(f"train.batch_size={self.global_batch_size} must be a multiple "
                             f"of the {replicas} replicas")
        batch = self.global_batch_size // replicas
        replicas_per_pipeline = replicas // pipelines
        steps = self.steps_per_epoch(pipelines)
        if steps == 0:
            raise ValueError(f"the train split has {self.num_records} images, fewer than "
                             f"one global batch ({self.global_batch_size}) per worker")
        ds = None
        for e in range(epoch, epoch + max(1, epochs)):
            part = self._epoch(e, pipelines, pipeline_id, batch, replicas_per_pipeline)
            part = part.take(steps * replicas_per_pipeline)
            ds = part if ds is None else ds.concatenate(part)
        if skip_steps:
            ds = ds.skip(skip_steps * replicas_per_pipeline)
        options = tf.data.Options()
        options.deterministic = True
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF)
        return ds.with_options(options).prefetch(tf.data.AUTOTUNE)

    def _epoch(self, epoch: int, pipelines: int, pipeline_id: int, batch: int,
               replicas_per_pipeline: int) -> tf.data.Dataset:
        """One epoch's batches for one pipeline (seeded by `seed` and `epoch`)."""
        epoch_seed = (self.seed * 1_000_003 + epoch * 7919) % (2 ** 31 - 1)
        ds = self.source()
        # The same seed on every worker: the same order, then disjoint shares.
        ds = ds.shuffle(max(1, min(self.shuffle_buffer, self.num_records)), seed=epoch_seed,
                        reshuffle_each_iteration=False)
        if pipelines > 1:
            ds = ds.shard(pipelines, pipeline_id)
        seed, references = self.seed, self.references
        ds = ds.map(lambda i, r: pick_caption(i, r, seed, epoch, references),
                    num_parallel_calls=tf.data.AUTOTUNE)
        if self.bucket_by_length and not references:
            ds = self._sorted_windows(ds, batch * BUCKET_WINDOW_BATCHES * replicas_per_pipeline)
        dtype = tf.as_dtype(self.dtype)
        ds = ds.map(lambda e: dict(e, annotations=tf.cast(e["annotations"], dtype)),
                    num_parallel_calls=tf.data.AUTOTUNE)
        padding = {"annotations": tf.cast(0, dtype), "tokens": PAD_ID}
        if references:
            padding["references"] = PAD_ID
        if self.word_ids is not None:
            padding.update(object_boxes=0.0, object_words=NO_WORD)
        ds = ds.padded_batch(batch, padding_values=padding, drop_remainder=True)
        if self.bucket_by_length and not references:
            # Batches leave a window sorted by length: shuffle their order.
            ds = ds.shuffle(BUCKET_WINDOW_BATCHES * replicas_per_pipeline,
                            seed=epoch_seed + 1, reshuffle_each_iteration=False)
        if self.pad_multiple > 1:
            ds = ds.map(lambda b: _pad_time(b, self.pad_multiple))
        return ds

    @staticmethod
    def _sorted_windows(ds, window: int):
        """Sorts each window of `window` examples by caption length (stable)."""
        def sort(w):
            lengths = tf.reduce_sum(tf.cast(tf.not_equal(w["tokens"], PAD_ID), tf.int32), 1)
            order = tf.argsort(lengths, stable=True)
            return (tf.gather(w["annotations"], order), tf.gather(w["tokens"], order),
                    tf.gather(lengths, order))

        def trim(annotations, tokens, length):
            return {"annotations": annotations, "tokens": tokens[:length]}

        ds = ds.padded_batch(window, padding_values={"annotations": tf.cast(0, tf.float16),
                                                     "tokens": PAD_ID})
        return ds.map(sort).unbatch().map(trim)


def read_references(files: Sequence[str], parallel_reads: int = 8) -> list[list[np.ndarray]]:
    """Every image's captions as word ids (`<start>`/`<end>` dropped), in file order.

    Reads only the caption features (no grids), for the document frequencies
    of self-critical training's CIDEr-D reward.
    """
    ds = _read(files, parallel_reads).map(schema.parse_caption_tokens,
                                          num_parallel_calls=tf.data.AUTOTUNE)
    out = []
    for record in ds.prefetch(tf.data.AUTOTUNE).as_numpy_iterator():
        bounds = np.cumsum(record["lengths"])[:-1]
        out.append([c[1:-1] for c in np.split(record["tokens"], bounds)])
    return out


@dataclass
class EvalSet:
    """Validation images held in memory.

    Attributes:
      ids: image ids.
      annotations: (N, L, D) float32.
      captions: per image, its token id arrays (`<start> .. <end>`).
      references: per image, its normalized reference texts.
    """
    ids: list
    annotations: np.ndarray
    captions: list
    references: list

    def __len__(self) -> int:
        return len(self.ids)

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (image, caption) pair: `(image index (P,), tokens (P, T) PAD-padded)`."""
        index, rows = [], []
        for i, caps in enumerate(self.captions):
            for c in caps:
                index.append(i)
                rows.append(c)
        width = max((len(r) for r in rows), default=1)
        tokens = np.full((len(rows), width), PAD_ID, np.int32)
        for j, r in enumerate(rows):
            tokens[j, :len(r)] = r
        return np.asarray(index, np.int64), tokens


def load_eval_set(files: Sequence[str], grid_shape: Sequence[int], max_images: int,
                  id_to_word: Sequence[str] | None = None) -> EvalSet:
    """The first `max_images` images of a split (file order), with all their captions.

    References are the normalized `captions/text` (or the decoded tokens when
    a record has no texts).
    """
    from models import text as text_lib
    h, w, d = (int(v) for v in grid_shape)
    ids, grids, captions, references = [], [], [], []
    if max_images <= 0 or not files:
        return EvalSet([], np.zeros((0, h * w, d), np.float32), [], [])
    for serialized in _read(files, 4).take(max_images).as_numpy_iterator():
        record = schema.decode_annotations(serialized)
        texts = [" ".join(text_lib.normalize(t)) for t in record.texts]
        if not texts and id_to_word is not None:
            texts = [text_lib.decode(c[1:], id_to_word) for c in record.captions]
        ids.append(record.image_id or str(len(ids)))
        grids.append(record.grid)
        captions.append(record.captions)
        references.append([t for t in texts if t] or [""])
    return EvalSet(ids, np.stack(grids) if grids else np.zeros((0, h * w, d), np.float32),
                   captions, references)


@dataclass
class TrainInputs:
    """The data side of a run: vocabulary, grid, train batches, validation images, step counts."""
    vocab_size: int
    id_to_word: list
    grid_shape: list
    data: Any            # TrainData
    eval_set: Any        # EvalSet
    steps_per_epoch: int
    total_steps: int


def read_inputs(strategy, role, config, annotations_uri: str, vocabulary_uri: str, *,
                annotations_properties: Mapping,
                vocabulary_properties: Mapping) -> TrainInputs:
    """Reads the artifacts and sizes the run.

    Args:
      strategy: the `tf.distribute.Strategy`.
      role: this process' `distribute.ClusterRole`.
      config: the `PipelineConfig`.
      annotations_uri, vocabulary_uri: the input artifact folders.
      annotations_properties, vocabulary_properties: their properties.
    Returns:
      The `TrainInputs`.
    Raises:
      ValueError, RuntimeError: a batch that the replicas cannot share, a
        missing train split, or one with fewer images than a global batch.
    """
    import keras

    from components.trainer import distribute
    tcfg = config.train
    replicas = strategy.num_replicas_in_sync
    if tcfg.batch_size % replicas:
        raise ValueError(f"train.batch_size={tcfg.batch_size} must be a multiple of the "
                         f"{replicas} replicas of train.strategy={tcfg.strategy}")
    keras.utils.set_random_seed(tcfg.seed)
    id_to_word = schema.read_vocabulary(vocabulary_uri)
    vocab_size = schema.vocabulary_size(vocabulary_uri, vocabulary_properties)
    grid_shape = schema.annotations_grid_shape(annotations_uri, annotations_properties)
    train_files = schema.split_files(annotations_uri, "train")
    if not train_files:
        raise RuntimeError(f"{annotations_uri} has no train split (train/*.tfrecord)")
    data = TrainData(
        train_files, grid_shape,
        num_records=(annotations_properties.get("num_records") or {}).get("train"),
        global_batch_size=tcfg.batch_size, seed=tcfg.seed,
        shuffle_buffer=tcfg.shuffle_buffer, cache=tcfg.cache,
        cache_budget_mb=tcfg.cache_budget_mb,
        bucket_by_length=tcfg.bucket_by_length,
        dtype=keras.mixed_precision.global_policy().compute_dtype,
        pad_multiple=8 if tcfg.jit_compile else 1)
    steps_per_epoch = data.steps_per_epoch(
        role.num_workers if distribute.is_multi_worker(strategy) else 1)
    if steps_per_epoch == 0:
        raise RuntimeError(f"the train split has {data.num_records} images, fewer than one "
                           f"global batch of {tcfg.batch_size} per worker: lower "
                           "train.batch_size")
    total_steps = steps_per_epoch * tcfg.epochs
    if tcfg.max_steps > 0:
        total_steps = min(total_steps, tcfg.max_steps)
    eval_set = load_eval_set(schema.split_files(annotations_uri, "val"),
                             grid_shape, tcfg.val_examples, id_to_word)
    return TrainInputs(vocab_size=vocab_size, id_to_word=id_to_word, grid_shape=grid_shape,
                       data=data, eval_set=eval_set, steps_per_epoch=steps_per_epoch,
                       total_steps=total_steps)
