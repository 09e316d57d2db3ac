"""How the Trainer starts: the stage entry `run(ctx)`, and `python -m components.trainer` (`main`: workers, child processes).

`mirrored` over logical CPU devices and `multi_worker` need settings made
before TensorFlow runs its first op; when an earlier stage of the same
pipeline process already started TensorFlow, `run` trains in a child process
(`python -m components.trainer`, `main` below) instead and reads its result
file. Under `multi_worker` only the chief runs the stage and publishes the
artifact; every other worker runs `main` with its own `TF_CONFIG`
(docs/multi_worker.md), saves into temporary folders and deletes them. A
child trainer exits when its pipeline process dies. This module imports no
TensorFlow, so that importing it decides nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from components.trainer import distribute


def _worker_command(ctx, config_path: str) -> str:
    return (f"TF_CONFIG='<this worker>' python -m components.trainer "
            f"--annotations {ctx.inputs['annotations'].uri} "
            f"--vocabulary {ctx.inputs['vocabulary'].uri} --config-json {config_path}")


def run(ctx) -> dict:
    """The Trainer stage: Annotations + Vocabulary -> Model (see `components.trainer`).

    Trains in this process, or in a child process when the strategy needs a
    fresh TensorFlow runtime (logical CPU devices, multi-worker collectives)
    and an earlier stage already started TensorFlow here.

    Returns:
      `{"model": {"counts": {...}, "properties": {...}}}`.
    """
    from components.contract import config as config_lib
    if ctx.config.train.init_model and not os.path.isabs(ctx.config.train.init_model):
        # From the command's folder; a child trainer runs elsewhere.
        ctx.config = config_lib.replace_section(
            ctx.config, "train", init_model=os.path.abspath(ctx.config.train.init_model))
    tcfg = ctx.config.train
    annotations, vocabulary = ctx.inputs["annotations"], ctx.inputs["vocabulary"]
    out = ctx.outputs["model"]
    os.makedirs(ctx.work_dir, exist_ok=True)
    config_path = os.path.join(ctx.work_dir, "config.json")
    with open(config_path, "w") as f:
        json.dump(config_lib.to_dict(ctx.config), f, indent=2, sort_keys=True)
    if tcfg.strategy == "multi_worker":
        role = distribute.cluster_role()
        if not role.is_chief:
            raise distribute.StrategyError(
                f"this process is {role.task_type}:{role.task_id} of a multi_worker job; only "
                "the chief runs the Trainer stage and publishes the Model. Start this worker "
                "with: " + _worker_command(ctx, config_path))
        ctx.log("multi_worker chief: start every other worker with\n  "
             + _worker_command(ctx, config_path))
    if distribute.needs_fresh_process(tcfg):
        ctx.log(f"TensorFlow already runs in this process; training in a child process "
             f"(train.strategy={tcfg.strategy}, cpu_logical_devices={tcfg.cpu_logical_devices})")
        return _run_child(annotations, vocabulary, config_path, out, ctx.work_dir)
    from components.trainer.phases import train
    return train(annotations.uri, vocabulary.uri, ctx.config, out, ctx.work_dir,
                 annotations_properties=annotations.properties,
                 vocabulary_properties=vocabulary.properties, log=ctx.log)


def _run_child(annotations, vocabulary, config_path, output_uri, work_dir) -> dict:
    """Runs `python -m components.trainer` and returns its result."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    fd, result_path = tempfile.mkstemp(prefix="trainer-result-", suffix=".json", dir=work_dir)
    os.close(fd)
    env = dict(os.environ)
    env["PYTHONPATH"] = package_root + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "components.trainer", "--annotations", annotations.uri,
           "--vocabulary", vocabulary.uri, "--config-json", config_path,
           "--output", output_uri, "--work-dir", work_dir, "--result", result_path,
           "--parent-pid", str(os.getpid())]
    proc = subprocess.Popen(cmd, env=env, cwd=package_root)
    try:
        code = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    try:
        if code != 0:
            raise RuntimeError(f"the Trainer child process failed with exit code {code} "
                               "(its messages are above)")
        with open(result_path) as f:
            return json.load(f)
    finally:
        os.remove(result_path)


def _exit_with_parent(parent_pid: int, interval: float = 1.0) -> None:
    """Ends this child process soon after its parent dies (a killed pipeline leaves no trainer)."""
    import threading

    def watch():
        while True:
            if os.getppid() != parent_pid:
                os._exit(3)
            time.sleep(interval)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv=None) -> int:
    """`python -m components.trainer`: train from artifact folders (workers, child processes).

    Every worker of a multi-worker job runs this with its own `TF_CONFIG`
    (the chief may run the pipeline's Trainer stage instead).
    """
    from components.contract import config as config_lib
    from components.contract.artifacts import Artifact, ArtifactError
    p = argparse.ArgumentParser(prog="python -m components.trainer", description=main.__doc__)
    p.add_argument("--annotations", required=True, help="Annotations artifact folder")
    p.add_argument("--vocabulary", required=True, help="Vocabulary artifact folder")
    p.add_argument("--config", default="", help="a config .py file (for a named config, "
                   "pass the JSON of `captioner config --config NAME` as --config-json)")
    p.add_argument("--config-json", default="", help="a resolved config (written by the stage)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    p.add_argument("--output", default="", help="Model folder (the chief's; default "
                   "<work-dir>/model)")
    p.add_argument("--work-dir", default="", help="checkpoints/logs folder (default: the "
                   "config JSON's folder, else ./trainer_work)")
    p.add_argument("--result", default="", help="write the result JSON here")
    p.add_argument("--parent-pid", type=int, default=0,
                   help="exit when this process (the pipeline's) is gone")
    args = p.parse_args(argv)
    if args.parent_pid:
        _exit_with_parent(args.parent_pid)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.config_json:
        with open(args.config_json) as f:
            config = config_lib.from_dict(json.load(f))
        config = config_lib.apply_overrides(config, args.overrides)
    elif args.config.endswith(".py"):
        config = config_lib.load_config_file(args.config, args.overrides)
    else:
        p.error("give --config-json (e.g. `captioner config --config tiny --set ... > "
                "config.json`) or --config PATH.py")
    work_dir = args.work_dir or (os.path.dirname(os.path.abspath(args.config_json))
                                 if args.config_json else os.path.abspath("trainer_work"))
    output = args.output or os.path.join(work_dir, "model")

    def props(uri):
        try:
            return dict(Artifact.load(uri).properties)
        except ArtifactError:
            return {}

    from components.trainer.phases import train
    result = train(args.annotations, args.vocabulary, config, output, work_dir,
                   annotations_properties=props(args.annotations),
                   vocabulary_properties=props(args.vocabulary))
    if args.result:
        tmp = args.result + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, default=str)
        os.replace(tmp, args.result)
    return 0
