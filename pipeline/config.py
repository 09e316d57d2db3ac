"""Named configs and the config API of the pipeline and its CLI.

The schema (the section dataclasses, `--set` overrides, `to_dict`) lives in
`components.config`, below the stages that read it; this module adds the
named configs shipped in `pipeline/configs/<name>.py` (each exposes
`get_config()`) and re-exports the schema, so that named configs, user
config files and the CLI have one module to import.
"""
from __future__ import annotations

import importlib
import os
from typing import Sequence

from components.config import (  # noqa: F401  (the config API in one place)
    SECTIONS, ConfigError, DataConfig, DeclaredConfig, EncoderConfig, EvalConfig, ModelConfig,
    PipelineConfig, PreprocessConfig, PushConfig, ServeConfig, TrainConfig,
    UndeclaredConfigError, apply_overrides, config_from_module, describe_fields, from_dict,
    load_config_file, to_dict, valid_keys)

CONFIGS_DIR = os.path.join(os.path.dirname(__file__), "configs")


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
        return load_config_file(name_or_path, overrides)
    if name_or_path not in named_configs():
        raise ConfigError(f"unknown config {name_or_path!r}; named configs: "
                          f"{', '.join(named_configs())} (or give a path to a .py file)")
    module = importlib.import_module(f"pipeline.configs.{name_or_path}")
    return config_from_module(module, name_or_path, overrides)
