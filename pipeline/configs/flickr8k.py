"""Flickr8k with the Karpathy split and an ImageNet VGG19 encoder.

    captioner run --config flickr8k --root runs/flickr8k \
        --set data.captions_json=/data/flickr8k/dataset_flickr8k.json \
        --set data.images_dir=/data/flickr8k/Flicker8k_Dataset

About a few hours on one GPU; the paper reports BLEU-4 19.5 (soft) / 21.3
(hard) on Flickr8k.
"""
from pipeline.config import (DataConfig, EncoderConfig, EvalConfig, ModelConfig,
                             PipelineConfig, PreprocessConfig, PushConfig, TrainConfig)


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
        push=PushConfig(beam_size=3, max_length=30),
    )
