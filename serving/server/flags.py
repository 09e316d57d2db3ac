"""`captioner serve`'s command line: this project's flags and `tensorflow_model_server`'s.

A deployment written for TF Serving runs unchanged: its flag names
(`--model_config_file=...`, `--rest_api_port=8501`, `--enable_batching`)
are accepted with TF Serving's meanings, next to this project's own
dash-separated flags. Every other TF Serving flag is refused with a message
that names it (`TF_SERVING_REFUSED`), never silently ignored; flags neither
server knows are argparse errors.

The settings, their defaults and help are declared once, in
`ServerOptions` (serving/server/options.py); the flags of those that are
plain values are generated from that declaration here (`_add_declared`).
`captioner serve --config NAME` (pipeline/cli.py) turns the config's `serve`
section into flags placed before the user's, so the user's win.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Dict, Optional, Sequence

from serving.cli_help import DefaultsHelpFormatter, parse_bool
from serving.server.options import DEFAULTS, ServerOptions
from serving.server.thread_choice import SMALL_ENCODER_GFLOPS
from serving.versions.batching_parameters import BatchingParameters
from serving.versions.model_config import VersionPolicy

# tensorflow_model_server flags (tensorflow_serving/model_servers/main.cc)
# that this server accepts, with what they do here.
TF_SERVING_SUPPORTED: Dict[str, str] = {
    "port": "gRPC port (0: any free port; TF Serving: 0 disables gRPC)",
    "rest_api_port": "REST port; 0 turns REST off, as in TF Serving",
    "rest_api_num_threads": "REST requests handled at once (default 4 per CPU)",
    "rest_api_timeout_in_ms": "REST request timeout (default 30000); here requests expected "
                              "to miss it are refused at once (429)",
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
    groups = {name: p.add_argument_group(name) for name in ("models", "network", "limits")}
    _add_declared(groups)
    _add_model_flags(groups["models"])
    _add_network_flags(groups["network"])
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


def _add_declared(groups) -> None:
    """The flags of the settings `ServerOptions` declares with flag spellings."""
    for f in dataclasses.fields(ServerOptions):
        spellings, group = f.metadata["flags"], f.metadata["group"]
        if not spellings:
            continue
        kind = f.type if isinstance(f.type, type) else _TYPES.get(str(f.type), str)
        help_text = f.metadata["help"]
        if f.metadata["switch"]:
            groups[group].add_argument(*spellings, dest=f.name, action="store_true",
                                       help=help_text + " (off by default)")
        elif kind is bool:
            groups[group].add_argument(*spellings, dest=f.name, default=f.default,
                                       **_BOOL_FLAG, help=help_text)
        else:
            groups[group].add_argument(*spellings, dest=f.name, type=kind, default=f.default,
                                       help=help_text)


# `from __future__ import annotations` leaves field types as strings.
_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "Optional[int]": int,
          "Optional[float]": float, "Optional[str]": str, "Union[str, VersionPolicy]": str}


def _add_model_flags(src) -> None:
    src.add_argument("--model-base-path", "--model_base_path", dest="model_base_path",
                     help="folder with integer version folders")
    src.add_argument("--model-name", "--model_name", dest="model_name", default="captioner",
                     help="name of the model at --model-base-path (default: captioner)")
    src.add_argument("--model_config_file_poll_wait_seconds", type=float, default=0.0,
                     dest="config_poll_seconds",
                     help="seconds between re-reads of the config file (0: read once)")


def _add_network_flags(net) -> None:
    net.add_argument("--rest-port", type=int, dest="rest_port", default=DEFAULTS.rest_port,
                     help="REST port (0: any free, -1: no REST)")
    net.add_argument("--rest_api_port", type=int, dest="rest_port", action=_RestApiPort,
                     help="REST port (0: no REST, as in TF Serving)")
    net.add_argument("--rest_api_num_threads", type=int, dest="rest_threads", default=0,
                     help="REST requests handled at once (0: 4 per CPU)")
    net.add_argument("--ssl_config_file",
                     help="TF Serving SSLConfig text: TLS on the gRPC port only")
    net.add_argument("--monitoring_config_file",
                     help="TF Serving MonitoringConfig text: Prometheus metrics on the REST port")


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
    bat.add_argument("--max-enqueued-batches", type=int,
                     help="batches of requests that may wait (default 10, as TF Serving); "
                          "beyond: UNAVAILABLE. Fewer keep the latency under overload low")


def batching_from_args(args) -> Optional[BatchingParameters]:
    """The batching parameters the flags ask for, or None when batching is off."""
    if not (args.enable_batching or args.batching_parameters_file):
        return None
    base = (BatchingParameters.from_file(args.batching_parameters_file)
            if args.batching_parameters_file else BatchingParameters())
    overrides = {k: v for k, v in (("max_batch_size", args.max_batch_size),
                                   ("batch_timeout_micros", args.batch_timeout_micros),
                                   ("num_batch_threads", args.num_batch_threads),
                                   ("max_enqueued_batches", args.max_enqueued_batches))
                 if v is not None}
    if overrides:
        if "max_batch_size" in overrides and base.allowed_batch_sizes:
            overrides["allowed_batch_sizes"] = ()
        base = dataclasses.replace(base, **overrides)
    return base


def options_from_args(args) -> ServerOptions:
    """The `ServerOptions` that parsed `captioner serve` flags ask for.

    Reads the files the flags name (batching parameters, monitoring and SSL
    configs).
    Raises:
      ValueError, OSError: a bad policy, an unreadable or malformed file, or
        metrics asked for without a REST port.
    """
    declared = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServerOptions)
                if f.metadata["flags"]}
    declared["version_policy"] = VersionPolicy.parse(args.version_policy)
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
        **declared, rest_port=args.rest_port if args.rest_port >= 0 else None,
        batching=batching_from_args(args), config_poll_seconds=args.config_poll_seconds,
        rest_threads=args.rest_threads or None, metrics_path=metrics_path,
        ssl_config=ssl_config)
