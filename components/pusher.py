"""Pusher: publishes the evaluated SavedModel as a new version for TensorFlow Serving.

What is pushed is exactly what was evaluated: the Exporter's SavedModel
folder, copied byte for byte. The Evaluation records the digest of the
export it scored (`components.contract.io_utils.tree_digest`); the Pusher refuses a
SavedModel whose digest differs, and checks the copy's digest before
publishing it.

The version folder `<serving_dir>/<model_name>/<version>/` is assembled in a
hidden sibling (`.tmp-*`, which TF Serving and `captioner serve` ignore) and
published with one atomic rename, so a polling server never sees half a
model. Old versions beyond `push.keep_versions` are first renamed out of the
way, then deleted. `models.config` and `batching_parameters.txt` for
`tensorflow_model_server` are rewritten atomically too. When the newest
version already holds the same bytes (a Pusher killed after publishing it,
before the runner published its artifact), a re-run reuses it instead of
pushing a duplicate version.
"""
from __future__ import annotations

import os
import shutil
import time

from components.contract import io_utils, schema
from serving.versions.batching_parameters import BatchingParameters

MODELS_CONFIG = "models.config"
BATCHING_PARAMETERS = "batching_parameters.txt"


def existing_versions(model_dir: str) -> list[int]:
    """Published integer versions in a model folder, ascending."""
    if not os.path.isdir(model_dir):
        return []
    return sorted(int(e) for e in os.listdir(model_dir)
                  if e.isdigit() and os.path.isdir(os.path.join(model_dir, e)))


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def models_config_text(serving_dir: str, model_names: list[str]) -> str:
    """`model_config_list` text for `--model_config_file`, validated by parsing it."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2
    config = model_server_config_pb2.ModelServerConfig()
    for name in model_names:
        entry = config.model_config_list.config.add()
        entry.name = name
        entry.base_path = os.path.abspath(os.path.join(serving_dir, name))
        entry.model_platform = "tensorflow"
        entry.model_version_policy.latest.num_versions = 1
    text = text_format.MessageToString(config)
    text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    return text


# Batch threads written into the pushed file: the serving host's CPUs are
# not known here, so a fixed count rather than the server's per-host default.
PUSHED_BATCH_THREADS = 4


def batching_parameters_text(max_batch_size: int, batch_timeout_micros: int) -> str:
    """`--batching_parameters_file` text: `BatchingParameters`' format and defaults, with
    `PUSHED_BATCH_THREADS` and TF Serving's padding of variable-length inputs."""
    params = BatchingParameters(max_batch_size=int(max_batch_size),
                                batch_timeout_micros=int(batch_timeout_micros),
                                num_batch_threads=PUSHED_BATCH_THREADS)
    return params.to_text() + "pad_variable_length_inputs: true\n"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def remove_leftovers(model_dir: str) -> None:
    """Removes the hidden folders a killed push left behind (`.tmp-*`, `.deleting-*`).

    A `.tmp-<version>-<pid>` folder whose pid is another live process on this
    machine is a concurrent push in progress, and is left alone.
    """
    for entry in os.listdir(model_dir):
        if entry.startswith(".tmp-"):
            pid = entry.rsplit("-", 1)[-1]
            if pid.isdigit() and int(pid) != os.getpid() and _pid_alive(int(pid)):
                continue
        if entry.startswith((".tmp-", ".deleting-")):
            shutil.rmtree(os.path.join(model_dir, entry), ignore_errors=True)


def pushed_digest(version_dir: str) -> str | None:
    """The `tree_digest` of a published version folder, or None when it cannot be read."""
    try:
        return io_utils.tree_digest(version_dir)
    except OSError:
        return None


def publish_version(model_dir: str, build, keep_versions: int) -> tuple[int, str]:
    """Builds a new version with `build(tmp_path)` and publishes it atomically.

    Args:
      model_dir: `<serving_dir>/<model_name>`.
      build: writes the SavedModel into the path it is given.
      keep_versions: how many published versions to keep (the newest).
    Returns:
      (version, path).
    """
    os.makedirs(model_dir, exist_ok=True)
    remove_leftovers(model_dir)
    version = max(existing_versions(model_dir), default=0) + 1
    tmp = os.path.join(model_dir, f".tmp-{version}-{os.getpid()}")
    try:
        build(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    from components.contract.artifacts import fsync_tree
    fsync_tree(tmp)
    final = os.path.join(model_dir, str(version))
    while os.path.exists(final):  # a concurrent pusher took it
        version += 1
        final = os.path.join(model_dir, str(version))
    os.rename(tmp, final)
    for old in existing_versions(model_dir)[:-max(1, keep_versions)]:
        trash = os.path.join(model_dir, f".deleting-{old}")
        os.rename(os.path.join(model_dir, str(old)), trash)
        shutil.rmtree(trash, ignore_errors=True)
    return version, final


def _copy_exact(source: str, digest: str):
    """A `publish_version` build step: copies `source` and checks the copy's digest."""
    def build(tmp: str) -> None:
        shutil.copytree(source, tmp)
        copied = io_utils.tree_digest(tmp)
        if copied != digest:
            raise PushError(f"the copy of {source} has digest {copied[:12]}, not the evaluated "
                            f"{digest[:12]} (the disk or another process changed it): nothing "
                            "pushed; re-run the Pusher")
    return build


class PushError(RuntimeError):
    """The bytes about to be pushed are not the bytes that were evaluated."""


def run(ctx) -> dict:
    """Publishes the evaluated SavedModel when blessed; otherwise pushes nothing and says why."""
    cfg = ctx.config.push
    log = ctx.log
    blessing = ctx.inputs["blessing"]
    if not blessing.properties.get("blessed"):
        reasons = blessing.properties.get("reasons", [])
        log("model NOT blessed, nothing pushed: " + "; ".join(reasons))
        return {"pushed_model": {"counts": {"pushed": 0},
                                 "properties": {"pushed": False, "reasons": reasons}}}
    serving, evaluation = ctx.inputs["serving_model"], ctx.inputs["evaluation"]
    source = serving.path(serving.properties.get("saved_model", schema.SAVED_MODEL_DIR))
    evaluated = evaluation.properties.get("export_digest")
    digest = io_utils.tree_digest(source)
    if not evaluated or digest != evaluated:
        raise PushError(f"the SavedModel {source} (digest {digest[:12]}) is not the one the "
                        f"Evaluation {evaluation.uri} scored (digest {str(evaluated)[:12]}): "
                        "nothing pushed; re-run the Exporter, Evaluator and Pusher together")
    serving_dir = os.path.abspath(cfg.serving_dir or os.path.join(ctx.root, "serving"))
    model_dir = os.path.join(serving_dir, cfg.model_name)
    start = time.time()
    newest = existing_versions(model_dir)[-1:]
    if newest and pushed_digest(os.path.join(model_dir, str(newest[0]))) == digest:
        version, path = newest[0], os.path.join(model_dir, str(newest[0]))
        remove_leftovers(model_dir)
        log(f"version {version} already holds this SavedModel (pushed by an "
            "interrupted run): not pushing it again")
    else:
        version, path = publish_version(model_dir, _copy_exact(source, digest),
                                        cfg.keep_versions)
    names = sorted(e for e in os.listdir(serving_dir)
                   if os.path.isdir(os.path.join(serving_dir, e)) and not e.startswith("."))
    _atomic_write(os.path.join(serving_dir, MODELS_CONFIG), models_config_text(serving_dir, names))
    _atomic_write(os.path.join(serving_dir, BATCHING_PARAMETERS),
                  batching_parameters_text(cfg.max_batch_size, cfg.batch_timeout_micros))
    log(f"pushed version {version} ({digest[:12]}, the evaluated SavedModel) to "
        f"{path} in {time.time() - start:.1f}s")
    return {"pushed_model": {
        "counts": {"pushed": 1},
        "properties": {"pushed": True, "version": version, "path": path, "digest": digest,
                       "serving_dir": serving_dir, "model_name": cfg.model_name,
                       "model_uri": serving.properties.get("model_uri"),
                       "serving_model_uri": serving.uri,
                       "evaluation_uri": evaluation.uri,
                       "decoding": serving.properties.get("decoding"),
                       "models_config": os.path.join(serving_dir, MODELS_CONFIG),
                       "external_paths": [path]}}}
