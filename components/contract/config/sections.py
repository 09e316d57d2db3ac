"""The configuration schema: the frozen dataclasses of every section, and their dicts.

A `PipelineConfig` has one section per concern (`data`, `encoder`,
`preprocess`, `model`, `train`, `eval`, `push`, `serve`). The allowed values
of its keys are in `values`, the checks in `validation`, `--set` parsing in
`overrides`, what a stage may read in `declared`.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping

from components.contract.config.values import CAPTION_METRICS, GROUNDING_METRICS
from models.decoder_options import DecoderOptions
from serving.server import options as server_options
from serving.signature.decoding import Decoding
from serving.versions.batching_parameters import BatchingParameters

# The server's batching defaults, which the pushed batching_parameters.txt starts from.
_BATCHING = BatchingParameters()
# The exported graph's decoding defaults, which the Evaluator measures and the Exporter bakes in.
_DECODING = Decoding()


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
    instances_json: str = ""           # coco/karpathy: COCO instances_*.json (object boxes by category; optional): the Evaluator's grounding metrics
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
    max_epochs: int = 30               # EncoderTrainer: a safety bound on epochs, not the stop (patience is); the log says when it ends training while val mAP still rises
    shuffle_buffer: int = 10000        # EncoderTrainer: encoded images in the shuffle buffer
    val_images: int = 5000             # EncoderTrainer: val images scored for mAP, at most
    patience: int = 3                  # EncoderTrainer: stop after this many epochs in a row without a val mAP gain above min_delta
    min_delta: float = 1e-3            # EncoderTrainer: smallest val mAP gain over the best so far that counts as improvement
    mixed_precision: str = "auto"      # EncoderTrainer: auto (bf16 if native) | float32 | mixed_float16 (loss-scaled) | mixed_bfloat16


@dataclass(frozen=True)
class PreprocessConfig:
    """Beam preprocessing: encoder inference and vocabulary."""
    runner: str = "direct"             # direct | portable | dask | any Beam runner name
    direct_num_workers: int = 1        # direct runner workers (multi_processing mode)
    dask_workers: int = 2              # dask without --dask_client_address: local worker processes
    direct_running_mode: str = "in_memory"  # in_memory | multi_threading | multi_processing
    max_batch_size: int = 64           # RunInference batch bound
    min_batch_size: int = 8            # RunInference smallest batch
    vocab_min_count: int = 1           # words seen fewer times in train become <unk>
    vocab_max_size: int = 10000        # vocabulary size limit, reserved tokens included
    max_caption_length: int = 30       # tokens, without <start>/<end>
    num_shards: int = 0                # shards per split: 0 = streamed, sized by max_shard_mb; N = exactly N (groups every record)
    max_shard_mb: int = 128            # num_shards=0: a shard is closed after this many MB


# The `model` section's keys, in the config's order: `DecoderOptions`' fields
# (default, type, allowed values and help declared there), with the hard
# attention's warm-up given in epochs instead of minibatches.
MODEL_KEYS = ('attention', 'attention_score', 'embedding_dim', 'hidden_dim', 'attention_dim', 'dropout', 'use_gate', 'doubly_stochastic_lambda', 'entropy_lambda', 'reinforce_lambda', 'expected_alpha_prob', 'expected_alpha_warmup_epochs', 'baseline_decay', 'reinforce_credit', 'reinforce_baseline', 'hard_inference', 'glimpse_std', 'glimpse_patches', 'glimpse_size', 'glimpse_scale', 'transform', 'transform_scale', 'transform_scale_min', 'transform_scale_max', 'location_channels')


def _model_section() -> type:
    """`ModelConfig`: the decoder's declared options (`models/decoder_options.py`) as config keys."""
    declared = {f.name: f for f in dataclasses.fields(DecoderOptions)}
    types = {"str": str, "int": int, "float": float, "bool": bool}
    fields = []
    for key in MODEL_KEYS:
        if key == "expected_alpha_warmup_epochs":
            fields.append((key, float, field(default=0.0, metadata={"help": (
                "hard: the first this many epochs use expected alpha (no sampling); "
                "steps = epochs x steps per epoch")})))
            continue
        f = declared[key]
        fields.append((key, types[str(f.type)], field(default=f.default, metadata=f.metadata)))
    cls = dataclasses.make_dataclass("ModelConfig", fields, frozen=True)
    cls.__module__ = __name__
    cls.__doc__ = ("The attention decoder (Xu et al. 2015, sections 3-4; the attention types: "
                   "docs/attention.md); declared in models/decoder_options.py.")
    return cls


ModelConfig = _model_section()


@dataclass(frozen=True)
class TrainConfig:
    """The Trainer stage: custom tf.distribute training loop."""
    strategy: str = "default"          # default | mirrored | multi_worker
    devices: str = ""                  # mirrored: comma-separated devices
    cpu_logical_devices: int = 0       # split the CPU for mirrored on CPU-only hosts
    batch_size: int = 64               # global batch
    epochs: int = 10                   # epoch limit (early stopping may end sooner)
    max_steps: int = 0                 # 0 = no step limit
    optimizer: str = "adam"            # adam (fused kernel, Keras Adam's math) | rmsprop
    learning_rate: float = 1e-3        # peak learning rate
    lr_schedule: str = "constant"      # constant | cosine
    warmup_steps: int = 0              # linear warmup steps
    clip_norm: float = 5.0             # global gradient norm clip (0 = off)
    early_stopping_metric: str = "val_loss"  # val_loss | bleu4 | cider
    patience: int = 3                  # epochs in a row without a gain above min_delta before stopping (0 = no early stopping; the SCST phase has train.scst_patience)
    min_delta: float = 1e-4            # smallest val gain that counts as improving: relative for val_loss, absolute for bleu4 and cider
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
    scst_epochs: int = 5               # scst: epochs of the self-critical phase; the best val-CIDEr epoch is kept (train.scst_patience stops earlier)
    scst_learning_rate: float = 5e-5   # scst: Adam learning rate (the peak under scst_lr_schedule=cosine)
    scst_lr_schedule: str = "constant"  # scst: constant | cosine (decayed to 0 over train.scst_epochs)
    scst_average_epochs: float = 0.0   # scst: validate and keep an exponential moving average of the weights with this time constant in epochs, not the last step's weights (0 = off; docs/scst.md)
    scst_patience: int = 0             # scst: stop after this many epochs in a row without a val CIDEr gain above min_delta, counted from the first epoch that beats the start; 0 = train all train.scst_epochs and keep the best (docs/scst.md)
    scst_samples: int = 5              # scst: captions sampled per image and step
    scst_baseline: str = "greedy"      # scst: greedy (the reward of the greedy caption) | mean (of the image's other samples)
    scst_xe_weight: float = 0.0        # scst: weight of the cross-entropy loss mixed into the self-critical loss
    scst_attention_kl: float = 0.0     # scst: weight of the attention anchor, the KL from the start model's attention map to the model's per sampled word (docs/scst.md)
    scst_box_attention: float = 0.0    # scst: weight of the box term: at each sampled word naming an object of the image (kind, colour, size; a COCO category), -log of the attention mass on its boxes (needs data with boxes; docs/scst.md)
    scst_box_mode: str = "raise"       # scst: raise (the box term counts every word's -log box mass) | keep (only the part above the start model's at that word: it holds the start model's grounding and does not push past it; reads the start model each step; docs/scst.md)
    scst_size_reward: float = 0.0      # scst: reward per size word of a sampled caption's object phrase: +weight when one object its phrase names has that size, -weight when none has (synthetic data; docs/scst.md)
    scst_max_length: int = 0           # scst: longest sampled caption in words (0 = the longest training reference + 1)
    scst_require_converged: bool = True  # scst: refuse to start from a model whose val_loss still fell >= 1% in its last epoch


def default_change_thresholds() -> dict[str, dict[str, float]]:
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
    return {**{m: {"relative": -0.05} for m in CAPTION_METRICS},
            **{m: {"absolute": -0.03} for m in GROUNDING_METRICS}}


@dataclass(frozen=True)
class EvalConfig:
    """Evaluator: decoding, metrics, figures and blessing thresholds."""
    beam_size: int = _DECODING.beam_size  # 1 = greedy; the Exporter bakes it into the SavedModel
    max_length: int = _DECODING.max_length  # longest caption, in words; the Exporter bakes it into the SavedModel
    length_normalization: float = _DECODING.length_normalization  # 0 = off; alpha of ((5+len)/6)^alpha; the Exporter bakes it into the SavedModel
    batch_size: int = 1                # images per serving_default call (1 = as a single-image request is served, bit for bit)
    num_figures: int = 6               # test images drawn with their attention maps
    max_examples: int = 0              # 0 = the whole test split
    thresholds: Mapping[str, float] = field(default_factory=lambda: {"Bleu_4": 0.0})  # metric -> minimum for blessing (JSON)
    change_thresholds: Mapping[str, Mapping[str, float]] = field(default_factory=default_change_thresholds)  # metric -> {"absolute" and/or "relative": least allowed change from the last pushed model, negative = a drop}; blocks only if worse beyond it with 95% confidence (JSON)


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
    max_batch_size: int = _BATCHING.max_batch_size  # batching_parameters.txt: most requests' rows in one run
    batch_timeout_micros: int = _BATCHING.batch_timeout_micros  # batching_parameters.txt: how long a batch waits for more requests
    num_warmup_requests: int = 2       # records in assets.extra/tf_serving_warmup_requests


def _serve_section() -> type:
    """`ServeConfig`: the server settings its declaration marks for the config.

    Generated from `ServerOptions` (serving/server/options.py), where each is
    declared once with its default, type and help; `captioner serve --config
    NAME` passes each as its flag (`config_flag`).
    """
    types = {"str": str, "int": int, "float": float, "bool": bool, "Optional[int]": int}
    fields = [(f.name, types[str(f.type)],
               field(default=f.default, metadata={"help": f.metadata["help"],
                                                  "flag": f.metadata["config_flag"]}))
              for f in server_options.config_settings()]
    cls = dataclasses.make_dataclass("ServeConfig", fields, frozen=True)
    cls.__module__ = __name__
    cls.__doc__ = ("`captioner serve --config NAME` settings (each becomes its flag); "
                   "declared, with the server's defaults, in serving/server/options.py.")
    return cls


ServeConfig = _serve_section()


@dataclass(frozen=True)
class PipelineConfig:
    """The whole pipeline's configuration, one section per stage concern."""
    name: str = "default"
    data: DataConfig = DataConfig()
    encoder: EncoderConfig = EncoderConfig()
    preprocess: PreprocessConfig = PreprocessConfig()
    model: ModelConfig = ModelConfig()  # type: ignore[valid-type]
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    push: PushConfig = PushConfig()
    serve: ServeConfig = ServeConfig()  # type: ignore[valid-type]


SECTIONS = ("data", "encoder", "preprocess", "model", "train", "eval", "push", "serve")


class ConfigError(ValueError):
    """A config name, file or override that cannot be used."""


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


def to_dict(obj: Any) -> Any:
    """A JSON-ready dict of a config, a config section or a `DeclaredConfig`.

    A `DeclaredConfig` gives only what it declares (whole sections, or the
    declared keys of a section).
    """
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if hasattr(obj, "to_dict"):  # a DeclaredConfig or one of its sections
        return obj.to_dict()
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


def replace_section(config, section: str, **changes):
    """`config` with fields of one section changed, for a config or a stage's view of one.

    Args:
      config: a `PipelineConfig` or a `DeclaredConfig`.
      section: the section name (`"train"`).
      **changes: field -> new value.
    Returns:
      A config of the same kind.
    """
    if not dataclasses.is_dataclass(config):  # a DeclaredConfig
        return config.replace_section(section, **changes)
    return dataclasses.replace(
        config, **{section: dataclasses.replace(getattr(config, section), **changes)})
