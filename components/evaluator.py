"""Evaluator: captions the test split, scores it, draws attention figures, blesses or not.

Metrics come from the coco-caption toolkit (`Bleu_1`..`Bleu_4`, `METEOR`,
`ROUGE_L`, `CIDEr`, comparable with the paper's Table 1); where the examples
carry object boxes (the synthetic data) also `grounding`, `grounding_noun`,
`attribute_accuracy` and `relation_accuracy`. Every run also reports the
end-of-caption check (`REPORTED_METRICS`: how many captions stop on a function
word, as in "a man riding a horse with a"; `components/metrics/endings.py`),
where lower is better and which the Blessing does not look at. The Blessing
passes when every threshold in `eval.thresholds` is met and no metric falls
more than `eval.max_regression` below the last pushed model's (the runner
resolves that model's Evaluation as the `baseline` input).

The test split streams: it is decoded and scored `eval.batch_size` images at
a time, and only the captions (with scores and references), the grounding
counts and the attention maps of the few images drawn outlive a batch. The
Evaluation records the decoding it measured (`decoding`), which the Pusher
exports.
"""
from __future__ import annotations

import heapq
import io
import json
import math
import os
import shutil
import sys
import time
from typing import Iterator

import numpy as np
from tqdm import tqdm

from components import io_utils, schema
from components.metrics.coco import SCORING_STEPS, coco_metrics
from components.metrics.endings import ending_metrics
from components.metrics.grounding import grounding_metrics, merge_grounding
from models.text import decode_words

# Metrics where larger is better and that the blessing compares.
BLESSING_METRICS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr",
                    "attribute_accuracy", "relation_accuracy", "grounding", "grounding_noun")
# Diagnostics reported next to them, where lower is better: never thresholds, never
# compared with the pushed model's.
REPORTED_METRICS = ("dangling_ending_rate", "dangling_endings", "empty_captions")


def iter_annotation_batches(uri: str, split: str, batch_size: int,
                            max_examples: int = 0) -> Iterator[dict]:
    """The records of one Annotations split, a batch at a time, in file order.

    Only one batch of grids is in memory at a time (as float32 for the decoder).

    Args:
      uri: the Annotations artifact folder.
      split: `train`, `val` or `test`.
      batch_size: records per batch (the last batch may be smaller).
      max_examples: stop after this many records (0 = all).
    Yields:
      Dicts with `ids`, `annotations` (float32 `(batch, L, D)`), `references`
      (per image, the reference texts), `objects` and `grid_shape` (`[H, W, D]`).
    """
    batch = {"ids": [], "annotations": [], "references": [], "objects": []}
    grid_shape, seen = None, 0

    def flush():
        out = {**batch, "annotations": np.stack(batch["annotations"]).astype(np.float32),
               "grid_shape": grid_shape}
        for key in batch:
            batch[key] = []
        return out

    for serialized in io_utils.read_records(schema.split_files(uri, split)):
        record = schema.decode_annotations(serialized)
        grid_shape = grid_shape or record.grid_shape
        batch["ids"].append(record.image_id)
        batch["annotations"].append(record.grid)
        batch["references"].append(record.texts)
        batch["objects"].append(record.objects)
        seen += 1
        if len(batch["ids"]) >= batch_size:
            yield flush()
        if max_examples and seen >= max_examples:
            break
    if batch["ids"]:
        yield flush()


def read_annotations(uri: str, split: str, max_examples: int = 0) -> dict:
    """Every record of one Annotations split, stacked and ordered by image id (for analyses).

    The Evaluator streams with `iter_annotation_batches` instead; this holds
    the whole split in memory.
    """
    parts = list(iter_annotation_batches(uri, split, 1024, max_examples))
    ids = [i for p in parts for i in p["ids"]]
    order = np.argsort(ids, kind="stable")  # shards interleave: make the order stable
    pick = lambda key: [x for p in parts for x in p[key]]  # noqa: E731
    grids = np.concatenate([p["annotations"] for p in parts]) if parts else None
    return {"ids": [ids[i] for i in order],
            "annotations": grids[order] if parts else None,
            "references": [pick("references")[i] for i in order],
            "objects": [pick("objects")[i] for i in order],
            "grid_shape": parts[0]["grid_shape"] if parts else None}


def read_images(examples_uri: str, split: str, wanted: set) -> dict:
    """Encoded image bytes for the wanted ids of one Examples split."""
    import tensorflow as tf
    found = {}
    for record in io_utils.read_records(schema.split_files(examples_uri, split)):
        image_id, image = schema.example_image(tf.train.Example.FromString(record).features.feature)
        if image_id in wanted:
            found[image_id] = image
            if len(found) == len(wanted):
                break
    return found


def decoding_settings(eval_config) -> dict:
    """The decoding the Evaluator measures, recorded in the Evaluation for the Pusher to export."""
    return {"beam_size": int(eval_config.beam_size), "max_length": int(eval_config.max_length),
            "length_normalization": float(eval_config.length_normalization)}


def make_decode(decoder, grid_size: int, depth: int, beam_size: int, max_length: int,
                length_normalization: float):
    """A traced-once function: `(batch, L, D)` float32 -> beam search (greedy for beam 1) outputs."""
    import tensorflow as tf
    from models.decoding import beam_search, greedy_decode
    spec = tf.TensorSpec([None, grid_size, depth], tf.float32)

    @tf.function(input_signature=[spec], autograph=False)
    def decode(batch):
        if beam_size <= 1:
            return greedy_decode(decoder, batch, max_length)
        return beam_search(decoder, batch, beam_size, max_length,
                           length_normalization=length_normalization)
    return decode


def bless(metrics: dict, thresholds: dict, max_regression: float,
          baseline_metrics: dict | None) -> tuple[bool, list[str]]:
    """Checks absolute thresholds and regression against the last pushed model.

    Returns:
      (blessed, reasons): reasons list every failed check (empty when blessed).
    """
    reasons = []
    for key, minimum in sorted(thresholds.items()):
        value = metrics.get(key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            reasons.append(f"{key} is not available (threshold {minimum})")
        elif value < minimum:
            reasons.append(f"{key} = {value:.4f} is below the threshold {minimum}")
    for key in BLESSING_METRICS:
        if not baseline_metrics or baseline_metrics.get(key) is None:
            continue
        value, base = metrics.get(key), baseline_metrics[key]
        if value is not None and value < base - max_regression:
            reasons.append(f"{key} = {value:.4f} regressed more than {max_regression} "
                           f"below the pushed model's {base:.4f}")
    return not reasons, reasons


class FigureKeeper:
    """Keeps the attention maps of the `count` smallest image ids seen (the figures drawn).

    Args:
      count: how many images get a figure.
    """

    def __init__(self, count: int):
        self.count = max(0, int(count))
        self._heap: list = []  # (negated id order, entry): the largest kept id on top

    def offer(self, image_id: str, words: list, attention: np.ndarray, references: list) -> None:
        """Considers one image; `attention` is `(T, H, W)`, trimmed here to its words."""
        if not self.count:
            return
        entry = {"image_id": image_id, "words": words, "references": references,
                 "attention": np.array(attention[:max(len(words), 1)])}
        key = _Descending(image_id)
        if len(self._heap) < self.count:
            heapq.heappush(self._heap, (key, entry))
        elif image_id < self._heap[0][0].value:
            heapq.heapreplace(self._heap, (key, entry))

    def entries(self) -> list[dict]:
        """The kept images, by image id."""
        return sorted((e for _, e in self._heap), key=lambda e: e["image_id"])


class _Descending:
    """Orders strings in reverse, so that `heapq` (a min-heap) keeps the smallest ids."""
    __slots__ = ("value",)

    def __init__(self, value: str):
        self.value = value

    def __lt__(self, other: "_Descending") -> bool:
        return self.value > other.value


def write_figures(out_dir: str, examples_uri: str, kept: list[dict]) -> list[dict]:
    """Attention figures (paper Figure 2/3 style) and `figures/index.html` for a few images.

    Args:
      out_dir: the Evaluation folder.
      examples_uri: the Examples artifact (the test images).
      kept: `FigureKeeper.entries()`.
    Returns:
      The index entries written.
    """
    from PIL import Image
    from components.figures import attention_figure, write_index
    fig_dir = os.path.join(out_dir, "figures")
    os.makedirs(fig_dir, exist_ok=True)
    images = read_images(examples_uri, "test", {e["image_id"] for e in kept})
    entries = []
    for e in kept:
        image_id, words = e["image_id"], e["words"]
        if image_id not in images:
            continue
        image = np.asarray(Image.open(io.BytesIO(images[image_id])).convert("RGB"))
        png = f"{image_id}.png"
        attention_figure(image, words, e["attention"][:len(words)], os.path.join(fig_dir, png),
                         title=" ".join(words))
        entries.append({"image_id": image_id, "png": png, "caption": " ".join(words),
                        "references": e["references"]})
    write_index(fig_dir, entries)
    return entries


def caption_test_split(decoder, ann_uri: str, vocab: list[str], cfg,
                       figures: FigureKeeper) -> tuple[list[dict], dict | None, float]:
    """Decodes and scores the test split one batch at a time.

    Only the captions (with score and references), the grounding counts and
    the few figures' attention maps outlive a batch.

    Args:
      decoder: the trained `ShowAttendTell`.
      ann_uri: the Annotations artifact.
      vocab: id -> word.
      cfg: the `eval` config section.
      figures: collects the figures' attention maps.
    Returns:
      (rows by image id: `image_id`, `caption`, `score`, `references`;
      the merged grounding metrics, or None when no image has boxes;
      seconds spent decoding).
    """
    rows, grounding_parts, has_boxes, decode, seconds = [], [], False, None, 0.0
    batches = iter_annotation_batches(ann_uri, "test", cfg.batch_size, cfg.max_examples)
    for batch in tqdm(batches, desc="Evaluator", unit="batch", file=sys.stderr,
                      mininterval=1.0):
        h, w, _ = batch["grid_shape"][:3]
        if decode is None:
            decode = make_decode(decoder, *batch["annotations"].shape[1:], **decoding_settings(cfg))
        start = time.time()
        out = {k: v.numpy() for k, v in decode(batch["annotations"]).items()}
        seconds += time.time() - start
        words = [decode_words(out["tokens"][i][:out["lengths"][i]], vocab)
                 for i in range(len(batch["ids"]))]
        attention = out["attention"].reshape(len(words), -1, h, w)  # (batch, T, H, W)
        for i, image_id in enumerate(batch["ids"]):
            rows.append({"image_id": image_id, "caption": " ".join(words[i]),
                         "score": float(out["scores"][i]), "references": batch["references"][i]})
            figures.offer(image_id, words[i], attention[i], batch["references"][i])
        has_boxes = has_boxes or any(batch["objects"])
        grounding_parts.append(grounding_metrics(words, list(attention), batch["objects"]))
    rows.sort(key=lambda r: r["image_id"])
    return rows, (merge_grounding(grounding_parts) if has_boxes else None), seconds


def run(ctx) -> dict:
    """Evaluates the Model on the test split; writes `Evaluation` and `Blessing`."""
    import keras
    import models.show_attend_tell  # noqa: F401  (registers the custom classes)
    cfg = ctx.config.eval
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    model_art, ann_art = ctx.inputs["model"], ctx.inputs["annotations"]
    vocab = schema.read_vocabulary(ctx.inputs["vocabulary"].uri)
    decoder = keras.saving.load_model(schema.model_file(model_art.uri))
    figures = FigureKeeper(cfg.num_figures if "examples" in ctx.inputs else 0)
    rows, grounding, decode_seconds = caption_test_split(decoder, ann_art.uri, vocab, cfg,
                                                         figures)
    if not rows:
        raise RuntimeError("the test split is empty: nothing to evaluate "
                           "(check data.test_fraction and the Preprocess counts)")
    predictions = {r["image_id"]: r["caption"] for r in rows}
    references = {r["image_id"]: r["references"] for r in rows}
    log(f"[Evaluator] decoded {len(rows)} test images in {decode_seconds:.1f}s "
        f"(beam {cfg.beam_size}); scoring with the coco-caption toolkit")
    with tqdm(total=len(SCORING_STEPS) - (0 if shutil.which("java") else 2),
              desc="Evaluator scoring", unit="step", file=sys.stderr, leave=False) as bar:
        begun = []

        def step(name):  # a step begins: the one before it is done
            if begun:
                bar.update(1)
            begun.append(name)
            bar.set_postfix_str(name)
        metrics = coco_metrics(predictions, references, progress=step)
        bar.update(bar.total - bar.n)
    notes = metrics.pop("notes", [])
    if grounding is not None:
        metrics.update(grounding)
    metrics.update(ending_metrics(list(predictions.values())))
    metrics = {k: (float(v) if isinstance(v, (np.floating, float)) else v)
               for k, v in metrics.items()}
    metrics["num_test_images"] = len(rows)
    metrics["decode_seconds"] = round(decode_seconds, 2)

    eval_dir = ctx.outputs["evaluation"]
    with open(os.path.join(eval_dir, "metrics.json"), "w") as f:
        json.dump({"metrics": metrics, "notes": notes}, f, indent=2)
    with open(os.path.join(eval_dir, "captions.jsonl"), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({k: r[k] for k in ("image_id", "caption", "score",
                                                  "references")}) + "\n")
    drawn = []
    if figures.count:
        drawn = write_figures(eval_dir, ctx.inputs["examples"].uri, figures.entries())

    baseline = ctx.inputs.get("baseline")  # the last pushed model's Evaluation, if any
    baseline_metrics = dict(baseline.properties.get("metrics", {})) if baseline else None
    blessed, reasons = bless(metrics, dict(cfg.thresholds), cfg.max_regression,
                             baseline_metrics)
    blessing_dir = ctx.outputs["blessing"]
    name = "BLESSED" if blessed else "NOT_BLESSED"
    with open(os.path.join(blessing_dir, name), "w") as f:
        f.write("all checks passed\n" if blessed else "\n".join(reasons) + "\n")
    blessing = {"blessed": blessed, "reasons": reasons, "thresholds": dict(cfg.thresholds),
                "max_regression": cfg.max_regression,
                "baseline_model": baseline.properties.get("model_uri") if baseline else None,
                "baseline_metrics": baseline_metrics, "model_uri": model_art.uri}
    with open(os.path.join(blessing_dir, "blessing.json"), "w") as f:
        json.dump(blessing, f, indent=2)
    shown = {k: round(metrics[k], 4) if isinstance(metrics[k], float) else metrics[k]
             for k in BLESSING_METRICS + REPORTED_METRICS
             if isinstance(metrics.get(k), (int, float))}
    log(f"[Evaluator] {json.dumps(shown)}")
    log(f"[Evaluator] {name}" + ("" if blessed else ": " + "; ".join(reasons)))
    return {
        "evaluation": {"counts": {"test_images": len(rows), "figures": len(drawn)},
                       "properties": {"metrics": metrics, "notes": notes,
                                      "decoding": decoding_settings(cfg),
                                      "figures_index": "figures/index.html",
                                      "model_uri": model_art.uri}},
        "blessing": {"properties": blessing},
    }
