"""Checks `captioner serve` makes before loading anything: the model folder and the ports.

TF Serving starts on a folder without versions and answers NOT_FOUND until
one appears; that is kept (a Pusher may publish the first version later), but
the server says at start-up what it found and what it expects, so that a
folder one level too high is noticed at once. A path that does not exist and
a port already taken stop the start.
"""
from __future__ import annotations

import errno
import os
import socket
from typing import Optional

EXPECTED = "<base>/<integer version>/saved_model.pb"


class StartupError(ValueError):
    """The server cannot start; the message says why and what to do."""


def _versions(base: str) -> list[str]:
    return sorted((d for d in os.listdir(base) if d.isdigit()
                   and os.path.isfile(os.path.join(base, d, "saved_model.pb"))), key=int)


def check_model_base_path(base: str) -> Optional[str]:
    """Checks a `--model_base_path`.

    Args:
      base: the folder.
    Returns:
      None when it holds at least one version, else a warning to print (the
      server still starts and serves versions as they appear).
    Raises:
      StartupError: the path does not exist or is not a folder.
    """
    if not os.path.exists(base):
        raise StartupError(f"--model_base_path {base!r} does not exist; expected a folder "
                           f"laid out as {EXPECTED} (the Pusher writes "
                           "<root>/serving/<model name>)")
    if not os.path.isdir(base):
        raise StartupError(f"--model_base_path {base!r} is a file; expected a folder laid "
                           f"out as {EXPECTED}")
    if _versions(base):
        return None
    entries = sorted(os.listdir(base))
    if not entries:
        found = "it is empty"
    else:
        shown = ", ".join(entries[:8]) + (", ..." if len(entries) > 8 else "")
        found = f"it holds {shown}"
    hint = ""
    below = [e for e in entries if os.path.isdir(os.path.join(base, e))
             and not e.isdigit() and _safe_versions(os.path.join(base, e))]
    if below:
        hint = f"; did you mean --model_base_path {os.path.join(base, below[0])}?"
    return (f"--model_base_path {base!r} has no model versions ({found}); expected "
            f"{EXPECTED}{hint} The server starts and answers NOT_FOUND until a version "
            "appears.")


def _safe_versions(path: str) -> list[str]:
    try:
        return _versions(path)
    except OSError:
        return []


def check_port_free(host: str, port: int, what: str, flag: str) -> None:
    """Raises `StartupError` naming the port when `host:port` is taken (0 is never taken).

    Args:
      host: the bind address.
      port: the port.
      what: `gRPC` or `REST`, for the message.
      flag: the flag that sets it, for the advice.
    """
    if port <= 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return  # the server reports an unusable host itself
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                reason = "is in use" if e.errno == errno.EADDRINUSE else "needs privileges"
                raise StartupError(f"the {what} port {port} on {host} {reason}: choose another "
                                   f"with {flag} PORT, or {flag} 0 for any free port") from None
