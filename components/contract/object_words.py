"""Which caption words name an object of an image: COCO categories and the synthetic attributes.

Two stages read object boxes against caption words: the Evaluator's
grounding metrics (which object a generated phrase names) and the
Trainer's self-critical box term, `train.scst_box_attention` (where the
model should look while it says a word). Both take the words from here.

- A COCO category (`data.instances_json`) is named by its name, the plural
  of its last word, and the synonyms in `SYNONYMS` ("man" and "people" name
  `person`, "table" names `dining table`); `name_table` maps every such
  word sequence to its category, and `mentions` finds them in a caption,
  the longest name first ("teddy bear" is not a `bear`).
- A synthetic object (shapes and scenes: `color`, `shape`, `size`) is named
  by the scenes grammar's words for its kind (singular and plural), its
  colour and its size (`components.synthetic.scenes_grammar`).

`object_words` gives the single words that name one object, for a model
that reads a caption one word at a time; `phrase_role` says what a word
does in a synthetic object phrase ("a big red star"), for the Trainer's
size reward (`train.scst_size_reward`), which reads phrases as the scenes
parser does.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping, Sequence

from components.synthetic import scenes_grammar

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


def object_words(obj: Mapping) -> tuple[str, ...]:
    """The single words that name one object, sorted.

    Args:
      obj: an object dict: with `category` (COCO instances), or with
        `color`, `shape` and `size` (synthetic; a missing attribute adds no word).
    Returns:
      Lower-case words. A category's one-word names (its name, plurals,
      synonyms) and the last word of its longer names, unless that word
      alone names another category ("table" for `dining table`, not "dog"
      for `hot dog`); an attribute's words in the scenes grammar (a kind's
      plurals included).
    """
    if "category" in obj:
        return _category_words(str(obj["category"]).strip().lower())
    words: set[str] = set()
    kind = str(obj.get("shape", ""))
    for w in scenes_grammar.KIND_WORDS.get(kind, ()):
        words.update((w, scenes_grammar.PLURALS.get(w, w + "s")))
    words.update(scenes_grammar.COLOR_WORDS.get(str(obj.get("color", "")), ()))
    words.update(scenes_grammar.SIZE_WORDS.get(str(obj.get("size", "")), ()))
    return tuple(sorted(words))


@lru_cache(maxsize=4096)
def _category_words(category: str) -> tuple[str, ...]:
    """`object_words` of a category (its table is COCO's plus the category itself)."""
    table = name_table((category,))
    words = set()
    for form, named in table.items():
        if named != category:
            continue
        if len(form) == 1:
            words.add(form[0])
        elif table.get(form[-1:], category) == category:
            words.add(form[-1])
    return tuple(sorted(words))


# What a word does in a synthetic object phrase ("a big red star"): the
# scenes parser's own reading, for the Trainer's size reward.
phrase_role = scenes_grammar.phrase_role
