"""The real export (serving/signature/export.py) served by ModelServer: contract, warmup, batching."""
from __future__ import annotations

import numpy as np
import pytest

from serving.client.caption_client import CaptionClient
from serving.versions.batching_parameters import BatchingParameters
from tests.serving.conftest import BLUE, GREEN, RED, run_concurrently
from tests.serving.fixtures import solid_image


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny exported captioner (random weights) as version 1."""
    import keras

    from serving.signature.export import Decoding, export_saved_model
    from tests.models.tiny import VOCAB, make_model

    inputs = keras.Input((16, 16, 3))
    grid = keras.layers.Conv2D(16, 3, strides=6, padding="same")(inputs)  # (3, 3, 16)
    encoder = keras.Model(inputs, grid)
    vocabulary = ["<pad>", "<start>", "<end>", "<unk>"] + [f"w{i}" for i in range(VOCAB - 4)]
    base = tmp_path_factory.mktemp("exported") / "captioner"
    export_saved_model(str(base / "1"), encoder, make_model(), vocabulary,
                       Decoding(beam_size=2, max_length=6))
    return str(base)


def test_exported_model_serves_with_and_without_batching(exported, start_server):
    plain = start_server(exported)
    batched = start_server(exported, batching=BatchingParameters(
        max_batch_size=8, batch_timeout_micros=50_000, num_batch_threads=1))
    assert plain.manager.get("captioner").warmup_requests == 2
    images = [solid_image(c, size=s, fmt=f) for c, s, f in
              ((RED, 16, "PNG"), (BLUE, 40, "JPEG"), (GREEN, 9, "GIF"), ((9, 99, 199), 23, "BMP"))]
    with CaptionClient(plain.grpc_address) as client:
        meta = client.metadata()["signatures"]
        assert meta["serving_default"]["inputs"] == {
            "image_bytes": {"dtype": "DT_STRING", "shape": [-1]}}
        assert set(meta["caption_annotations"]["outputs"]) == {
            "caption", "tokens", "lengths", "score", "attention"}
        together = client.caption(images)
    for result in together:
        assert result["attention"].shape[1:] == (3, 3)
        assert result["attention"].shape[0] == result["length"] == len(result["tokens"])
        np.testing.assert_allclose(result["attention"].sum(axis=(1, 2)), 1.0, rtol=1e-4)

    def one(address, image):
        with CaptionClient(address) as client:
            return client.caption([image])[0]

    alone = run_concurrently(lambda image: one(plain.grpc_address, image), images)
    merged = run_concurrently(lambda image: one(batched.grpc_address, image), images)
    for a, b, c in zip(together, alone, merged, strict=True):
        assert a["caption"] == b["caption"] == c["caption"]
        np.testing.assert_array_equal(b["tokens"], c["tokens"])
        assert b["score"] == pytest.approx(c["score"], abs=1e-4)
