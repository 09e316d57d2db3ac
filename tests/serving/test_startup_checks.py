"""`captioner serve` start-up: the model folder and the ports are checked before loading."""
import socket

import pytest

from serving.server import startup_checks
from serving.server.model_server import main


def test_missing_path_stops_the_start(tmp_path, capsys):
    with pytest.raises(startup_checks.StartupError, match="does not exist; expected a folder"):
        startup_checks.check_model_base_path(str(tmp_path / "nope"))
    assert main(["--model_base_path", str(tmp_path / "nope"), "--port", "0",
                 "--rest-port", "-1"]) == 1
    err = capsys.readouterr().err
    assert "does not exist" in err and "<base>/<integer version>/saved_model.pb" in err


def test_empty_folder_is_named(tmp_path):
    warning = startup_checks.check_model_base_path(str(tmp_path))
    assert "has no model versions (it is empty)" in warning
    assert "<base>/<integer version>/saved_model.pb" in warning


def test_folder_one_level_too_high_suggests_the_right_one(tmp_path):
    version = tmp_path / "captioner" / "3"
    version.mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"")
    warning = startup_checks.check_model_base_path(str(tmp_path))
    assert "it holds captioner" in warning
    assert f"did you mean --model_base_path {tmp_path / 'captioner'}" in warning
    assert startup_checks.check_model_base_path(str(tmp_path / "captioner")) is None


def test_a_file_is_not_a_model_folder(tmp_path):
    path = tmp_path / "saved_model.pb"
    path.write_bytes(b"")
    with pytest.raises(startup_checks.StartupError, match="is a file"):
        startup_checks.check_model_base_path(str(path))


def test_port_in_use_is_named_before_loading(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(startup_checks.StartupError, match=f"gRPC port {port} .*in use"):
            startup_checks.check_port_free("127.0.0.1", port, "gRPC", "--port")
        # An empty model folder: the port check comes first, nothing is loaded.
        assert main(["--model_base_path", str(tmp_path), "--port", str(port),
                     "--rest-port", "-1"]) == 1
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is in use" in err and "--port 0" in err
    startup_checks.check_port_free("127.0.0.1", 0, "gRPC", "--port")  # 0 is never taken


def test_serve_and_caption_help_show_defaults():
    from serving.client.caption_client import _parser
    from serving.server.flags import build_parser
    serve_help = " ".join(build_parser().format_help().split())
    for text in ("--port PORT gRPC port (0: any free) (default: 8500)",
                 "--max_num_load_retries MAX_LOAD_RETRIES load attempts after a version's "
                 "first failure (default: 5)"):
        assert text in serve_help
    caption_help = " ".join(_parser().format_help().split())
    assert "--timeout TIMEOUT (default: 30.0)" in caption_help
    assert "--model-name MODEL_NAME (default: captioner)" in caption_help
    assert "--json one JSON object per line --attention-out" in caption_help  # no default shown
