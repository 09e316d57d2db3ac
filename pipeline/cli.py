"""`captioner`: the one command-line entry point.

Subcommands: `run` (pipeline stages), `inspect` (metadata store), `serve`
(TF-Serving-compatible server), `caption` (gRPC client; bulk, as a Beam job, with
`--model`), `config` (a resolved config, or every key's reference),
`tensorboard` (the training logs of a pipeline root), `demo` (the whole main job).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys

from pipeline import config as config_lib
from pipeline import dag


def _quiet(verbose: bool, command: str | None) -> None:
    """Quiet by default (`components.contract.quiet`); `--verbose` or CAPTIONER_VERBOSE=1 shows every log."""
    if verbose or os.environ.get("CAPTIONER_VERBOSE") == "1":
        os.environ["CAPTIONER_VERBOSE"] = "1"
        os.environ.pop("CAPTIONER_QUIET", None)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
        return
    from components.contract import quiet
    quiet.install(python_logs=command not in ("serve",))


def _add_config_args(p: argparse.ArgumentParser, default: str | None = "demo") -> None:
    p.add_argument("--config", default=default,
                   help=f"named config ({', '.join(config_lib.named_configs())}) or a .py path"
                   + ("; default: the config the root was last run with, else demo"
                      if default is None else ""))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V",
                   help="override a config value, e.g. --set train.batch_size=8 (repeatable)")


def _resolve_run_config(args) -> tuple[config_lib.PipelineConfig, str, list[str]]:
    """The config of `captioner run`: `--config`, else the one recorded in the root, else demo.

    Says on stderr which config is used when it comes from the root, and
    which keys differ from the root's when `--config` changes them.
    """
    record = config_lib.read_root_config(args.root)
    recorded = config_lib.from_dict(record["resolved"]) if record else None
    where = os.path.join(args.root, config_lib.ROOT_CONFIG_FILE)
    if args.config is None and recorded is not None:
        config = config_lib.validate(config_lib.apply_overrides(recorded, args.overrides))
        label, overrides = record["config"], list(record["overrides"]) + list(args.overrides)
        print(f"captioner: using config {label!r}"
              + (f" with {' '.join('--set ' + o for o in record['overrides'])}"
                 if record["overrides"] else "")
              + f", recorded in {where} (--config to change it)", file=sys.stderr)
    else:
        label, overrides = args.config or "demo", list(args.overrides)
        config = config_lib.load_config(label, overrides)
    if recorded is not None:
        changed = config_lib.config_differences(recorded, config)
        if changed:
            print(f"captioner: this config differs from the one {args.root} was last run with "
                  f"({record['config']!r}): " + "; ".join(changed), file=sys.stderr)
    return config, label, overrides


def _cmd_run(args) -> int:
    stages = [s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else None
    for name in stages or []:
        if name not in dag.STAGE_NAMES:
            raise config_lib.ConfigError(
                f"unknown stage {name!r}; stages: {', '.join(dag.STAGE_NAMES)}"
                f"{config_lib.did_you_mean(name, dag.STAGE_NAMES)}")
    config, label, overrides = _resolve_run_config(args)
    config_lib.check_paths(config, stages)
    from pipeline.runner import Runner
    runner = Runner(config, args.root, use_cache=not args.no_cache, beam_args=args.beam_arg,
                    verify=args.verify)
    summary = runner.run(stages, on_start=lambda: config_lib.write_root_config(
        args.root, label, overrides, config))
    print(f"run summary: {os.path.join(os.path.abspath(args.root), 'run_summary.json')}")
    for name, st in summary["stages"].items():
        print(f"  {name:15s} {st['status']:7s} execution {st['execution_id']}  "
              f"{json.dumps(st.get('counts', {}), default=str)}")
    if summary.get("metrics"):
        keys = ("Bleu_1", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "attribute_accuracy",
                "relation_accuracy", "grounding", "grounding_noun", "dangling_ending_rate")
        shown = {k: summary["metrics"][k] for k in keys if k in summary["metrics"]}
        print("  metrics: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                        for k, v in shown.items()))
    if "blessed" in summary and not summary["blessed"]:
        print("  model NOT blessed: nothing was pushed (see the Blessing artifact for reasons)")
    if "Trainer" in summary["stages"]:
        print(f"  training curves: captioner tensorboard --root {args.root}")
    return 0


def _cmd_inspect(args) -> int:
    from pipeline.runner import inspect
    info = inspect(args.root, verify=args.verify)
    # With --verify, a damaged artifact makes the exit status 1 (for scripts and CI).
    status = 1 if info.get("verify", {}).get("damaged") else 0
    from components.evaluator.report_page import report_of
    for x in info["executions"]:
        x.update(_blessing_of(x))
        x["outputs"] = [dict(o, **report_of(o)) for o in x["outputs"]]  # an Evaluation's page
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return status
    print(f"pipeline root: {info['root']}")
    for x in info["executions"]:
        reused = f" (reuses {x['reused_execution']})" if x["reused_execution"] else ""
        secs = f" {x['seconds']}s" if x["seconds"] is not None else ""
        print(f"#{x['id']:<4d} {x['stage']:15s} {x['state']:9s}{reused} {x['started']}{secs}"
              f" fp={x['fingerprint']}")
        for e in x["inputs"]:
            print(f"       <- {e['name']:13s} {e['type']:12s} #{e['artifact_id']} {e['uri']}")
        for e in x["outputs"]:
            check = e.get("verify")
            shown = "" if check is None else (
                f"  [DAMAGED: {check['problem']}]" if check["status"] == "damaged"
                else f"  [{check['status']}]")
            print(f"       -> {e['name']:13s} {e['type']:12s} #{e['artifact_id']} {e['uri']}"
                  + shown + (f"\n          report: {e['report']}" if "report" in e else ""))
        if "blessing" in x:
            _print_blessing(x["blessing"])
        if x["counts"]:
            print(f"       counts {json.dumps(x['counts'], default=str)}")
        if x["error"]:
            print(f"       error: {x['error'].strip()}")
    if "verify" in info:
        v = info["verify"]
        print(f"verify: {v['ok']} artifacts intact, {v['damaged']} damaged, {v['unchecked']} "
              "unchecked (published before file lists were recorded)"
              + (f", {v['missing']} missing (folder removed)" if v["missing"] else ""))
        if v["damaged"]:
            print(f"  `captioner run --root {shlex.quote(args.root)} --verify` rebuilds the "
                  "damaged outputs the current config uses")
    return status


def _blessing_of(execution: dict) -> dict:
    """`{"blessing": ...}`: an Evaluator execution's verdict, reasons and comparison rows."""
    from components.contract.artifacts import Artifact, ArtifactError
    for e in execution["outputs"]:
        if e["type"] != "Blessing" or execution["state"] != "complete":
            continue
        try:
            props = Artifact.load(e["uri"]).properties
        except ArtifactError:
            return {}
        baseline = props.get("baseline") or {}
        return {"blessing": {"blessed": props.get("blessed"), "reasons": props.get("reasons", []),
                             "baseline": baseline.get("serving_model_uri"),
                             "comparison": props.get("comparison", [])}}
    return {}


def _print_blessing(blessing: dict) -> None:
    from components.evaluator.metrics.blessing import format_rows
    verdict = "BLESSED" if blessing["blessed"] else "NOT BLESSED"
    against = (f" against {blessing['baseline']}" if blessing["baseline"]
               else " (first push: no baseline)")
    print(f"       {verdict}{against}")
    if blessing["baseline"] and blessing["comparison"]:
        for line in format_rows(blessing["comparison"]):
            print(f"         {line}")
    for reason in blessing["reasons"]:
        print(f"         reason: {reason}")


def _cmd_config(args) -> int:
    print(config_reference_markdown() if args.reference else json.dumps(
        config_lib.to_dict(config_lib.load_config(args.config, args.overrides)), indent=2))
    return 0


def config_reference_markdown() -> str:
    """The config reference table, generated from the dataclasses."""
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, typ, default, comment in config_lib.describe_fields():
        comment = comment.replace("|", "\\|")
        lines.append(f"| `{key}` | {typ} | `{json.dumps(default)}` | {comment} |")
    return "\n".join(lines)


# ServeConfig field -> `captioner serve` flag (declared with the setting).
SERVE_FLAGS = {f.name: f.metadata["flag"] for f in dataclasses.fields(config_lib.ServeConfig)}


def serve_argv(argv: list[str]) -> list[str]:
    """`captioner serve` arguments with `--config NAME` / `--set K=V` turned into flags.

    The config's `serve` section becomes flags placed before the user's own,
    so flags given on the command line win. Without `--config` the line is
    returned as it is (the server's defaults equal `ServeConfig`'s).
    """
    name, overrides, rest = None, [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, has_value, value = arg.partition("=")
        if key in ("--config", "--set"):
            if not has_value:
                if i + 1 >= len(argv):
                    raise config_lib.ConfigError(f"{key} needs a value")
                value = argv[i + 1]
                i += 1
            if key == "--config":
                name = value
            else:
                overrides.append(value)
        else:
            rest.append(arg)
        i += 1
    if name is None and not overrides:
        return rest
    serve = config_lib.load_config(name or "demo", overrides).serve
    prefix = [x for field, flag in SERVE_FLAGS.items() for x in (flag, str(getattr(serve, field)))]
    return prefix + rest


TENSORBOARD_HELP = """\
TensorBoard on the training curves of a pipeline root: the EncoderTrainer's
(encoder/loss, encoder/val_map, encoder/learning_rate, ... per epoch) and the
Trainer's (train/*, val/*, attention maps; scst/* for the self-critical
phase). Runs: `<Stage>/<execution id>` for a published execution (the logs/
of its artifact), `<Stage>/running-<fp>` for a stage training now (the logs
of its work folder, written as it trains), and `<Stage>/unpublished-<fp>`
for one that stopped before publishing. A work folder whose logs an
execution already published is not shown twice. A stage that starts after
TensorBoard does needs a restart of this command to show."""

# Stages whose work folder and artifact hold TensorBoard logs.
LOG_STAGES = ("EncoderTrainer", "Trainer")
LOGS_DIR = "logs"  # components.contract.schema.LOGS_DIR (not imported: the CLI starts without it)


def _cmd_tensorboard(args) -> int:
    logdirs = tensorboard_logdirs(args.root)
    if not logdirs:
        print(f"captioner: no TensorBoard logs under {args.root} yet: run the EncoderTrainer "
              f"or the Trainer first (captioner run --root {args.root})", file=sys.stderr)
        return 1
    spec = ",".join(f"{name}:{path}" for name, path in logdirs)
    command = ["tensorboard", f"--logdir_spec={spec}", "--port", str(args.port),
               "--host", args.host]
    if args.print_only:
        print(" ".join(command))
        return 0
    print("captioner: " + " ".join(command), file=sys.stderr)
    # In this process, so that the quiet default covers TensorFlow's start-up too.
    sys.argv = command
    from tensorboard import main as tensorboard_main
    try:
        tensorboard_main.run_main()
    except KeyboardInterrupt:
        pass
    return 0


def _event_files(folder: str) -> set[str]:
    """The names of the TensorBoard event files in `folder` and below it."""
    return {name for _, _, files in os.walk(folder) for name in files
            if name.startswith("events.out.tfevents")}


def _running_fingerprints(root: str, stage: str) -> set[str]:
    """Fingerprints of `stage`'s executions that the metadata store says are running.

    One SELECT (a WAL store serves readers while a pipeline writes it); an
    unreadable store knows of none.
    """
    import sqlite3
    path = os.path.join(root, "metadata.sqlite")
    if not os.path.exists(path):  # connecting would create it
        return set()
    try:
        db = sqlite3.connect(path, timeout=2.0)
        try:
            rows = db.execute("SELECT fingerprint FROM executions WHERE stage=? AND "
                              "state='running'", (stage,)).fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return set()
    return {row[0] for row in rows}


def tensorboard_logdirs(root: str) -> list[tuple[str, str]]:
    """(run name, logs folder) of every EncoderTrainer and Trainer TensorBoard log in `root`.

    Published executions come first, named `<Stage>/<execution id>`
    (`<root>/<Stage>/<id>/<artifact>/logs`). Then the work folders
    (`<root>/<Stage>/.work/<fp>/logs`, where a stage writes while it trains)
    whose event files are not all published already: `<Stage>/running-<fp8>`
    while the metadata store records the stage running with that
    fingerprint, else `<Stage>/unpublished-<fp8>` (stopped or killed before
    publishing). Folders holding no event file are left out.

    Args:
      root: the pipeline root.
    Returns:
      The `(name, folder)` pairs, in stage order, for `--logdir_spec`.
    """
    found = []
    for stage in LOG_STAGES:
        stage_dir = os.path.join(root, stage)
        if not os.path.isdir(stage_dir):
            continue
        published: set[str] = set()
        executions = sorted((e for e in os.listdir(stage_dir) if e.isdigit()), key=int)
        for execution in executions:
            exec_dir = os.path.join(stage_dir, execution)
            for artifact in sorted(os.listdir(exec_dir)) if os.path.isdir(exec_dir) else []:
                logs = os.path.join(exec_dir, artifact, LOGS_DIR)
                events = _event_files(logs)
                if events:
                    found.append((f"{stage}/{execution}", logs))
                    published |= events
        work_root = os.path.join(stage_dir, ".work")
        if not os.path.isdir(work_root):
            continue
        running = {fp[:16] for fp in _running_fingerprints(root, stage)}
        for fp in sorted(os.listdir(work_root)):
            logs = os.path.join(work_root, fp, LOGS_DIR)
            events = _event_files(logs)
            # Event file names are unique (host, pid, time): all of them in
            # an artifact means an execution published these very curves.
            if events and not events <= published:
                state = "running" if fp in running else "unpublished"
                found.append((f"{stage}/{state}-{fp[:8]}", logs))
    return found


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every default (none for flags that are off unless given)."""

    def _get_help_string(self, action):
        if action.default in (None, False, [], "", argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="captioner", description=__doc__.splitlines()[0],
                                     formatter_class=_Formatter)
    parser.add_argument("--verbose", action="store_true",
                        help="show TensorFlow, absl, Beam and Keras logs and warnings")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name, **kw):
        return sub.add_parser(name, formatter_class=_Formatter, **kw)

    p = add("run", help="run pipeline stages (with caching)")
    _add_config_args(p, default=None)
    p.add_argument("--root", default="pipeline_root", help="pipeline root folder")
    p.add_argument("--stages", default="",
                   help=f"comma-separated subset of {','.join(dag.STAGE_NAMES)} (default: all)")
    p.add_argument("--no-cache", action="store_true", help="re-run every selected stage")
    p.add_argument("--verify", action="store_true",
                   help="before reusing outputs, check their files' checksums (reads them in "
                        "full; sizes are always checked): a damaged output is rebuilt")
    p.add_argument("--beam-arg", action="append", default=[], metavar="ARG",
                   help="extra Beam pipeline option, e.g. --beam-arg=--runner=FlinkRunner")
    p.set_defaults(func=_cmd_run)

    p = add("inspect", help="show executions, artifacts and lineage")
    p.add_argument("--root", default="pipeline_root", help="pipeline root folder")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--verify", action="store_true",
                   help="check every published artifact's file sizes and checksums; "
                        "exit status 1 when one is damaged")
    p.set_defaults(func=_cmd_inspect)

    p = add("config", help="print a resolved config, or --reference for every key")
    _add_config_args(p)
    p.add_argument("--reference", action="store_true",
                   help="print the reference table of every key instead")
    p.set_defaults(func=_cmd_config)

    p = add("tensorboard", help="TensorBoard on the EncoderTrainer's and Trainer's curves, "
                                "running stages included", description=TENSORBOARD_HELP)
    p.add_argument("--root", default="pipeline_root", help="pipeline root folder")
    p.add_argument("--port", type=int, default=6006, help="TensorBoard's port")
    p.add_argument("--host", default="127.0.0.1", help="TensorBoard's bind address")
    p.add_argument("--print-only", action="store_true",
                   help="print the tensorboard command instead of running it")
    p.set_defaults(func=_cmd_tensorboard)

    # Listed for `--help`; `_main` hands their command lines to `DELEGATED`.
    add("serve", help="TF-Serving-compatible gRPC/REST server", add_help=False)
    add("caption", help="caption images through a gRPC server, or with --model PATH (a "
                        "SavedModel) as a Beam job without one", add_help=False)
    add("demo", help="the whole main job on the synthetic data", add_help=False)
    return parser


# Subcommands that parse their own flags: name -> "module:function(argv)".
DELEGATED = {"serve": "serving.server.model_server:main", "caption": "serving.client.caption_client:caption_main",
             "demo": "pipeline.demo:main"}
BULK_CAPTION = "components.bulk_inferrer.cli:main"  # `caption --model PATH`: no server


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `--verbose` before or after the subcommand (none of them has a flag of that name).
    verbose = "--verbose" in argv
    argv = [a for a in argv if a != "--verbose"]
    _quiet(verbose, argv[0] if argv else None)
    try:
        status = _main(argv, verbose)
        sys.stdout.flush()  # here, where a closed pipe can still be caught
        return status
    except BrokenPipeError:
        # `captioner config | head`: the reader left; say nothing more, and
        # keep the flush at exit from failing again.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 141  # 128 + SIGPIPE, as a shell reports a command a pipe ended


def _delegate(command: str, rest: list[str]) -> int:
    """Runs a subcommand that parses its own flags; `caption --model` is bulk captioning."""
    import importlib
    bulk = command == "caption" and any(a.split("=", 1)[0] == "--model" for a in rest)
    if command == "serve":
        try:
            rest = serve_argv(rest)
        except config_lib.ConfigError as e:
            print(f"captioner: config error: {e}", file=sys.stderr)
            return 2
    module, func = (BULK_CAPTION if bulk else DELEGATED[command]).split(":")
    return int(getattr(importlib.import_module(module), func)(rest) or 0)


def _main(argv: list[str], verbose: bool) -> int:
    # serve / caption / demo own their flags: hand them the rest of the line.
    if argv and argv[0] in DELEGATED:
        return _delegate(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except config_lib.ConfigError as e:
        print(f"captioner: config error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("captioner: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # the stage errors users can act on
        from pipeline.runner import StageError
        if isinstance(e, StageError):
            print(f"captioner: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
