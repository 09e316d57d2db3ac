"""Self-critical training with and without the attention anchor, against cross-entropy.

    python benchmarks/scst_grounding.py --config scenes --root /tmp/runs/ground \
        --attention soft,hard --seeds 0,1,2 --anchor-weights 1.0

The data stages run once (`<root>/data`, `--stages
ExampleGen,EncoderTrainer,Preprocess`). For each attention and training seed
a copy of that root (roots are relocatable, so a copy reuses every
artifact) trains the cross-entropy model (`train.objective=xe`; the
Evaluator scores it, the Pusher pushes it). That root is then copied once
per SCST variant, and in each copy a run fine-tunes that
Model with SCST (`train.init_model`): plain (`train.scst_attention_kl=0`)
and anchored at each `--anchor-weights` value. So every SCST model's
Evaluator compares it with the same cross-entropy model, on the same test
images, with its paired bootstrap (the interval of each difference).

`--scst-set K=V` adds a setting to every SCST run of the call; with
`--anchor-weights ""` only the unanchored one runs, e.g. the box term
alone (`--scst-set train.scst_box_attention=1.0`), or with the size reward
(`--scst-set train.scst_box_attention=1.0 --scst-set
train.scst_size_reward=0.5`), its record's rows joining those of the
earlier records of the same attention, seed, test split and cross-entropy
model.

Prints one JSON line per run and a last line with the CPU; records
everything with `write_result("scst_grounding", ..., variant=<attentions>-seed<seeds>)`
(`scst_grounding-soft-seed1-2-<date>-<host>.json`, with `-<key><value>` for each
`--set` and `--scst-set`; the docs' table reads every such record, one row group per
attention, seed and test split, the variants of later records added to it). Targets: CIDEr at
least +15% over cross-entropy, and the intervals of the grounding and
size-accuracy differences reaching zero or above.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.results import artifact_properties, write_result  # noqa: E402
from benchmarks.scst import _run  # noqa: E402
from benchmarks.scst_targets import targets  # noqa: E402
from benchmarks.train_step import cpu_has_bf16, cpu_model  # noqa: E402

METRICS = ("CIDEr", "Bleu_4", "METEOR", "grounding", "grounding_noun", "attribute_accuracy",
           "relation_accuracy", "size_accuracy", "dangling_ending_rate")


def _properties(summary: dict, stage: str, output: str) -> dict:
    return artifact_properties(summary["stages"][stage]["outputs"][output])


def _record(summary: dict) -> dict:
    """Metrics, the Evaluator's comparison with the pushed model, the Trainer's cost."""
    evaluation = _properties(summary, "Evaluator", "evaluation")
    model = _properties(summary, "Trainer", "model")
    comparison = evaluation.get("comparison") or []  # one row per metric
    scst = model.get("scst") or {}
    return {
        "metrics": {k: evaluation["metrics"].get(k) for k in METRICS},
        "test_images": evaluation["metrics"].get("num_test_images"),
        "versus_xe": {row["metric"]: {k: row.get(k) for k in ("baseline", "difference",
                                                              "interval", "relative")}
                      for row in comparison
                      if row.get("metric") in METRICS and row.get("difference") is not None},
        "trainer_seconds": summary["stages"]["Trainer"].get("seconds"),
        # From the Model (also when the Trainer was cached): training steps only, no validation.
        "train_seconds_total": model.get("train_seconds_total"),
        "seconds_per_step": (round(model["train_seconds_total"] / model["steps"], 3)
                             if model.get("train_seconds_total") and model.get("steps") else None),
        "steps": model.get("steps"), "best_epoch": scst.get("best_epoch"),
        "epochs": scst.get("epochs"), "start_cider": scst.get("start_cider"),
        "xe_weight": scst.get("xe_weight"),
        "best_val_cider": scst.get("best_cider"),
        "model": summary["stages"]["Trainer"]["outputs"]["model"],
    }


def test_split(config: str, overrides: list[str], test_images: int) -> list[str]:
    """Overrides giving the test split about `test_images` images while the train
    and val splits keep the config's sizes: more images, the same counts outside
    test (ExampleGen assigns splits by a hash of the image id, so the images
    differ but the sizes do not)."""
    from pipeline.config import load_config

    data = load_config(config, overrides).data
    kept = data.num_images * (1.0 - data.test_fraction)  # train + val images
    total = round(kept + test_images)
    return [f"data.num_images={total}",
            f"data.val_fraction={data.val_fraction * data.num_images / total:.6f}",
            f"data.test_fraction={test_images / total:.6f}"]


def _short(item: str) -> str:
    """'train.scst_xe_weight=0.1' -> 'scst_xe_weight=0.1' (the key without its section)."""
    key, _, value = item.partition("=")
    return f"{key.split('.')[-1]}={value}"


def one_seed(root: str, config: str, attention: str, seed: int, weights: list[float],
             extra: list[str], scst_extra: Sequence[str] = (), shown: Sequence[str] = ()) -> dict:
    """One cross-entropy model and its SCST variants; `shown`: the `--set` items the tables name."""
    base = [f"model.attention={attention}", f"train.seed={seed}"] + extra
    xe_root = os.path.join(root, f"{attention}-seed{seed}", "xe")
    if not os.path.exists(xe_root):
        shutil.copytree(os.path.join(root, "data"), xe_root)
    xe = _run(xe_root, config, base + ["train.objective=xe"])
    xe_model = xe["stages"]["Trainer"]["outputs"]["model"]
    out = {"attention": attention, "seed": seed, "xe": _record(xe), "scst": {},
           "set": [_short(item) for item in shown]}
    for weight in [0.0] + weights:
        name = ("plain" if weight == 0 else f"anchor{weight:g}") + "".join(
            "+" + _short(item) for item in scst_extra)  # e.g. plain+scst_xe_weight=0.1
        copy = os.path.join(root, f"{attention}-seed{seed}", name)
        if not os.path.exists(copy):
            shutil.copytree(xe_root, copy)
        model = os.path.join(copy, os.path.relpath(xe_model, xe_root))
        run = _run(copy, config, base + ["train.objective=scst", f"train.init_model={model}",
                                         f"train.scst_attention_kl={weight:g}", *scst_extra])
        record = _record(run)
        record["attention_kl"] = weight
        record["scst_set"] = [_short(item) for item in scst_extra]
        record["set"] = out["set"]
        record["targets"] = targets(record["versus_xe"])
        out["scst"][name] = record
        print(json.dumps({"attention": attention, "seed": seed, "variant": name, **record}),
              flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="scenes")
    p.add_argument("--root", required=True, help="a folder for the roots (created; reused)")
    p.add_argument("--attention", default="soft,hard", help="comma-separated: soft, hard")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated train.seed values")
    p.add_argument("--anchor-weights", default="1.0",
                   help="comma-separated train.scst_attention_kl values to compare with plain SCST")
    p.add_argument("--test-images", type=int, default=0,
                   help="test split of about this many images, train and val kept (0: the "
                        "config's); more test images narrow the Evaluator's intervals")
    p.add_argument("--scst-set", dest="scst_overrides", action="append", default=[],
                   metavar="K=V", help="config overrides for the SCST runs only (the "
                                       "cross-entropy model stays cached), e.g. train.scst_xe_weight=0.1")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V",
                   help="config overrides for every run")
    args = p.parse_args(argv)
    weights = [float(w) for w in args.anchor_weights.split(",") if w.strip()]
    shown = list(args.overrides)  # the user's, not the test split's
    if args.test_images:
        args.overrides += test_split(args.config, args.overrides, args.test_images)
    # The data stages, once for every run (their artifacts do not depend on the decoder).
    _run(os.path.join(args.root, "data"), args.config, args.overrides,
         stages="ExampleGen,EncoderTrainer,Preprocess")
    runs = []
    for attention in [a.strip() for a in args.attention.split(",") if a.strip()]:
        for seed in [int(s) for s in args.seeds.split(",") if s.strip()]:
            runs.append(one_seed(args.root, args.config, attention, seed, weights,
                                 args.overrides, args.scst_overrides, shown))
    print(json.dumps({"cpu": cpu_model(), "bf16_native": cpu_has_bf16()}), flush=True)
    attentions = [a.strip() for a in args.attention.split(",") if a.strip()]
    seeds = [s.strip() for s in args.seeds.split(",") if s.strip()]
    write_result("scst_grounding", {"config": args.config, "overrides": args.overrides,
                                    "runs": runs}, argv=argv,
                 variant="-".join(attentions) + "-seed" + "-".join(seeds) + "".join(
                     "-" + _short(item).replace("=", "") for item in shown + args.scst_overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
