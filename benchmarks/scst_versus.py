"""Two models of one root head to head: the paired bootstrap of their test captions.

    python benchmarks/scst_versus.py \
        --pair R/soft-seed5/plain+scst_box_attention=0.3+scst_size_reward=0.5 \
               R/soft-seed5/plain+scst_size_reward=0 [--pair A B ...]

Each `--pair CANDIDATE BASELINE` names two roots whose last runs evaluated a
model on the same test images (as `benchmarks/scst_grounding.py` leaves its
SCST variants: copies of one root, each Evaluator comparing its model with
the cross-entropy one). The Evaluator compares each variant with
cross-entropy; this compares the variants with each other. From each root's
Evaluator folder it reads the model's test captions (`captions.jsonl`),
scores both with the coco-caption toolkit once (`image_stats`), and resamples
the images with the Evaluator's paired bootstrap (`paired_bootstrap`, 1,000
resamples): CIDEr, Bleu_4, METEOR and ROUGE_L, candidate minus baseline,
with the 95% interval. (The grounding metrics need the attention maps,
which the captions files do not hold.)

Prints one JSON line per pair and writes them with `write_result`
("scst_versus"; with `--variant V`, `scst_versus-V-<date>-<host>.json`, so
that two calls on one day and host keep two records).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Mapping, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.results import stage_outputs, write_result  # noqa: E402

METRICS = ("CIDEr", "Bleu_4", "METEOR", "ROUGE_L")


def versus(candidate: Sequence[Mapping], baseline: Sequence[Mapping], *,
           use_java: bool | None = None, resamples: int = 1000) -> dict:
    """Candidate minus baseline per metric of `METRICS`, from two captions files' rows.

    Args:
      candidate, baseline: rows of `captions.jsonl` (`image_id`, `caption`,
        `references`), on the same images with the same references.
      use_java, resamples: as for `image_stats` and `paired_bootstrap`.
    Returns:
      metric -> {candidate, baseline, difference, relative, interval,
      relative_interval}, and `images`.
    Raises:
      ValueError: the two files caption other images, or other references.
    """
    from components.evaluator.metrics.bootstrap import image_stats, paired_bootstrap
    refs = {r["image_id"]: list(r["references"]) for r in candidate}
    other = {r["image_id"]: list(r["references"]) for r in baseline}
    if refs != other:
        missing = sorted(set(refs) ^ set(other))
        raise ValueError("the two models were evaluated on other images or references"
                         + (f", e.g. {missing[:3]}" if missing else ""))
    stats = [image_stats({r["image_id"]: r["caption"] for r in rows}, refs, use_java=use_java)
             for rows in (candidate, baseline)]
    compared = paired_bootstrap(*stats, resamples=resamples)
    keys = ("candidate", "baseline", "difference", "relative", "interval", "relative_interval")
    out = {m: {k: compared[m][k] for k in keys} for m in METRICS}
    out["images"] = len(refs)
    return out


def _captions(root: str) -> list[dict]:
    """The test captions of the model that `<root>`'s last run evaluated."""
    evaluation = stage_outputs(root)["Evaluator"]["evaluation"]
    with open(os.path.join(evaluation, "captions.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", nargs=2, action="append", required=True,
                   metavar=("CANDIDATE", "BASELINE"),
                   help="two roots whose last runs evaluated a model on the same test images")
    p.add_argument("--variant", default="",
                   help="a name for this call's record (e.g. soft-seed9-keep), so that "
                        "calls on one day and host do not overwrite each other's")
    args = p.parse_args(argv)
    results = []
    for candidate, baseline in args.pair:
        row = {"candidate": candidate, "baseline": baseline,
               **versus(_captions(candidate), _captions(baseline))}
        results.append(row)
        print(json.dumps(row), flush=True)
    write_result("scst_versus", {"pairs": results}, argv=argv, variant=args.variant)
    return 0


if __name__ == "__main__":
    sys.exit(main())
