"""Which model versions are loaded: watches base paths like TF Serving does.

Every poll interval, each model's `base_path` is listed. Folders whose name
is an integer (not starting with '.') and that hold a `saved_model.pb` are
versions; the version policy picks the ones to serve (`latest` N, `all`,
or `specific` versions). A new version is loaded and warmed up while the old
ones keep serving; only then does it enter the table, and only then are
versions that left the policy unloaded (TF Serving's availability-preserving
policy): while no version the policy wants is available (still loading,
failed, waiting for a retry), the newest of the others keeps serving, even
once its folder is gone. A version that left the policy is unloaded at once
when another one it wants is available, or when the policy wants none (the
folders were removed). A poll that cannot list a base path (missing, out of
file descriptors) changes nothing for that model, as in TF Serving. Requests
hold a reference to the `Servable` they started on, so an unloaded version
finishes its in-flight requests before Python frees it.

Models come from one `--model_base_path` or from a `models.config` file
(`ModelServerConfig` text format), which is re-read when it changes (every
`config_poll_seconds`), or from `ModelService.HandleReloadConfigRequest`
(`reload`). A new config is checked whole before anything changes (TF
Serving's rules: a version label may only point at a version that is
loaded, unless labels for unavailable models are allowed, and then only a
label that does not exist yet); models it adds are loaded before `reload`
returns; models it drops are unloaded once their in-flight requests finish.
Request model names are only ever looked up in the loaded table: no request
field reaches the file system.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import grpc
import tensorflow as tf

from serving.errors import ServingError, failed_precondition, invalid_argument, not_found
from serving.versions.batching_parameters import BatchingParameters

# The model config's types, importable from here as before.
from serving.versions.model_config import (  # noqa: F401
    ModelSource,
    VersionPolicy,
    VersionStatus,
    read_model_config,
    sources_from_config,
)
from serving.versions.servable import Servable

log = logging.getLogger(__name__)

_VERSION_DIR = re.compile(r"^[0-9]+$")
# A version that fails to load (say, copied in non-atomically) is retried
# this many times, 2, 4, 8... seconds apart, and again whenever its
# saved_model.pb changes.
MAX_LOAD_RETRIES = 5


@dataclass(frozen=True)
class LoadOptions:
    """How each version is loaded.

    Attributes:
      max_image_pixels: passed to every `Servable`.
      batching: batching parameters for every `Servable`, or None.
      warmup: `warmup(request, servable)` that replays one warmup
        PredictRequest; None skips warmup.
      batch_observer: passed to every `Servable` (batching metrics).
      max_load_retries: attempts after a version's first failed load
        (TF Serving's `--max_num_load_retries`).
    """
    max_image_pixels: int = 0
    batching: Optional[BatchingParameters] = None
    warmup: Optional[Callable] = None
    batch_observer: Optional[Callable] = None
    max_load_retries: int = MAX_LOAD_RETRIES


class ModelManager:
    """Loads, warms up, serves and unloads model versions (see module doc).

    Args:
      sources: the models to serve (with no `config_file`).
      config_file: a `models.config` to read the models from, re-read when
        its modification time changes.
      poll_seconds: seconds between polls of the base paths; <= 0 polls once,
        at start.
      config_poll_seconds: seconds between checks of `config_file` (TF
        Serving's `--model_config_file_poll_wait_seconds`); <= 0 reads it
        once; None checks it at every poll of the base paths.
      loading: how each version is loaded (`LoadOptions`).
      on_change: called with no argument after each poll that changed the table.
    """

    def __init__(self, sources: Optional[List[ModelSource]] = None,
                 config_file: Optional[str] = None, poll_seconds: float = 1.0, *,
                 config_poll_seconds: Optional[float] = None,
                 loading: Optional[LoadOptions] = None, on_change: Optional[Callable] = None):
        if bool(sources) == bool(config_file):
            raise ValueError("give either model sources or a model config file")
        self.config_file = config_file
        self.poll_seconds = poll_seconds
        self.config_poll_seconds = config_poll_seconds
        self.loading = loading or LoadOptions()
        self._next_config_check = 0.0
        self._on_change = on_change
        self._lock = threading.RLock()
        self._poll_lock = threading.Lock()
        self._sources: Dict[str, ModelSource] = {}
        self._servables: Dict[str, Dict[int, Servable]] = {}
        self._states: Dict[str, Dict[int, VersionStatus]] = {}
        # (model, version) -> (saved_model.pb mtime, failed attempts, next retry time)
        self._failed: Dict[Tuple[str, int], Tuple[Optional[int], int, float]] = {}
        self._missing_warned: set = set()
        self._config_mtime: Optional[float] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if config_file:
            self._set_sources(read_model_config(config_file))
            self._config_mtime = _mtime(config_file)
        else:
            self._set_sources(sources)

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Polls once (loading the initial versions), then keeps polling in a thread."""
        self.poll()
        if self.poll_seconds > 0:
            self._thread = threading.Thread(target=self._loop, name="model-poller", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stops polling and unloads everything."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            servables = [s for versions in self._servables.values() for s in versions.values()]
            self._servables = {name: {} for name in self._servables}
        for servable in servables:
            servable.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.poll()
            except Exception:  # a poll must never kill the poller
                log.exception("model poll failed")

    def poll(self) -> None:
        """One pass: re-reads the config file if changed, syncs every model."""
        with self._poll_lock:
            changed = self._reload_config()
            for source in list(self._sources.values()):
                if self._stop.is_set():
                    break
                changed |= self._sync(source)
        if changed and self._on_change is not None:
            self._on_change()

    # -- queries -----------------------------------------------------------

    @property
    def model_names(self) -> List[str]:
        with self._lock:
            return sorted(self._sources)

    def get(self, name: str, version: Optional[int] = None,
            label: Optional[str] = None) -> Servable:
        """The servable for a request's model spec.

        Args:
          name: model name (looked up in the table only).
          version: a specific version, or None for the latest available.
          label: a version label from models.config (instead of `version`).
        Raises:
          ServingError: NOT_FOUND (unknown model/version), INVALID_ARGUMENT
            (unknown label).
        """
        with self._lock:
            if label:
                version = self._label_version(name, label)
            versions = self._servables.get(name) or {}
            if version is None:
                if not versions:
                    raise not_found(f"Servable not found for request: Latest({name})")
                return versions[max(versions)]
            servable = versions.get(version)
            if servable is None:
                raise not_found(f"Servable not found for request: Specific({name}, {version})")
            return servable

    def _label_version(self, name: str, label: str) -> int:
        """The version a models.config label points at (caller holds the lock)."""
        source = self._sources.get(name)
        if source is None or label not in source.labels:
            raise invalid_argument(f"Unrecognized servable version label: {label}")
        return source.labels[label]

    def status(self, name: str, version: Optional[int] = None,
               label: Optional[str] = None) -> List[Tuple[int, VersionStatus]]:
        """(version, status) pairs, newest first, as GetModelStatus reports them."""
        with self._lock:
            if label:
                version = self._label_version(name, label)
            states = self._states.get(name) or {}
            if version is not None:
                if version not in states:
                    raise not_found(f"Could not find version {version} of model {name}")
                return [(version, states[version])]
            if not states:
                raise not_found(f"Could not find any versions of model {name}")
            return sorted(states.items(), reverse=True)

    def available_versions(self, name: str) -> List[int]:
        with self._lock:
            return sorted(self._servables.get(name) or {})

    def ready(self) -> bool:
        """True when every configured model has at least one available version."""
        with self._lock:
            return bool(self._sources) and all(self._servables.get(n) for n in self._sources)

    def wait_for_version(self, name: str, version: int, timeout: float = 30.0,
                         available: bool = True) -> bool:
        """Waits until `version` is (or, with available=False, is no longer) served."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (version in self.available_versions(name)) == available:
                return True
            time.sleep(0.02)
        return False

    # -- internals ---------------------------------------------------------

    def _set_sources(self, sources: List[ModelSource]) -> None:
        with self._lock:
            self._sources = {s.name: s for s in sources}
            for name in self._sources:
                self._servables.setdefault(name, {})
                self._states.setdefault(name, {})

    def _reload_config(self) -> bool:
        if not self.config_file:
            return False
        if self.config_poll_seconds is not None:
            now = time.monotonic()
            if self.config_poll_seconds <= 0 or now < self._next_config_check:
                return False
            self._next_config_check = now + self.config_poll_seconds
        mtime = _mtime(self.config_file)
        if mtime is None or mtime == self._config_mtime:
            return False
        try:
            sources = read_model_config(self.config_file)
            self._check_labels(sources, allow_unavailable=False)
        except Exception as e:  # keep serving the old config
            log.error("cannot reload %s, keeping the current models: %s", self.config_file, e)
            self._config_mtime = mtime
            return False
        self._config_mtime = mtime
        log.info("reloaded %s: models %s", self.config_file, [s.name for s in sources])
        return self._apply_sources(sources)

    def reload(self, sources: List[ModelSource],
               allow_version_labels_for_unavailable_models: bool = False) -> None:
        """Applies a new list of models (HandleReloadConfigRequest), TF Serving's way.

        The whole config is checked first; on any error nothing changes.
        Models are added, removed, or get their new version policy and
        labels; versions the new config adds are loaded (and warmed up)
        before this returns. Requests in progress finish on the versions
        they started on.

        Args:
          sources: the new models.
          allow_version_labels_for_unavailable_models: a label may then point
            at a version that is not loaded, if the label is new (or keeps
            its version); an existing label can only move to a loaded one.
        Raises:
          ServingError: FAILED_PRECONDITION for a label on a version that is
            not available.
        """
        with self._poll_lock:
            self._check_labels(sources, allow_version_labels_for_unavailable_models)
            changed = self._apply_sources(sources)
            log.info("config reloaded: models %s", [s.name for s in sources])
            for source in list(self._sources.values()):
                changed |= self._sync(source)
        if changed and self._on_change is not None:
            self._on_change()

    def _check_labels(self, sources: List[ModelSource], allow_unavailable: bool) -> None:
        """FAILED_PRECONDITION unless every label may point where `sources` say."""
        with self._lock:
            for source in sources:
                current = self._sources.get(source.name)
                available = self._servables.get(source.name) or {}
                for label, version in sorted(source.labels.items()):
                    existing = current.labels.get(label) if current is not None else None
                    allowed = allow_unavailable and (existing is None or existing == version)
                    if not allowed and version not in available:
                        raise failed_precondition(
                            f"Request to assign label to version {version} of model "
                            f"{source.name}, which is not currently available for inference")

    def _apply_sources(self, sources: List[ModelSource]) -> bool:
        """Swaps in a new model list; unloads the models it drops."""
        removed = []
        with self._lock:
            names = {s.name for s in sources}
            for name in list(self._sources):
                if name not in names:
                    for version, servable in self._servables.pop(name, {}).items():
                        removed.append(servable)
                        self._states[name][version] = VersionStatus("END")
            self._set_sources(sources)
        for servable in removed:
            servable.close()
        return True

    def _scan(self, source: ModelSource) -> Dict[int, str]:
        """Integer version folders that hold a saved_model.pb ({} when unlistable)."""
        return self._listing(source) or {}

    def _listing(self, source: ModelSource) -> Optional[Dict[int, str]]:
        """The version folders of `source`, or None when its base path cannot be listed."""
        base = source.base_path
        try:
            versions = version_folders(base)
        except tf.errors.OpError as e:
            if base not in self._missing_warned:
                log.warning("model %s: cannot list the base path %s (%s): the versions "
                            "loaded stay as they are", source.name, base, e.message)
                self._missing_warned.add(base)
            return None
        self._missing_warned.discard(base)
        return versions

    def _set_state(self, name: str, version: int, status: VersionStatus) -> None:
        with self._lock:
            self._states.setdefault(name, {})[version] = status

    def _sync(self, source: ModelSource) -> bool:
        name = source.name
        on_disk = self._listing(source)
        if on_disk is None:  # a failed listing says nothing about the versions
            return False
        desired = source.policy.select(on_disk)
        changed = False
        with self._lock:
            loaded = set(self._servables.get(name) or {})
        for version in sorted(desired - loaded, reverse=True):
            path = on_disk[version]
            stamp = _mtime(os.path.join(path, "saved_model.pb"))
            failed = self._failed.get((name, version))
            if failed is not None and failed[0] == stamp and (
                    failed[1] > self.loading.max_load_retries or time.monotonic() < failed[2]):
                continue  # failed and unchanged: retry a few times, spaced out, then stop
            servable = self._load(source, version, path, stamp)
            if servable is None:
                continue
            with self._lock:
                if self._sources.get(name) is not source:  # config changed meanwhile
                    servable.close()
                    continue
                self._servables[name][version] = servable
                self._states[name][version] = VersionStatus("AVAILABLE")
                servable.available_at = time.monotonic()
            changed = True
            log.info("model %s version %d is available (%d warmup requests)", name, version,
                     servable.warmup_requests)
        closing = []
        with self._lock:
            servables = self._servables.get(name) or {}
            for version in retired(desired, servables):
                closing.append(servables.pop(version))
                self._states[name][version] = VersionStatus("END")
                changed = True
        for servable in closing:
            log.info("model %s version %d unloaded", name, servable.version)
            servable.close()
        return changed

    def _load(self, source: ModelSource, version: int, path: str,
              stamp: Optional[float]) -> Optional[Servable]:
        name = source.name
        self._set_state(name, version, VersionStatus("LOADING"))
        started = time.monotonic()
        try:
            loading = self.loading
            servable = Servable(name, version, path, loading.max_image_pixels, loading.batching,
                                batch_observer=loading.batch_observer)
            if loading.warmup is not None:
                servable.warmup(loading.warmup)
        except Exception as e:
            code = e.code if isinstance(e, ServingError) else grpc.StatusCode.UNKNOWN
            message = e.message if isinstance(e, ServingError) else f"{type(e).__name__}: {e}"
            log.error("model %s version %d failed to load from %s: %s", name, version, path,
                      message)
            previous = self._failed.get((name, version))
            attempts = previous[1] + 1 if previous and previous[0] == stamp else 1
            self._failed[(name, version)] = (stamp, attempts,
                                             time.monotonic() + 2.0 ** attempts)
            self._set_state(name, version, VersionStatus("END", code, message))
            return None
        servable.load_started, servable.load_seconds = started, time.monotonic() - started
        log.info("model %s version %d loaded from %s in %.2fs", name, version, path,
                 servable.load_seconds)
        self._failed.pop((name, version), None)
        return servable


def retired(desired, loaded) -> List[int]:
    """The loaded versions to unload: TF Serving's availability-preserving policy.

    Args:
      desired: the versions the policy wants (from the folders on disk).
      loaded: the versions available now.
    Returns:
      Every loaded version the policy no longer wants, once one it wants is
      available or when it wants none; while none it wants is available
      (loading, failed, waiting for a retry), all but the newest of them, so
      a version is never unloaded before its successor is available, whether
      or not its folder is still there.
    """
    unwanted = sorted(set(loaded) - set(desired))
    if not desired or set(desired) & set(loaded):
        return unwanted
    return unwanted[:-1]


def version_folders(base_path: str) -> Dict[int, str]:
    """The version folders of a model base path, as TF Serving finds them.

    Args:
      base_path: the folder holding `<integer version>/saved_model.pb` (local
        or any `tf.io.gfile` path).
    Returns:
      version -> folder, for every integer-named folder (hidden ones skipped)
      that holds a `saved_model.pb`.
    Raises:
      tf.errors.OpError: the base path cannot be listed.
    """
    versions = {}
    for entry in tf.io.gfile.listdir(base_path):
        entry = entry.rstrip("/")
        if entry.startswith(".") or not _VERSION_DIR.match(entry):
            continue
        path = os.path.join(base_path, entry)
        if tf.io.gfile.exists(os.path.join(path, "saved_model.pb")):
            versions[int(entry)] = path
    return versions


def _mtime(path: str) -> Optional[float]:
    try:
        return tf.io.gfile.stat(path).mtime_nsec
    except tf.errors.OpError:
        return None
