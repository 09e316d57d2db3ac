"""COCO with the paper's settings (Xu et al. 2015, Table 1): VGG19 block5_conv4 14x14x512.

    captioner run --config coco_paper --root runs/coco \
        --set data.captions_json=/data/coco/dataset_coco.json \
        --set data.images_dir=/data/coco

Needs the Karpathy split file, the COCO 2014 images and ImageNet weights
(downloaded by keras.applications on first use). The paper reports BLEU-4
24.3 (soft) / 25.0 (hard), METEOR 23.90 / 23.04. Add
`--set data.instances_json=/data/coco/annotations/instances_val2014.json`
for attention grounding on the test split (its 5,000 images are all from
val2014; docs/metrics.md, "Grounding on COCO images").

Cost per image (docs/SCALING.md; 2 CPU cores, 2026-11-26): Preprocess
0.669 s (VGG19 at 224 px, measured), Trainer ~46 ms per train image and
epoch (2.3 GFLOP, estimated, at a measured ~50 GFLOP/s), Evaluator <= 0.15 s per
test image, ExampleGen ~12 ms; memory flat in the number of images
(measured at 14x14x512 grids to 16,000 images: every stage < 1.5 GB but
the Evaluator, ~2.1 GB with METEOR's Java, and the Pusher, ~1.6 GB with its
load check; VGG19's activations add ~2 GB to Preprocess at batch 64,
estimated). For COCO's 123,287 images
(113,287 / 5,000 / 5,000): Preprocess 22.9 h, Trainer 1.45 h per epoch
(29 h for 20), Evaluator ~12 min; 24.8 GB of annotations
(201,405 B per image). On one GPU (estimated): Preprocess ~3 min at 8
decode cores, Trainer 1-2 min per epoch; or run Preprocess on Dataflow
(20 x n1-standard-8: ~35 min).

Tuned on: COCO 2014 with the Karpathy split (the paper's settings; not
reproduced here). The encoder is ImageNet VGG19, not trained; the Trainer
stops on val BLEU-4 (`train.patience` 3) within `train.epochs` 20 (constant
learning rate: a bound). For other data: `preprocess.vocab_min_count` 5 and
`preprocess.max_caption_length` 30 are COCO's, so check them against your
captions, and set `eval.thresholds` after a first run (docs/configuration.md,
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
        name="coco_paper",
        data=DataConfig(source="karpathy", num_shards=64),
        encoder=EncoderConfig(kind="keras_app", application="VGG19", layer="block5_conv4",
                              weights="imagenet", image_size=224, coord_channels=False,
                              train=False),
        preprocess=PreprocessConfig(max_batch_size=64, vocab_min_count=5,
                                    vocab_max_size=10000, max_caption_length=30),
        model=ModelConfig(attention="soft", embedding_dim=512, hidden_dim=1800,
                          attention_dim=512, dropout=0.5, doubly_stochastic_lambda=1.0),
        train=TrainConfig(batch_size=64, epochs=20, optimizer="adam", learning_rate=1e-4,
                          early_stopping_metric="bleu4", patience=3, checkpoint_every=2000,
                          val_examples=1000),
        # 256 images per serving_default call: VGG19 runs batched over 5,000 test
        # images. A caption can then differ from a single-image request's in the
        # last float bits; eval.batch_size=1 scores exactly as single requests
        # are served, at a higher cost.
        eval=EvalConfig(beam_size=3, max_length=30, batch_size=256,
                        thresholds={"Bleu_4": 0.2}),
    )
