"""The pipeline's configuration: its schema, allowed values, checks, overrides and declared reads.

One module per job; this package re-exports the API that stages, the runner
and the CLI use (`from components.contract import config as config_lib`).

| module | job |
|---|---|
| `sections` | the frozen dataclasses of every section; `to_dict`, `from_dict`, `replace_section` |
| `values` | the allowed values of keys (`CHOICES`), the metric names, the boxed sources |
| `validation` | the checks a config passes before any stage runs; near-miss suggestions |
| `overrides` | configs from files and modules; `--set section.key=value`, type-checked |
| `declared` | `DeclaredConfig`: what a stage may read, as its DAG entry declares |
| `docs` | every key with its type, default and comment, for the config reference |

The keys that name files or folders, and their checks, are in
`components.contract.config_paths`.
"""
from components.contract.config.declared import (
                                                 DeclaredConfig,
                                                 UndeclaredConfigError,
                                                 parse_declaration,
)
from components.contract.config.docs import describe_fields
from components.contract.config.overrides import (
                                                 apply_overrides,
                                                 config_from_module,
                                                 load_config_file,
)
from components.contract.config.sections import (
                                                 SECTIONS,
                                                 ConfigError,
                                                 DataConfig,
                                                 EncoderConfig,
                                                 EvalConfig,
                                                 ModelConfig,
                                                 PipelineConfig,
                                                 PreprocessConfig,
                                                 PushConfig,
                                                 ServeConfig,
                                                 TrainConfig,
                                                 from_dict,
                                                 replace_section,
                                                 to_dict,
                                                 valid_keys,
)
from components.contract.config.validation import change_thresholds, did_you_mean, validate
from components.contract.config.values import (
                                                 BOXED_SOURCES,
                                                 CAPTION_METRICS,
                                                 CHANGE_BOUNDS,
                                                 CHOICES,
                                                 EARLY_STOPPING_METRICS,
                                                 EVAL_METRICS,
                                                 GROUNDING_METRICS,
                                                 INSTANCE_METRICS,
                                                 INSTANCE_SOURCES,
                                                 MAX_OBJECTS,
                                                 REPORTED_METRICS,
)

__all__ = [
    "BOXED_SOURCES", "CAPTION_METRICS", "CHANGE_BOUNDS", "CHOICES", "EARLY_STOPPING_METRICS",
    "EVAL_METRICS", "GROUNDING_METRICS", "INSTANCE_METRICS", "INSTANCE_SOURCES", "MAX_OBJECTS", "REPORTED_METRICS", "SECTIONS",
    "ConfigError", "DataConfig", "DeclaredConfig", "EncoderConfig", "EvalConfig", "ModelConfig",
    "PipelineConfig", "PreprocessConfig", "PushConfig", "ServeConfig", "TrainConfig",
    "UndeclaredConfigError", "apply_overrides", "change_thresholds", "config_from_module",
    "describe_fields", "did_you_mean", "from_dict", "load_config_file", "parse_declaration",
    "replace_section", "to_dict", "valid_keys", "validate",
]
