"""The REST port's server: `RestServer` (uvicorn on a background thread) and its `RestOptions`.

The app it serves, TF Serving's REST API, is `serving/server/rest.py`.

Overload (`serving/limits/load_shedding.py`): a request's
deadline is its arrival plus `timeout_ms` (TF Serving's
`--rest_api_timeout_in_ms`). One that would wait for a pool thread past it
(the requests waiting over the threads, times the mean time a request
holds a thread, more than `DEADLINE_SHARE` of the time left) is refused at
once, 429; one still waiting when it passes
is answered 504 without running; a batched one expected to be answered
after it is refused by the batch queue (429), on the event loop before its
body is parsed when the queue already refuses a one-row request (refusing
must cost less than queueing, or an overload is spent parsing requests only
to refuse them). A request whose connection is
lost while it waits (reset, transport error) is dropped from the batch
queue unrun: a client that only half-closes (FIN) after its request still
gets its answer, so a FIN cannot tell a client that left, and what bounds
the work left by clients that gave up is the timeout. Beyond
`max_connections` open connections, requests get 503 and their
connection is closed, so the process keeps file descriptors for loading
its models.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

import uvicorn

from serving.limits.work_admission import mark_pool
from serving.server.metrics import ServingMetrics
from serving.server.options import DEFAULTS
from serving.server.predictor import Predictor
from serving.server.rest import _RestApp
from serving.server.rest_http import IDLE_SECONDS, MAX_HEAD_BYTES, StrictH11Protocol, bind_socket
from serving.ui.routes import UiFiles


@dataclass(frozen=True)
class RestOptions:
    """How the REST port serves.

    Attributes:
      max_request_bytes: largest accepted request body.
      ssl_cert, ssl_key: PEM files for HTTPS, or None.
      num_threads: requests handled at once (TF Serving's
        `--rest_api_num_threads`; default 4 per CPU, as there).
      metrics_path: the URL path of the Prometheus endpoint (with
        `RestServer`'s `metrics`).
      fast_path: run a small predict request on the event loop when it is
        alone (see the module doc); False: every request goes to the pool.
      timeout_ms: a request's deadline after its arrival (see the module
        doc); 0: none.
      max_connections: open connections beyond which requests get 503;
        None: half the process's open-file limit; 0: no limit.
    """
    max_request_bytes: int = DEFAULTS.max_request_bytes
    ssl_cert: Optional[str] = None
    ssl_key: Optional[str] = None
    num_threads: Optional[int] = None
    metrics_path: Optional[str] = None
    fast_path: bool = True
    timeout_ms: int = DEFAULTS.rest_timeout_ms
    max_connections: Optional[int] = DEFAULTS.rest_max_connections


def default_max_connections() -> int:
    """Half the process's soft open-file limit (0, no limit, where it cannot be read)."""
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 0
    return 0 if soft == resource.RLIM_INFINITY else max(soft // 2, 1)


class RestServer:
    """Serves the REST API from a background thread running uvicorn's event loop.

    Args:
      predictor: the shared request logic.
      host: address to bind.
      port: port to bind (0: any free port).
      options: body limit, TLS, threads, metrics path (`RestOptions`).
      metrics: when given with `options.metrics_path`, served there in
        Prometheus text format, and every request is counted in it.
      ui: when given, answers `/ui` paths (the attention explorer page).
    Raises:
      OSError: the port cannot be bound.
    """

    def __init__(self, predictor: Predictor, host: str = "127.0.0.1", port: int = 8501,
                 options: Optional[RestOptions] = None, *,
                 metrics: Optional[ServingMetrics] = None, ui: Optional[UiFiles] = None):
        options = options or RestOptions()
        self.host = host
        self._socket = bind_socket(host, port)
        self.port = self._socket.getsockname()[1]
        self.scheme = "https" if options.ssl_cert else "http"
        threads = options.num_threads or 4 * (os.cpu_count() or 1)
        # Marked so that requests waiting for decode capacity leave it threads.
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rest",
                                            initializer=mark_pool, initargs=("rest", threads))
        app = _RestApp(predictor, options.max_request_bytes, self._executor, metrics,
                       options.metrics_path)
        app.ui = ui  # `captioner serve --ui`: the page at /ui/ (serving/ui/routes.py)
        app.threads = threads
        app.timeout = options.timeout_ms / 1e3 if options.timeout_ms > 0 else None
        app.max_connections = (default_max_connections() if options.max_connections is None
                               else max(options.max_connections, 0))
        app.fast_path = options.fast_path
        self.app = app
        # proxy_headers off: nothing here reads the client address, so no
        # per-request middleware rewrites it from X-Forwarded-For.
        config = uvicorn.Config(
            app, lifespan="off", log_config=None, access_log=False, ws="none",
            proxy_headers=False,
            http=StrictH11Protocol, h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            timeout_keep_alive=IDLE_SECONDS, timeout_graceful_shutdown=5,
            server_header=False, ssl_certfile=options.ssl_cert, ssl_keyfile=options.ssl_key,
            backlog=128)
        try:
            config.load()  # TLS files are read here, so their errors reach the caller
        except Exception:
            self._socket.close()
            raise
        self._server = uvicorn.Server(config)
        state = self._server.server_state
        app.connections = lambda: len(state.connections)
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "RestServer":
        """Starts serving; returns once the port accepts connections."""
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._socket]},
                                        name="rest-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise OSError(f"the REST server on {self.url} did not start")
            time.sleep(0.005)
        return self

    def stop(self, grace: float = 5.0) -> None:
        """Stops accepting; requests in progress finish (up to `grace` seconds)."""
        if self._thread is not None:
            self._server.config.timeout_graceful_shutdown = max(0.0, grace or 0.0)
            self._server.should_exit = True
            self._thread.join(grace + 5.0)
            self._thread = None
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._socket.close()
