"""What a `ModelServer` is told: `ServerOptions`, and how `captioner serve`'s flags map to it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Union

from serving.versions.batching_parameters import BatchingParameters
from serving.server.flags import DEFAULTS, batching_from_args
from serving.versions.model_config import VersionPolicy


@dataclass(frozen=True)
class ServerOptions:
    """Every setting of `ModelServer` but the model's path and name.

    Attributes:
      model_config_file: a `models.config` (ModelServerConfig text format),
        instead of `ModelServer`'s `model_base_path`.
      host: address to bind both ports to (default loopback only).
      port: gRPC port; 0 picks a free one (see `ModelServer.grpc_port`).
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
        together (estimated before decoding, `serving/limits/admission.py`); a
        request that does not fit gets RESOURCE_EXHAUSTED (REST 429); 0: no
        budget.
      max_decode_work: most decode work (pixel-passes) of one image
        (`serving/limits/decode_work.py`); 0: no limit.
      decode_work_budget: pixel-passes that expensive requests in progress
        may hold together (`serving/limits/work_admission.py`); None: twice
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
      ssl_config: a TF Serving `SSLConfig` (serving/server/config_protos.py): TLS
        on the gRPC port from PEM text, client certificates checked against
        `custom_ca` when `client_verify`; REST stays plain, as in TF Serving.
      health_service: register `grpc.health.v1.Health`.
      ui: serve the attention explorer page at `/ui/` on the REST port
        (`serving/ui/routes.py`).
    """
    model_config_file: Optional[str] = None
    host: str = DEFAULTS.host
    port: int = DEFAULTS.port
    rest_port: Optional[int] = DEFAULTS.rest_port
    poll_seconds: float = DEFAULTS.poll_seconds
    version_policy: Union[str, VersionPolicy] = "latest:1"
    batching: Optional[BatchingParameters] = None
    ssl_cert: Optional[str] = None
    ssl_key: Optional[str] = None
    max_request_bytes: int = DEFAULTS.max_request_bytes
    max_image_pixels: int = DEFAULTS.max_image_pixels
    max_images_per_request: int = DEFAULTS.max_images_per_request
    max_request_pixels: int = DEFAULTS.max_request_pixels
    decode_memory_budget_mb: int = DEFAULTS.decode_memory_budget_mb
    max_decode_work: int = DEFAULTS.max_decode_work
    decode_work_budget: Optional[int] = None
    decode_lanes: Optional[int] = None
    max_threads: int = DEFAULTS.max_threads
    config_poll_seconds: Optional[float] = None
    rest_threads: Optional[int] = None
    metrics_path: Optional[str] = None
    warmup: bool = True
    allow_version_labels_for_unavailable_models: bool = False
    max_load_retries: int = DEFAULTS.max_load_retries
    ssl_config: Any = None
    health_service: bool = True
    ui: bool = False

    def checked(self, model_base_path: Optional[str]) -> "ServerOptions":
        """These options with the version policy parsed.

        Raises:
          ValueError: both or neither of `model_base_path` and
            `model_config_file`, half a TLS pair, or two ways of TLS.
        """
        if bool(model_base_path) == bool(self.model_config_file):
            raise ValueError("give exactly one of model_base_path and model_config_file")
        if bool(self.ssl_cert) != bool(self.ssl_key):
            raise ValueError("TLS needs both ssl_cert and ssl_key")
        if self.ssl_config is not None and self.ssl_cert:
            raise ValueError("give either ssl_cert/ssl_key or ssl_config")
        if self.ssl_config is not None and not (self.ssl_config.server_key
                                                and self.ssl_config.server_cert):
            raise ValueError("ssl_config needs server_key and server_cert")
        if isinstance(self.version_policy, str):
            return dataclasses.replace(self, version_policy=VersionPolicy.parse(
                self.version_policy))
        return self


def options_from_args(args) -> ServerOptions:
    """The `ServerOptions` that parsed `captioner serve` flags ask for.

    Reads the files the flags name (batching parameters, monitoring and SSL
    configs).
    Raises:
      ValueError, OSError: a bad policy, an unreadable or malformed file, or
        metrics asked for without a REST port.
    """
    policy = VersionPolicy.parse(args.model_version_policy)
    batching = batching_from_args(args)
    metrics_path = None
    if args.monitoring_config_file:
        from serving.server.metrics import read_monitoring_config
        enabled, path = read_monitoring_config(args.monitoring_config_file)
        metrics_path = path if enabled else None
        if enabled and args.rest_port < 0:
            raise ValueError("--monitoring_config_file serves metrics on the REST port: "
                             "set --rest_api_port")
    ssl_config = None
    if args.ssl_config_file:
        from serving.server.config_protos import SSLConfig, parse_text_file
        ssl_config = parse_text_file(args.ssl_config_file, SSLConfig)
    return ServerOptions(
        model_config_file=args.model_config_file, host=args.host, port=args.port,
        rest_port=args.rest_port if args.rest_port >= 0 else None,
        poll_seconds=args.poll_seconds, version_policy=policy,
        batching=batching, ssl_cert=args.ssl_cert, ssl_key=args.ssl_key,
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
