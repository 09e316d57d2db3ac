"""Security: loopback by default, safe and configurable limits, no path traversal.

TLS with a given (self-signed) certificate is tested in tests/serving/test_tls.py
(both ports, and that plaintext and untrusted clients are refused).
"""
from __future__ import annotations

import builtins
import io
import ipaddress
import json
import os
import shutil
import socket
from urllib.parse import quote

import grpc
import psutil
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2_grpc,
)

from pipeline.config import ServeConfig
from serving.server.model_server import ModelServer, build_parser
from serving.server.options import ServerOptions
from tests.reliability.test_fuzz_serving import image, png_bomb, request_of_size
from tests.serving.conftest import RED
from tests.serving.fixtures import b64, build_fixture_model, expected_caption, publish_version
from tests.serving.fixtures import rest_call as rest
from tests.serving.test_server import png_header, predict_request

LOOPBACK = "127.0.0.1"


def listening(port: int):
    """Local addresses this process listens on at `port` (IPv4-mapped IPv6 as IPv4: gRPC
    listens on an IPv6 socket bound to ::ffff:127.0.0.1)."""
    addresses = set()
    for c in psutil.Process().net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port:
            ip = ipaddress.ip_address(c.laddr.ip)
            addresses.add(str(getattr(ip, "ipv4_mapped", None) or ip))
    return addresses


def other_addresses():
    """This machine's non-loopback IPv4 addresses."""
    return [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET and not a.address.startswith("127.")]


@pytest.fixture(scope="module")
def base(tmp_path_factory, model_store):
    base = tmp_path_factory.mktemp("security") / "captioner"
    base.mkdir()
    publish_version(model_store["image"], str(base), 1)
    return str(base)


# -- binding ------------------------------------------------------------------------


def test_binds_loopback_by_default(base):
    assert ServeConfig().host == LOOPBACK
    assert build_parser().parse_args(["--model-base-path", base]).host == LOOPBACK
    assert ServerOptions().host == LOOPBACK
    server = ModelServer(base, options=ServerOptions(port=0, rest_port=0, poll_seconds=0)).start()  # no host given
    try:
        assert server.describe().startswith(f"serving: grpc={LOOPBACK}:")
        assert listening(server.grpc_port) == {LOOPBACK}
        assert listening(server.rest_port) == {LOOPBACK}
        for address in other_addresses():  # not reachable from another interface
            for port in (server.grpc_port, server.rest_port):
                with pytest.raises(OSError):
                    socket.create_connection((address, port), timeout=2).close()
        print(f"\nlistening: gRPC {listening(server.grpc_port)}, REST "
              f"{listening(server.rest_port)}; refused on {other_addresses() or 'no other'} "
              f"addresses")
    finally:
        server.stop(grace=0)


# -- limits --------------------------------------------------------------------------


def test_limits_have_safe_defaults(base):
    defaults = ServeConfig()
    assert 0 < defaults.max_request_bytes <= 64 << 20
    assert 0 < defaults.max_image_pixels <= 100_000_000
    args = build_parser().parse_args(["--model-base-path", base])
    assert (args.max_request_bytes, args.max_image_pixels) == (
        defaults.max_request_bytes, defaults.max_image_pixels)
    options = ServerOptions()  # what ModelServer uses when not told
    assert options.max_request_bytes == defaults.max_request_bytes
    assert options.max_image_pixels == defaults.max_image_pixels

    server = ModelServer(base, options=ServerOptions(port=0, rest_port=0, poll_seconds=0)).start()
    try:
        channel = grpc.insecure_channel(server.grpc_address)
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        side = int(defaults.max_image_pixels ** 0.5) + 1  # just over the default limit
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(predict_request([png_header(side, side)]), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"exceeds the limit of {defaults.max_image_pixels} pixels" in info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(request_of_size(defaults.max_request_bytes + 1), timeout=60)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        padded = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING)  # a few bytes, a huge shape
        padded.tensor_shape.dim.add().size = defaults.max_request_bytes + 1
        request = predict_request()
        request.inputs["image_bytes"].CopyFrom(padded)
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(request, timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"more than the limit of {defaults.max_request_bytes}" in info.value.details()
        status, body = rest(server.rest_url, "/v1/models/captioner:predict",
                            b"{" * (defaults.max_request_bytes + 1))
        assert status == 413, body
        channel.close()
    finally:
        server.stop(grace=0)


def test_limits_are_configurable(base):
    args = build_parser().parse_args(["--model-base-path", base, "--max-request-bytes",
                                      "65536", "--max-image-pixels", "10000"])
    server = ModelServer(base, options=ServerOptions(port=0, rest_port=0, poll_seconds=0, max_request_bytes=args.max_request_bytes, max_image_pixels=args.max_image_pixels)).start()
    try:
        channel = grpc.insecure_channel(server.grpc_address)
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        at_limit = image(RED, 100, 100, "PNG")
        response = stub.Predict(predict_request([at_limit]), timeout=30)
        assert response.outputs["caption"].string_val == [expected_caption(RED).encode()]
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(predict_request([image(RED, 101, 100, "PNG")]), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "10100 pixels exceeds the limit of 10000 pixels" in info.value.details()
        assert stub.Predict(request_of_size(65536), timeout=30).outputs["caption"].string_val
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(request_of_size(65537), timeout=30)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        status, body = rest(server.rest_url, "/v1/models/captioner:predict",
                            {"instances": [b64(png_bomb(8000, 8000))]})
        assert status == 400 and "exceeds the limit of 10000 pixels" in body["error"], body
        status, body = rest(server.rest_url, "/v1/models/captioner:predict", b"{" * 65537)
        assert status == 413 and "exceeds the limit of 65536 bytes" in body["error"], body
        channel.close()
    finally:
        server.stop(grace=0)


# -- paths ---------------------------------------------------------------------------------


class FileAccess:
    """Records the paths that Python-level file functions (builtins, os, tf.io.gfile,
    tf.saved_model.load) are called with while installed."""

    OS = ("open", "stat", "lstat", "listdir", "scandir", "access", "readlink")
    GFILE = ("exists", "listdir", "glob", "isdir", "stat", "walk", "GFile")

    def __init__(self, monkeypatch):
        self.paths = []
        self.on = False
        for module, names in ((builtins, ("open",)), (io, ("open",)), (os, self.OS),
                              (tf.io.gfile, self.GFILE), (tf.saved_model, ("load",))):
            for name in names:
                monkeypatch.setattr(module, name, self._wrap(getattr(module, name)))

    def _wrap(self, fn):
        def wrapper(path=None, *args, **kwargs):
            if self.on and isinstance(path, (str, bytes, os.PathLike)):
                self.paths.append(os.fsdecode(path))
            return fn(*args, **kwargs) if path is None else fn(path, *args, **kwargs)
        return wrapper


def test_no_request_path_reads_outside_the_model_folders(tmp_path, base, model_store,
                                                         monkeypatch):
    # A real SavedModel outside the base path: it would answer "... circle".
    outside = tmp_path / "outside"
    secret = outside / "secret"
    build_fixture_model(str(secret / "1"), noun="circle")
    shutil.copytree(secret / "1", outside / "1")
    assert (secret / "1" / "saved_model.pb").exists()
    base_real = os.path.realpath(base)
    relative = os.path.relpath(secret, base)  # e.g. ../../<tmp>/outside/secret
    names = [str(secret), str(secret / "1"), str(outside), relative, relative + "/1",
             "../" + relative, os.path.relpath(outside, base), "secret", "outside",
             "captioner/../" + relative, "file://" + str(secret), str(secret) + "\x00",
             base, os.path.join(base, "1"), "../captioner", "./captioner", "captioner/1",
             quote(str(secret), safe=""), "%2e%2e/outside/secret"]
    server = ModelServer(base, options=ServerOptions(port=0, rest_port=0, poll_seconds=0)).start()  # polls once
    access = FileAccess(monkeypatch)
    access.on = True
    assert tf.io.gfile.exists(str(secret)) and str(secret) in access.paths  # hooks work
    access.paths.clear()
    answers = []
    try:
        channel = grpc.insecure_channel(server.grpc_address)
        predictions = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        models = model_service_pb2_grpc.ModelServiceStub(channel)

        def call(fn, request, code):
            with pytest.raises(grpc.RpcError) as info:
                fn(request, timeout=30)
            assert info.value.code() == code, (request, info.value.details())
            answers.append(info.value.details())

        image_ = [b"\x89PNG not read"]
        for name in names:
            for version in (None, 1):
                spec = {} if version is None else {"version": {"value": version}}
                call(predictions.Predict, predict_request(image_, name=name, **spec),
                     grpc.StatusCode.NOT_FOUND)
                call(predictions.GetModelMetadata, get_model_metadata_pb2.GetModelMetadataRequest(
                    model_spec=model_pb2.ModelSpec(name=name, **spec),
                    metadata_field=["signature_def"]), grpc.StatusCode.NOT_FOUND)
                call(models.GetModelStatus, get_model_status_pb2.GetModelStatusRequest(
                    model_spec=model_pb2.ModelSpec(name=name, **spec)), grpc.StatusCode.NOT_FOUND)
            call(predictions.Predict, predict_request(image_, version_label=name),
                 grpc.StatusCode.INVALID_ARGUMENT)
            call(models.GetModelStatus, get_model_status_pb2.GetModelStatusRequest(
                model_spec=model_pb2.ModelSpec(name="captioner", version_label=name)),
                grpc.StatusCode.INVALID_ARGUMENT)
            for signature in (name, os.path.join(name, "1", "saved_model.pb")):
                call(predictions.Predict, predict_request(image_, signature=signature),
                     grpc.StatusCode.FAILED_PRECONDITION)
            quoted = quote(name, safe="")
            for path, status in ((f"/v1/models/{quoted}:predict", 404),
                                 (f"/v1/models/{quoted}/versions/1:predict", 404),
                                 (f"/v1/models/{quoted}", 404),
                                 (f"/v1/models/{quoted}/metadata", 404),
                                 (f"/v1/models/captioner/labels/{quoted}:predict", 400)):
                code, body = rest(server.rest_url, path, {"instances": [b64(image_[0])]}
                                  if path.endswith(":predict") else None)
                assert code == status, (path, body)
                answers.append(body["error"])
            code, body = rest(server.rest_url, "/v1/models/captioner:predict",
                              {"signature_name": name, "instances": [b64(image_[0])]})
            assert code == 400, body
        for path in ("/v1/models/../../outside/secret:predict",
                     "/v1/models/captioner/versions/1/../../../outside/secret/1:predict",
                     "/v1/models/..%2F..%2Foutside%2Fsecret:predict",
                     f"/v1/models/{quote(relative, safe='')}:predict",
                     "/../outside/secret/1/saved_model.pb"):
            with socket.create_connection(("127.0.0.1", server.rest_port), timeout=30) as sock:
                body = json.dumps({"instances": [b64(image_[0])]}).encode()
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
                             f"\r\nConnection: close\r\n\r\n".encode() + body)
                reply = b"".join(iter(lambda: sock.recv(65536), b""))
            status = int(reply.split(b" ", 2)[1])
            assert status in (400, 404), (path, reply[:300])
            answers.append(reply.decode("latin-1"))
        requests = len(answers)
        channel.close()
    finally:
        access.on = False
        server.stop(grace=0)
    assert not any("circle" in a for a in answers)
    assert server.manager.model_names == ["captioner"]
    outside_base = [p for p in access.paths
                    if not os.path.realpath(p).startswith(base_real + os.sep)]
    assert not outside_base, outside_base
    print(f"\npath traversal: {len(names)} path-like names, {requests} requests, "
          f"{len(access.paths)} file accesses during them, 0 outside {base}")
