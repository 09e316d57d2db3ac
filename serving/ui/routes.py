"""The attention explorer's files at `/ui/` on the REST port (`captioner serve --ui`).

The page (`serving/ui/`: index.html, app.js, style.css) is static: it calls
only REST routes that TensorFlow Serving has too (model status, metadata,
predict), so the same folder works in front of a real `tensorflow_model_server`
behind a reverse proxy (docs/serving.md, "Browser UI"). Two small JSON
documents are served here besides the files, and the page works without
either:

    GET /ui/config.json
        {"model": NAME}: the model the page opens when its URL has no
        `?model=` (the served model, "captioner" when it is among several).
    GET /ui/models/NAME/versions/V/captioner_export.json
        The export record of a loaded version (its
        `assets.extra/captioner_export.json`: the decoding it was exported
        and blessed with, `beam_size` among it); 404 when the version is not
        loaded or has no record.

Only these paths are answered; file names come from a fixed table, never
from the request, and the export record is read from the folder of a
version the server has loaded.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Callable, Dict, List, Optional, Tuple
from urllib.parse import unquote

from serving.errors import ServingError
from serving.signature.export import EXPORT_RECORD

UI_DIR = os.path.dirname(os.path.abspath(__file__))
PREFIX = "/ui"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}
_FILES = {"/ui/": "index.html", "/ui/index.html": "index.html", "/ui/app.js": "app.js",
          "/ui/style.css": "style.css"}
_EXPORT = re.compile(r"^/ui/models/([^/]+)/versions/(\d{1,18})/captioner_export\.json$")
# The page loads nothing from other origins and runs no inline script.
_SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; img-src 'self' blob: data:; object-src 'none'; "
     b"base-uri 'none'; frame-ancestors 'none'; form-action 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]

Response = Tuple[int, List[Tuple[bytes, bytes]], bytes]


def is_ui_path(path: str) -> bool:
    """Whether a request path belongs to the UI (`/ui` or below)."""
    return path == PREFIX or path.startswith(PREFIX + "/")


class UiFiles:
    """Answers `/ui/...` requests: the page's files and its two JSON documents.

    Args:
      manager: a callable returning the server's `ModelManager` (or None
        before it starts): model names for the default, loaded versions'
        folders for the export record.
      ui_dir: the folder holding index.html, app.js and style.css.
    """

    def __init__(self, manager: Callable[[], object], ui_dir: str = UI_DIR):
        self._manager = manager
        self._files: Dict[str, bytes] = {}
        for name in set(_FILES.values()):
            with open(os.path.join(ui_dir, name), "rb") as f:
                self._files[name] = f.read()

    def default_model(self) -> str:
        """The served model's name; "captioner" when it is one of several (or none)."""
        manager = self._manager()
        names = list(manager.model_names) if manager is not None else []
        if len(names) == 1 or (names and "captioner" not in names):
            return names[0]
        return "captioner"

    def handle(self, method: str, path: str, query: str = "") -> Response:
        """(status, headers, body) of one request for a `/ui` path."""
        if method not in ("GET", "HEAD"):
            return _json(405, {"error": f"{method} is not allowed on {path}"},
                         [(b"allow", b"GET, HEAD")])
        if path == PREFIX:  # relative links in the page need the trailing slash
            location = "/ui/" + (f"?{query}" if query else "")
            return 301, [(b"location", location.encode("latin-1"))], b""
        name = _FILES.get(path)
        if name is not None:
            content_type = _TYPES[os.path.splitext(name)[1]].encode()
            headers = [(b"content-type", content_type), (b"cache-control", b"no-cache")]
            return 200, headers + _SECURITY_HEADERS, self._files[name]
        if path == "/ui/config.json":
            return _json(200, {"model": self.default_model()})
        match = _EXPORT.match(path)
        if match:
            return self._export_record(unquote(match.group(1)), int(match.group(2)))
        return _json(404, {"error": f"Not found: {path}"})

    def _export_record(self, model: str, version: int) -> Response:
        manager = self._manager()
        if manager is None:
            return _json(404, {"error": "no model is loaded yet"})
        try:
            folder = manager.get(model, version).path
        except ServingError as e:  # NOT_FOUND: not loaded
            return _json(404, {"error": e.message})
        try:
            with open(os.path.join(folder, EXPORT_RECORD), "rb") as f:
                record = json.loads(f.read())
        except (OSError, ValueError):
            record = None
        if not isinstance(record, dict):
            return _json(404, {"error": f"version {version} of model {model} has no "
                                        f"export record ({EXPORT_RECORD})"})
        return _json(200, record)

    async def respond(self, scope, send, executor) -> None:
        """Answers one ASGI request for a `/ui` path (files on the executor)."""
        raw_path = scope.get("raw_path")
        path = raw_path.decode("latin-1") if raw_path is not None else scope["path"]
        query = (scope.get("query_string") or b"").decode("latin-1")
        status, headers, body = await asyncio.get_running_loop().run_in_executor(
            executor, self.handle, scope["method"], path, query)
        headers = headers + [(b"content-length", str(len(body)).encode("ascii"))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body",
                    "body": b"" if scope["method"] == "HEAD" else body})


def _json(status: int, payload: dict, extra: Optional[list] = None) -> Response:
    headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-cache")]
    return status, headers + (extra or []), json.dumps(payload).encode("utf-8")
