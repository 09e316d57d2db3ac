"""Artifacts: typed output folders with an `artifact.json`, published atomically."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

SCHEMA_VERSION = 2
ARTIFACT_FILE = "artifact.json"
# How `artifact.json` writes a path inside the pipeline root: "${root}/Trainer/4/model".
# Read back against the root the artifact lies in now, so a copied or moved
# root reads its own files.
ROOT_PREFIX = "${root}"


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
      inputs: input name -> the artifact folder the producer read.
      files: path relative to `uri` -> {"size": bytes, "crc32c" (or "crc32"):
        8 hex digits} of every file the producer published; None for
        artifacts published before file lists were recorded.
    """
    type: str
    uri: str
    fingerprint: str = ""
    producer: str = ""
    execution_id: int = 0
    properties: Mapping[str, Any] = field(default_factory=dict)
    counts: Mapping[str, Any] = field(default_factory=dict)
    inputs: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, Mapping[str, Any]] | None = None

    def path(self, *parts: str) -> str:
        """A path inside the artifact folder."""
        return os.path.join(self.uri, *parts)

    @classmethod
    def load(cls, uri: str, expected_type: str | None = None) -> "Artifact":
        """Reads a published artifact; refuses unpublished (`.tmp-*`) folders.

        Paths the producer recorded inside the pipeline root (`${root}/...`)
        are resolved against the root `uri` lies in now; so are absolute
        paths under the root's former location in artifacts written before
        paths were recorded relative to the root.

        Args:
          uri: the artifact folder, `<root>/<Stage>/<execution_id>/<name>`.
          expected_type: refuse an artifact of another type.
        Returns:
          The artifact.
        Raises:
          ArtifactError: unpublished, missing `artifact.json`, or another type.
        """
        if any(part.startswith(".tmp-") for part in os.path.normpath(uri).split(os.sep)):
            raise ArtifactError(f"{uri} is an unpublished (temporary) folder")
        meta_path = os.path.join(uri, ARTIFACT_FILE)
        if not os.path.exists(meta_path):
            raise ArtifactError(f"{uri} has no {ARTIFACT_FILE}: not a published artifact")
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
        except ValueError as e:  # not JSON, or not UTF-8: a damaged file
            raise ArtifactError(f"{meta_path} is damaged: {e}") from None
        if expected_type and meta.get("type") != expected_type:
            raise ArtifactError(f"{uri} is a {meta.get('type')}, expected {expected_type}")
        root = artifact_root(uri)
        inputs = dict(meta.get("inputs", {}))
        # Absolute paths of an older artifact: moved along only when this folder is
        # where the runner published it (not a test's or a benchmark's own layout).
        laid_out = os.path.normpath(os.path.abspath(uri)).split(os.sep)[-3:-1] == [
            meta.get("producer"), str(meta.get("execution_id"))]
        former = former_root(inputs.values()) if laid_out else None
        former = former if former != root else None
        return cls(type=meta["type"], uri=uri, fingerprint=meta.get("fingerprint", ""),
                   producer=meta.get("producer", ""),
                   execution_id=int(meta.get("execution_id", 0)),
                   properties=from_portable(meta.get("properties", {}), root, former),
                   counts=meta.get("counts", {}),
                   inputs=from_portable(inputs, root, former), files=meta.get("files"))


def artifact_root(uri: str) -> str:
    """The pipeline root of an artifact folder `<root>/<Stage>/<execution_id>/<name>`."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(uri))))


def former_root(paths: Iterable[str]) -> str | None:
    """The root that absolute artifact paths of the `<root>/<Stage>/<id>/<name>` shape name.

    Args:
      paths: artifact folders as an older store or `artifact.json` recorded them.
    Returns:
      The first such root, or None when no path has that shape.
    """
    for path in paths:
        if not isinstance(path, str) or not os.path.isabs(path):
            continue
        parts = os.path.normpath(path).split(os.sep)
        if len(parts) >= 5 and parts[-2].isdigit():  # ["", ..., Stage, id, name]
            return os.sep.join(parts[:-3]) or os.sep
    return None


def _inside(path: str, root: str) -> bool:
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def to_portable(value: Any, root: str) -> Any:
    """`value` with every string that is an absolute path inside `root` written as `${root}/...`.

    Args:
      value: a JSON-like value (dicts and lists are walked).
      root: the pipeline root.
    Returns:
      The same structure; paths outside `root` and other strings unchanged.
    """
    if isinstance(value, Mapping):
        return {k: to_portable(v, root) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_portable(v, root) for v in value]
    if isinstance(value, str) and os.path.isabs(value) and "\n" not in value \
            and _inside(value, root):
        rel = os.path.relpath(os.path.normpath(value), os.path.normpath(root))
        return ROOT_PREFIX if rel == "." else f"{ROOT_PREFIX}/{rel.replace(os.sep, '/')}"
    return value


def from_portable(value: Any, root: str, former: str | None = None) -> Any:
    """The inverse of `to_portable`: `${root}/...` resolved against `root`.

    Args:
      value: a JSON-like value as `artifact.json` holds it.
      root: the pipeline root the artifact lies in now.
      former: where the root lay when absolute paths were recorded (older
        artifacts); paths under it are moved under `root`.
    Returns:
      The same structure with absolute paths.
    """
    if isinstance(value, Mapping):
        return {k: from_portable(v, root, former) for k, v in value.items()}
    if isinstance(value, list):
        return [from_portable(v, root, former) for v in value]
    if isinstance(value, str):
        if value == ROOT_PREFIX or value.startswith(ROOT_PREFIX + "/"):
            return os.path.join(root, *value[len(ROOT_PREFIX) + 1:].split("/"))
        if former and os.path.isabs(value) and _inside(value, former):
            return os.path.normpath(os.path.join(
                root, os.path.relpath(os.path.normpath(value), former)))
    return value


def write_artifact_json(artifact: Artifact, config: Mapping[str, Any],
                        root: str | None = None) -> None:
    """Writes `artifact.json` into a (not yet published) artifact folder.

    Args:
      artifact: what to record: its `uri` (the folder), `type`, `producer`,
        `execution_id`, `fingerprint`, `inputs` (input name -> artifact
        folder read), `counts`, `properties` (type-specific facts,
        JSON-serializable) and `files` (the folder's file list with sizes and
        checksums, or None).
      config: the resolved config the producer ran with.
      root: the pipeline root: paths inside it, in `inputs` and `properties`,
        are written relative to it (`${root}/...`) so that the root can move.
    """
    uri, files = artifact.uri, artifact.files
    os.makedirs(uri, exist_ok=True)
    inputs, properties = dict(artifact.inputs), dict(artifact.properties)
    if root is not None:
        inputs, properties = to_portable(inputs, root), to_portable(properties, root)
    meta = {"type": artifact.type, "schema_version": SCHEMA_VERSION,
            "producer": artifact.producer, "execution_id": artifact.execution_id,
            "fingerprint": artifact.fingerprint, "inputs": inputs, "config": dict(config),
            "counts": dict(artifact.counts), "properties": properties}
    if files is not None:
        meta["files"] = {k: dict(v) for k, v in files.items()}
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
