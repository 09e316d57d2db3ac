"""`captioner serve` with tensorflow_model_server's flags: the docs' docker line, refusals."""
from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading

import pytest

from serving.client.caption_client import CaptionClient
from serving.server.flags import (
    TF_SERVING_REFUSED,
    TF_SERVING_SUPPORTED,
    build_parser,
    refused_flag,
)
from serving.server.model_server import main
from tests.serving.conftest import RED
from tests.serving.fixtures import (
    expected_caption,
    publish_version,
    rest_call,
    solid_image,
    stop_process,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Every flag of tensorflow_model_server (tensorflow_serving/model_servers/main.cc).
TF_SERVING_FLAGS = {
    "port", "grpc_socket_path", "rest_api_port", "rest_api_num_threads",
    "rest_api_timeout_in_ms", "rest_api_enable_cors_support", "enable_batching",
    "allow_version_labels_for_unavailable_models", "batching_parameters_file",
    "enable_per_model_batching_parameters", "model_config_file",
    "model_config_file_poll_wait_seconds", "model_name", "model_base_path", "num_load_threads",
    "num_unload_threads", "max_num_load_retries", "load_retry_interval_micros",
    "file_system_poll_wait_seconds", "flush_filesystem_caches",
    "tensorflow_session_parallelism", "tensorflow_session_config_file",
    "tensorflow_intra_op_parallelism", "tensorflow_inter_op_parallelism",
    "use_alts_credentials", "ssl_config_file", "platform_config_file",
    "per_process_gpu_memory_fraction", "saved_model_tags", "grpc_channel_arguments",
    "grpc_max_threads", "enable_model_warmup", "num_request_iterations_for_warmup", "version",
    "monitoring_config_file", "remove_unused_fields_from_bundle_metagraph",
    "prefer_tflite_model", "num_tflite_pools", "num_tflite_interpreters_per_pool",
    "enable_signature_method_name_check", "xla_cpu_compilation_enabled",
    "xla_gpu_compilation_enabled", "enable_profiler", "thread_pool_factory_config_file",
    "mixed_precision", "skip_initialize_tpu", "enable_grpc_healthcheck_service",
    "enable_serialization_as_tensor_content",
}


def docs_docker_flags() -> list[str]:
    """The tensorflow_model_server arguments of the docker command in docs/serving.md."""
    with open(os.path.join(REPO, "docs", "serving.md"), encoding="utf-8") as f:
        text = f.read()
    block = re.search(r"```bash\n(SERVING_DIR=.*?docker run.*?)```", text, re.S).group(1)
    command = block.split("\n", 1)[1].replace("\\\n", " ")
    words = shlex.split(command)
    return words[words.index("tensorflow/serving:latest") + 1:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_tf_serving_flag_is_either_supported_or_refused():
    assert set(TF_SERVING_SUPPORTED) | set(TF_SERVING_REFUSED) == TF_SERVING_FLAGS
    assert not set(TF_SERVING_SUPPORTED) & set(TF_SERVING_REFUSED)
    parser_flags = {option.lstrip("-") for action in build_parser()._actions
                    for option in action.option_strings}
    assert set(TF_SERVING_SUPPORTED) <= parser_flags
    assert not set(TF_SERVING_REFUSED) & parser_flags


@pytest.mark.parametrize("flag", ["--rest_api_enable_cors_support", "--num_load_threads=2",
                                  "--saved_model_tags=serve,gpu", "--enable_profiler=false"])
def test_unimplemented_tf_serving_flags_are_refused_by_name(flag, capsys):
    name = flag[2:].split("=")[0]
    assert name in refused_flag(["--model_base_path=/m", flag])
    with pytest.raises(SystemExit) as exit_info:
        main(["--model_base_path=/m", flag])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--{name} is a tensorflow_model_server flag that this server does not implement" \
        in err


def test_unknown_flags_and_abbreviations_are_errors(capsys):
    for argv in (["--model_base_path=/m", "--no_such_flag=1"], ["--model_base=/m"]):
        with pytest.raises(SystemExit):
            main(argv)
    assert "unrecognized arguments" in capsys.readouterr().err


def test_tf_serving_flag_meanings():
    parser = build_parser()
    args = parser.parse_args(["--model_base_path=/m", "--rest_api_port=0",
                              "--enable_model_warmup=false", "--enable_batching",
                              "--file_system_poll_wait_seconds=3", "--grpc_max_threads=7",
                              "--allow_version_labels_for_unavailable_models=true",
                              "--rest_api_num_threads=5", "--rest_api_timeout_in_ms=2500"])
    assert args.rest_port == -1  # TF Serving: 0 turns REST off
    assert args.warmup is False and args.enable_batching is True
    assert args.poll_seconds == 3 and args.max_threads == 7 and args.allow_version_labels_for_unavailable_models is True
    assert args.rest_threads == 5
    assert args.rest_timeout_ms == 2500  # REST requests' deadline (refused if expected later)
    assert args.config_poll_seconds == 0  # unset: the config file is read once
    defaults = parser.parse_args(["--model-base-path", "/m"])
    assert defaults.warmup is True and defaults.enable_batching is False
    assert defaults.rest_timeout_ms == 30_000  # TF Serving's default
    assert parser.parse_args(["--model_base_path=/m", "--rest-port=0"]).rest_port == 0


def test_version_flag(capsys):
    assert main(["--version"]) == 0
    assert "TensorFlow" in capsys.readouterr().out


def test_the_docs_docker_command_line_runs_unchanged(tmp_path, model_store):
    """docs/serving.md's tensorflow_model_server arguments, against `captioner serve`.

    Only $SERVING_DIR is filled in, and the two port numbers are swapped for
    free ones (8500/8501 may be taken on a shared machine).
    """
    from components.pusher import batching_parameters_text, models_config_text
    serving_dir = tmp_path / "serving"
    (serving_dir / "captioner").mkdir(parents=True)
    publish_version(model_store["image"], str(serving_dir / "captioner"), 1)
    (serving_dir / "models.config").write_text(models_config_text(str(serving_dir),
                                                                  ["captioner"]))
    (serving_dir / "batching_parameters.txt").write_text(batching_parameters_text(8, 1000))
    flags = docs_docker_flags()
    assert "--model_config_file=$SERVING_DIR/models.config" in flags and "--enable_batching" \
        in flags
    grpc_port, rest_port = _free_port(), _free_port()
    args = [f.replace("$SERVING_DIR", str(serving_dir)).replace("=8500", f"={grpc_port}")
            .replace("=8501", f"={rest_port}") for f in flags]
    process = subprocess.Popen([sys.executable, "-m", "serving.server.model_server", *args], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        found = {}

        def read_banner():
            for line in process.stdout:
                if line.startswith("serving: "):
                    found["banner"] = line
                    return

        reader = threading.Thread(target=read_banner, daemon=True)
        reader.start()
        reader.join(120)
        assert "banner" in found, process.stderr.read() if process.poll() is not None else ""
        assert f"grpc=127.0.0.1:{grpc_port} rest=127.0.0.1:{rest_port}" in found["banner"]
        with CaptionClient(f"127.0.0.1:{grpc_port}") as client:
            assert client.caption([solid_image(RED)])[0]["caption"] == expected_caption(RED)
        status, body = rest_call(f"http://127.0.0.1:{rest_port}", "/v1/models/captioner")
        assert status == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        stop_process(process)
