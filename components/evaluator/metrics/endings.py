"""The end-of-caption check: how many captions stop on a function word.

Self-critical training with a CIDEr reward is known to learn endings such as
"a man riding a horse with a": CIDEr rewards the n-grams a caption shares
with its references and barely penalizes a trailing "with a", so nothing
stops the model from appending one. The coco-caption metrics hardly move
when it does; this check counts it.

A caption *dangles* when its last word is in `FUNCTION_WORDS`: a word that
needs something after it to complete the phrase. The list is fixed, and
leaves out words that end complete captions:

- "left", "right" and "next" ("a red circle on the left"), and numbers and
  "one" ("a red circle and a blue one");
- "her" ("a woman with a dog beside her") and "by" ("a bus driving by"),
  whose use at the end of a caption is ordinary English.

Prepositions that can also be adverbs ("above", "over", "behind", ...) are
in the list: in the built-in synthetic data they only ever introduce an
object, so a caption that ends on one has lost that object. No reference
caption of the shapes or scenes grammar dangles (the tests check it).
"""
from __future__ import annotations

from typing import Sequence

from models.text import normalize

ARTICLES_AND_DETERMINERS = ("a", "an", "the", "this", "that", "these", "those", "some",
                            "its", "their", "his", "my", "your", "our", "every")
PREPOSITIONS = ("of", "in", "on", "at", "with", "to", "for", "from", "near", "under", "over",
                "above", "below", "behind", "beside", "between", "beneath", "underneath",
                "into", "onto", "atop", "among", "toward", "towards", "than", "upon")
CONJUNCTIONS = ("and", "or", "but", "nor")
AUXILIARIES = ("is", "are", "was", "were", "be", "been", "being", "has", "have", "had")
# The words a caption must not end on.
FUNCTION_WORDS = frozenset(ARTICLES_AND_DETERMINERS + PREPOSITIONS + CONJUNCTIONS + AUXILIARIES)


def last_word(caption: str | Sequence[str]) -> str | None:
    """The caption's last word after `models.text.normalize`, or None for an empty caption.

    Args:
      caption: the caption string, or its words (each normalized).
    """
    if isinstance(caption, str):
        words = normalize(caption)
    else:
        words = [w for word in caption for w in normalize(str(word))]
    return words[-1] if words else None


def is_dangling(caption: str | Sequence[str]) -> bool:
    """Whether a caption ends on a function word (an empty caption does not)."""
    return last_word(caption) in FUNCTION_WORDS


def ending_metrics(captions: Sequence[str | Sequence[str]]) -> dict:
    """The end-of-caption check over a set of generated captions.

    Captions are normalized as the Evaluator's metrics read them
    (`models.text.normalize`: lowercase, punctuation stripped, whitespace
    split).

    Args:
      captions: per image, the caption string or its words.
    Returns:
      ``dangling_endings``: how many non-empty captions end on a word of
      `FUNCTION_WORDS`; ``dangling_ending_rate``: that count over the
      non-empty captions (None when there are none; lower is better);
      ``empty_captions``: how many captions have no word (not counted as
      dangling).
    """
    endings = [last_word(c) for c in captions]
    non_empty = [w for w in endings if w is not None]
    dangling = sum(w in FUNCTION_WORDS for w in non_empty)
    return {"dangling_endings": dangling,
            "dangling_ending_rate": dangling / len(non_empty) if non_empty else None,
            "empty_captions": len(endings) - len(non_empty)}
