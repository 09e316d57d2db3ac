"""The local runner: executes stages in order with caching, lineage and atomic publishing."""
from __future__ import annotations

import errno
import hashlib
import importlib
import json
import os
import shutil
import sqlite3
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from components.contract import stage_log
from components.contract.artifacts import Artifact, fsync_tree, write_artifact_json
from components.contract.errors import ActionableError
from pipeline import config as config_lib
from pipeline import dag, input_fingerprints, integrity, root_lock
from pipeline.imports import PACKAGE_ROOT, code_fingerprint
from pipeline.metadata import MetadataStore
from pipeline.resolver import resolve_latest, summarize


class StageError(RuntimeError):
    """A stage failed in a way the user can act on; the message says how."""


@dataclass
class StageContext:
    """What a component's `run(ctx)` gets.

    Attributes:
      stage: the stage name.
      config: the resolved config as a `DeclaredConfig`: only the sections
        and keys the stage's DAG entry declares can be read.
      inputs: input name -> published `Artifact`, resolver inputs (the
        DAG's `resolved`) included when they found one.
      outputs: artifact name -> folder to fill (inside the unpublished
        execution folder).
      work_dir: a folder that survives a crash of this stage and is shared by
        every attempt with the same fingerprint (for checkpoints to resume).
      root: the pipeline root.
      execution_id: this execution's id in the metadata store.
      beam_args: extra Beam pipeline options from `--beam-arg`.
    """
    stage: str
    config: config_lib.DeclaredConfig
    inputs: dict
    outputs: dict
    work_dir: str
    root: str
    execution_id: int
    beam_args: tuple = ()

    def log(self, line: str) -> None:
        """One line of progress on stderr, as `[<stage>] <line>`."""
        stage_log.write(self.stage, line)


def stage_fingerprint(spec: dag.StageSpec, config: config_lib.PipelineConfig,
                      inputs: Mapping[str, Artifact], code: str,
                      external: Mapping[str, Mapping] | None = None) -> str:
    """sha256 over the declared config, the input and code fingerprints and the outside inputs.

    Args:
      spec: the stage.
      config: the resolved config; only what `spec.config_sections` declares counts.
      inputs: the stage's input artifacts (resolver inputs included).
      code: `pipeline.imports.code_fingerprint` of the stage's module.
      external: `pipeline.input_fingerprints.stage_records` of the stage: the
        content of the files and folders its config keys name. None or empty
        adds nothing (the fingerprint without them, the "base").
    Returns:
      64 hex digits.
    """
    payload = {
        "stage": spec.name,
        "config": config_lib.DeclaredConfig(config, spec.config_sections, spec.name).to_dict(),
        "inputs": {k: v.fingerprint for k, v in sorted(inputs.items())},
        "code": code,
    }
    if external:
        payload["external"] = {k: input_fingerprints.content_key(v)
                               for k, v in sorted(external.items())}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str)
                          .encode()).hexdigest()


def _check_writable(root: str) -> None:
    try:
        os.makedirs(root, exist_ok=True)
        probe = os.path.join(root, f".write-probe-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("x" * 4096)
            f.flush()
            os.fsync(f.fileno())
        os.remove(probe)
    except OSError as e:
        advice = ("choose a writable --root" if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
                  else "choose another --root or free some space")
        raise StageError(f"pipeline root {root!r} is not writable ({e.strerror}): "
                         f"{advice}") from None


_DISK_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "read-only file system"}
# The same errors after a library turned them into text (TensorFlow, Beam, SQLite).
_DISK_TEXTS = (("No space left on device", errno.ENOSPC),
               ("database or disk is full", errno.ENOSPC),
               ("Disk quota exceeded", errno.EDQUOT), ("Read-only file system", errno.EROFS),
               ("attempt to write a readonly database", errno.EROFS))


def disk_error(exc: BaseException | None) -> tuple[int, str | None] | None:
    """(errno, path or None) when `exc`, or an exception it chains, is a full or read-only disk."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS:
            return exc.errno, exc.filename
        text = str(exc)
        for marker, code in _DISK_TEXTS:
            at = text.find(marker)
            if at < 0:
                continue
            # "<path>; No space left on device" (TensorFlow) or
            # "[Errno 28] No space left on device: '<path>'" (an OSError as text).
            before, after = text[:at].rstrip(), text[at + len(marker):]
            path = None
            if before.endswith(";"):
                path = (before[:-1].splitlines() or [""])[-1].strip()
            elif after.startswith(": '") and "'" in after[3:]:
                path = after[3:after.index("'", 3)]
            return code, (path if path and os.path.isabs(path) else None)
        exc = exc.__cause__ or exc.__context__
    return None


def _disk_error_message(stage: str | None, error: tuple[int, str | None], root: str) -> str:
    code, path = error
    where = f" while writing {path}" if path else ""
    what = f"{stage} failed" if stage else "the pipeline failed"
    if code == errno.EROFS:
        advice = "choose a writable --root"
    else:
        advice = "free some space on that disk or choose another --root"
    return f"{what}: {_DISK_ERRNOS[code]}{where} (pipeline root {root!r}); {advice}"


@dataclass
class _RunState:
    """What a run has done so far.

    Attributes:
      selected: the stages asked for.
      produced: stage -> output name -> its `Artifact` in this run.
      ran: the stages that ran (not cached) in this run.
      rebuilt: stages not selected that ran because their outputs were damaged.
    """
    selected: list
    produced: dict = field(default_factory=dict)
    ran: set = field(default_factory=set)
    rebuilt: set = field(default_factory=set)


class Runner:
    """Runs the pipeline DAG locally.

    Args:
      config: the resolved pipeline config.
      root: the pipeline root folder (artifacts, metadata.sqlite, run_summary.json).
      use_cache: reuse outputs of earlier executions with the same fingerprint.
      beam_args: extra Beam pipeline options for the Beam stages.
      log: a function taking one line of progress text.
      stages: the DAG (default: the product's stages).
      code_root: the folder holding the stage modules' packages, whose
        import closures key the cache.
      verify: before reusing outputs, recompute their files' checksums (else
        only their sizes are compared).
    """

    def __init__(self, config: config_lib.PipelineConfig, root: str, use_cache: bool = True,
                 beam_args: Sequence[str] = (), log=None,
                 stages: Sequence[dag.StageSpec] = dag.STAGES, code_root: str = PACKAGE_ROOT,
                 verify: bool = False):
        self.stages = tuple(stages)
        self.verify = verify
        self.code_root = code_root
        self.specs = {s.name: s for s in self.stages}
        self.config = config
        self.root = os.path.abspath(root)
        self.use_cache = use_cache
        self.beam_args = tuple(beam_args)
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))

    def run(self, stages: Sequence[str] | None = None, on_start=None) -> dict:
        """Runs `stages` (default: all) in DAG order and writes `run_summary.json`.

        Stages that are not selected but feed a selected stage are resolved
        from the cache (their outputs for the current config must exist).
        One run at a time per root: another run's lock on it refuses this one
        (pipeline/root_lock.py); `on_start()` is called once the lock is held.

        Returns:
          The run summary dict.
        """
        selected = list(self.specs) if not stages else list(stages)
        for name in selected:
            if name not in self.specs:
                raise StageError(f"unknown stage {name!r}; stages: {', '.join(self.specs)}")
        # Paths the config names, before anything is recorded (a config error, not a failure).
        config_lib.check_paths(self.config, selected)
        _check_writable(self.root)
        try:
            with root_lock.hold(self.root):
                if on_start is not None:
                    on_start()
                return self._run(selected)
        except root_lock.RootBusyError as e:
            raise StageError(str(e)) from None

    def _run(self, selected: list[str]) -> dict:
        """`run` with the root's lock held."""
        store = MetadataStore(os.path.join(self.root, "metadata.sqlite"), log=self.log)
        current = None  # the stage being resolved or run
        try:
            abandoned = store.abandon_running()
            if abandoned:
                self.log(f"[runner] executions {abandoned} were interrupted earlier; "
                         "their unpublished folders are discarded")
            self._remove_stale_tmp()
            summary = {"config": self.config.name, "root": self.root, "stages": {},
                       "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
            state = _RunState(selected)
            needed = self._needed(selected)
            for spec in self.stages:
                if spec.name not in needed:
                    continue
                current = spec.name
                result = self._stage(store, spec, state)
                state.produced[spec.name] = result.pop("artifacts")
                if spec.name in selected or result["status"] == "ran":
                    summary["stages"][spec.name] = result
                    summary.update(summarize(spec, state.produced[spec.name]))
            current = None
            summary["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
            self._write_summary(summary)
            return summary
        except Exception as e:
            # A full or read-only disk: one line that says where and what to do.
            error = None if isinstance(e, StageError) else disk_error(e)
            if error is None:
                raise
            raise StageError(_disk_error_message(current, error, self.root)) from e
        finally:
            store.close()

    def _stage(self, store: MetadataStore, spec: dag.StageSpec, state: "_RunState") -> dict:
        """Runs one stage of the run, or takes it from the cache: its result with `artifacts`."""
        inputs = {in_name: state.produced[up_stage][up_art]
                  for in_name, (up_stage, up_art) in spec.inputs.items()}
        for in_name, resolver in spec.resolved.items():
            found = resolve_latest(store, resolver, inputs)
            if found is not None:
                inputs[in_name] = found
        code = code_fingerprint(spec.module, root=self.code_root)
        base = stage_fingerprint(spec, self.config, inputs, code)
        # What the config's paths hold now; a change re-runs the stage.
        external = input_fingerprints.stage_records(spec.config_sections, self.config)
        fp = stage_fingerprint(spec, self.config, inputs, code, external)
        changes = (input_fingerprints.changes_since(store, spec.name, base, external)
                   if external else [])
        reason = input_fingerprints.changes_line(changes)
        if spec.name in state.selected:
            result = self._run_stage(store, spec, inputs, fp, reason)
        else:
            result = self._unselected(store, spec, (inputs, fp), reason, state)
        if result["status"] == "ran" and external:
            store.set_external_inputs(result["execution_id"], {"base": base, "inputs": external})
            if changes:
                result["changed_inputs"] = changes
        if result["status"] == "ran":
            state.ran.add(spec.name)
        return result

    def _unselected(self, store: MetadataStore, spec: dag.StageSpec, keyed: tuple,
                    reason: str, state: "_RunState") -> dict:
        """A stage that feeds the selected ones: cached, rebuilt, run between, or refused.

        `keyed` is `(inputs, fingerprint)` of the stage.
        """
        inputs, fp = keyed
        result = self._resolve_cached(store, spec, fp)
        if result is not None:
            result["status"] = "cached"
            return result
        upstream = {up for up, _ in spec.inputs.values()}
        if store.complete_executions(spec.name, fp) or state.rebuilt & upstream:
            # Its outputs for this config were damaged since, or it reads
            # one that was: rebuilt, not refused.
            state.rebuilt.add(spec.name)
            return self._run_stage(store, spec, inputs, fp, reuse=False)
        if state.ran & upstream:
            # Between a stage that just ran and a selected one (the
            # Exporter of `--stages Trainer,Evaluator`): it runs too.
            self.log(f"[{spec.name}] runs too: it reads the new output of "
                     f"{', '.join(sorted(state.ran & upstream))} and feeds the selected stages")
            return self._run_stage(store, spec, inputs, fp)
        raise StageError(
            f"{spec.name} has no outputs for the current config"
            + (f" ({reason})" if reason else "") + "; "
            f"add it to --stages (it feeds {', '.join(sorted(set(state.selected)))})")

    def _needed(self, selected: Sequence[str]) -> set[str]:
        needed = set(selected)
        frontier = list(selected)
        while frontier:
            spec = self.specs[frontier.pop()]
            for up, _ in spec.inputs.values():
                if up not in needed:
                    needed.add(up)
                    frontier.append(up)
        return needed

    def _remove_stale_tmp(self) -> None:
        for name in self.specs:
            stage_dir = os.path.join(self.root, name)
            if not os.path.isdir(stage_dir):
                continue
            for entry in os.listdir(stage_dir):
                if entry.startswith(".tmp-"):
                    shutil.rmtree(os.path.join(stage_dir, entry), ignore_errors=True)

    def _resolve_cached(self, store: MetadataStore, spec: dag.StageSpec, fp: str) -> dict | None:
        """The newest intact outputs of an execution of `spec` with fingerprint `fp`, or None.

        Outputs that fail a check are logged (which file, which check) and skipped.
        """
        for execution_id in store.complete_executions(spec.name, fp):
            outputs = store.outputs(execution_id)
            if set(outputs) != set(spec.outputs):
                continue
            problem = integrity.outputs_problem(outputs, checksums=self.verify)
            if problem is not None:
                self.log(f"[{spec.name}] not reusing execution {execution_id}: {problem}")
                continue
            arts = {name: Artifact.load(row["uri"], spec.outputs[name])
                    for name, row in outputs.items()}
            return self._result(execution_id, arts)
        return None

    def _result(self, execution_id: int, arts: Mapping[str, Artifact]) -> dict:
        counts = {}
        for art in arts.values():
            counts.update(art.counts)
        return {"execution_id": execution_id,
                "outputs": {name: art.uri for name, art in arts.items()},
                "counts": counts, "artifacts": dict(arts)}

    def _run_stage(self, store: MetadataStore, spec: dag.StageSpec,
                   inputs: Mapping[str, Artifact], fp: str, reason: str = "",
                   reuse: bool = True) -> dict:
        if self.use_cache and reuse:
            cached = self._resolve_cached(store, spec, fp)
            if cached is not None:
                store.record_cached(spec.name, fp, cached["execution_id"])
                self.log(f"[{spec.name}] cached (execution {cached['execution_id']})")
                cached["status"] = "cached"
                return cached
        if reason:  # which outside input changed
            self.log(f"[{spec.name}] {reason}: running")
        resolved = config_lib.to_dict(self.config)
        execution_id = store.begin_execution(spec.name, fp, resolved)
        for in_name, art in inputs.items():
            art_id = store.artifact_id(art.uri)
            if art_id is not None:
                store.add_event(execution_id, art_id, "input", in_name)
        stage_dir = os.path.join(self.root, spec.name)
        tmp_dir = os.path.join(stage_dir, f".tmp-{execution_id}")
        final_dir = os.path.join(stage_dir, str(execution_id))
        work_dir = os.path.join(stage_dir, ".work", fp[:16])
        os.makedirs(work_dir, exist_ok=True)
        outputs = {name: os.path.join(tmp_dir, name) for name in spec.outputs}
        for path in outputs.values():
            os.makedirs(path, exist_ok=True)
        declared = config_lib.DeclaredConfig(self.config, spec.config_sections, spec.name)
        ctx = StageContext(stage=spec.name, config=declared, inputs=dict(inputs),
                           outputs=outputs, work_dir=work_dir, root=self.root,
                           execution_id=execution_id, beam_args=self.beam_args)
        self.log(f"[{spec.name}] running (execution {execution_id})")
        start = time.time()
        try:
            module = importlib.import_module(spec.module)
            results = module.run(ctx) or {}
            for name, typ in spec.outputs.items():
                res = results.get(name, {})
                # Paths inside the root are recorded relative to it, and every
                # file with its size and checksum: a cache hit checks them.
                write_artifact_json(Artifact(type=typ, uri=outputs[name], producer=spec.name,
                                             execution_id=execution_id,
                                             fingerprint=f"{fp}:{name}:{execution_id}",
                                             inputs={k: v.uri for k, v in inputs.items()},
                                             counts=res.get("counts", {}),
                                             properties=res.get("properties", {}),
                                             files=integrity.file_list(outputs[name])),
                                    config=resolved, root=self.root)
            fsync_tree(tmp_dir)
            os.replace(tmp_dir, final_dir)  # the atomic publish
        except BaseException as e:
            # The unpublished folder goes first: on a full disk, that frees the
            # space the metadata store needs to record the failure.
            shutil.rmtree(tmp_dir, ignore_errors=True)
            try:
                store.finish_execution(execution_id, "failed",
                                       error="".join(traceback.format_exception_only(type(e), e)))
            except sqlite3.Error as db_error:  # the original error matters more
                self.log(f"[runner] could not record execution {execution_id} as failed: "
                         f"{db_error}")
            read = integrity.damaged_read(e) if isinstance(e, Exception) else None
            message = read and integrity.damaged_read_message(
                spec.name, inputs, read, self.root, self.stages, work_dir)
            if message:
                raise StageError(message) from e
            if isinstance(e, ActionableError):
                raise StageError(f"{spec.name} failed: {e}") from e
            raise
        arts = {}
        for name, typ in spec.outputs.items():
            uri = os.path.join(final_dir, name)
            arts[name] = Artifact.load(uri, typ)
            store.add_artifact(execution_id, name, typ, uri, arts[name].fingerprint)
        result = self._result(execution_id, arts)
        store.finish_execution(execution_id, "complete", counts=result["counts"])
        self.log(f"[{spec.name}] done in {time.time() - start:.1f}s: "
                 f"{json.dumps(result['counts'], default=str)}")
        result["status"] = "ran"
        result["seconds"] = round(time.time() - start, 2)
        return result

    def _write_summary(self, summary: dict) -> None:
        path = os.path.join(self.root, "run_summary.json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(summary, f, indent=2, default=str)
        os.replace(tmp, path)


def inspect(root: str, verify: bool = False) -> dict:
    """Executions (newest first) with their input/output artifacts.

    Args:
      root: the pipeline root.
      verify: check every published artifact's file sizes and checksums.
    Returns:
      {"root", "executions": [...]}, artifact paths as they resolve now; with
      `verify`, each output gets a `verify` entry ({"status": ok | damaged |
      unchecked | missing, "problem"}) and `verify` counts them ({"ok": n, ...}).
    """
    db = os.path.join(root, "metadata.sqlite")
    if not os.path.exists(db):
        raise StageError(f"no metadata store at {db}: run `captioner run --root {root}` first")
    store = MetadataStore(db)
    try:
        checked = integrity.verify_artifacts(store.artifacts()) if verify else {}
        executions = []
        for x in store.executions():
            events = store.events(x["id"])
            executions.append({
                "id": x["id"], "stage": x["stage"], "state": x["state"],
                "reused_execution": x["reused_execution"],
                "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(x["started"])),
                "seconds": (round(x["finished"] - x["started"], 2) if x["finished"] else None),
                "fingerprint": x["fingerprint"][:12],
                "counts": json.loads(x["counts"]) if x["counts"] else {},
                "inputs": [e for e in events if e["kind"] == "input"],
                "outputs": [e for e in events if e["kind"] == "output"],
                "error": x["error"],
            })
        info = {"root": os.path.abspath(root), "executions": executions}
        if verify:
            integrity.add_verification(info, checked)
        return info
    finally:
        store.close()
