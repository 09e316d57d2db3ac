"""Beam helpers for the Beam stages: runner options, a Keras model handler, metrics.

* `pipeline_options` turns `PreprocessConfig.runner` (+ `--beam-arg`s) into
  `PipelineOptions`, always naming the runner (Beam would otherwise try to
  download Prism) and, for `portable`, starting an in-process job service
  with the LOOPBACK environment.
* `KerasModelHandler` is a `RunInference` model handler for Keras 3 `.keras`
  files (Beam's `TFModelHandler*` cannot load them).
* `counters` / `distributions` read user metrics back from a `PipelineResult`.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.ml.inference.base import ModelHandler
from apache_beam.options.pipeline_options import PipelineOptions

# `PreprocessConfig.runner` short names -> Beam runner class names.
RUNNER_ALIASES = {
    "direct": "DirectRunner",
    "portable": "PortableRunner",
    "flink": "FlinkRunner",
    "spark": "SparkRunner",
    "dataflow": "DataflowRunner",
    "prism": "PrismRunner",
    # Beam's DaskRunner with the project's fixes (components/beam/dask_runner.py).
    "dask": "components.beam.dask_runner.DaskRunner",
}
DASK_RUNNER = RUNNER_ALIASES["dask"]
DIRECT_RUNNING_MODES = ("in_memory", "multi_threading", "multi_processing")


def runner_name(name: str) -> str:
    """The Beam runner class name for a config name (`direct` -> `DirectRunner`).

    Beam's own DaskRunner, named by its path, gets the project's adapter: the
    stock runner loses data (docs/beam.md, "Dask").
    """
    name = (name or "").strip()
    if not name:
        raise ValueError("no Beam runner named: set preprocess.runner (direct, portable, "
                         "dask, or a Beam runner name such as FlinkRunner)")
    if name in ("DaskRunner", "apache_beam.runners.dask.dask_runner.DaskRunner"):
        return DASK_RUNNER
    return RUNNER_ALIASES.get(name.lower(), name)


def flag_value(args: Sequence[str], flag: str) -> Optional[str]:
    """The last value of `--flag=value` / `--flag value` in `args` (None if absent)."""
    value = None
    key = f"--{flag}"
    for i, arg in enumerate(args):
        if arg.startswith(key + "="):
            value = arg.split("=", 1)[1]
        elif arg == key and i + 1 < len(args):
            value = args[i + 1]
    return value


def start_local_job_service() -> tuple[Any, str]:
    """Starts Beam's local job service in this process.

    Returns:
      (servicer, endpoint): call `servicer.stop()` when done; the endpoint is
      `localhost:<port>` for `--job_endpoint`.
    """
    from apache_beam.runners.portability import local_job_service
    servicer = local_job_service.LocalJobServicer()
    port = servicer.start_grpc_server(0)
    return servicer, f"localhost:{port}"


@contextlib.contextmanager
def pipeline_options(runner: str = "direct", beam_args: Sequence[str] = (), *,
                     direct_num_workers: int = 1, direct_running_mode: str = "in_memory",
                     job_name: str | None = None,
                     dask_workers: int = 2) -> Iterator[PipelineOptions]:
    """Pipeline options for a runner, as a context manager.

    The runner comes from `runner` unless `beam_args` name one
    (`--runner=FlinkRunner`); `beam_args` come last, so they override
    anything set here. `portable` without `--job_endpoint` starts a local job
    service for the duration of the block and runs the SDK harness in this
    process (`--environment_type=LOOPBACK`). `dask` without
    `--dask_client_address` starts a local Dask cluster of `dask_workers`
    worker processes for the duration of the block.

    Args:
      runner: `direct`, `portable`, `flink`, `spark`, `dataflow` or a Beam
        runner class name.
      beam_args: extra Beam command-line options (from `--beam-arg`).
      direct_num_workers: DirectRunner workers (threads or processes).
      direct_running_mode: `in_memory`, `multi_threading` or `multi_processing`.
      job_name: a job name for runners that use one (Dataflow, Flink).
      dask_workers: `dask` without a scheduler address: local worker processes.
    Yields:
      `PipelineOptions`.
    """
    user = [str(a) for a in beam_args]
    name = runner_name(flag_value(user, "runner") or runner)
    # A user's `--runner=` resolved the same way (Beam's DaskRunner -> the adapter).
    user = [f"--runner={name}" if a.startswith("--runner=") else a for a in user]
    args = [f"--runner={name}"]
    servicer = cluster = None
    if name in ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner"):
        if direct_running_mode not in DIRECT_RUNNING_MODES:
            raise ValueError(f"direct_running_mode {direct_running_mode!r}: expected one of "
                             f"{', '.join(DIRECT_RUNNING_MODES)}")
        args += [f"--direct_running_mode={direct_running_mode}",
                 f"--direct_num_workers={max(1, int(direct_num_workers))}"]
    elif name == "PortableRunner":
        if not flag_value(user, "job_endpoint"):
            servicer, endpoint = start_local_job_service()
            args.append(f"--job_endpoint={endpoint}")
        if not flag_value(user, "environment_type"):
            args.append("--environment_type=LOOPBACK")
    elif name == DASK_RUNNER:
        if not (flag_value(user, "dask_client_address") or flag_value(user, "dask_scheduler_file")):
            from components.beam import dask_cluster
            cluster = dask_cluster.start_local_cluster(dask_workers)
            args.append(f"--dask_client_address={cluster.scheduler_address}")
    if job_name and not flag_value(user, "job_name"):
        args.append(f"--job_name={job_name}")
    try:
        yield PipelineOptions(args + user)
    finally:
        if servicer is not None:
            servicer.stop()
        if cluster is not None:
            cluster.close()


def _local_copy(path: str) -> tuple[str, Optional[str]]:
    """A local path for `path` (copied from gs:// etc. if needed) and a temp dir to remove."""
    if "://" not in path:
        return path, None
    import tensorflow as tf
    tmp = tempfile.mkdtemp(prefix="model-")
    local = os.path.join(tmp, os.path.basename(path))
    tf.io.gfile.copy(path, local, overwrite=True)
    return local, tmp


class _CompiledModel:
    """A Keras model called through one traced `tf.function` (no per-batch retracing)."""

    def __init__(self, model, input_shape: Sequence[int]):
        import tensorflow as tf
        self.keras_model = model
        self.input_shape = tuple(int(v) for v in input_shape)
        self._fn = tf.function(
            lambda x: model(x, training=False),
            input_signature=[tf.TensorSpec((None, *self.input_shape), tf.float32)])

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        return self._fn(batch).numpy()


class KerasModelHandler(ModelHandler[np.ndarray, np.ndarray, _CompiledModel]):
    """Runs a Keras 3 `.keras` model on batches of numpy arrays in `RunInference`.

    Each output is the model's output array for one example (not a
    `PredictionResult`: the input image is not kept alive until the output
    is written).

    The model is loaded once per worker process (RunInference keeps it in a
    process-wide `Shared` handle across bundles and DoFn instances).

    Args:
      model_path: the `.keras` file (local or any `tf.io.gfile` path).
      input_shape: one example's shape, e.g. `(S, S, 3)`.
      output_dtype: numpy dtype of the returned arrays (e.g. `float16`).
      min_batch_size, max_batch_size: `BatchElements` bounds.
      metrics_namespace: namespace of RunInference's own metrics.
      custom_modules: modules to import before loading, so that the model's
        registered custom layers are known in a fresh worker process.
    """

    def __init__(self, model_path: str, *, input_shape: Sequence[int],
                 output_dtype: str = "float32", min_batch_size: int | None = None,
                 max_batch_size: int | None = None,
                 metrics_namespace: str = "RunInference",
                 custom_modules: Sequence[str] = ()):
        if min_batch_size is not None and max_batch_size is not None:
            min_batch_size = min(min_batch_size, max_batch_size)
        super().__init__(min_batch_size=min_batch_size, max_batch_size=max_batch_size)
        self.model_path = model_path
        self.input_shape = tuple(int(v) for v in input_shape)
        self.output_dtype = np.dtype(output_dtype).name
        self._metrics_namespace = metrics_namespace
        self.custom_modules = tuple(custom_modules)

    def load_model(self) -> _CompiledModel:
        import importlib

        import keras
        for module in self.custom_modules:
            importlib.import_module(module)
        local, tmp = _local_copy(self.model_path)
        try:
            model = keras.saving.load_model(local, compile=False)
        finally:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
        expected = tuple(model.input_shape[1:])
        if len(expected) != len(self.input_shape) or any(
                d is not None and d != s for d, s in zip(expected, self.input_shape, strict=True)):
            raise ValueError(f"{self.model_path} takes inputs {expected}, "
                             f"not {self.input_shape}")
        return _CompiledModel(model, self.input_shape)

    def run_inference(self, batch: Sequence[np.ndarray], model: _CompiledModel,
                      inference_args: Optional[dict[str, Any]] = None) -> Iterable[np.ndarray]:
        x = np.stack([np.asarray(b, dtype=np.float32) for b in batch])  # (B, *input_shape)
        y = model(x).astype(self.output_dtype, copy=False)
        return list(y)

    def get_num_bytes(self, batch: Sequence[np.ndarray]) -> int:
        # The default pickles the whole batch just to measure it.
        return int(sum(np.asarray(b).nbytes for b in batch))

    def get_metrics_namespace(self) -> str:
        return self._metrics_namespace


class WriteTFRecordShards(beam.PTransform):
    """Writes serialized records to `<prefix>-SSSSS-of-NNNNN<suffix>` TFRecord shards.

    With `num_shards=0` nothing is grouped: every bundle writes its records
    straight to its own temporary files, a file is closed once it holds
    `max_shard_bytes`, and the finalize step renames the files (the shard
    count is the number of files written). Memory stays flat in the number of
    records on every runner, the in-memory DirectRunner included. With
    `num_shards=N > 0` Beam assigns records round-robin to N keys and groups
    them (`WriteToTFRecord(num_shards=N)`): exactly N files, at the cost of a
    GroupByKey over every record, which the DirectRunner holds in memory.

    Args:
      file_path_prefix: path prefix of the shards (local, gs://, s3://).
      file_name_suffix: e.g. `.tfrecord`.
      num_shards: 0 (streamed) or the exact number of shards.
      max_shard_bytes: `num_shards=0`: close a shard after this many bytes
        (0 = one file per bundle).
      shard_name_template: Beam's template, e.g. `-SSSSS-of-NNNNN`.
    """

    def __init__(self, file_path_prefix: str, *, file_name_suffix: str = "",
                 num_shards: int = 0, max_shard_bytes: int = 0,
                 shard_name_template: str | None = None):
        super().__init__()
        from apache_beam.coders import coders
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.tfrecordio import _TFRecordSink
        self._sink = _TFRecordSink(file_path_prefix, coders.BytesCoder(), file_name_suffix,
                                   max(0, int(num_shards)), shard_name_template,
                                   CompressionTypes.AUTO)
        if num_shards <= 0 and max_shard_bytes > 0:
            # Honoured by FileBasedSink's per-bundle writer (`at_capacity`);
            # `WriteToTFRecord` does not expose it.
            self._sink.max_bytes_per_shard = int(max_shard_bytes)

    def expand(self, pcoll):
        return pcoll | beam.io.Write(self._sink)


def _metric_value(result) -> Any:
    committed = getattr(result, "committed", None)
    return committed if committed is not None else result.attempted


def counters(result: beam.runners.runner.PipelineResult,
             namespace: str) -> Optional[dict[str, int]]:
    """User counters of `namespace`, summed over steps; None if the runner reports none."""
    from apache_beam.metrics.metric import MetricsFilter
    try:
        found = result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]
    except (NotImplementedError, AttributeError, KeyError):
        return None
    if not found:
        return None
    totals: dict[str, int] = {}
    for r in found:
        totals[r.key.metric.name] = totals.get(r.key.metric.name, 0) + int(_metric_value(r) or 0)
    return totals


def distributions(result: beam.runners.runner.PipelineResult,
                  namespace: str) -> dict[str, dict[str, float]]:
    """User distributions of `namespace`: name -> {count, sum, mean}, summed over steps."""
    from apache_beam.metrics.metric import MetricsFilter
    try:
        found = result.metrics().query(
            MetricsFilter().with_namespace(namespace))["distributions"]
    except (NotImplementedError, AttributeError, KeyError):
        return {}
    totals: dict[str, dict[str, float]] = {}
    for r in found:
        value = _metric_value(r)
        if value is None or not value.count:
            continue
        t = totals.setdefault(r.key.metric.name, {"count": 0, "sum": 0})
        t["count"] += value.count
        t["sum"] += value.sum
    for t in totals.values():
        t["mean"] = t["sum"] / t["count"]
    return totals


def wait_with_progress(result, report: Callable[[], Optional[str]], log: Callable[[str], None],
                       interval: float = 15.0) -> str:
    """Waits for a pipeline, logging `report()` every `interval` seconds meanwhile.

    Runners that run synchronously (the in-process DirectRunner) are already
    done here; for asynchronous ones (portable, Flink, Dataflow) the driver
    polls the report (typically counters) while waiting.

    Returns:
      The final pipeline state.
    """
    from apache_beam.runners.runner import PipelineState
    if PipelineState.is_terminal(result.state):
        return result.state
    stop = threading.Event()

    def poll():
        while not stop.wait(interval):
            try:
                line = report()
            except Exception:  # progress is best effort; never fail the run for it
                line = None
            if line:
                log(line)

    thread = threading.Thread(target=poll, name="beam-progress", daemon=True)
    thread.start()
    try:
        return result.wait_until_finish()
    finally:
        stop.set()
        thread.join(timeout=1.0)


# A progress bar the driver opened for DoFns that run in its own process
# (the DirectRunner's in_memory and multi_threading modes); None otherwise.
_LOCAL_BAR = None


@contextlib.contextmanager
def local_progress_bar(desc: str, total: int | None, unit: str):
    """A tqdm bar (rate, ETA) on stderr that `ProgressLog`s in this process advance.

    DoFns running in other processes (multi_processing, portable and remote
    runners) do not see it and log lines instead.

    Args:
      desc: the bar's label.
      total: the expected count (None: no ETA).
      unit: what is counted.
    """
    global _LOCAL_BAR
    from tqdm import tqdm
    bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, mininterval=0.5)
    _LOCAL_BAR = bar
    try:
        yield bar
    finally:
        _LOCAL_BAR = None
        bar.close()


class ProgressLog:
    """Per-process progress lines from inside a DoFn, at most one per `interval` seconds.

    Worker-side, so it works on every runner (the lines go to the worker
    logs on remote runners and to stderr locally). In the driver's own
    process, inside `local_progress_bar`, it advances that bar instead.
    """

    def __init__(self, label: str, unit: str = "items", interval: float = 15.0):
        self.label, self.unit, self.interval = label, unit, interval
        self.count = 0
        self._start = self._last = time.monotonic()
        self._lock = threading.Lock()

    def add(self, n: int = 1) -> None:
        bar = _LOCAL_BAR
        if bar is not None:
            with self._lock:
                bar.update(n)
            return
        with self._lock:
            self.count += n
            now = time.monotonic()
            if now - self._last < self.interval:
                return
            self._last = now
            rate = self.count / max(now - self._start, 1e-9)
            count = self.count
        print(f"[{self.label}] pid {os.getpid()}: {count} {self.unit} "
              f"({rate:.1f}/s)", file=sys.stderr, flush=True)


def write_text(path: str, text: str) -> None:
    """Writes a text file through `tf.io.gfile` (local, gs://, ...) via a temp name."""
    import tensorflow as tf
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write(text)
    tf.io.gfile.rename(tmp, path, overwrite=True)


def match_files(pattern: str) -> list[str]:
    """Files matching a glob through Beam FileSystems (local, gs://, s3://), sorted."""
    from apache_beam.io.filesystems import FileSystems
    results = FileSystems.match([pattern])
    return sorted(m.path for r in results for m in r.metadata_list)


def join(*parts: str) -> str:
    """Path join that keeps `gs://bucket/...` style URLs intact."""
    from apache_beam.io.filesystems import FileSystems
    return FileSystems.join(*parts)
