"""The tables of `benchmarks/report.py` on self-critical training and grounding (benchmarks/scst_grounding.py).

Each `t_<name>` renders the table of that name from the newest records
(`benchmarks/report_records.py`).
"""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Sequence, Tuple

from benchmarks.report_records import Context, Rendered, metric, num, table
from benchmarks.scst_targets import cider_met, not_lower


def _versus(record: Dict[str, Any], key: str, relative: bool = False) -> str:
    """A metric's difference from cross-entropy with its 95% bootstrap interval."""
    row = record["versus_xe"].get(key)
    if not row or row.get("difference") is None:
        return ""
    low, high = row["interval"]
    if relative:
        base = row["baseline"]
        return f"{row['difference'] / base * 100:+.1f}% [{low / base * 100:+.1f}, {high / base * 100:+.1f}]"
    return f"{row['difference']:+.3f} [{low:+.3f}, {high:+.3f}]"


def _with_versus(record: Dict[str, Any], key: str) -> str:
    """The metric, then its difference from cross-entropy where the record has one."""
    versus = _versus(record, key)
    return f"{metric(record['metrics'], key)} ({versus})" if versus else metric(record["metrics"], key)


# `--scst-set` keys named in a variant's label (the others are listed in parentheses).
_LABELLED = {"scst_box_attention": "box term", "scst_size_reward": "size reward"}


def _scst_variant(r: Dict[str, Any]) -> str:
    """An SCST record's model: plain, anchored, with the box term, with cross-entropy mixed in, other settings."""
    name = "SCST" + (f" + anchor {num(r['attention_kl'], 2)}" if r["attention_kl"] else "")
    settings = [item.partition("=") for item in r.get("scst_set") or ()]
    keep = ("scst_box_mode", "=", "keep") in settings  # the box term's keep form
    for key, _, value in settings:
        if key in _LABELLED and float(value):
            label = _LABELLED[key] + (" (keep)" if keep and key == "scst_box_attention" else "")
            name += f" + {label} {num(float(value), 2)}"
    name += f" + cross-entropy {num(r['xe_weight'], 2)}" if r.get("xe_weight") else ""
    other = [f"{key}={value}" for key, _, value in settings  # `--scst-set` beyond those
             if key not in ("scst_xe_weight", "scst_attention_kl", *_LABELLED)
             and not (keep and key == "scst_box_mode")]
    other += [f"{item} in both phases" for item in r.get("set") or ()]  # `--set`
    return name + (f" ({', '.join(other)})" if other else "")


def _variant_order(r: Dict[str, Any]) -> Tuple[float, float, str]:
    """Plain first, then by anchor weight, then by other settings; cross-entropy mixes last."""
    return r.get("xe_weight") or 0, r["attention_kl"], _scst_variant(r)


def _targets_over_seeds(runs: Sequence[Dict[str, Any]]) -> List[str]:
    """Per attention and variant, over its seeds: mean differences and how many seeds met each target.

    The targets are the benchmark's (benchmarks/scst_targets.py): CIDEr at
    least +15% over cross-entropy, and the intervals of the grounding and
    size-accuracy differences reaching zero or above (a seed without that
    interval is not counted).
    """
    groups: Dict[Tuple[Any, ...], List[Tuple[int, int, Dict[str, Any]]]] = {}
    for run in runs:
        for r in run["scst"].values():
            key = (run["attention"], r.get("test_images") or 0, *_variant_order(r))
            groups.setdefault(key, []).append((run["seed"], run.get("repeat", 1), r))

    def mean_and_met(records, key, relative=False):
        rows = [r["versus_xe"][key] for r in records if (r["versus_xe"].get(key) or {}).get("interval")]
        if not rows:
            return "", ""
        met = sum(bool(cider_met(row) if relative else not_lower(row)) for row in rows)
        mean = statistics.mean(row["relative" if relative else "difference"] for row in rows)
        return (f"{mean * 100:+.1f}%" if relative else f"{mean:+.3f}"), f"{met} of {len(rows)}"

    out = []
    for (attention, test_images, *_), seeded in sorted(groups.items(),
                                                       key=lambda g: (g[0][0] != "soft", *g[0][1:])):
        variant = _scst_variant(seeded[0][-1])
        seeded.sort(key=lambda x: x[:2])
        seeds = [_seed_label({"seed": seed, "repeat": repeat})
                 + (" (start kept)" if _kept_start(r) else "") for seed, repeat, r in seeded]
        records = [r for *_, r in seeded]
        trained = [r for r in records if not _kept_start(r)]  # grounding: only of SCST models
        cells = [c for key, rel, rs in (("CIDEr", True, records), ("grounding", False, trained),
                                        ("size_accuracy", False, trained))
                 for c in mean_and_met(rs, key, rel)]
        out.append([attention, num(test_images, 0) if test_images else "config's", variant,
                    ", ".join(map(str, seeds)), *cells])
    return table(["attention", "test images", "model", "seeds", "CIDEr change (mean)", "seeds at +15% or more",
                  "grounding difference (mean)", "seeds reaching 0",
                  "size_accuracy difference (mean)", "seeds reaching 0"], out)


def _scst_grounding_runs(ctx: Context) -> Tuple[List[Dict[str, Any]], List[Any]]:
    """Every attention and seed's newest run, soft first, and the records they came from."""
    # One record per invocation (`scst_grounding-<attentions>-seed<seeds>`; the
    # first ones carry no seeds in the name); a later record of the same
    # attention and seed replaces an earlier one.
    records = [ctx.latest(stem) for stem in sorted(ctx.by_stem)
               if stem.startswith("scst_grounding-")]
    # Variants from later records of the same run (`--scst-set`) join its row
    # group: the same attention, seed and test split, and the same
    # cross-entropy model, known by its test metrics (the data stages and the
    # cross-entropy model trained again in a new root are another model).
    newest: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    for rec in sorted(records, key=lambda r: r.order):
        for run in rec.figures["runs"]:
            xe = run.get("xe") or {}
            key = (run["attention"], xe.get("test_images") or 0, run["seed"],
                   *(round(xe.get("metrics", {}).get(m) or 0.0, 4) for m in _XE_IDENTITY))
            merged = newest.setdefault(key, {**run, "scst": {}, "order": len(newest)})
            merged.update({k: v for k, v in run.items() if k != "scst"})
            merged["scst"].update(run["scst"])
    def split(r):  # attention, seed, test images
        return r["attention"], r["seed"], (r.get("xe") or {}).get("test_images") or 0

    runs = sorted(newest.values(), key=lambda r: (r["attention"] != "soft", split(r)[2],
                                                  r["seed"], r["order"]))
    for i, run in enumerate(runs):  # a second cross-entropy model of the same seed: "(2nd)"
        run["repeat"] = 1 + sum(split(r) == split(run) for r in runs[:i])
    return runs, records


# The cross-entropy test metrics that tell one cross-entropy model from another.
_XE_IDENTITY = ("CIDEr", "Bleu_4", "grounding")


def _ordinal(run: Dict[str, Any]) -> str:
    """'' for a seed's first cross-entropy model, '2nd' for its second, ..."""
    repeat = run.get("repeat", 1)
    return "" if repeat <= 1 else {2: "2nd", 3: "3rd"}.get(repeat, f"{repeat}th")


def _seed_label(run: Dict[str, Any]) -> str:
    """'3', or '3 (2nd)' for the second cross-entropy model of seed 3."""
    return str(run["seed"]) + (f" ({_ordinal(run)})" if _ordinal(run) else "")


def _kept_start(r: Dict[str, Any]) -> bool:
    """No SCST epoch beat the start model's val CIDEr: the exported model is the cross-entropy one."""
    return r.get("best_epoch") is not None and r["best_epoch"] < 0


def _epochs(r: Dict[str, Any]) -> str:
    if _kept_start(r):
        return f"{r['epochs']} epochs, none beat the start: the cross-entropy model"
    return f"{r['epochs']} epochs, best {r['best_epoch'] + 1}"


def t_scst_grounding(ctx: Context) -> Rendered:
    runs, records = _scst_grounding_runs(ctx)
    keys = ["CIDEr", "Bleu_4", "METEOR", "grounding", "grounding_noun", "attribute_accuracy",
            "relation_accuracy", "size_accuracy"]
    rows = []
    for run in runs:
        xe = run["xe"]
        notes = [n for n in (_ordinal(run), xe.get("test_images") and
                             f"{num(xe['test_images'], 0)} test images", *run.get("set", ())) if n]
        label = f"{run['attention']}, seed {run['seed']}" + (f" ({'; '.join(notes)})" if notes else "")
        rows.append([label, "cross-entropy", *[metric(xe["metrics"], k) for k in keys],
                     num(xe.get("seconds_per_step"), 3)])
        for r in sorted(run["scst"].values(), key=_variant_order):
            variant = _scst_variant(r)
            m = r["metrics"]
            rows.append([label, variant, f"{metric(m, 'CIDEr')} ({_versus(r, 'CIDEr', relative=True)})",
                         metric(m, "Bleu_4"), metric(m, "METEOR"),
                         _with_versus(r, "grounding"), _with_versus(r, "grounding_noun"),
                         metric(m, "attribute_accuracy"), metric(m, "relation_accuracy"),
                         _with_versus(r, "size_accuracy"),
                         f"{num(r.get('seconds_per_step'), 3)} ({_epochs(r)})"])
    lines = table(["attention, seed", "model", *keys, "s/step (epochs)"], rows)
    return lines + ["", "In parentheses: the difference from the cross-entropy model of the same run, "
                        "with the Evaluator's 95% paired bootstrap interval over the test images. s/step: "
                        "training steps only (no validation), on a host shared with other jobs."], records


def t_scst_grounding_targets(ctx: Context) -> Rendered:
    runs, records = _scst_grounding_runs(ctx)
    return _targets_over_seeds(runs) + [
        "", "Over the seeds of the table above: the mean difference from cross-entropy, and how many "
            "seeds met the target (CIDEr at least +15%; the 95% interval of the grounding or "
            "size_accuracy difference reaching zero or above). Both over the seeds whose record has "
            "that interval (the first records have none for size_accuracy), and not where no SCST "
            "epoch beat the start (\"start kept\": the exported model is the cross-entropy one, "
            "and CIDEr counts +0%). Test images: "
            "`--test-images`, or the config's own test split (410 images on scenes)."], records
