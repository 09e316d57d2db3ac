"""The attention explorer's requests in headless Chromium: answers out of order, unreadable files.

- Two images chosen one after the other, the first one's answer held back
  (the page's `fetch` wrapped, so the order does not depend on timing) until
  the second one's caption is shown: the late answer must not replace it.
- A file the browser cannot read (`FileReader` made to fail): the page says
  so in its error line instead of throwing.

Both models answer from the fixture captioner, whose caption follows the
image's colour, so the two images have different captions.
"""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from tests.serving.fixtures import build_fixture_model, expected_caption
from tests.ui.test_browser import upload, wait_state

pytestmark = pytest.mark.slow

RED, BLUE = (220, 30, 30), (20, 20, 200)

# Holds the first :predict answer back until `window.releaseFirst()`: the request
# reaches the server at once, only its answer is delayed.
HOLD_FIRST_PREDICT = """
    const realFetch = window.fetch;
    window.held = {sent: false, released: false};
    window.releaseFirst = null;
    window.fetch = function (path, options) {
        if (!window.held.sent && String(path).endsWith(":predict")) {
            window.held.sent = true;
            const answer = realFetch(path, options);
            return new Promise((resolve, reject) => {
                window.releaseFirst = () => {
                    window.held.released = true;
                    answer.then(resolve, reject);
                };
            });
        }
        return realFetch(path, options);
    };
"""

# Every FileReader read fails, as when the chosen file was removed or is unreadable.
FAILING_READER = """
    FileReader.prototype.readAsDataURL = function () {
        const error = new DOMException("The file could not be read", "NotReadableError");
        Object.defineProperty(this, "error", {value: error});
        setTimeout(() => this.onerror && this.onerror(new ProgressEvent("error")), 0);
    };
"""


def solid_png(rgb, size: int = 48) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), rgb, np.uint8)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def page_url(tmp_path_factory, ui_server):
    base = tmp_path_factory.mktemp("ui-requests") / "captioner"
    build_fixture_model(str(base / "1"), noun="image")
    server = ui_server(["--model-base-path", str(base), "--poll-seconds", "0"])
    return server.rest_url + "/ui/"


def _ready(browser, page_url) -> None:
    from selenium.webdriver.common.by import By
    browser.get(page_url)
    assert wait_state(browser, ("ready", "error")) == "ready", \
        browser.find_element(By.ID, "error").text


def _counts(browser):
    return browser.execute_script(
        "const s = window.captioner.state; return [s.asked, s.answered];")


def _wait(browser, condition: str, timeout: float = 60.0) -> None:
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(browser, timeout).until(lambda d: d.execute_script("return " + condition))


def test_a_late_answer_does_not_replace_the_latest_caption(browser, page_url, tmp_path):
    from selenium.webdriver.common.by import By

    first, second = tmp_path / "red.png", tmp_path / "blue.png"
    first.write_bytes(solid_png(RED))
    second.write_bytes(solid_png(BLUE))
    first_caption, second_caption = expected_caption(RED), expected_caption(BLUE)
    assert first_caption != second_caption

    _ready(browser, page_url)
    browser.execute_script(HOLD_FIRST_PREDICT)
    upload(browser, str(first))
    _wait(browser, "window.releaseFirst !== null")  # the first request is out, its answer held
    upload(browser, str(second))
    assert wait_state(browser, ("captioned", "error")) == "captioned", \
        browser.find_element(By.ID, "error").text
    assert browser.find_element(By.ID, "caption").text == second_caption
    assert _counts(browser) == [2, 1]  # the second answered, the first still held

    browser.execute_script("window.releaseFirst()")
    # `answered` counts an answer before the page decides what to do with it, in the
    # same turn of the event loop: once it is 2 the first answer has been handled.
    _wait(browser, "window.captioner.state.answered === 2")
    assert browser.execute_script("return window.held.released") is True
    assert browser.find_element(By.ID, "caption").text == second_caption
    chips = browser.find_elements(By.CSS_SELECTOR, "#words .chip")
    assert [c.text for c in chips] == second_caption.split()
    assert browser.execute_script("return window.captioner.state.result.caption") == \
        second_caption
    assert browser.execute_script("return document.body.dataset.state") == "captioned"
    assert not browser.find_element(By.ID, "error").is_displayed()


def test_a_late_answer_does_not_replace_a_newer_error(browser, page_url, tmp_path):
    """The newer request fails (its image refused): the older one's caption stays out."""
    from selenium.webdriver.common.by import By

    first, bad = tmp_path / "red.png", tmp_path / "bad.png"
    first.write_bytes(solid_png(RED))
    bad.write_bytes(b"this is not an image")
    _ready(browser, page_url)
    browser.execute_script(HOLD_FIRST_PREDICT)
    upload(browser, str(first))
    _wait(browser, "window.releaseFirst !== null")
    upload(browser, str(bad))
    assert wait_state(browser, ("captioned", "error")) == "error"
    browser.execute_script("window.releaseFirst()")
    _wait(browser, "window.captioner.state.answered === 2")
    assert browser.execute_script("return document.body.dataset.state") == "error"
    assert browser.find_element(By.ID, "error").text.startswith("The server refused the image: ")
    assert browser.find_element(By.ID, "caption").text == ""
    assert not browser.find_element(By.ID, "result").is_displayed()


def test_an_unreadable_file_is_reported_in_the_error_line(browser, page_url, tmp_path):
    from selenium.webdriver.common.by import By

    good = tmp_path / "red.png"
    good.write_bytes(solid_png(RED))
    _ready(browser, page_url)
    upload(browser, str(good))  # a caption first: the failure must take it away
    assert wait_state(browser, ("captioned", "error")) == "captioned"
    browser.execute_script(FAILING_READER + """
        window.uncaught = [];
        window.addEventListener("unhandledrejection", (e) => window.uncaught.push(String(e.reason)));
        window.addEventListener("error", (e) => window.uncaught.push(String(e.message)));""")
    gone = tmp_path / "gone.png"
    gone.write_bytes(solid_png(BLUE))
    upload(browser, str(gone))
    assert wait_state(browser, ("error",)) == "error"
    error = browser.find_element(By.ID, "error")
    assert error.is_displayed()
    assert error.text.startswith("Cannot read gone.png to send it (The file could not be read)")
    assert "\n" not in error.text
    assert browser.find_element(By.ID, "caption").text == ""
    assert not browser.find_element(By.ID, "result").is_displayed()
    assert _counts(browser) == [2, 2]
    assert browser.execute_script("return window.uncaught") == []  # nothing thrown past the page
