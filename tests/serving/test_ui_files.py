"""`/ui/` on the REST port (serving/ui/routes.py): off by default, the page's files, its JSON."""
from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request

import pytest

from serving.server.flags import build_parser
from serving.server.predictor import Predictor
from serving.server.rest_server import RestServer
from serving.ui.routes import UI_DIR, UiFiles


class _Servable:
    def __init__(self, path):
        self.path = path


class _Manager:
    """The two things UiFiles asks a ModelManager: model names, a loaded version's folder."""

    def __init__(self, names, folders):
        self.model_names = names
        self.folders = folders

    def get(self, name, version=None):
        from serving.errors import not_found
        if (name, version) not in self.folders:
            raise not_found(f"Servable not found for request: Specific({name}, {version})")
        return _Servable(self.folders[(name, version)])


def fetch(url, method="GET"):
    """(status, headers, body) without raising on HTTP errors."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.fixture
def rest(tmp_path):
    """rest(ui=...) -> a started RestServer's URL (no model behind it)."""
    servers = []

    def start(ui=None):
        server = RestServer(Predictor(), port=0, ui=ui).start()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop(grace=0)


def test_the_flag_is_off_by_default():
    assert build_parser().parse_args(["--model-base-path", "m"]).ui is False
    assert build_parser().parse_args(["--model-base-path", "m", "--ui"]).ui is True


def test_without_ui_the_rest_port_serves_no_page(rest):
    url = rest()
    status, _, body = fetch(url + "/ui/")
    assert status == 404 and "error" in json.loads(body)


def test_the_page_and_its_files(rest):
    url = rest(UiFiles(lambda: _Manager(["captioner"], {})))
    status, headers, body = fetch(url + "/ui/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in headers["content-security-policy"]
    page = body.decode()
    assert 'src="app.js"' in page and 'href="style.css"' in page
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        status, headers, body = fetch(url + "/ui/" + name)
        assert status == 200 and headers["content-type"].startswith(kind)
        with open(os.path.join(UI_DIR, name), "rb") as f:
            assert body == f.read()
    status, headers, _ = fetch(url + "/ui?model=x")  # redirected: relative links need the slash
    assert status == 200 and headers["content-type"].startswith("text/html")


def test_the_page_loads_nothing_from_elsewhere():
    for name in os.listdir(UI_DIR):
        with open(os.path.join(UI_DIR, name), encoding="utf-8") as f:
            text = f.read()
        assert not re.search(r"https?://", text), name
        assert "<script>" not in text and " on" + "click=" not in text, name  # CSP: no inline code


def test_every_control_has_a_label():
    with open(os.path.join(UI_DIR, "index.html"), encoding="utf-8") as f:
        page = f.read()
    controls = re.findall(r'<(?:input|select)[^>]*\bid="([^"]+)"', page)
    assert controls
    for control in controls:
        assert f'<label for="{control}"' in page, control


def test_config_names_the_served_model(rest):
    one = rest(UiFiles(lambda: _Manager(["flowers"], {})))
    assert json.loads(fetch(one + "/ui/config.json")[2]) == {"model": "flowers"}
    several = rest(UiFiles(lambda: _Manager(["a", "captioner"], {})))
    assert json.loads(fetch(several + "/ui/config.json")[2]) == {"model": "captioner"}


def test_the_export_record_of_a_loaded_version(rest, tmp_path):
    record = {"decoding": {"beam_size": 3, "max_length": 24, "length_normalization": 0.0}}
    version = tmp_path / "captioner" / "2"
    (version / "assets.extra").mkdir(parents=True)
    (version / "assets.extra" / "captioner_export.json").write_text(json.dumps(record))
    bare = tmp_path / "captioner" / "1"
    bare.mkdir()
    manager = _Manager(["captioner"], {("captioner", 2): str(version), ("captioner", 1): str(bare)})
    url = rest(UiFiles(lambda: manager)) + "/ui/models/captioner/versions/{}/captioner_export.json"
    status, _, body = fetch(url.format(2))
    assert status == 200 and json.loads(body) == record
    status, _, body = fetch(url.format(1))
    assert status == 404 and "no export record" in json.loads(body)["error"]
    status, _, body = fetch(url.format(7))
    assert status == 404 and "Specific(captioner, 7)" in json.loads(body)["error"]


@pytest.mark.parametrize("path", ["/ui/../setup.py", "/ui/ui_files.py", "/ui/%2e%2e/rest.py",
                                  "/ui/models/captioner/versions/1/saved_model.pb", "/uix"])
def test_nothing_else_is_served(rest, path):
    url = rest(UiFiles(lambda: _Manager(["captioner"], {})))
    status, _, body = fetch(url + path)
    assert status in (400, 404) and b"import" not in body


def test_only_get_and_head(rest):
    url = rest(UiFiles(lambda: _Manager(["captioner"], {})))
    status, headers, _ = fetch(url + "/ui/", method="DELETE")
    assert status == 405 and headers["allow"] == "GET, HEAD"
    status, headers, body = fetch(url + "/ui/", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
