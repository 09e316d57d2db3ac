"""A model server that speaks TensorFlow Serving's gRPC and REST APIs.

TF Serving's binary cannot be installed everywhere; this server loads the
same model folders (`<base_path>/<version>/saved_model.pb`, `variables/`,
`assets.extra/tf_serving_warmup_requests`) with `tf.saved_model.load` and
answers the same API with the same status codes, so a client written for
TF Serving works unchanged against it:

- gRPC `tensorflow.serving.PredictionService`: Predict, GetModelMetadata
  (Classify, Regress, MultiInference: UNIMPLEMENTED);
  `tensorflow.serving.ModelService`: GetModelStatus and
  HandleReloadConfigRequest; plus standard health checking
  (`grpc.health.v1.Health`) and server reflection;
- REST on a second port (`serving/rest.py`), with TF Serving's Prometheus
  metrics there when asked for (`serving/metrics.py`);
- version watching, warmup and availability-preserving swaps
  (`serving/model_manager.py`), optional dynamic batching
  (`serving/batch_scheduler.py`), image pixel limits checked from headers
  (`serving/image_headers.py`), per-request image and pixel limits and a
  server-wide decode-memory budget (`serving/admission.py`), decode-work
  limits and CPU admission with deadlines (`serving/work_admission.py`), TLS
  on both ports.

Command line (`captioner serve` calls `main`; flags in `serving/flags.py`,
tensorflow_model_server's included):

    captioner serve --model-base-path /srv/serving/captioner --port 8500 --rest-port 8501
    captioner serve --port=8500 --rest_api_port=8501 \
        --model_config_file=/srv/serving/models.config --enable_batching \
        --batching_parameters_file=/srv/serving/batching_parameters.txt
"""
from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from concurrent import futures
from typing import Optional, Sequence, Union

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from tensorflow_serving.apis import (model_management_pb2, model_service_pb2,
                                     model_service_pb2_grpc, prediction_service_pb2,
                                     prediction_service_pb2_grpc)

from serving import flags
from serving.admission import DecodeBudget
from serving.batching_parameters import BatchingParameters
from serving.errors import ServingError, invalid_argument
from serving.flags import DEFAULTS as _DEFAULTS
from serving.flags import build_parser  # noqa: F401  (the `captioner serve` parser)
from serving.flags import batching_from_args as _batching_from_args  # noqa: F401
from serving.metrics import ServingMetrics
from serving.model_manager import ModelManager, ModelSource, VersionPolicy, sources_from_config
from serving.predictor import Predictor
from serving.rest import RestServer
from serving.ui_files import UiFiles
from serving.work_admission import grpc_deadline, mark_pool

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


class _PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, predictor: Predictor, metrics: Optional[ServingMetrics]):
        self.predictor = predictor
        self.metrics = metrics

    def Predict(self, request, context):
        deadline = grpc_deadline(context)  # nothing starts once the client gave up
        return _handle(context, lambda r: self.predictor.predict(r, deadline), request,
                       self.metrics, "Predict")

    def GetModelMetadata(self, request, context):
        return _handle(context, self.predictor.metadata, request)

    def Classify(self, request, context):
        return _handle(context, _unimplemented("Classify"), request, self.metrics, "Classify")

    def Regress(self, request, context):
        return _handle(context, _unimplemented("Regress"), request, self.metrics, "Regress")

    def MultiInference(self, request, context):
        _handle(context, _unimplemented("MultiInference"), request)


class _ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, server: "ModelServer"):
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
      max_images_per_request: most images (string elements) and rows in one
        request, checked from the shapes before anything is materialized;
        0: no limit.
      max_request_pixels: most decoded pixels of all images of one request;
        0: no limit.
      decode_memory_budget_mb: MiB that requests in progress may need
        together (estimated before decoding, `serving/admission.py`); a
        request that does not fit gets RESOURCE_EXHAUSTED (REST 429); 0: no
        budget.
      max_decode_work: most decode work (pixel-passes) of one image
        (`serving/decode_work.py`); 0: no limit.
      decode_work_budget: pixel-passes that expensive requests in progress
        may hold together (`serving/work_admission.py`); None: twice
        `max_decode_work`; 0: no CPU admission.
      decode_lanes: expensive requests decoding at once; None: TensorFlow's
        inter-op threads less one.
      max_threads: gRPC worker threads (concurrent requests in progress).
      config_poll_seconds: seconds between re-reads of `model_config_file`;
        <= 0: read once; None: at every file-system poll.
      rest_threads: REST requests handled at once (None: 4 per CPU).
      metrics_path: when set, TF Serving's Prometheus metrics are served at
        this path of the REST port.
      warmup: replay each version's warmup records before serving it.
      allow_version_labels_for_unavailable_models: TF Serving's flag of that
        name, for HandleReloadConfigRequest.
      max_load_retries: load attempts after a version's first failure.
      ssl_config: a TF Serving `SSLConfig` (serving/config_protos.py): TLS
        on the gRPC port from PEM text, client certificates checked against
        `custom_ca` when `client_verify`; REST stays plain, as in TF Serving.
      health_service: register `grpc.health.v1.Health`.
      ui: serve the attention explorer page at `/ui/` on the REST port
        (`serving/ui_files.py`).
    """

    def __init__(self, model_base_path: Optional[str] = None, model_name: str = "captioner", *,
                 model_config_file: Optional[str] = None, host: str = _DEFAULTS.host,
                 port: int = _DEFAULTS.port, rest_port: Optional[int] = _DEFAULTS.rest_port,
                 poll_seconds: float = _DEFAULTS.poll_seconds,
                 version_policy: Union[str, VersionPolicy] = "latest:1",
                 batching: Optional[BatchingParameters] = None,
                 ssl_cert: Optional[str] = None, ssl_key: Optional[str] = None,
                 max_request_bytes: int = _DEFAULTS.max_request_bytes,
                 max_image_pixels: int = _DEFAULTS.max_image_pixels,
                 max_images_per_request: int = _DEFAULTS.max_images_per_request,
                 max_request_pixels: int = _DEFAULTS.max_request_pixels,
                 decode_memory_budget_mb: int = _DEFAULTS.decode_memory_budget_mb,
                 max_decode_work: int = _DEFAULTS.max_decode_work,
                 decode_work_budget: Optional[int] = None, decode_lanes: Optional[int] = None,
                 max_threads: int = _DEFAULTS.max_threads,
                 config_poll_seconds: Optional[float] = None, rest_threads: Optional[int] = None,
                 metrics_path: Optional[str] = None, warmup: bool = True,
                 allow_version_labels_for_unavailable_models: bool = False,
                 max_load_retries: int = _DEFAULTS.max_load_retries, ssl_config=None,
                 health_service: bool = True, ui: bool = False):
        if bool(model_base_path) == bool(model_config_file):
            raise ValueError("give exactly one of model_base_path and model_config_file")
        if bool(ssl_cert) != bool(ssl_key):
            raise ValueError("TLS needs both ssl_cert and ssl_key")
        if ssl_config is not None and ssl_cert:
            raise ValueError("give either ssl_cert/ssl_key or ssl_config")
        if ssl_config is not None and not (ssl_config.server_key and ssl_config.server_cert):
            raise ValueError("ssl_config needs server_key and server_cert")
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
        self.max_images_per_request = max_images_per_request
        self.max_request_pixels = max_request_pixels
        self.budget = DecodeBudget(decode_memory_budget_mb << 20
                                   if decode_memory_budget_mb > 0 else 0)
        self.max_threads = max_threads
        self.config_poll_seconds = config_poll_seconds
        self.rest_threads = rest_threads
        self.metrics_path = metrics_path
        self.warmup = warmup
        self.allow_version_labels_for_unavailable_models = \
            allow_version_labels_for_unavailable_models
        self.max_load_retries = max_load_retries
        self.ssl_config = ssl_config
        self.health_service = health_service
        self.ui = ui
        self.metrics = ServingMetrics(batching=batching is not None)
        # Every tensor element a request spells out costs at least one byte,
        # so only TF's padding rule (a few values, any shape) gives more
        # elements than max_request_bytes: bound what it can make us allocate.
        self.predictor = Predictor(
            max_tensor_elements=max_request_bytes if max_request_bytes > 0 else None,
            metrics=self.metrics, max_images=max_images_per_request,
            max_request_pixels=max_request_pixels, budget=self.budget,
            max_decode_work=max_decode_work, decode_work_budget=decode_work_budget,
            decode_lanes=decode_lanes)
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
        """Whether the gRPC port uses TLS (the REST port too with ssl_cert/ssl_key)."""
        return bool(self.ssl_cert) or self.ssl_config is not None

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
            batching=self.batching, warmup=self.predictor.predict_on if self.warmup else None,
            on_change=self._update_health, config_poll_seconds=self.config_poll_seconds,
            max_load_retries=self.max_load_retries,
            batch_observer=self.metrics.record_batch if self.batching else None)
        self.predictor.manager = self.manager
        self.manager.start()
        try:
            self._start_grpc()
            if self.requested_rest_port is not None and self.requested_rest_port >= 0:
                self._rest = RestServer(
                    self.predictor, self.host, self.requested_rest_port,
                    self.max_request_bytes, ssl_cert=self.ssl_cert, ssl_key=self.ssl_key,
                    num_threads=self.rest_threads,
                    metrics=self.metrics if self.metrics_path else None,
                    metrics_path=self.metrics_path,
                    ui=UiFiles(lambda: self.manager) if self.ui else None).start()
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
        server = grpc.server(futures.ThreadPoolExecutor(
            max_workers=self.max_threads, thread_name_prefix="grpc", initializer=mark_pool,
            initargs=("grpc", self.max_threads)), options=options)
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            _PredictionServicer(self.predictor, self.metrics), server)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(_ModelServicer(self), server)
        services = [PREDICTION_SERVICE, MODEL_SERVICE, reflection.SERVICE_NAME]
        if self.health_service:
            health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
            services.append(health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        reflection.enable_server_reflection(services, server)
        address = _join(self.host, self.requested_port)
        try:
            if self.ssl_config is not None:
                config = self.ssl_config
                credentials = grpc.ssl_server_credentials(
                    [(config.server_key.encode(), config.server_cert.encode())],
                    root_certificates=config.custom_ca.encode() or None,
                    require_client_auth=config.client_verify)
                port = server.add_secure_port(address, credentials)
            elif self.tls:
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

    def reload_config(self, config) -> None:
        """HandleReloadConfigRequest: serves the models of a `ModelServerConfig`.

        Raises:
          ServingError: INVALID_ARGUMENT for a config that is not a
            model_config_list or is malformed; FAILED_PRECONDITION for a label
            on a version that is not available (see `ModelManager.reload`).
        """
        if config.WhichOneof("config") != "model_config_list":
            raise invalid_argument("ServerModelConfig type not supported by "
                                   "HandleReloadConfigRequest. Only ModelConfigList is "
                                   "currently supported")
        try:
            sources = sources_from_config(config, "ReloadConfigRequest")
        except ValueError as e:
            raise invalid_argument(str(e)) from None
        self.manager.reload(sources, self.allow_version_labels_for_unavailable_models)

    def stop(self, grace: Optional[float] = 5.0) -> None:
        """Stops taking requests, lets in-flight ones finish (up to `grace` s), unloads."""
        self.health.enter_graceful_shutdown()
        # Both APIs stop accepting at once and drain in parallel: gRPC's
        # stop() returns at once, with an event set once its RPCs are done.
        grpc_stopped = self._grpc.stop(grace) if self._grpc is not None else None
        self._grpc = None
        if self._rest is not None:
            self._rest.stop(grace if grace is not None else 5.0)
            self._rest = None
        if grpc_stopped is not None:
            grpc_stopped.wait()
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
        if self.metrics_path and self.rest_port is not None:
            line += f" metrics={self.metrics_path}"
        if self.ui and self.rest_port is not None:
            line += " ui=/ui/"
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`captioner serve`: runs the server until SIGTERM or SIGINT.

    Prints one line `serving: grpc=HOST:PORT rest=HOST:PORT` on stdout once
    the ports are open (the bound ports when 0 was asked for).
    Returns:
      The exit status: 0 after a clean shutdown, 1 when the server cannot
      start (port taken, bad models.config), 2 for bad arguments.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    refused = flags.refused_flag(argv)
    if refused:
        parser.error(refused)
    args = parser.parse_args(argv)
    if args.show_version:
        print(f"captioner serve {_version()} (TensorFlow {_tf_version()}); speaks "
              f"TensorFlow Serving's gRPC and REST APIs")
        return 0
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not (args.model_base_path or args.model_config_file):
        parser.error("give --model-base-path (--model_base_path) or --model-config-file "
                     "(--model_config_file)")
    if args.model_base_path and args.model_config_file:
        log.warning("--model_config_file is set: --model_base_path and --model_name are "
                    "ignored (as in TF Serving)")
        args.model_base_path = None
    if bool(args.ssl_cert) != bool(args.ssl_key):
        parser.error("--ssl-cert and --ssl-key go together")
    if args.ssl_config_file and args.ssl_cert:
        parser.error("give either --ssl_config_file or --ssl-cert/--ssl-key")
    try:
        policy = VersionPolicy.parse(args.model_version_policy)
        batching = _batching_from_args(args)
        metrics_path = None
        if args.monitoring_config_file:
            from serving.metrics import read_monitoring_config
            enabled, path = read_monitoring_config(args.monitoring_config_file)
            metrics_path = path if enabled else None
            if enabled and args.rest_port < 0:
                raise ValueError("--monitoring_config_file serves metrics on the REST port: "
                                 "set --rest_api_port")
        ssl_config = None
        if args.ssl_config_file:
            from serving.config_protos import SSLConfig, parse_text_file
            ssl_config = parse_text_file(args.ssl_config_file, SSLConfig)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    # Before any model loads: a missing folder or a taken port ends the start
    # here; a folder without versions is named (the server still starts).
    from serving import startup_checks
    try:
        if args.model_base_path:
            warning = startup_checks.check_model_base_path(args.model_base_path)
            if warning:
                print(f"captioner serve: warning: {warning}", file=sys.stderr, flush=True)
        startup_checks.check_port_free(args.host, args.port, "gRPC", "--port")
        if args.rest_port > 0:
            startup_checks.check_port_free(args.host, args.rest_port, "REST", "--rest-port")
    except startup_checks.StartupError as e:
        print(f"captioner serve: {e}", file=sys.stderr)
        return 1
    if args.intra_op or args.inter_op:
        import tensorflow as tf
        if args.intra_op:
            tf.config.threading.set_intra_op_parallelism_threads(args.intra_op)
        if args.inter_op:
            tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
    try:
        server = ModelServer(
            args.model_base_path, args.model_name, model_config_file=args.model_config_file,
            host=args.host, port=args.port,
            rest_port=args.rest_port if args.rest_port >= 0 else None,
            poll_seconds=args.poll_seconds, version_policy=policy, batching=batching,
            ssl_cert=args.ssl_cert, ssl_key=args.ssl_key,
            max_request_bytes=args.max_request_bytes, max_image_pixels=args.max_image_pixels,
            max_images_per_request=args.max_images_per_request,
            max_request_pixels=args.max_request_pixels,
            decode_memory_budget_mb=args.decode_memory_budget_mb,
            max_decode_work=args.max_decode_work, decode_work_budget=args.decode_work_budget,
            max_threads=args.max_threads, config_poll_seconds=args.config_poll_seconds,
            rest_threads=args.rest_threads or None, metrics_path=metrics_path,
            warmup=args.warmup, allow_version_labels_for_unavailable_models=args.allow_labels,
            max_load_retries=args.max_load_retries, ssl_config=ssl_config,
            health_service=args.health, ui=args.ui)
    except ValueError as e:
        parser.error(str(e))
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


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("captioner")
    except Exception:  # not installed: running from a checkout
        return "(source checkout)"


def _tf_version() -> str:
    import tensorflow as tf
    return tf.__version__


if __name__ == "__main__":
    sys.exit(main())
