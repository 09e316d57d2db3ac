"""The checks a resolved config passes before any stage runs, and the near-miss suggestions."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from components.contract.config.sections import (
    ConfigError,
    PipelineConfig,
    default_change_thresholds,
)
from components.contract.config.values import (
    BOXED_SOURCES,
    CHANGE_BOUNDS,
    CHOICES,
    EVAL_METRICS,
    GROUNDING_METRICS,
    INSTANCE_METRICS,
    INSTANCE_SOURCES,
    MAX_OBJECTS,
    REPORTED_METRICS,
)


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """` (did you mean 'x'?)` for a near miss among `choices`, else ``."""
    import difflib

    def norm(text):  # BLEU4 ~ Bleu_4, Train.Epochs ~ train.epochs
        return str(text).lower().replace("_", "").replace("-", "")
    normalized = {norm(c): c for c in choices}
    close = difflib.get_close_matches(norm(word), list(normalized), n=1, cutoff=0.6)
    return f" (did you mean {normalized[close[0]]!r}?)" if close else ""


def _choice_error(key: str, value: str, choices: Sequence[str]) -> ConfigError:
    return ConfigError(f"{key}={value!r} is not one of: {', '.join(choices)}"
                       f"{did_you_mean(value, choices)}")


def _check_decoder_options(model) -> None:
    """The decoder's own check of the `model` section (`models.decoder_options`, no TensorFlow)."""
    from models.decoder_options import check_options
    try:
        check_options(dataclasses.asdict(model))
    except ValueError as e:
        raise ConfigError(f"model.{e}") from None


def _check_train(tcfg) -> None:
    """The `train` rules that span keys: the self-critical settings, patience, min_delta."""
    if tcfg.objective == "scst" and tcfg.scst_baseline == "mean" and tcfg.scst_samples < 2:
        raise ConfigError(f"train.scst_baseline=mean compares each sample with the image's other "
                          f"samples: it needs train.scst_samples >= 2, got {tcfg.scst_samples}")
    if tcfg.objective == "scst" and (tcfg.scst_samples < 1 or tcfg.scst_epochs < 1):
        raise ConfigError("train.objective=scst needs train.scst_samples >= 1 and "
                          "train.scst_epochs >= 1")
    if not tcfg.min_delta >= 0:
        raise ConfigError(f"train.min_delta={tcfg.min_delta}: the smallest gain that counts "
                          "must be >= 0 (relative for val_loss, absolute for bleu4 and cider)")
    weights = ("scst_attention_kl", "scst_xe_weight", "scst_box_attention", "scst_size_reward")
    bad = [f"train.{k}={getattr(tcfg, k)}" for k in weights
           if not getattr(tcfg, k) >= 0]  # NaN fails too
    if bad:
        raise ConfigError(f"{', '.join(bad)}: the self-critical weights are 0 (off) or a positive number")
    if tcfg.scst_box_mode == "keep" and not tcfg.scst_box_attention > 0:
        raise ConfigError("train.scst_box_mode=keep sets how the box term counts: it needs "
                          "train.scst_box_attention above 0 (e.g. 0.3)")
    if tcfg.patience < 0 or tcfg.scst_patience < 0:
        raise ConfigError(f"train.patience={tcfg.patience}, train.scst_patience="
                          f"{tcfg.scst_patience}: epochs without a gain before stopping are "
                          ">= 1, or 0 for no early stopping")
    if not 0 <= tcfg.scst_average_epochs < float("inf"):  # NaN fails too
        raise ConfigError(f"train.scst_average_epochs={tcfg.scst_average_epochs}: the time constant "
                          "of the weight average is 0 (off) or a positive number of epochs")


def validate(config: PipelineConfig) -> PipelineConfig:
    """Checks enumerated values, metric names and rules that span keys.

    Runs when a config is resolved, so that a mistake is reported before any
    stage runs. Paths are checked separately (`check_paths`), by the
    commands that read them.

    Args:
      config: a resolved config.
    Returns:
      `config`, unchanged.
    Raises:
      ConfigError: the first problem, with the valid choices.
    """
    for key, choices in CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(config, section), name)
        if value not in choices:
            raise _choice_error(key, value, choices)
    data, model, ev = config.data, config.model, config.eval
    if data.instances_json and data.source not in INSTANCE_SOURCES:
        raise ConfigError(f"data.instances_json is read for data.source="
                          f"{' or '.join(INSTANCE_SOURCES)} (COCO images), not {data.source!r}: "
                          "leave it empty")
    _check_thresholds(ev, data)
    _check_train(config.train)
    if model.reinforce_baseline == "expected" and model.reinforce_credit != "token":
        raise ConfigError("model.reinforce_baseline=expected is a per-word baseline: "
                          "it needs model.reinforce_credit=token")
    _check_decoder_options(model)
    most = MAX_OBJECTS.get(data.source, 3)
    if data.source in MAX_OBJECTS and not 1 <= data.min_objects <= data.max_objects <= most:
        raise ConfigError(f"data.min_objects={data.min_objects} and data.max_objects="
                          f"{data.max_objects}: need 1 <= min_objects <= max_objects <= {most} "
                          f"for data.source={data.source}")
    if data.val_fraction < 0 or data.test_fraction < 0 or \
            data.val_fraction + data.test_fraction >= 1:
        raise ConfigError(f"data.val_fraction={data.val_fraction} + data.test_fraction="
                          f"{data.test_fraction} must be >= 0 and leave images for train (< 1)")
    if config.encoder.kind == "small_cnn":
        enc = config.encoder
        ratio = enc.image_size / max(enc.grid_size, 1)
        if enc.grid_size < 1 or ratio < 2 or ratio != int(ratio) or int(ratio) & (int(ratio) - 1):
            raise ConfigError(f"encoder.image_size={enc.image_size} must be encoder.grid_size="
                              f"{enc.grid_size} times a power of two (at least 2)")
    positive = {"train.batch_size": config.train.batch_size,
                "encoder.batch_size": config.encoder.batch_size,
                "encoder.max_epochs": config.encoder.max_epochs,
                "encoder.patience": config.encoder.patience,
                "eval.batch_size": ev.batch_size, "eval.beam_size": ev.beam_size,
                "eval.max_length": ev.max_length, "train.epochs": config.train.epochs,
                "preprocess.max_batch_size": config.preprocess.max_batch_size}
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key}={value} must be at least 1")
    if config.preprocess.min_batch_size > config.preprocess.max_batch_size:
        raise ConfigError(f"preprocess.min_batch_size={config.preprocess.min_batch_size} is "
                          f"above preprocess.max_batch_size={config.preprocess.max_batch_size}")
    return config


def _check_thresholds(ev, data) -> None:
    """`eval.thresholds` and `eval.change_thresholds` name metrics the Evaluator computes."""
    for metric in ev.thresholds:
        if metric in REPORTED_METRICS:
            raise ConfigError(f"eval.thresholds: {metric} is reported, never a threshold "
                              f"(lower is better, and a threshold is a minimum); thresholds "
                              f"may name: {', '.join(EVAL_METRICS)}")
        if metric not in EVAL_METRICS:
            raise ConfigError(f"eval.thresholds: no metric {metric!r}; the Evaluator's metrics: "
                              f"{', '.join(EVAL_METRICS)}{did_you_mean(metric, EVAL_METRICS)}")
        if metric in GROUNDING_METRICS and not _computed(metric, data):
            raise ConfigError(f"eval.thresholds: {_where_computed(metric, data)}")
    changes = change_thresholds(ev.change_thresholds, "eval.change_thresholds")
    defaults = default_change_thresholds()
    for metric, bounds in changes.items():
        # The defaults name every metric; only a bound someone set is a mistake on unboxed data.
        if metric in GROUNDING_METRICS and not _computed(metric, data) \
                and bounds != defaults.get(metric):
            raise ConfigError(f"eval.change_thresholds: {_where_computed(metric, data)}")


def _computed(metric: str, data) -> bool:
    """Whether the Evaluator computes a grounding metric on this data."""
    return data.source in BOXED_SOURCES or (
        metric in INSTANCE_METRICS and data.source in INSTANCE_SOURCES and bool(data.instances_json))


def _where_computed(metric: str, data) -> str:
    """Which data a grounding metric needs, for a config error."""
    where = f"data.source={' or '.join(BOXED_SOURCES)}"
    if metric in INSTANCE_METRICS:
        where += (f", or {' or '.join(INSTANCE_SOURCES)} with data.instances_json (COCO "
                  "instance boxes)")
    return f"{metric} is computed only for {where}; it needs object boxes, not {data.source!r}"


def change_thresholds(value: Any, where: str) -> dict[str, dict[str, float]]:
    """Checks an `eval.change_thresholds` mapping and returns it as plain dicts of floats.

    Args:
      value: metric -> {"absolute" and/or "relative": number}.
      where: the key, for messages.
    Returns:
      The same mapping, bounds as floats.
    Raises:
      ConfigError: not a mapping of mappings, an unknown metric or bound
        kind, no bound, or a bound that is not a finite number.
    """
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a JSON object of metric -> "
                          f'{{"absolute"|"relative": number}}, got {value!r}')
    out = {}
    for metric, bounds in value.items():
        if metric in REPORTED_METRICS or metric not in EVAL_METRICS:
            why = (f"{metric} is reported, never compared (lower is better)"
                   if metric in REPORTED_METRICS else f"no metric {metric!r}")
            raise ConfigError(f"{where}: {why}; change thresholds may name: "
                              f"{', '.join(EVAL_METRICS)}{did_you_mean(metric, EVAL_METRICS)}")
        if not isinstance(bounds, Mapping) or not bounds:
            raise ConfigError(f'{where}: {metric} needs {{"absolute": number}} and/or '
                              f'{{"relative": number}}, got {bounds!r}')
        out[metric] = {}
        for kind, bound in bounds.items():
            if kind not in CHANGE_BOUNDS:
                raise ConfigError(f"{where}: {metric}: unknown bound {kind!r}; bounds: "
                                  f"{', '.join(CHANGE_BOUNDS)}{did_you_mean(kind, CHANGE_BOUNDS)}")
            if isinstance(bound, bool) or not isinstance(bound, (int, float)) \
                    or bound != bound or abs(bound) == float("inf"):
                raise ConfigError(f"{where}: {metric}.{kind} must be a finite number "
                                  f"(e.g. -0.05), got {bound!r}")
            out[metric][kind] = float(bound)
    return out
