"""`captioner serve`'s command line: this project's flags and `tensorflow_model_server`'s.

A deployment written for TF Serving runs unchanged: its flag names
(`--model_config_file=...`, `--rest_api_port=8501`, `--enable_batching`)
are accepted with TF Serving's meanings, next to this project's own
dash-separated flags. Every other TF Serving flag is refused with a message
that names it (`TF_SERVING_REFUSED`), never silently ignored; flags neither
server knows are argparse errors.

Defaults live here (`DEFAULTS`), not in the pipeline's config: `captioner
serve --config NAME` (pipeline/cli.py) turns the config's `serve` section
into flags placed before the user's, so the user's win.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

from serving.cli_help import DefaultsHelpFormatter, parse_bool
from serving.versions.batching_parameters import BatchingParameters
from serving.server.thread_choice import SMALL_ENCODER_GFLOPS


@dataclass(frozen=True)
class ServeDefaults:
    """Defaults of `captioner serve` (and of `ModelServer`)."""
    host: str = "127.0.0.1"
    port: int = 8500
    rest_port: int = 8501
    poll_seconds: float = 1.0
    max_request_bytes: int = 16 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    max_images_per_request: int = 1000
    max_request_pixels: int = 80_000_000
    decode_memory_budget_mb: int = 2048
    # Pixel-passes (serving/limits/decode_work.py): twice a 40 Mpx progressive CMYK
    # JPEG's 0.96 G, the most any common encoder writes at the pixel limit.
    max_decode_work: int = 2_000_000_000
    max_threads: int = 64
    max_load_retries: int = 5


DEFAULTS = ServeDefaults()

# tensorflow_model_server flags (tensorflow_serving/model_servers/main.cc)
# that this server accepts, with what they do here.
TF_SERVING_SUPPORTED: Dict[str, str] = {
    "port": "gRPC port (0: any free port; TF Serving: 0 disables gRPC)",
    "rest_api_port": "REST port; 0 turns REST off, as in TF Serving",
    "rest_api_num_threads": "REST requests handled at once (default 4 per CPU)",
    "model_name": "name of the model at --model_base_path",
    "model_base_path": "folder of integer version folders",
    "model_config_file": "models.config (ModelServerConfig text format)",
    "model_config_file_poll_wait_seconds": "seconds between re-reads of --model_config_file; "
                                           "unset or 0: read once",
    "enable_batching": "dynamic batching",
    "batching_parameters_file": "batching parameters text file (implies batching here)",
    "monitoring_config_file": "MonitoringConfig text: Prometheus metrics on the REST port",
    "ssl_config_file": "SSLConfig text: TLS (and client certificates) on the gRPC port",
    "enable_model_warmup": "replay assets.extra/tf_serving_warmup_requests (default true)",
    "file_system_poll_wait_seconds": "seconds between polls of the base paths; 0: once",
    "allow_version_labels_for_unavailable_models": "a new label may name a version that is "
                                                   "not loaded yet",
    "grpc_max_threads": "gRPC requests handled at once",
    "max_num_load_retries": "load attempts after a version's first failure (default 5)",
    "tensorflow_intra_op_parallelism": "threads within one op (0: TensorFlow's choice; unset: "
                                       "1 for small encoders, serving/server/thread_choice.py)",
    "tensorflow_inter_op_parallelism": "ops run at once (0: TensorFlow's choice)",
    "enable_grpc_healthcheck_service": "grpc.health.v1 service (default true here; "
                                       "TF Serving: false)",
    "version": "print the version and exit",
}

# tensorflow_model_server flags this server does not implement, and why.
TF_SERVING_REFUSED: Dict[str, str] = {
    "grpc_socket_path": "no UNIX-socket gRPC listener",
    "rest_api_timeout_in_ms": "no per-request REST timeout",
    "rest_api_enable_cors_support": "no CORS headers",
    "enable_per_model_batching_parameters": "batching parameters are server-wide",
    "num_load_threads": "versions load one at a time",
    "num_unload_threads": "versions unload one at a time",
    "load_retry_interval_micros": "retries are spaced 2, 4, 8 ... s apart",
    "flush_filesystem_caches": "no file-system cache flushing",
    "tensorflow_session_parallelism": "use the intra/inter-op flags",
    "tensorflow_session_config_file": "no session ConfigProto: signatures run as TF2 functions",
    "use_alts_credentials": "no ALTS",
    "platform_config_file": "only the tensorflow platform",
    "per_process_gpu_memory_fraction": "no GPU memory fraction",
    "saved_model_tags": "the 'serve' meta graph is always loaded",
    "grpc_channel_arguments": "no raw gRPC channel arguments",
    "num_request_iterations_for_warmup": "each warmup record is replayed once",
    "remove_unused_fields_from_bundle_metagraph": "not applicable",
    "prefer_tflite_model": "no TensorFlow Lite",
    "num_tflite_pools": "no TensorFlow Lite",
    "num_tflite_interpreters_per_pool": "no TensorFlow Lite",
    "enable_signature_method_name_check": "no method name check",
    "xla_cpu_compilation_enabled": "no XLA switch",
    "xla_gpu_compilation_enabled": "no XLA switch",
    "enable_profiler": "no profiler service",
    "thread_pool_factory_config_file": "no thread pool factory",
    "mixed_precision": "no mixed precision switch",
    "skip_initialize_tpu": "no TPU",
    "enable_serialization_as_tensor_content": "outputs are always in tensor_content",
}


def refused_flag(argv: Sequence[str]) -> Optional[str]:
    """The error message for the first TF Serving flag in `argv` that is not implemented."""
    for arg in argv:
        if arg == "--":
            break
        if arg.startswith("--"):
            name = arg[2:].split("=", 1)[0]
            if name in TF_SERVING_REFUSED:
                return (f"--{name} is a tensorflow_model_server flag that this server does not "
                        f"implement ({TF_SERVING_REFUSED[name]}); remove it "
                        f"(docs/serving.md lists the supported ones)")
    return None


class _RestApiPort(argparse.Action):
    """`--rest_api_port`: TF Serving's meaning, 0 turns REST off."""

    def __call__(self, parser, namespace, value, option_string=None):
        setattr(namespace, self.dest, -1 if value == 0 else value)


# A TF-style boolean flag: `--name`, `--name=true`, `--name=false`.
_BOOL_FLAG = dict(type=parse_bool, nargs="?", const=True, metavar="BOOL")


def build_parser() -> argparse.ArgumentParser:
    """The `captioner serve` argument parser (both flag styles)."""
    p = argparse.ArgumentParser(
        prog="captioner serve", allow_abbrev=False, formatter_class=DefaultsHelpFormatter,
        description="Serve SavedModel versions over TF Serving's gRPC and REST APIs. "
                    "tensorflow_model_server's flags are accepted too.")
    _add_model_flags(p.add_argument_group("models"))
    _add_network_flags(p.add_argument_group("network"))
    _add_limit_flags(p.add_argument_group("limits"))
    _add_batching_flags(p.add_argument_group("batching"))
    tf_group = p.add_argument_group("TensorFlow")
    tf_group.add_argument(
        "--tensorflow_intra_op_parallelism", dest="intra_op", type=int, default=None,
        help="threads within one op; 0: TensorFlow's choice (one per CPU). Unset: 1 when "
             "every model's export records an encoder of at most "
             f"{SMALL_ENCODER_GFLOPS:g} GFLOPs per image, where handing small ops to pool "
             "threads costs more than it gains, else TensorFlow's choice "
             "(serving/server/thread_choice.py)")
    tf_group.add_argument("--tensorflow_inter_op_parallelism", dest="inter_op", type=int,
                          default=0)
    p.add_argument("--version", dest="show_version", default=False, **_BOOL_FLAG,
                   help="print the version and exit")
    p.add_argument("--log-level", default="INFO")
    return p


def _add_model_flags(src) -> None:
    src.add_argument("--model-base-path", "--model_base_path", dest="model_base_path",
                     help="folder with integer version folders")
    src.add_argument("--model-name", "--model_name", dest="model_name", default="captioner",
                     help="name of the model at --model-base-path (default: captioner)")
    src.add_argument("--model-config-file", "--model_config_file", dest="model_config_file",
                     help="models.config (ModelServerConfig text)")
    src.add_argument("--model_config_file_poll_wait_seconds", type=float, default=0.0,
                     dest="config_poll_seconds",
                     help="seconds between re-reads of the config file (0: read once)")
    src.add_argument("--model-version-policy", default="latest:1",
                     help="latest:N | all | specific:1,2 for --model-base-path "
                          "(default: latest:1)")
    src.add_argument("--poll-seconds", "--file_system_poll_wait_seconds", type=float,
                     dest="poll_seconds", default=DEFAULTS.poll_seconds,
                     help="file-system poll interval; <= 0 polls once")
    src.add_argument("--enable_model_warmup", dest="warmup", default=True, **_BOOL_FLAG,
                     help="replay the warmup records of each version (default true)")
    src.add_argument("--allow_version_labels_for_unavailable_models", dest="allow_labels",
                     default=False, **_BOOL_FLAG)
    src.add_argument("--max_num_load_retries", dest="max_load_retries", type=int,
                     default=DEFAULTS.max_load_retries)


def _add_network_flags(net) -> None:
    net.add_argument("--host", default=DEFAULTS.host,
                     help="address to bind (default: 127.0.0.1, loopback only)")
    net.add_argument("--port", type=int, default=DEFAULTS.port, help="gRPC port (0: any free)")
    net.add_argument("--rest-port", type=int, dest="rest_port", default=DEFAULTS.rest_port,
                     help="REST port (0: any free, -1: no REST)")
    net.add_argument("--rest_api_port", type=int, dest="rest_port", action=_RestApiPort,
                     help="REST port (0: no REST, as in TF Serving)")
    net.add_argument("--rest_api_num_threads", type=int, dest="rest_threads", default=0)
    net.add_argument("--ssl-cert", help="PEM certificate chain: TLS on both ports")
    net.add_argument("--ssl-key", help="PEM private key for --ssl-cert")
    net.add_argument("--ssl_config_file",
                     help="TF Serving SSLConfig text: TLS on the gRPC port only")
    net.add_argument("--max-threads", "--grpc_max_threads", dest="max_threads", type=int,
                     default=DEFAULTS.max_threads, help="gRPC worker threads")
    net.add_argument("--enable_grpc_healthcheck_service", dest="health", default=True,
                     **_BOOL_FLAG)
    net.add_argument("--monitoring_config_file",
                     help="TF Serving MonitoringConfig text: Prometheus metrics on the REST port")
    net.add_argument("--ui", action="store_true",
                     help="serve the attention explorer page at /ui/ on the REST port "
                          "(off by default)")


def _add_limit_flags(lim) -> None:
    lim.add_argument("--max-request-bytes", type=int, default=DEFAULTS.max_request_bytes)
    lim.add_argument("--max-image-pixels", type=int, default=DEFAULTS.max_image_pixels,
                     help="refuse images whose header claims more pixels (0: no limit)")
    lim.add_argument("--max-images-per-request", type=int,
                     default=DEFAULTS.max_images_per_request,
                     help="most images (string elements) and rows in one request, counted "
                          "from the shape before anything is decoded (0: no limit)")
    lim.add_argument("--max-request-pixels", type=int, default=DEFAULTS.max_request_pixels,
                     help="most decoded pixels of all images of one request (0: no limit)")
    lim.add_argument("--decode-memory-budget-mb", type=int,
                     default=DEFAULTS.decode_memory_budget_mb,
                     help="server-wide memory that requests in progress may need together; "
                          "beyond it RESOURCE_EXHAUSTED / 429 (0: no budget)")
    lim.add_argument("--max-decode-work", type=int, default=DEFAULTS.max_decode_work,
                     help="refuse images whose estimated decode work exceeds this many "
                          "pixel-passes: pixels x passes, a JPEG's scans, a PNG's 7 "
                          "interlacing passes, a GIF's or WebP's frames (0: no limit)")
    lim.add_argument("--decode-work-budget", type=int, default=None,
                     help="pixel-passes that expensive requests in progress may hold "
                          "together; more wait, up to their deadline, and one request may "
                          "need no more (default: twice --max-decode-work; 0: no CPU "
                          "admission)")


def _add_batching_flags(bat) -> None:
    bat.add_argument("--enable-batching", "--enable_batching", dest="enable_batching",
                     default=False, **_BOOL_FLAG,
                     help="batch concurrent requests (TF Serving semantics)")
    bat.add_argument("--batching-parameters-file", "--batching_parameters_file",
                     dest="batching_parameters_file",
                     help="TF Serving batching parameters text file (implies batching)")
    bat.add_argument("--max-batch-size", type=int)
    bat.add_argument("--batch-timeout-micros", type=int)
    bat.add_argument("--num-batch-threads", type=int)


def batching_from_args(args) -> Optional[BatchingParameters]:
    """The batching parameters the flags ask for, or None when batching is off."""
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
