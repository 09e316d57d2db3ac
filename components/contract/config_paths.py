"""The paths a config names: which stage reads which, and whether they exist.

`check_paths` runs before anything is recorded in a root (a missing file is a
config error, not a failed execution); `path_keys_read` tells the runner
which outside files and folders key each stage's cache
(`pipeline.input_fingerprints`).
"""
from __future__ import annotations

import os
from typing import Sequence

from components.contract.config import ConfigError, PipelineConfig

# Paths each stage reads: (stage, key, "file" | "dir" | "path" (either)).
_PATH_KEYS = (("ExampleGen", "data.captions_json", "file"),
              ("ExampleGen", "data.images_dir", "dir"),
              ("ExampleGen", "data.instances_json", "file"),
              ("ExampleGen", "data.tfds_data_dir", "dir"),
              ("EncoderTrainer", "encoder.weights", "file"),
              ("Trainer", "train.init_model", "path"))
# Values of `encoder.weights` that name no file (see `models.encoder.keras_app_backbone`).
_WEIGHTS_KEYWORDS = ("", "none", "imagenet")


def path_keys_read(config: PipelineConfig) -> list[tuple[str, str, str, str]]:
    """The path keys whose value the config's stages read, with that value.

    A key the config makes irrelevant is left out: `data.captions_json`,
    `data.images_dir` and `data.instances_json` unless `data.source` is coco
    or karpathy,
    `data.tfds_data_dir` unless it is tfds, and `encoder.weights` unless
    `encoder.kind` is keras_app and the value is a path (not `imagenet` or
    `none`). A value may be `""`: not set (for `data.tfds_data_dir`, TFDS's
    default folder).

    Args:
      config: a resolved config.
    Returns:
      (stage, key, kind, value) tuples, in `_PATH_KEYS` order; kind is
      `file`, `dir` or `path` (a file or a folder).
    """
    source = config.data.source
    used_by_source = {"data.captions_json": source in ("coco", "karpathy"),
                      "data.images_dir": source in ("coco", "karpathy"),
                      "data.instances_json": source in ("coco", "karpathy"),
                      "data.tfds_data_dir": source == "tfds"}
    read = []
    for stage, key, kind in _PATH_KEYS:
        if not used_by_source.get(key, True):
            continue
        section, name = key.split(".")
        path = getattr(getattr(config, section), name)
        if key == "encoder.weights" and (config.encoder.kind != "keras_app"
                                         or path.strip().lower() in _WEIGHTS_KEYWORDS):
            continue
        read.append((stage, key, kind, path))
    return read


def check_paths(config: PipelineConfig, stages: Sequence[str] | None = None) -> None:
    """Checks that every path the config names (for `stages`; default all) exists.

    Args:
      config: a resolved config.
      stages: the stages about to run; paths only other stages read are skipped.
    Raises:
      ConfigError: naming the key, the path and what was expected there.
    """
    source = config.data.source
    if (stages is None or "ExampleGen" in stages) and source in ("coco", "karpathy") \
            and not config.data.captions_json:
        what = "captions_*.json" if source == "coco" else "dataset_*.json"
        raise ConfigError(f"data.source={source} needs data.captions_json (the {what} "
                          "file) and data.images_dir, e.g. --set data.captions_json=PATH "
                          "--set data.images_dir=DIR")
    for stage, key, kind, path in path_keys_read(config):
        if (stages is not None and stage not in stages) or not path:
            continue
        exists = (os.path.exists(path) if kind == "path" else
                  os.path.isfile(path) if kind == "file" else os.path.isdir(path))
        if not exists:
            what = ("a Model folder or .keras file" if kind == "path" else
                    "a file" if kind == "file" else "a folder")
            found = (" (it is a folder)" if kind == "file" and os.path.isdir(path) else
                     " (it is a file)" if kind == "dir" and os.path.isfile(path) else
                     " (it does not exist)")
            raise ConfigError(f"{key}={path!r}: expected {what}{found}")
