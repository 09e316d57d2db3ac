"""Preprocess (Apache Beam): encoder inference over every image, tokenized captions, vocabulary.

The stage entry `run(ctx)` and the driver `run_preprocess`, which builds the
Beam job (components/preprocess/transforms.py), runs it on the configured
runner, and checks and records what it wrote. Record formats:
docs/ARTIFACTS.md; running on other runners: docs/beam.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from typing import Any, Callable, Mapping, Sequence

import apache_beam as beam

from components.beam import beam_utils, record_guard
from components.contract import schema, stage_log
from components.preprocess import transforms
from components.preprocess.transforms import (
    ENCODER_MODULES,
    INFERENCE_NAMESPACE,
    NAMESPACE,
    build_pipeline,
)
from models import text

_log = stage_log.logger(NAMESPACE)


@dataclasses.dataclass(frozen=True)
class PreprocessJob:
    """One Preprocess run: the artifacts it reads and writes, the encoder's input, Beam options.

    Attributes:
      examples_uri: the Examples artifact folder.
      encoder_uri: the Encoder artifact folder (`encoder.keras`).
      config: `PreprocessConfig`.
      annotations_uri, vocabulary_uri: output artifact folders.
      image_size: the encoder's input side S.
      grid_shape: the encoder's `[H, W, D]` (read from the model when empty).
      encoder_properties: the Encoder artifact's properties (for the grid shape).
      examples_counts: the Examples artifact's counts (a cross-check only).
      beam_args: extra Beam options, appended last.
      job_name: Beam job name.
    """
    examples_uri: str
    encoder_uri: str
    config: Any
    annotations_uri: str
    vocabulary_uri: str
    image_size: int
    grid_shape: Sequence[int] = ()
    encoder_properties: Mapping = dataclasses.field(default_factory=dict)
    examples_counts: Mapping = dataclasses.field(default_factory=dict)
    beam_args: Sequence[str] = ()
    job_name: str | None = None


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


def run_preprocess(job: PreprocessJob, log: Callable[[str], None] = _log) -> dict:
    """Runs the encoder over every image and writes annotation grids and the vocabulary.

    One record per image: the `L x D` grid as float16 bytes, every tokenized
    reference caption, and the reference texts for evaluation (paper section
    3.1.1: the annotation vectors `a_i` come from a convolutional layer). Images
    that fail to decode go to `<annotations>/dead_letters.jsonl` with the reason.

    Args:
      job: what to read and write, and how.
      log: one line of progress text.
    Returns:
      `{"annotations": {"counts", "properties"}, "vocabulary": {"counts", "properties"}}`.
    """
    files = {s: beam_utils.match_files(beam_utils.join(job.examples_uri, s, "*.tfrecord"))
             for s in schema.SPLITS}
    if not files["train"]:
        raise RuntimeError(f"{job.examples_uri} has no train split: the vocabulary is built "
                           "from the train captions")
    encoder_path = beam_utils.join(job.encoder_uri, schema.ENCODER_FILE)
    grid_shape = list(job.grid_shape or _grid_shape(encoder_path, job.encoder_properties))
    splits = [s for s in schema.SPLITS if files[s]]
    runner = beam_utils.flag_value(list(job.beam_args), "runner") or job.config.runner
    log(f"runner {beam_utils.runner_name(runner)}, image size {job.image_size}, "
        f"grid {grid_shape}, splits {splits}, batch {job.config.min_batch_size}-"
        f"{job.config.max_batch_size}")
    start = time.time()
    metrics, distributions = _run_beam(job, files, encoder_path, grid_shape, log)
    seconds = time.time() - start
    out_files = {s: beam_utils.match_files(beam_utils.join(
        job.annotations_uri, s, f"{schema.ANNOTATIONS_PREFIX}-*.tfrecord")) for s in splits}
    per_split = _split_counts(job, metrics, files, out_files, log)
    counts = {
        "seen": sum(r["seen"] for r in per_split.values()),
        "accepted": sum(r["accepted"] for r in per_split.values()),
        "rejected": sum(r["dead_lettered"] for r in per_split.values()),
        **{s: per_split[s]["accepted"] for s in schema.SPLITS},
    }
    vocab_size = _vocabulary_size(job.vocabulary_uri)
    # Per-stage time: decode/serialize per image (micros), inference per batch
    # (micros), model loading (millis).
    timings = {k: {"count": int(v["count"]), "sum": int(v["sum"]), "mean": round(v["mean"], 1)}
               for k, v in distributions.items()}
    log(f"done in {seconds:.1f}s ({counts['accepted'] / max(seconds, 1e-9):.1f} "
        f"img/s): seen {counts['seen']}, accepted {counts['accepted']}, dead-lettered "
        f"{counts['rejected']}; train/val/test = {counts['train']}/{counts['val']}/"
        f"{counts['test']}; vocabulary {vocab_size}")
    annotations = {
        "counts": counts,
        "properties": {
            schema.GRID_SHAPE: grid_shape,
            "image_size": int(job.image_size),
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
        "properties": {"size": vocab_size, "path": schema.VOCAB_FILE,
                       "counts_path": schema.COUNTS_FILE,
                       "min_count": job.config.vocab_min_count,
                       "max_size": job.config.vocab_max_size},
    }
    return {"annotations": annotations, "vocabulary": vocabulary}


def _run_beam(job: PreprocessJob, files: Mapping[str, Sequence[str]], encoder_path: str,
              grid_shape: Sequence[int], log: Callable[[str], None]) -> tuple:
    """Builds and runs the Beam job: `(counters or None, distributions)`."""
    config = job.config
    splits = [s for s in schema.SPLITS if files[s]]
    runner = beam_utils.flag_value(list(job.beam_args), "runner") or config.runner
    with beam_utils.pipeline_options(
            config.runner, job.beam_args, direct_num_workers=config.direct_num_workers,
            direct_running_mode=config.direct_running_mode, job_name=job.job_name,
            dask_workers=config.dask_workers) as options:
        p = beam.Pipeline(options=options)
        build_pipeline(p, job, files, encoder_path, grid_shape)
        total = (sum(int(job.examples_counts.get(s) or 0) for s in splits)
                 if job.examples_counts else None) or None
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
            parts = getattr(result, "partitions", 0)  # the Dask runner's tasks
            tasks = f" ({result.partitions_done}/{parts} partitions done)" if parts else ""
            return f"{seen} images read, {done} encoded{tasks}" if seen or tasks else None

        if state is None:
            state = beam_utils.wait_with_progress(result, report, log=log)
        if state != "DONE":
            raise RuntimeError(f"Preprocess Beam job ended in state {state}")
        # Queried before the block ends: a local job service stops with it.
        return (beam_utils.counters(result, NAMESPACE),
                {**beam_utils.distributions(result, NAMESPACE),
                 **beam_utils.distributions(result, INFERENCE_NAMESPACE)})


def _split_counts(job: PreprocessJob, metrics: Mapping | None,
                  files: Mapping[str, Sequence[str]], out_files: Mapping[str, Sequence[str]],
                  log: Callable[[str], None]) -> dict:
    """Split -> seen, accepted, dead-lettered, counted from the files; raises on any loss.

    Records in: the records of the split's Examples files; written: the
    records in the output shards; dead-lettered: the lines of the
    dead-letter file (all three read from the files' framing, not decoded). The Beam
    counters are cross-checked, never trusted alone: a runner can count an
    output it then drops (docs/beam.md, "Dask").
    """
    dead = _dead_letters_by_split(beam_utils.join(job.annotations_uri, schema.DEAD_LETTERS_FILE))
    guard, per_split = {}, {}
    for s in schema.SPLITS:
        written = record_guard.count_tfrecords(out_files.get(s, []))
        read = record_guard.count_tfrecords(files.get(s, []))
        expected = job.examples_counts.get(s) if job.examples_counts else None
        if expected is not None and int(expected) != read:
            log(f"warning: split {s} has {expected} Examples by their artifact counts "
                f"but {read} records in its files")
        guard[s] = {"read": read, "written": written, "dead_lettered": dead.get(s, 0)}
        if metrics is not None:
            counted = {"read": int(metrics.get(f"{s}_seen", 0)),
                       "written": int(metrics.get(f"{s}_accepted", 0)),
                       "dead_lettered": int(metrics.get(f"{s}_dead_lettered", 0))}
            if counted != guard[s]:
                log(f"split {s}: the Beam counters say {counted}, the files {guard[s]}")
                guard[f"{s} (Beam counters against the files)"] = {
                    "read": counted["written"], "written": written, "dead_lettered": 0}
        per_split[s] = {"seen": read, "accepted": written, "dead_lettered": dead.get(s, 0)}
    if metrics is None:
        log("the runner reported no counters; the counts come from the files")
    else:  # the vocabulary branch read the whole train split and counted every word
        counts = schema.read_word_counts(job.vocabulary_uri)
        guard["vocabulary (train records)"] = {
            "read": guard["train"]["read"], "dead_lettered": 0,
            "written": int(metrics.get(transforms.VOCABULARY_RECORDS, 0))}
        guard["vocabulary (words)"] = {
            "read": int(metrics.get(transforms.VOCABULARY_WORDS, 0)), "dead_lettered": 0,
            "written": sum(counts.values())}
    record_guard.check(NAMESPACE, guard)
    return per_split


def _dead_letters_by_split(path: str) -> dict:
    """Split -> lines of the dead-letter file."""
    import tensorflow as tf
    counts: dict = {}
    if tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path) as f:
            for line in f:
                if line.strip():
                    s = json.loads(line)["split"]
                    counts[s] = counts.get(s, 0) + 1
    return counts


def _vocabulary_size(vocabulary_uri: str) -> int:
    """Tokens in the written vocabulary; raises when there is none."""
    import tensorflow as tf
    vocab_size = (len(schema.read_vocabulary(vocabulary_uri)) if tf.io.gfile.exists(
        beam_utils.join(vocabulary_uri, schema.VOCAB_FILE)) else 0)
    if vocab_size < len(text.RESERVED):
        raise RuntimeError(f"Preprocess wrote no vocabulary to {vocabulary_uri}")
    return vocab_size


def run(ctx) -> dict:
    """The Preprocess stage: Examples + Encoder -> Annotations + Vocabulary.

    Returns:
      `{"annotations": {...}, "vocabulary": {...}}` (counts and properties).
    """
    examples = ctx.inputs["examples"]
    encoder = ctx.inputs["encoder"]
    image_size = int(encoder.properties.get("image_size") or ctx.config.encoder.image_size)
    results = run_preprocess(PreprocessJob(
        examples.uri, encoder.uri, ctx.config.preprocess,
        ctx.outputs["annotations"], ctx.outputs["vocabulary"],
        image_size=image_size, encoder_properties=dict(encoder.properties),
        examples_counts=dict(examples.counts), beam_args=tuple(ctx.beam_args),
        job_name=f"preprocess-{ctx.execution_id}"), log=ctx.log)
    props = results["annotations"]["properties"]
    props["has_boxes"] = bool(examples.properties.get("has_boxes", False))
    props["source"] = examples.properties.get("source", "")
    if results["annotations"]["counts"]["accepted"] == 0:
        raise RuntimeError("Preprocess encoded no image: see "
                           f"{os.path.join(ctx.outputs['annotations'], schema.DEAD_LETTERS_FILE)}")
    return results
