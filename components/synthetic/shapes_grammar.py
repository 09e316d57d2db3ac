"""The synthetic shapes vocabulary and caption grammar.

Shared by the generator (`components/synthetic/shapes.py`), which writes the
reference captions, and by the grounding metrics
(`components/evaluator/metrics/grounding.py`), which parse generated captions back into
objects and a spatial relation.

Grammar (every caption is lowercase, words separated by single spaces):

    object   := "a" SIZE COLOR SHAPE            e.g. "a large red circle"
    relation := "to the left of" | "above"       (canonical, o1 -> o2)
              | "left of" | "over"               (alternative wording)
              | "to the right of" | "below"      (inverse, o2 -> o1)
              | "right of" | "under"            (inverse, alternative wording)

Canonical order: objects are sorted left to right by box centre; o1, o2 are
the two leftmost, o3 the rightmost. If the o1/o2 displacement is mostly
horizontal the canonical relation is "to the left of"; if it is mostly
vertical, o1 and o2 are swapped where needed so that o1 is the upper one and
the canonical relation is "above" (so the first object named always follows
from a clear geometric fact, never from a pixel or two of x difference).

Every image gets one primary caption (the first template of its object
count) plus templates drawn from pools; ``ceil(0.6 * n)`` of the ``n``
captions (3 of 5) name o1 first with the canonical relation, the rest use the
inverse relation or another order (one object: another opening, "there
is ..."), so a model has a clear mode to learn.
"""
from __future__ import annotations

import math
import re
from typing import Mapping, NamedTuple, Optional, Sequence

import numpy as np

# Distinct hues, saturated, on a black background.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (230, 30, 30),
    "green": (30, 200, 50),
    "blue": (40, 90, 255),
    "yellow": (245, 235, 30),
    "purple": (170, 50, 230),
    "orange": (255, 140, 0),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "cross")
# Side of the object's box as a fraction of the image side: (low, high).
SIZES: dict[str, tuple[float, float]] = {
    "small": (0.16, 0.20),
    "large": (0.30, 0.34),
}
ARTICLES: tuple[str, ...] = ("a", "an", "the", "one")

RELATION_KINDS: tuple[str, ...] = ("left", "right", "above", "below")
INVERSE: dict[str, str] = {"left": "right", "right": "left", "above": "below", "below": "above"}
# The wording the generator uses: the canonical phrase and an alternative.
RELATION_PHRASE: dict[str, str] = {"left": "to the left of", "right": "to the right of",
                                   "above": "above", "below": "below"}
RELATION_ALT_PHRASE: dict[str, str] = {"left": "left of", "right": "right of",
                                       "above": "over", "below": "under"}
# Everything the parser recognizes, longest first so "to the left of" wins
# over "left of".
_RELATION_WORDS: dict[str, tuple[str, ...]] = {
    "left": ("to the left of", "on the left of", "left of"),
    "right": ("to the right of", "on the right of", "right of"),
    "above": ("on top of", "above", "over"),
    "below": ("underneath", "beneath", "below", "under"),
}
_RELATION_PATTERNS: list[tuple[tuple[str, ...], str]] = sorted(
    ((tuple(p.split()), kind) for kind, ps in _RELATION_WORDS.items() for p in ps),
    key=lambda item: -len(item[0]))

# Templates. {o}, {o1}, {o2}, {o3}: object phrases in canonical order; {rel}
# and {rel_alt}: the canonical relation of o1 to o2; {inv}, {inv_alt}: the
# inverse relation (of o2 to o1).
ONE_OBJECT = {
    "primary": "{o}",
    "canonical": ("{o} on a black background", "{o} in the picture", "{o} in the image"),
    "other": ("there is {o}", "a picture of {o}", "an image with {o}", "a photo of {o}"),
}
TWO_OBJECTS = {
    "primary": "{o1} {rel} {o2}",
    "canonical": ("{o1} is {rel} {o2}", "there is {o1} {rel} {o2}", "{o1} {rel_alt} {o2}",
                  "{o1} {rel} {o2} on a black background"),
    "other": ("{o2} is {inv} {o1}", "{o2} {inv} {o1}", "there is {o2} {inv} {o1}",
              "{o2} {inv_alt} {o1}"),
}
THREE_OBJECTS = {
    "primary": "{o1} {rel} {o2} and {o3}",
    "canonical": ("there is {o1} {rel} {o2} and {o3}", "{o1} {rel_alt} {o2} and {o3}",
                  "{o1} {rel} {o2} and also {o3}", "{o1} {rel} {o2} with {o3}",
                  "{o1} {rel} {o2} and {o3} on a black background"),
    "other": ("{o2} {inv} {o1} and {o3}", "{o2} is {inv} {o1} and {o3}",
              "there is {o2} {inv} {o1} and {o3}", "{o3} and {o1} {rel} {o2}"),
}
CANONICAL_FRACTION = 0.6

_PUNCT = re.compile(r"[^\w<>]+")


class ObjectPhrase(NamedTuple):
    """One object named in a caption: words ``[start, end)``, the noun at ``end - 1``."""
    start: int
    end: int
    size: Optional[str]
    color: Optional[str]
    shape: str

    @property
    def noun_index(self) -> int:
        return self.end - 1


class Relation(NamedTuple):
    """A relation phrase at words ``[start, end)``: objects[subject] is `kind` of objects[object]."""
    start: int
    end: int
    kind: str
    subject: int
    object: int


class ParsedCaption(NamedTuple):
    """What `parse_caption` found: the words, the object phrases and relations."""
    words: tuple[str, ...]
    objects: tuple[ObjectPhrase, ...]
    relation: Optional[Relation]
    relations: tuple[Relation, ...]


def object_phrase(obj: Mapping) -> str:
    """"a large red circle" for an object dict with `size`, `color`, `shape`."""
    return f"a {obj['size']} {obj['color']} {obj['shape']}"


def box_center(box: Sequence[float]) -> tuple[float, float]:
    """(cy, cx) of a ``(ymin, xmin, ymax, xmax)`` box."""
    ymin, xmin, ymax, xmax = (float(v) for v in box)
    return (ymin + ymax) / 2.0, (xmin + xmax) / 2.0


def dominant_relation(box_a: Sequence[float], box_b: Sequence[float]) -> str:
    """The relation of box a to box b along the axis of larger centre displacement.

    Image coordinates: y grows downwards, so "above" means a smaller y.
    """
    ay, ax = box_center(box_a)
    by, bx = box_center(box_b)
    dx, dy = bx - ax, by - ay
    if abs(dx) >= abs(dy):
        return "left" if dx > 0 else "right"
    return "above" if dy > 0 else "below"


def relation_holds(kind: str, box_a: Sequence[float], box_b: Sequence[float]) -> bool:
    """Whether "a is <kind> b" is true for boxes ``(ymin, xmin, ymax, xmax)``.

    True when the centre of a lies on the `kind` side of the centre of b and
    that axis carries the larger displacement (so "left of" is false for an
    object mostly above the other).

    Args:
      kind: one of "left", "right", "above", "below".
      box_a, box_b: normalized boxes of the subject and the object.
    Returns:
      A bool.
    """
    if kind not in RELATION_KINDS:
        raise ValueError(f"unknown relation kind {kind!r}; expected one of {RELATION_KINDS}")
    ay, ax = box_center(box_a)
    by, bx = box_center(box_b)
    dx, dy = bx - ax, by - ay
    if kind == "left":
        return dx > 0 and abs(dx) >= abs(dy)
    if kind == "right":
        return dx < 0 and abs(dx) >= abs(dy)
    if kind == "above":
        return dy > 0 and abs(dy) >= abs(dx)
    return dy < 0 and abs(dy) >= abs(dx)


def canonical_order(objects: Sequence[Mapping]) -> tuple[list[Mapping], Optional[str]]:
    """Objects in the order the primary caption names them, and o1's relation to o2.

    Sorted left to right by box centre; for a mostly vertical o1/o2 pair the
    upper one comes first. Returns ``(ordered, kind)`` with kind "left",
    "above" or None (a single object).
    """
    ordered = sorted(objects, key=lambda o: box_center(o["bbox"])[1])
    if len(ordered) < 2:
        return list(ordered), None
    a, b = ordered[0], ordered[1]
    kind = dominant_relation(a["bbox"], b["bbox"])
    if kind == "below":  # a is lower: name the upper one first
        ordered[0], ordered[1] = b, a
        kind = "above"
    return list(ordered), kind


def make_captions(objects: Sequence[Mapping], num_captions: int,
                  rng: np.random.Generator) -> tuple[list[Mapping], list[str]]:
    """Reference captions for an image's objects.

    Args:
      objects: dicts with `bbox` (ymin, xmin, ymax, xmax), `size`, `color`, `shape`;
        1 to 3 of them.
      num_captions: how many captions (>= 1).
      rng: draws which templates fill the non-primary slots.
    Returns:
      ``(ordered_objects, captions)``: the objects in canonical order and the
      captions, the primary one first.
    """
    if num_captions < 1:
        raise ValueError("num_captions must be >= 1")
    ordered, kind = canonical_order(objects)
    n = len(ordered)
    grammar = {1: ONE_OBJECT, 2: TWO_OBJECTS, 3: THREE_OBJECTS}.get(n)
    if grammar is None:
        raise ValueError(f"the shapes grammar describes 1 to 3 objects, got {n}")
    fill = {f"o{i + 1}": object_phrase(o) for i, o in enumerate(ordered)}
    fill["o"] = object_phrase(ordered[0])
    if kind is not None:
        fill.update(rel=RELATION_PHRASE[kind], rel_alt=RELATION_ALT_PHRASE[kind],
                    inv=RELATION_PHRASE[INVERSE[kind]], inv_alt=RELATION_ALT_PHRASE[INVERSE[kind]])
    n_canonical = max(1, math.ceil(CANONICAL_FRACTION * num_captions))
    n_other = num_captions - n_canonical
    if not grammar["other"]:
        n_canonical, n_other = num_captions, 0
    templates = [grammar["primary"]]
    templates += _draw(grammar["canonical"], n_canonical - 1, rng)
    templates += _draw(grammar["other"], n_other, rng)
    rest = templates[1:]
    order = rng.permutation(len(rest))
    templates = templates[:1] + [rest[i] for i in order]
    return ordered, [t.format(**fill) for t in templates]


def _draw(pool: Sequence[str], k: int, rng: np.random.Generator) -> list[str]:
    """k templates from the pool, without replacement until the pool runs out."""
    out: list[str] = []
    while k > 0 and pool:
        take = min(k, len(pool))
        out += [pool[i] for i in rng.choice(len(pool), size=take, replace=False)]
        k -= take
    return out


def _clean(word: str) -> str:
    """Lowercase, punctuation stripped (keeps <end>-style tokens)."""
    return _PUNCT.sub("", str(word).lower())


def parse_caption(caption: str | Sequence[str]) -> ParsedCaption:
    """Finds the object phrases and the relation in a caption.

    An object phrase is a shape noun with the run of article/size/color words
    right before it (in any order; missing ones are None). A relation is a
    relation phrase (any wording in `_RELATION_WORDS`) outside object
    phrases, whose subject is the nearest object phrase before it and whose
    object is the nearest after it. Unknown words are skipped.

    Args:
      caption: a string (split on whitespace after stripping punctuation) or a
        sequence of words (indices are kept, so they match decoding steps).
    Returns:
      A `ParsedCaption`; `relation` is the first relation with both
      arguments (for canonical captions, between the first two named
      objects), or None.
    """
    if isinstance(caption, str):
        words = tuple(_PUNCT.sub(" ", caption.lower()).split())
    else:
        words = tuple(_clean(w) for w in caption)
    attributes = set(COLORS) | set(SIZES) | set(ARTICLES)
    objects: list[ObjectPhrase] = []
    used_until = 0  # words before this index already belong to a phrase
    spans: list[tuple[int, int, str]] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w in SHAPES:
            start, size, color = i, None, None
            j = i - 1
            while j >= used_until and words[j] in attributes:
                if words[j] in COLORS and color is None:
                    color = words[j]
                elif words[j] in SIZES and size is None:
                    size = words[j]
                start = j
                if words[j] in ARTICLES:
                    break
                j -= 1
            objects.append(ObjectPhrase(start, i + 1, size, color, w))
            used_until = i + 1
            i += 1
            continue
        span = relation_span(words, i)
        if span:
            spans.append(span)
            used_until = i = span[1]
            continue
        i += 1
    return caption_with_relations(words, objects, spans)


def relation_span(words: Sequence[str], i: int) -> Optional[tuple[int, int, str]]:
    """`(start, end, kind)` of the relation phrase starting at word `i`, or None."""
    for pattern, kind in _RELATION_PATTERNS:
        if tuple(words[i:i + len(pattern)]) == pattern:
            return i, i + len(pattern), kind
    return None


def caption_with_relations(words, objects, spans) -> "ParsedCaption":
    """The `ParsedCaption`: each relation span links the nearest object phrases around it."""
    relations = []
    for start, end, kind in spans:
        before = [k for k, o in enumerate(objects) if o.end <= start]
        after = [k for k, o in enumerate(objects) if o.start >= end]
        if before and after:
            relations.append(Relation(start, end, kind, before[-1], after[0]))
    return ParsedCaption(words, tuple(objects), relations[0] if relations else None,
                         tuple(relations))
