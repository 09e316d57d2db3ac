"""TF Serving's MonitoringConfig and SSLConfig, which `tensorflow-serving-api` does not ship.

The two messages are declared here field for field as in
`tensorflow_serving/config/monitoring_config.proto` and `ssl_config.proto`
(package `tensorflow.serving`), so `--monitoring_config_file` and
`--ssl_config_file` are parsed by protobuf's own text-format parser, with
its errors for unknown fields and bad values, as `tensorflow_model_server`
parses them.
"""
from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

_FILE = "captioner/tensorflow_serving_config_subset.proto"
_BOOL = descriptor_pb2.FieldDescriptorProto.TYPE_BOOL
_STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name=_FILE, package="tensorflow.serving",
                                               syntax="proto3")

    def message(name, fields):
        m = proto.message_type.add(name=name)
        for number, (field, kind, type_name) in enumerate(fields, start=1):
            f = m.field.add(name=field, number=number, type=kind, label=_OPTIONAL)
            if type_name:
                f.type_name = type_name

    message("PrometheusConfig", [("enable", _BOOL, None), ("path", _STRING, None)])
    message("MonitoringConfig", [("prometheus_config", _MESSAGE,
                                  ".tensorflow.serving.PrometheusConfig")])
    message("SSLConfig", [("server_key", _STRING, None), ("server_cert", _STRING, None),
                          ("custom_ca", _STRING, None), ("client_verify", _BOOL, None)])
    return proto


# A private pool: TF or TF Serving may register the real messages in the
# default pool under the same names.
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file_descriptor())
MonitoringConfig = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName("tensorflow.serving.MonitoringConfig"))
SSLConfig = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName("tensorflow.serving.SSLConfig"))


def parse_text_file(path: str, message_class):
    """Reads a text-format protobuf file into a new `message_class`.

    Raises:
      ValueError: the file cannot be read or parsed (the message says where).
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    message = message_class()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as e:
        raise ValueError(f"{path}: {e}") from None
    return message
