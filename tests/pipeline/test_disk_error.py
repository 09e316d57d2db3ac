"""`disk_error`: a full, over-quota or read-only disk, found in an exception or its chain."""
from __future__ import annotations

import errno
import os
import sqlite3

import pytest

from pipeline.runner import _disk_error_message, disk_error


def _oserror(code: int, path: str | None = "/root/Trainer/.tmp-1/model/best.keras"):
    return OSError(code, os.strerror(code), path)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_disk_errnos_give_the_errno_and_the_path(code):
    assert disk_error(_oserror(code)) == (code, "/root/Trainer/.tmp-1/model/best.keras")
    assert disk_error(_oserror(code, None)) == (code, None)


@pytest.mark.parametrize("error", [
    _oserror(errno.EACCES), _oserror(errno.ENOENT), _oserror(errno.EIO),
    FileNotFoundError("x"), ValueError("bad value"), KeyboardInterrupt(),
    RuntimeError("out of memory"), None])
def test_other_errors_are_not_disk_errors(error):
    assert disk_error(error) is None


def test_found_through_the_cause_and_the_context():
    try:
        try:
            raise _oserror(errno.ENOSPC)
        except OSError as e:
            raise RuntimeError("the stage failed") from e
    except RuntimeError as e:
        caused = e
    try:
        try:
            raise _oserror(errno.EROFS, "/ro/x")
        except OSError:
            raise ValueError("while handling it")  # noqa: B904 (the implicit context is the point)
    except ValueError as e:
        during = e
    assert disk_error(caused) == (errno.ENOSPC, "/root/Trainer/.tmp-1/model/best.keras")
    assert disk_error(during) == (errno.EROFS, "/ro/x")


def test_a_chain_that_loops_ends():
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__context__, second.__context__ = second, first
    assert disk_error(first) is None


@pytest.mark.parametrize("text, expected", [
    # TensorFlow: "<path>; No space left on device"
    ("/r/Preprocess/.tmp-2/annotations/train-00000; No space left on device",
     (errno.ENOSPC, "/r/Preprocess/.tmp-2/annotations/train-00000")),
    ("Failed to flush\n/r/out.tfrecord; No space left on device",
     (errno.ENOSPC, "/r/out.tfrecord")),
    # An OSError as text (Beam re-raises worker errors so).
    ("Error in WriteToTFRecord: [Errno 28] No space left on device: '/r/x.tfrecord' "
     "[while running 'Write']", (errno.ENOSPC, "/r/x.tfrecord")),
    ("[Errno 122] Disk quota exceeded: '/home/u/r/a.json'", (errno.EDQUOT, "/home/u/r/a.json")),
    ("[Errno 30] Read-only file system: '/mnt/r'", (errno.EROFS, "/mnt/r")),
    # A relative path is not reported (the message names absolute paths only).
    ("relative/file; No space left on device", (errno.ENOSPC, None)),
    ("No space left on device", (errno.ENOSPC, None)),
])
def test_library_texts_give_the_errno_and_the_path(text, expected):
    assert disk_error(RuntimeError(text)) == expected


def test_sqlite_errors():
    assert disk_error(sqlite3.OperationalError("database or disk is full")) == (errno.ENOSPC,
                                                                                None)
    assert disk_error(sqlite3.OperationalError("attempt to write a readonly database")) == (
        errno.EROFS, None)
    assert disk_error(sqlite3.OperationalError("database is locked")) is None


def test_the_message_names_the_stage_the_path_the_root_and_what_to_do():
    assert _disk_error_message("Trainer", (errno.ENOSPC, "/r/Trainer/.tmp-1/x"), "/r") == (
        "Trainer failed: no space left on device while writing /r/Trainer/.tmp-1/x "
        "(pipeline root '/r'); free some space on that disk or choose another --root")
    assert _disk_error_message("Pusher", (errno.EDQUOT, None), "/r") == (
        "Pusher failed: disk quota exceeded (pipeline root '/r'); free some space on that "
        "disk or choose another --root")
    assert _disk_error_message(None, (errno.EROFS, "/r/metadata.sqlite"), "/r") == (
        "the pipeline failed: read-only file system while writing /r/metadata.sqlite "
        "(pipeline root '/r'); choose a writable --root")
