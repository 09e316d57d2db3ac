"""The SQLite metadata store: executions, artifacts and lineage events."""
from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any, Callable, Iterable

_SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  stage TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  state TEXT NOT NULL,            -- running | complete | failed | abandoned | cached
  reused_execution INTEGER,       -- for cached: the execution whose outputs were reused
  started REAL NOT NULL,
  finished REAL,
  config TEXT,
  counts TEXT,
  error TEXT
);
CREATE TABLE IF NOT EXISTS artifacts (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  execution_id INTEGER NOT NULL REFERENCES executions(id),
  name TEXT NOT NULL,
  type TEXT NOT NULL,
  uri TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
  execution_id INTEGER NOT NULL REFERENCES executions(id),
  artifact_id INTEGER NOT NULL REFERENCES artifacts(id),
  kind TEXT NOT NULL,             -- input | output
  name TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS executions_by_fp ON executions(stage, fingerprint, state);
"""


class MetadataStore:
    """A small ML-Metadata-like store in one SQLite file.

    Artifact URIs are stored relative to the folder holding the database (the
    pipeline root) and returned resolved against it, so a root that is copied
    or moved reads its own artifacts. Stores written before that hold absolute
    URIs, `<former root>/<Stage>/<id>/<name>`: those are read the same way.

    Args:
      path: the database file (created if missing).
      log: called once with a line of text when the store's URIs name a
        former location of the root.
    """

    def __init__(self, path: str, log: Callable[[str], None] | None = None):
        self.path = path
        self.root = os.path.dirname(os.path.abspath(path))
        self._log = log
        self._former_roots: set[str] = set()
        self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        self._add_column("executions", "external_inputs", "TEXT")

    def _add_column(self, table: str, column: str, typ: str) -> None:
        """Adds `column` to `table` unless it is there: a store from before it stays readable."""
        columns = {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}
        if column in columns:
            return
        try:
            self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {typ}")
        except sqlite3.OperationalError as e:
            # Another process added it first, or a read-only store (inspect still reads it).
            if "duplicate column" not in str(e) and "readonly" not in str(e):
                raise

    def close(self) -> None:
        self._db.close()

    def begin_execution(self, stage: str, fingerprint: str, config: Any) -> int:
        cur = self._db.execute(
            "INSERT INTO executions(stage, fingerprint, state, started, config) VALUES (?,?,?,?,?)",
            (stage, fingerprint, "running", time.time(), json.dumps(config, default=str)))
        return int(cur.lastrowid)

    def finish_execution(self, execution_id: int, state: str, counts: Any = None,
                         error: str | None = None) -> None:
        self._db.execute(
            "UPDATE executions SET state=?, finished=?, counts=?, error=? WHERE id=?",
            (state, time.time(), json.dumps(counts or {}, default=str), error, execution_id))

    def record_cached(self, stage: str, fingerprint: str, reused: int) -> int:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO executions(stage, fingerprint, state, reused_execution, started, finished)"
            " VALUES (?,?,?,?,?,?)", (stage, fingerprint, "cached", reused, now, now))
        return int(cur.lastrowid)

    def set_external_inputs(self, execution_id: int, records: Any) -> None:
        """Records the outside inputs an execution read (`pipeline.input_fingerprints`)."""
        self._db.execute("UPDATE executions SET external_inputs=? WHERE id=?",
                         (json.dumps(records, default=str), execution_id))

    def external_inputs(self, stage: str) -> list[tuple[int, Any]]:
        """(execution id, recorded outside inputs) of complete executions of `stage`, newest first.

        Executions from before the column existed have none and are left out.
        """
        rows = self._db.execute(
            "SELECT id, external_inputs FROM executions WHERE stage=? AND state='complete'"
            " AND external_inputs IS NOT NULL ORDER BY id DESC", (stage,)).fetchall()
        return [(int(r["id"]), json.loads(r["external_inputs"])) for r in rows]

    def abandon_running(self) -> list[int]:
        """Marks executions left `running` by a killed process as `abandoned`."""
        rows = self._db.execute("SELECT id FROM executions WHERE state='running'").fetchall()
        ids = [int(r["id"]) for r in rows]
        if ids:
            self._db.execute("UPDATE executions SET state='abandoned', finished=? "
                             "WHERE state='running'", (time.time(),))
        return ids

    def stored_uri(self, uri: str) -> str:
        """How `uri` is stored: relative to the root when inside it, else absolute."""
        uri, root = os.path.normpath(os.path.abspath(uri)), os.path.normpath(self.root)
        if uri.startswith(root.rstrip(os.sep) + os.sep):
            return os.path.relpath(uri, root)
        return uri

    def resolve_uri(self, stored: str) -> str:
        """The path a stored URI names now (absolute).

        A relative URI is joined to the root. An absolute one inside the
        root's former location (older stores) keeps its last three parts,
        `<Stage>/<id>/<name>`, joined to the root; the first such location
        seen is logged once.
        """
        if not os.path.isabs(stored):
            return os.path.join(self.root, stored)
        parts = os.path.normpath(stored).split(os.sep)
        if len(parts) < 5 or not parts[-2].isdigit():
            return stored  # not an artifact folder of a pipeline root: kept as it is
        former = os.sep.join(parts[:-3]) or os.sep
        if former != os.path.normpath(self.root) and former not in self._former_roots:
            self._former_roots.add(former)
            if self._log is not None:
                self._log(f"[runner] {self.path} records artifacts under {former}, this "
                          f"root's former location: reading them under {self.root}")
        return os.path.join(self.root, *parts[-3:])

    def _resolved(self, row: sqlite3.Row) -> dict:
        row = dict(row)
        if row.get("uri") is not None:
            row["uri"] = self.resolve_uri(row["uri"])
        return row

    def add_artifact(self, execution_id: int, name: str, type: str, uri: str,
                     fingerprint: str) -> int:
        cur = self._db.execute(
            "INSERT INTO artifacts(execution_id, name, type, uri, fingerprint, created)"
            " VALUES (?,?,?,?,?,?)",
            (execution_id, name, type, self.stored_uri(uri), fingerprint, time.time()))
        artifact_id = int(cur.lastrowid)
        self.add_event(execution_id, artifact_id, "output", name)
        return artifact_id

    def add_event(self, execution_id: int, artifact_id: int, kind: str, name: str) -> None:
        self._db.execute("INSERT INTO events(execution_id, artifact_id, kind, name)"
                         " VALUES (?,?,?,?)", (execution_id, artifact_id, kind, name))

    def artifact_id(self, uri: str) -> int | None:
        """The newest artifact recorded at `uri` (as it resolves now), or None."""
        stored = self.stored_uri(uri)
        row = self._db.execute("SELECT id FROM artifacts WHERE uri=? ORDER BY id DESC LIMIT 1",
                               (stored,)).fetchone()
        if row is None and not os.path.isabs(stored):
            # An older store's absolute URI: the same <Stage>/<id>/<name> under any root.
            tail = os.sep + stored
            rows = self._db.execute(
                "SELECT id, uri FROM artifacts WHERE substr(uri, -?) = ? ORDER BY id DESC",
                (len(tail), tail)).fetchall()
            row = next((r for r in rows if self.resolve_uri(r["uri"]) == os.path.join(
                self.root, stored)), None)
        return int(row["id"]) if row else None

    def complete_executions(self, stage: str, fingerprint: str) -> list[int]:
        """Complete executions of `stage` with `fingerprint`, newest first."""
        rows = self._db.execute(
            "SELECT id FROM executions WHERE stage=? AND fingerprint=? AND state='complete'"
            " ORDER BY id DESC", (stage, fingerprint)).fetchall()
        return [int(r["id"]) for r in rows]

    def outputs(self, execution_id: int) -> dict[str, dict]:
        rows = self._db.execute(
            "SELECT a.* FROM artifacts a JOIN events e ON e.artifact_id = a.id"
            " WHERE e.execution_id=? AND e.kind='output'", (execution_id,)).fetchall()
        return {r["name"]: self._resolved(r) for r in rows}

    def latest_outputs(self, stage: str, name: str) -> list[dict]:
        """Artifacts named `name` that complete executions of `stage` wrote, newest first."""
        rows = self._db.execute(
            "SELECT a.* FROM artifacts a JOIN executions x ON x.id = a.execution_id"
            " WHERE x.stage=? AND a.name=? AND x.state='complete' ORDER BY a.id DESC",
            (stage, name)).fetchall()
        return [self._resolved(r) for r in rows]

    def artifacts(self) -> list[dict]:
        """Every artifact of a complete execution, with its producer's stage, newest first."""
        rows = self._db.execute(
            "SELECT a.*, x.stage FROM artifacts a JOIN executions x ON x.id = a.execution_id"
            " WHERE x.state='complete' ORDER BY a.id DESC").fetchall()
        return [self._resolved(r) for r in rows]

    def executions(self) -> list[dict]:
        rows = self._db.execute("SELECT * FROM executions ORDER BY id DESC").fetchall()
        return [dict(r) for r in rows]

    def events(self, execution_id: int) -> list[dict]:
        rows = self._db.execute(
            "SELECT e.kind, e.name, a.id AS artifact_id, a.type, a.uri FROM events e"
            " JOIN artifacts a ON a.id = e.artifact_id WHERE e.execution_id=?"
            " ORDER BY e.kind, e.name", (execution_id,)).fetchall()
        return [self._resolved(r) for r in rows]

    def lineage(self, artifact_id: int) -> Iterable[dict]:
        """The executions that produced and consumed an artifact."""
        rows = self._db.execute(
            "SELECT e.kind, x.id AS execution_id, x.stage FROM events e"
            " JOIN executions x ON x.id = e.execution_id WHERE e.artifact_id=?",
            (artifact_id,)).fetchall()
        return [dict(r) for r in rows]
