"""`python -m components.trainer`: the Trainer outside a pipeline run.

Every worker of a multi-worker job runs it with its own `TF_CONFIG`
(docs/multi_worker.md), and the Trainer stage runs it as a child process when
its strategy needs a fresh TensorFlow runtime. Non-chief workers save into
temporary folders and delete them.
"""
from __future__ import annotations

import argparse
import json
import os
import time


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
