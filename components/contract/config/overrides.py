"""Configs from files and modules, and `--set section.key=value` overrides, type-checked."""
from __future__ import annotations

import collections.abc
import dataclasses
import importlib.util
import json
import os
import typing
from typing import Any, Mapping, Sequence

from components.contract.config.sections import (
    SECTIONS,
    ConfigError,
    PipelineConfig,
    _field_types,
    valid_keys,
)
from components.contract.config.validation import change_thresholds, did_you_mean, validate


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
