"""The gRPC services of `ModelServer`: TF Serving's PredictionService and ModelService.

Every failure becomes a gRPC status, never a crash; status details are cut
to fit the trailers gRPC clients accept.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

import grpc
from tensorflow_serving.apis import (
    model_management_pb2,
    model_service_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2,
    prediction_service_pb2_grpc,
)

from serving.errors import ServingError
from serving.limits.work_admission import grpc_deadline
from serving.server.metrics import ServingMetrics
from serving.server.predictor import Predictor

log = logging.getLogger(__name__)

PREDICTION_SERVICE = prediction_service_pb2.DESCRIPTOR.services_by_name[
    "PredictionService"].full_name
MODEL_SERVICE = model_service_pb2.DESCRIPTOR.services_by_name["ModelService"].full_name


# Status details travel percent-encoded in the trailers, and gRPC clients
# refuse trailers over 8 KiB (by default) with RESOURCE_EXHAUSTED instead of
# the real status: details that echo a long request field are cut to fit.
MAX_DETAILS_BYTES = 4096


def _details(message: str) -> str:
    """`message`, cut so that its percent-encoded form fits MAX_DETAILS_BYTES."""
    size = 0
    for i, char in enumerate(message):
        if " " <= char <= "~" and char != "%":
            size += 1
        else:  # each UTF-8 byte becomes %XX
            size += 3 * len(char.encode("utf-8", "surrogatepass"))
        if size > MAX_DETAILS_BYTES - 64:  # room for the note
            return f"{message[:i]}... ({len(message) - i} more characters)"
    return message


def _handle(context: grpc.ServicerContext, fn, request, metrics: Optional[ServingMetrics] = None,
            api: str = ""):
    """Runs one RPC; every failure becomes a status code, never a crash.

    With `metrics`, the request is counted as TF Serving counts its
    PredictionService calls (model name, status; latency when OK).
    """
    started = time.perf_counter()
    code = grpc.StatusCode.OK
    try:
        return fn(request)
    except ServingError as e:
        code = e.code
        context.abort(e.code, _details(e.message))
    except Exception as e:
        code = grpc.StatusCode.INTERNAL
        log.exception("unexpected error")
        context.abort(grpc.StatusCode.INTERNAL, _details(f"{type(e).__name__}: {e}"))
    finally:
        if metrics is not None:
            metrics.record_request(request.model_spec.name, code.name, api, "GRPC",
                                   1e6 * (time.perf_counter() - started))


def _unimplemented(what: str):
    def fail(request):
        raise ServingError(grpc.StatusCode.UNIMPLEMENTED, f"{what} is not supported by this "
                                                          f"server")
    return fail


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, predictor: Predictor, metrics: Optional[ServingMetrics]):
        self.predictor = predictor
        self.metrics = metrics

    def Predict(self, request, context):
        # Nothing starts once the client gave up; a batched request expected to
        # be answered after its deadline is refused at once (RESOURCE_EXHAUSTED),
        # and one whose client cancels while it waits for its batch never runs.
        deadline = grpc_deadline(context)
        return _handle(context, lambda r: self.predictor.predict(r, deadline, context.is_active),
                       request, self.metrics, "Predict")

    def GetModelMetadata(self, request, context):
        return _handle(context, self.predictor.metadata, request)

    def Classify(self, request, context):
        return _handle(context, _unimplemented("Classify"), request, self.metrics, "Classify")

    def Regress(self, request, context):
        return _handle(context, _unimplemented("Regress"), request, self.metrics, "Regress")

    def MultiInference(self, request, context):
        _handle(context, _unimplemented("MultiInference"), request)


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, server):
        self.server = server

    def GetModelStatus(self, request, context):
        return _handle(context, self.server.predictor.model_status, request)

    def HandleReloadConfigRequest(self, request, context):
        response = model_management_pb2.ReloadConfigResponse()
        try:
            self.server.reload_config(request.config)
        except ServingError as e:
            response.status.error_code = e.code.value[0]
            response.status.error_message = e.message
            context.set_code(e.code)
            context.set_details(_details(e.message))
            return response
        except Exception as e:
            log.exception("config reload failed")
            context.abort(grpc.StatusCode.INTERNAL, _details(f"{type(e).__name__}: {e}"))
        return response
