"""EncoderTrainer: the small CNN learns caption words better than chance; mAP is right."""
import numpy as np
import pytest

from components import encoder_trainer
from components.contract import schema
from components.contract.artifacts import Artifact
from components.example_gen import stage as example_gen
from components.synthetic.shapes import generate
from pipeline.config import DataConfig, EncoderConfig, PipelineConfig
from pipeline.runner import StageContext


def _run_stage(tmp_path, config, examples):
    """Runs the stage into `tmp_path/encoder`; returns the folder and the Encoder result."""
    out = tmp_path / "encoder"
    out.mkdir()
    ctx = StageContext(stage="EncoderTrainer", config=config, inputs={"examples": examples},
                       outputs={"encoder": str(out)}, work_dir=str(tmp_path), root=str(tmp_path),
                       execution_id=1)
    return out, encoder_trainer.run(ctx)["encoder"]


def test_average_precision_hand_computed():
    # ranks: 0.9 (hit), 0.8 (miss), 0.7 (hit) -> (1/1 + 2/3) / 2
    ap = encoder_trainer.average_precision(np.array([0.9, 0.8, 0.7]), np.array([1, 0, 1]))
    assert ap == pytest.approx((1 + 2 / 3) / 2)
    assert np.isnan(encoder_trainer.average_precision(np.array([0.1, 0.2]), np.array([0, 0])))


@pytest.mark.slow
def test_trained_encoder_beats_chance_on_held_out_images(tmp_path):
    data = DataConfig(num_images=400, image_size=32, val_fraction=0.2, test_fraction=0.0, seed=2)
    examples = tmp_path / "examples"
    counts = example_gen.write_examples(generate(400, image_size=32, seed=2), str(examples), data)
    config = PipelineConfig(data=data, encoder=EncoderConfig(
        image_size=32, width=8, grid_size=4, max_epochs=6, patience=2, batch_size=32,
        learning_rate=3e-3))
    out, result = _run_stage(tmp_path, config, Artifact(type="Examples", uri=str(examples),
                                                        counts=counts))
    props = result["properties"]
    assert props["val_map"] > props["chance_map"] + 0.1, props
    assert props["grid_shape"] == [4, 4, 8 * 8 + 2]  # D = 8 x width + (x, y)
    assert (out / "encoder.keras").exists()
    assert len(props["history"]) <= 6


@pytest.mark.slow
def test_bfloat16_training_saves_a_float32_encoder_as_good_as_float32(tmp_path):
    import keras
    data = DataConfig(num_images=400, image_size=32, val_fraction=0.2, test_fraction=0.0, seed=2)
    examples = tmp_path / "examples"
    counts = example_gen.write_examples(generate(400, image_size=32, seed=2), str(examples), data)
    artifact = Artifact(type="Examples", uri=str(examples), counts=counts)
    results = {}
    for policy in ("float32", "mixed_bfloat16"):
        config = PipelineConfig(data=data, encoder=EncoderConfig(
            image_size=32, width=8, grid_size=4, max_epochs=4, patience=4, batch_size=32,
            learning_rate=3e-3, mixed_precision=policy))
        (tmp_path / policy).mkdir()
        out, result = _run_stage(tmp_path / policy, config, artifact)
        results[policy] = result["properties"]
        encoder = keras.saving.load_model(out / "encoder.keras")
        assert {layer.dtype_policy.name for layer in encoder.layers} == {"float32"}
        assert keras.mixed_precision.global_policy().name == "float32"   # restored
    bf16 = results["mixed_bfloat16"]
    assert bf16["mixed_precision"] == "mixed_bfloat16" and bf16["mixed_precision_requested"] == (
        "mixed_bfloat16")
    # Same data, seed and epochs: the word classifier's held-out mAP agrees
    # within 0.05 (bfloat16 rounding changes the path, not the result).
    assert abs(bf16["val_map"] - results["float32"]["val_map"]) < 0.05, results


def test_keras_app_encoder_loads_the_configured_weights_file(tmp_path):
    # The offline paper path: `encoder.weights=/path/to/..._notop.h5`.
    import keras

    from tests.models.keras_app_weights import write_notop_weights
    weights = str(tmp_path / "vgg19_weights_tf_dim_ordering_tf_kernels_notop.h5")
    reference = write_notop_weights("VGG19", "block5_conv4", weights)
    config = PipelineConfig(encoder=EncoderConfig(
        kind="keras_app", application="VGG19", layer="block5_conv4", weights=weights,
        image_size=32, coord_channels=False))
    unused = Artifact(type="Examples", uri=str(tmp_path / "none"))   # keras_app reads no images
    out, result = _run_stage(tmp_path, config, unused)
    assert result["properties"]["grid_shape"] == [2, 2, 512]
    assert result["properties"]["kind"] == "keras_app" and not result["counts"]
    assert not (out / "words.txt").exists()       # nothing is trained for keras_app
    images = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    encoder = keras.saving.load_model(out / "encoder.keras")
    np.testing.assert_allclose(np.asarray(encoder(images)), reference(images),
                               rtol=1e-5, atol=1e-4)


def _examples(tmp_path, n: int = 60):
    data = DataConfig(num_images=n, image_size=32, val_fraction=0.2, test_fraction=0.0,
                      seed=3, num_shards=2)
    uri = tmp_path / "examples"
    counts = example_gen.write_examples(generate(n, image_size=32, seed=3), str(uri), data)
    return str(uri), counts


def _in_memory_train_dataset(files, index, image_size, batch_size):
    """The EncoderTrainer's earlier input pipeline: every train image decoded in memory."""
    import tensorflow as tf

    from models.image_ops import decode_and_resize
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "captions": tf.io.VarLenFeature(tf.string)}

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        image = tf.cast(tf.round(decode_and_resize(ex["image/encoded"], image_size)), tf.uint8)
        return image, tf.sparse.to_dense(ex["captions"])

    images, word_sets = [], []
    for image, caps in tf.data.TFRecordDataset(files).map(parse).as_numpy_iterator():
        images.append(image)
        word_sets.append(encoder_trainer.caption_words(caps))
    x = np.stack(images)
    y = encoder_trainer.word_targets(word_sets, index)
    return (tf.data.Dataset.from_tensor_slices((x, y))
            .shuffle(min(len(x), 10000), seed=0, reshuffle_each_iteration=True)
            .map(lambda a, b: (tf.cast(a, tf.float32), b)).batch(batch_size))


def test_streamed_batches_equal_the_in_memory_pipeline(tmp_path):
    """Streaming from disk feeds the CNN exactly the batches the in-memory arrays did."""
    uri, counts = _examples(tmp_path)
    files = schema.split_files(uri, "train")
    freq, n = encoder_trainer.word_frequencies(files)
    assert n == counts["train"]
    index = {w: i for i, w in enumerate(sorted(w for w, c in freq.items() if c >= 2))}
    assert "red" in index or "blue" in index
    assert not set(index) & encoder_trainer.STOPWORDS
    streamed = encoder_trainer.image_word_dataset(
        files, index, 32, shuffle_buffer=min(n, 10000), seed=0).batch(8)
    reference = _in_memory_train_dataset(files, index, 32, 8)
    for _ in range(2):  # two epochs: the per-epoch reshuffle matches too
        pairs = list(zip(streamed.as_numpy_iterator(), reference.as_numpy_iterator(),
                         strict=True))
        assert len(pairs) == -(-n // 8)
        for (xs, ys), (xr, yr) in pairs:
            np.testing.assert_array_equal(xs, xr)
            np.testing.assert_array_equal(ys, yr)
            assert ys.sum() > 0


def test_trains_from_a_stream_with_the_val_images_capped(tmp_path):
    uri, counts = _examples(tmp_path)
    cfg = EncoderConfig(image_size=32, width=4, grid_size=4, max_epochs=1, batch_size=16,
                        shuffle_buffer=8, val_images=5)
    backbone, props, run_counts, words = encoder_trainer.train_from_examples(
        uri, cfg, log=lambda line: None)
    assert run_counts == {"encoder_train_images": counts["train"], "encoder_val_images": 5,
                          "encoder_words": len(words)}
    assert props["words"] == words and props["epochs"] == 1
    assert 0.0 <= props["val_map"] <= 1.0 and 0.0 < props["chance_map"] <= 1.0
    assert tuple(backbone.output_shape[1:3]) == (4, 4)


def _scalars(logs_dir) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] of the scalar summaries under `logs_dir`."""
    import glob
    import os

    import tensorflow as tf
    from tensorflow.python.summary.summary_iterator import summary_iterator
    values: dict = {}
    for path in sorted(glob.glob(os.path.join(str(logs_dir), "**", "events.out.tfevents.*"),
                                 recursive=True)):
        for event in summary_iterator(path):
            for v in event.summary.value:
                values.setdefault(v.tag, []).append((event.step, float(tf.make_ndarray(v.tensor))))
    return values


def test_stage_writes_per_epoch_scalars_to_its_work_folder_and_the_encoder(tmp_path):
    uri, counts = _examples(tmp_path)
    config = PipelineConfig(encoder=EncoderConfig(
        image_size=32, width=4, grid_size=4, max_epochs=2, patience=5, batch_size=16,
        shuffle_buffer=8, val_images=5, learning_rate=3e-3))
    artifact = Artifact(type="Examples", uri=uri, counts=counts)
    # A killed earlier attempt's curves: training never resumes, so they go.
    stale = tmp_path / "logs" / "events.out.tfevents.0.stale"
    stale.parent.mkdir()
    stale.write_bytes(b"")
    out, result = _run_stage(tmp_path, config, artifact)
    assert not stale.exists()
    epochs = result["properties"]["epochs"]
    assert epochs == 2
    work = _scalars(tmp_path / "logs")
    for tag in ("encoder/loss", "encoder/val_map", "encoder/best_val_map",
                "encoder/learning_rate", "encoder/epoch_seconds"):
        assert [step for step, _ in work[tag]] == [1, 2], tag
    history = result["properties"]["history"]
    assert [v for _, v in work["encoder/loss"]] == pytest.approx([h["loss"] for h in history])
    assert [v for _, v in work["encoder/val_map"]] == pytest.approx(
        [h["val_map"] for h in history])
    assert work["encoder/learning_rate"][0][1] == pytest.approx(3e-3)
    assert work["encoder/best_val_map"][-1][1] == pytest.approx(result["properties"]["val_map"])
    # The Encoder artifact carries the same curves.
    assert _scalars(out / "logs") == work


@pytest.mark.slow
def test_an_encoder_still_learning_past_epoch_4_trains_on_until_val_map_levels_off(
        tmp_path, capfd):
    """1,200 shapes at 32 px, a narrow CNN: val mAP still rises well after epoch 4.

    Under the demo's stop rule the stage trains on until val mAP levels off
    (epoch 15 on a 2-core AMD EPYC, val mAP 0.51 at epoch 4 and 0.78 at its
    best); bounded at 4 epochs, it stops there and says val mAP was still rising.
    """
    from pipeline.configs import demo
    stop = demo.get_config().encoder
    data = DataConfig(num_images=1200, image_size=32, val_fraction=0.2, test_fraction=0.0,
                      seed=2)
    examples = tmp_path / "examples"
    counts = example_gen.write_examples(generate(1200, image_size=32, seed=2), str(examples),
                                        data)
    artifact = Artifact(type="Examples", uri=str(examples), counts=counts)
    runs = {}
    for max_epochs in (stop.max_epochs, 4):
        config = PipelineConfig(data=data, encoder=EncoderConfig(
            image_size=32, width=8, grid_size=4, batch_size=32, learning_rate=2e-3,
            mixed_precision="float32", max_epochs=max_epochs, patience=stop.patience,
            min_delta=stop.min_delta))
        (tmp_path / str(max_epochs)).mkdir()
        _, result = _run_stage(tmp_path / str(max_epochs), config, artifact)
        runs[max_epochs] = (result["properties"], capfd.readouterr().err)
    props, log = runs[stop.max_epochs]
    history = [h["val_map"] for h in props["history"]]
    assert props["stopped"] == "patience" and not props["still_rising"], history
    assert 4 < props["epochs"] < stop.max_epochs
    # The best epoch's weights: no later epoch beat it by more than min_delta.
    assert max(history) - stop.min_delta <= props["val_map"] <= max(history), history
    assert props["val_map"] > history[3] + 0.1, history
    assert "val mAP stopped improving" in log
    capped, log = runs[4]
    assert capped["stopped"] == "max_epochs" and capped["still_rising"] and capped["epochs"] == 4
    assert capped["val_map"] < props["val_map"] - 0.1
    assert "stopped at encoder.max_epochs=4 while val mAP was still rising (+" in log
    assert "raise encoder.max_epochs" in log
