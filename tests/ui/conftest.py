"""Browser tests: headless Chromium (Debian's `chromium`, `chromium-driver`) through Selenium.

The system browser and driver only (Selenium's `Service(executable_path=...)`
with the binary named), never a downloaded one. `make test` installs them
where it runs as root; elsewhere the tests skip with the command that
installs them, except under `CI=true`, where a missing browser is a failure.
"""
from __future__ import annotations

import importlib.util
import shutil

import pytest

from tests.reliability.server_process import ServerProcess
from tests.serving.conftest import model_store  # noqa: F401  (re-exported fixture)
from tests.tools import INSTALL, on_ci

WINDOW = (1100, 900)


def chromium_paths():
    """(browser, driver) paths, or the reason why a browser test cannot run."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    absent = [name for name, path in (("chromium", browser), ("chromium-driver", driver))
              if path is None]
    how = []
    if absent:
        how.append(f"{INSTALL['chromium']} (`make test` runs this where it is root)")
    if importlib.util.find_spec("selenium") is None:
        absent.append("the selenium package")
        how.append("pip install -e '.[test]'")
    if absent:
        return None, "needs " + " and ".join(absent) + ": " + "; ".join(how)
    return (browser, driver), None


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium WebDriver, WINDOW sized; skipped (failed under CI) without one."""
    paths, reason = chromium_paths()
    if paths is None:
        if on_ci():
            pytest.fail(f"browser tests under CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--force-device-scale-factor=1",
                     "--force-color-profile=srgb", f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=paths[1]), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory):
    """ui_server(args) -> a started `captioner serve --ui ...` child process."""
    started = []

    def start(args):
        log_path = str(tmp_path_factory.mktemp("ui-server-log") / "server.log")
        server = ServerProcess(["--ui", "--port", "0", "--rest-port", "0", *args], log_path)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
