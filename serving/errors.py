"""Serving errors: one exception carrying a gRPC status code, as TF Serving returns.

The same fault gives the same code on every path (gRPC, REST, warmup):
`ServingError.code` is a `grpc.StatusCode`; REST maps it to the HTTP status
TF Serving's HTTP server uses (`http_status`).
"""
from __future__ import annotations

import re

import grpc

# tensorflow_serving/model_servers/http_server.cc: ToHTTPStatusCode.
_HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}
_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


class ServingError(Exception):
    """A request failure with the gRPC status code TF Serving gives the same fault.

    Args:
      code: a `grpc.StatusCode`.
      message: the error details sent to the client.
    """

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        """The HTTP status TF Serving's REST API uses for this code."""
        return http_status(self.code)

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


def http_status(code: grpc.StatusCode) -> int:
    """HTTP status for a gRPC code (TF Serving's mapping)."""
    return _HTTP_STATUS.get(code, 500)


def invalid_argument(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.NOT_FOUND, message)


def failed_precondition(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.FAILED_PRECONDITION, message)


def unavailable(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.UNAVAILABLE, message)


def internal(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.INTERNAL, message)


_NOISE = re.compile(r"^(Graph execution error:|Detected at node .*|<stack traces unavailable>|"
                    r"\s*\[\[.*\]\].*)$")


def clean_tf_message(message: str) -> str:
    """Drops TF's graph-location noise from an op error message, keeps the reason."""
    lines = [line for line in message.splitlines()
             if line.strip() and not _NOISE.match(line)]
    text = " ".join(line.strip() for line in lines) or message.strip()
    return re.sub(r"\s*\[Op:[^\]]*\]\s*$", "", text)


def from_tf_error(error: Exception) -> ServingError:
    """Maps a TensorFlow `OpError` (its canonical code) to a ServingError."""
    number = getattr(error, "error_code", None)
    code = _BY_NUMBER.get(number, grpc.StatusCode.INTERNAL)
    message = getattr(error, "message", None) or str(error)
    return ServingError(code, clean_tf_message(message))
