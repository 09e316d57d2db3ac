"""One run per pipeline root: an exclusive lock on `<root>/run.lock` for the length of a run.

The lock is the kernel's (`fcntl.flock`) on an open file, so it goes away
with the process that holds it, however that process ends (SIGKILL, a
crash, a lost container): no stale lock can block the next run, which then
recovers the interrupted executions as usual. The file also says who holds
the lock (pid, host, start time, command line), for the one-line refusal a
second run prints. Read-only commands (`inspect`, `tensorboard`, `config`)
never take it.

Shared filesystems: on NFS (v4, or v3 with lockd) Linux turns `flock` into
an NFS lock that every client sees, so runs on several hosts exclude each
other. A filesystem without locks (some FUSE mounts of object storage)
raises ENOLCK/EOPNOTSUPP: the run is refused with a message that says so,
unless `CAPTIONER_UNLOCKED_ROOT=1` says the user keeps to one run at a time
themselves (docs/usage.md, "One run per root").
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time
from typing import Iterator

LOCK_FILE = "run.lock"
UNLOCKED_ENV = "CAPTIONER_UNLOCKED_ROOT"


class RootBusyError(RuntimeError):
    """Another run holds the root (the message names it), or the root cannot be locked."""


def _holder(path: str) -> str:
    """Who holds the lock, from the lock file: `pid P on host H since T (command)`."""
    try:
        with open(path) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return "another process (its details are not written yet)"
    command = f" ({info['command']})" if info.get("command") else ""
    return f"pid {info.get('pid')} on host {info.get('host')} since {info.get('started')}{command}"


@contextlib.contextmanager
def hold(root: str) -> Iterator[str]:
    """Holds the root's run lock for the block; refuses at once if another run holds it.

    Args:
      root: the pipeline root (created if missing).
    Yields:
      The lock file's path.
    Raises:
      RootBusyError: another run holds the lock (one line naming it), or the
        filesystem has no locks and `CAPTIONER_UNLOCKED_ROOT=1` is not set.
    """
    import fcntl
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RootBusyError(
                f"pipeline root {root} is in use by another run: {_holder(path)}. Wait for it "
                f"to finish, or stop it; read-only commands (inspect, tensorboard, config) "
                f"work meanwhile") from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            if os.environ.get(UNLOCKED_ENV) != "1":
                raise RootBusyError(
                    f"pipeline root {root} is on a filesystem without file locks "
                    f"({e.strerror}), so two runs on it could not be kept apart: use a root "
                    f"on a local disk or NFS, or set {UNLOCKED_ENV}=1 if you make sure "
                    f"yourself that one run at a time uses it") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "command": " ".join(os.path.basename(a) if i == 0 else a
                                    for i, a in enumerate(sys.argv))[:300]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock
