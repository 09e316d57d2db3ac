"""What a `ModelServer` is told: `ServerOptions`, the one declaration of the server's settings.

Each field carries its default, type (the annotation) and help text, and
where it is a flag of `captioner serve`, its spellings and flag group
(`field.metadata`, written by `setting`). From this declaration come:

- the flags of those settings (`serving/server/flags.py`, `build_parser`);
- the pipeline config's `serve` section, the fields marked `config=True`
  (`components/contract/config/sections.py`, `ServeConfig`), and its rows
  in the config reference (docs/configuration.md, `make docs`);
- `RestOptions`' body limit (`serving/server/rest.py`).

The settings whose flag is a file the server parses (batching parameters,
monitoring and SSL configs) or that TF Serving spells with another meaning
(`--rest_api_port=0` turns REST off) keep hand-written flags in
`flags.py`, with their defaults read from here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:  # kept light: the pipeline's config imports this declaration
    from serving.versions.batching_parameters import BatchingParameters
    from serving.versions.model_config import VersionPolicy


def setting(default: Any, help: str, *flags: str, group: str = "", config: bool = False,
            config_flag: str = "", switch: bool = False):
    """A `ServerOptions` field: its default and help, its flag spellings and group, and
    whether the pipeline config's `serve` section has it (`config=True`, passed to
    `captioner serve` as `config_flag`, default the first spelling). A `switch` is an
    off-by-default flag that takes no value (`--ui`); TF Serving's booleans take one."""
    return field(default=default, metadata={
        "help": help, "flags": flags, "group": group, "config": config, "switch": switch,
        "config_flag": config_flag or (flags[0] if flags else "")})


@dataclass(frozen=True)
class ServerOptions:
    """Every setting of `ModelServer` but the model's path and name (see each field's help)."""
    model_config_file: Optional[str] = setting(
        None, "models.config (ModelServerConfig text), instead of --model-base-path",
        "--model-config-file", "--model_config_file", group="models")
    host: str = setting("127.0.0.1", "address to bind (default: loopback only)", "--host",
                        group="network", config=True)
    port: int = setting(8500, "gRPC port (0: any free)", "--port", group="network", config=True)
    rest_port: Optional[int] = setting(
        8501, "REST port (0: any free, -1 or None: no REST)", group="network", config=True,
        config_flag="--rest-port")
    poll_seconds: float = setting(
        1.0, "seconds between polls of the model folders; <= 0 polls once", "--poll-seconds",
        "--file_system_poll_wait_seconds", group="models", config=True)
    version_policy: Union[str, VersionPolicy] = setting(
        "latest:1", "latest:N | all | specific:1,2 for --model-base-path",
        "--model-version-policy", group="models")
    batching: Optional[BatchingParameters] = setting(
        None, "BatchingParameters to batch concurrent requests, or None")
    ssl_cert: Optional[str] = setting(None, "PEM certificate chain: TLS on both ports",
                                      "--ssl-cert", group="network")
    ssl_key: Optional[str] = setting(None, "PEM private key for --ssl-cert", "--ssl-key",
                                     group="network")
    max_request_bytes: int = setting(
        16 * 1024 * 1024, "larger gRPC messages get RESOURCE_EXHAUSTED, larger REST bodies 413",
        "--max-request-bytes", group="limits", config=True)
    max_image_pixels: int = setting(
        40_000_000, "refuse images whose header claims more pixels, before decoding "
        "(INVALID_ARGUMENT; 0: no limit)", "--max-image-pixels", group="limits", config=True)
    max_images_per_request: int = setting(
        1000, "most images (string elements) and rows in one request, counted from the shape "
        "before anything is decoded (0: no limit)", "--max-images-per-request", group="limits")
    max_request_pixels: int = setting(
        80_000_000, "most decoded pixels of all images of one request (0: no limit)",
        "--max-request-pixels", group="limits")
    decode_memory_budget_mb: int = setting(
        2048, "server-wide memory (MiB) that requests in progress may need together, "
        "estimated before decoding; beyond it RESOURCE_EXHAUSTED / 429 (0: no budget)",
        "--decode-memory-budget-mb", group="limits")
    # Pixel-passes (serving/limits/decode_work.py): twice a 40 Mpx progressive
    # CMYK JPEG's 0.96 G, the most any common encoder writes at the pixel limit.
    max_decode_work: int = setting(
        2_000_000_000, "refuse images whose estimated decode work exceeds this many "
        "pixel-passes: pixels x passes, a JPEG's scans, a PNG's 7 interlacing passes, a GIF's "
        "or WebP's frames (0: no limit)", "--max-decode-work", group="limits", config=True)
    decode_work_budget: Optional[int] = setting(
        None, "pixel-passes that expensive requests in progress may hold together; more wait, "
        "up to their deadline, and one request may need no more (default: twice "
        "--max-decode-work; 0: no CPU admission)", "--decode-work-budget", group="limits")
    decode_lanes: Optional[int] = setting(
        None, "expensive requests decoding at once; None: TensorFlow's inter-op threads less one")
    max_threads: int = setting(
        64, "gRPC worker threads: requests in progress at once; more get RESOURCE_EXHAUSTED "
        "at once instead of waiting for a thread (as TF Serving's --grpc_max_threads)",
        "--max-threads", "--grpc_max_threads", group="network")
    rest_timeout_ms: int = setting(
        30_000, "REST request timeout (ms), from its arrival: a predict request expected to "
        "be answered later is refused at once (429), one not started in time is answered 504 "
        "without running (gRPC requests use their own deadline); 0: none",
        "--rest-timeout-ms", "--rest_api_timeout_in_ms", group="limits")
    rest_max_connections: Optional[int] = setting(
        None, "open REST connections beyond which requests get 503 and their connection is "
        "closed, so the process keeps file descriptors for its models (default: half the "
        "open-file limit, RLIMIT_NOFILE; 0: no limit)", "--rest-max-connections",
        group="limits")
    config_poll_seconds: Optional[float] = setting(
        None, "seconds between re-reads of the config file; <= 0: read once; None: at every "
        "file-system poll")
    rest_threads: Optional[int] = setting(
        None, "REST requests handled at once (None: 4 per CPU, as in TF Serving)")
    metrics_path: Optional[str] = setting(
        None, "URL path of TF Serving's Prometheus metrics on the REST port, or None")
    warmup: bool = setting(True, "replay the warmup records of each version before serving it",
                           "--enable_model_warmup", group="models")
    allow_version_labels_for_unavailable_models: bool = setting(
        False, "a new version label may name a version that is not loaded yet",
        "--allow_version_labels_for_unavailable_models", group="models")
    max_load_retries: int = setting(5, "load attempts after a version's first failure",
                                    "--max_num_load_retries", group="models")
    ssl_config: Any = setting(
        None, "a TF Serving SSLConfig (serving/server/config_protos.py): TLS on the gRPC port "
        "from PEM text, client certificates checked against custom_ca when client_verify")
    health_service: bool = setting(True, "register grpc.health.v1.Health",
                                   "--enable_grpc_healthcheck_service", group="network")
    ui: bool = setting(False, "serve the attention explorer page at /ui/ on the REST port",
                       "--ui", group="network", switch=True)

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
            from serving.versions.model_config import VersionPolicy
            return dataclasses.replace(self, version_policy=VersionPolicy.parse(
                self.version_policy))
        return self


DEFAULTS = ServerOptions()


def declared(name: str) -> dataclasses.Field:
    """The declaration (field) of the setting `name`."""
    return next(f for f in dataclasses.fields(ServerOptions) if f.name == name)


def config_settings() -> list[dataclasses.Field]:
    """The settings the pipeline config's `serve` section has, in declaration order."""
    return [f for f in dataclasses.fields(ServerOptions) if f.metadata.get("config")]
