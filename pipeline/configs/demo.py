"""Demo: the default config, the built-in synthetic shapes data, fully offline.

    captioner run --config demo --root demo_output/pipeline     (or: make demo)

For: a whole run of every stage on one CPU host, serving included.
Cost: minutes on 2 CPU cores; the README's table gives the duration per
host kind (bfloat16 where the CPU has it, float32 elsewhere).
Result (test split, 416 images, beam 3; float32, `train.seed` 0, 1, 2): soft
attention Bleu_4 0.97, CIDEr 6.96-7.01, attribute_accuracy 0.94-0.95,
relation_accuracy 0.91-0.93, grounding 0.99 (docs/PERFORMANCE.md, "Quality").

Tuned on: the built-in synthetic shapes (8,000 64x64 images of 1-3
coloured shapes, a vocabulary of 39 tokens, captions of 4-21 words). The
encoder stops when its val mAP levels off, on any data; the Trainer's 30
epochs are its cosine schedule's length, with patience on val_loss. What was
chosen for the shapes and what to check on your own data
(docs/configuration.md, "Your own data"):

- encoder.max_epochs 30 is a bound; if the log says it stopped there "while
  val mAP was still rising", raise it.
- encoder.patience 2 / min_delta 0.005: stops when val mAP gains less than
  0.005 over two epochs (epoch 6 on the shapes, which level off at 0.88
  after epoch 4); raise patience if your val mAP is noisy.
- train.epochs 30 with a cosine schedule: also the schedule's length; if the
  best epoch is the last, raise it.
- encoder.image_size 64: enough for the shapes; scans, handwriting and
  photos usually need more.
- preprocess.vocab_min_count 1: keeps every word; 3-5 on real captions.
- eval.max_length 24, eval.thresholds Bleu_4 0.5 / CIDEr 3.0: the shapes'
  caption length and quality; set your own after a first run.
- model.doubly_stochastic_lambda 0.01: for captions far shorter than the 64
  regions (below).
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
        name="demo",
        data=DataConfig(source="synthetic", num_images=8000, image_size=64, seed=0,
                        val_fraction=0.05, test_fraction=0.05, num_shards=4),
        # Stops when val mAP gains less than 0.005 over 2 epochs (a steady rise of
        # more than 0.0025 per epoch goes on) and keeps the best epoch's weights:
        # on the shapes val mAP is 0.876 at epoch 4 and within 0.005 of it for
        # the next ten, so it stops at epoch 6. max_epochs is only a bound.
        encoder=EncoderConfig(kind="small_cnn", image_size=64, width=16, grid_size=8,
                              batch_size=64, max_epochs=30, patience=2, min_delta=0.005),
        preprocess=PreprocessConfig(max_batch_size=128, min_batch_size=16, num_shards=4),
        # lambda 0.01: with T ~ 20 words and L = 64 regions the doubly stochastic
        # penalty's minimum, (L - T)^2 / L ~ 30, would dominate the loss at the
        # paper's 1 and spread attention over the empty background.
        # Hard attention (`--set model.attention=hard`; ignored by soft): 6 epochs
        # of expected alpha first, so attention focuses before sampling starts;
        # each sample credited with its own word's log-likelihood against what
        # the expected context would have scored for that word.
        # LSTM 256 wide: at 128 the step is 1.2-1.5x faster in float32, but
        # relation_accuracy fell to 0.83-0.91 over four runs (docs/PERFORMANCE.md).
        model=ModelConfig(attention="soft", embedding_dim=64, hidden_dim=256,
                          attention_dim=128, dropout=0.1, doubly_stochastic_lambda=0.01,
                          expected_alpha_warmup_epochs=6, reinforce_credit="token",
                          reinforce_baseline="expected", entropy_lambda=0.0),
        # Learning rate 4e-3 for 30 epochs keeps relation and attribute accuracy
        # >= 0.88 and grounding >= 0.90 in every seed measured, float32 and
        # bfloat16 (24 epochs: relation 0.86-0.94; docs/PERFORMANCE.md, "What the
        # demo config's settings buy"). SCST (`--set train.objective=scst`, docs/scst.md): 5e-4,
        # 12 epochs, keeping the best by val CIDEr, since hard attention gains
        # more slowly than soft. No `bucket_by_length`: it made the Trainer
        # 1.2-1.3x faster, but relation_accuracy fell to 0.885-0.931 over six
        # runs (seeds 0-2, float32 and bfloat16), against 0.927-0.962 without
        # (docs/PERFORMANCE.md, "What the demo config's settings buy").
        train=TrainConfig(batch_size=64, epochs=30, learning_rate=4e-3, lr_schedule="cosine",
                          checkpoint_every=200, val_examples=256, patience=3,
                          scst_learning_rate=5e-4, scst_epochs=12),
        eval=EvalConfig(beam_size=3, max_length=24, num_figures=8,
                        thresholds={"Bleu_4": 0.5, "CIDEr": 3.0}),
    )
