"""Preprocess on a Dask cluster started with dask's own CLI, against the DirectRunner.

A scheduler and two single-thread workers run as separate processes
(`dask scheduler`, `dask worker`), as a user starts them; `captioner run
--stages Preprocess --set preprocess.runner=dask` on a copy of a `tiny` root
must write the same records, vocabulary and dead letters as the DirectRunner,
also when a worker is killed with SIGKILL mid-run; a worker without the
package and an unreachable scheduler fail in one line, publishing nothing.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.components.beam import same_artifacts

pytestmark = pytest.mark.slow

BIN = os.path.dirname(sys.executable)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
# A preload that makes a worker look like one without the captioner package.
BLOCKER = '''
import sys
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("components", "models", "pipeline", "serving"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, _Blocker())
'''


def captioner(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


class DaskCLI:
    """`dask scheduler` and `dask worker` processes on 127.0.0.1 (stopped by `close`)."""

    def __init__(self, folder, workers: int = 2, preload: str | None = None):
        self.folder = str(folder)
        os.makedirs(self.folder, exist_ok=True)
        self.scheduler_file = os.path.join(self.folder, "scheduler.json")
        self.procs = []
        self.procs.append(self._start("scheduler", [
            os.path.join(BIN, "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
            "--no-dashboard", "--scheduler-file", self.scheduler_file]))
        deadline = time.monotonic() + 60
        while not os.path.exists(self.scheduler_file):
            assert time.monotonic() < deadline, "dask scheduler did not start"
            time.sleep(0.2)
        time.sleep(0.5)  # the file is written before the listener is ready on slow hosts
        with open(self.scheduler_file) as f:
            self.address = json.load(f)["address"]
        cmd = [os.path.join(BIN, "dask"), "worker", self.address, "--nworkers", str(workers),
               "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1"]
        if preload:
            cmd += ["--preload", preload]
        self.procs.append(self._start("workers", cmd))
        self.client = __import__("distributed").Client(self.address, timeout=30,
                                                       set_as_default=False)
        self.client.wait_for_workers(workers, timeout=120)

    def _start(self, name, cmd):
        log = open(os.path.join(self.folder, f"{name}.log"), "w")
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=self.folder)

    def task_prefixes(self) -> set:
        return set(self.client.run_on_scheduler(
            lambda dask_scheduler: list(dask_scheduler.task_prefixes)))

    def close(self):
        self.client.close()
        for proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    """A tiny root after ExampleGen and EncoderTrainer, and the DirectRunner's Preprocess of it."""
    base = tmp_path_factory.mktemp("dask") / "base"
    r = captioner("run", "--config", "tiny", "--root", str(base), "--stages",
                  "ExampleGen,EncoderTrainer")
    assert r.returncode == 0, r.stderr[-3000:]
    direct = base.parent / "direct"
    shutil.copytree(base, direct)
    r = captioner("run", "--root", str(direct), "--stages", "Preprocess")
    assert r.returncode == 0, r.stderr[-3000:]
    return base, direct


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = DaskCLI(tmp_path_factory.mktemp("cluster"))
    yield c
    c.close()


def preprocess_folder(root) -> str:
    """The one published Preprocess execution of a root."""
    runs = [d for d in os.listdir(os.path.join(root, "Preprocess")) if d.isdigit()]
    assert len(runs) == 1, runs
    return os.path.join(root, "Preprocess", runs[0])


def assert_same_as_direct(root, direct) -> int:
    mine, theirs = preprocess_folder(root), preprocess_folder(direct)
    return same_artifacts.assert_same(
        os.path.join(theirs, "annotations"), os.path.join(mine, "annotations"),
        os.path.join(theirs, "vocabulary"), os.path.join(mine, "vocabulary"))


def run_on(cluster_address: str, root, *extra: str, timeout: float = 600):
    return captioner("run", "--root", str(root), "--stages", "Preprocess",
                     "--set", "preprocess.runner=dask",
                     f"--beam-arg=--dask_client_address={cluster_address}", *extra,
                     timeout=timeout)


def test_preprocess_on_a_dask_cli_cluster_writes_what_the_direct_runner_writes(
        tiny_root, cluster, tmp_path):
    base, direct = tiny_root
    root = tmp_path / "dask"
    shutil.copytree(base, root)
    r = run_on(cluster.address, root)
    assert r.returncode == 0, r.stderr[-3000:]
    assert assert_same_as_direct(root, direct) == 80
    # The scheduler ran the work: the adapter's fused stages went through it.
    assert "stage" in cluster.task_prefixes()
    with open(os.path.join(preprocess_folder(root), "annotations", "artifact.json")) as f:
        props = json.load(f)["properties"]
    assert props["runner"].endswith("dask_runner.DaskRunner")


def test_exact_shard_count_on_dask(tiny_root, cluster, tmp_path):
    base, _ = tiny_root
    root = tmp_path / "shards"
    shutil.copytree(base, root)
    r = run_on(cluster.address, root, "--set", "preprocess.num_shards=3")
    assert r.returncode == 0, r.stderr[-3000:]
    folder = os.path.join(preprocess_folder(root), "annotations")
    for split in ("train", "val", "test"):
        names = sorted(os.listdir(os.path.join(folder, split)))
        assert names == [f"annotations-0000{i}-of-00003.tfrecord" for i in range(3)], names
    assert same_artifacts.leftovers(folder) == []


def test_a_worker_killed_mid_run_changes_nothing(tiny_root, tmp_path):
    base, direct = tiny_root
    root = tmp_path / "killed"
    shutil.copytree(base, root)
    cli = DaskCLI(tmp_path / "cluster")
    killed = {}
    try:
        pids = cli.client.run(os.getpid)
        stop = threading.Event()

        def kill_when_busy():
            # SIGKILL the first worker that is running one of the job's bundles.
            while not stop.is_set():
                busy = cli.client.processing()
                for worker, keys in busy.items():
                    if any("stage" in str(k) for k in keys) and worker in pids:
                        os.kill(pids[worker], signal.SIGKILL)
                        killed[worker] = pids[worker]
                        return
                time.sleep(0.05)

        thread = threading.Thread(target=kill_when_busy, daemon=True)
        thread.start()
        r = run_on(cli.address, root)
        stop.set()
        thread.join(timeout=5)
        assert r.returncode == 0, r.stderr[-3000:]
        assert killed, "no worker was busy with the job to be killed"
        (worker, pid), = killed.items()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert assert_same_as_direct(root, direct) == 80
    finally:
        cli.close()


def test_a_worker_without_the_package_fails_in_one_line(tiny_root, tmp_path):
    base, _ = tiny_root
    root = tmp_path / "nopackage"
    shutil.copytree(base, root)
    preload = tmp_path / "blocker.py"
    preload.write_text(BLOCKER)
    cli = DaskCLI(tmp_path / "cluster", workers=1, preload=str(preload))
    try:
        r = run_on(cli.address, root, timeout=300)
    finally:
        cli.close()
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert "cannot import the captioner package" in last and cli.address in last, r.stderr[-2000:]
    assert not [d for d in os.listdir(root / "Preprocess") if d.isdigit()]


def test_an_unreachable_scheduler_fails_in_one_line_and_publishes_nothing(tiny_root, tmp_path):
    base, _ = tiny_root
    root = tmp_path / "unreachable"
    shutil.copytree(base, root)
    address = "tcp://127.0.0.1:9"  # discard: nothing listens
    start = time.monotonic()
    r = run_on(address, root, "--beam-arg=--dask_connection_timeout=3", timeout=120)
    assert r.returncode == 1
    assert time.monotonic() - start < 90  # Python and TensorFlow start-up included
    last = r.stderr.strip().splitlines()[-1]
    assert address in last and "cannot reach the Dask scheduler" in last
    assert not [d for d in os.listdir(root / "Preprocess") if d.isdigit()]
