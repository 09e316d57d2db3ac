"""Attention grounding on COCO-format data: object boxes labelled by category.

Where the data carries COCO instance annotations (`data.instances_json`,
docs/datasets.md), each test image has boxes labelled with a category name
("dog", "dining table"). A generated caption *mentions* a category where its
words spell the category's name, a plural of it, or a synonym
(`components.contract.object_words`: "man" and "people" name `person`,
"table" names `dining table`); the longest name wins ("teddy bear" is not a `bear`, "hot dog" not a `dog`).

A mention is *matched* when the image has a box of that category. Over the
matched mentions, as on the synthetic data (`components.evaluator.metrics.grounding`):

- ``grounding``: the fraction where the attention maximum at one of the
  mention's words lies inside a box of that category (widened by one grid
  cell);
- ``grounding_noun``: the same at the mention's last word alone (its head
  noun: "table" in "dining table").

The counts come in `COUNT_KEYS` order so that the paired bootstrap and
`merge_grounding` treat both kinds of data alike; the attribute, size and
relation counts stay 0 here (COCO annotations name no colour or relation).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from components.contract.object_words import mentions, name_table


def category_counts(words: Sequence[str], attention, objects: Sequence[Mapping],
                    looks_inside, widen_cells: float) -> dict:
    """One image's grounding counts (`COUNT_KEYS` names) from category-labelled boxes.

    Args:
      words: the generated words, aligned with the attention steps.
      attention: ``(T, H, W)`` maps, ``T >= len(words)``.
      objects: dicts with `bbox` (ymin, xmin, ymax, xmax normalized) and `category`.
      looks_inside: ``(map, bbox, widen_cells) -> bool``, the synthetic
        data's test of the attention maximum against a box.
      widen_cells: grid cells the box is widened by on every side.
    Returns:
      ``num_phrases`` (mentions), ``num_matched_phrases``, ``num_grounded``,
      ``num_grounded_noun``; every other count 0.
    """
    boxes: dict[str, list] = {}
    for o in objects:
        boxes.setdefault(str(o["category"]).strip().lower(), []).append(o["bbox"])
    counts = {"num_phrases": 0, "num_matched_phrases": 0, "num_grounded": 0,
              "num_grounded_noun": 0}
    for category, start, end in mentions(words, name_table(tuple(sorted(boxes)))):
        counts["num_phrases"] += 1
        if category not in boxes:
            continue
        counts["num_matched_phrases"] += 1
        counts["num_grounded"] += any(looks_inside(attention[t], box, widen_cells)
                                      for t in range(start, end) for box in boxes[category])
        counts["num_grounded_noun"] += any(looks_inside(attention[end - 1], box, widen_cells)
                                           for box in boxes[category])
    return counts
