"""What survives a crash: the loop's state variables, checkpoints, model files, history, lock.

Checkpoints (`tf.train.CheckpointManager`: model, optimizer and `TrainState`)
go to `<work_dir>/checkpoints`; model files are written beside their final
name and renamed into place; `history.jsonl` gets one line per epoch; a lock
file keeps a second trainer out of the same work folder.
"""
from __future__ import annotations

import glob
import json
import os

import numpy as np

from components.contract import schema

HISTORY = schema.HISTORY_FILE


class TrainState:
    """Training-loop counters saved in every checkpoint (plain variables)."""

    def __init__(self):
        import tensorflow as tf

        def var(value, dtype, name):
            return tf.Variable(value, dtype=dtype, trainable=False, name=name)

        self.step = var(0, tf.int64, "step")
        self.epoch = var(0, tf.int64, "epoch")
        self.step_in_epoch = var(0, tf.int64, "step_in_epoch")
        self.best_metric = var(float("nan"), tf.float64, "best_metric")
        self.best_epoch = var(-1, tf.int64, "best_epoch")
        self.bad_epochs = var(0, tf.int64, "bad_epochs")
        self.finished = var(0, tf.int64, "finished")
        self.train_seconds = var(0.0, tf.float64, "train_seconds")

    def variables(self) -> dict:
        """Name -> variable, for `tf.train.Checkpoint(**state.variables())`."""
        return dict(vars(self))


def atomic_save(model, path: str) -> None:
    """Saves the model in float32 to a `.keras` file next to `path`, then renames it into place.

    Whatever policy training ran in, saved models compute in float32 (the
    same weights: the variables are float32 under mixed precision too), so
    that the Evaluator, the Pusher's SavedModel and TF Serving decode at
    full speed on hosts without native bfloat16.
    """
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".tmp-{os.getpid()}-{name}")
    model.as_float32().save(tmp)
    os.replace(tmp, path)


def remove_stale_saves(work_dir: str) -> None:
    """Deletes model files that a killed attempt left half-written (see `atomic_save`)."""
    for stale in glob.glob(os.path.join(glob.escape(work_dir), ".tmp-*.keras")):
        os.remove(stale)


def append_history(work_dir: str, row: dict) -> None:
    """Appends one epoch's record to `<work_dir>/history.jsonl`."""
    with open(os.path.join(work_dir, HISTORY), "a") as f:
        f.write(json.dumps(row) + "\n")


def read_history(work_dir: str) -> list[dict]:
    """Epoch records, the last one per epoch (a killed run may have written one twice)."""
    path = os.path.join(work_dir, HISTORY)
    if not os.path.exists(path):
        return []
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a kill
                    continue
                rows[row["epoch"]] = row
    return [rows[k] for k in sorted(rows)]


def weights_digest(model) -> str:
    """sha256 of every weight's bytes: equal digests mean bit-identical models (workers in sync)."""
    import hashlib
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()


def lock_work_dir(work_dir: str):
    """An exclusive lock on `<work_dir>/.lock` (released when the process dies).

    Returns:
      The open lock file; close it to release the lock.
    Raises:
      RuntimeError: another live process trains in the same folder.
    """
    import fcntl
    f = open(os.path.join(work_dir, ".lock"), "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        owner = f.read().strip() or "?"
        f.close()
        raise RuntimeError(f"another Trainer (pid {owner}) is training in {work_dir}; "
                           "wait for it or stop it") from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f
