"""Flickr8k with the Karpathy split and an ImageNet VGG19 encoder.

    captioner run --config flickr8k --root runs/flickr8k \
        --set data.captions_json=/data/flickr8k/dataset_flickr8k.json \
        --set data.images_dir=/data/flickr8k/Flicker8k_Dataset

The paper reports BLEU-4 19.5 (soft) / 21.3 (hard) on Flickr8k.

Cost per image (docs/SCALING.md; 2 CPU cores, 2026-11-26): Preprocess
0.669 s (VGG19 at 224 px, measured), Trainer ~46 ms per train image and
epoch for an LSTM of 1800 (estimated from the measured FLOP rate; this
config's 1000-unit LSTM costs less), Evaluator <= 0.15 s per test image,
ExampleGen ~12 ms; memory flat in the number of images (every stage < 1.5
GB but the Evaluator, ~2.1 GB with METEOR's Java, and the Pusher, ~1.6 GB
with its load check; VGG19's activations add ~2 GB to Preprocess at batch
64, estimated). For 8,000
images (6,000 / 1,000 / 1,000): Preprocess 1.5 h, Trainer at most 4.6 min
per epoch (2.3 h for 30), Evaluator ~2.5 min; 1.6 GB of
annotations. On one GPU (estimated): minutes per stage.

Tuned on: Flickr8k (its numbers follow the paper's Flickr8k setup; none was
measured here). The encoder is ImageNet VGG19, not trained, so no encoder
stop applies; the Trainer stops on val BLEU-4 (`train.patience` 5) within
`train.epochs` 30 (constant learning rate: a bound). For a dataset of your
own photos: `data.captions_json` / `data.images_dir`,
`preprocess.vocab_min_count` for its vocabulary, `eval.max_length` for its
longest caption, `eval.thresholds` after a first run (docs/configuration.md,
"Your own data").
"""
from pipeline.config import (
    DataConfig,
    EncoderConfig,
    EvalConfig,
    ModelConfig,
    PipelineConfig,
    PreprocessConfig,
    TrainConfig,
)


def get_config() -> PipelineConfig:
    return PipelineConfig(
        name="flickr8k",
        data=DataConfig(source="karpathy", num_shards=8),
        encoder=EncoderConfig(kind="keras_app", application="VGG19", layer="block5_conv4",
                              weights="imagenet", image_size=224, coord_channels=False,
                              train=False),
        preprocess=PreprocessConfig(max_batch_size=64, vocab_min_count=3,
                                    vocab_max_size=10000),
        model=ModelConfig(attention="soft", embedding_dim=512, hidden_dim=1000,
                          attention_dim=512, dropout=0.5),
        train=TrainConfig(batch_size=64, epochs=30, learning_rate=1e-4,
                          early_stopping_metric="bleu4", patience=5, checkpoint_every=1000),
        eval=EvalConfig(beam_size=3, max_length=30, thresholds={"Bleu_4": 0.1}),
    )
