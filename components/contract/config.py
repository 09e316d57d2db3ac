"""The configuration schema: frozen dataclasses, `--set` overrides and declared reads.

A `PipelineConfig` has one section per concern (`data`, `encoder`,
`preprocess`, `model`, `train`, `eval`, `push`, `serve`). Overrides come from
the command line as `section.key=value` strings and are type-checked against
the dataclass field types. Named configs (`pipeline/configs/<name>.py`) are
found by `pipeline.config`, which sits above the stages; this module is what
the stages themselves may use.

A stage sees the config through a `DeclaredConfig`: only the sections (or
`section.key`s) its DAG entry declares can be read, so the stage's cache key,
built from the same declaration, covers everything the stage reads.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import importlib
import importlib.util
import json
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class DataConfig:
    """Where the images and captions come from (the ExampleGen stage)."""
    source: str = "synthetic"          # synthetic (shapes) | scenes | coco | karpathy | tfds
    seed: int = 0                      # synthetic/scenes images and the split assignment
    # synthetic shapes and scenes (docs/datasets.md)
    num_images: int = 2000             # synthetic/scenes: how many images
    image_size: int = 64               # synthetic/scenes: image side in pixels
    min_objects: int = 1               # synthetic/scenes: objects per image, at least
    max_objects: int = 3               # synthetic/scenes: objects per image, at most (shapes <= 3, scenes <= 8)
    captions_per_image: int = 5        # synthetic/scenes: reference captions per image
    # coco: captions JSON + image folder; karpathy: split JSON + image folder
    captions_json: str = ""            # coco: captions_*.json; karpathy: dataset_*.json
    images_dir: str = ""               # coco/karpathy: folder the image paths are relative to
    # tfds
    tfds_name: str = "coco_captions"   # tfds: dataset name
    tfds_data_dir: str = ""            # tfds: data_dir ("" = TFDS default)
    tfds_splits: str = "train,val,test"  # tfds: splits to read (validation->val, restval->train)
    # splits (coco / synthetic / scenes); karpathy and tfds keep their own splits
    val_fraction: float = 0.1          # synthetic/scenes/coco: fraction of images in val
    test_fraction: float = 0.1         # synthetic/scenes/coco: fraction of images in test
    max_images: int = 0                # accept at most this many images (0 = no limit)
    num_shards: int = 2                # TFRecord shards per split


@dataclass(frozen=True)
class EncoderConfig:
    """The CNN whose conv grid gives the annotation vectors a_i."""
    kind: str = "small_cnn"            # small_cnn | keras_app
    application: str = "VGG19"         # any keras.applications model name
    layer: str = "block5_conv4"        # keras_app: the conv layer giving the grid
    weights: str = "none"              # imagenet | none | path to a weights file
    image_size: int = 64               # input side in pixels (square)
    width: int = 16                    # small CNN: channels of the stem (D = 8 x width)
    grid_size: int = 8                 # small CNN: output grid side H = W
    coord_channels: bool = True        # append (x, y) of each cell to a_i
    # EncoderTrainer (small CNN on caption words as multi-label targets)
    train: bool = True                 # small_cnn: train it on caption words (EncoderTrainer)
    batch_size: int = 64               # EncoderTrainer batch size
    learning_rate: float = 2e-3        # EncoderTrainer Adam learning rate
    max_epochs: int = 30               # EncoderTrainer epoch limit (early stopping usually ends it)
    shuffle_buffer: int = 10000        # EncoderTrainer: encoded images in the shuffle buffer
    val_images: int = 5000             # EncoderTrainer: val images scored for mAP, at most
    patience: int = 3                  # epochs without val mAP improvement
    min_delta: float = 1e-3            # smallest val mAP gain that counts as improvement
    mixed_precision: str = "auto"      # EncoderTrainer: auto (bf16 if native) | float32 | mixed_float16 (loss-scaled) | mixed_bfloat16


@dataclass(frozen=True)
class PreprocessConfig:
    """Beam preprocessing: encoder inference and vocabulary."""
    runner: str = "direct"             # direct | portable | any Beam runner name
    direct_num_workers: int = 1        # direct runner workers (multi_processing mode)
    direct_running_mode: str = "in_memory"  # in_memory | multi_threading | multi_processing
    max_batch_size: int = 64           # RunInference batch bound
    min_batch_size: int = 8            # RunInference smallest batch
    vocab_min_count: int = 1           # words seen fewer times in train become <unk>
    vocab_max_size: int = 10000        # vocabulary size limit, reserved tokens included
    max_caption_length: int = 30       # tokens, without <start>/<end>
    num_shards: int = 0                # shards per split: 0 = streamed, sized by max_shard_mb; N = exactly N (groups every record)
    max_shard_mb: int = 128            # num_shards=0: a shard is closed after this many MB


@dataclass(frozen=True)
class ModelConfig:
    """The attention decoder (Xu et al. 2015, sections 3-4)."""
    attention: str = "soft"            # soft | hard
    embedding_dim: int = 128           # word embedding size m
    hidden_dim: int = 256              # LSTM size n
    attention_dim: int = 128           # hidden size of the attention MLP f_att
    dropout: float = 0.3               # dropout on the deep output layer
    use_gate: bool = True              # beta_t gating scalar (section 4.2.1)
    doubly_stochastic_lambda: float = 1.0  # soft: lambda of sum_i (1 - sum_t alpha_ti)^2 (section 4.2.1; hard has none)
    entropy_lambda: float = 0.01       # hard attention entropy bonus lambda_e
    reinforce_lambda: float = 1.0      # hard attention lambda_r
    expected_alpha_prob: float = 0.5   # hard: P(use expected alpha) per minibatch
    expected_alpha_warmup_epochs: float = 0.0  # hard: the first this many epochs use expected alpha (no sampling); steps = epochs x steps per epoch
    baseline_decay: float = 0.9        # hard: REINFORCE moving-average baseline decay
    reinforce_credit: str = "sequence"  # hard: sequence (paper: log p(y|s,a) per sample) | token (log p(y_t))
    reinforce_baseline: str = "moving_average"  # hard: moving_average (paper) | expected (per word: log p(y_t) with the expected context; token credit)
    hard_inference: str = "expected"   # expected | argmax


@dataclass(frozen=True)
class TrainConfig:
    """The Trainer stage: custom tf.distribute training loop."""
    strategy: str = "default"          # default | mirrored | multi_worker
    devices: str = ""                  # mirrored: comma-separated devices
    cpu_logical_devices: int = 0       # split the CPU for mirrored on CPU-only hosts
    batch_size: int = 64               # global batch
    epochs: int = 10                   # epoch limit (early stopping may end sooner)
    max_steps: int = 0                 # 0 = no step limit
    optimizer: str = "adam"            # adam | rmsprop
    learning_rate: float = 1e-3        # peak learning rate
    lr_schedule: str = "constant"      # constant | cosine
    warmup_steps: int = 0              # linear warmup steps
    clip_norm: float = 5.0             # global gradient norm clip (0 = off)
    early_stopping_metric: str = "val_loss"  # val_loss | bleu4 | cider
    patience: int = 3                  # epochs without improvement before stopping
    val_examples: int = 256            # validation images for early stopping
    checkpoint_every: int = 200        # steps between checkpoints (resume after a crash)
    keep_checkpoints: int = 3          # checkpoints kept by the CheckpointManager
    shuffle_buffer: int = 2048         # tf.data shuffle buffer (images)
    cache: str = "auto"                # auto | true | false: keep parsed records in memory
    cache_budget_mb: int = 1024        # train.cache=auto caches only a split estimated to fit this
    bucket_by_length: bool = False     # batch captions of similar length together
    mixed_precision: str = "auto"      # auto (bf16 if native) | float32 | mixed_float16 (loss-scaled) | mixed_bfloat16
    jit_compile: bool = False          # XLA-compile the train step
    seed: int = 0                      # model init, shuffling and caption sampling
    log_every: int = 20                # steps between TensorBoard scalar summaries
    init_model: str = ""               # start from this Model folder (or .keras file) instead of fresh weights
    # Self-critical sequence training (docs/scst.md)
    objective: str = "xe"              # xe (cross-entropy, the paper) | scst (cross-entropy, then self-critical fine-tuning on CIDEr-D)
    scst_epochs: int = 5               # scst: epoch limit of the self-critical phase (early stopping on val CIDEr)
    scst_learning_rate: float = 5e-5   # scst: Adam learning rate (constant)
    scst_samples: int = 5              # scst: captions sampled per image and step
    scst_baseline: str = "greedy"      # scst: greedy (the reward of the greedy caption) | mean (of the image's other samples)
    scst_xe_weight: float = 0.0        # scst: weight of the cross-entropy loss mixed into the self-critical loss
    scst_max_length: int = 0           # scst: longest sampled caption in words (0 = the longest training reference + 1)
    scst_require_converged: bool = True  # scst: refuse to start from a model whose val_loss still fell >= 1% in its last epoch


def _default_change_thresholds() -> dict[str, dict[str, float]]:
    """The default `eval.change_thresholds`.

    The caption metrics get relative bounds because their scales differ by
    data set and metric (CIDEr near 7 on the shapes and near 1 on COCO,
    BLEU-4 well below BLEU-1), so one fraction reads the same everywhere. The
    accuracies and grounding rates are fractions of images or phrases, on the
    same 0-1 scale for every source, so they get absolute bounds in points.
    Sampling noise is the bootstrap interval's job, so a bound is the size of
    drop worth blocking a push for: 5% of a caption metric, 3 points of an
    accuracy.

    Returns:
      metric -> {"relative" or "absolute": bound}, a new dict on each call.
    """
    caption = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")
    rates = ("attribute_accuracy", "relation_accuracy", "grounding", "grounding_noun")
    return {**{m: {"relative": -0.05} for m in caption},
            **{m: {"absolute": -0.03} for m in rates}}


@dataclass(frozen=True)
class EvalConfig:
    """Evaluator: decoding, metrics, figures and blessing thresholds."""
    beam_size: int = 3                 # 1 = greedy; the Exporter bakes it into the SavedModel
    max_length: int = 30               # longest caption, in words; the Exporter bakes it into the SavedModel
    length_normalization: float = 0.0  # 0 = off; alpha of ((5+len)/6)^alpha; the Exporter bakes it into the SavedModel
    batch_size: int = 1                # images per serving_default call (1 = as a single-image request is served, bit for bit)
    num_figures: int = 6               # test images drawn with their attention maps
    max_examples: int = 0              # 0 = the whole test split
    thresholds: Mapping[str, float] = field(default_factory=lambda: {"Bleu_4": 0.0})  # metric -> minimum for blessing (JSON)
    change_thresholds: Mapping[str, Mapping[str, float]] = field(default_factory=_default_change_thresholds)  # metric -> {"absolute" and/or "relative": least allowed change from the last pushed model, negative = a drop}; blocks only if worse beyond it with 95% confidence (JSON)


@dataclass(frozen=True)
class PushConfig:
    """Pusher: SavedModel versions for TensorFlow Serving.

    The exported graph decodes with the `eval` settings the Evaluator measured
    (beam size, maximum length, length normalization), read from the
    Evaluation artifact: what is served is what was blessed.
    """
    serving_dir: str = ""              # empty = <root>/serving
    model_name: str = "captioner"      # model name in TF Serving
    keep_versions: int = 3             # newest versions kept in the serving folder
    max_batch_size: int = 32           # batching_parameters.txt
    batch_timeout_micros: int = 2000   # batching_parameters.txt
    num_warmup_requests: int = 2       # records in assets.extra/tf_serving_warmup_requests


@dataclass(frozen=True)
class ServeConfig:
    """`captioner serve --config NAME` settings (each becomes the flag of that name).

    The defaults equal the server's own (`serving/flags.py`), which apply
    when no `--config` is given; flags on the command line override these.
    """
    host: str = "127.0.0.1"            # bind address (loopback unless told otherwise)
    port: int = 8500                   # gRPC port
    rest_port: int = 8501              # REST port
    poll_seconds: float = 1.0          # how often the model folder is scanned
    max_request_bytes: int = 16 * 1024 * 1024  # larger requests get RESOURCE_EXHAUSTED
    max_image_pixels: int = 40_000_000  # larger images get INVALID_ARGUMENT
    max_decode_work: int = 2_000_000_000  # pixel-passes one image may cost to decode (JPEG scans, PNG passes, frames); more gets INVALID_ARGUMENT


@dataclass(frozen=True)
class PipelineConfig:
    """The whole pipeline's configuration, one section per stage concern."""
    name: str = "default"
    data: DataConfig = DataConfig()
    encoder: EncoderConfig = EncoderConfig()
    preprocess: PreprocessConfig = PreprocessConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    push: PushConfig = PushConfig()
    serve: ServeConfig = ServeConfig()


SECTIONS = ("data", "encoder", "preprocess", "model", "train", "eval", "push", "serve")


class ConfigError(ValueError):
    """A config name, file or override that cannot be used."""


class UndeclaredConfigError(AttributeError):
    """A stage read a config section or key that its DAG entry does not declare."""


def load_config_file(path: str, overrides: Sequence[str] = ()) -> PipelineConfig:
    """Loads a Python file exposing `get_config()`, then applies overrides.

    Args:
      path: the `.py` file.
      overrides: `section.key=value` strings (see `apply_overrides`).
    Returns:
      The resolved `PipelineConfig`.
    """
    if not os.path.exists(path):
        raise ConfigError(f"config file not found: {path}")
    spec = importlib.util.spec_from_file_location("_user_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return config_from_module(module, path, overrides)


def config_from_module(module: Any, label: str, overrides: Sequence[str] = ()) -> PipelineConfig:
    """`module.get_config()` checked and overridden.

    Args:
      module: a config module (named or loaded from a file).
      label: its name or path, for error messages.
      overrides: `section.key=value` strings.
    Returns:
      The resolved `PipelineConfig`.
    """
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{label} has no get_config()")
    config = module.get_config()
    if not isinstance(config, PipelineConfig):
        raise ConfigError(f"{label}: get_config() must return a PipelineConfig")
    return validate(apply_overrides(config, overrides))


# Keys whose values come from a fixed list (the stages and models check the
# same lists; tests/pipeline/test_config.py keeps the two in step).
CHOICES: dict[str, tuple[str, ...]] = {
    "data.source": ("synthetic", "scenes", "coco", "karpathy", "tfds"),
    "encoder.kind": ("small_cnn", "keras_app"),
    "preprocess.direct_running_mode": ("in_memory", "multi_threading", "multi_processing"),
    "model.attention": ("soft", "hard"),
    "model.reinforce_credit": ("sequence", "token"),
    "model.reinforce_baseline": ("moving_average", "expected"),
    "model.hard_inference": ("expected", "argmax"),
    "train.strategy": ("default", "mirrored", "multi_worker"),
    "train.optimizer": ("adam", "rmsprop"),
    "train.lr_schedule": ("constant", "cosine"),
    "train.early_stopping_metric": ("val_loss", "bleu4", "cider"),
    "train.objective": ("xe", "scst"),
    "train.scst_baseline": ("greedy", "mean"),
    "train.cache": ("auto", "true", "false"),
    "encoder.mixed_precision": ("auto", "float32", "mixed_float16", "mixed_bfloat16"),
    "train.mixed_precision": ("auto", "float32", "mixed_float16", "mixed_bfloat16"),
}

# The Evaluator's metrics that `eval.thresholds` may name (larger is better).
CAPTION_METRICS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")
# Computed only for data with object boxes (`data.source=synthetic`).
GROUNDING_METRICS = ("attribute_accuracy", "relation_accuracy", "grounding", "grounding_noun")
EVAL_METRICS = CAPTION_METRICS + GROUNDING_METRICS
# Reported by the Evaluator but never thresholds: lower is better (the end-of-caption check).
REPORTED_METRICS = ("dangling_ending_rate", "dangling_endings", "empty_captions")
# The sources whose examples carry object boxes (the grounding metrics need them).
BOXED_SOURCES = ("synthetic", "scenes")
# Objects per image that each built-in synthetic source can draw, at most.
MAX_OBJECTS = {"synthetic": 3, "scenes": 8}


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
    for metric in ev.thresholds:
        if metric in REPORTED_METRICS:
            raise ConfigError(f"eval.thresholds: {metric} is reported, never a threshold "
                              f"(lower is better, and a threshold is a minimum); thresholds "
                              f"may name: {', '.join(EVAL_METRICS)}")
        if metric not in EVAL_METRICS:
            raise ConfigError(f"eval.thresholds: no metric {metric!r}; the Evaluator's metrics: "
                              f"{', '.join(EVAL_METRICS)}{did_you_mean(metric, EVAL_METRICS)}")
        if metric in GROUNDING_METRICS and data.source not in BOXED_SOURCES:
            raise ConfigError(f"eval.thresholds: {metric} is computed only for "
                              f"data.source={' or '.join(BOXED_SOURCES)} (it needs object "
                              f"boxes), not {data.source!r}")
    changes = change_thresholds(ev.change_thresholds, "eval.change_thresholds")
    defaults = _default_change_thresholds()
    for metric, bounds in changes.items():
        # The defaults name every metric; only a bound someone set is a mistake on unboxed data.
        if metric in GROUNDING_METRICS and data.source not in BOXED_SOURCES \
                and bounds != defaults.get(metric):
            raise ConfigError(f"eval.change_thresholds: {metric} is computed only for "
                              f"data.source={' or '.join(BOXED_SOURCES)} (it needs object "
                              f"boxes), not {data.source!r}")
    tcfg = config.train
    if tcfg.objective == "scst" and tcfg.scst_baseline == "mean" and tcfg.scst_samples < 2:
        raise ConfigError(f"train.scst_baseline=mean compares each sample with the image's other "
                          f"samples: it needs train.scst_samples >= 2, got {tcfg.scst_samples}")
    if tcfg.objective == "scst" and (tcfg.scst_samples < 1 or tcfg.scst_epochs < 1):
        raise ConfigError("train.objective=scst needs train.scst_samples >= 1 and "
                          "train.scst_epochs >= 1")
    if model.reinforce_baseline == "expected" and model.reinforce_credit != "token":
        raise ConfigError("model.reinforce_baseline=expected is a per-word baseline: "
                          "it needs model.reinforce_credit=token")
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


CHANGE_BOUNDS = ("absolute", "relative")


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


def _coerce(value: str, typ: Any, where: str) -> Any:
    """Parses a command-line string into the field's declared type."""
    origin = typing.get_origin(typ)
    if typ is bool:
        low = value.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{where}: expected a boolean (true/false), got {value!r}")
    if typ is int:
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
    if typ is float:
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if typ is str:
        return value
    if origin in (collections.abc.Mapping, dict) or typ in (dict, Mapping):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: expected a JSON object, got {value!r} ({e})") from None
        if not isinstance(parsed, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {value!r}")
        args = typing.get_args(typ)
        if args and typing.get_origin(args[-1]) in (collections.abc.Mapping, dict):
            return change_thresholds(parsed, where)  # the only nested mapping
        return {str(k): float(v) for k, v in parsed.items()}
    raise ConfigError(f"{where}: unsupported field type {typ!r}")


def _field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def valid_keys() -> list[str]:
    """Every `section.key` that `--set` accepts."""
    keys = []
    for section in SECTIONS:
        cls = _field_types(PipelineConfig)[section]
        keys += [f"{section}.{k}" for k in _field_types(cls)]
    return keys


def apply_overrides(config: PipelineConfig, overrides: Sequence[str]) -> PipelineConfig:
    """Applies `section.key=value` overrides, checking keys and types.

    Args:
      config: the base config.
      overrides: strings like `train.batch_size=8` or
        `eval.thresholds={"Bleu_4": 0.5}` (JSON for mappings).
    Returns:
      A new `PipelineConfig`.
    Raises:
      ConfigError: unknown key (the message lists the valid keys) or bad value.
    """
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        key, value = item.split("=", 1)
        key = key.strip()
        if key == "name":
            config = dataclasses.replace(config, name=value)
            continue
        parts = key.split(".")
        if len(parts) != 2 or parts[0] not in SECTIONS:
            hint = did_you_mean(key, valid_keys())
            if hint:
                raise ConfigError(f"unknown config key {key!r}{hint}; sections: "
                                  f"{', '.join(SECTIONS)} (`captioner config --reference` "
                                  "lists every key)")
            raise ConfigError(f"unknown config key {key!r}; valid keys:\n  "
                              + "\n  ".join(valid_keys()))
        section_name, field_name = parts
        section = getattr(config, section_name)
        types = _field_types(type(section))
        if field_name not in types:
            raise ConfigError(f"unknown config key {key!r}{did_you_mean(field_name, types)}; "
                              f"valid keys in [{section_name}]: {', '.join(sorted(types))}")
        new_value = _coerce(value, types[field_name], key)
        section = dataclasses.replace(section, **{field_name: new_value})
        config = dataclasses.replace(config, **{section_name: section})
    return config


def to_dict(obj: Any) -> Any:
    """A JSON-ready dict of a config, a config section or a `DeclaredConfig`.

    A `DeclaredConfig` gives only what it declares (whole sections, or the
    declared keys of a section).
    """
    if isinstance(obj, (DeclaredConfig, _DeclaredSection)):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_dict(v) for k, v in sorted(obj.items())}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def from_dict(data: Mapping[str, Any]) -> PipelineConfig:
    """Rebuilds a `PipelineConfig` from `to_dict` output (unknown keys rejected)."""
    kwargs = {}
    top = _field_types(PipelineConfig)
    for key, value in data.items():
        if key not in top:
            raise ConfigError(f"unknown config section {key!r}")
        if key in SECTIONS:
            cls = top[key]
            types = _field_types(cls)
            unknown = set(value) - set(types)
            if unknown:
                raise ConfigError(f"unknown keys in [{key}]: {sorted(unknown)}")
            kwargs[key] = cls(**value)
        else:
            kwargs[key] = value
    return PipelineConfig(**kwargs)


def describe_fields() -> list[tuple[str, str, Any, str]]:
    """(key, type, default, comment) for every field, for the config reference."""
    import inspect
    import re
    rows = []
    for section in SECTIONS:
        cls = _field_types(PipelineConfig)[section]
        source = inspect.getsource(cls)
        comments = {}
        for line in source.splitlines():
            m = re.match(r"\s+(\w+):[^#]*#\s*(.*)$", line)
            if m:
                comments[m.group(1)] = m.group(2).strip()
        default = cls()
        for f in dataclasses.fields(cls):
            typ = _field_types(cls)[f.name]
            tname = getattr(typ, "__name__", None) or str(typ).replace("typing.", "")
            rows.append((f"{section}.{f.name}", tname, to_dict(getattr(default, f.name)),
                         comments.get(f.name, "")))
    return rows


def parse_declaration(declared: Sequence[str]) -> dict[str, frozenset | None]:
    """`("model", "encoder.image_size")` -> `{"model": None, "encoder": {"image_size"}}`.

    None means the whole section. Unknown sections or keys raise `ConfigError`,
    so a declaration cannot silently name nothing.
    """
    sections: dict[str, set | None] = {}
    types = _field_types(PipelineConfig)
    for item in declared:
        section, _, key = item.partition(".")
        if section not in SECTIONS:
            raise ConfigError(f"declared config {item!r}: no section {section!r}; "
                              f"sections: {', '.join(SECTIONS)}")
        if not key:
            sections[section] = None
            continue
        if key not in _field_types(types[section]):
            raise ConfigError(f"declared config {item!r}: [{section}] has no key {key!r}")
        if section not in sections:
            sections[section] = set()
        if sections[section] is not None:
            sections[section].add(key)
    return {s: (None if keys is None else frozenset(keys)) for s, keys in sections.items()}


class _DeclaredSection:
    """One section of which only some keys are declared."""

    def __init__(self, section: Any, name: str, keys: frozenset, stage: str):
        self._section, self._name, self._keys, self._stage = section, name, keys, stage

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        if key not in self._keys:
            raise UndeclaredConfigError(
                f"{self._stage} read config key {self._name}.{key}, which its DAG entry "
                f"does not declare (declared in [{self._name}]: {', '.join(sorted(self._keys))})"
                f"; add it to the stage's config in pipeline/dag.py")
        return getattr(self._section, key)

    def to_dict(self) -> dict:
        return {k: to_dict(getattr(self._section, k)) for k in sorted(self._keys)}


def replace_section(config, section: str, **changes):
    """`config` with fields of one section changed, for a config or a stage's view of one.

    Args:
      config: a `PipelineConfig` or a `DeclaredConfig`.
      section: the section name (`"train"`).
      **changes: field -> new value.
    Returns:
      A config of the same kind.
    """
    if isinstance(config, DeclaredConfig):
        return config.replace_section(section, **changes)
    return dataclasses.replace(
        config, **{section: dataclasses.replace(getattr(config, section), **changes)})


class DeclaredConfig:
    """A `PipelineConfig` of which a stage may read only what it declared.

    Reading an undeclared section or key raises `UndeclaredConfigError`, so
    every read is covered by the stage's cache key (see `to_dict`).

    Args:
      config: the resolved `PipelineConfig`.
      declared: sections (`"model"`) or keys (`"encoder.image_size"`).
      stage: the stage name, for error messages.
    """

    def __init__(self, config: PipelineConfig, declared: Sequence[str], stage: str = "a stage"):
        self._config = config
        self._declaration = tuple(declared)
        self._declared = parse_declaration(declared)
        self._stage = stage

    def replace_section(self, section: str, **changes) -> "DeclaredConfig":
        """The same view of a config whose `section` has `changes` (see `replace_section`)."""
        return DeclaredConfig(replace_section(self._config, section, **changes),
                              self._declaration, self._stage)

    @property
    def name(self) -> str:
        """The config's name (labels only; never part of a cache key)."""
        return self._config.name

    def __getattr__(self, section: str) -> Any:
        if section.startswith("__"):
            raise AttributeError(section)
        if section not in self._declared:
            raise UndeclaredConfigError(
                f"{self._stage} read config section [{section}], which its DAG entry does not "
                f"declare (declared: {', '.join(sorted(self._declared)) or 'nothing'}); add it "
                "to the stage's config in pipeline/dag.py")
        keys = self._declared[section]
        value = getattr(self._config, section)
        return value if keys is None else _DeclaredSection(value, section, keys, self._stage)

    def to_dict(self) -> dict:
        """The declared part of the config: what keys a stage's cache."""
        out = {}
        for section, keys in sorted(self._declared.items()):
            value = getattr(self._config, section)
            out[section] = (to_dict(value) if keys is None
                            else {k: to_dict(getattr(value, k)) for k in sorted(keys)})
        return out
