"""Named configs and the config API of the pipeline and its CLI.

The schema (the section dataclasses, `--set` overrides, `to_dict`) lives in
`components.contract.config`, below the stages that read it; this module adds the
named configs shipped in `pipeline/configs/<name>.py` (each exposes
`get_config()`) and re-exports the schema, so that named configs, user
config files and the CLI have one module to import.
"""
from __future__ import annotations

import importlib
import json
import os
from typing import Sequence

from components.contract.config import (  # noqa: F401  (the config API in one place)
    BOXED_SOURCES,
    CHOICES,
    EVAL_METRICS,
    MAX_OBJECTS,
    REPORTED_METRICS,
    SECTIONS,
    ConfigError,
    DataConfig,
    DeclaredConfig,
    EncoderConfig,
    EvalConfig,
    ModelConfig,
    PipelineConfig,
    PreprocessConfig,
    PushConfig,
    ServeConfig,
    TrainConfig,
    UndeclaredConfigError,
    apply_overrides,
    config_from_module,
    describe_fields,
    did_you_mean,
    from_dict,
    load_config_file,
    replace_section,
    to_dict,
    valid_keys,
    validate,
)
from components.contract.config_paths import check_paths  # noqa: F401

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
        raise ConfigError(f"unknown config {name_or_path!r}"
                          f"{did_you_mean(name_or_path, named_configs())}; named configs: "
                          f"{', '.join(named_configs())} (or give a path to a .py file)")
    module = importlib.import_module(f"pipeline.configs.{name_or_path}")
    return config_from_module(module, name_or_path, overrides)


# The config a pipeline root was last run with, written by `captioner run`.
ROOT_CONFIG_FILE = "pipeline_config.json"


def read_root_config(root: str) -> dict | None:
    """`{"config": label, "overrides": [...], "resolved": {...}}` recorded in `root`, or None."""
    path = os.path.join(root, ROOT_CONFIG_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
        from_dict(record["resolved"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path} cannot be read ({e}); pass --config") from None
    return record


def write_root_config(root: str, label: str, overrides: Sequence[str],
                      config: PipelineConfig) -> str:
    """Records the config `root` is run with (atomically); returns the file's path."""
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, ROOT_CONFIG_FILE)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"config": label, "overrides": list(overrides),
                   "resolved": to_dict(config)}, f, indent=2)
    os.replace(tmp, path)
    return path


def config_differences(old: PipelineConfig, new: PipelineConfig) -> list[str]:
    """`section.key: old -> new` for every key whose value differs."""
    a, b = to_dict(old), to_dict(new)
    out = []
    for section in ("name",) + SECTIONS:
        if section == "name":
            if a["name"] != b["name"]:
                out.append(f"name: {a['name']} -> {b['name']}")
            continue
        for key in b[section]:
            if a[section].get(key) != b[section][key]:
                out.append(f"{section}.{key}: {json.dumps(a[section].get(key))} -> "
                           f"{json.dumps(b[section][key])}")
    return out
