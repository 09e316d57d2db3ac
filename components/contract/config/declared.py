"""What a stage may read of the config: `DeclaredConfig`.

A stage sees the config through a `DeclaredConfig`: only the sections (or
`section.key`s) its DAG entry declares can be read, so the stage's cache key,
built from the same declaration, covers everything the stage reads. The
declared values are copied in as plain attributes; `__getattr__` runs only
for a name that is not one, to say what to declare.
"""
from __future__ import annotations

from typing import Any, Sequence

from components.contract.config.sections import (
    SECTIONS,
    ConfigError,
    PipelineConfig,
    _field_types,
    replace_section,
    to_dict,
)


class UndeclaredConfigError(AttributeError):
    """A stage read a config section or key that its DAG entry does not declare."""


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
    """One section of which only some keys are declared: those keys are its attributes."""

    def __init__(self, section: Any, name: str, keys: frozenset, stage: str):
        self.__dict__.update({k: getattr(section, k) for k in keys})
        self._name, self._keys, self._stage = name, keys, stage

    def __getattr__(self, key: str) -> Any:
        # Only reached for a key that is not an attribute: explain the miss.
        if key.startswith("_"):
            raise AttributeError(key)
        raise UndeclaredConfigError(
            f"{self._stage} read config key {self._name}.{key}, which its DAG entry "
            f"does not declare (declared in [{self._name}]: {', '.join(sorted(self._keys))})"
            f"; add it to the stage's config in pipeline/dag.py")

    def to_dict(self) -> dict:
        return {k: to_dict(self.__dict__[k]) for k in sorted(self._keys)}


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
        # The declared sections are plain attributes; nothing else is.
        for section, keys in self._declared.items():
            value = getattr(config, section)
            self.__dict__[section] = (value if keys is None
                                      else _DeclaredSection(value, section, keys, stage))

    def replace_section(self, section: str, **changes) -> "DeclaredConfig":
        """The same view of a config whose `section` has `changes` (see `replace_section`)."""
        return DeclaredConfig(replace_section(self._config, section, **changes),
                              self._declaration, self._stage)

    @property
    def name(self) -> str:
        """The config's name (labels only; never part of a cache key)."""
        return self._config.name

    def __getattr__(self, section: str) -> Any:
        # Only reached for a section that is not an attribute: explain the miss.
        if section.startswith("_"):
            raise AttributeError(section)
        raise UndeclaredConfigError(
            f"{self._stage} read config section [{section}], which its DAG entry does not "
            f"declare (declared: {', '.join(sorted(self._declared)) or 'nothing'}); add it "
            "to the stage's config in pipeline/dag.py")

    def to_dict(self) -> dict:
        """The declared part of the config: what keys a stage's cache."""
        out = {}
        for section, keys in sorted(self._declared.items()):
            value = getattr(self._config, section)
            out[section] = (to_dict(value) if keys is None
                            else {k: to_dict(getattr(value, k)) for k in sorted(keys)})
        return out
