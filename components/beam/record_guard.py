"""No silent loss: records in = records written + dead letters, counted from the files.

A Beam job's own counters say what its DoFns saw, not what reached the disk:
a runner that drops a bundle's outputs (Beam's stock DaskRunner drops what
`finish_bundle` emits) or a sink that is never finalized still reports full
counters. So the Beam jobs count what they wrote by reading it back, cheaply
(a TFRecord's length headers, a text file's lines), and refuse to publish
when the sum does not match what went in.
"""
from __future__ import annotations

import struct
from typing import Iterable, Mapping

from components.contract.errors import ActionableError

# A TFRecord: uint64 length, uint32 masked CRC of the length, data, uint32 masked CRC of the data.
_HEADER = 12
_FOOTER = 4


class RecordLossError(ActionableError):
    """What a job read differs from what it wrote plus what it dead-lettered."""


def count_tfrecords(paths: Iterable[str]) -> int:
    """Records in TFRecord files, from their length headers (data is skipped, not read).

    Args:
      paths: uncompressed TFRecord files (local or any `tf.io.gfile` path).
    Returns:
      The number of records.
    Raises:
      RecordLossError: a file ends inside a record (a truncated write).
    """
    import tensorflow as tf
    total = 0
    for path in paths:
        size = tf.io.gfile.stat(path).length
        with tf.io.gfile.GFile(path, "rb") as f:
            offset = 0
            while offset < size:
                header = f.read(_HEADER)
                if len(header) < _HEADER:
                    raise RecordLossError(f"{path} ends inside a record header at byte {offset}")
                (length,) = struct.unpack("<Q", header[:8])
                offset += _HEADER + length + _FOOTER
                if offset > size:
                    raise RecordLossError(f"{path} ends inside a record at byte {size} "
                                          f"(the record needs {offset})")
                f.seek(offset)
                total += 1
    return total


def check(job: str, counts: Mapping[str, Mapping[str, int]]) -> None:
    """Raises unless `read == written + dead_lettered` for every group.

    Args:
      job: the job's name, for the message (e.g. `Preprocess`).
      counts: group (a split) -> {"read", "written", "dead_lettered"}.
    Raises:
      RecordLossError: one line per group whose counts do not add up.
    """
    bad = [f"{group}: read {c['read']}, written {c['written']}, dead-lettered "
           f"{c['dead_lettered']} ({c['read'] - c['written'] - c['dead_lettered']:+d} unaccounted)"
           for group, c in sorted(counts.items())
           if c["read"] != c["written"] + c["dead_lettered"]]
    if bad:
        raise RecordLossError(f"{job} lost records, nothing is published: " + "; ".join(bad)
                              + " (a runner that dropped outputs, or a sink that was not "
                              "finalized: docs/beam.md)")
