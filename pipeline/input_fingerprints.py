"""Content fingerprints of what a stage reads from outside the pipeline root.

A config key that names a file or folder (`components.contract.config_paths.path_keys_read`:
`data.captions_json`, `data.images_dir`, `data.instances_json`, `data.tfds_data_dir`,
`encoder.weights`, `train.init_model`) keys the cache of the stages that
declare it with a record of the path's content, not only with the path:

- a file: its size and the SHA-256 of its bytes when it is at most
  `HASH_LIMIT` bytes (64 MiB), else its size and modification time (so
  `touch` re-runs a stage that reads a large file, and keeps the cache of
  one that reads a small one);
- a folder: a manifest of every file below it (following links): relative
  name, size and modification time, hashed, with the file count and total
  size;
- `data.tfds_data_dir`: the dataset's folder in it, `<dir>/<tfds_name>`, as
  a folder; an empty value means TFDS's default folder (`$TFDS_DATA_DIR`,
  else `~/tensorflow_datasets`). A dataset that TFDS downloads and prepares
  during a run is absent before it and present after, so the next run runs
  ExampleGen once more;
- a path that does not exist: recorded as missing.

The records of an execution are kept in the metadata store, so that a stage
that runs because one of them changed can say which (`describe_changes`).
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from typing import Mapping, Sequence

from components.contract.config import PipelineConfig, parse_declaration
from components.contract.config_paths import path_keys_read

# Files up to this size are hashed; larger ones are known by size and mtime.
HASH_LIMIT = 64 * 2 ** 20
_CHUNK = 2 ** 20


def tfds_dataset_dir(config: PipelineConfig) -> str:
    """The folder of `data.tfds_name` in `data.tfds_data_dir` (TFDS's default when empty).

    Args:
      config: a resolved config.
    Returns:
      An absolute path, e.g. `~/tensorflow_datasets/coco_captions` expanded;
      a builder config or version in the name (`name/config:1.0.0`) is
      dropped, since the dataset's folder holds them all.
    """
    data_dir = (config.data.tfds_data_dir or os.environ.get("TFDS_DATA_DIR")
                or os.path.join("~", "tensorflow_datasets"))
    dataset = config.data.tfds_name.split(":")[0].split("/")[0]
    return os.path.abspath(os.path.join(os.path.expanduser(data_dir), dataset))


def _declares(declared: Mapping[str, frozenset | None], key: str) -> bool:
    section, name = key.split(".")
    return section in declared and (declared[section] is None or name in declared[section])


def stage_paths(config_sections: Sequence[str], config: PipelineConfig) -> dict[str, str]:
    """The outside paths a stage reads: each path key it declares that the config uses.

    Args:
      config_sections: the stage's declared config (`StageSpec.config_sections`);
        a stage can read only declared keys, so only those count.
      config: the resolved config.
    Returns:
      Config key -> absolute path, empty values left out (except
      `data.tfds_data_dir`, see `tfds_dataset_dir`).
    """
    declared = parse_declaration(config_sections)
    paths = {}
    for _, key, _, value in path_keys_read(config):
        if not _declares(declared, key):
            continue
        if key == "data.tfds_data_dir":
            paths[key] = tfds_dataset_dir(config)
        elif value:
            paths[key] = os.path.abspath(value)
    return paths


def _file_record(path: str, st: os.stat_result) -> dict:
    if st.st_size > HASH_LIMIT:
        return {"type": "file", "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return {"type": "file", "size": st.st_size, "sha256": digest.hexdigest()}


def _folder_record(path: str) -> dict:
    manifest = hashlib.sha256()
    files = total = 0
    seen = set()  # folders already walked (a link loop ends here)
    for dirpath, dirnames, filenames in os.walk(path, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
                size, mtime = st.st_size, st.st_mtime_ns
            except OSError:  # a dangling link: its name still counts
                size, mtime = -1, 0
            rel = os.path.relpath(full, path)
            manifest.update(json.dumps([rel, size, mtime]).encode() + b"\n")
            files += 1
            total += max(size, 0)
    return {"type": "dir", "files": files, "bytes": total, "manifest": manifest.hexdigest()}


def path_record(path: str) -> dict:
    """A record of the content at `path` (the rules are in the module docstring).

    Args:
      path: a file or folder (it need not exist).
    Returns:
      A JSON-able dict with `path` and `type` (`file`, `dir` or `missing`)
      and, for a file, `size` plus `sha256` or `mtime_ns`; for a folder,
      `files`, `bytes` and `manifest`.
    """
    try:
        st = os.stat(path)
    except OSError:
        return {"path": path, "type": "missing"}
    if stat.S_ISDIR(st.st_mode):
        return {"path": path, **_folder_record(path)}
    return {"path": path, **_file_record(path, st)}


def stage_records(config_sections: Sequence[str], config: PipelineConfig) -> dict[str, dict]:
    """`path_record` of each outside path a stage reads (`stage_paths`).

    Args:
      config_sections: the stage's declared config.
      config: the resolved config.
    Returns:
      Config key -> record; empty when the stage reads nothing outside the root.
    """
    return {key: path_record(path)
            for key, path in sorted(stage_paths(config_sections, config).items())}


def content_key(record: Mapping) -> dict:
    """What of a record keys the cache: everything but the path.

    The path string is in the declared config already; leaving the resolved
    path out keeps the cache when only the working folder differs.

    Args:
      record: a `path_record`.
    Returns:
      The record without `path`.
    """
    return {k: v for k, v in record.items() if k != "path"}


def _change(before: Mapping, after: Mapping) -> str:
    """How `after` differs from `before` (two records of one key), in words."""
    kinds = {"file": "a file", "dir": "a folder", "missing": "missing"}
    if before.get("type") != after.get("type"):
        return f"was {kinds.get(before.get('type'), '?')}, now {kinds.get(after.get('type'), '?')}"
    moved = (f", now at {after['path']}" if before.get("path") != after.get("path") else "")
    if after["type"] == "dir":
        if (before["files"], before["bytes"]) != (after["files"], after["bytes"]):
            return (f"{before['files']} -> {after['files']} files, "
                    f"{before['bytes']} -> {after['bytes']} bytes{moved}")
        return f"same {after['files']} files and size, names or modification times differ{moved}"
    if after["type"] == "missing":
        return f"still missing{moved}"
    size = (f"size {before['size']} -> {after['size']} bytes" if before["size"] != after["size"]
            else "same size")
    if "sha256" in before and "sha256" in after:
        return f"{size}, content differs{moved}"
    return f"{size}, modified{moved}"


def describe_changes(before: Mapping[str, Mapping], after: Mapping[str, Mapping]) -> dict[str, str]:
    """The keys whose content differs between two sets of records, each with how.

    Args:
      before: key -> record of an earlier execution.
      after: key -> record now.
    Returns:
      Key -> a description such as `size 12345 -> 6000 bytes, content
      differs`, in key order; empty when every content key is the same.
    """
    changes = {}
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old is None or new is None:
            changes[key] = "not read before" if old is None else "no longer read"
        elif content_key(old) != content_key(new):
            changes[key] = _change(old, new)
    return changes


def changes_since(store, stage: str, base: str, records: Mapping[str, Mapping]) -> list[dict]:
    """What changed outside the root since the stage's last execution with the same base.

    Args:
      store: the `MetadataStore` (its `external_inputs` records).
      stage: the stage name.
      base: the stage's fingerprint without its outside inputs (config, code
        and input artifacts).
      records: `stage_records` now.
    Returns:
      One `{"key", "since_execution", "change"}` per changed key, compared
      with the newest complete execution of `stage` with fingerprint base
      `base`; empty when there is none or nothing changed.
    """
    for execution_id, recorded in store.external_inputs(stage):
        if recorded.get("base") != base:
            continue
        changes = describe_changes(recorded.get("inputs", {}), records)
        return [{"key": key, "since_execution": execution_id, "change": change}
                for key, change in changes.items()]
    return []


def changes_line(changes: Sequence[Mapping]) -> str:
    """`changes_since` as one log phrase.

    Args:
      changes: `changes_since`'s list.
    Returns:
      `data.captions_json changed since execution 1 (size 12345 -> 6000
      bytes, content differs)`, one such part per key joined by `; `; empty
      when nothing changed.
    """
    return "; ".join(f"{c['key']} changed since execution {c['since_execution']} ({c['change']})"
                     for c in changes)
