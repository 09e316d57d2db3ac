"""Which models a server serves: version policies, model sources, `models.config`.

A model is a `ModelSource`: its name, its base path (integer version
folders) and a `VersionPolicy` choosing which versions on disk to serve
(TF Serving's `latest` N, `all` or `specific`), plus version labels. Sources
come from one `--model_base_path` or from a `models.config`
(`ModelServerConfig` text format, `read_model_config`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Tuple

import grpc
import tensorflow as tf
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2


@dataclass(frozen=True)
class VersionPolicy:
    """Which of the versions on disk to serve (TF Serving's ServableVersionPolicy)."""
    kind: str = "latest"              # latest | all | specific
    num_versions: int = 1             # latest
    versions: Tuple[int, ...] = ()    # specific

    def __post_init__(self):
        if self.kind not in ("latest", "all", "specific"):
            raise ValueError(f"unknown version policy {self.kind!r}")
        if self.kind == "latest" and self.num_versions < 1:
            raise ValueError("latest: num_versions must be >= 1")
        if self.kind == "specific" and not self.versions:
            raise ValueError("specific: give at least one version")

    @classmethod
    def parse(cls, text: str) -> "VersionPolicy":
        """Parses `latest`, `latest:N`, `all` or `specific:1,2`."""
        kind, _, arg = text.strip().partition(":")
        try:
            if kind == "latest":
                return cls("latest", int(arg) if arg else 1)
            if kind == "all" and not arg:
                return cls("all")
            if kind == "specific":
                return cls("specific", versions=tuple(sorted({int(v) for v in arg.split(",")})))
        except ValueError as e:
            raise ValueError(f"bad version policy {text!r}: {e}") from None
        raise ValueError(f"bad version policy {text!r}; use latest:N, all or specific:1,2")

    @classmethod
    def from_proto(cls, policy) -> "VersionPolicy":
        """From a `FileSystemStoragePathSourceConfig.ServableVersionPolicy`."""
        choice = policy.WhichOneof("policy_choice")
        if choice == "all":
            return cls("all")
        if choice == "specific":
            return cls("specific", versions=tuple(sorted(set(policy.specific.versions))))
        if choice == "latest":
            return cls("latest", policy.latest.num_versions or 1)
        return cls()

    def select(self, versions) -> set:
        """The versions to serve among those on disk."""
        versions = sorted(versions)
        if self.kind == "all":
            return set(versions)
        if self.kind == "specific":
            return set(versions) & set(self.versions)
        return set(versions[-self.num_versions:])

    def __str__(self) -> str:
        if self.kind == "latest":
            return f"latest:{self.num_versions}"
        if self.kind == "specific":
            return "specific:" + ",".join(map(str, self.versions))
        return "all"


@dataclass(frozen=True)
class ModelSource:
    """One served model: its name, base path, version policy and labels."""
    name: str
    base_path: str
    policy: VersionPolicy = VersionPolicy()
    labels: Mapping[str, int] = field(default_factory=dict)


@dataclass
class VersionStatus:
    """A version's state as GetModelStatus reports it."""
    state: str                        # START | LOADING | AVAILABLE | UNLOADING | END
    error_code: grpc.StatusCode = grpc.StatusCode.OK
    error_message: str = ""


def read_model_config(path: str) -> List[ModelSource]:
    """Parses a `models.config` (ModelServerConfig text format).

    Relative base paths are taken relative to the config file's folder.
    Raises:
      ValueError: unparsable text, a custom config, duplicate or missing
        names, missing base paths, or a platform other than tensorflow.
    """
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            text = f.read()
    except tf.errors.OpError as e:
        raise ValueError(f"cannot read the model config {path}: {e.message}") from None
    config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise ValueError(f"{path}: {e}") from None
    return sources_from_config(config, path, os.path.dirname(os.path.abspath(path)))


def sources_from_config(config: model_server_config_pb2.ModelServerConfig, path: str = "config",
                        base_dir: Optional[str] = None) -> List[ModelSource]:
    """The models a `ModelServerConfig` lists.

    Args:
      config: the parsed config.
      path: names the config in error messages.
      base_dir: relative base paths are taken relative to it (default: the
        working directory).
    Raises:
      ValueError: as `read_model_config`.
    """
    base_dir = base_dir or os.getcwd()
    if config.WhichOneof("config") == "custom_model_config":
        raise ValueError(f"{path}: custom_model_config is not supported")
    sources, seen = [], set()
    for entry in config.model_config_list.config:
        if not entry.name:
            raise ValueError(f"{path}: a model config has no name")
        if entry.name in seen:
            raise ValueError(f"{path}: model {entry.name!r} is configured twice")
        if not entry.base_path:
            raise ValueError(f"{path}: model {entry.name!r} has no base_path")
        if entry.model_platform not in ("", "tensorflow"):
            raise ValueError(f"{path}: model {entry.name!r}: platform "
                             f"{entry.model_platform!r} is not supported")
        seen.add(entry.name)
        base = entry.base_path
        if "://" not in base and not os.path.isabs(base):
            base = os.path.join(base_dir, base)
        policy = (VersionPolicy.from_proto(entry.model_version_policy)
                  if entry.HasField("model_version_policy") else VersionPolicy())
        sources.append(ModelSource(entry.name, base, policy, dict(entry.version_labels)))
    return sources
