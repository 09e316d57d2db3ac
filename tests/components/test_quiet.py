"""The quiet default: TensorFlow's start-up lines filtered, real errors kept."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env():
    env = dict(os.environ, PYTHONPATH=REPO)
    for name in ("CAPTIONER_VERBOSE", "CAPTIONER_QUIET", "TF_CPP_MIN_LOG_LEVEL"):
        env.pop(name, None)
    return env


def test_native_log_lines_are_filtered():
    from components.contract.quiet import filter_native_logs
    text = ("WARNING: All log messages before absl::InitializeLog() is called are written to "
            "STDERR\n"
            "I0000 00:00:1795691193.598091   18521 port.cc:153] oneDNN custom operations are on.\n"
            "E0000 00:00:1795691196.546917   18521 cuda_platform.cc:52] failed call to cuInit\n"
            "ImportError: a real problem\n")
    assert filter_native_logs(text) == "ImportError: a real problem\n"


def test_quiet_tensorflow_start_up():
    code = ("from components.contract import quiet\nquiet.install()\nimport tensorflow as tf\n"
            "import keras\nprint(int(tf.constant(1) + 1))")
    env = _env()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"
    assert result.stderr == ""


def test_install_if_asked_only_when_asked():
    code = ("import sys\nfrom components.contract import quiet\nquiet.install_if_asked()\n"
            "print(any(type(f).__name__ == '_QuietFinder' for f in sys.meta_path))")
    for asked, expected in (("1", "True"), ("", "False")):
        env = dict(_env(), CAPTIONER_QUIET=asked)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                env=env, cwd=REPO, timeout=120)
        assert result.stdout.strip() == expected, result.stderr

