"""Attention grounding on COCO-format data: object boxes labelled by category.

Where the data carries COCO instance annotations (`data.instances_json`,
docs/datasets.md), each test image has boxes labelled with a category name
("dog", "dining table"). A generated caption *mentions* a category where its
words spell the category's name, a plural of it, or a synonym from
`SYNONYMS` ("man" and "people" name `person`, "table" names `dining table`);
the longest name wins ("teddy bear" is not a `bear`, "hot dog" not a `dog`).

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

from functools import lru_cache
from typing import Mapping, Sequence

# COCO 2014/2017's 80 object categories, as `instances_*.json` names them.
COCO_CATEGORIES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat",
    "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack",
    "umbrella", "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball",
    "kite", "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket",
    "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair",
    "couch", "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse",
    "remote", "keyboard", "cell phone", "microwave", "oven", "toaster", "sink",
    "refrigerator", "book", "clock", "vase", "scissors", "teddy bear", "hair drier",
    "toothbrush")

# Words captions use for a category other than its name (plurals are derived).
# Kept to unambiguous uses in COCO's captions; a word naming two categories
# is left out.
SYNONYMS = {
    "person": ("man", "men", "woman", "women", "people", "boy", "girl", "child", "children",
               "kid", "guy", "lady", "ladies", "player", "skier", "surfer", "skateboarder",
               "snowboarder", "baby", "babies", "persons", "rider", "pedestrian"),
    "bicycle": ("bike",),
    "motorcycle": ("motorbike", "motor bike", "scooter"),
    "airplane": ("plane", "jet", "aeroplane", "airliner", "aircraft"),
    "bus": ("buses",),
    "boat": ("ship", "canoe", "kayak", "sailboat"),
    "traffic light": ("stop light", "stoplight"),
    "fire hydrant": ("hydrant",),
    "sheep": ("lamb",),
    "cow": ("cattle", "bull", "calf", "calves"),
    "tie": ("necktie",),
    "suitcase": ("luggage", "suit case"),
    "skis": ("ski",),
    # not "baseball" or "football": captions use them as modifiers ("a baseball player")
    "sports ball": ("ball", "soccer ball", "tennis ball"),
    "baseball bat": ("bat",),
    "baseball glove": ("glove", "mitt"),
    "tennis racket": ("racket", "racquet"),
    "wine glass": ("glass of wine",),
    "cup": ("mug",),
    "knife": ("knives",),
    "hot dog": ("hotdog",),
    "donut": ("doughnut",),
    "couch": ("sofa",),
    "potted plant": ("plant", "houseplant"),
    "dining table": ("table",),
    "tv": ("television", "tvs"),
    "laptop": ("notebook computer",),
    "mouse": ("mice", "computer mouse"),
    "remote": ("remote control", "controller"),
    "cell phone": ("phone", "cellphone", "smartphone", "mobile phone"),
    "refrigerator": ("fridge",),
    "hair drier": ("hair dryer", "blow dryer"),
}


def _plurals(name: str) -> tuple[str, ...]:
    """English plural forms of a name's last word (a lexicon would be exact; these cover COCO)."""
    head, _, rest = name.rpartition(" ")
    word = rest
    forms = {word + "s"}
    if word.endswith(("s", "sh", "ch", "x", "z")):
        forms.add(word + "es")
    if word.endswith("y") and word[-2:-1] not in "aeiou":
        forms.add(word[:-1] + "ies")
    if word.endswith("fe"):
        forms.add(word[:-2] + "ves")
    return tuple(f"{head} {f}".strip() for f in sorted(forms))


@lru_cache(maxsize=512)
def name_table(categories: tuple[str, ...] = ()) -> dict[tuple[str, ...], str]:
    """Word sequence -> category, for COCO's categories, `SYNONYMS` and `categories`.

    Args:
      categories: further category names (a dataset's own, from its
        instances file); each is matched by its name and plurals.
    Returns:
      A mapping from lower-case word tuples (one or more words) to the
      category they name (cached per `categories`: do not modify it).
    """
    table: dict[tuple[str, ...], str] = {}
    for category in tuple(COCO_CATEGORIES) + tuple(categories):
        category = category.strip().lower()
        if not category:
            continue
        for form in (category, *_plurals(category)):
            table.setdefault(tuple(form.split()), category)
        for synonym in SYNONYMS.get(category, ()):
            for form in (synonym, *_plurals(synonym)):
                table.setdefault(tuple(form.split()), category)
    return table


def mentions(words: Sequence[str], table: Mapping[tuple[str, ...], str]) -> list[tuple[str, int, int]]:
    """The category mentions of a caption, longest name first, left to right.

    Args:
      words: the caption's words.
      table: `name_table`.
    Returns:
      (category, start, end) per mention: words ``start..end-1`` spell it.
    """
    longest = max((len(k) for k in table), default=1)
    lowered = [w.lower() for w in words]
    found, i = [], 0
    while i < len(lowered):
        for n in range(min(longest, len(lowered) - i), 0, -1):
            category = table.get(tuple(lowered[i:i + n]))
            if category is not None:
                found.append((category, i, i + n))
                i += n
                break
        else:
            i += 1
    return found


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
