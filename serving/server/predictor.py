"""The request logic shared by gRPC, REST and warmup: Predict, metadata, status.

Checks happen in TF Serving's order, with its status codes: model and
version (NOT_FOUND), signature (FAILED_PRECONDITION), input names, dtypes,
tensor parsing, output filter (INVALID_ARGUMENT); then shapes and image
headers, then the request-wide limits (images, pixels), the decode work of
each image and of the request (`serving/limits/work_admission.py`), then the run:
admitted by its decode work (it may wait for CPU, up to its deadline) and
by the decode-memory budget (`serving/limits/admission.py`). TensorFlow errors
keep their code. Counts are read from tensor shapes before any tensor is
materialized: TensorProto's padding rule lets one string fill any shape.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
    predict_pb2,
    status_pb2,
)

from serving.errors import invalid_argument
from serving.limits.admission import DecodeBudget
from serving.limits.work_admission import LIGHT_FRACTION, WorkScheduler, request_work
from serving.tensors import (
    DT_STRING,
    TensorParseError,
    ndarray_to_tensor_proto,
    short_dtype_name,
    tensor_proto_to_ndarray,
    tensor_shape,
)
from serving.versions.model_manager import ModelManager
from serving.versions.servable import Servable, Signature

SIGNATURE_DEF = "signature_def"
Arrays = Dict[str, np.ndarray]
# Most decode work of a request that the REST event loop may run itself
# (`Predictor.run(..., inline=True)`): about a 2.7 Mpx baseline colour JPEG,
# at most ~25 ms of decoding (6 ns per pixel-pass, serving/limits/decode_work.py).
INLINE_MAX_WORK = 1 << 22


class RunElsewhere(Exception):
    """`Predictor.run(..., inline=True)` refused, before running anything: the
    request is batched or costs more decode work than `INLINE_MAX_WORK`, so
    it must run on a worker thread, not on the caller's (an event loop)."""


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask for (0 or None: no limit, unless said otherwise).

    Attributes:
      max_tensor_elements: request tensors whose shape has more elements are
        refused (INVALID_ARGUMENT) before anything is allocated; None: no limit.
      max_images: most rows (dimension 0) of any input, and most strings
        (images) in all inputs together, of one request; 0: no limit.
      max_request_pixels: most decoded pixels (as image headers state them)
        of all images of one request together; 0: no limit.
      max_decode_work: most decode work (pixel-passes, `serving/limits/decode_work.py`)
        of one image; 0: no limit.
      decode_work_budget: pixel-passes that expensive requests in progress
        may hold together, and the most one request may need; None: twice
        `max_decode_work`; 0: no CPU admission.
      decode_lanes: expensive requests that may run at once; None: one less
        than TensorFlow's inter-op threads (`work_admission.default_lanes`).
    """
    max_tensor_elements: Optional[int] = None
    max_images: int = 0
    max_request_pixels: int = 0
    max_decode_work: int = 0
    decode_work_budget: Optional[int] = None
    decode_lanes: Optional[int] = None


class Predictor:
    """Serves requests from the versions a `ModelManager` holds.

    Args:
      manager: the model table.
      limits: what one request may ask for (`RequestLimits`).
      metrics: a `ServingMetrics` that gets each model run's time, or None.
      budget: the server-wide decode-memory budget every run reserves its
        estimated bytes from; None: no budget.
    """

    def __init__(self, manager: Optional[ModelManager] = None,
                 limits: Optional[RequestLimits] = None, metrics=None,
                 budget: Optional[DecodeBudget] = None):
        limits = limits or RequestLimits()
        self.manager = manager
        self.max_tensor_elements = limits.max_tensor_elements
        self.metrics = metrics
        self.max_images = max(limits.max_images, 0)
        self.max_request_pixels = max(limits.max_request_pixels, 0)
        self.budget = budget if budget is not None else DecodeBudget(0)
        self.max_decode_work = max(limits.max_decode_work, 0)
        work_budget = (2 * self.max_decode_work if limits.decode_work_budget is None
                       else max(limits.decode_work_budget, 0))
        self.work = WorkScheduler(
            work_budget, light_work=(self.max_decode_work or work_budget // 2) // LIGHT_FRACTION,
            lanes=limits.decode_lanes if work_budget else 1)

    def resolve(self, spec: model_pb2.ModelSpec) -> Servable:
        """The servable a ModelSpec names (NOT_FOUND / INVALID_ARGUMENT)."""
        version = spec.version.value if spec.HasField("version") else None
        return self.manager.get(spec.name, version=version, label=spec.version_label or None)

    # -- Predict -----------------------------------------------------------

    def predict(self, request: predict_pb2.PredictRequest, deadline: Optional[float] = None,
                is_active: Optional[Callable[[], bool]] = None) -> predict_pb2.PredictResponse:
        """PredictionService.Predict.

        Args:
          request: the request.
          deadline: `time.monotonic()` time after which nothing is started
            (DEADLINE_EXCEEDED), and by which a batched request must be
            expected to be answered (else RESOURCE_EXHAUSTED at once); None: none.
          is_active: returns False once the client is gone; None: never.
        Returns:
          The response.
        """
        return self.predict_on(request, self.resolve(request.model_spec), deadline, is_active)

    def predict_on(self, request: predict_pb2.PredictRequest, servable: Servable,
                   deadline: Optional[float] = None,
                   is_active: Optional[Callable[[], bool]] = None
                   ) -> predict_pb2.PredictResponse:
        """Predict on a given servable (also the warmup replay path)."""
        self.work.check_deadline(deadline)
        signature = servable.signature(request.model_spec.signature_name)
        # Refused before its tensors are parsed when its batch queue would refuse it.
        servable.check_admission(deadline, signature.name)
        inputs = self.parse_inputs(servable, signature, request.inputs,
                                   max_elements=self.max_tensor_elements,
                                   max_images=self.max_images)
        aliases = output_aliases(signature, request.output_filter)
        outputs = self.run(servable, signature, inputs, deadline, is_active=is_active)
        response = predict_pb2.PredictResponse()
        response.model_spec.name = servable.name
        response.model_spec.version.value = servable.version
        response.model_spec.signature_name = signature.name
        for alias in aliases:
            ndarray_to_tensor_proto(outputs[alias], out=response.outputs[alias])
        return response

    @staticmethod
    def parse_inputs(servable: Servable, signature: Signature, protos,
                     max_elements: Optional[int] = None, max_images: int = 0) -> Arrays:
        """TensorProtos -> arrays, checked against the signature.

        With `max_images`, the counts are checked from the shapes first
        (`check_counts`), before any tensor is materialized.
        """
        expected = signature.inputs
        servable.check_input_names(signature, protos)
        for index, alias in enumerate(sorted(expected)):
            proto = protos[alias]
            want = expected[alias].dtype.as_datatype_enum
            if proto.dtype != want:
                raise invalid_argument(f"Expects arg[{index}] to be {expected[alias].dtype.name} "
                                       f"but {short_dtype_name(proto.dtype)} is provided")
        if max_images:
            shapes = {}
            for alias in sorted(expected):
                try:
                    shape = tensor_shape(protos[alias], max_elements)
                except TensorParseError as e:
                    raise invalid_argument(f"tensor parsing error: {alias} ({e})") from None
                shapes[alias] = (shape, protos[alias].dtype == DT_STRING)
            check_counts(shapes, max_images)
        arrays = {}
        for alias in sorted(expected):
            proto = protos[alias]
            try:
                arrays[alias] = tensor_proto_to_ndarray(proto, max_elements)
            except TensorParseError as e:
                raise invalid_argument(f"tensor parsing error: {alias} ({e})") from None
        return arrays

    def run(self, servable: Servable, signature: Signature, inputs: Arrays,
            deadline: Optional[float] = None, inline: bool = False,
            is_active: Optional[Callable[[], bool]] = None) -> Arrays:
        """Checks shapes and images, then runs (batched when configured).

        Args:
          servable: the version.
          signature: its signature to run.
          inputs: alias -> array.
          deadline: `time.monotonic()` time after which the run must not
            start, and by which a batched run must be expected to end
            (`Servable.run`); None: none.
          inline: the caller may not block long (an event loop): raise
            `RunElsewhere` after the checks unless `may_run_inline`.
          is_active: returns False once the client is gone; None: never.
        Returns:
          The outputs, alias -> array.

        The run's wall time after admission (batch queueing included) goes
        to the runtime latency metric.
        """
        work, cost, what = self._checked(servable, signature, inputs, inline)
        with self.work.admit(work, deadline, what):
            started = time.perf_counter()
            with self.budget.reserve(cost.bytes, what):
                outputs = servable.run(signature, inputs, deadline, is_active)
        if self.metrics is not None:
            self.metrics.record_runtime(servable.name, "Predict",
                                        1e6 * (time.perf_counter() - started))
        return outputs

    def run_async(self, servable: Servable, signature: Signature, inputs: Arrays,
                  deadline: Optional[float] = None,
                  is_active: Optional[Callable[[], bool]] = None) -> Future:
        """As `run`, but returns once the request is queued for its batch, with a Future
        of its outputs, so the caller's thread is not held while it waits (REST).

        Checks, decode-work admission (which may wait, up to `deadline`) and
        refusals happen here and raise here; the admission and the memory
        reservation are held until the Future is done. Unbatched, the run
        happens here and the Future is done on return. Never cancel the Future.
        """
        work, cost, what = self._checked(servable, signature, inputs)
        held = ExitStack()
        try:
            held.enter_context(self.work.admit(work, deadline, what))
            started = time.perf_counter()
            held.enter_context(self.budget.reserve(cost.bytes, what))
            future = servable.submit(signature, inputs, deadline, is_active)
        except BaseException:
            held.close()
            raise

        def done(future: Future) -> None:
            held.close()
            if self.metrics is not None and not future.cancelled() \
                    and future.exception() is None:
                self.metrics.record_runtime(servable.name, "Predict",
                                            1e6 * (time.perf_counter() - started))

        future.add_done_callback(done)
        return future

    def _checked(self, servable: Servable, signature: Signature, inputs: Arrays,
                 inline: bool = False):
        """`run`'s checks: (decode work, InputCost, the request in words)."""
        check_counts({alias: (array.shape, array.dtype == object)
                      for alias, array in inputs.items()}, self.max_images)
        check_finite(inputs)
        cost = servable.check_inputs(signature, inputs)
        if self.max_request_pixels and cost.pixels > self.max_request_pixels:
            raise invalid_argument(
                f"the request's {cost.images} images decode to {cost.pixels} pixels in all, "
                f"more than the limit of {self.max_request_pixels} pixels per request "
                f"(--max-request-pixels); send them in several requests")
        # An empty batch is a client bug (REST's `"instances": []` is refused
        # too); TF Serving's gRPC API would run the model on zero rows.
        for alias, array in sorted(inputs.items()):
            if array.ndim >= 1 and array.shape[0] == 0:
                raise invalid_argument(f"empty batch: input '{alias}' has 0 rows "
                                       f"(shape {list(array.shape)}); send at least one")
        work, _ = request_work(inputs, self.max_decode_work, self.work.budget, cost.headers)
        if inline and not self.may_run_inline(servable, work):
            raise RunElsewhere()
        what = f"a request of {cost.images} images" if cost.images else "a request"
        return work, cost, what

    def may_run_inline(self, servable: Servable, work: int) -> bool:
        """Whether a request of `work` decode work may run on an event loop's thread.

        Only unbatched requests that never wait for CPU admission and whose
        decode work is at most `INLINE_MAX_WORK`: the loop is blocked for
        their run, so the run must be short.
        """
        return (servable.batching is None and work <= INLINE_MAX_WORK
                and self.work.is_light(work))

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


def check_counts(shapes: Dict[str, tuple], max_images: int) -> None:
    """INVALID_ARGUMENT when a request has more rows or images than `max_images`.

    Args:
      shapes: alias -> (shape, whether the input holds strings); shapes may
        be read from a TensorProto (nothing materialized yet) or an array.
      max_images: the limit (0: none). Every input's dimension 0 counts as
        rows; every string element counts as an image.
    """
    if not max_images:
        return
    strings = 0
    for alias, (shape, is_string) in sorted(shapes.items()):
        shape: Sequence[int] = tuple(shape)
        if shape and shape[0] > max_images:
            raise invalid_argument(
                f"input {alias}: {shape[0]} rows in one request, more than the limit of "
                f"{max_images} (--max-images-per-request); send them in several requests")
        if is_string:
            strings += math.prod(shape)
    if strings > max_images:
        raise invalid_argument(
            f"{strings} images (string elements) in one request, more than the limit of "
            f"{max_images} (--max-images-per-request); send them in several requests")


def check_finite(inputs: Arrays) -> None:
    """INVALID_ARGUMENT for NaN or infinite values in a floating-point input.

    A value beyond the input's dtype (1e40 for a float32 input) arrives as
    infinity, so it is refused too. The model would otherwise answer with
    NaN scores, which JSON cannot carry.
    """
    for alias, array in sorted(inputs.items()):
        if array.dtype.kind in "fc" and array.size and not np.isfinite(array).all():
            bad = int(array.size - np.count_nonzero(np.isfinite(array)))
            first = tuple(int(i) for i in np.argwhere(~np.isfinite(array))[0])
            raise invalid_argument(
                f"input '{alias}' holds {bad} non-finite value(s) (NaN, infinity, or beyond "
                f"the range of {array.dtype.name}), the first at index {list(first)}: "
                f"send finite numbers")


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

