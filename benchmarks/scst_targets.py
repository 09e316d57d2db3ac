"""The targets self-critical training is held to, in one place.

A self-critical model meets them when, against the cross-entropy model of
the same run, its CIDEr is at least 15% higher and the 95% paired bootstrap
intervals of its grounding, grounding_noun and size_accuracy differences
reach zero or above (the Evaluator's comparison rows: `difference`,
`interval`, `relative`). benchmarks/scst_grounding.py writes them into each
record; benchmarks/report_scst.py counts them over seeds. No heavy
imports: the report imports this.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

CIDER_GAIN = 0.15  # CIDEr at least this much higher, relative to cross-entropy
NOT_LOWER = ("grounding", "grounding_noun", "size_accuracy")  # intervals reaching zero or above


def cider_met(row: Optional[Mapping[str, Any]]) -> Optional[bool]:
    """CIDEr's comparison row -> gained at least CIDER_GAIN (None: no relative change)."""
    relative = (row or {}).get("relative")
    return None if relative is None else relative >= CIDER_GAIN


def not_lower(row: Optional[Mapping[str, Any]]) -> Optional[bool]:
    """A comparison row -> its interval's upper end is zero or above (None: no interval)."""
    interval = (row or {}).get("interval")
    return None if not interval or interval[1] is None else interval[1] >= 0


def targets(versus_xe: Mapping[str, Mapping[str, Any]]) -> dict:
    """{metric: comparison row} -> each target met (True/False) or not measurable (None)."""
    out = {"cider_plus_15pct": bool(cider_met(versus_xe.get("CIDEr")))}
    out.update({f"{metric}_not_lower": not_lower(versus_xe.get(metric)) for metric in NOT_LOWER})
    return out
