"""EncoderTrainer: the small CNN learns caption words better than chance; mAP is right."""
import numpy as np
import pytest

from components import encoder_trainer, example_gen
from components.sources.synthetic import generate
from pipeline.config import DataConfig, EncoderConfig, PipelineConfig
from pipeline.artifacts import Artifact
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
