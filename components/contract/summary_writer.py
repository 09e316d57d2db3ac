"""TensorBoard scalars for any training stage: a flushing file writer and scalar entries.

Written through `tf.summary.write` with TensorBoard's plugin metadata, so the
event files read as if written by `tf.summary.scalar` (the `tensorboard`
package is not needed to write them).

The Trainer and the EncoderTrainer write into `<work_dir>/logs` while they
run and copy that folder into their artifact at the end; `captioner
tensorboard` shows both places (pipeline/cli.py `tensorboard_logdirs`).
Writers flush every `FLUSH_SECONDS` and at every epoch's end, so that a
running job's curves reach TensorBoard while it trains.
"""
from __future__ import annotations

# TensorFlow's default (120 s) would hide the first minutes of a run.
FLUSH_SECONDS = 10


def file_writer(logs_dir: str):
    """A `tf.summary` file writer on `logs_dir` that flushes every `FLUSH_SECONDS`.

    Args:
      logs_dir: the folder of the event files (created when missing).
    Returns:
      The writer; `flush()` it at natural boundaries, `close()` it at the end.
    """
    import tensorflow as tf
    return tf.summary.create_file_writer(logs_dir, flush_millis=FLUSH_SECONDS * 1000)


def scalar_value(value) -> float:
    """A Python float from a tensor, a (distributed or Keras) variable or a number."""
    import tensorflow as tf
    if hasattr(value, "value") and not isinstance(value, tf.Variable):
        value = value.value  # a Keras variable
    return float(tf.convert_to_tensor(value).numpy())


def summary_metadata(plugin: str):
    """The `SummaryMetadata` naming TensorBoard's `plugin` (scalars, images, text)."""
    from tensorflow.core.framework import summary_pb2
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin))


def summary_scalar(tag: str, value, step: int) -> None:
    """A TensorBoard scalar, through the default writer.

    Args:
      tag: its name (`train/loss`).
      value: a number.
      step: its step.
    """
    import tensorflow as tf
    tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step,
                     metadata=summary_metadata("scalars"))


def write_scalars(writer, values: dict, step: int) -> None:
    """Writes every `tag -> value` of `values` at `step` through `writer`.

    Args:
      writer: a `tf.summary` writer.
      values: tag -> number (a float, tensor or variable).
      step: the step (or epoch) the values belong to.
    """
    with writer.as_default():
        for tag, value in values.items():
            if not isinstance(value, (int, float)):
                value = scalar_value(value)
            summary_scalar(tag, value, step)
