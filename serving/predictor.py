"""The request logic shared by gRPC, REST and warmup: Predict, metadata, status.

Checks happen in TF Serving's order, with its status codes: model and
version (NOT_FOUND), signature (FAILED_PRECONDITION), input names, dtypes,
tensor parsing, output filter (INVALID_ARGUMENT); then shapes and image
headers, then the run itself, whose TensorFlow errors keep their code.
"""
from __future__ import annotations

import time
from typing import Dict, Iterable, List, Optional

import numpy as np
from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, model_pb2,
                                     predict_pb2)
from tensorflow_serving.apis import status_pb2

from serving.errors import invalid_argument
from serving.model_manager import ModelManager
from serving.servable import Servable, Signature
from serving.tensors import TensorParseError, short_dtype_name, tensor_proto_to_ndarray
from serving.tensors import ndarray_to_tensor_proto

SIGNATURE_DEF = "signature_def"
Arrays = Dict[str, np.ndarray]


class Predictor:
    """Serves requests from the versions a `ModelManager` holds.

    Args:
      manager: the model table.
      max_tensor_elements: request tensors whose shape has more elements are
        refused (INVALID_ARGUMENT) before anything is allocated; None: no limit.
      metrics: a `ServingMetrics` that gets each model run's time, or None.
    """

    def __init__(self, manager: Optional[ModelManager] = None,
                 max_tensor_elements: Optional[int] = None, metrics=None):
        self.manager = manager
        self.max_tensor_elements = max_tensor_elements
        self.metrics = metrics

    def resolve(self, spec: model_pb2.ModelSpec) -> Servable:
        """The servable a ModelSpec names (NOT_FOUND / INVALID_ARGUMENT)."""
        version = spec.version.value if spec.HasField("version") else None
        return self.manager.get(spec.name, version=version, label=spec.version_label or None)

    # -- Predict -----------------------------------------------------------

    def predict(self, request: predict_pb2.PredictRequest) -> predict_pb2.PredictResponse:
        """PredictionService.Predict."""
        return self.predict_on(request, self.resolve(request.model_spec))

    def predict_on(self, request: predict_pb2.PredictRequest,
                   servable: Servable) -> predict_pb2.PredictResponse:
        """Predict on a given servable (also the warmup replay path)."""
        signature = servable.signature(request.model_spec.signature_name)
        inputs = self.parse_inputs(servable, signature, request.inputs,
                                   max_elements=self.max_tensor_elements)
        aliases = output_aliases(signature, request.output_filter)
        outputs = self.run(servable, signature, inputs)
        response = predict_pb2.PredictResponse()
        response.model_spec.name = servable.name
        response.model_spec.version.value = servable.version
        response.model_spec.signature_name = signature.name
        for alias in aliases:
            ndarray_to_tensor_proto(outputs[alias], out=response.outputs[alias])
        return response

    @staticmethod
    def parse_inputs(servable: Servable, signature: Signature, protos,
                     max_elements: Optional[int] = None) -> Arrays:
        """TensorProtos -> arrays, checked against the signature."""
        expected = signature.inputs
        servable.check_input_names(signature, protos)
        arrays = {}
        for index, alias in enumerate(sorted(expected)):
            proto = protos[alias]
            want = expected[alias].dtype.as_datatype_enum
            if proto.dtype != want:
                raise invalid_argument(f"Expects arg[{index}] to be {expected[alias].dtype.name} "
                                       f"but {short_dtype_name(proto.dtype)} is provided")
            try:
                arrays[alias] = tensor_proto_to_ndarray(proto, max_elements)
            except TensorParseError as e:
                raise invalid_argument(f"tensor parsing error: {alias} ({e})") from None
        return arrays

    def run(self, servable: Servable, signature: Signature, inputs: Arrays) -> Arrays:
        """Checks shapes and images, then runs (batched when configured).

        The run's wall time (batch queueing included) goes to the runtime
        latency metric.
        """
        servable.check_inputs(signature, inputs)
        # An empty batch is a client bug (REST's `"instances": []` is refused
        # too); TF Serving's gRPC API would run the model on zero rows.
        for alias, array in sorted(inputs.items()):
            if array.ndim >= 1 and array.shape[0] == 0:
                raise invalid_argument(f"empty batch: input '{alias}' has 0 rows "
                                       f"(shape {list(array.shape)}); send at least one")
        started = time.perf_counter()
        outputs = servable.run(signature, inputs)
        if self.metrics is not None:
            self.metrics.record_runtime(servable.name, "Predict",
                                        1e6 * (time.perf_counter() - started))
        return outputs

    # -- metadata and status -------------------------------------------------

    def metadata(self, request: get_model_metadata_pb2.GetModelMetadataRequest
                 ) -> get_model_metadata_pb2.GetModelMetadataResponse:
        """PredictionService.GetModelMetadata (signature_def only, like TF Serving)."""
        if not request.HasField("model_spec"):
            raise invalid_argument("Missing ModelSpec")
        fields = list(request.metadata_field)
        if not fields:
            raise invalid_argument("GetModelMetadataRequest must specify at least one "
                                   "metadata_field")
        for name in fields:
            if name != SIGNATURE_DEF:
                raise invalid_argument(f"Metadata field {name} is not supported")
        servable = self.resolve(request.model_spec)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = servable.name
        response.model_spec.version.value = servable.version
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        for key, signature_def in servable.signature_defs.items():
            signature_map.signature_def[key].CopyFrom(signature_def)
        response.metadata[SIGNATURE_DEF].Pack(signature_map)
        return response

    def model_status(self, request: get_model_status_pb2.GetModelStatusRequest
                     ) -> get_model_status_pb2.GetModelStatusResponse:
        """ModelService.GetModelStatus."""
        if not request.HasField("model_spec"):
            raise invalid_argument("Missing ModelSpec")
        spec = request.model_spec
        version = spec.version.value if spec.HasField("version") else None
        states = self.manager.status(spec.name, version, spec.version_label or None)
        response = get_model_status_pb2.GetModelStatusResponse()
        for number, status in states:
            response.model_version_status.add(
                version=number,
                state=get_model_status_pb2.ModelVersionStatus.State.Value(status.state),
                status=status_pb2.StatusProto(error_code=status.error_code.value[0],
                                              error_message=status.error_message))
        return response


def output_aliases(signature: Signature, output_filter: Iterable[str]) -> List[str]:
    """The outputs to return: the filter (checked) or every output."""
    wanted = list(output_filter)
    if not wanted:
        return list(signature.outputs)
    seen = set()
    for alias in wanted:
        if alias not in signature.outputs:
            raise invalid_argument(
                f"output tensor alias not found in signature: {alias} Outputs expected to be "
                f"in the set {{{','.join(sorted(signature.outputs))}}}.")
        if alias in seen:
            raise invalid_argument(f"duplicate output tensor alias: {alias}")
        seen.add(alias)
    return wanted

