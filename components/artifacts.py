"""Artifacts: typed output folders with an `artifact.json`, published atomically."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

SCHEMA_VERSION = 1
ARTIFACT_FILE = "artifact.json"


class ArtifactError(RuntimeError):
    """An artifact folder that is missing, unpublished or of the wrong type."""


@dataclass(frozen=True)
class Artifact:
    """A published stage output.

    Attributes:
      type: `Examples`, `Encoder`, `Annotations`, `Vocabulary`, `Model`,
        `Evaluation`, `Blessing` or `PushedModel`.
      uri: the artifact folder.
      fingerprint: identifies the content (the producing execution's
        fingerprint and the artifact name); downstream caching keys on it.
      properties: type-specific facts (grid shape, metrics, version, ...).
      counts: record counts (seen / accepted / rejected / per split).
    """
    type: str
    uri: str
    fingerprint: str = ""
    producer: str = ""
    execution_id: int = 0
    properties: Mapping[str, Any] = field(default_factory=dict)
    counts: Mapping[str, Any] = field(default_factory=dict)

    def path(self, *parts: str) -> str:
        """A path inside the artifact folder."""
        return os.path.join(self.uri, *parts)

    @classmethod
    def load(cls, uri: str, expected_type: str | None = None) -> "Artifact":
        """Reads a published artifact; refuses unpublished (`.tmp-*`) folders."""
        if any(part.startswith(".tmp-") for part in os.path.normpath(uri).split(os.sep)):
            raise ArtifactError(f"{uri} is an unpublished (temporary) folder")
        meta_path = os.path.join(uri, ARTIFACT_FILE)
        if not os.path.exists(meta_path):
            raise ArtifactError(f"{uri} has no {ARTIFACT_FILE}: not a published artifact")
        with open(meta_path) as f:
            meta = json.load(f)
        if expected_type and meta.get("type") != expected_type:
            raise ArtifactError(f"{uri} is a {meta.get('type')}, expected {expected_type}")
        return cls(type=meta["type"], uri=uri, fingerprint=meta.get("fingerprint", ""),
                   producer=meta.get("producer", ""),
                   execution_id=int(meta.get("execution_id", 0)),
                   properties=meta.get("properties", {}), counts=meta.get("counts", {}))


def write_artifact_json(uri: str, *, type: str, producer: str, execution_id: int,
                        fingerprint: str, inputs: Mapping[str, str],
                        config: Mapping[str, Any], counts: Mapping[str, Any],
                        properties: Mapping[str, Any]) -> None:
    """Writes `artifact.json` into a (not yet published) artifact folder."""
    os.makedirs(uri, exist_ok=True)
    meta = {"type": type, "schema_version": SCHEMA_VERSION, "producer": producer,
            "execution_id": execution_id, "fingerprint": fingerprint,
            "inputs": dict(inputs), "config": dict(config), "counts": dict(counts),
            "properties": dict(properties)}
    tmp = os.path.join(uri, ARTIFACT_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(uri, ARTIFACT_FILE))


def fsync_tree(path: str) -> None:
    """Flushes every file under `path` to disk before an atomic publish."""
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
