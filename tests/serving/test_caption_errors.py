"""`captioner caption` errors: JSON lines for failed images, a REST port named as such."""
import http.server
import json
import threading

import grpc
import pytest

from serving.client.caption_client import CaptionError, caption_main, is_http1_peer


@pytest.fixture
def http_port():
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_unreadable_image_has_a_json_error_line(tmp_path, capsys):
    missing = tmp_path / "missing.jpg"
    assert caption_main([str(missing), "--server", "127.0.0.1:1", "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"image": str(missing),
                                        "error": "cannot read: No such file or directory"}
    assert f"{missing}: cannot read" in captured.err


def test_http_port_is_named_and_not_retried(tmp_path, capsys, http_port):
    image = tmp_path / "x.png"
    image.write_bytes(b"not used")
    assert caption_main([str(image), "--server", f"127.0.0.1:{http_port}", "--json",
                         "--timeout", "20"]) == 1
    captured = capsys.readouterr()
    assert "that is an HTTP/1.1 port, such as the REST port" in captured.err
    line = json.loads(captured.out)
    assert line["image"] == str(image) and "REST port" in line["error"]


def test_http1_markers():
    assert is_http1_peer(grpc.StatusCode.UNAVAILABLE, "Failed parsing HTTP/2 (Expected SETTINGS")
    assert not is_http1_peer(grpc.StatusCode.UNAVAILABLE, "Connection refused")
    assert "REST port" in str(CaptionError(grpc.StatusCode.UNAVAILABLE,
                                           "Trying to connect an http1.x server", "Predict", "h:1"))
