"""One run per pipeline root: a second run is refused in one line naming the holder."""
import errno
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from pipeline import config as config_lib
from pipeline import root_lock
from pipeline.runner import Runner, StageError, inspect
from tests.pipeline import fake_stages

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(root):
    return Runner(config_lib.PipelineConfig(), str(root), stages=fake_stages.STAGES,
                  log=lambda _: None).run()


def _holder_process(root):
    """A separate process that holds the root's lock until it is killed."""
    code = textwrap.dedent(f"""
        import sys, time
        from pipeline import root_lock
        with root_lock.hold({str(root)!r}):
            print("held", flush=True)
            time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT_DIR, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_is_refused_naming_the_holder_and_inspect_still_works(tmp_path):
    _run(tmp_path)  # a root with executions, for inspect
    proc = _holder_process(tmp_path)
    try:
        with pytest.raises(StageError) as info:
            _run(tmp_path)
        message = str(info.value)
        assert f"pid {proc.pid}" in message and "on host" in message and "since" in message
        assert "\n" not in message
        assert [x["stage"] for x in inspect(str(tmp_path))["executions"]] == ["C", "B", "A"]
    finally:
        proc.kill()
        proc.wait()


def test_a_holder_killed_with_sigkill_leaves_no_lock(tmp_path):
    proc = _holder_process(tmp_path)
    with pytest.raises(StageError):
        _run(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    summary = _run(tmp_path)
    assert {st["status"] for st in summary["stages"].values()} == {"ran"}


def test_the_lock_is_released_when_a_run_ends(tmp_path):
    _run(tmp_path)
    with root_lock.hold(str(tmp_path)):
        pass
    assert _run(tmp_path)["stages"]["A"]["status"] == "cached"


def test_a_filesystem_without_locks_refuses_unless_the_user_says_so(tmp_path, monkeypatch):
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(root_lock.RootBusyError, match="without file locks"):
        with root_lock.hold(str(tmp_path)):
            pass
    monkeypatch.setenv(root_lock.UNLOCKED_ENV, "1")
    with root_lock.hold(str(tmp_path)) as path:
        assert os.path.exists(path)
