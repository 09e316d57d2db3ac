"""Caption text normalization and the reserved vocabulary tokens."""
from __future__ import annotations

import re
import string

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
RESERVED = (PAD, START, END, UNK)
PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3

_PUNCT = re.compile("[" + re.escape(string.punctuation) + "]")


def normalize(caption: str) -> list[str]:
    """Lowercases, strips punctuation and splits on whitespace.

    Args:
      caption: raw caption text.
    Returns:
      The list of words (possibly empty).
    """
    return _PUNCT.sub(" ", caption.lower()).split()


def encode(words: list[str], word_to_id: dict[str, int], max_length: int = 0) -> list[int]:
    """`<start> w1 .. wn <end>` as ids; unknown words map to `<unk>`.

    Args:
      words: normalized words.
      word_to_id: the vocabulary.
      max_length: if > 0, keep at most this many words (before `<end>`).
    """
    if max_length > 0:
        words = words[:max_length]
    return [START_ID] + [word_to_id.get(w, UNK_ID) for w in words] + [END_ID]


def decode_words(ids, id_to_word: list[str]) -> list[str]:
    """Token ids to words: stops at `<end>`, skips `<pad>`/`<start>`, unknown ids are `<unk>`.

    Args:
      ids: token ids (any iterable of ints).
      id_to_word: the vocabulary (a token's id is its index).
    Returns:
      The caption's words.
    """
    words = []
    for i in ids:
        i = int(i)
        if i == END_ID:
            break
        if i in (PAD_ID, START_ID):
            continue
        words.append(id_to_word[i] if 0 <= i < len(id_to_word) else UNK)
    return words


def decode(ids, id_to_word: list[str]) -> str:
    """Token ids to a caption string (`decode_words` joined by spaces)."""
    return " ".join(decode_words(ids, id_to_word))
