"""CaptionClient behaviour that needs no particular server: retries, errors, figures."""
from __future__ import annotations

import socket
import threading

import grpc
import numpy as np
import pytest
from PIL import Image

from serving.client.attention_figure import save_attention_figure, upsample_attention
from serving.client.caption_client import CaptionClient, CaptionError, ClientOptions
from tests.serving.conftest import RED
from tests.serving.fixtures import expected_caption, solid_image


def test_retries_unavailable_until_the_server_is_up(make_base, start_server):
    """The server starts only once the client's first attempt was refused."""
    base = make_base({1: "image"})
    with socket.socket() as placeholder:  # holds the port until the server takes it
        placeholder.bind(("127.0.0.1", 0))
        placeholder.listen()
        placeholder.settimeout(60)
        port = placeholder.getsockname()[1]
        answers = []

        def call():
            with CaptionClient(f"127.0.0.1:{port}", options=ClientOptions(max_attempts=50, initial_backoff=0.05, max_backoff=0.5)) as client:
                answers.append(client.caption([solid_image(RED)]))

        thread = threading.Thread(target=call)
        thread.start()
        try:
            connection, _ = placeholder.accept()  # the first attempt: no gRPC server there
            connection.close()
        except BaseException:
            thread.join()
            raise
    try:
        start_server(base, port=port, rest_port=None)
    finally:
        thread.join()
    assert [a["caption"] for a in answers[0]] == [expected_caption(RED)]


def test_gives_up_after_bounded_retries_with_a_clear_error():
    with socket.socket() as bound:  # bound, not listening: every connection is refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        client = CaptionClient(f"127.0.0.1:{port}", timeout=2, options=ClientOptions(max_attempts=3, initial_backoff=0.05, max_backoff=0.1))
        stub, attempts = client._predictions, []

        class CountingStub:
            def Predict(self, request, **kwargs):
                attempts.append(1)
                return stub.Predict(request, **kwargs)

        client._predictions = CountingStub()
        with client:
            with pytest.raises(CaptionError) as info:
                client.caption([solid_image(RED)])
    assert len(attempts) == 3  # max_attempts, then the error
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
