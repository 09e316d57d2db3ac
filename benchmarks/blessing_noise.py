"""Benchmark: does the blessing refuse a retrain on noise? Seeds against each other, every order.

    python benchmarks/blessing_noise.py --root demo_output/pipeline      # a finished demo root
    python benchmarks/blessing_noise.py --root R --seeds 0,1,2 --config demo

For each seed, trains the Trainer and runs the Exporter on the root's data
(`captioner run --stages Trainer,Exporter --set train.seed=S`; cached when
that model exists), captions the test split once per seed through its
SavedModel's `serving_default` (the Evaluator's `CaptionedSplit`, one image
per call) and scores it once (`components.evaluator.stage.score`). Then for every
ordered pair (candidate, baseline) it runs exactly the Evaluator's decision:
the paired bootstrap (1,000 resamples, seed 0) and `blessing_decision` with
the config's `eval.thresholds` and `eval.change_thresholds`.

With `--refused-epochs N` it also trains a model for N epochs (seed 0) and
compares it against each seed's model: the blessing should refuse it.

Prints the CPU, each seed's metrics, each pair's verdict with the intervals,
and one JSON line at the end.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.results import stage_outputs  # noqa: E402

SHOWN = ("Bleu_4", "CIDEr", "METEOR", "attribute_accuracy", "relation_accuracy", "grounding")


def export_for(root: str, config: str, overrides: list[str]) -> tuple[str, float]:
    """Runs Trainer and Exporter with `overrides`; returns the ServingModel folder and seconds."""
    start = time.time()
    command = [sys.executable, "-m", "pipeline.cli", "run", "--config", config, "--root", root,
               "--stages", "Trainer,Exporter"]
    for item in overrides:
        command += ["--set", item]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return stage_outputs(root)["Exporter"]["serving_model"], time.time() - start


def caption_and_score(serving_uri: str, examples_uri: str, batch_size: int):
    """The Evaluator's captioning and scoring of one ServingModel: (split, metrics, seconds)."""
    from components.contract import schema
    from components.contract.artifacts import Artifact
    from components.evaluator.split_readers import iter_example_batches
    from components.evaluator.stage import CaptionedSplit, ServedFunction, score
    art = Artifact.load(serving_uri)
    split = CaptionedSplit(ServedFunction(art.path(schema.SAVED_MODEL_DIR)), batch_size)
    start = time.time()
    for batch in iter_example_batches(examples_uri, "test", 64):
        split.caption(batch)
    metrics = score(split)
    return split, metrics, time.time() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="a pipeline root whose data stages ran")
    parser.add_argument("--config", default="demo")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--refused-epochs", type=int, default=0,
                        help="also compare a model trained this many epochs (0: skip)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="more config overrides for every model")
    args = parser.parse_args(argv)

    from benchmarks.results import write_result
    from benchmarks.train_step import cpu_has_bf16, cpu_model
    from components.evaluator.metrics.blessing import blessing_decision
    from components.evaluator.metrics.bootstrap import paired_bootstrap
    from components.evaluator.stage import BOOTSTRAP
    from pipeline import config as config_lib
    config = config_lib.load_config(args.config, args.overrides)
    print(f"CPU: {cpu_model()} (native bfloat16: {cpu_has_bf16()})", flush=True)
    root = os.path.abspath(args.root)
    examples_uri = stage_outputs(root).get("ExampleGen", {}).get("examples")
    models = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        models[f"seed {seed}"] = [*args.overrides, f"train.seed={seed}"]
    if args.refused_epochs:
        models[f"{args.refused_epochs} epoch(s)"] = [*args.overrides, "train.seed=0",
                                                     f"train.epochs={args.refused_epochs}"]
    scored, timings = {}, {}
    for name, overrides in models.items():
        serving_uri, seconds = export_for(root, args.config, overrides)
        if examples_uri is None:
            examples_uri = stage_outputs(root)["ExampleGen"]["examples"]
        split, metrics, eval_seconds = caption_and_score(serving_uri, examples_uri,
                                                         config.eval.batch_size)
        scored[name] = (split, metrics)
        timings[name] = {"train_export_s": round(seconds, 1), "caption_score_s":
                         round(eval_seconds, 1), "caption_s": round(split.seconds, 1)}
        print(f"{name}: " + ", ".join(f"{k} {metrics.get(k):.4f}" for k in SHOWN
                                      if isinstance(metrics.get(k), float))
              + f"  ({timings[name]})", flush=True)
    pairs = []
    for cand, base in itertools.permutations(scored, 2):
        compared = paired_bootstrap(scored[cand][0].stats, scored[base][0].stats, **BOOTSTRAP)
        blessed, reasons, rows = blessing_decision(compared, config.eval.change_thresholds,
                                                   config.eval.thresholds, scored[cand][1])
        pairs.append({"candidate": cand, "baseline": base, "blessed": blessed,
                      "reasons": reasons,
                      "rows": {r["metric"]: {k: r[k] for k in ("difference", "interval",
                                                               "relative_interval", "verdict")}
                               for r in rows if r.get("difference") is not None}})
        print(f"\n{cand} against {base}: {'BLESSED' if blessed else 'NOT BLESSED'}")
        for metric in SHOWN:
            row = pairs[-1]["rows"].get(metric)
            if row:
                lo, hi = row["interval"]
                print(f"  {metric:20s} {row['difference']:+.4f}  [{lo:+.4f}, {hi:+.4f}]  "
                      f"{row['verdict']}")
        for reason in reasons:
            print(f"  reason: {reason}")
    result = {"cpu": cpu_model(), "native_bf16": cpu_has_bf16(),
              "metrics": {n: {k: m.get(k) for k in SHOWN} for n, (_, m) in scored.items()},
              "timings": timings, "pairs": pairs}
    print(json.dumps(result))
    write_result("blessing_noise", result, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
