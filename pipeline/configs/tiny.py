"""Tiny: the test config, seconds per stage.

    captioner run --config tiny --root /tmp/tiny

About 1 minute for the whole pipeline on 2 CPU cores; the captions are poor
(the model sees 80 images for a few steps) but every stage runs, the model is
blessed (thresholds at 0) and pushed, so serving can be exercised.

Tuned on: nothing; its counts are a time budget for the tests (80 synthetic
32x32 images). `encoder.max_epochs` 2 and `train.epochs` 2 cut training
short on purpose (the Trainer's log says it stopped at train.epochs while
val_loss was still improving). Not a starting point for your own data: copy
`demo` (pipeline/configs/demo.py; docs/configuration.md, "Your own data").
"""
from pipeline.config import (
    DataConfig,
    EncoderConfig,
    EvalConfig,
    ModelConfig,
    PipelineConfig,
    PreprocessConfig,
    PushConfig,
    TrainConfig,
)


def get_config() -> PipelineConfig:
    return PipelineConfig(
        name="tiny",
        data=DataConfig(source="synthetic", num_images=80, image_size=32, seed=1,
                        val_fraction=0.15, test_fraction=0.15, num_shards=2),
        encoder=EncoderConfig(kind="small_cnn", image_size=32, width=8, grid_size=4,
                              batch_size=16, max_epochs=2, patience=1),
        preprocess=PreprocessConfig(max_batch_size=16, min_batch_size=1),
        model=ModelConfig(embedding_dim=16, hidden_dim=32, attention_dim=16, dropout=0.0),
        train=TrainConfig(batch_size=16, epochs=2, checkpoint_every=5, val_examples=16,
                          log_every=5, shuffle_buffer=64),
        eval=EvalConfig(beam_size=2, max_length=12, num_figures=2,
                        thresholds={"Bleu_4": 0.0}),
        push=PushConfig(num_warmup_requests=1),
    )
