"""Pusher: exports a blessed model as a new SavedModel version for TensorFlow Serving.

The version folder `<serving_dir>/<model_name>/<version>/` is assembled in a
hidden sibling (`.tmp-*`, which TF Serving and `captioner serve` ignore) and
published with one atomic rename, so a polling server never sees half a
model. Old versions beyond `push.keep_versions` are first renamed out of the
way, then deleted. `models.config` and `batching_parameters.txt` for
`tensorflow_model_server` are rewritten atomically too.

The exported graph decodes exactly as the Evaluator measured and blessed:
beam size, maximum length and length normalization come from the
Evaluation artifact's `decoding` property, not from a second set of keys.

Before a version is published, `serving.infra_validator` checks in a
separate process that TF Serving could load and run it (session-based
loader, warmup requests by tensor name, only stock TensorFlow ops, no
Python callbacks); a version that fails is not published and the Pusher
reports why. Each version records what it was exported from, and the
validation report (ops used, TensorFlow version that wrote it), in
`assets.extra/captioner_push.json`, which TF Serving ignores. When the
newest version already holds the same model, vocabulary and export settings
(a Pusher killed after publishing it, before the runner published its
artifact), a re-run reuses it instead of pushing a duplicate version.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

from components import schema

MODELS_CONFIG = "models.config"
BATCHING_PARAMETERS = "batching_parameters.txt"
PUSH_RECORD = os.path.join("assets.extra", "captioner_push.json")


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


def batching_parameters_text(max_batch_size: int, batch_timeout_micros: int,
                             num_batch_threads: int = 4, max_enqueued_batches: int = 100) -> str:
    """`--batching_parameters_file` text (the batching protos are not shipped: plain text)."""
    return (f"max_batch_size {{ value: {int(max_batch_size)} }}\n"
            f"batch_timeout_micros {{ value: {int(batch_timeout_micros)} }}\n"
            f"num_batch_threads {{ value: {int(num_batch_threads)} }}\n"
            f"max_enqueued_batches {{ value: {int(max_enqueued_batches)} }}\n"
            "pad_variable_length_inputs: true\n")


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


def pushed_from(version_dir: str) -> dict | None:
    """What a version was exported from (its `PUSH_RECORD`), or None."""
    try:
        with open(os.path.join(version_dir, PUSH_RECORD), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
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
    build(tmp)
    from components.artifacts import fsync_tree
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


def blessed_decoding(evaluation) -> dict:
    """The decoding settings the Evaluator measured (`beam_size`, `max_length`, `length_normalization`).

    Args:
      evaluation: the Evaluation artifact.
    Returns:
      The settings, as keyword arguments of `serving.export.export_saved_model`.
    """
    decoding = evaluation.properties.get("decoding")
    keys = ("beam_size", "max_length", "length_normalization")
    if not isinstance(decoding, dict) or set(keys) - set(decoding):
        raise RuntimeError(f"{evaluation.uri} does not record the decoding settings it "
                           "measured: re-run the Evaluator (`--stages Evaluator,Pusher`)")
    return {"beam_size": int(decoding["beam_size"]), "max_length": int(decoding["max_length"]),
            "length_normalization": float(decoding["length_normalization"])}


def _export(ctx, path: str, record: dict) -> None:
    """Writes the SavedModel version folder `path` and its `PUSH_RECORD`."""
    import keras
    import models.encoder  # noqa: F401  (registers the custom layers)
    import models.show_attend_tell  # noqa: F401
    from serving.export import export_saved_model
    from tqdm import tqdm
    cfg = ctx.config.push
    # Three steps of seconds to minutes each: a bar that names the one running.
    with tqdm(total=3, desc="Pusher", unit="step", file=sys.stderr, leave=False) as bar:
        bar.set_postfix_str("load")
        decoder = keras.saving.load_model(schema.model_file(ctx.inputs["model"].uri))
        encoder = keras.saving.load_model(ctx.inputs["encoder"].path(schema.ENCODER_FILE))
        vocabulary = schema.read_vocabulary(ctx.inputs["vocabulary"].uri)
        bar.update(1)
        bar.set_postfix_str("export SavedModel")
        export_saved_model(path, encoder, decoder, vocabulary, **record["export"]["decoding"],
                           model_name=cfg.model_name,
                           num_warmup_requests=cfg.num_warmup_requests)
        bar.update(1)
        bar.set_postfix_str("infra validation")
        from serving.infra_validator import InfraValidationError, validate
        report = validate(path)
        bar.update(1)
    if not report["ok"]:
        raise InfraValidationError(report["reason"])
    record = dict(record, infra_validation=report)
    os.makedirs(os.path.dirname(os.path.join(path, PUSH_RECORD)), exist_ok=True)
    with open(os.path.join(path, PUSH_RECORD), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2, sort_keys=True)


def run(ctx) -> dict:
    """Pushes the model if the Blessing says so; otherwise pushes nothing and says why."""
    cfg = ctx.config.push
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    blessing = ctx.inputs["blessing"]
    if not blessing.properties.get("blessed"):
        reasons = blessing.properties.get("reasons", [])
        log("[Pusher] model NOT blessed, nothing pushed: " + "; ".join(reasons))
        return {"pushed_model": {"counts": {"pushed": 0},
                                 "properties": {"pushed": False, "reasons": reasons}}}
    serving_dir = os.path.abspath(cfg.serving_dir or os.path.join(ctx.root, "serving"))
    model_dir = os.path.join(serving_dir, cfg.model_name)
    model_art = ctx.inputs["model"]
    record = {"model": model_art.fingerprint, "encoder": ctx.inputs["encoder"].fingerprint,
              "vocabulary": ctx.inputs["vocabulary"].fingerprint,
              "export": {"decoding": blessed_decoding(ctx.inputs["evaluation"]),
                         "model_name": cfg.model_name,
                         "num_warmup_requests": cfg.num_warmup_requests}}
    start = time.time()
    newest = existing_versions(model_dir)[-1:]
    previous = pushed_from(os.path.join(model_dir, str(newest[0]))) if newest else None
    if previous is not None and dict(previous, infra_validation=None) == dict(
            record, infra_validation=None):
        version, path = newest[0], os.path.join(model_dir, str(newest[0]))
        remove_leftovers(model_dir)
        log(f"[Pusher] version {version} already holds this model (pushed by an interrupted "
            "run): not pushing it again")
    else:
        from serving.infra_validator import InfraValidationError
        try:
            version, path = publish_version(model_dir, lambda tmp: _export(ctx, tmp, record),
                                            cfg.keep_versions)
        except InfraValidationError as e:
            remove_leftovers(model_dir)
            reasons = [f"infra validation: TF Serving could not serve this model: {e}"]
            log("[Pusher] NOT pushed: " + reasons[0])
            return {"pushed_model": {"counts": {"pushed": 0},
                                     "properties": {"pushed": False, "reasons": reasons}}}
    names = sorted(e for e in os.listdir(serving_dir)
                   if os.path.isdir(os.path.join(serving_dir, e)) and not e.startswith("."))
    _atomic_write(os.path.join(serving_dir, MODELS_CONFIG), models_config_text(serving_dir, names))
    _atomic_write(os.path.join(serving_dir, BATCHING_PARAMETERS),
                  batching_parameters_text(cfg.max_batch_size, cfg.batch_timeout_micros))
    log(f"[Pusher] pushed version {version} to {path} in {time.time() - start:.1f}s")
    return {"pushed_model": {
        "counts": {"pushed": 1},
        "properties": {"pushed": True, "version": version, "path": path,
                       "serving_dir": serving_dir, "model_name": cfg.model_name,
                       "model_uri": model_art.uri,
                       "evaluation_uri": ctx.inputs["evaluation"].uri,
                       "decoding": record["export"]["decoding"],
                       "models_config": os.path.join(serving_dir, MODELS_CONFIG),
                       "external_paths": [path]}}}
