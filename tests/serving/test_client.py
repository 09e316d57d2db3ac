"""CaptionClient behaviour that needs no particular server: retries, errors, figures."""
from __future__ import annotations

import socket
import threading
import time

import grpc
import numpy as np
import pytest
from PIL import Image

from serving.attention_figure import save_attention_figure, upsample_attention
from serving.client import CaptionClient, CaptionError
from tests.serving.conftest import RED
from tests.serving.fixtures import expected_caption, solid_image


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_retries_unavailable_until_the_server_is_up(make_base, start_server):
    base = make_base({1: "image"})
    port = free_port()
    started = threading.Event()

    def late_start():
        time.sleep(0.6)
        start_server(base, port=port, rest_port=None)
        started.set()

    thread = threading.Thread(target=late_start)
    thread.start()
    try:
        with CaptionClient(f"127.0.0.1:{port}", max_attempts=10, initial_backoff=0.1,
                           max_backoff=0.5) as client:
            assert client.caption([solid_image(RED)])[0]["caption"] == expected_caption(RED)
    finally:
        thread.join()
    assert started.is_set()


def test_gives_up_after_bounded_retries_with_a_clear_error():
    port = free_port()
    started = time.monotonic()
    with CaptionClient(f"127.0.0.1:{port}", max_attempts=3, initial_backoff=0.05,
                       max_backoff=0.1, timeout=2) as client:
        with pytest.raises(CaptionError) as info:
            client.caption([solid_image(RED)])
    assert time.monotonic() - started < 10
    error = info.value
    assert error.code == grpc.StatusCode.UNAVAILABLE
    assert f"127.0.0.1:{port}" in str(error) and "Predict" in str(error)
    assert "model server listening" in str(error)


def test_version_argument_number_or_label():
    assert CaptionClient("x:1", version=3).model_spec().version.value == 3
    assert CaptionClient("x:1", version="3").model_spec().version.value == 3
    spec = CaptionClient("x:1", version="stable").model_spec()
    assert spec.version_label == "stable" and not spec.HasField("version")


def test_attention_figure(tmp_path):
    image = solid_image(RED, size=40)
    attention = np.random.RandomState(0).rand(3, 4, 4).astype(np.float32)
    path = save_attention_figure(image, ["a", "red", "square"], attention,
                                 str(tmp_path / "fig.png"), columns=2)
    figure = Image.open(path)
    assert figure.format == "PNG"
    assert figure.size[1] > figure.size[0] * 0.9  # 2 columns x 2 rows
    up = upsample_attention(attention[0], 40, 40)
    assert up.shape == (40, 40) and up.min() >= 0.0 and up.max() == pytest.approx(1.0)
