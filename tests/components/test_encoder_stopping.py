"""EncoderTrainer stopping: val mAP's patience decides, `encoder.max_epochs` is only a bound.

The stop rule alone (`StopRule`), then the stage's epoch loop on a scripted
model whose val mAP keeps rising past epoch 4, under the `demo` config's
encoder settings: it trains on until val mAP levels off, keeps the best
epoch's weights, and says so when the bound ends training instead.
"""
import numpy as np
import pytest

from components import encoder_trainer
from components.encoder_trainer import StopRule
from pipeline.configs import demo


def _run(rule: StopRule, values) -> list[tuple[bool, str]]:
    """`rule.update` over `values` (epochs 1, 2, ...) until it returns a stop line."""
    out = []
    for epoch, value in enumerate(values, start=1):
        out.append(rule.update(epoch, value))
        if out[-1][1]:
            break
    return out


def test_improving_epochs_continue():
    rule = StopRule(patience=2, min_delta=0.01, max_epochs=30)
    steps = _run(rule, [0.5, 0.6, 0.7, 0.75])
    assert steps == [(True, "")] * 4
    assert rule.stopped == "" and rule.best == pytest.approx(0.75) and rule.best_epoch == 4


def test_a_plateau_of_patience_epochs_stops_and_names_the_best_epoch():
    rule = StopRule(patience=2, min_delta=0.01, max_epochs=30)
    # 0.805 and 0.79 are within min_delta of the best 0.8: no improvement.
    steps = _run(rule, [0.5, 0.8, 0.805, 0.79, 0.9])
    assert [improved for improved, _ in steps] == [True, True, False, False]
    assert rule.stopped == "patience" and not rule.still_rising
    assert rule.best == pytest.approx(0.8) and rule.best_epoch == 2
    assert steps[-1][1] == ("val mAP stopped improving: best 0.8000 at epoch 2, no gain above "
                            "encoder.min_delta=0.01 in the 2 epochs since")


def test_one_bad_epoch_inside_patience_does_not_stop():
    rule = StopRule(patience=2, min_delta=0.01, max_epochs=30)
    steps = _run(rule, [0.5, 0.6, 0.55, 0.7, 0.69, 0.8])
    assert [line for _, line in steps] == [""] * 6
    assert rule.bad == 0 and rule.best_epoch == 6


def test_reaching_the_bound_while_rising_says_so():
    rule = StopRule(patience=2, min_delta=0.005, max_epochs=4)
    steps = _run(rule, [0.56, 0.72, 0.83, 0.88, 0.95])
    assert len(steps) == 4   # the bound holds
    assert rule.stopped == "max_epochs" and rule.still_rising
    assert steps[-1] == (True, "stopped at encoder.max_epochs=4 while val mAP was still rising "
                               "(+0.0500 in the last epoch); raise encoder.max_epochs")


def test_reaching_the_bound_on_a_plateau_is_not_called_rising():
    rule = StopRule(patience=3, min_delta=0.005, max_epochs=4)
    steps = _run(rule, [0.6, 0.8, 0.801, 0.802])
    assert rule.stopped == "max_epochs" and not rule.still_rising
    assert steps[-1][1].startswith("stopped at encoder.max_epochs=4 before patience ran out: "
                                   "best val mAP 0.8000 at epoch 2, 2 of encoder.patience=3")


def test_a_single_epoch_bound_reports_its_value():
    rule = StopRule(patience=3, min_delta=0.001, max_epochs=1)
    assert _run(rule, [0.4]) == [(True, "stopped at encoder.max_epochs=1 while val mAP was "
                                        "still rising (0.4000 after its only epoch); raise "
                                        "encoder.max_epochs")]


# The stage's epoch loop on a scripted model.

VAL_IMAGES = 12


class _Fit:
    def __init__(self, loss):
        self.history = {"loss": [loss]}


class _ScriptedModel:
    """A word classifier whose held-out ranking improves on a script, one epoch per `fit`.

    One word, present in val image 0 only: its average precision is 1 / the
    rank `ranks[epoch - 1]` the model gives that image among the 12.
    """

    def __init__(self, ranks):
        self.ranks = list(ranks)
        self.epoch = 0

    def fit(self, train_ds, epochs, verbose, shuffle, callbacks):
        self.epoch += 1
        return _Fit(1.0 / self.epoch)

    def predict(self, val_images, verbose):
        rank = self.ranks[self.epoch - 1]
        scores = 1.0 - (np.arange(VAL_IMAGES) - 0.5) / VAL_IMAGES   # negatives, descending
        scores[0] = 1.0 - (rank - 0.5) / VAL_IMAGES                 # rank-1 negatives above it
        return scores[:, None]


class _Backbone:
    """Weights that name the epoch they come from."""

    def __init__(self, model):
        self.model = model

    def get_weights(self):
        return [np.array([self.model.epoch])]


def _fit(config, ranks):
    val_y = np.zeros((VAL_IMAGES, 1), np.float32)
    val_y[0, 0] = 1.0
    model = _ScriptedModel(ranks)
    lines = []
    best, weights, epochs, history, rule = encoder_trainer._fit_epochs(
        model, _Backbone(model), train_ds=None, val=(None, val_y), config=config,
        log=lines.append, steps_per_epoch=None, writer=None)
    return best, weights, epochs, history, rule, lines


def test_the_demo_encoder_trains_on_while_val_map_rises_past_epoch_4():
    config = demo.get_config().encoder
    # val mAP 1/12, 1/10, ..., rising for 8 epochs (past the 4 a fixed count
    # tuned on the shapes would stop at), then level.
    ranks = [12, 10, 8, 6, 5, 4, 2, 1] + [1] * 30
    best, weights, epochs, history, rule, lines = _fit(config, ranks)
    assert [h["val_map"] for h in history[:8]] == pytest.approx([1 / r for r in ranks[:8]])
    assert rule.stopped == "patience" and epochs == 8 + config.patience
    assert epochs < config.max_epochs
    assert best == pytest.approx(1.0) and weights == [np.array([8])]  # the best epoch's
    assert lines[-1].startswith("val mAP stopped improving: best 1.0000 at epoch 8")
    assert not any("encoder.max_epochs" in line for line in lines)


def test_the_bound_ends_a_run_that_is_still_rising_and_the_log_says_so():
    config = demo.get_config().encoder
    ranks = list(range(12, 0, -1))
    bounded = type(config)(**{**config.__dict__, "max_epochs": 6})
    best, weights, epochs, history, rule, lines = _fit(bounded, ranks)
    assert epochs == 6 and rule.still_rising and weights == [np.array([6])]
    assert lines[-1] == ("stopped at encoder.max_epochs=6 while val mAP was still rising "
                         f"(+{1 / 7 - 1 / 8:.4f} in the last epoch); raise encoder.max_epochs")
