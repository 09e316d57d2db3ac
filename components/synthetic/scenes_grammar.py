"""The synthetic "scenes" vocabulary, reference captions and caption parser.

Shared by the generator (`components/synthetic/scenes.py`), which writes the
reference captions, and by the grounding metrics
(`components/evaluator/metrics/grounding.py`), which parse generated captions back into
object phrases (with counts) and spatial relations.

Unlike the shapes grammar, a scenes caption describes a *subset* of the
image, the way people describe a photo: each reference names 1 to 3
"mentions", drawn with a preference for the salient ones (the largest visible
area). A mention is either one object ("a big red star") or every object of
one (color, kind) pair, counted ("two green rings"). Captions vary in their
words (kind, size and color synonyms, articles), in their sentence frame
("there is ...", "a picture of ...", "... on a striped background") and in
the order they name things; two singular mentions whose positions differ
clearly along one axis may be linked by a relation ("to the left of",
"above", ...), whether or not other objects lie between them.

Parsing is a superset of the shapes parser
(`components.synthetic.shapes_grammar.parse_caption`): on a caption made only
of shapes words it returns the same phrases, spans and relations, so the
grounding scores of shapes models do not change.
"""
from __future__ import annotations

import re
from typing import Mapping, NamedTuple, Optional, Sequence

import numpy as np

from components.synthetic import shapes_grammar
from components.synthetic.shapes_grammar import ARTICLES, INVERSE, ParsedCaption, box_center

# Saturated object colors (the shapes' six, then three more); backgrounds
# stay dark and desaturated.
COLORS: dict[str, tuple[int, int, int]] = {
    **shapes_grammar.COLORS,
    "pink": (255, 120, 200),
    "cyan": (30, 225, 235),
    "white": (240, 240, 240),
}
# Kinds of object (the `shape` attribute of an object dict).
KINDS: tuple[str, ...] = ("circle", "square", "triangle", "cross", "star", "diamond",
                          "ring", "heart")
# Side of the object's box as a fraction of the image side: (low, high).
SIZES: dict[str, tuple[float, float]] = {
    "small": (0.15, 0.19),
    "medium": (0.21, 0.25),
    "large": (0.28, 0.33),
}

# Words the generator writes for each attribute, the canonical one first.
KIND_WORDS: dict[str, tuple[str, ...]] = {
    "circle": ("circle", "disc", "dot"),
    "square": ("square", "box", "block"),
    "triangle": ("triangle",),
    "cross": ("cross",),
    "star": ("star",),
    "diamond": ("diamond", "rhombus"),
    "ring": ("ring", "hoop"),
    "heart": ("heart",),
}
PLURALS: dict[str, str] = {"box": "boxes", "cross": "crosses", "rhombus": "rhombuses"}
SIZE_WORDS: dict[str, tuple[str, ...]] = {
    "small": ("small", "little", "tiny"),
    "medium": ("medium", "average"),
    "large": ("large", "big"),
}
COLOR_WORDS: dict[str, tuple[str, ...]] = {c: (c,) for c in COLORS}
COLOR_WORDS["purple"] = ("purple", "violet")
COLOR_WORDS["cyan"] = ("cyan", "turquoise")
NUMBER_WORDS: tuple[str, ...] = ("zero", "one", "two", "three", "four", "five", "six",
                                 "seven", "eight", "nine", "ten")
BACKGROUNDS: tuple[str, ...] = ("dark", "striped", "checkered", "spotted", "shaded")
# How often the canonical synonym is used (the rest are spread evenly).
CANONICAL_WORD_PROB = 0.6
SIZE_WORD_PROB = 0.5          # a mention names its size this often
MENTION_COUNTS = (1, 2, 3)    # mentions per caption ...
MENTION_PROBS = (0.3, 0.45, 0.25)  # ... and how often
RELATION_PROB = 0.7           # two singular mentions with a clear relation get it this often
RELATION_MARGIN = 0.08        # min | |dx| - |dy| | between two centres for a relation
RELATION_MIN_DISTANCE = 0.15  # min displacement along the relation's axis
GROUP_BONUS = 0.25            # salience gained per extra member of a counted group
SALIENCE_POWER = 2.0          # mention draw weight: visible area ** SALIENCE_POWER

# Sentence frames. {A}, {B}, {C}: mentions; {rel}: A's relation to B, {inv}:
# B's to A; {bg}: the background word; {n}: the number of objects, in words.
FRAMES_1 = ("{A}", "there is {A}", "a picture of {A}", "an image of {A}",
            "{A} on a {bg} background", "a photo showing {A}")
FRAMES_1_MANY = ("{A} among {n} shapes", "{n} shapes including {A}",
                 "{A} and some other shapes")
FRAMES_2 = ("{A} and {B}", "{A} with {B}", "a picture of {A} and {B}",
            "{A} and {B} on a {bg} background", "there is {A} and {B}")
FRAMES_2_MANY = ("{n} shapes including {A} and {B}",)
FRAMES_2_REL = ("{A} {rel} {B}", "{A} is {rel} {B}", "there is {A} {rel} {B}",
                "{B} {inv} {A}", "{B} is {inv} {A}", "{A} {rel} {B} on a {bg} background")
FRAMES_3 = ("{A} with {B} and {C}", "{A} and {B} and {C}", "there is {A} with {B} and {C}",
            "{A} and {B} and {C} on a {bg} background")
FRAMES_3_REL = ("{A} {rel} {B} and {C}", "{A} is {rel} {B} and there is {C}",
                "{C} and {A} {rel} {B}", "{B} {inv} {A} with {C}")
# The relation wording the generator draws from (all of it parses).
RELATION_WORDING: dict[str, tuple[str, ...]] = {
    "left": ("to the left of", "left of", "on the left of"),
    "right": ("to the right of", "right of", "on the right of"),
    "above": ("above", "over"),
    "below": ("below", "under", "beneath"),
}

_PUNCT = re.compile(r"[^\w<>]+")
_THERE_IS_MANY = re.compile(r"\bthere is (" + "|".join(NUMBER_WORDS[2:]) + r")\b")
# Parser lookups: every written form -> canonical attribute.
_NOUNS: dict[str, tuple[str, bool]] = {}
for _kind, _words in KIND_WORDS.items():
    for _w in _words:
        _NOUNS[_w] = (_kind, False)
        _NOUNS[PLURALS.get(_w, _w + "s")] = (_kind, True)
_COLOR_OF = {w: c for c, ws in COLOR_WORDS.items() for w in ws}
_SIZE_OF = {w: s for s, ws in SIZE_WORDS.items() for w in ws}
_COUNT_OF = {w: i for i, w in enumerate(NUMBER_WORDS)}
_ATTRIBUTES = set(_COLOR_OF) | set(_SIZE_OF) | set(ARTICLES) | set(_COUNT_OF)


def phrase_role(word: str) -> str:
    """What a word does in an object phrase, as `parse_caption` reads it.

    Returns:
      "kind" (a kind noun, singular or plural), "color", "size", "stop" (an
      article or a number word: a phrase's run of modifiers starts there) or
      "other" (the parser skips it, or it ends the run).
    """
    if word in _NOUNS:
        return "kind"
    if word in _COLOR_OF:
        return "color"
    if word in _SIZE_OF:
        return "size"
    if word in ARTICLES or word in _COUNT_OF:
        return "stop"
    return "other"


class ScenePhrase(NamedTuple):
    """One mention in a caption: words ``[start, end)``, the noun at ``end - 1``.

    `count` is the number the phrase states: 1 for a singular noun, the number
    word of a plural ("two red rings" -> 2), None for a plural without one.
    """
    start: int
    end: int
    size: Optional[str]
    color: Optional[str]
    shape: str
    count: Optional[int] = 1
    plural: bool = False

    @property
    def noun_index(self) -> int:
        return self.end - 1


def number_word(n: int) -> str:
    """"two" for 2 (0 to 10)."""
    return NUMBER_WORDS[n]


def parse_caption(caption: str | Sequence[str]) -> ParsedCaption:
    """Finds the mentions (with counts) and the relations in a caption.

    A mention is a kind noun, singular or plural, in any of its synonyms,
    with the run of article/number/size/color words right before it (the
    run stops after an article or a number word). Relations are found as in
    the shapes parser: a relation phrase outside mentions links the nearest
    mention before it to the nearest after it. Unknown words are skipped.

    Args:
      caption: a string (split on whitespace after stripping punctuation) or a
        sequence of words (indices are kept, so they match decoding steps).
    Returns:
      A `ParsedCaption` whose `objects` are `ScenePhrase`s (canonical color,
      size and kind); `relation` is the first relation with both arguments.
    """
    if isinstance(caption, str):
        words = tuple(_PUNCT.sub(" ", caption.lower()).split())
    else:
        words = tuple(_PUNCT.sub("", str(w).lower()) for w in caption)
    objects: list[ScenePhrase] = []
    spans: list[tuple[int, int, str]] = []
    used_until = 0  # words before this index already belong to a phrase
    i = 0
    while i < len(words):
        w = words[i]
        if w in _NOUNS:
            kind, plural = _NOUNS[w]
            start, size, color, count = i, None, None, None
            j = i - 1
            while j >= used_until and words[j] in _ATTRIBUTES:
                wj = words[j]
                if wj in _COLOR_OF and color is None:
                    color = _COLOR_OF[wj]
                elif wj in _SIZE_OF and size is None:
                    size = _SIZE_OF[wj]
                elif wj in _COUNT_OF and count is None:
                    count = _COUNT_OF[wj]
                start = j
                if wj in ARTICLES or wj in _COUNT_OF:
                    break
                j -= 1
            if not plural:
                count = 1
            objects.append(ScenePhrase(start, i + 1, size, color, kind, count, plural))
            used_until = i + 1
            i += 1
            continue
        # The shapes parser's own relation phrases, so both read relations alike.
        span = shapes_grammar.relation_span(words, i)
        if span:
            spans.append(span)
            used_until = i = span[1]
            continue
        i += 1
    return shapes_grammar.caption_with_relations(words, objects, spans)


def clear_relation(box_a: Sequence[float], box_b: Sequence[float]) -> Optional[str]:
    """a's relation to b when it is unambiguous, else None.

    Unambiguous: the dominant axis beats the other by `RELATION_MARGIN` and
    the centres are at least `RELATION_MIN_DISTANCE` apart along it.

    Args:
      box_a, box_b: normalized ``(ymin, xmin, ymax, xmax)`` boxes.
    Returns:
      "left", "right", "above", "below" (a relative to b) or None.
    """
    ay, ax = box_center(box_a)
    by, bx = box_center(box_b)
    dx, dy = bx - ax, by - ay
    if abs(abs(dx) - abs(dy)) < RELATION_MARGIN or max(abs(dx), abs(dy)) < RELATION_MIN_DISTANCE:
        return None
    return shapes_grammar.dominant_relation(box_a, box_b)


def group_objects(objects: Sequence[Mapping]) -> list[list[Mapping]]:
    """Objects grouped by (color, kind), most salient group first (see `salience`)."""
    groups: dict[tuple[str, str], list[Mapping]] = {}
    for o in objects:
        groups.setdefault((o["color"], o["shape"]), []).append(o)
    return sorted(groups.values(), key=lambda g: -salience(g))


def salience(group: Sequence[Mapping]) -> float:
    """How much a group stands out: its largest visible area, plus a quarter per extra member.

    Summing the areas would make every group outshine single objects; people
    notice a repeated object somewhat more, not twice as much.
    """
    return max(o["visible_area"] for o in group) * (1 + GROUP_BONUS * (len(group) - 1))


def make_captions(objects: Sequence[Mapping], background: str, num_captions: int,
                  rng: np.random.Generator) -> list[str]:
    """Reference captions for a scene, each naming a salient subset of it.

    Args:
      objects: dicts with `bbox` (ymin, xmin, ymax, xmax), `size`, `color`,
        `shape` and `visible_area` (visible pixels, the salience).
      background: one of `BACKGROUNDS`.
      num_captions: how many captions (>= 1).
      rng: draws the mentions, words and frames.
    Returns:
      The captions: lowercase words separated by single spaces.
    """
    if num_captions < 1:
        raise ValueError("num_captions must be >= 1")
    if not objects:
        raise ValueError("a scene needs at least one object")
    groups = group_objects(objects)
    weights = np.array([salience(g) for g in groups], float)
    weights = np.maximum(weights, 1e-6) ** SALIENCE_POWER
    return [_one_caption(groups, weights, len(objects), background, rng)
            for _ in range(num_captions)]


def _one_caption(groups, weights, n_objects, background, rng) -> str:
    """One reference: draw the mentions, maybe a relation, then a frame."""
    m = int(rng.choice(MENTION_COUNTS, p=MENTION_PROBS))
    m = min(m, len(groups))
    picked = rng.choice(len(groups), size=m, replace=False, p=weights / weights.sum())
    picked = sorted(int(k) for k in picked)  # most salient named first
    mentions = [groups[k] for k in picked]
    relation = None
    if m >= 2:
        singular = [k for k, g in enumerate(mentions) if len(g) == 1]
        pairs = [(a, b) for a in singular for b in singular if a < b]
        pairs = [(a, b, clear_relation(mentions[a][0]["bbox"], mentions[b][0]["bbox"]))
                 for a, b in pairs]
        pairs = [p for p in pairs if p[2] is not None]
        if pairs and rng.random() < RELATION_PROB:
            a, b, kind = pairs[int(rng.integers(len(pairs)))]
            rest = [k for k in range(m) if k not in (a, b)]
            mentions = [mentions[a], mentions[b]] + [mentions[k] for k in rest]
            relation = kind
    fill = {key: _mention_phrase(g, rng) for key, g in zip("ABC", mentions, strict=False)}
    fill["bg"] = background
    fill["n"] = number_word(n_objects)
    if relation is not None:
        fill["rel"] = _pick(RELATION_WORDING[relation], rng)
        fill["inv"] = _pick(RELATION_WORDING[INVERSE[relation]], rng)
        frames = FRAMES_2_REL if m == 2 else FRAMES_3_REL
    else:
        frames = {1: FRAMES_1, 2: FRAMES_2, 3: FRAMES_3}[m]
        many = {1: FRAMES_1_MANY, 2: FRAMES_2_MANY, 3: ()}[m]
        if n_objects > sum(len(g) for g in mentions):
            frames = frames + many
    caption = _pick(frames, rng).format(**fill)
    return _THERE_IS_MANY.sub(r"there are \1", caption)


def _mention_phrase(group: Sequence[Mapping], rng: np.random.Generator) -> str:
    """"a big red star" for one object, "two green rings" for a group."""
    color, kind = group[0]["color"], group[0]["shape"]
    noun = _synonym(KIND_WORDS[kind], rng)
    sizes = {o["size"] for o in group}
    words = []
    if len(sizes) == 1 and rng.random() < SIZE_WORD_PROB:
        words.append(_synonym(SIZE_WORDS[sizes.pop()], rng))
    words.append(_synonym(COLOR_WORDS[color], rng))
    if len(group) > 1:
        return " ".join([number_word(len(group))] + words + [PLURALS.get(noun, noun + "s")])
    article = "a" if rng.random() < 0.85 else "one"
    if article == "a" and words[0][0] in "aeiou":
        article = "an"
    return " ".join([article] + words + [noun])


def _synonym(words: Sequence[str], rng: np.random.Generator) -> str:
    """The canonical word with probability `CANONICAL_WORD_PROB`, else another."""
    if len(words) == 1 or rng.random() < CANONICAL_WORD_PROB:
        return words[0]
    return words[1 + int(rng.integers(len(words) - 1))]


def _pick(pool: Sequence[str], rng: np.random.Generator) -> str:
    """One item of the pool, uniformly."""
    return pool[int(rng.integers(len(pool)))]
