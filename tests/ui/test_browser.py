"""The attention explorer (`captioner serve --ui`) in headless Chromium.

Loads the page, uploads a PNG, waits for the caption, hovers the second
word and checks the overlay against the figures' drawing (bicubic upsampling,
then `base * (0.25 + 0.75 a) + 0.45 a (1 - base)`) at that word's attention
maximum, in the canvas and in a screenshot; steps words with the keyboard,
shows the grid and phone width, and shows a bad file's error line. The time
from page load to caption is printed (reported, not asserted).

`CAPTIONER_UI_MODEL=<base path>` runs it on another model (the demo's:
`demo_output/serving/captioner`) with a shapes image;
`CAPTIONER_UI_SCREENSHOTS=<folder>` keeps the screenshots there.
"""
from __future__ import annotations

import base64
import io
import json
import os
import urllib.request

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from serving.client.attention_figure import upsample_attention
from tests.serving.fixtures import FixtureCaptioner, build_fixture_model

pytestmark = pytest.mark.slow

DRAWN_SIDE = 480  # app.js: the view's drawing size
MARGIN = 8
MAX_REQUEST_BYTES = 200_000  # the test server's limit: a larger upload gets 413
GLIMPSE = (0.5, -0.5, 0.25)  # centre x, centre y, scale: x 300..420, y 60..180 of 480
FIXTURE_DECODING = {"beam_size": 2, "max_length": 6, "length_normalization": 0.0}


def block_image(size: int = 96) -> bytes:
    """Dark red with a bright red top-right ninth: the fixture attends there."""
    pixels = np.zeros((size, size, 3), np.uint8)
    pixels[:] = (120, 20, 20)
    pixels[: size // 3, 2 * size // 3:] = (250, 40, 40)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def shapes_image() -> bytes:
    """A 64x64 image of the demo's synthetic shapes data (index 7999, not a training one)."""
    from components.synthetic.shapes import make_example
    return make_example(7999, image_size=64).image_bytes


class GlimpseCaptioner(tf.Module):
    """The fixture captioner plus a `locations` output, as location-wise attentions return.

    Every step's window is GLIMPSE: centre (x, y) and scale in [-1, 1] grid
    coordinates.
    """

    def __init__(self):
        super().__init__(name="glimpse_captioner")
        self.inner = FixtureCaptioner(noun="image")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
    def serve_images(self, image_bytes):
        outputs = dict(self.inner.serve_images(image_bytes))
        steps = tf.shape(outputs["tokens"])[:2]
        outputs["locations"] = tf.broadcast_to(tf.constant(GLIMPSE), tf.concat([steps, [3]], 0))
        return outputs


def write_models(tmp) -> str:
    """models.config: "captioner" (the fixture, or CAPTIONER_UI_MODEL) and "glimpse"."""
    base = os.environ.get("CAPTIONER_UI_MODEL")
    if not base:
        base = str(tmp / "captioner")
        version = build_fixture_model(os.path.join(base, "1"), noun="image")
        record = os.path.join(version, "assets.extra", "captioner_export.json")
        os.makedirs(os.path.dirname(record), exist_ok=True)
        with open(record, "w") as f:
            json.dump({"decoding": FIXTURE_DECODING}, f)
    module = GlimpseCaptioner()
    tf.saved_model.save(module, str(tmp / "glimpse" / "1"),
                        signatures={"serving_default": module.serve_images})
    config = tmp / "models.config"
    config.write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{name}" base_path: "{path}" model_platform: "tensorflow" }}\n'
        for name, path in (("captioner", base), ("glimpse", str(tmp / "glimpse")))) + "}\n")
    return str(config)


@pytest.fixture(scope="module")
def served(tmp_path_factory, ui_server):
    """(server, image bytes, screenshot folder): the fixture model, or CAPTIONER_UI_MODEL."""
    tmp = tmp_path_factory.mktemp("ui")
    image = shapes_image() if os.environ.get("CAPTIONER_UI_MODEL") else block_image()
    shots = os.environ.get("CAPTIONER_UI_SCREENSHOTS") or str(tmp / "screenshots")
    os.makedirs(shots, exist_ok=True)
    server = ui_server(["--model-config-file", write_models(tmp), "--poll-seconds", "0",
                        "--max-request-bytes", str(MAX_REQUEST_BYTES)])
    return server, image, shots


def rest_predict(server, image: bytes) -> dict:
    body = json.dumps({"instances": [{"b64": base64.b64encode(image).decode()}]}).encode()
    request = urllib.request.Request(server.rest_url + "/v1/models/captioner:predict", body)
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["predictions"][0]


def wait_state(driver, states, timeout=60.0) -> str:
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(driver, timeout).until(
        lambda d: d.execute_script("return document.body.dataset.state") in states)
    return driver.execute_script("return document.body.dataset.state")


def upload(driver, path: str) -> None:
    from selenium.webdriver.common.by import By
    driver.find_element(By.ID, "file").send_keys(path)


def expected_overlay(image: bytes, attention: np.ndarray, step: int):
    """(x, y, drawn RGB, drawn size) at the word's attention maximum, drawn as the figures."""
    with Image.open(io.BytesIO(image)) as decoded:
        rgb = decoded.convert("RGB")
    scale = DRAWN_SIDE / max(rgb.size)
    size = (round(rgb.width * scale), round(rgb.height * scale))
    alpha = upsample_attention(attention[step], size[1], size[0])
    inner = alpha[MARGIN:-MARGIN, MARGIN:-MARGIN]  # clear of the view's rounded corners
    y, x = np.add(np.unravel_index(int(np.argmax(inner)), inner.shape), MARGIN)
    base = np.asarray(rgb.resize(size, Image.BILINEAR), np.float32)[y, x] / 255.0
    a = float(alpha[y, x])
    lit = np.clip(base * (0.25 + 0.75 * a) + 0.45 * a * (1.0 - base), 0.0, 1.0)
    return int(x), int(y), np.round(lit * 255.0), size


def canvas_pixel(driver, x: int, y: int) -> np.ndarray:
    rgba = driver.execute_script(
        "const c = document.getElementById('view');"
        "return Array.from(c.getContext('2d').getImageData(arguments[0], arguments[1], 1, 1).data);",
        x, y)
    return np.array(rgba[:3], np.float64)


def screenshot_pixel(element, x: int, y: int, drawn) -> np.ndarray:
    shot = Image.open(io.BytesIO(element.screenshot_as_png)).convert("RGB")
    sx = min(shot.width - 1, int((x + 0.5) * shot.width / drawn[0]))
    sy = min(shot.height - 1, int((y + 0.5) * shot.height / drawn[1]))
    return np.asarray(shot, np.float64)[sy, sx]


def check_hover_overlay(browser, chips, image: bytes, expected: dict, shots: str) -> None:
    """Hovering the second word draws its map as the figures do, on the canvas and on screen."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    attention = np.asarray(expected["attention"], np.float32)
    x, y, lit, drawn = expected_overlay(image, attention, step=1)
    view = browser.find_element(By.ID, "view")
    before_canvas = canvas_pixel(browser, x, y)
    before_shot = screenshot_pixel(view, x, y, drawn)
    ActionChains(browser).move_to_element(chips[1]).perform()
    assert chips[1].get_attribute("aria-pressed") == "true"
    after_canvas = canvas_pixel(browser, x, y)
    after_shot = screenshot_pixel(view, x, y, drawn)
    browser.save_screenshot(os.path.join(shots, "ui_word.png"))
    # The canvas holds exactly the figures' drawing at the maximum, and the
    # screen shows it: those pixels changed.
    assert np.abs(after_canvas - lit).max() <= 3, (after_canvas, lit, before_canvas)
    assert np.abs(after_canvas - before_canvas).max() >= 20, (before_canvas, after_canvas)
    assert np.abs(after_shot - after_canvas).max() <= 12, (after_shot, after_canvas)
    assert np.abs(after_shot - before_shot).max() >= 20, (before_shot, after_shot)


def check_keys_grid_and_phone(browser, chips, shots: str) -> None:
    """Arrow keys on the chips and the slider, the all-words grid, phone width."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    # Keyboard: from the second word, the right arrow moves to the third.
    chips[1].send_keys(Keys.ARROW_RIGHT)
    third = browser.find_element(By.CSS_SELECTOR, '#words .chip[data-word="3"]')
    assert third.get_attribute("aria-pressed") == "true"
    assert browser.switch_to.active_element == third
    slider = browser.find_element(By.ID, "step")
    slider.send_keys(Keys.ARROW_LEFT)
    assert browser.find_element(By.ID, "step-word").text == chips[1].text

    browser.set_window_size(1100, 1300)  # tall enough for the grid
    browser.find_element(By.ID, "grid-toggle").click()
    panels = browser.find_elements(By.CSS_SELECTOR, "#grid button canvas")
    assert len(panels) == len(chips) + 1
    browser.save_screenshot(os.path.join(shots, "ui_grid.png"))

    browser.set_window_size(390, 844)  # a phone
    width = browser.execute_script("return document.documentElement.scrollWidth")
    assert width <= 390, f"the page is {width} px wide at phone width"
    browser.find_element(By.ID, "grid-toggle").click()
    browser.execute_script("document.getElementById('input').scrollIntoView()")
    browser.save_screenshot(os.path.join(shots, "ui_phone.png"))
    browser.set_window_size(1100, 900)


def test_caption_overlay_keyboard_grid_phone_and_errors(browser, served, tmp_path):
    from selenium.webdriver.common.by import By

    server, image, shots = served
    expected = rest_predict(server, image)
    image_path = tmp_path / "test.png"
    image_path.write_bytes(image)

    browser.set_window_size(1100, 900)
    browser.get(server.rest_url + "/ui/")
    assert wait_state(browser, ("ready", "error")) == "ready", \
        browser.find_element(By.ID, "error").text
    info = browser.find_element(By.ID, "model-info").text
    assert "captioner" in info and "beam size" in info, info
    if not os.environ.get("CAPTIONER_UI_MODEL"):
        assert f"beam size {FIXTURE_DECODING['beam_size']}" in info, info

    upload(browser, str(image_path))
    assert wait_state(browser, ("captioned", "error")) == "captioned", \
        browser.find_element(By.ID, "error").text
    timings = browser.execute_script("return window.captioner.timings")
    assert browser.find_element(By.ID, "caption").text == expected["caption"]
    chips = browser.find_elements(By.CSS_SELECTOR, "#words .chip")
    assert [c.text for c in chips] == expected["caption"].split()
    assert "Caption in" in browser.find_element(By.ID, "timing").text

    check_hover_overlay(browser, chips, image, expected, shots)
    check_keys_grid_and_phone(browser, chips, shots)

    bad = tmp_path / "bad.png"
    bad.write_bytes(b"this is not an image")
    upload(browser, str(bad))
    assert wait_state(browser, ("error",)) == "error"
    error = browser.find_element(By.ID, "error")
    assert error.is_displayed() and error.text.startswith("The server refused the image: ")
    assert "\n" not in error.text and len(error.text) > len("The server refused the image: ")
    browser.save_screenshot(os.path.join(shots, "ui_error.png"))

    to_caption = timings["ready"] + (timings["shown"] - timings["chosen"])
    print(f"\nUI timing ({os.environ.get('CAPTIONER_UI_MODEL') or 'fixture model'}): "
          f"page load to ready {timings['ready']:.0f} ms, image chosen to caption shown "
          f"{timings['shown'] - timings['chosen']:.0f} ms (request "
          f"{timings['answered'] - timings['sent']:.0f} ms); page load to caption "
          f"{to_caption:.0f} ms without the test's own steps; screenshots in {shots}")


def test_model_from_the_url_and_unknown_model_error(browser, served):
    from selenium.webdriver.common.by import By

    server, _, _ = served
    browser.get(server.rest_url + "/ui/?model=nosuchmodel")
    assert wait_state(browser, ("ready", "error")) == "error"
    error = browser.find_element(By.ID, "error").text
    assert error.startswith("Not found: ") and "nosuchmodel" in error, error
    assert browser.find_element(By.ID, "model").get_attribute("value") == "nosuchmodel"
    browser.get(server.rest_url + "/ui?model=captioner&version=1")
    assert wait_state(browser, ("ready", "error")) == "ready"
    assert browser.find_element(By.ID, "version").get_attribute("value") == "1"
    for control in browser.find_elements(By.CSS_SELECTOR, "input, select"):
        label = browser.find_elements(By.CSS_SELECTOR, f'label[for="{control.get_attribute("id")}"]')
        assert label, f"no label for #{control.get_attribute('id')}"


def test_glimpse_window_of_a_location_wise_attention(browser, served, tmp_path):
    from selenium.webdriver.common.by import By

    server, _, shots = served
    image_path = tmp_path / "test.png"
    image_path.write_bytes(block_image())
    browser.get(server.rest_url + "/ui/?model=glimpse")
    assert wait_state(browser, ("ready", "error")) == "ready"
    upload(browser, str(image_path))
    assert wait_state(browser, ("captioned", "error")) == "captioned"
    edge, below = (300, 120), (300, 240)  # on the window's left side; under the window
    yellow = np.array([255, 212, 0])
    assert np.abs(canvas_pixel(browser, *edge) - yellow).max() > 40  # the image alone: none
    browser.find_element(By.CSS_SELECTOR, '#words .chip[data-word="2"]').click()
    assert np.abs(canvas_pixel(browser, *edge) - yellow).max() <= 2
    assert np.abs(canvas_pixel(browser, *below) - yellow).max() > 40
    browser.save_screenshot(os.path.join(shots, "ui_glimpse.png"))


def dispatch_file(driver, event: str, data: bytes, name: str) -> None:
    """Drops a file on the drop box ("drop") or pastes it into the page ("paste")."""
    driver.execute_script("""
        const bytes = Uint8Array.from(atob(arguments[1]), (c) => c.charCodeAt(0));
        const transfer = new DataTransfer();
        transfer.items.add(new File([bytes], arguments[2], {type: "image/png"}));
        const event = arguments[0] === "drop"
            ? new DragEvent("drop", {dataTransfer: transfer, bubbles: true, cancelable: true})
            : new ClipboardEvent("paste", {clipboardData: transfer, bubbles: true,
                                           cancelable: true});
        (arguments[0] === "drop" ? document.getElementById("drop") : document)
            .dispatchEvent(event);""", event, base64.b64encode(data).decode(), name)


def test_drop_paste_too_large_and_every_error_as_one_line(browser, served, tmp_path):
    from selenium.webdriver.common.by import By

    server, image, _ = served
    browser.get(server.rest_url + "/ui/")
    assert wait_state(browser, ("ready", "error")) == "ready"
    expected = rest_predict(server, image)["caption"]
    for event in ("drop", "paste"):
        browser.execute_script("document.getElementById('caption').textContent = ''")
        dispatch_file(browser, event, image, f"{event}.png")
        assert wait_state(browser, ("captioned", "error")) == "captioned", event
        assert browser.find_element(By.ID, "caption").text == expected, event
    large = tmp_path / "large.png"
    large.write_bytes(image + os.urandom(MAX_REQUEST_BYTES))
    upload(browser, str(large))
    assert wait_state(browser, ("error",)) == "error"
    error = browser.find_element(By.ID, "error").text
    assert error.startswith("Too large for the server: request body of "), error
    assert f"limit of {MAX_REQUEST_BYTES} bytes" in error
    assert not browser.find_element(By.ID, "result").is_displayed()
    lines = browser.execute_script("""
        const d = window.captioner.describeError;
        return [d(429, {error: "decode memory budget of 1 MiB is held by requests in\\n"
                               + "progress"}, "caption"),
                d(400, {error: "RESOURCE_EXHAUSTED: over budget"}, "caption"),
                d(0, {error: "Failed to fetch"}, "caption"),
                d(503, {error: "batching queue full"}, "caption"),
                d(500, {error: "x".repeat(2000)}, "caption")];""")
    assert lines[0].startswith("The server is busy (RESOURCE_EXHAUSTED): decode memory budget")
    assert lines[0].endswith("Try again in a moment.")
    assert lines[1].startswith("The server is busy (RESOURCE_EXHAUSTED)")
    assert lines[2] == "Cannot reach the server (Failed to fetch)"
    assert lines[3] == "The server is unavailable: batching queue full"
    assert lines[4].startswith("caption failed (HTTP 500): x") and len(lines[4]) == 400
    assert all("\n" not in line for line in lines)
