"""`captioner serve` (serving.server.model_server.main) and `captioner caption` (serving.client.caption_client.caption_main)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading

import pytest
from PIL import Image

from serving.client.caption_client import CaptionClient, caption_main
from serving.server.model_server import _batching_from_args, build_parser
from tests.serving.conftest import BLUE, RED
from tests.serving.fixtures import expected_caption, solid_image, stop_process

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_serve_main_prints_ports_serves_and_stops_on_sigterm(make_base):
    base = make_base({1: "image"})
    process = subprocess.Popen(
        [sys.executable, "-m", "serving.server.model_server", "--model-base-path", base, "--port", "0",
         "--rest-port", "0", "--poll-seconds", "0.5", "--enable-batching",
         "--max-batch-size", "4", "--batch-timeout-micros", "1000"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        found = {}

        def read_banner():
            for line in process.stdout:
                match = re.match(r"serving: grpc=(\S+):(\d+) rest=(\S+):(\d+)", line)
                if match:
                    found["grpc"] = f"{match.group(1)}:{match.group(2)}"
                    return

        reader = threading.Thread(target=read_banner, daemon=True)
        reader.start()
        reader.join(120)
        assert "grpc" in found, "no banner line"
        assert found["grpc"].startswith("127.0.0.1:")
        with CaptionClient(found["grpc"]) as client:
            assert client.caption([solid_image(RED)])[0]["caption"] == expected_caption(RED)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        stop_process(process)


def test_serve_arguments():
    parser = build_parser()
    args = parser.parse_args(["--model-base-path", "/m", "--batching-parameters-file", os.devnull,
                              "--max-batch-size", "8", "--max-enqueued-batches", "3"])
    params = _batching_from_args(args)
    assert params.max_batch_size == 8 and params.max_enqueued_batches == 3
    assert _batching_from_args(parser.parse_args(
        ["--model-base-path", "/m", "--enable-batching"])).max_enqueued_batches == 10
    assert _batching_from_args(parser.parse_args(["--model-base-path", "/m"])) is None
    from serving.server.model_server import main
    with pytest.raises(SystemExit):
        main(["--port", "0"])  # neither a base path nor a config file
    with pytest.raises(SystemExit):
        main(["--model-base-path", "/m", "--ssl-cert", "c.pem"])  # cert without key


def test_caption_cli_text_json_and_attention_figures(make_base, start_server, tmp_path, capsys):
    server = start_server(make_base({1: "image"}))
    red, blue, bad = tmp_path / "red.png", tmp_path / "blue.jpg", tmp_path / "bad.png"
    red.write_bytes(solid_image(RED, size=32))
    blue.write_bytes(solid_image(BLUE, size=24, fmt="JPEG"))
    bad.write_bytes(b"definitely not an image")
    figures = tmp_path / "figures"

    assert caption_main([str(red), "--server", server.grpc_address]) == 0
    out = capsys.readouterr().out.strip().split("\t")
    assert out[0] == str(red) and out[1] == expected_caption(RED) and out[2].startswith("score=")

    code = caption_main([str(red), str(bad), str(blue), "--server", server.grpc_address,
                         "--json", "--attention-out", str(figures), "--version", "1"])
    captured = capsys.readouterr()
    assert code == 1  # one image failed; the others were still captioned
    assert "bad.png: INVALID_ARGUMENT" in captured.err
    lines = [json.loads(line) for line in captured.out.splitlines()]
    # Every image has a line, in order; the refused one carries its error.
    assert [(l["image"], l.get("caption")) for l in lines] == [
        (str(red), expected_caption(RED)), (str(bad), None), (str(blue), expected_caption(BLUE))]
    assert lines[1]["error"].startswith("INVALID_ARGUMENT: ")
    lines = [lines[0], lines[2]]
    assert lines[0]["version"] == 1 and lines[0]["tokens"] == [4, 5, 7, 10, 2]
    for line in lines:
        figure = Image.open(line["attention_figure"])
        assert figure.format == "PNG" and figure.size[0] > figure.size[1] > 0
    assert sorted(os.listdir(figures)) == ["blue.attention.png", "red.attention.png"]


def test_caption_cli_reports_unreachable_server(tmp_path, capsys):
    image = tmp_path / "red.png"
    image.write_bytes(solid_image(RED))
    assert caption_main([str(image), "--server", "127.0.0.1:1", "--timeout", "2"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err
