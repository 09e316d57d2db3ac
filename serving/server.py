"""A model server that speaks TensorFlow Serving's gRPC and REST APIs.

TF Serving's binary cannot be installed everywhere; this server loads the
same model folders (`<base_path>/<version>/saved_model.pb`, `variables/`,
`assets.extra/tf_serving_warmup_requests`) with `tf.saved_model.load` and
answers the same API with the same status codes, so a client written for
TF Serving works unchanged against it:

- gRPC `tensorflow.serving.PredictionService`: Predict, GetModelMetadata
  (Classify, Regress, MultiInference: UNIMPLEMENTED);
  `tensorflow.serving.ModelService`: GetModelStatus
  (HandleReloadConfigRequest: UNIMPLEMENTED); plus standard health checking
  (`grpc.health.v1.Health`) and server reflection;
- REST on a second port (`serving/rest.py`);
- version watching, warmup and availability-preserving swaps
  (`serving/model_manager.py`), optional dynamic batching
  (`serving/batch_scheduler.py`), image pixel limits checked from headers
  (`serving/image_headers.py`), TLS on both ports.

Command line (`captioner serve` calls `main`):

    captioner serve --model-base-path /srv/serving/captioner --port 8500 --rest-port 8501
    captioner serve --model-config-file /srv/serving/models.config \
        --batching-parameters-file /srv/serving/batching_parameters.txt
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import ssl
import sys
import threading
from concurrent import futures
from typing import Optional, Sequence, Union

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from tensorflow_serving.apis import (model_service_pb2, model_service_pb2_grpc,
                                     prediction_service_pb2, prediction_service_pb2_grpc)

from pipeline.config import ServeConfig
from serving.batching_parameters import BatchingParameters
from serving.errors import ServingError
from serving.model_manager import ModelManager, ModelSource, VersionPolicy
from serving.predictor import Predictor
from serving.rest import RestServer

log = logging.getLogger(__name__)

PREDICTION_SERVICE = prediction_service_pb2.DESCRIPTOR.services_by_name[
    "PredictionService"].full_name
MODEL_SERVICE = model_service_pb2.DESCRIPTOR.services_by_name["ModelService"].full_name
_DEFAULTS = ServeConfig()


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


def _handle(context: grpc.ServicerContext, fn, request):
    """Runs one RPC; every failure becomes a status code, never a crash."""
    try:
        return fn(request)
    except ServingError as e:
        context.abort(e.code, _details(e.message))
    except Exception as e:
        log.exception("unexpected error")
        context.abort(grpc.StatusCode.INTERNAL, _details(f"{type(e).__name__}: {e}"))


def _unimplemented(context: grpc.ServicerContext, what: str):
    context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{what} is not supported by this server")


class _PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, predictor: Predictor):
        self.predictor = predictor

    def Predict(self, request, context):
        return _handle(context, self.predictor.predict, request)

    def GetModelMetadata(self, request, context):
        return _handle(context, self.predictor.metadata, request)

    def Classify(self, request, context):
        _unimplemented(context, "Classify")

    def Regress(self, request, context):
        _unimplemented(context, "Regress")

    def MultiInference(self, request, context):
        _unimplemented(context, "MultiInference")


class _ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, predictor: Predictor):
        self.predictor = predictor

    def GetModelStatus(self, request, context):
        return _handle(context, self.predictor.model_status, request)

    def HandleReloadConfigRequest(self, request, context):
        _unimplemented(context, "HandleReloadConfigRequest (edit models.config instead: it "
                                "is re-read on change)")


class ModelServer:
    """The server, usable in-process (tests, benchmarks) or from `main`.

    Give either `model_base_path` (+ `model_name`, `version_policy`) or
    `model_config_file`.

    Args:
      model_base_path: folder holding integer version folders.
      model_name: the name requests use for that model.
      model_config_file: a `models.config` (ModelServerConfig text format).
      host: address to bind both ports to (default loopback only).
      port: gRPC port; 0 picks a free one (see `grpc_port`).
      rest_port: REST port; 0 picks a free one; None or negative: no REST.
      poll_seconds: seconds between file-system polls; <= 0 polls once.
      version_policy: `latest:N`, `all`, `specific:1,2` or a VersionPolicy.
      batching: BatchingParameters to batch concurrent requests, or None.
      ssl_cert, ssl_key: PEM files; when both are given, gRPC and REST use TLS.
      max_request_bytes: gRPC messages (RESOURCE_EXHAUSTED) and REST bodies
        (413) larger than this are refused.
      max_image_pixels: images whose header claims more pixels are refused
        (INVALID_ARGUMENT) before decoding; 0 disables the check.
      max_threads: gRPC worker threads (concurrent requests in progress).
    """

    def __init__(self, model_base_path: Optional[str] = None, model_name: str = "captioner", *,
                 model_config_file: Optional[str] = None, host: str = _DEFAULTS.host,
                 port: int = _DEFAULTS.port, rest_port: Optional[int] = _DEFAULTS.rest_port,
                 poll_seconds: float = _DEFAULTS.poll_seconds,
                 version_policy: Union[str, VersionPolicy] = "latest:1",
                 batching: Optional[BatchingParameters] = None,
                 ssl_cert: Optional[str] = None, ssl_key: Optional[str] = None,
                 max_request_bytes: int = _DEFAULTS.max_request_bytes,
                 max_image_pixels: int = _DEFAULTS.max_image_pixels, max_threads: int = 64):
        if bool(model_base_path) == bool(model_config_file):
            raise ValueError("give exactly one of model_base_path and model_config_file")
        if bool(ssl_cert) != bool(ssl_key):
            raise ValueError("TLS needs both ssl_cert and ssl_key")
        if isinstance(version_policy, str):
            version_policy = VersionPolicy.parse(version_policy)
        self.model_base_path = model_base_path
        self.model_name = model_name
        self.model_config_file = model_config_file
        self.host = host
        self.requested_port = port
        self.requested_rest_port = rest_port
        self.poll_seconds = poll_seconds
        self.version_policy = version_policy
        self.batching = batching
        self.ssl_cert = ssl_cert
        self.ssl_key = ssl_key
        self.max_request_bytes = max_request_bytes
        self.max_image_pixels = max_image_pixels
        self.max_threads = max_threads
        # Every tensor element a request spells out costs at least one byte,
        # so only TF's padding rule (a few values, any shape) gives more
        # elements than max_request_bytes: bound what it can make us allocate.
        self.predictor = Predictor(
            max_tensor_elements=max_request_bytes if max_request_bytes > 0 else None)
        self.manager: Optional[ModelManager] = None
        self.health = health.HealthServicer()
        self.grpc_port: Optional[int] = None
        self.rest_port: Optional[int] = None
        self._grpc: Optional[grpc.Server] = None
        self._rest: Optional[RestServer] = None
        self._started = False

    # -- addresses ---------------------------------------------------------

    @property
    def grpc_address(self) -> str:
        """`host:port` of the gRPC API (a client's target)."""
        return _join(self.host, self.grpc_port)

    @property
    def rest_url(self) -> Optional[str]:
        """`http(s)://host:port` of the REST API, or None when it is off."""
        return self._rest.url if self._rest is not None else None

    @property
    def tls(self) -> bool:
        return bool(self.ssl_cert)

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> "ModelServer":
        """Loads the initial versions, then opens the ports. Returns self.

        Raises:
          OSError: a port cannot be bound.
          ValueError: a bad models.config.
        """
        if self._started:
            return self
        sources = None
        if self.model_base_path:
            sources = [ModelSource(self.model_name, self.model_base_path, self.version_policy)]
        self.manager = ModelManager(
            sources=sources, config_file=self.model_config_file,
            poll_seconds=self.poll_seconds, max_image_pixels=self.max_image_pixels,
            batching=self.batching, warmup=self.predictor.predict_on,
            on_change=self._update_health)
        self.predictor.manager = self.manager
        self.manager.start()
        try:
            self._start_grpc()
            if self.requested_rest_port is not None and self.requested_rest_port >= 0:
                self._rest = RestServer(self.predictor, self.host, self.requested_rest_port,
                                        self.max_request_bytes, self._ssl_context()).start()
                self.rest_port = self._rest.port
        except BaseException:
            self.stop(grace=0)
            raise
        self._started = True
        self._update_health()
        log.info("%s", self.describe())
        return self

    def _start_grpc(self) -> None:
        options = [("grpc.max_receive_message_length", self.max_request_bytes),
                   ("grpc.max_send_message_length", -1),
                   ("grpc.so_reuseport", 0)]
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.max_threads,
                                                        thread_name_prefix="grpc"),
                             options=options)
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            _PredictionServicer(self.predictor), server)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(
            _ModelServicer(self.predictor), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (PREDICTION_SERVICE, MODEL_SERVICE,
             health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), server)
        address = _join(self.host, self.requested_port)
        try:
            if self.tls:
                with open(self.ssl_key, "rb") as f:
                    key = f.read()
                with open(self.ssl_cert, "rb") as f:
                    cert = f.read()
                port = server.add_secure_port(address,
                                              grpc.ssl_server_credentials([(key, cert)]))
            else:
                port = server.add_insecure_port(address)
        except RuntimeError as e:
            raise OSError(f"cannot bind the gRPC port {address}: {e}") from None
        if not port:
            raise OSError(f"cannot bind the gRPC port {address}")
        server.start()
        self._grpc = server
        self.grpc_port = port

    def _ssl_context(self) -> Optional[ssl.SSLContext]:
        if not self.tls:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.ssl_cert, self.ssl_key)
        return context

    def stop(self, grace: Optional[float] = 5.0) -> None:
        """Stops taking requests, lets in-flight ones finish (up to `grace` s), unloads."""
        self.health.enter_graceful_shutdown()
        if self._rest is not None:
            self._rest.stop()
            self._rest = None
        if self._grpc is not None:
            self._grpc.stop(grace).wait()
            self._grpc = None
        if self.manager is not None:
            self.manager.stop()
        self._started = False

    def __enter__(self) -> "ModelServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def describe(self) -> str:
        """The one-line startup banner: `serving: grpc=HOST:PORT rest=HOST:PORT`."""
        rest = _join(self.host, self.rest_port) if self.rest_port is not None else "off"
        line = f"serving: grpc={self.grpc_address} rest={rest}"
        if self.tls:
            line += " tls=on"
        return line

    def _update_health(self) -> None:
        if self.manager is None:
            return
        status = (health_pb2.HealthCheckResponse.SERVING if self.manager.ready()
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for service in ("", PREDICTION_SERVICE, MODEL_SERVICE):
            self.health.set(service, status)


def _join(host: str, port: Optional[int]) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def build_parser() -> argparse.ArgumentParser:
    """The `captioner serve` argument parser."""
    p = argparse.ArgumentParser(
        prog="captioner serve",
        description="Serve SavedModel versions over TF Serving's gRPC and REST APIs.")
    src = p.add_argument_group("models")
    src.add_argument("--model-base-path", help="folder with integer version folders")
    src.add_argument("--model-name", default="captioner",
                     help="name of the model at --model-base-path (default: captioner)")
    src.add_argument("--model-config-file",
                     help="models.config (ModelServerConfig text); re-read when it changes")
    src.add_argument("--model-version-policy", default="latest:1",
                     help="latest:N | all | specific:1,2 for --model-base-path "
                          "(default: latest:1)")
    src.add_argument("--poll-seconds", type=float, default=_DEFAULTS.poll_seconds,
                     help="file-system poll interval; <= 0 polls once")
    net = p.add_argument_group("network")
    net.add_argument("--host", default=_DEFAULTS.host,
                     help="address to bind (default: 127.0.0.1, loopback only)")
    net.add_argument("--port", type=int, default=_DEFAULTS.port, help="gRPC port (0: any free)")
    net.add_argument("--rest-port", type=int, default=_DEFAULTS.rest_port,
                     help="REST port (0: any free, -1: no REST)")
    net.add_argument("--ssl-cert", help="PEM certificate chain: TLS on both ports")
    net.add_argument("--ssl-key", help="PEM private key for --ssl-cert")
    net.add_argument("--max-threads", type=int, default=64, help="gRPC worker threads")
    lim = p.add_argument_group("limits")
    lim.add_argument("--max-request-bytes", type=int, default=_DEFAULTS.max_request_bytes)
    lim.add_argument("--max-image-pixels", type=int, default=_DEFAULTS.max_image_pixels,
                     help="refuse images whose header claims more pixels (0: no limit)")
    bat = p.add_argument_group("batching")
    bat.add_argument("--enable-batching", action="store_true",
                     help="batch concurrent requests (TF Serving semantics)")
    bat.add_argument("--batching-parameters-file",
                     help="TF Serving batching parameters text file (implies --enable-batching)")
    bat.add_argument("--max-batch-size", type=int)
    bat.add_argument("--batch-timeout-micros", type=int)
    bat.add_argument("--num-batch-threads", type=int)
    p.add_argument("--log-level", default="INFO")
    return p


def _batching_from_args(args) -> Optional[BatchingParameters]:
    if not (args.enable_batching or args.batching_parameters_file):
        return None
    base = (BatchingParameters.from_file(args.batching_parameters_file)
            if args.batching_parameters_file else BatchingParameters())
    overrides = {k: v for k, v in (("max_batch_size", args.max_batch_size),
                                   ("batch_timeout_micros", args.batch_timeout_micros),
                                   ("num_batch_threads", args.num_batch_threads))
                 if v is not None}
    if overrides:
        if "max_batch_size" in overrides and base.allowed_batch_sizes:
            overrides["allowed_batch_sizes"] = ()
        base = dataclasses.replace(base, **overrides)
    return base


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`captioner serve`: runs the server until SIGTERM or SIGINT.

    Prints one line `serving: grpc=HOST:PORT rest=HOST:PORT` on stdout once
    the ports are open (the bound ports when 0 was asked for).
    Returns:
      The exit status: 0 after a clean shutdown, 1 when the server cannot
      start (port taken, bad models.config), 2 for bad arguments.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if bool(args.model_base_path) == bool(args.model_config_file):
        parser.error("give exactly one of --model-base-path and --model-config-file")
    if bool(args.ssl_cert) != bool(args.ssl_key):
        parser.error("--ssl-cert and --ssl-key go together")
    try:
        policy = VersionPolicy.parse(args.model_version_policy)
        batching = _batching_from_args(args)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    server = ModelServer(
        args.model_base_path, args.model_name, model_config_file=args.model_config_file,
        host=args.host, port=args.port,
        rest_port=args.rest_port if args.rest_port >= 0 else None,
        poll_seconds=args.poll_seconds, version_policy=policy, batching=batching,
        ssl_cert=args.ssl_cert, ssl_key=args.ssl_key,
        max_request_bytes=args.max_request_bytes, max_image_pixels=args.max_image_pixels,
        max_threads=args.max_threads)
    stop = threading.Event()

    def on_signal(signum, frame):
        log.info("signal %d: shutting down", signum)
        stop.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():  # signals need the main thread
        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            server.start()
        except (OSError, ValueError) as e:
            print(f"captioner serve: {e}", file=sys.stderr)
            return 1
        print(server.describe(), flush=True)
        while not stop.wait(0.5):
            pass
        server.stop()
        return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    sys.exit(main())
