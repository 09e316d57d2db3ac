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
- REST on a second port (`serving/server/rest.py`), with TF Serving's Prometheus
  metrics there when asked for (`serving/server/metrics.py`);
- version watching, warmup and availability-preserving swaps
  (`serving/versions/model_manager.py`), optional dynamic batching
  (`serving/versions/batch_scheduler.py`), image pixel limits checked from headers
  (`serving/limits/image_headers.py`), per-request image and pixel limits and a
  server-wide decode-memory budget (`serving/limits/admission.py`), decode-work
  limits and CPU admission with deadlines (`serving/limits/work_admission.py`), TLS
  on both ports.

Command line (`captioner serve` calls `main`; flags in `serving/server/flags.py`,
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
from concurrent import futures
from typing import Optional, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

from serving.errors import invalid_argument
from serving.limits.admission import DecodeBudget
from serving.limits.work_admission import mark_pool
from serving.server import flags
from serving.server.flags import batching_from_args as _batching_from_args  # noqa: F401
from serving.server.flags import (
    build_parser,  # noqa: F401  (the `captioner serve` parser)
    options_from_args,
)
from serving.server.grpc_services import (
    MODEL_SERVICE,
    PREDICTION_SERVICE,
    ModelServicer,
    PredictionServicer,
)
from serving.server.metrics import ServingMetrics
from serving.server.options import ServerOptions
from serving.server.predictor import Predictor, RequestLimits
from serving.server.rest_server import RestOptions, RestServer
from serving.server.thread_choice import choose_intra_op
from serving.ui.routes import UiFiles
from serving.versions.model_manager import (
    LoadOptions,
    ModelManager,
    ModelSource,
    sources_from_config,
)

log = logging.getLogger(__name__)


class ModelServer:
    """The server, usable in-process (tests, benchmarks) or from `main`.

    Give either `model_base_path` (+ `model_name`) or the options'
    `model_config_file`. Every other setting is a field of `options`:
    `ModelServer(base, options=ServerOptions(port=0, rest_port=0))`.

    Args:
      model_base_path: folder holding integer version folders.
      model_name: the name requests use for that model.
      options: every other setting (`serving/server/options.py`); None: the defaults.
    Raises:
      ValueError: conflicting settings (see `ServerOptions.checked`).
    """

    def __init__(self, model_base_path: Optional[str] = None, model_name: str = "captioner", *,
                 options: Optional[ServerOptions] = None):
        options = options or ServerOptions()
        self.options = options.checked(model_base_path)
        self.model_base_path = model_base_path
        self.model_name = model_name
        self.host = options.host
        self.metrics_path = options.metrics_path
        self.ui = options.ui
        budget_mb = options.decode_memory_budget_mb
        self.budget = DecodeBudget(budget_mb << 20 if budget_mb > 0 else 0)
        self.metrics = ServingMetrics(batching=options.batching is not None)
        # Every tensor element a request spells out costs at least one byte,
        # so only TF's padding rule (a few values, any shape) gives more
        # elements than max_request_bytes: bound what it can make us allocate.
        max_bytes = options.max_request_bytes
        self.predictor = Predictor(metrics=self.metrics, budget=self.budget, limits=RequestLimits(
            max_tensor_elements=max_bytes if max_bytes > 0 else None,
            max_images=options.max_images_per_request,
            max_request_pixels=options.max_request_pixels,
            max_decode_work=options.max_decode_work,
            decode_work_budget=options.decode_work_budget, decode_lanes=options.decode_lanes))
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
        return bool(self.options.ssl_cert) or self.options.ssl_config is not None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> "ModelServer":
        """Loads the initial versions, then opens the ports. Returns self.

        Raises:
          OSError: a port cannot be bound.
          ValueError: a bad models.config.
        """
        if self._started:
            return self
        options = self.options
        sources = None
        if self.model_base_path:
            sources = [ModelSource(self.model_name, self.model_base_path,
                                   options.version_policy)]
        loading = LoadOptions(
            max_image_pixels=options.max_image_pixels, batching=options.batching,
            warmup=self.predictor.predict_on if options.warmup else None,
            batch_observer=self.metrics.record_batch if options.batching else None,
            max_load_retries=options.max_load_retries)
        self.manager = ModelManager(
            sources=sources, config_file=options.model_config_file,
            poll_seconds=options.poll_seconds, config_poll_seconds=options.config_poll_seconds,
            loading=loading, on_change=self._update_health)
        self.predictor.manager = self.manager
        self.manager.start()
        try:
            self._start_grpc()
            if options.rest_port is not None and options.rest_port >= 0:
                self._start_rest()
        except BaseException:
            self.stop(grace=0)
            raise
        self._started = True
        self._update_health()
        log.info("%s", self.describe())
        return self

    def _start_rest(self) -> None:
        options = self.options
        rest_options = RestOptions(
            max_request_bytes=options.max_request_bytes, ssl_cert=options.ssl_cert,
            ssl_key=options.ssl_key, num_threads=options.rest_threads,
            metrics_path=self.metrics_path, timeout_ms=options.rest_timeout_ms,
            max_connections=options.rest_max_connections)
        self._rest = RestServer(
            self.predictor, options.host, options.rest_port, rest_options,
            metrics=self.metrics if self.metrics_path else None,
            ui=UiFiles(lambda: self.manager) if self.ui else None).start()
        self.rest_port = self._rest.port

    def _start_grpc(self) -> None:
        options = self.options
        grpc_options = [("grpc.max_receive_message_length", options.max_request_bytes),
                        ("grpc.max_send_message_length", -1),
                        ("grpc.so_reuseport", 0)]
        # No RPC waits for a worker thread: beyond max_threads in progress, gRPC
        # refuses it at once (RESOURCE_EXHAUSTED), as TF Serving's sync server
        # does once its --grpc_max_threads are busy; waiting, it would only be
        # answered after its deadline (serving/limits/load_shedding.py).
        server = grpc.server(futures.ThreadPoolExecutor(
            max_workers=options.max_threads, thread_name_prefix="grpc", initializer=mark_pool,
            initargs=("grpc", options.max_threads)), options=grpc_options,
            maximum_concurrent_rpcs=options.max_threads)
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            PredictionServicer(self.predictor, self.metrics), server)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(self), server)
        services = [PREDICTION_SERVICE, MODEL_SERVICE, reflection.SERVICE_NAME]
        if options.health_service:
            health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
            services.append(health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        reflection.enable_server_reflection(services, server)
        address = _join(self.host, options.port)
        try:
            port = server.add_secure_port(address, self._credentials()) if self.tls \
                else server.add_insecure_port(address)
        except RuntimeError as e:
            raise OSError(f"cannot bind the gRPC port {address}: {e}") from None
        if not port:
            raise OSError(f"cannot bind the gRPC port {address}")
        server.start()
        self._grpc = server
        self.grpc_port = port

    def _credentials(self) -> grpc.ServerCredentials:
        """The gRPC port's TLS credentials, from `ssl_config` or the PEM files."""
        config = self.options.ssl_config
        if config is not None:
            return grpc.ssl_server_credentials(
                [(config.server_key.encode(), config.server_cert.encode())],
                root_certificates=config.custom_ca.encode() or None,
                require_client_auth=config.client_verify)
        with open(self.options.ssl_key, "rb") as f:
            key = f.read()
        with open(self.options.ssl_cert, "rb") as f:
            cert = f.read()
        return grpc.ssl_server_credentials([(key, cert)])

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
        self.manager.reload(sources, self.options.allow_version_labels_for_unavailable_models)

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
    _check_args(parser, args)
    try:
        options = options_from_args(args)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    # Before any model loads: a missing folder or a taken port ends the start
    # here; a folder without versions is named (the server still starts).
    if not _startup_checks_pass(args):
        return 1
    threads = choose_intra_op(args.intra_op, _model_base_paths(args))
    log.info("TensorFlow intra-op threads: %s (%s)",
             threads.intra_op or "TensorFlow's choice", threads.reason)
    _set_tf_threads(threads.intra_op, args.inter_op)
    try:
        server = ModelServer(args.model_base_path, args.model_name, options=options)
    except ValueError as e:
        parser.error(str(e))
    return _serve_until_signal(server)


def _check_args(parser, args) -> None:
    """Argument combinations argparse cannot check (exits with status 2)."""
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


def _model_base_paths(args) -> list:
    """The base path of each model the server starts with ([] where the config cannot be
    read: ModelServer reports that)."""
    if args.model_base_path:
        return [args.model_base_path]
    from serving.versions.model_config import read_model_config
    try:
        return [source.base_path for source in read_model_config(args.model_config_file)]
    except ValueError:
        return []


def _startup_checks_pass(args) -> bool:
    """The model path and the ports; False (after saying why) when the start must end."""
    from serving.server import startup_checks
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
        return False
    return True


def _set_tf_threads(intra_op: int, inter_op: int) -> None:
    """TensorFlow's thread pools: their sizes when the flags set them (0: TensorFlow's choice)."""
    import tensorflow as tf
    try:
        if intra_op:
            tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        if inter_op:
            tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError as e:  # the pools exist already (TensorFlow ran in this process)
        log.warning("TensorFlow is initialized: its thread pools stay as they are (%s)", e)


def _serve_until_signal(server: ModelServer) -> int:
    """Starts `server`, prints its banner, serves until SIGTERM or SIGINT; the exit status."""
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
