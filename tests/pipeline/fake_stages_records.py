"""Stand-in stages over TFRecord shards, for the integrity tests.

W writes `SHARDS` shards of `tf.train.Example`s (like Annotations); R reads
them record by record through `io_utils.read_records` (as the Evaluator
does); T reads them with an interleaved `tf.data` pipeline (as the Trainer
does), which cannot say which file a bad record came from.
"""
import os

from pipeline.dag import StageSpec

SHARDS = 4
RECORDS_PER_SHARD = 40


def shard_name(i: int) -> str:
    """A shard's path inside the artifact folder."""
    return f"train/records-{i:05d}-of-{SHARDS:05d}.tfrecord"


def _write(ctx) -> dict:
    import tensorflow as tf
    out = ctx.outputs["out"]
    os.makedirs(os.path.join(out, "train"))
    for i in range(SHARDS):
        with tf.io.TFRecordWriter(os.path.join(out, shard_name(i))) as writer:
            for j in range(RECORDS_PER_SHARD):
                value = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x" * 200]))
                index = tf.train.Feature(int64_list=tf.train.Int64List(value=[i * 1000 + j]))
                example = tf.train.Example(features=tf.train.Features(
                    feature={"payload": value, "index": index}))
                writer.write(example.SerializeToString())
    return {"out": {"counts": {"records": SHARDS * RECORDS_PER_SHARD}}}


def _read(ctx) -> dict:
    import tensorflow as tf

    from components.contract import io_utils
    src = ctx.inputs["x"]
    files = [src.path(shard_name(i)) for i in range(SHARDS)]
    if ctx.stage == "R":
        n = sum(1 for record in io_utils.read_records(files)
                if tf.train.Example.FromString(record))
    else:
        ds = tf.data.Dataset.from_tensor_slices(files).interleave(
            tf.data.TFRecordDataset, cycle_length=2)
        n = int(ds.reduce(0, lambda count, _: count + 1))
    with open(os.path.join(ctx.outputs["out"], "count.txt"), "w") as f:
        f.write(str(n))
    return {"out": {"counts": {"read": n}}}


def run(ctx) -> dict:
    return _write(ctx) if ctx.stage == "W" else _read(ctx)


STAGES = (
    StageSpec("W", "tests.pipeline.fake_stages_records", outputs={"out": "Annotations"},
              config_sections=("data",)),
    StageSpec("R", "tests.pipeline.fake_stages_records", inputs={"x": ("W", "out")},
              outputs={"out": "Model"}, config_sections=("train",)),
    StageSpec("T", "tests.pipeline.fake_stages_records", inputs={"x": ("W", "out")},
              outputs={"out": "Evaluation"}, config_sections=("eval",)),
)
