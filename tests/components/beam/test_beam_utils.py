"""beam_utils.WriteTFRecordShards: streamed (size-bounded) and fixed-count TFRecord shards."""
from __future__ import annotations

import glob
import os

import apache_beam as beam
import pytest

from components.beam import beam_utils
from components.contract import io_utils


def _write(tmp_path, records, **kwargs) -> list[str]:
    prefix = os.path.join(str(tmp_path), "out", "records")
    with beam.Pipeline(runner="DirectRunner") as p:
        _ = (p | beam.Create(records)
             | beam_utils.WriteTFRecordShards(prefix, file_name_suffix=".tfrecord",
                                              shard_name_template="-SSSSS-of-NNNNN",
                                              **kwargs))
    return sorted(glob.glob(prefix + "-*.tfrecord"))


RECORDS = [f"record-{i:03d}".encode() * 40 for i in range(30)]  # 400 bytes each


def test_streamed_shards_close_at_the_byte_bound_and_keep_every_record(tmp_path):
    files = _write(tmp_path, RECORDS, num_shards=0, max_shard_bytes=4000)
    # 30 records of ~416 framed bytes, a new shard after >= 4000 bytes: 3 shards.
    assert len(files) == 3
    assert [os.path.basename(f) for f in files] == [
        f"records-{i:05d}-of-00003.tfrecord" for i in range(3)]
    read = [r for f in files for r in io_utils.read_records([f])]
    assert sorted(read) == sorted(RECORDS)


def test_streamed_without_a_bound_writes_one_shard_per_bundle(tmp_path):
    files = _write(tmp_path, RECORDS, num_shards=0, max_shard_bytes=0)
    assert len(files) >= 1
    assert sorted(r for f in files for r in io_utils.read_records([f])) == sorted(RECORDS)


@pytest.mark.parametrize("num_shards", [1, 4])
def test_fixed_shard_count(tmp_path, num_shards):
    files = _write(tmp_path, RECORDS, num_shards=num_shards, max_shard_bytes=100)
    assert len(files) == num_shards
    assert sorted(r for f in files for r in io_utils.read_records([f])) == sorted(RECORDS)
