"""Cross-entropy vs cross-entropy + self-critical training, on one config's test split.

    python benchmarks/scst.py --config scenes --root runs/scst_scenes
    python benchmarks/scst.py --config demo --root runs/scst_demo --attention soft
    python benchmarks/scst.py --config scenes --root R --set train.scst_epochs=3

For each attention (`--attention soft,hard`): one `captioner run` trains the
cross-entropy model (`train.objective=xe`), then a second run in the same
root fine-tunes that Model with SCST (`train.objective=scst`,
`train.init_model=<the first Model>`). The data stages run once and are
cached after that. Both models are evaluated by the Evaluator with the config's
`eval.*` decoding. Prints one JSON line per attention with both metric sets,
the relative changes, the Trainer seconds, and the issue's targets:
CIDEr +8% or more, Bleu_4 down by at most 2%, and the dangling-ending rate
not up. A last line gives the CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.results import write_result  # noqa: E402
from benchmarks.train_step import cpu_has_bf16, cpu_model  # noqa: E402

METRICS = ("Bleu_1", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "attribute_accuracy",
           "relation_accuracy", "grounding", "grounding_noun", "dangling_ending_rate")


def _run(root: str, config: str, overrides: list[str], stages: str = "") -> dict:
    """One `captioner run` (all stages, or `stages`); its run_summary.json with the wall time."""
    cmd = [sys.executable, "-m", "pipeline.cli", "run", "--config", config, "--root", root]
    cmd += ["--stages", stages] if stages else []
    for item in overrides:
        cmd += ["--set", item]
    print("+ " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    started = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT)
    with open(os.path.join(root, "run_summary.json")) as f:
        summary = json.load(f)
    summary["wall_seconds"] = round(time.time() - started, 1)
    return summary


def _metrics(summary: dict) -> dict:
    return {k: summary["metrics"].get(k) for k in METRICS}


def _change(before, after):
    if before in (None, 0) or after is None:
        return None
    return round((after - before) / abs(before), 4)


def compare(root: str, config: str, attention: str, extra: list[str]) -> dict:
    base = [f"model.attention={attention}"] + list(extra)
    xe = _run(root, config, base + ["train.objective=xe"])
    model = xe["stages"]["Trainer"]["outputs"]["model"]
    scst = _run(root, config, base + ["train.objective=scst", f"train.init_model={model}"])
    before, after = _metrics(xe), _metrics(scst)
    change = {k: _change(before[k], after[k]) for k in METRICS}
    dangling_before = before["dangling_ending_rate"] or 0.0
    dangling_after = after["dangling_ending_rate"] or 0.0
    return {
        "config": config, "attention": attention, "overrides": extra,
        "xe": before, "scst": after, "relative_change": change,
        "trainer_seconds": {"xe": xe["stages"]["Trainer"].get("seconds"),
                            "scst": scst["stages"]["Trainer"].get("seconds")},
        "targets": {"cider_plus_8pct": (change["CIDEr"] or 0.0) >= 0.08,
                    "bleu4_within_2pct": (change["Bleu_4"] or 0.0) >= -0.02,
                    "dangling_not_up": dangling_after <= dangling_before},
        "xe_model": model, "scst_model": scst["stages"]["Trainer"]["outputs"]["model"],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="scenes")
    p.add_argument("--root", required=True, help="pipeline root (created; reused when it exists)")
    p.add_argument("--attention", default="soft,hard", help="comma-separated: soft, hard")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V",
                   help="config overrides for both runs")
    args = p.parse_args(argv)
    compared = {}
    for attention in [a.strip() for a in args.attention.split(",") if a.strip()]:
        compared[attention] = compare(args.root, args.config, attention, args.overrides)
        print(json.dumps(compared[attention]), flush=True)
    print(json.dumps({"cpu": cpu_model(), "bf16_native": cpu_has_bf16()}), flush=True)
    write_result("scst", {"config": args.config, "attention": compared}, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
