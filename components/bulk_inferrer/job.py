"""Bulk captioning: an exported captioner SavedModel over many images, as one Beam job.

    image paths (expanded on the driver)
      -> Create -> ReadImage (tf.io.gfile) -----------------------------------> dead letters
      -> RunInference(KeyedModelHandler(CaptionModelHandler), batched)
      -> ToLine (a JSON line per image) --------------------------------------> dead letters
      -> Flatten(caption lines, dead-letter lines) -> WriteToText (one file, a temp folder)

    driver: images in == caption lines + dead-letter lines (counted from the
    file), lines sorted by image, then moved to `--output` (or stdout)

What the model handler does, and why: Beam's `TFModelHandler*` cannot load
the Keras 3 export, so `CaptionModelHandler` loads the SavedModel itself and
calls its serving signature on a `tf.string` batch of encoded images. One
image that does not decode fails its whole batch inside the graph; the
handler then captions that batch one image at a time, and each image that
still fails becomes a dead letter with the server's error text, so one bad
file never stops the job. Lines are those of `captioner caption --json`
(`serving.client.caption_client.json_line`). The file is written by Beam's `WriteToText`,
which renames only the output of bundles that succeeded, so a task that a
runner retries (a Dask worker that died) writes no line twice.
"""
from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any, Iterable, Optional, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import ModelHandler

from components.beam import beam_utils, record_guard
from components.bulk_inferrer import inputs

NAMESPACE = "BulkInferrer"
INFERENCE_NAMESPACE = "BulkInferrer/RunInference"  # RunInference's own metrics
DEAD_LETTERS = "dead_letters"
# The signature outputs a caption line needs (`attention` is not converted).
OUTPUTS = ("caption", "tokens", "lengths", "score")
LINES_FILE = "captions.jsonl"
DASK_WORKERS = 2  # a local Dask cluster's worker processes unless --workers says


# ----------------------------------------------------------------------------- the Beam job

class ReadImage(beam.DoFn):
    """(image, location) -> (image, encoded bytes); an unreadable file -> a dead letter."""

    def setup(self):
        self._read = Metrics.counter(NAMESPACE, "images_read")

    def process(self, item):
        import tensorflow as tf
        image, location = item
        try:
            with tf.io.gfile.GFile(location, "rb") as f:
                data = f.read()
        except (tf.errors.OpError, OSError) as e:
            reason = getattr(e, "message", None) or getattr(e, "strerror", None) or str(e)
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, (image, f"cannot read: {reason}"))
            return
        self._read.inc()
        yield image, data


class _LoadedSignature:
    """A SavedModel's signature; holds the loaded object, whose variables the function uses."""

    def __init__(self, path: str, signature: str):
        import tensorflow as tf
        self._tf = tf
        self.loaded = tf.saved_model.load(path)
        if signature not in self.loaded.signatures:
            raise ValueError(f"{path} has no signature {signature!r} (it has "
                             f"{', '.join(sorted(self.loaded.signatures)) or 'none'})")
        self.function = self.loaded.signatures[signature]
        _, args = self.function.structured_input_signature
        outputs = set(self.function.structured_outputs)
        if len(args) != 1 or not {"caption", "score"} <= outputs:
            raise ValueError(f"{path} signature {signature!r} takes {sorted(args)} and "
                             f"returns {sorted(outputs)}: not the captioner's (one tf.string "
                             f"image input; caption, score, tokens, lengths out)")
        self.input_name = next(iter(args))

    def __call__(self, images: Sequence[bytes]) -> dict[str, np.ndarray]:
        batch = self._tf.constant(list(images), dtype=self._tf.string)
        outputs = self.function(**{self.input_name: batch})
        return {name: value.numpy() for name, value in outputs.items() if name in OUTPUTS}


class CaptionModelHandler(ModelHandler[bytes, Any, _LoadedSignature]):
    """Runs a captioner SavedModel's signature on batches of encoded images in `RunInference`.

    Each output is the dict of `serving.client.caption_client.caption_results` (caption,
    score, tokens cut to their length, version), or a str: why that image
    failed (a dead letter). The SavedModel is loaded once per worker process
    (RunInference's shared handle).

    Args:
      model_path: the version folder (local or any `tf.io.gfile` path).
      signature: the signature to call (`serving_default`).
      version: the version number the results carry (None: not numbered).
      max_batch_size: the most images per signature call.
    """

    def __init__(self, model_path: str, signature: str = "serving_default", *,
                 version: Optional[int] = None, max_batch_size: int = 8):
        super().__init__(min_batch_size=1, max_batch_size=max(1, int(max_batch_size)))
        self.model_path = model_path
        self.signature = signature
        self.version = version

    def load_model(self) -> _LoadedSignature:
        return _LoadedSignature(self.model_path, self.signature)

    def run_inference(self, batch: Sequence[bytes], model: _LoadedSignature,
                      inference_args: Optional[dict[str, Any]] = None) -> Iterable[Any]:
        import tensorflow as tf

        from serving.client.caption_client import caption_results
        from serving.errors import from_tf_error
        try:
            outputs = model(batch)
        except tf.errors.OpError as e:
            if len(batch) == 1:
                return [str(from_tf_error(e))]  # the server's text: `INVALID_ARGUMENT: ...`
            # A batch fails as a whole in the graph: one image at a time finds the bad ones.
            return [r for image in batch for r in self.run_inference([image], model)]
        return caption_results(outputs, len(batch), self.version)

    def get_num_bytes(self, batch: Sequence[bytes]) -> int:
        # The default pickles the whole batch just to measure it.
        return int(sum(len(b) for b in batch))

    def get_metrics_namespace(self) -> str:
        return INFERENCE_NAMESPACE


class ToLine(beam.DoFn):
    """(image, result) -> its `--json` line; a failed image -> a dead letter."""

    def setup(self):
        self._captioned = Metrics.counter(NAMESPACE, "images_captioned")

    def process(self, item):
        from serving.client.caption_client import json_line
        image, result = item
        if isinstance(result, str):
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, (image, result))
            return
        try:
            line = json.dumps(json_line(image, result), allow_nan=False)
        except ValueError:  # NaN or infinity: JSON has no such number
            yield beam.pvalue.TaggedOutput(
                DEAD_LETTERS, (image, f"the model returned a non-finite score ({result['score']})"))
            return
        self._captioned.inc()
        yield line


class Progress(beam.DoFn):
    """Passes lines through, advancing the progress bar (or logging the progress on workers)."""

    def setup(self):
        self._progress = beam_utils.ProgressLog(NAMESPACE, "images")

    def process(self, line):
        self._progress.add()
        yield line


def dead_letter_line(item: tuple[str, str]) -> str:
    """(image, reason) -> `{"image": ..., "error": ...}`, as `captioner caption --json` prints."""
    image, reason = item
    Metrics.counter(NAMESPACE, "dead_letters").inc()
    return json.dumps({"image": image, "error": reason}, allow_nan=False)


def build_pipeline(p: beam.Pipeline, images: Sequence[str], handler: ModelHandler,
                   lines_prefix: str) -> None:
    """Adds the bulk captioning transforms to `p`.

    Args:
      p: the pipeline.
      images: the image paths (the keys of the results).
      handler: the unkeyed model handler (`CaptionModelHandler`).
      lines_prefix: the one output file (`WriteToText` with no shard name).
    """
    from apache_beam.ml.inference.base import KeyedModelHandler, RunInference
    read = (
        p
        | "Images" >> beam.Create([(image, inputs.read_location(image)) for image in images])
        | "Read" >> beam.ParDo(ReadImage()).with_outputs(DEAD_LETTERS, main="images"))
    captioned = (
        read.images
        | "Caption" >> RunInference(KeyedModelHandler(handler))
        | "ToLine" >> beam.ParDo(ToLine()).with_outputs(DEAD_LETTERS, main="lines"))
    dead = ((read[DEAD_LETTERS], captioned[DEAD_LETTERS])
            | "DeadLetters" >> beam.Flatten()
            | "DeadLetterLine" >> beam.Map(dead_letter_line))
    _ = ((captioned.lines, dead)
         | "AllLines" >> beam.Flatten()
         | "Progress" >> beam.ParDo(Progress())
         | "Write" >> beam.io.WriteToText(lines_prefix, shard_name_template="", num_shards=1))


# ----------------------------------------------------------------------------- the driver

def _log(message: str) -> None:
    print(f"captioner caption: {message}", file=sys.stderr, flush=True)


def check_lines(lines: Sequence[str], images: Sequence[str]) -> tuple[list[tuple[str, str]], int]:
    """Checks images in == caption lines + dead-letter lines.

    Args:
      lines: the lines the job wrote.
      images: the image paths that went in.
    Returns:
      (`(image, line)` for every line, sorted by image; the dead letters).
    Raises:
      RecordLossError: the counts differ, or they agree but the lines name
        other images than went in (one lost, another written twice).
    """
    captioned = dead = 0
    pairs = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # neither a caption nor a dead letter: the counts show it
        if isinstance(record, dict) and "error" in record:
            dead += 1
        elif isinstance(record, dict) and "caption" in record:
            captioned += 1
        else:
            continue
        pairs.append((str(record.get("image")), line))
    record_guard.check("Bulk captioning", {"images": {
        "read": len(images), "written": captioned, "dead_lettered": dead}})
    pairs.sort()
    if [image for image, _ in pairs] != sorted(images):
        missing = len(set(images) - {image for image, _ in pairs})
        raise record_guard.RecordLossError(
            f"Bulk captioning lost records, nothing is published: {len(images)} images in and "
            f"{len(pairs)} lines out, but {missing} of the images have no line (the lines "
            f"name others, or one twice)")
    return pairs, dead


def _read_lines(path: str) -> list[str]:
    """The lines of the job's output file ([] when the sink wrote none)."""
    import tensorflow as tf
    if not tf.io.gfile.exists(path):
        return []
    with tf.io.gfile.GFile(path, "r") as f:
        return [line for line in f.read().splitlines() if line.strip()]


def _run_job(images: Sequence[str], handler: ModelHandler, lines_path: str, runner: str,
             beam_args: Sequence[str], workers: Optional[int]) -> None:
    """Builds and runs the Beam job; raises unless it ends DONE."""
    from apache_beam.runners.runner import PipelineState
    direct_workers = max(1, int(workers or 1))
    dask_workers = max(1, int(workers or DASK_WORKERS))
    mode = "multi_processing" if direct_workers > 1 else "in_memory"
    name = beam_utils.runner_name(beam_utils.flag_value(beam_args, "runner") or runner)
    with beam_utils.pipeline_options(runner, beam_args, direct_num_workers=direct_workers,
                                     direct_running_mode=mode, job_name="bulk-captioning",
                                     dask_workers=dask_workers) as options:
        p = beam.Pipeline(options=options)
        build_pipeline(p, images, handler, lines_path)
        # DoFns in this process advance a bar; elsewhere they log lines.
        in_process = name == "DirectRunner" and mode != "multi_processing"
        with (beam_utils.local_progress_bar("caption", len(images), "img") if in_process
              else contextlib.nullcontext()):
            result = p.run()
            state = result.state if PipelineState.is_terminal(result.state) else None

        def report():
            c = beam_utils.counters(result, NAMESPACE) or {}
            done = c.get("images_captioned", 0) + c.get("dead_letters", 0)
            return f"{done}/{len(images)} images done" if c else None

        if state is None:
            state = beam_utils.wait_with_progress(result, report, log=_log)
    if state != PipelineState.DONE:
        raise RuntimeError(f"the bulk captioning Beam job ended in state {state}")


def run_bulk_inference(model_path: str, images: Sequence[str], output: Optional[str] = None,
                       runner: str = "direct", beam_args: Sequence[str] = (),
                       batch_size: int = 8, workers: Optional[int] = None,
                       signature: str = "serving_default") -> dict:
    """Captions every image a list of files, folders and globs names, as one Beam job.

    Writes one JSON line per image, sorted by image path, to `output` (or
    stdout): `{"image", "caption", "score", "tokens", "version"}` as
    `captioner caption --json` prints them, or `{"image", "error"}` for an
    image that could not be read or decoded (a dead letter). Nothing is
    written unless every image has its line.

    Args:
      model_path: a SavedModel version folder, or a base path of numbered
        versions (the highest is used).
      images: files, folders (their image files, recursively) and globs.
      output: the JSON-lines file (local or any `tf.io.gfile` path); None:
        stdout.
      runner: `direct`, `dask` or a Beam runner name (`--runner=` in
        `beam_args` wins).
      beam_args: extra Beam pipeline options (`--dask_client_address=...`).
      batch_size: the most images per signature call.
      workers: direct runner worker processes (more than 1: multi_processing;
        default 1), or the local Dask cluster's size (default `DASK_WORKERS`).
      signature: the SavedModel signature to call.
    Returns:
      `{"images", "captioned", "dead_letters", "seconds", "model", "version"}`.
    Raises:
      BulkInputError: no model at `model_path` (or no such signature), or no
        image to caption.
      RecordLossError: the written lines do not account for every image.
    """
    import tensorflow as tf
    start = time.monotonic()
    paths = inputs.expand_images(list(images))
    folder, version = inputs.resolve_model(model_path)
    inputs.check_signature(folder, signature)
    beam_args = [str(a) for a in beam_args]
    tmp = inputs.temp_folder(output, runner, beam_args)
    tf.io.gfile.makedirs(tmp)
    try:
        lines_path = beam_utils.join(tmp, LINES_FILE)
        handler = CaptionModelHandler(folder, signature, version=version,
                                      max_batch_size=batch_size)
        _run_job(paths, handler, lines_path, runner, beam_args, workers)
        pairs, dead = check_lines(_read_lines(lines_path), paths)
        text = "".join(line + "\n" for _, line in pairs)
        if output:
            beam_utils.write_text(output, text)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()
    finally:
        with contextlib.suppress(tf.errors.OpError):
            tf.io.gfile.rmtree(tmp)
    seconds = time.monotonic() - start
    print(f"captioned {len(paths)} images ({dead} dead letters) in {seconds:.1f} s, "
          f"{len(paths) / max(seconds, 1e-9):.1f} img/s", file=sys.stderr, flush=True)
    return {"images": len(paths), "captioned": len(paths) - dead, "dead_letters": dead,
            "seconds": round(seconds, 2), "model": folder, "version": version}
