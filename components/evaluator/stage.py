"""Evaluator: captions the test images through the exported SavedModel, scores them, blesses or not.

What is scored is what is served: the Exporter's SavedModel, called through
its `serving_default` signature on the test split's image bytes, exactly as
TF Serving (or `captioner serve`) calls it for a client's request. By
default each image is its own call (`eval.batch_size=1`), so a single-image
request to the pushed version returns the caption recorded here, bit for bit.

Metrics come from the coco-caption toolkit (`Bleu_1`..`Bleu_4`, `METEOR`,
`ROUGE_L`, `CIDEr`, comparable with the paper's Table 1); where the examples
carry object boxes also `grounding` and `grounding_noun`, and on the
synthetic data `attribute_accuracy`, `size_accuracy` and
`relation_accuracy` (COCO instance boxes, `data.instances_json`, name no
colour, size or relation). Every run also reports the
end-of-caption check (`REPORTED_METRICS`), where lower is better and which
the Blessing does not look at.

The baseline is the last pushed model (the runner resolves its ServingModel
as the `baseline` input). It is captioned on the same images in the same
run, with the same decoding (re-exported when its export decoded otherwise)
and scored by the same toolkit pass settings; a paired bootstrap over the
test images gives each metric's difference with a 95% interval, and a
metric blocks the push only when the candidate is worse beyond its
`eval.change_thresholds` entry with that confidence. `eval.thresholds` are
absolute minima on the candidate. A model that failed infra validation is
neither scored nor blessed.
"""
from __future__ import annotations

import contextlib
import heapq
import io
import json
import os
import shutil
import sys
import time

import numpy as np
from tqdm import tqdm

from components.contract import io_utils, schema
from components.contract.config import REPORTED_METRICS
from components.contract.export_model import ExportSources, decoding_settings, export
from components.evaluator.metrics.blessing import blessing_decision, format_rows
from components.evaluator.metrics.bootstrap import METRICS, image_stats, paired_bootstrap
from components.evaluator.metrics.coco import SCORING_STEPS, start_meteor
from components.evaluator.metrics.endings import ending_metrics
from components.evaluator.metrics.grounding import grounding_metrics, merge_grounding
from components.evaluator.metrics.java import find_java
from components.evaluator.report_page import REPORT_FILE, write_report
from components.evaluator.split_readers import iter_example_batches, read_images

# The paired bootstrap's settings, recorded with the comparison.
BOOTSTRAP = {"resamples": 1000, "seed": 0, "confidence": 0.95}


class ServedFunction:
    """A SavedModel folder's `serving_default`, called as the model server calls it.

    Args:
      path: the SavedModel folder.
    """

    def __init__(self, path: str):
        import tensorflow as tf
        self._tf = tf
        self.path = path
        self.module = tf.saved_model.load(path)
        self.function = self.module.signatures["serving_default"]

    def __call__(self, images: list) -> dict:
        """`image_bytes` in, every output as a NumPy array (batch first)."""
        tf = self._tf
        tensor = tf.convert_to_tensor(np.array(images, dtype=object), dtype=tf.string)
        return {k: v.numpy() for k, v in self.function(image_bytes=tensor).items()}


class CaptionedSplit:
    """One model's captions of the test images, and what scoring them needs.

    Attributes:
      rows: per image, in reading order: `image_id`, `caption`, `score`, `references`.
      grounding: image id -> `grounding_metrics` of that image (only images with boxes).
      failed: image id -> why `serving_default` refused it (its caption is empty).
      seconds: time spent in `serving_default`.
    """

    def __init__(self, served: ServedFunction, request_size: int):
        self.served = served
        self.request_size = max(1, int(request_size))
        self.rows: list[dict] = []
        self.grounding: dict[str, dict] = {}
        self.stats = None  # `image_stats`, once scored
        self.failed: dict[str, str] = {}
        self.seconds = 0.0

    def caption(self, batch: dict, figures: "FigureKeeper | None" = None) -> None:
        """Captions one batch of `iter_example_batches`, `request_size` images per call."""
        n = len(batch["ids"])
        for start in range(0, n, self.request_size):
            chunk = range(start, min(n, start + self.request_size))
            for i, out in zip(chunk, self._call([batch["images"][i] for i in chunk],
                                                [batch["ids"][i] for i in chunk]), strict=True):
                image_id = batch["ids"][i]
                caption = out["caption"] if out else ""
                words = caption.split()
                self.rows.append({"image_id": image_id, "caption": caption,
                                  "score": out["score"] if out else float("nan"),
                                  "references": batch["references"][i]})
                attention = out["attention"] if out else np.zeros((1, 1, 1), np.float32)
                if batch["objects"][i]:
                    self.grounding[image_id] = grounding_metrics([words], [attention],
                                                                 [batch["objects"][i]])
                if figures is not None and out:
                    figures.offer(image_id, words, attention, batch["references"][i])

    def _call(self, images: list, ids: list) -> list:
        """Per image: `caption`, `score`, `attention` `(T, H, W)`; None where refused."""
        import tensorflow as tf
        start = time.time()
        try:
            out = self.served(images)
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as e:
            self.seconds += time.time() - start
            if len(images) > 1:  # find the image at fault, serve the others
                return [x for image, i in zip(images, ids, strict=True) for x in self._call([image], [i])]
            self.failed[ids[0]] = e.message.splitlines()[0] if e.message else type(e).__name__
            return [None]
        self.seconds += time.time() - start
        return [{"caption": out["caption"][j].decode("utf-8"), "score": float(out["score"][j]),
                 "attention": out["attention"][j]} for j in range(len(images))]

    def predictions(self) -> dict:
        return {r["image_id"]: r["caption"] for r in self.rows}

    def references(self) -> dict:
        return {r["image_id"]: r["references"] for r in self.rows}


def score(split: CaptionedSplit, progress=None, meteor=None) -> dict:
    """The toolkit's metrics, grounding and the end-of-caption check of one model's captions.

    Keeps each image's share of the corpus scores in `split.stats`, for the
    paired bootstrap.

    Returns:
      The metrics dict, with `notes`.
    """
    split.stats = image_stats(split.predictions(), split.references(),
                              grounding=split.grounding or None, progress=progress,
                              meteor=meteor)
    metrics = dict(split.stats.metrics)
    if split.grounding:
        metrics.update(merge_grounding(list(split.grounding.values())))
    metrics.update(ending_metrics([r["caption"] for r in split.rows]))
    metrics["num_test_images"] = len(split.rows)
    metrics["failed_images"] = len(split.failed)
    metrics["decode_seconds"] = round(split.seconds, 2)
    return {k: (float(v) if isinstance(v, (np.floating, float)) else v)
            for k, v in metrics.items()}


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

    from components.evaluator.figures import attention_figure, write_index
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


def _baseline_saved_model(baseline, decoding: dict, work_dir: str) -> tuple[str, str]:
    """The baseline's SavedModel decoding with `decoding`, and a note when it had to change.

    A baseline exported with other decoding settings is exported again from
    its Model, Encoder and Vocabulary with this run's settings (into the
    stage's work folder, reused by later attempts), so that both models are
    measured with the same decoding.
    """
    props = baseline.properties
    path = baseline.path(props.get("saved_model", schema.SAVED_MODEL_DIR))
    theirs = props.get("decoding")
    if theirs == decoding:
        return path, ""
    key = json.dumps(decoding, sort_keys=True)
    import hashlib
    target = os.path.join(work_dir, f"baseline-{str(props.get('digest', ''))[:12]}-"
                                    f"{hashlib.sha256(key.encode()).hexdigest()[:8]}")
    if not os.path.exists(os.path.join(target, "saved_model.pb")):
        tmp = f"{target}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            export(tmp, ExportSources(props["model_uri"], props["encoder_uri"],
                                      props["vocabulary_uri"], decoding, model_name="baseline"),
                   validate_infra=False)
        except Exception as e:  # noqa: BLE001 - the served baseline is still a baseline
            shutil.rmtree(tmp, ignore_errors=True)
            return path, (f"the baseline decoded with its own export's settings {theirs}: "
                          f"exporting it with {decoding} failed ({type(e).__name__}: {e})")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    return target, (f"the baseline was exported again with this run's decoding {decoding} "
                    f"(its pushed export decodes with {theirs})")


def _scoring_bar(total_steps: int, label: str):
    """A progress callback for `coco_metrics` and the bar it drives."""
    bar = tqdm(total=total_steps, desc=label, unit="step", file=sys.stderr, leave=False)
    begun: list = []

    def step(name):  # a step begins: the one before it is done
        if begun:
            bar.update(1)
        begun.append(name)
        bar.set_postfix_str(name)
    return bar, step


def _score_with_bar(split: CaptionedSplit, label: str, meteor=None) -> dict:
    bar, step = _scoring_bar(len(SCORING_STEPS) - (0 if find_java() else 2), label)
    with bar:
        metrics = score(split, progress=step, meteor=meteor)
        bar.update(bar.total - bar.n)
    return metrics


def _write_captions(path: str, split: CaptionedSplit) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in sorted(split.rows, key=lambda r: r["image_id"]):
            f.write(json.dumps({k: r[k] for k in ("image_id", "caption", "score",
                                                  "references")}) + "\n")


def _public(metrics: dict) -> dict:
    """The metrics as recorded (the notes are recorded apart)."""
    return {k: v for k, v in metrics.items() if k != "notes"}


def run(ctx) -> dict:
    """Scores the exported SavedModel (and the baseline) on the test images.

    Returns:
      The `Evaluation` and `Blessing` outputs' counts and properties.
    """
    cfg = ctx.config.eval
    serving = ctx.inputs["serving_model"]
    saved, digest = _checked_saved_model(serving)
    decoding = dict(serving.properties.get("decoding") or decoding_settings(cfg))
    infra = dict(serving.properties.get("infra_validation") or {})
    common = {"export_digest": digest, "serving_model_uri": serving.uri,
              "model_uri": serving.properties.get("model_uri"), "decoding": decoding}
    if not infra.get("ok", False):
        return _not_servable(ctx, infra, common)

    baseline = ctx.inputs.get("baseline")  # the last pushed model's ServingModel, if any
    notes: list[str] = []
    candidate = CaptionedSplit(ServedFunction(saved), cfg.batch_size)
    reference = None
    if baseline is not None:
        path, note = _baseline_saved_model(baseline, decoding, ctx.work_dir)
        notes += [note] if note else []
        reference = CaptionedSplit(ServedFunction(path), cfg.batch_size)
    figures = FigureKeeper(cfg.num_figures)
    # METEOR's jar loads its tables while the test images are captioned, once for both.
    with start_meteor() or contextlib.nullcontext() as meteor:
        notes += _caption_test_split(ctx, candidate, reference, figures)
        ctx.log(f"captioned {len(candidate.rows)} test images through serving_default in "
                f"{candidate.seconds:.1f}s (beam {decoding['beam_size']}, "
                f"{candidate.request_size} image(s) per call)"
                + (f"; the baseline in {reference.seconds:.1f}s" if reference else ""))
        metrics = _score_with_bar(candidate, "Evaluator scoring", meteor)
        notes = metrics.pop("notes", []) + notes
        baseline_metrics = _score_with_bar(reference, "Evaluator scoring baseline", meteor) \
            if reference is not None else None

    compared = (paired_bootstrap(candidate.stats, reference.stats, **BOOTSTRAP)
                if reference is not None else None)
    blessed, reasons, comparison = blessing_decision(compared, cfg.change_thresholds,
                                                     cfg.thresholds, metrics)
    drawn = _write_evaluation(ctx, candidate, reference, figures, {
        "metrics": _public(metrics), "notes": notes,
        "baseline_metrics": _public(baseline_metrics) if baseline_metrics else None,
        "comparison": comparison})
    baseline_info = None if baseline is None else {
        "serving_model_uri": baseline.uri, "digest": baseline.properties.get("digest"),
        "model_uri": baseline.properties.get("model_uri"),
        "metrics": _public(baseline_metrics)}
    blessing = {"blessed": blessed, "reasons": reasons, "thresholds": dict(cfg.thresholds),
                "change_thresholds": {k: dict(v) for k, v in cfg.change_thresholds.items()},
                "comparison": comparison, "bootstrap": BOOTSTRAP if reference else None,
                "baseline": baseline_info, **common}
    _write_blessing(ctx.outputs["blessing"], blessing)
    write_report(ctx.outputs["evaluation"], blessing)  # report.html: the Evaluation as one page
    _log_results(ctx.log, metrics, comparison if reference is not None else None, blessing)
    return {
        "evaluation": {"counts": {"test_images": len(candidate.rows), "figures": len(drawn)},
                       "properties": {"metrics": _public(metrics), "notes": notes,
                                      "baseline": baseline_info, "comparison": comparison,
                                      "figures_index": "figures/index.html",
                                      "report": REPORT_FILE, **common}},
        "blessing": {"properties": blessing},
    }


def _checked_saved_model(serving) -> tuple[str, str]:
    """The ServingModel's SavedModel folder and digest, checked against the Exporter's record."""
    saved = serving.path(serving.properties.get("saved_model", schema.SAVED_MODEL_DIR))
    digest = io_utils.tree_digest(saved)
    if digest != serving.properties.get("digest"):
        raise RuntimeError(f"{saved} is not the SavedModel the Exporter wrote (digest {digest[:12]}"
                           f", recorded {str(serving.properties.get('digest'))[:12]}): re-run "
                           "the Exporter (`captioner run --no-cache --stages Exporter,Evaluator,"
                           "Pusher`)")
    return saved, digest


def _caption_test_split(ctx, candidate: CaptionedSplit, reference: CaptionedSplit | None,
                        figures: FigureKeeper) -> list[str]:
    """Captions the test split with both models; returns notes on refused images."""
    cfg, examples = ctx.config.eval, ctx.inputs["examples"]
    total = examples.counts.get("test")
    total = min(total, cfg.max_examples) if total and cfg.max_examples else (total or None)
    with tqdm(total=total, desc="Evaluator", unit="image", file=sys.stderr,
              mininterval=1.0) as bar:
        for batch in iter_example_batches(examples.uri, "test", 64, cfg.max_examples):
            candidate.caption(batch, figures)
            if reference is not None:
                reference.caption(batch)
            bar.update(len(batch["ids"]))
    if not candidate.rows:
        raise RuntimeError("the test split is empty: nothing to evaluate "
                           "(check data.test_fraction and the ExampleGen counts)")
    notes = []
    for label, split in (("candidate", candidate), ("baseline", reference)):
        if split is not None and split.failed:
            first = next(iter(split.failed.items()))
            notes.append(f"{len(split.failed)} test images refused by the {label}'s "
                         f"serving_default (captioned as empty), e.g. {first[0]}: {first[1]}")
    return notes


def _write_evaluation(ctx, candidate: CaptionedSplit, reference: CaptionedSplit | None,
                      figures: FigureKeeper, recorded: dict) -> list[dict]:
    """`metrics.json`, the captions and the figures; returns the figures drawn."""
    eval_dir = ctx.outputs["evaluation"]
    with open(os.path.join(eval_dir, "metrics.json"), "w") as f:
        json.dump(recorded, f, indent=2)
    _write_captions(os.path.join(eval_dir, "captions.jsonl"), candidate)
    if reference is not None:
        _write_captions(os.path.join(eval_dir, "baseline_captions.jsonl"), reference)
    if not figures.count:
        return []
    return write_figures(eval_dir, examples_uri=ctx.inputs["examples"].uri,
                         kept=figures.entries())


def _log_results(log, metrics: dict, comparison: list | None, blessing: dict) -> None:
    """The metrics, the comparison with the baseline (if any) and the verdict, one line each."""
    shown = {k: round(metrics[k], 4) if isinstance(metrics[k], float) else metrics[k]
             for k in METRICS + REPORTED_METRICS
             if isinstance(metrics.get(k), (int, float))}
    log(json.dumps(shown))
    for line in format_rows(comparison) if comparison is not None else ():
        log(f"  {line}")
    log("BLESSED" if blessing["blessed"] else "NOT_BLESSED: " + "; ".join(blessing["reasons"]))


def _write_blessing(blessing_dir: str, blessing: dict) -> None:
    name = "BLESSED" if blessing["blessed"] else "NOT_BLESSED"
    with open(os.path.join(blessing_dir, name), "w") as f:
        f.write("all checks passed\n" if blessing["blessed"]
                else "\n".join(blessing["reasons"]) + "\n")
    with open(os.path.join(blessing_dir, "blessing.json"), "w") as f:
        json.dump(blessing, f, indent=2)


def _not_servable(ctx, infra: dict, common: dict) -> dict:
    """A model TF Serving could not load or run: not scored, not blessed."""
    reason = (f"infra validation: TF Serving could not serve this model: "
              f"{infra.get('reason') or 'no validation report'}")
    blessing = {"blessed": False, "reasons": [reason], "comparison": [], "baseline": None,
                **common}
    with open(os.path.join(ctx.outputs["evaluation"], "metrics.json"), "w") as f:
        json.dump({"metrics": {}, "notes": [reason]}, f, indent=2)
    _write_blessing(ctx.outputs["blessing"], blessing)
    write_report(ctx.outputs["evaluation"], blessing)
    ctx.log(f"NOT_BLESSED: {reason}")
    return {"evaluation": {"counts": {"test_images": 0, "figures": 0},
                           "properties": {"metrics": {}, "notes": [reason], "comparison": [],
                                          **common}},
            "blessing": {"properties": blessing}}
