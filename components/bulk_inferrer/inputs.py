"""The driver's inputs of bulk captioning: the model folder, the image paths, a temp folder.

Everything here runs on the driver, before the Beam job, through
`tf.io.gfile` (local paths, gs:// and the other filesystems TensorFlow
reads): the version folder is chosen the way TF Serving chooses one
(`serving.versions.model_manager.version_folders`), and the image arguments are
expanded to a sorted list of paths, so the job's input is known, counted and
checked against its output.
"""
from __future__ import annotations

import os
import uuid
from typing import Optional, Sequence

from components.beam import beam_utils
from components.contract.errors import ActionableError

# The extensions a folder or a glob contributes (a file named on its own is always taken).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")


class BulkInputError(ActionableError):
    """The command cannot start: no model at the path, or no image to caption."""


def resolve_model(model_path: str) -> tuple[str, Optional[int]]:
    """The SavedModel folder to load, and its version.

    Args:
      model_path: a version folder (holding `saved_model.pb`) or a model base
        path (holding numbered version folders: the highest is taken, as TF
        Serving does).
    Returns:
      `(folder, version)`: the version is the folder's name as an int, or
      None when the folder is not numbered.
    Raises:
      BulkInputError: neither layout is there.
    """
    import tensorflow as tf

    from serving.versions.model_manager import version_folders
    path = model_path.rstrip("/") or model_path
    if tf.io.gfile.exists(os.path.join(path, "saved_model.pb")):
        name = os.path.basename(path)
        return path, int(name) if name.isdigit() else None
    try:
        versions = version_folders(path)
    except tf.errors.OpError:
        versions = {}
    if not versions:
        raise BulkInputError(f"--model {model_path}: no SavedModel there; expected "
                             f"{path}/saved_model.pb or {path}/<integer version>/saved_model.pb")
    version = max(versions)
    return versions[version], version


def check_signature(folder: str, signature: str) -> None:
    """Raises `BulkInputError` unless `folder`'s SavedModel has `signature`, taking image bytes.

    Read from `saved_model.pb` on the driver, so that a wrong `--signature`
    is one line before the job starts, not a failure inside every worker.
    """
    from tensorflow.core.framework import types_pb2

    from serving.versions.servable import read_meta_graph
    signatures = read_meta_graph(folder).signature_def
    names = sorted(name for name in signatures if not name.startswith("__"))
    if signature not in names:
        raise BulkInputError(f"{folder} has no signature {signature!r} (it has "
                             f"{', '.join(names) or 'none'}): give one to --signature")
    taken = signatures[signature].inputs
    if len(taken) != 1 or next(iter(taken.values())).dtype != types_pb2.DT_STRING:
        raise BulkInputError(f"{folder} signature {signature!r} takes {sorted(taken)}, not "
                             "one tf.string tensor of encoded images")


def _is_image(path: str) -> bool:
    return path.lower().endswith(IMAGE_EXTENSIONS)


def _images_under(folder: str) -> list[str]:
    """Every file with an image extension in `folder` and below it."""
    import tensorflow as tf
    return [os.path.join(dirpath, name) for dirpath, _, files in tf.io.gfile.walk(folder)
            for name in files if _is_image(name)]


def _expand_one(arg: str) -> list[str]:
    """The images one command-line argument names: a file, a folder or a glob."""
    import tensorflow as tf
    path = arg.rstrip("/") or arg
    if tf.io.gfile.isdir(path):
        return _images_under(path)
    if tf.io.gfile.exists(arg):  # a file, even one whose name holds glob characters
        return [arg]
    if any(c in arg for c in "*?["):
        found = []
        for match in tf.io.gfile.glob(arg):
            if tf.io.gfile.isdir(match):
                found += _images_under(match)
            elif _is_image(match):
                found.append(match)
        return found
    return []


def expand_images(args: Sequence[str]) -> list[str]:
    """The image paths that files, folders (recursively) and globs name, sorted, unique.

    Args:
      args: paths as given on the command line (local or any `tf.io.gfile`
        path). A file is taken whatever its name; a folder or a glob
        contributes the files with an image extension (`IMAGE_EXTENSIONS`).
    Returns:
      The sorted paths.
    Raises:
      BulkInputError: no argument, or an argument that names no image (a
        typo must not pass for an empty folder).
    """
    if not args:
        raise BulkInputError("no images given: name image files, folders or globs")
    found: set[str] = set()
    for arg in args:
        images = _expand_one(arg)
        if not images:
            raise BulkInputError(f"no images match {arg} (a folder or a glob takes "
                                 f"{', '.join(IMAGE_EXTENSIONS)} files)")
        found.update(images)
    return sorted(found)


def read_location(path: str) -> str:
    """Where a worker reads `path`: local paths made absolute (a worker's folder may differ)."""
    return path if "://" in path else os.path.abspath(path)


def _runs_here(runner: str, beam_args: Sequence[str]) -> bool:
    """Whether the job's workers share this machine's disk (direct, or a local Dask cluster)."""
    name = beam_utils.runner_name(beam_utils.flag_value(beam_args, "runner") or runner)
    if name == beam_utils.DASK_RUNNER:
        return not (beam_utils.flag_value(beam_args, "dask_client_address")
                    or beam_utils.flag_value(beam_args, "dask_scheduler_file"))
    return name in ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


def temp_folder(output: Optional[str], runner: str, beam_args: Sequence[str]) -> str:
    """A new folder for the job's output file, where the workers can write.

    Next to `output` (so the final move stays on one filesystem), else under
    `--temp_location`, else in this machine's temp folder when the workers
    run here.

    Args:
      output: the final output file, or None for stdout.
      runner: the `--runner` flag's value.
      beam_args: the Beam options (`--runner=`, `--temp_location=`, the Dask
        scheduler's address).
    Returns:
      The folder's path (not created yet).
    Raises:
      BulkInputError: stdout output on a remote cluster without `--temp_location`.
    """
    import tempfile
    name = f"bulk-captions-{uuid.uuid4().hex[:12]}"
    if output:
        parent = os.path.dirname(output) or "."
        if "://" not in parent:
            parent = os.path.abspath(parent)
        return beam_utils.join(parent, f".{os.path.basename(output)}.{name}")
    temp_location = beam_utils.flag_value(beam_args, "temp_location")
    if temp_location:
        return beam_utils.join(temp_location, name)
    if not _runs_here(runner, beam_args):
        raise BulkInputError("with a remote cluster give --output FILE or "
                             "--beam-arg=--temp_location=DIR (a folder every worker can "
                             "write): the workers write the lines there")
    return os.path.join(tempfile.gettempdir(), name)
