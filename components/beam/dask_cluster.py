"""The Dask cluster a Beam job runs on: a local one for the run, or the user's, checked first.

* `start_local_cluster(n)`: `n` worker processes (one thread each) on this
  machine, for `runner=dask` without `--dask_client_address`.
* `connect(address, timeout)`: a `distributed.Client`, or one line that names
  the address when the scheduler cannot be reached.
* `check_workers(client)`: every worker can import this package, with the same
  Beam and TensorFlow versions as the driver; otherwise one line that says
  which worker lacks what.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from components.contract.errors import ActionableError

# Seconds to reach a scheduler before giving up (Beam's --dask_connection_timeout overrides).
CONNECT_TIMEOUT_S = 10
# The modules a worker must import to run the project's DoFns.
WORKER_MODULES = ("components.beam.dask_bundles", "models.image_ops")


class ClusterError(ActionableError):
    """The cluster cannot run the job: unreachable, no workers, or workers without the package."""


def start_local_cluster(workers: int):
    """Starts a local Dask cluster: `workers` processes with one thread each.

    Args:
      workers: worker processes (at least 1).
    Returns:
      The `distributed.LocalCluster` (its `scheduler_address` for
      `--dask_client_address`; `close()` stops it).
    """
    try:
        import distributed
    except ImportError as e:  # pragma: no cover - install_requires has it
        raise ClusterError("runner dask needs dask.distributed: pip install "
                           "'dask[distributed]'") from e
    quiet = _quiet_logs()
    # A local run needs no dashboard; the default port may be taken. The
    # workers import this module first (`dask_setup`): quiet like the driver.
    return distributed.LocalCluster(n_workers=max(1, int(workers)), threads_per_worker=1,
                                    processes=True, dashboard_address=None,
                                    silence_logs=logging.ERROR if quiet else logging.INFO,
                                    preload=[__name__])


def dask_setup(worker=None) -> None:
    """Dask's preload hook: a worker of a quiet `captioner` is quiet too.

    Workers started by hand can use it as well:
    `dask worker ADDRESS --preload components.beam.dask_cluster`.
    """
    from components.contract import quiet
    quiet.install_if_asked()
    _quiet_logs()


def _quiet_logs() -> bool:
    """Dask's own INFO lines off, where `captioner` runs quiet; whether it does."""
    if os.environ.get("CAPTIONER_QUIET") != "1":
        return False
    for name in ("distributed", "dask"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return True


def connect(address: str | None = None, *, scheduler_file: str | None = None,
            timeout: Any = None, name: str | None = None):
    """A `distributed.Client` for the scheduler at `address` (or `scheduler_file`).

    Args:
      address: `tcp://host:port` of the scheduler.
      scheduler_file: a scheduler file instead of an address.
      timeout: seconds to wait for the scheduler (default `CONNECT_TIMEOUT_S`).
      name: the client's name in the scheduler's logs.
    Returns:
      The connected client.
    Raises:
      ClusterError: the scheduler could not be reached in time (one line).
    """
    import distributed
    _quiet_logs()
    timeout = CONNECT_TIMEOUT_S if timeout in (None, "") or not isinstance(
        timeout, (int, float)) else timeout
    where = address or f"the scheduler file {scheduler_file}"
    try:
        return distributed.Client(address=address, scheduler_file=scheduler_file,
                                  timeout=timeout, name=name, set_as_default=False)
    except (OSError, TimeoutError) as e:
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise ClusterError(
            f"cannot reach the Dask scheduler at {where} within {timeout} s ({reason}): "
            f"start one (`dask scheduler`, then `dask worker {address or 'ADDRESS'}` on each "
            f"host) or leave out --dask_client_address to run on a local cluster") from None


def _worker_versions() -> dict:
    """On a worker: the versions it would run the job with (a missing module raises there)."""
    import importlib

    import apache_beam
    import tensorflow
    for module in WORKER_MODULES:
        importlib.import_module(module)
    return {"apache_beam": apache_beam.__version__, "tensorflow": tensorflow.__version__}


def driver_versions() -> dict:
    """The driver's versions, as `_worker_versions` reports a worker's."""
    import apache_beam
    import tensorflow
    return {"apache_beam": apache_beam.__version__, "tensorflow": tensorflow.__version__}


def check_workers(client, wait_s: float = 30.0) -> dict:
    """Checks that the cluster has workers and that each can run the project's code.

    Runs a small function on every worker: it imports the project's modules
    and reports the Beam and TensorFlow versions. The function is pickled by
    reference, so a worker without the package fails to load it.

    Args:
      client: a connected `distributed.Client`.
      wait_s: how long to wait for a first worker.
    Returns:
      worker address -> versions.
    Raises:
      ClusterError: no worker, a worker that cannot import the package, or
        versions that differ from the driver's (one line).
    """
    address = client.scheduler.address
    try:
        client.wait_for_workers(1, timeout=wait_s)
    except (TimeoutError, OSError):
        raise ClusterError(f"the Dask scheduler at {address} has no worker after {wait_s:.0f} s: "
                           f"start some with `dask worker {address}`") from None
    try:
        versions = client.run(_worker_versions)
    except (ImportError, AttributeError) as e:
        raise ClusterError(
            f"a Dask worker of {address} cannot import the captioner package ({e}): install "
            f"it on every worker (pip install of this repository or its wheel, in the "
            f"environment `dask worker` runs in)") from None
    except Exception as e:  # what a worker raised, re-raised here by distributed
        if "No module named" in str(e) or isinstance(e, ModuleNotFoundError):
            raise ClusterError(
                f"a Dask worker of {address} cannot import the captioner package ({e}): "
                f"install it on every worker") from None
        raise
    mine = driver_versions()
    for worker, theirs in sorted(versions.items()):
        if theirs != mine:
            raise ClusterError(f"Dask worker {worker} runs {theirs}, the driver {mine}: "
                               f"install the same versions on every worker")
    return versions


def worker_pids(client) -> dict:
    """worker address -> process id (for tests and the benchmark)."""
    return client.run(os.getpid)
