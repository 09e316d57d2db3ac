"""TF Serving's API messages without importing TensorFlow: the shipped descriptors.

`tensorflow_serving.apis` reaches its messages through the `tensorflow`
package, whose `__init__` takes seconds to import; `captioner caption` would
pay that on every start. This module loads the same `.proto` definitions
(`tf_serving_api.binpb`, a `FileDescriptorSet` written from the installed
`tensorflow-serving-api` by `python -m serving.protos --write`) into a
private descriptor pool, with protobuf's public API, and builds the message
classes and the gRPC method callables from it. The wire format is the
proto's, so a server (this project's or `tensorflow_model_server`) cannot
tell these messages from the generated ones.

The classes are not TensorFlow's: a message of one kind cannot be
`CopyFrom`'d into the other (serialize and parse instead).
`tests/serving/test_protos.py` checks that the shipped file equals what the
installed packages describe, so an upgrade of them cannot drift silently.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

DESCRIPTOR_SET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tf_serving_api.binpb")

# The services the client calls; their files' dependencies come along.
SERVICE_FILES = ("tensorflow_serving/apis/prediction_service.proto",
                 "tensorflow_serving/apis/model_service.proto")
# The generated modules that define them (read only by `descriptor_set`).
_SERVICE_MODULES = ("tensorflow_serving.apis.prediction_service_pb2",
                    "tensorflow_serving.apis.model_service_pb2")


def _load_pool() -> descriptor_pool.DescriptorPool:
    with open(DESCRIPTOR_SET, "rb") as f:
        files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for file_proto in files.file:  # dependencies first
        pool.Add(file_proto)
    return pool


POOL = _load_pool()


def message_class(full_name: str):
    """The message class of `full_name` (`"tensorflow.serving.PredictRequest"`)."""
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(full_name))


TensorProto = message_class("tensorflow.TensorProto")
ModelSpec = message_class("tensorflow.serving.ModelSpec")
PredictRequest = message_class("tensorflow.serving.PredictRequest")
PredictResponse = message_class("tensorflow.serving.PredictResponse")
GetModelMetadataRequest = message_class("tensorflow.serving.GetModelMetadataRequest")
GetModelMetadataResponse = message_class("tensorflow.serving.GetModelMetadataResponse")
SignatureDefMap = message_class("tensorflow.serving.SignatureDefMap")
GetModelStatusRequest = message_class("tensorflow.serving.GetModelStatusRequest")
GetModelStatusResponse = message_class("tensorflow.serving.GetModelStatusResponse")
DATA_TYPE = POOL.FindEnumTypeByName("tensorflow.DataType")
VERSION_STATE = POOL.FindEnumTypeByName("tensorflow.serving.ModelVersionStatus.State")


def _unary(channel, service: str, method: str) -> Callable:
    """`channel`'s callable for one unary RPC of `service`, typed by the pool."""
    descriptor = POOL.FindServiceByName(service).methods_by_name[method]
    request = message_factory.GetMessageClass(descriptor.input_type)
    response = message_factory.GetMessageClass(descriptor.output_type)
    return channel.unary_unary(f"/{service}/{method}",
                               request_serializer=request.SerializeToString,
                               response_deserializer=response.FromString)


@dataclass(frozen=True)
class PredictionService:
    """`tensorflow.serving.PredictionService`'s calls the client makes, on one channel."""
    Predict: Callable  # noqa: N815 (the RPC's name, as in generated stubs)
    GetModelMetadata: Callable  # noqa: N815

    @classmethod
    def on(cls, channel) -> "PredictionService":
        name = "tensorflow.serving.PredictionService"
        return cls(_unary(channel, name, "Predict"), _unary(channel, name, "GetModelMetadata"))


@dataclass(frozen=True)
class ModelService:
    """`tensorflow.serving.ModelService.GetModelStatus`, on one channel."""
    GetModelStatus: Callable  # noqa: N815

    @classmethod
    def on(cls, channel) -> "ModelService":
        return cls(_unary(channel, "tensorflow.serving.ModelService", "GetModelStatus"))


def descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """The services' files and their dependencies, dependencies first, from the installed packages.

    Imports `tensorflow_serving.apis` (and so TensorFlow): for writing and
    checking `tf_serving_api.binpb`, never on the client's path.
    """
    import importlib
    ordered, seen = [], set()

    def visit(file_descriptor):
        if file_descriptor.name in seen:
            return
        seen.add(file_descriptor.name)
        for dependency in file_descriptor.dependencies:
            visit(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file_descriptor.CopyToProto(proto)
        ordered.append(proto)

    for module in _SERVICE_MODULES:
        visit(importlib.import_module(module).DESCRIPTOR)
    return descriptor_pb2.FileDescriptorSet(file=ordered)


def main(argv=None) -> int:
    """`python -m serving.protos --write` rewrites the shipped file; `--check` compares."""
    argv = sys.argv[1:] if argv is None else argv
    wanted = descriptor_set().SerializeToString(deterministic=True)
    if argv == ["--write"]:
        with open(DESCRIPTOR_SET, "wb") as f:
            f.write(wanted)
        print(f"wrote {DESCRIPTOR_SET} ({len(wanted)} bytes)")
        return 0
    if argv == ["--check"]:
        with open(DESCRIPTOR_SET, "rb") as f:
            same = f.read() == wanted
        print("up to date" if same else f"{DESCRIPTOR_SET} differs from the installed "
              "tensorflow-serving-api: run python -m serving.protos --write")
        return 0 if same else 1
    print("usage: python -m serving.protos --write | --check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
