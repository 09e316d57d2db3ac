"""Artifact integrity: file lists with sizes and checksums, their checks, damaged reads.

At publish the runner records every file of an artifact folder in its
`artifact.json` (`files`: relative path -> size and CRC-32C). A cache hit
compares the sizes (a `stat` per file); `--verify` also recomputes the
checksums. A stage that reads a damaged record (TensorFlow's DataLossError,
Beam's TFRecord errors, a parse failure) fails with one line naming the
artifact, the file and the command that rebuilds it (`damaged_read_message`).
"""
from __future__ import annotations

import os
import re
import shlex
import stat
import zlib
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from components.contract.artifacts import ARTIFACT_FILE, Artifact, ArtifactError

_CHUNK = 1 << 20


def _checksum_function() -> tuple[str, Callable[[int, bytes], int]]:
    """(name, extend(crc, data)) of the fastest checksum available: CRC-32C, else zlib's CRC-32."""
    try:
        import google_crc32c
        return "crc32c", google_crc32c.extend
    except ImportError:
        pass
    try:
        import crc32c
        return "crc32c", lambda crc, data: crc32c.crc32c(data, crc)
    except ImportError:
        pass
    return "crc32", lambda crc, data: zlib.crc32(data, crc)


CHECKSUM, _extend = _checksum_function()


def file_checksum(path: str, algorithm: str = CHECKSUM) -> str | None:
    """8 hex digits of a file's `algorithm` (`crc32c` or `crc32`); None when unavailable."""
    if algorithm == CHECKSUM:
        extend = _extend
    elif algorithm == "crc32":
        extend = lambda crc, data: zlib.crc32(data, crc)  # noqa: E731
    else:
        return None
    crc = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            crc = extend(crc, chunk)
    return f"{crc & 0xFFFFFFFF:08x}"


def file_list(folder: str) -> dict[str, dict]:
    """Every regular file under an artifact folder: relative path -> size and checksum.

    Args:
      folder: the (not yet published) artifact folder.
    Returns:
      `{"train/x.tfrecord": {"size": 1234, "crc32c": "0a1b2c3d"}, ...}`, sorted;
      `artifact.json` itself (written after) is not listed.
    """
    listed = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            if rel in (ARTIFACT_FILE, ARTIFACT_FILE + ".tmp"):
                continue
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                continue  # links and the like: nothing of their own to check
            listed[rel] = {"size": st.st_size, CHECKSUM: file_checksum(path)}
    return listed


@dataclass(frozen=True)
class Damage:
    """A file of an artifact that failed a check.

    Attributes:
      uri: the artifact folder.
      file: the file, relative to `uri`.
      check: `size` or `crc32c`/`crc32`; empty for an `artifact.json` that
        is missing or cannot be read.
      detail: what was found, e.g. "is 512 bytes, 1024 recorded".
    """
    uri: str
    file: str
    check: str
    detail: str

    @property
    def path(self) -> str:
        return os.path.join(self.uri, *self.file.split("/"))

    def __str__(self) -> str:
        return f"{self.path} {self.detail}" + (f" ({self.check} check)" if self.check else "")


def check_files(uri: str, files: Mapping[str, Mapping] | None, checksums: bool = False,
                only: str | None = None) -> Damage | None:
    """The first listed file that is missing, or has another size or (`checksums`) checksum.

    Sizes are compared for every file before any checksum is computed, so a
    truncated file is found without reading the others.

    Args:
      uri: the artifact folder.
      files: `Artifact.files` (None: published before file lists, nothing to check).
      checksums: recompute the checksums too (reads every file in full).
      only: check this one file (relative path) only.
    Returns:
      The damage, or None when every check passes.
    """
    if not files:
        return None
    entries = [(rel, e) for rel, e in sorted(files.items()) if only is None or rel == only]
    for rel, entry in entries:
        path = os.path.join(uri, *rel.split("/"))
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            return Damage(uri, rel, "size", "is missing")
        if size != entry.get("size"):
            return Damage(uri, rel, "size", f"is {size} bytes, {entry.get('size')} recorded")
    if checksums:
        for rel, entry in entries:
            algorithm = next((a for a in ("crc32c", "crc32") if a in entry), None)
            actual = file_checksum(os.path.join(uri, *rel.split("/")), algorithm) \
                if algorithm else None
            if actual is not None and actual != entry[algorithm]:
                return Damage(uri, rel, algorithm,
                              f"has {algorithm} {actual}, {entry[algorithm]} recorded")
    return None


def check_artifact(uri: str, checksums: bool = False) -> tuple[Artifact | None, Damage | None]:
    """Loads an artifact and checks its files.

    Returns:
      (artifact or None when it cannot be loaded, damage or None).
    """
    try:
        art = Artifact.load(uri)
    except ArtifactError as e:
        if not os.path.exists(os.path.join(uri, ARTIFACT_FILE)):
            return None, Damage(uri, ARTIFACT_FILE, "", "is missing")
        # "<path> is damaged: <JSON error>", "<uri> is a Model, expected ...": the reason.
        return None, Damage(uri, ARTIFACT_FILE, "", f"cannot be read ({str(e).split(': ', 1)[-1]})")
    return art, check_files(art.uri, art.files, checksums)


def outputs_problem(outputs: Mapping[str, Mapping], checksums: bool = False) -> str | None:
    """What keeps an execution's published outputs from being reused, or None when intact.

    Args:
      outputs: output name -> metadata store row (`MetadataStore.outputs`).
      checksums: recompute every file's checksum (else sizes only: a `stat` each).
    Returns:
      One line: the output, and the file that failed which check (or the
      external path that is gone).
    """
    for name, row in sorted(outputs.items()):
        art, damage = check_artifact(row["uri"], checksums)
        if damage is not None:
            return f"its {name} is damaged: {damage}"
        for path in art.properties.get("external_paths", []):
            if not os.path.exists(path):
                return f"its {name} names {path}, which is gone"
    return None


def verify_artifacts(rows: Sequence[Mapping]) -> dict[int, dict]:
    """Checks sizes and checksums of every artifact the metadata store lists.

    Args:
      rows: `MetadataStore.artifacts()`.
    Returns:
      artifact id -> {"status": "ok" | "damaged" | "unchecked" (no file list:
      published before they were recorded) | "missing" (its folder was
      removed), "problem": text or None}.
    """
    results = {}
    for row in rows:
        if not os.path.isdir(row["uri"]):  # an execution pruned by hand: nothing to damage
            results[row["id"]] = {"status": "missing", "problem": None}
            continue
        art, damage = check_artifact(row["uri"], checksums=True)
        if damage is not None:
            results[row["id"]] = {"status": "damaged", "problem": str(damage)}
        elif art.files is None:
            results[row["id"]] = {"status": "unchecked", "problem": None}
        else:
            results[row["id"]] = {"status": "ok", "problem": None}
    return results


def add_verification(info: dict, checked: Mapping[int, Mapping]) -> None:
    """Adds `verify_artifacts` results to `runner.inspect`'s answer, in place.

    Each output event gets `verify` ({"status", "problem"}); `info["verify"]`
    counts the statuses.
    """
    for x in info["executions"]:
        for e in x["outputs"]:
            e["verify"] = dict(checked.get(e["artifact_id"],
                                           {"status": "unchecked", "problem": None}))
    info["verify"] = {k: sum(1 for v in checked.values() if v["status"] == k)
                      for k in ("ok", "damaged", "unchecked", "missing")}


# Errors that say for sure that bytes read were damaged (TensorFlow's record
# reader, Beam's TFRecord source), as exception text after a library wrapped them.
_DAMAGE_TEXTS = ("truncated record at", "corrupted record at", "Not a valid TFRecord",
                 "DataLossError")
# Parse failures: damaged data, or data that was never of that format.
_PARSE_ERRORS = ("DecodeError", "BadZipFile", "JSONDecodeError")
_OP_CONTEXT = re.compile(r"\{\{.*?\}\}|\[\[.*?\]\]|\[Op:.*?\]|\bname:\s*$", re.S)
_HEX_DUMP = re.compile(r":\s*b?'?[0-9a-f]{16,}'?")


@dataclass(frozen=True)
class DamagedRead:
    """What an exception says about damaged data a stage read.

    Attributes:
      reason: the reader's words, one line ("truncated record at 75586").
      file: the file, when the reader named it (`io_utils.read_records`).
      certain: the reader saw damage (a record's length or checksum); False
        for a parse failure, which may also be data of the wrong format.
    """
    reason: str
    file: str | None
    certain: bool


def damaged_read(exc: BaseException | None) -> DamagedRead | None:
    """The damaged-data error in `exc` or the exceptions it chains, or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        name = type(exc).__name__
        text = getattr(exc, "message", None) or str(exc)
        certain = name == "DataLossError" or any(m in text for m in _DAMAGE_TEXTS)
        if certain or name in _PARSE_ERRORS:
            reason = _HEX_DUMP.sub("", " ".join(_OP_CONTEXT.sub("", text).split()))
            if name not in reason:
                reason = f"{name}: {reason}"
            file = getattr(exc, "damaged_file", None)
            return DamagedRead(reason[:300], file, certain)
        exc = exc.__cause__ or exc.__context__
    return None


def _rebuild_stages(specs: Sequence, producer: str, stage: str) -> list[str]:
    """`producer`, `stage` and every stage on a path between them, in DAG order."""
    reads = {s.name: {up for up, _ in s.inputs.values()} for s in specs}

    def upstream(name: str) -> set[str]:
        found, frontier = set(), [name]
        while frontier:
            for up in reads.get(frontier.pop(), ()):
                if up not in found:
                    found.add(up)
                    frontier.append(up)
        return found

    feeding_stage = upstream(stage)
    return [s.name for s in specs if s.name in (producer, stage)
            or (s.name in feeding_stage and producer in upstream(s.name))]


def damaged_read_message(stage: str, inputs: Mapping[str, Artifact], read: DamagedRead,
                         root: str, specs: Sequence, work_dir: str) -> str | None:
    """The one line that replaces a stage's traceback when it read damaged data.

    Finds the damaged input: the file the reader named, else the first input
    file that fails its size or checksum check (reading the inputs in full).

    Args:
      stage: the failed stage.
      inputs: its input artifacts.
      read: `damaged_read` of its exception.
      root: the pipeline root (for the command).
      specs: the DAG (to list the stages the command re-runs).
      work_dir: the stage's resume folder.
    Returns:
      The message, or None for a parse failure not traced to a damaged input
      (then the original error says more).
    """
    found = None  # (input name, artifact, relative file, damage or None)
    if read.file:
        for in_name, art in inputs.items():
            rel = os.path.relpath(os.path.abspath(read.file), os.path.abspath(art.uri))
            if not rel.startswith(os.pardir):
                rel = rel.replace(os.sep, "/")
                found = (in_name, art, rel, check_files(art.uri, art.files, True, only=rel))
                break
    if found is None:
        for in_name, art in inputs.items():
            damage = check_files(art.uri, art.files, checksums=True)
            if damage is not None:
                found = (in_name, art, damage.file, damage)
                break
    where = f" in {read.file}" if read.file else ""
    if found is None:
        if not read.certain:
            return None
        if read.file and os.path.abspath(read.file).startswith(os.path.abspath(work_dir)):
            return (f"{stage} failed: its resume state is damaged ({read.reason}{where}): "
                    f"remove {work_dir} and run it again")
        return (f"{stage} failed reading damaged data ({read.reason}{where}), and none of "
                f"its input artifacts ({', '.join(sorted(inputs)) or 'none'}) fails its size "
                f"or checksum check: the damage is in its resume state (remove {work_dir} "
                f"to start it over) or in a file its config names")
    in_name, art, rel, damage = found
    what = (f"{os.path.join(art.uri, *rel.split('/'))} " +
            (f"{damage.detail} ({damage.check} check, {read.reason})" if damage
             else f"cannot be read ({read.reason})"))
    stages = ",".join(_rebuild_stages(specs, art.producer, stage))
    return (f"{stage} failed: input {in_name} ({art.type} of {art.producer} execution "
            f"{art.execution_id}) is damaged: {what}; rebuild it with: captioner run --root "
            f"{shlex.quote(root)} --stages {stages} --no-cache")
