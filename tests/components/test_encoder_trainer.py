"""EncoderTrainer: the small CNN learns caption words better than chance; mAP is right."""
import numpy as np
import pytest

from components import encoder_trainer, example_gen
from components.sources.synthetic import generate
from pipeline.config import DataConfig, EncoderConfig, PipelineConfig
from components.artifacts import Artifact
from pipeline.runner import StageContext


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
    out = tmp_path / "encoder"
    out.mkdir()
    ctx = StageContext(stage="EncoderTrainer", config=config,
                       inputs={"examples": Artifact(type="Examples", uri=str(examples),
                                                    counts=counts)},
                       outputs={"encoder": str(out)}, work_dir=str(tmp_path), root=str(tmp_path),
                       execution_id=1)
    props = encoder_trainer.run(ctx)["encoder"]["properties"]
    assert props["val_map"] > props["chance_map"] + 0.1, props
    assert props["grid_shape"] == [4, 4, 8 * 8 + 2]  # D = 8 x width + (x, y)
    assert (out / "encoder.keras").exists()
    assert len(props["history"]) <= 6
