"""The allowed values of config keys, and the names the config's checks know.

The one home of these lists: the stages import them from here.
"""
from __future__ import annotations

from components.contract import precision
from models import decoder_options

# What the Trainer may select its best model and stop early on.
EARLY_STOPPING_METRICS = ("val_loss", "bleu4", "cider")

# Keys whose values come from a fixed list. The `model` section's lists are
# the decoder's own (`models/decoder_options.py`), which checks them too.
CHOICES: dict[str, tuple[str, ...]] = {
    **{f"model.{key}": choices for key, choices in decoder_options.CHOICES.items()},
    "data.source": ("synthetic", "scenes", "coco", "karpathy", "tfds"),
    "encoder.kind": ("small_cnn", "keras_app"),
    "preprocess.direct_running_mode": ("in_memory", "multi_threading", "multi_processing"),
    "train.strategy": ("default", "mirrored", "multi_worker"),
    "train.optimizer": ("adam", "rmsprop"),
    "train.lr_schedule": ("constant", "cosine"),
    "train.scst_lr_schedule": ("constant", "cosine"),
    "train.early_stopping_metric": EARLY_STOPPING_METRICS,
    "train.objective": ("xe", "scst"),
    "train.scst_baseline": ("greedy", "mean"),
    "train.scst_box_mode": ("raise", "keep"),
    "train.cache": ("auto", "true", "false"),
    "encoder.mixed_precision": precision.CHOICES,
    "train.mixed_precision": precision.CHOICES,
}


# The Evaluator's metrics that `eval.thresholds` may name (larger is better).
CAPTION_METRICS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")


# Computed only for data with object boxes (`data.source=synthetic`).
GROUNDING_METRICS = ("attribute_accuracy", "relation_accuracy", "size_accuracy", "grounding",
                     "grounding_noun")


EVAL_METRICS = CAPTION_METRICS + GROUNDING_METRICS


# Reported by the Evaluator but never thresholds: lower is better (the end-of-caption check).
REPORTED_METRICS = ("dangling_ending_rate", "dangling_endings", "empty_captions")


# The sources whose examples carry object boxes (the grounding metrics need them).
BOXED_SOURCES = ("synthetic", "scenes")
# Sources whose images may carry COCO instance boxes (`data.instances_json`):
# grounding and grounding_noun only.
INSTANCE_SOURCES = ("coco", "karpathy")
INSTANCE_METRICS = ("grounding", "grounding_noun")


# Objects per image that each built-in synthetic source can draw, at most.
MAX_OBJECTS = {"synthetic": 3, "scenes": 8}


CHANGE_BOUNDS = ("absolute", "relative")
