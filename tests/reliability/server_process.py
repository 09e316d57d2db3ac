"""`python -m serving.server.model_server` in a child process, for the reliability tests.

A child process lets a test check that the server never dies (`alive`) and
read its memory from /proc (`rss_mb`).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from typing import List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BANNER = re.compile(r"serving: grpc=(\S+) rest=(\S+)")


class ServerProcess:
    """`python -m serving.server.model_server ARGS` in a child process, ports read from its banner.

    Args:
      args: command-line arguments (`--port 0 --rest-port 0` to pick free ports).
      log_path: where the server's stderr (its log) goes.
      timeout: seconds to wait for the banner.
    """

    def __init__(self, args: List[str], log_path: str, timeout: float = 120.0):
        self.log_path = log_path
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "serving.server.model_server", *args], cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     env=env)
        self.pid = self.proc.pid
        found = {}

        def read_stdout():
            for line in self.proc.stdout:  # keep draining after the banner
                match = _BANNER.match(line)
                if match and not found:
                    found["grpc"], found["rest"] = match.groups()
                    ready.set()
            ready.set()

        ready = threading.Event()
        threading.Thread(target=read_stdout, daemon=True).start()
        ready.wait(timeout)
        if "grpc" not in found:
            self.stop()
            raise RuntimeError(f"no banner from the server (exit {self.proc.poll()}):\n"
                               + self.log()[-3000:])
        self.grpc_address: str = found["grpc"]
        self.rest_url: Optional[str] = (None if found["rest"] == "off"
                                        else "http://" + found["rest"])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_mb(self) -> float:
        """Resident memory (VmRSS) in MB."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
        raise RuntimeError("no VmRSS")

    def peak_rss_mb(self) -> float:
        """Largest resident memory (VmHWM) in MB since start or `reset_peak`."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
        raise RuntimeError("no VmHWM")

    def reset_peak(self) -> bool:
        """Resets VmHWM to the current RSS (Linux 4.0+); False where not allowed."""
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def log(self) -> str:
        self._log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout: float = 60.0) -> Optional[int]:
        """SIGTERM, then the exit status (SIGKILL and None if it hangs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self._log.close()
                return None
        self._log.close()
        return self.proc.returncode
