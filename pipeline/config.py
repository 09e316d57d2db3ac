"""Pipeline configuration: frozen dataclasses, named configs and `--set` overrides.

A `PipelineConfig` has one section per concern (`data`, `encoder`,
`preprocess`, `model`, `train`, `eval`, `push`, `serve`). Named configs live
in `pipeline/configs/<name>.py` and expose `get_config()`. Overrides come from
the command line as `section.key=value` strings and are type-checked against
the dataclass field types.
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
    patience: int = 3                  # epochs without val mAP improvement
    min_delta: float = 1e-3            # smallest val mAP gain that counts as improvement


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
    num_shards: int = 2                # output TFRecord shards per split


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
    expected_alpha_warmup: int = 0     # hard: first N minibatches use expected alpha (no sampling)
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
    early_stopping_metric: str = "val_loss"  # val_loss | bleu4
    patience: int = 3                  # epochs without improvement before stopping
    val_examples: int = 256            # validation images for early stopping
    checkpoint_every: int = 200        # steps between checkpoints (resume after a crash)
    keep_checkpoints: int = 3          # checkpoints kept by the CheckpointManager
    shuffle_buffer: int = 2048         # tf.data shuffle buffer (images)
    cache: bool = True                 # cache parsed records in memory (small data)
    bucket_by_length: bool = False     # batch captions of similar length together
    mixed_precision: str = "float32"   # float32 | mixed_float16 | mixed_bfloat16
    jit_compile: bool = False          # XLA-compile the train step
    seed: int = 0                      # model init, shuffling and caption sampling
    log_every: int = 20                # steps between TensorBoard scalar summaries


@dataclass(frozen=True)
class EvalConfig:
    """Evaluator: decoding, metrics, figures and blessing thresholds."""
    beam_size: int = 3                 # 1 = greedy
    max_length: int = 30               # longest caption, in words
    length_normalization: float = 0.0  # 0 = off; alpha of ((5+len)/6)^alpha
    batch_size: int = 128              # images decoded per batch
    num_figures: int = 6               # test images drawn with their attention maps
    max_examples: int = 0              # 0 = the whole test split
    thresholds: Mapping[str, float] = field(default_factory=lambda: {"Bleu_4": 0.0})  # metric -> minimum for blessing (JSON)
    max_regression: float = 0.05       # allowed drop below the last pushed model's metrics


@dataclass(frozen=True)
class PushConfig:
    """Pusher: SavedModel versions for TensorFlow Serving."""
    serving_dir: str = ""              # empty = <root>/serving
    model_name: str = "captioner"      # model name in TF Serving
    keep_versions: int = 3             # newest versions kept in the serving folder
    beam_size: int = 3                 # beam size of the exported graph (1 = greedy)
    max_length: int = 30               # longest caption of the exported graph
    max_batch_size: int = 32           # batching_parameters.txt
    batch_timeout_micros: int = 2000   # batching_parameters.txt
    num_warmup_requests: int = 2       # records in assets.extra/tf_serving_warmup_requests


@dataclass(frozen=True)
class ServeConfig:
    """Defaults for `captioner serve`."""
    host: str = "127.0.0.1"            # bind address (loopback unless told otherwise)
    port: int = 8500                   # gRPC port
    rest_port: int = 8501              # REST port
    poll_seconds: float = 1.0          # how often the model folder is scanned
    max_request_bytes: int = 16 * 1024 * 1024  # larger requests get RESOURCE_EXHAUSTED
    max_image_pixels: int = 40_000_000  # larger images get INVALID_ARGUMENT


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
CONFIGS_DIR = os.path.join(os.path.dirname(__file__), "configs")


class ConfigError(ValueError):
    """A config name, file or override that cannot be used."""


def named_configs() -> list[str]:
    """Names of the configs shipped in `pipeline/configs/`."""
    return sorted(f[:-3] for f in os.listdir(CONFIGS_DIR)
                  if f.endswith(".py") and not f.startswith("_"))


def load_config(name_or_path: str = "demo",
                overrides: Sequence[str] = ()) -> PipelineConfig:
    """Loads a named config or a Python file with `get_config()`, then overrides.

    Args:
      name_or_path: a name from `pipeline/configs/` or a path to a `.py` file.
      overrides: `section.key=value` strings (see `apply_overrides`).
    Returns:
      The resolved `PipelineConfig`.
    """
    if name_or_path.endswith(".py") or os.sep in name_or_path:
        if not os.path.exists(name_or_path):
            raise ConfigError(f"config file not found: {name_or_path}")
        spec = importlib.util.spec_from_file_location("_user_config", name_or_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        if name_or_path not in named_configs():
            raise ConfigError(f"unknown config {name_or_path!r}; named configs: "
                              f"{', '.join(named_configs())} (or give a path to a .py file)")
        module = importlib.import_module(f"pipeline.configs.{name_or_path}")
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{name_or_path} has no get_config()")
    config = module.get_config()
    if not isinstance(config, PipelineConfig):
        raise ConfigError(f"{name_or_path}: get_config() must return a PipelineConfig")
    return apply_overrides(config, overrides)


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
            raise ConfigError(f"unknown config key {key!r}; valid keys:\n  "
                              + "\n  ".join(valid_keys()))
        section_name, field_name = parts
        section = getattr(config, section_name)
        types = _field_types(type(section))
        if field_name not in types:
            raise ConfigError(f"unknown config key {key!r}; valid keys in "
                              f"[{section_name}]: {', '.join(sorted(types))}")
        new_value = _coerce(value, types[field_name], key)
        section = dataclasses.replace(section, **{field_name: new_value})
        config = dataclasses.replace(config, **{section_name: section})
    return config


def to_dict(obj: Any) -> Any:
    """A JSON-ready dict of a config or a config section."""
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
