"""Evaluator: captions the test split, scores it, draws attention figures, blesses or not.

Metrics come from the coco-caption toolkit (`Bleu_1`..`Bleu_4`, `METEOR`,
`ROUGE_L`, `CIDEr`, comparable with the paper's Table 1); where the examples
carry object boxes (the synthetic data) also `grounding`, `grounding_noun`,
`attribute_accuracy` and `relation_accuracy`. The Blessing passes when every
threshold in `eval.thresholds` is met and no metric falls more than
`eval.max_regression` below the last pushed model's.
"""
from __future__ import annotations

import io
import json
import math
import os
import sys
import time

import numpy as np
from tqdm import tqdm

from components import io_utils
from components.metrics.coco import coco_metrics
from components.metrics.grounding import grounding_metrics

# Metrics where larger is better and that the blessing compares.
BLESSING_METRICS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr",
                    "attribute_accuracy", "relation_accuracy", "grounding", "grounding_noun")


def read_annotations(uri: str, split: str, max_examples: int = 0) -> dict:
    """Every record of one Annotations split as numpy arrays and lists."""
    import tensorflow as tf
    ids, grids, refs, objects, grid_shape = [], [], [], [], None
    for record in io_utils.read_records(io_utils.split_files(uri, split)):
        f = tf.train.Example.FromString(record).features.feature
        shape = list(f["grid_shape"].int64_list.value)
        grid_shape = grid_shape or shape
        ids.append(f["image/id"].bytes_list.value[0].decode())
        grids.append(io_utils.decode_float16_grid(f["annotations"].bytes_list.value[0], shape))
        refs.append([t.decode() for t in f["captions/text"].bytes_list.value])
        objects.append(io_utils.parse_objects(f))
        if max_examples and len(ids) >= max_examples:
            break
    order = np.argsort(ids, kind="stable")  # shards interleave: make the order stable
    return {"ids": [ids[i] for i in order],
            "annotations": np.stack([grids[i] for i in order]) if grids else None,
            "references": [refs[i] for i in order], "objects": [objects[i] for i in order],
            "grid_shape": grid_shape}


def read_images(examples_uri: str, split: str, wanted: set) -> dict:
    """Encoded image bytes for the wanted ids of one Examples split."""
    import tensorflow as tf
    found = {}
    for record in io_utils.read_records(io_utils.split_files(examples_uri, split)):
        f = tf.train.Example.FromString(record).features.feature
        image_id = f["image/id"].bytes_list.value[0].decode()
        if image_id in wanted:
            found[image_id] = f["image/encoded"].bytes_list.value[0]
            if len(found) == len(wanted):
                break
    return found


def decode_all(decoder, annotations: np.ndarray, beam_size: int, max_length: int,
               length_normalization: float, batch_size: int) -> dict:
    """Beam search (greedy for beam 1) over all annotations, in large batches."""
    import tensorflow as tf
    from models.decoding import beam_search, greedy_decode
    spec = tf.TensorSpec([None, *annotations.shape[1:]], tf.float32)

    @tf.function(input_signature=[spec], autograph=False)
    def decode(batch):
        if beam_size <= 1:
            return greedy_decode(decoder, batch, max_length)
        return beam_search(decoder, batch, beam_size, max_length,
                           length_normalization=length_normalization)

    parts = {"tokens": [], "lengths": [], "scores": [], "attention": []}
    for start in tqdm(range(0, len(annotations), batch_size), desc="Evaluator decode",
                      unit="batch", file=sys.stderr, mininterval=1.0):
        out = decode(tf.constant(annotations[start:start + batch_size], tf.float32))
        for key in parts:
            value = out[key].numpy()
            if key in ("tokens", "attention") and value.shape[1] < max_length:
                pad = [(0, 0), (0, max_length - value.shape[1])] + [(0, 0)] * (value.ndim - 2)
                value = np.pad(value, pad)
            parts[key].append(value)
    return {k: np.concatenate(v) for k, v in parts.items()}


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


def _decoded_words(tokens, length, vocab) -> list[str]:
    from models.text import END_ID, PAD_ID, START_ID
    words = []
    for t in tokens[:length]:
        t = int(t)
        if t == END_ID:
            break
        if t in (PAD_ID, START_ID):
            continue
        words.append(vocab[t] if t < len(vocab) else "<unk>")
    return words


def write_figures(out_dir: str, examples_uri: str, data: dict, words: list, attention,
                  count: int) -> list[dict]:
    """Attention figures (paper Figure 2/3 style) and `figures/index.html` for a few images."""
    from PIL import Image
    from components.figures import attention_figure, write_index
    fig_dir = os.path.join(out_dir, "figures")
    os.makedirs(fig_dir, exist_ok=True)
    chosen = list(range(min(count, len(data["ids"]))))
    images = read_images(examples_uri, "test", {data["ids"][i] for i in chosen})
    entries = []
    h, w = data["grid_shape"][:2]
    for i in chosen:
        image_id = data["ids"][i]
        if image_id not in images:
            continue
        image = np.asarray(Image.open(io.BytesIO(images[image_id])).convert("RGB"))
        n = len(words[i])
        maps = attention[i, :max(n, 1)].reshape(-1, h, w)
        png = f"{image_id}.png"
        attention_figure(image, words[i], maps[:n], os.path.join(fig_dir, png),
                         title=" ".join(words[i]))
        entries.append({"image_id": image_id, "png": png, "caption": " ".join(words[i]),
                        "references": data["references"][i]})
    write_index(fig_dir, entries)
    return entries


def run(ctx) -> dict:
    """Evaluates the Model on the test split; writes `Evaluation` and `Blessing`."""
    import keras
    import models.show_attend_tell  # noqa: F401  (registers the custom classes)
    from serving.export import load_vocabulary
    cfg = ctx.config.eval
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    model_art, ann_art = ctx.inputs["model"], ctx.inputs["annotations"]
    vocab = load_vocabulary(ctx.inputs["vocabulary"].path("vocab.txt"))
    model_file = model_art.path("best.keras")
    if not os.path.exists(model_file):
        model_file = model_art.path("model.keras")
    decoder = keras.saving.load_model(model_file)
    data = read_annotations(ann_art.uri, "test", cfg.max_examples)
    if data["annotations"] is None:
        raise RuntimeError("the test split is empty: nothing to evaluate "
                           "(check data.test_fraction and the Preprocess counts)")
    start = time.time()
    out = decode_all(decoder, data["annotations"], cfg.beam_size, cfg.max_length,
                     cfg.length_normalization, cfg.batch_size)
    decode_seconds = time.time() - start
    words = [_decoded_words(out["tokens"][i], out["lengths"][i], vocab)
             for i in range(len(data["ids"]))]
    predictions = {image_id: " ".join(ws) for image_id, ws in zip(data["ids"], words)}
    references = dict(zip(data["ids"], data["references"]))
    log(f"[Evaluator] decoded {len(words)} test images in {decode_seconds:.1f}s "
        f"(beam {cfg.beam_size}); scoring with the coco-caption toolkit")
    metrics = coco_metrics(predictions, references)
    notes = metrics.pop("notes", [])
    has_boxes = any(data["objects"])
    if has_boxes:
        h, w = data["grid_shape"][:2]
        attn = [out["attention"][i].reshape(-1, h, w) for i in range(len(words))]
        grounding = grounding_metrics(words, attn, data["objects"])
        metrics.update(grounding)
    metrics = {k: (float(v) if isinstance(v, (np.floating, float)) else v)
               for k, v in metrics.items()}
    metrics["num_test_images"] = len(words)
    metrics["decode_seconds"] = round(decode_seconds, 2)

    eval_dir = ctx.outputs["evaluation"]
    with open(os.path.join(eval_dir, "metrics.json"), "w") as f:
        json.dump({"metrics": metrics, "notes": notes}, f, indent=2)
    with open(os.path.join(eval_dir, "captions.jsonl"), "w", encoding="utf-8") as f:
        for i, image_id in enumerate(data["ids"]):
            f.write(json.dumps({"image_id": image_id, "caption": predictions[image_id],
                                "score": float(out["scores"][i]),
                                "references": data["references"][i]}) + "\n")
    figures = []
    if cfg.num_figures > 0 and "examples" in ctx.inputs:
        figures = write_figures(eval_dir, ctx.inputs["examples"].uri, data, words,
                                out["attention"], cfg.num_figures)

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
    shown = {k: round(metrics[k], 4) for k in BLESSING_METRICS
             if isinstance(metrics.get(k), float)}
    log(f"[Evaluator] {json.dumps(shown)}")
    log(f"[Evaluator] {name}" + ("" if blessed else ": " + "; ".join(reasons)))
    return {
        "evaluation": {"counts": {"test_images": len(words), "figures": len(figures)},
                       "properties": {"metrics": metrics, "notes": notes,
                                      "figures_index": "figures/index.html",
                                      "model_uri": model_art.uri}},
        "blessing": {"properties": blessing},
    }
