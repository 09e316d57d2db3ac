"""Distribution for the Trainer: the `tf.distribute` strategies, this process's cluster role, the chief's values on every worker.

Some settings only take effect before TensorFlow runs its first op in a
process: splitting the CPU into logical devices (`train.cpu_logical_devices`)
and the collective ops of `MultiWorkerMirroredStrategy`. `needs_fresh_process`
tells the Trainer when it must train in a child process because an earlier
stage in the same process already started TensorFlow (docs/multi_worker.md).

Only the chief reads checkpoints and computes validation metrics:
`broadcast_from_chief` and `chief_values` hand its values to the other
workers (one all-reduce each), so that every worker resumes from the same
state and takes the same early-stopping decision. Every worker takes part in
saves; the others write into temporary folders (`write_dir`) and delete them
(`cleanup`).
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from typing import Mapping

from components.contract.config.values import CHOICES

STRATEGIES = CHOICES["train.strategy"]


class StrategyError(RuntimeError):
    """A strategy that cannot be set up as configured; the message says why."""


@dataclass(frozen=True)
class ClusterRole:
    """This process's place in a multi-worker cluster (from `TF_CONFIG`).

    Attributes:
      task_type: `"worker"` / `"chief"` (or `None` outside a cluster).
      task_id: the index within `task_type`.
      num_workers: workers in the cluster (1 outside a cluster).
      is_chief: the task that publishes artifacts and writes summaries:
        `chief:0`, or `worker:0` when the cluster has no `chief` job.
    """
    task_type: str | None = None
    task_id: int = 0
    num_workers: int = 1
    is_chief: bool = True


def cluster_role(tf_config: str | None = None) -> ClusterRole:
    """Reads this task's role from `TF_CONFIG` (the environment variable by default).

    Raises:
      StrategyError: `TF_CONFIG` is not JSON or has no `cluster`/`task`.
    """
    raw = os.environ.get("TF_CONFIG", "") if tf_config is None else tf_config
    if not raw:
        return ClusterRole()
    try:
        spec = json.loads(raw)
        cluster, task = spec["cluster"], spec["task"]
        task_type, task_id = task["type"], int(task["index"])
    except (ValueError, KeyError, TypeError) as e:
        raise StrategyError(f"TF_CONFIG must be JSON with 'cluster' and 'task' "
                            f"({{'type': ..., 'index': ...}}): {e}") from None
    workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
    if "chief" in cluster:
        chief = task_type == "chief"
    else:
        chief = task_type == "worker" and task_id == 0
    return ClusterRole(task_type, task_id, max(workers, 1), chief)


def tf_initialized() -> bool:
    """Whether TensorFlow's runtime already started in this process (devices then are fixed).

    Importing TensorFlow does not start it; running the first op does.
    """
    import sys
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.eager import context
    return bool(getattr(context.context(), "_initialized", False))


def needs_fresh_process(train_config) -> bool:
    """True when `train_config` needs settings made before TF's first op and TF has started.

    `cpu_logical_devices > 0` needs the CPU split first; `multi_worker` needs
    the collective ops configured first. An already matching CPU split is fine.
    """
    if not tf_initialized():
        return False
    if train_config.strategy == "multi_worker":
        return True
    if train_config.cpu_logical_devices > 0:
        import tensorflow as tf
        return len(tf.config.list_logical_devices("CPU")) != train_config.cpu_logical_devices
    return False


def configure_cpu_devices(count: int) -> None:
    """Splits the first physical CPU into `count` logical devices (`/cpu:0` .. `/cpu:N-1`).

    Raises:
      StrategyError: TensorFlow already started with another split.
    """
    import tensorflow as tf
    if count <= 0:
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
        if have != count:
            raise StrategyError(
                f"train.cpu_logical_devices={count} must be set before TensorFlow runs its "
                f"first op, but this process already has {have} logical CPU device(s). Run "
                "the Trainer in a fresh process (the Trainer stage does this itself: "
                "components.trainer.run) or set it at program start.") from None


def make_strategy(train_config):
    """The `tf.distribute.Strategy` named by `train.strategy`.

    - `default`: one device (the default strategy).
    - `mirrored`: `MirroredStrategy` over `train.devices` (comma-separated)
      or every local GPU, or, with `train.cpu_logical_devices = N` and no
      GPU, over `/cpu:0..N-1`.
    - `multi_worker`: `MultiWorkerMirroredStrategy` from `TF_CONFIG`.

    Call it before any other TensorFlow op in the process for `multi_worker`
    and for `cpu_logical_devices`.

    Raises:
      StrategyError: unknown strategy, or settings TF can no longer apply.
    """
    import tensorflow as tf
    name = train_config.strategy
    if name not in STRATEGIES:
        raise StrategyError(f"train.strategy must be one of {STRATEGIES}, got {name!r}")
    if name == "multi_worker":
        if not os.environ.get("TF_CONFIG"):
            raise StrategyError("train.strategy=multi_worker reads the cluster from TF_CONFIG, "
                                "which is not set (see docs/multi_worker.md)")
        if tf_initialized():
            raise StrategyError("train.strategy=multi_worker must be set up before TensorFlow "
                                "runs its first op in the process; run the Trainer in a fresh "
                                "process (python -m components.trainer)")
        cluster_role()  # validates TF_CONFIG with a readable message
        return tf.distribute.MultiWorkerMirroredStrategy()
    configure_cpu_devices(train_config.cpu_logical_devices)
    if name == "default":
        return tf.distribute.get_strategy()
    devices = [d.strip() for d in train_config.devices.split(",") if d.strip()]
    if not devices:
        gpus = tf.config.list_logical_devices("GPU")
        if gpus:
            devices = [d.name for d in gpus]
        else:
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    return tf.distribute.MirroredStrategy(devices)


def is_multi_worker(strategy) -> bool:
    """Whether `strategy` spans several worker processes."""
    extended = strategy.extended
    return bool(getattr(extended, "_in_multi_worker_mode", lambda: False)())


def write_dir(path: str, role: ClusterRole) -> str:
    """Where this task saves `path`: the path itself on the chief, a temporary sibling elsewhere.

    Every worker must take part in saves (they may run collective ops); only
    the chief's copy is kept, the others delete theirs with `cleanup`.
    """
    if role.is_chief:
        return path
    parent, name = os.path.split(os.path.normpath(path))
    return os.path.join(parent, f".worker-{role.task_type}-{role.task_id}-{name}")


def cleanup(path: str, role: ClusterRole) -> None:
    """Removes a non-chief's temporary copy (see `write_dir`)."""
    if not role.is_chief:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.remove(path)


def broadcast_from_chief(strategy, variables) -> None:
    """Gives every worker the chief's values of `variables` (after the chief alone restored).

    Values travel as float64 through one all-reduce to which only global
    replica 0 (the chief's first device) contributes: exact for float32/16,
    int64 steps below 2^53 and the uint32 seed-generator states.

    Args:
      strategy: the multi-worker strategy.
      variables: `tf.Variable`s or Keras variables, assigned in place.
    """
    import tensorflow as tf
    tensors = [v if isinstance(v, tf.Variable) else v.value for v in variables]

    def fn():
        ctx = tf.distribute.get_replica_context()
        first = tf.cast(tf.equal(ctx.replica_id_in_sync_group, 0), tf.float64)
        vals = [tf.cast(tf.convert_to_tensor(t), tf.float64) * first for t in tensors]
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, vals)

    reduced = strategy.run(tf.function(fn, autograph=False))
    for var, value in zip(tensors, reduced, strict=True):
        local = strategy.experimental_local_results(value)[0]
        var.assign(tf.cast(local, var.dtype))


def chief_values(strategy, values: Mapping[str, float]) -> dict:
    """The chief's `values` on every worker (see `broadcast_from_chief`).

    Args:
      strategy: the multi-worker strategy.
      values: name -> float on this worker (ignored unless it is the chief).
    Returns:
      name -> the chief's float.
    """
    import tensorflow as tf
    names = sorted(values)
    vector = tf.constant([values[k] for k in names], tf.float64)

    def fn():
        ctx = tf.distribute.get_replica_context()
        return vector * tf.cast(tf.equal(ctx.replica_id_in_sync_group, 0), tf.float64)

    per_replica = strategy.run(tf.function(fn, autograph=False))
    reduced = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
    return {k: float(v) for k, v in zip(names, reduced.numpy(), strict=True)}
