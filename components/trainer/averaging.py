"""A moving average of the weights: the momentum for a time span, and the averaged weights in the model.

A phase whose updates are noisy (self-critical training samples its own
captions) can keep an exponential moving average of its weights in the
optimizer (Keras's `use_ema`). The loop then validates and saves the average
instead of the weights the last step left: `averaged_weights` swaps the
average into the model for a block and the trained weights back after it,
so training itself runs on unchanged.
"""
from __future__ import annotations

import contextlib


def momentum(average_epochs: float, steps_per_epoch: int) -> float:
    """The EMA momentum whose time constant is `average_epochs` epochs (0: no average).

    A momentum `m` weighs the weights of `k` steps ago by `m**k`, a time
    constant of `1 / (1 - m)` steps; stating the span in epochs keeps its
    meaning when the data, and with it the steps per epoch, change.

    Args:
      average_epochs: the time constant in epochs (> 0), or 0.
      steps_per_epoch: the phase's steps per epoch (>= 1).
    Returns:
      The momentum in [0, 1), 0.0 when `average_epochs` is 0.
    """
    if average_epochs <= 0:
        return 0.0
    return 1.0 - 1.0 / max(1.0, average_epochs * max(1, steps_per_epoch))


def _inner(optimizer):
    """The optimizer a loss-scale wrapper holds, or `optimizer` itself."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def averages(optimizer) -> bool:
    """Whether `optimizer` (or the optimizer a loss-scale wrapper holds) keeps a weight EMA."""
    return bool(getattr(_inner(optimizer), "use_ema", False))


@contextlib.contextmanager
def averaged_weights(model, optimizer):
    """The optimizer's moving average in `model`'s trainable weights for the block, then the trained ones.

    Does nothing when the optimizer keeps no average. Call it where every
    worker runs (the weights are mirrored); the average exists after the
    first update step.

    Args:
      model: the model the optimizer trains.
      optimizer: its optimizer (built, with `use_ema=True` to have an effect).
    Yields:
      None.
    """
    if not averages(optimizer):
        yield
        return
    inner = _inner(optimizer)
    variables = list(model.trainable_variables)
    trained = [v.numpy() for v in variables]
    # Keras's one public way to the average, `finalize_variable_values`,
    # overwrites the weights for good; these private names are pinned by
    # tests/components/trainer/test_averaging.py.
    stored = inner._model_variables_moving_average
    for variable in variables:
        variable.assign(stored[inner._get_variable_index(variable)])
    try:
        yield
    finally:
        for variable, value in zip(variables, trained, strict=True):
            variable.assign(value)
