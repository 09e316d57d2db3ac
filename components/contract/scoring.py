"""How every stage that scores captions treats them: the Trainer's validation and the Evaluator."""
from __future__ import annotations

# Stands in for an empty caption when it is scored, so that the line-based
# tokenizer stays aligned and ROUGE-L does not divide by zero; it matches no
# reference word.
EMPTY_CAPTION = "emptycaption"


def nonempty(caption: str) -> str:
    """One line of text, `EMPTY_CAPTION` for a blank caption."""
    caption = " ".join(str(caption).split())
    return caption if caption else EMPTY_CAPTION
