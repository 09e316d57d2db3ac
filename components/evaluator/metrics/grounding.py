"""Attention grounding and caption correctness on the synthetic shapes and scenes data.

Does the model look at an object while naming it (Xu et al. 2015, section 5.4
shows this qualitatively; the synthetic boxes let us count it), and does the
caption name the right objects and a true relation? Captions are parsed with
the scenes parser (`components/synthetic/scenes_grammar.py`), which reads every
shapes caption exactly as the shapes grammar does and also understands the
scenes words (more kinds and colors, synonyms, counted plurals).

A generated object phrase *matches* the ground-truth objects with the same
color and shape: exactly one on a shapes image (each (color, shape) appears
at most once there), one or more on a scenes image ("two red rings").

Objects labelled with a `category` instead (COCO instance boxes,
`data.instances_json`) are scored by
`components.evaluator.metrics.category_grounding`: grounding and
grounding_noun only, over the caption's mentions of the image's categories.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from components.evaluator.metrics.category_grounding import category_counts
from components.synthetic.scenes_grammar import parse_caption
from components.synthetic.shapes_grammar import relation_holds

COUNT_KEYS = ("num_phrases", "num_matched_phrases", "num_grounded", "num_grounded_noun",
              "num_attribute_images", "num_attribute_correct", "num_sized_phrases",
              "num_size_correct", "num_relation_images", "num_relation_correct")


def grounding_metrics(captions: Sequence[Sequence[str] | str],
                      attentions: Sequence[np.ndarray],
                      objects: Sequence[Sequence[Mapping]],
                      widen_cells: float = 1.0) -> dict:
    """Grounding, attribute and relation scores over a set of test images.

    Args:
      captions: per image, the generated words (a list, aligned with the
        attention steps) or the caption string (split on whitespace).
      attentions: per image, ``(T, H, W)`` attention maps, map t being the
        weights used to emit word t; ``T >= len(words)`` (extra steps, e.g.
        for ``<end>``, are ignored).
      objects: per image, the ground-truth objects: dicts with `bbox`
        (ymin, xmin, ymax, xmax normalized), `color`, `shape`, `size`; or
        with `bbox` and `category` (COCO instances: see the module's
        docstring).
      widen_cells: how many grid cells the box is widened by on every side.
    Returns:
      A flat dict. Rates (None where their count is 0):
        ``grounding``: over matched object phrases, the fraction where the
          argmax cell of at least one of the phrase's steps (article to
          noun) has its centre inside the widened box (of any matched object);
        ``grounding_noun``: the same with the shape noun's step alone;
        ``attribute_accuracy``: fraction of the images with coloured
          objects whose caption names exactly the right set of (color,
          shape) objects;
        ``size_accuracy``: over matched phrases that name a size, the
          fraction naming the size of a matched object;
        ``relation_accuracy``: over images with >= 2 objects, the fraction
          whose first relation holds between two distinct objects its
          arguments match (no relation, or an argument that matches no
          object, is wrong).
      Counts: ``num_images``, ``num_phrases``, ``num_matched_phrases``,
      ``num_grounded``, ``num_grounded_noun``, ``num_attribute_images``,
      ``num_attribute_correct``,
      ``num_sized_phrases``, ``num_size_correct``, ``num_relation_images``,
      ``num_relation_correct``.
    """
    counts = grounding_counts(captions, attentions, objects, widen_cells)
    return _with_rates(dict(zip(COUNT_KEYS, (int(c) for c in counts.sum(axis=0)), strict=True)),
                       len(captions))


def grounding_counts(captions: Sequence[Sequence[str] | str],
                     attentions: Sequence[np.ndarray],
                     objects: Sequence[Sequence[Mapping]],
                     widen_cells: float = 1.0) -> np.ndarray:
    """The counts of `grounding_metrics`, one row per image.

    The paired bootstrap (`components/evaluator/metrics/bootstrap.py`) resamples
    images, so it needs each image's counts rather than their total.

    Args:
      captions, attentions, objects, widen_cells: as for `grounding_metrics`.
    Returns:
      int64 ``(num_images, len(COUNT_KEYS))``, columns in `COUNT_KEYS` order;
      the column sums are `grounding_metrics`' counts.
    """
    if not len(captions) == len(attentions) == len(objects):
        raise ValueError(f"captions, attentions and objects differ in length: "
                         f"{len(captions)}, {len(attentions)}, {len(objects)}")
    rows = np.zeros((len(captions), len(COUNT_KEYS)), np.int64)
    for i, (words, attention, gt) in enumerate(zip(captions, attentions, objects, strict=True)):
        counts = _image_counts(words, attention, gt, widen_cells)
        rows[i] = [counts[k] for k in COUNT_KEYS]
    return rows


def _image_counts(words, attention, gt: Sequence[Mapping], widen_cells: float) -> dict:
    """`COUNT_KEYS` -> count for one image (see `grounding_metrics`)."""
    counts = dict.fromkeys(COUNT_KEYS, 0)
    words = words.split() if isinstance(words, str) else list(words)
    attention = np.asarray(attention)
    if attention.ndim != 3:
        raise ValueError(f"attention must be (T, H, W), got shape {attention.shape}")
    if attention.shape[0] < len(words):
        raise ValueError(f"{len(words)} words but only {attention.shape[0]} attention maps")
    if any("category" in o for o in gt):
        counts.update(category_counts(words, attention, gt, _looks_inside, widen_cells))
        return counts
    counts["num_attribute_images"] = 1
    parsed = parse_caption(words)
    by_key: dict[tuple, list] = {}
    for o in gt:
        by_key.setdefault((o["color"], o["shape"]), []).append(o)
    for phrase in parsed.objects:
        counts["num_phrases"] += 1
        matched = by_key.get((phrase.color, phrase.shape))
        if matched is None:
            continue
        counts["num_matched_phrases"] += 1
        steps = range(phrase.start, phrase.end)
        counts["num_grounded"] += any(_looks_inside(attention[t], o["bbox"], widen_cells)
                                      for t in steps for o in matched)
        counts["num_grounded_noun"] += any(
            _looks_inside(attention[phrase.noun_index], o["bbox"], widen_cells)
            for o in matched)
        if phrase.size is not None:
            counts["num_sized_phrases"] += 1
            counts["num_size_correct"] += any(phrase.size == o["size"] for o in matched)
    named = {(p.color, p.shape) for p in parsed.objects}
    counts["num_attribute_correct"] += named == set(by_key)
    if len(gt) >= 2:
        counts["num_relation_images"] += 1
        counts["num_relation_correct"] += _relation_true(parsed, by_key)
    return counts


def merge_grounding(parts: Sequence[Mapping]) -> dict:
    """`grounding_metrics` of the union of disjoint image sets, from each set's result.

    The Evaluator scores one batch at a time; the counts add up, and the rates
    come out exactly as if every image had been scored at once.

    Args:
      parts: `grounding_metrics` results.
    Returns:
      The same keys as `grounding_metrics`.
    """
    counts = {k: sum(int(p[k]) for p in parts) for k in COUNT_KEYS}
    return _with_rates(counts, sum(int(p["num_images"]) for p in parts))


def _with_rates(counts: Mapping[str, int], num_images: int) -> dict:
    """The rates of `grounding_metrics` from its counts."""
    rate = lambda a, b: counts[a] / counts[b] if counts[b] else None  # noqa: E731
    return {
        "grounding": rate("num_grounded", "num_matched_phrases"),
        "grounding_noun": rate("num_grounded_noun", "num_matched_phrases"),
        "attribute_accuracy": rate("num_attribute_correct", "num_attribute_images"),
        "size_accuracy": rate("num_size_correct", "num_sized_phrases"),
        "relation_accuracy": rate("num_relation_correct", "num_relation_images"),
        "num_images": num_images,
        **counts,
    }


def attention_argmax_cell(attention_map: np.ndarray) -> tuple[int, int]:
    """(row, col) of the largest weight of an (H, W) map."""
    row, col = np.unravel_index(int(np.argmax(attention_map)), attention_map.shape)
    return int(row), int(col)


def _looks_inside(attention_map: np.ndarray, bbox: Sequence[float], widen_cells: float) -> bool:
    """Whether the argmax cell's centre lies in the box widened by `widen_cells` cells."""
    h, w = attention_map.shape
    row, col = attention_argmax_cell(attention_map)
    cy, cx = (row + 0.5) / h, (col + 0.5) / w
    ymin, xmin, ymax, xmax = (float(v) for v in bbox)
    my, mx = widen_cells / h, widen_cells / w
    return bool(ymin - my <= cy <= ymax + my and xmin - mx <= cx <= xmax + mx)


def _relation_true(parsed, by_key: Mapping[tuple, Sequence[Mapping]]) -> bool:
    """The caption's first relation holds between two distinct objects its arguments match."""
    rel = parsed.relation
    if rel is None:
        return False
    a, b = parsed.objects[rel.subject], parsed.objects[rel.object]
    objs_a, objs_b = by_key.get((a.color, a.shape), ()), by_key.get((b.color, b.shape), ())
    return any(relation_holds(rel.kind, oa["bbox"], ob["bbox"])
               for oa in objs_a for ob in objs_b if oa is not ob)
