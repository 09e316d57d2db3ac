"""The Blessing's decision: minimums on the candidate, and change thresholds against the baseline.

`eval.thresholds` are minimums the candidate's metrics must reach.
`eval.change_thresholds` bound the change from the baseline (the last pushed
model), with the semantics of TFMA's ``GenericChangeThreshold`` for metrics
where higher is better: ``absolute`` bounds candidate - baseline,
``relative`` bounds (candidate - baseline) / baseline, and a metric with both
must meet both. A negative bound allows a drop up to its size.

Both models are scored on the same images, so the change carries sampling
noise: a metric blocks the push only when the candidate is worse beyond the
bound with the interval's confidence, that is when the upper end of the
bootstrap interval of the change (`paired_bootstrap`) is below the bound.
"""
from __future__ import annotations

import math
from typing import Mapping

from components.evaluator.metrics.bootstrap import METRICS

# The columns of `format_rows`.
ROW_HEADER = ("metric", "candidate", "baseline", "difference", "interval", "threshold", "verdict")


def blessing_decision(comparison: Mapping[str, Mapping] | None,
                      change_thresholds: Mapping[str, Mapping[str, float]],
                      thresholds: Mapping[str, float],
                      candidate_metrics: Mapping) -> tuple[bool, list[str], list[dict]]:
    """Decides the Blessing from the candidate's metrics and its comparison with the baseline.

    Args:
      comparison: `paired_bootstrap(candidate, baseline)`, or None when there
        is no baseline (the first push): then only `thresholds` apply.
      change_thresholds: `eval.change_thresholds`: metric ->
        ``{"absolute": bound, "relative": bound}`` (either or both).
      thresholds: `eval.thresholds`: metric -> minimum.
      candidate_metrics: the candidate's full-set metrics (the Evaluation's),
        which `thresholds` are checked on.
    Returns:
      (blessed, reasons, rows): ``reasons`` names every failed check (empty
      when blessed); ``rows`` has one dict per metric with a value or a
      check, in `METRICS` order: ``metric``, ``candidate``, ``baseline``,
      ``difference``, ``relative``, ``interval``, ``relative_interval``,
      ``minimum`` (or None), ``change_threshold`` (the bounds, or None),
      ``verdict`` ("pass", "fail" or "not checked") and ``notes`` (why a
      check did not run). A change threshold on a metric the comparison
      lacks for either model (METEOR without Java, grounding without boxes)
      is not checked and does not block.
    """
    reasons, rows = [], []
    for metric in _row_metrics(comparison, change_thresholds, thresholds, candidate_metrics):
        entry = dict((comparison or {}).get(metric) or {})
        value = candidate_metrics.get(metric, entry.get("candidate"))
        row = {"metric": metric, "candidate": _number(value), "baseline": entry.get("baseline"),
               "difference": entry.get("difference"), "relative": entry.get("relative"),
               "interval": entry.get("interval"),
               "relative_interval": entry.get("relative_interval"),
               "minimum": thresholds.get(metric),
               "change_threshold": dict(change_thresholds[metric])
               if metric in change_thresholds else None,
               "verdict": "not checked", "notes": []}
        failed, checked = [], False
        if metric in thresholds:
            checked = True
            minimum = thresholds[metric]
            if row["candidate"] is None:
                failed.append(f"{metric} is not available (threshold {minimum})")
            elif row["candidate"] < minimum:
                failed.append(f"{metric} = {row['candidate']:.4f} is below the threshold {minimum}")
        if metric in change_thresholds:
            if comparison is None:
                row["notes"].append("no baseline")
            else:
                for kind in ("absolute", "relative"):
                    if kind not in change_thresholds[metric]:
                        continue
                    result = _change_check(metric, entry, kind, change_thresholds[metric][kind])
                    if result is None:
                        row["notes"].append(f"not compared: {metric} is not available for "
                                            "both models")
                        break
                    checked = True
                    if result:
                        failed.append(result)
        if checked:
            row["verdict"] = "fail" if failed else "pass"
        reasons += failed
        rows.append(row)
    return not reasons, reasons, rows


def _row_metrics(comparison, change_thresholds, thresholds, candidate_metrics) -> list[str]:
    """The metrics a row is shown for, in `METRICS` order, then any others thresholds name."""
    def shown(metric):
        entry = (comparison or {}).get(metric) or {}
        return (metric in thresholds or metric in change_thresholds
                or _number(candidate_metrics.get(metric)) is not None
                or entry.get("candidate") is not None)
    named = [m for m in METRICS if shown(m)]
    return named + sorted(set(thresholds) - set(named))


def _change_check(metric: str, entry: Mapping, kind: str, bound: float) -> str | None:
    """'' when the change may be within `bound`, the reason when it is below, None untestable."""
    key, interval_key = (("difference", "interval") if kind == "absolute"
                         else ("relative", "relative_interval"))
    change, interval = entry.get(key), entry.get(interval_key)
    if change is None or interval is None:
        return None
    if interval[1] >= bound:
        return ""
    label = "difference" if kind == "absolute" else "relative difference"
    allowed = "allowed change" if kind == "absolute" else "allowed relative change"
    confidence = f"{100 * float(entry.get('confidence', 0.95)):g}%"
    return (f"{metric}: candidate {entry['candidate']:.3f}, baseline {entry['baseline']:.3f}, "
            f"{label} {change:.3f} ({confidence} interval {interval[0]:.3f} to "
            f"{interval[1]:.3f}) is below the {allowed} {bound:g}")


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) else float(value)


def format_rows(rows: list[dict]) -> list[str]:
    """`blessing_decision`'s rows as an aligned text table (header first), for logs and inspect.

    Args:
      rows: the rows.
    Returns:
      Lines of text, one per row after the header.
    """
    def num(v):
        return "-" if v is None else f"{v:.4f}"

    def span(row):
        bits = []
        if row["interval"] is not None:
            bits.append(f"[{row['interval'][0]:.4f}, {row['interval'][1]:.4f}]")
        if row["relative_interval"] is not None and row["change_threshold"] \
                and "relative" in row["change_threshold"]:
            lo, hi = row["relative_interval"]
            bits.append(f"rel [{lo:.4f}, {hi:.4f}]")
        return " ".join(bits) or "-"

    def limit(row):
        bits = [] if row["minimum"] is None else [f">= {row['minimum']:g}"]
        for kind, bound in sorted((row["change_threshold"] or {}).items()):
            bits.append(f"{'change' if kind == 'absolute' else 'rel. change'} >= {bound:g}")
        return ", ".join(bits) or "-"

    table = [ROW_HEADER] + [(r["metric"], num(r["candidate"]), num(r["baseline"]),
                             num(r["difference"]), span(r), limit(r),
                             r["verdict"] + (f" ({'; '.join(r['notes'])})" if r["notes"] else ""))
                            for r in rows]
    widths = [max(len(line[j]) for line in table) for j in range(len(ROW_HEADER))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in table]
