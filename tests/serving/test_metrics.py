"""TF Serving's Prometheus metrics: scraped from the REST port, parsed with prometheus_client."""
from __future__ import annotations

import urllib.request

import grpc
import pytest
import tensorflow as tf
from prometheus_client.parser import text_string_to_metric_families
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving.server.metrics import (
    DEFAULT_PATH,
    LATENCY_BUCKETS,
    QUEUING_LATENCY,
    REQUEST_COUNT,
    REQUEST_LATENCY,
    RUNTIME_LATENCY,
    WRAPPED_RUN_COUNT,
    ServingMetrics,
    read_monitoring_config,
)
from serving.versions.batching_parameters import BatchingParameters
from tests.serving.conftest import BLUE, GREEN, RED, run_concurrently
from tests.serving.fixtures import b64, rest_call, solid_image


def scrape(server) -> dict:
    """{family name: family} of the server's Prometheus endpoint."""
    with urllib.request.urlopen(server.rest_url + server.metrics_path, timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(family, sample_name: str, **labels) -> float:
    matches = [s.value for s in family.samples
               if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matches) <= 1, matches
    return matches[0] if matches else 0.0


def predict_request(model: str, images) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto(images, dtype=tf.string))
    return request


def test_counts_and_latencies_match_the_requests_sent(make_base, start_server):
    server = start_server(make_base({1: "image"}), metrics_path=DEFAULT_PATH)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(
        grpc.insecure_channel(server.grpc_address))
    for color in (RED, GREEN, BLUE):
        stub.Predict(predict_request("captioner", [solid_image(color)]), timeout=30)
    for _ in range(2):
        with pytest.raises(grpc.RpcError) as e:
            stub.Predict(predict_request("nope", [solid_image(RED)]), timeout=30)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        stub.Predict(predict_request("captioner", [b"not an image"]), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    url = server.rest_url
    for color in (RED, BLUE):
        assert rest_call(url, "/v1/models/captioner:predict",
                         {"instances": [b64(solid_image(color))]})[0] == 200
    assert rest_call(url, "/v1/models/captioner/versions/9:predict",
                     {"instances": [b64(solid_image(RED))]})[0] == 404
    assert rest_call(url, "/v1/models/captioner:predict", {"instances": "x"})[0] == 400
    assert rest_call(url, "/v1/models/captioner")[0] == 200

    families = scrape(server)
    counts = families[REQUEST_COUNT]
    assert value(counts, REQUEST_COUNT, model_name="captioner", status="OK") == 3 + 2 + 1
    assert value(counts, REQUEST_COUNT, model_name="captioner", status="NOT_FOUND") == 1
    assert value(counts, REQUEST_COUNT, model_name="captioner",
                 status="INVALID_ARGUMENT") == 1 + 1
    assert value(counts, REQUEST_COUNT, model_name="nope", status="NOT_FOUND") == 2
    assert sum(s.value for s in counts.samples) == 3 + 2 + 1 + 2 + 1 + 1 + 1

    latency = families[REQUEST_LATENCY]
    assert latency.type == "histogram"
    grpc_ok = dict(model_name="captioner", API="Predict", entrypoint="GRPC")
    rest_ok = dict(model_name="captioner", API="predict", entrypoint="REST")
    assert value(latency, REQUEST_LATENCY + "_count", **grpc_ok) == 3  # successes only
    assert value(latency, REQUEST_LATENCY + "_count", **rest_ok) == 2
    assert value(latency, REQUEST_LATENCY + "_bucket", le="+Inf", **grpc_ok) == 3
    buckets = [s for s in latency.samples if s.name == REQUEST_LATENCY + "_bucket"
               and s.labels["entrypoint"] == "GRPC"]
    assert len(buckets) == len(LATENCY_BUCKETS) + 1
    assert [b.value for b in buckets] == sorted(b.value for b in buckets)  # cumulative
    total_us = value(latency, REQUEST_LATENCY + "_sum", **grpc_ok)
    assert 3 * 100 < total_us < 3 * 30e6  # microseconds

    runtime = families[RUNTIME_LATENCY]
    # 5 successful predictions and the 2 warmup records replayed at load time
    # (the undecodable image is refused from its header, before the model).
    assert value(runtime, RUNTIME_LATENCY + "_count", model_name="captioner",
                 API="Predict", runtime="TF2") == 5 + 2
    assert QUEUING_LATENCY not in families  # batching is off


def test_batching_metrics(make_base, start_server):
    params = BatchingParameters(max_batch_size=4, batch_timeout_micros=100_000,
                                num_batch_threads=1)
    server = start_server(make_base({1: "square"}), metrics_path="/metrics", batching=params)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(
        grpc.insecure_channel(server.grpc_address))
    run_concurrently(lambda c: stub.Predict(predict_request("captioner", [solid_image(c)]),
                                            timeout=30), [RED, GREEN, BLUE, RED])
    families = scrape(server)
    batches = sum(sum(sizes.values()) for sizes in
                  server.manager.get("captioner").batch_sizes().values())
    assert value(families[WRAPPED_RUN_COUNT], WRAPPED_RUN_COUNT) == batches >= 1
    queued = sum(s.value for s in families[QUEUING_LATENCY].samples
                 if s.name == QUEUING_LATENCY + "_count")
    assert queued == 4


def test_metrics_are_off_without_a_monitoring_config(make_base, start_server):
    server = start_server(make_base({1: "image"}))
    status, _ = rest_call(server.rest_url, DEFAULT_PATH)
    assert status == 404


def test_monitoring_config_file(tmp_path):
    path = tmp_path / "monitoring.config"
    path.write_text('prometheus_config { enable: true, path: "/monitoring/prometheus/metrics" }')
    assert read_monitoring_config(str(path)) == (True, "/monitoring/prometheus/metrics")
    path.write_text("prometheus_config { enable: true }")
    assert read_monitoring_config(str(path)) == (True, DEFAULT_PATH)
    path.write_text("prometheus_config { enable: false path: '/m' }")
    assert read_monitoring_config(str(path)) == (False, "/m")
    path.write_text("prometheus_config { enabled: true }")
    with pytest.raises(ValueError, match="no field named"):
        read_monitoring_config(str(path))


def test_exposition_keeps_tf_serving_names():
    metrics = ServingMetrics()
    metrics.record_request('we"ird\\name', "OK", "Predict", "GRPC", 12.0)
    text = metrics.exposition().decode()
    assert ':tensorflow:serving:request_count{model_name="we\\"ird\\\\name",status="OK"} 1.0' \
        in text
    assert "_total" not in text and "_created" not in text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == REQUEST_COUNT]
    assert family.samples[0].labels["model_name"] == 'we"ird\\name'
