"""The model, learning-rate schedule and optimizer the Trainer builds from its config."""
from __future__ import annotations

import dataclasses


def build_model(model_config, vocab_size: int, grid_shape, seed: int | None = None,
                steps_per_epoch: int = 0):
    """A built `ShowAttendTell` from the `ModelConfig` fields (in the current dtype policy).

    Args:
      model_config: `components.contract.config.ModelConfig`.
      vocab_size: tokens in the vocabulary, reserved ones included.
      grid_shape: `[H, W, D]` of the annotations.
      seed: seeds the model's sampler, dropout and coin flips.
      steps_per_epoch: turns `expected_alpha_warmup_epochs` into the model's
        minibatch count, so the warmup keeps its meaning at any data size.
    Returns:
      The built model.
    """
    from models.decoder_options import DecoderOptions
    from models.show_attend_tell import ShowAttendTell
    h, w, d = (int(v) for v in grid_shape)
    fields = dataclasses.asdict(model_config)
    warmup_epochs = fields.pop("expected_alpha_warmup_epochs")
    options = DecoderOptions(**fields, expected_alpha_warmup=round(warmup_epochs * steps_per_epoch),
                             grid_height=h, grid_width=w)
    model = ShowAttendTell(vocab_size, options, seed=seed)
    model.build((None, h * w, d))
    return model


def learning_rate_schedule(train_config, total_steps: int):
    """`train.learning_rate` constant or cosine-decayed to 0, after `warmup_steps` linear warmup.

    Args:
      train_config: `components.contract.config.TrainConfig`.
      total_steps: the steps the schedule spans.
    Returns:
      A float (constant, no warmup) or a Keras `CosineDecay` schedule.
    """
    import keras
    cfg = train_config
    if cfg.lr_schedule not in ("constant", "cosine"):
        raise ValueError(f"train.lr_schedule must be constant or cosine, got {cfg.lr_schedule!r}")
    if cfg.lr_schedule == "constant" and cfg.warmup_steps <= 0:
        return cfg.learning_rate
    warmup = max(0, cfg.warmup_steps)
    decay_steps = max(1, total_steps - warmup)
    # alpha = 1: the "decayed" rate stays at the peak, i.e. warmup then constant.
    alpha = 1.0 if cfg.lr_schedule == "constant" else 0.0
    if warmup:
        return keras.optimizers.schedules.CosineDecay(
            0.0, decay_steps, alpha=alpha, warmup_target=cfg.learning_rate,
            warmup_steps=warmup)
    return keras.optimizers.schedules.CosineDecay(cfg.learning_rate, decay_steps, alpha=alpha)


def make_optimizer(train_config, total_steps: int):
    """Adam (`FusedAdam`) or RMSProp (paper 4.3) on the schedule; loss scaling for mixed_float16.

    Args:
      train_config: `components.contract.config.TrainConfig`.
      total_steps: the steps of the whole run (for the schedule).
    Returns:
      A Keras optimizer, wrapped in a `LossScaleOptimizer` under mixed_float16.
    """
    import keras

    from components.trainer.fused_adam import FusedAdam
    lr = learning_rate_schedule(train_config, total_steps)
    if train_config.optimizer == "adam":
        optimizer = FusedAdam(lr)
    elif train_config.optimizer == "rmsprop":
        optimizer = keras.optimizers.RMSprop(lr)
    else:
        raise ValueError(f"train.optimizer must be adam or rmsprop, got {train_config.optimizer!r}")
    if train_config.mixed_precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def start_file(path: str) -> str:
    """The `.keras` file to start from: the file itself, or a Model folder's served file."""
    import os

    from components.contract import schema
    return schema.model_file(path) if os.path.isdir(path) else path


def load_weights(model, path: str) -> str:
    """Copies the weights of a saved captioner into `model`; returns the file read.

    Args:
      model: the built `ShowAttendTell` to fill.
      path: a Model folder (its `best.keras`, else `model.keras`) or a `.keras` file.
    Returns:
      The file whose weights were loaded.
    Raises:
      ValueError: the saved model has other weights (another vocabulary,
        grid or model config).
    """
    import keras

    import models.show_attend_tell  # noqa: F401  (registers the layers)
    source = start_file(path)
    saved = keras.saving.load_model(source, compile=False)
    mine, theirs = model.weights, saved.weights
    if len(mine) != len(theirs):
        raise ValueError(f"train.init_model={path!r}: the saved model has {len(theirs)} weights, "
                         f"this config's {len(mine)} (another attention or model config?)")
    for a, b in zip(mine, theirs, strict=True):
        if tuple(a.shape) != tuple(b.shape):
            raise ValueError(f"train.init_model={path!r}: weight {a.path} is {tuple(b.shape)} "
                             f"there and {tuple(a.shape)} here: the model must be trained on the "
                             "same vocabulary and grid with the same model config")
    model.set_weights(saved.get_weights())
    return source
