"""TensorFlow Serving's metrics, in Prometheus text format.

The names, labels and units are those `tensorflow_model_server` exports on
its `--monitoring_config_file` Prometheus endpoint, so dashboards and alerts
written for TF Serving work unchanged:

- `:tensorflow:serving:request_count` {model_name, status}: requests by
  outcome (`status` is the gRPC code name: OK, INVALID_ARGUMENT, ...);
- `:tensorflow:serving:request_latency` {model_name, API, entrypoint}:
  histogram of successful requests' wall time in microseconds (`entrypoint`
  GRPC or REST);
- `:tensorflow:serving:runtime_latency` {model_name, API, runtime}:
  histogram of the time spent running the model, in microseconds;
- with batching on, `:tensorflow:serving:batching_session:queuing_latency`
  {thread_pool_name} (microseconds a request waited for its batch) and
  `:tensorflow:serving:batching_session:wrapped_run_count` (batches run).

Histograms have TF Serving's buckets (10 us x 1.8^i, 33 of them; queuing:
100 us x 1.2^i, 52). The exposition is `prometheus_client`'s; counters are
written as `untyped` because that library appends `_total` to anything
typed `counter`, and the names must stay TF Serving's.
"""
from __future__ import annotations

import bisect
import threading
from typing import Dict, Iterable, List, Sequence, Tuple

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

PREFIX = ":tensorflow:serving:"
REQUEST_COUNT = PREFIX + "request_count"
REQUEST_LATENCY = PREFIX + "request_latency"
RUNTIME_LATENCY = PREFIX + "runtime_latency"
QUEUING_LATENCY = PREFIX + "batching_session:queuing_latency"
WRAPPED_RUN_COUNT = PREFIX + "batching_session:wrapped_run_count"
CONTENT_TYPE = CONTENT_TYPE_LATEST
# The runtime label: TF Serving says TF1 (session) or TFRT; this server runs
# the signatures as TF2 concrete functions.
RUNTIME = "TF2"


def exponential_buckets(scale: float, growth: float, count: int) -> List[float]:
    """Upper bounds `scale * growth**i`, i < count (TF's Buckets::Exponential)."""
    return [scale * growth ** i for i in range(count)]


LATENCY_BUCKETS = exponential_buckets(10, 1.8, 33)
QUEUING_BUCKETS = exponential_buckets(100, 1.2, 52)


class _Histogram:
    """Bucket counts and sum for one label set; `bounds` exclude +Inf."""

    def __init__(self, bounds: Sequence[float]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> List[Tuple[str, int]]:
        cumulative, out = 0, []
        for bound, count in zip(list(self.bounds) + [float("inf")], self.counts, strict=True):
            cumulative += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
        return out


class ServingMetrics(Collector):
    """Thread-safe request, runtime and batching metrics (see module doc).

    Args:
      batching: whether the batching metrics are exported.
    """

    def __init__(self, batching: bool = False):
        self.batching = batching
        self._lock = threading.Lock()
        self._counts: Dict[Tuple[str, str], int] = {}
        self._request: Dict[Tuple[str, str, str], _Histogram] = {}
        self._runtime: Dict[Tuple[str, str, str], _Histogram] = {}
        self._queuing: Dict[Tuple[str], _Histogram] = {}
        self._batches = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    # -- recording -----------------------------------------------------------

    def record_request(self, model_name: str, status: str, api: str, entrypoint: str,
                       micros: float) -> None:
        """Counts one request; its latency joins the histogram only when OK (as TF Serving).

        Args:
          model_name: the model the request named.
          status: gRPC code name (`OK`, `NOT_FOUND`, ...).
          api: `Predict`, `GetModelMetadata`, ... (REST: `predict`, ...).
          entrypoint: `GRPC` or `REST`.
          micros: wall time of the request in microseconds.
        """
        with self._lock:
            key = (model_name, status)
            self._counts[key] = self._counts.get(key, 0) + 1
            if status == "OK":
                self._histogram(self._request, (model_name, api, entrypoint),
                                LATENCY_BUCKETS).observe(micros)

    def record_runtime(self, model_name: str, api: str, micros: float) -> None:
        """One run of a model's signature took `micros` microseconds."""
        with self._lock:
            self._histogram(self._runtime, (model_name, api, RUNTIME),
                            LATENCY_BUCKETS).observe(micros)

    def record_batch(self, thread_pool_name: str, queued_micros: Iterable[float]) -> None:
        """One batch ran; `queued_micros`: how long each of its requests waited."""
        with self._lock:
            self._batches += 1
            histogram = self._histogram(self._queuing, (thread_pool_name,), QUEUING_BUCKETS)
            for micros in queued_micros:
                histogram.observe(micros)

    @staticmethod
    def _histogram(table, key, bounds) -> _Histogram:
        histogram = table.get(key)
        if histogram is None:
            histogram = table[key] = _Histogram(bounds)
        return histogram

    # -- exposition ----------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        """The metric families (prometheus_client's Collector protocol)."""
        with self._lock:
            counts = dict(self._counts)
            request = {k: (h.buckets(), h.total) for k, h in self._request.items()}
            runtime = {k: (h.buckets(), h.total) for k, h in self._runtime.items()}
            queuing = {k: (h.buckets(), h.total) for k, h in self._queuing.items()}
            batches = self._batches
        family = Metric(REQUEST_COUNT, "The total number of requests.", "unknown")
        for (model_name, status), value in sorted(counts.items()):
            family.add_sample(REQUEST_COUNT, {"model_name": model_name, "status": status},
                              value)
        yield family
        yield _histogram_family(REQUEST_LATENCY, "Distribution of wall time (in microseconds) "
                                "for Tensorflow Serving request.",
                                ("model_name", "API", "entrypoint"), request)
        yield _histogram_family(RUNTIME_LATENCY, "Distribution of wall time (in microseconds) "
                                "for Tensorflow runtime.", ("model_name", "API", "runtime"),
                                runtime)
        if self.batching:
            yield _histogram_family(QUEUING_LATENCY, "Distribution of wall time spent (in "
                                    "microseconds) in queuing", ("thread_pool_name",), queuing)
            family = Metric(WRAPPED_RUN_COUNT,
                            "Total count of run calls on the wrapped session", "unknown")
            family.add_sample(WRAPPED_RUN_COUNT, {}, batches)
            yield family

    def exposition(self) -> bytes:
        """The Prometheus text exposition (format 0.0.4) of every metric."""
        return generate_latest(self.registry)


def _histogram_family(name: str, documentation: str, labels: Tuple[str, ...],
                      points: Dict[tuple, tuple]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for key, (buckets, total) in sorted(points.items()):
        family.add_metric(list(key), buckets, total)
    return family


DEFAULT_PATH = "/monitoring/prometheus/metrics"


def read_monitoring_config(path: str) -> Tuple[bool, str]:
    """Parses TF Serving's `--monitoring_config_file` (MonitoringConfig text format).

    Returns:
      (enabled, path): whether Prometheus export is on and the URL path it is
      served at (TF Serving's default `/monitoring/prometheus/metrics`).
    Raises:
      ValueError: unreadable or unparsable file, or a path not starting with '/'.
    """
    from serving.server.config_protos import MonitoringConfig, parse_text_file

    prometheus = parse_text_file(path, MonitoringConfig).prometheus_config
    url_path = prometheus.path or DEFAULT_PATH
    if not url_path.startswith("/"):
        raise ValueError(f"{path}: prometheus_config.path must start with '/'")
    return prometheus.enable, url_path
