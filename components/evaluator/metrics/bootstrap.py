"""Paired bootstrap of the blessing metrics: candidate against baseline on the same images.

Both models caption the same test images; `image_stats` scores each model
once with the coco-caption toolkit and keeps, per image, what the corpus
metrics are computed from. `paired_bootstrap` then resamples the images
(the same draw for both models, so that what the images share cancels out)
and recomputes every metric on each resample from those per-image numbers,
without running the toolkit again:

- BLEU-1..4: the toolkit's corpus BLEU (pycocoevalcap's ``bleu_scorer``,
  "closest" reference length) from summed per-image statistics: clipped
  n-gram matches and n-gram counts for n = 1..4, hypothesis length and
  closest reference length (`bleu_stats`, `corpus_bleu`).
- METEOR: the METEOR 1.5 jar's corpus score from summed per-image statistics
  lines (`corpus_meteor`), as the jar computes it for the whole set.
- ROUGE-L and CIDEr-D: means of the per-image scores; CIDEr-D's document
  frequencies stay those of the full reference set on every resample.
- attribute_accuracy, relation_accuracy, size_accuracy, grounding,
  grounding_noun: ratios of
  summed per-image counts (`components.evaluator.metrics.grounding.grounding_counts`).

On the full set these give the toolkit's values, to rounding (the tests
check BLEU and METEOR against it).

Speed: 1,000 resamples of 5,000 images take about 0.1 s (one weights matrix
per block of resamples, multiplied by the per-image columns).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np

from components.contract.config import EVAL_METRICS
from components.evaluator.metrics.grounding import COUNT_KEYS

# What `paired_bootstrap` compares, in order (the Blessing's metrics).
METRICS = EVAL_METRICS
# Columns of a `bleu_stats` row.
BLEU_COLUMNS = ("correct_1", "correct_2", "correct_3", "correct_4",
                "guess_1", "guess_2", "guess_3", "guess_4", "testlen", "reflen")
# METEOR 1.5's parameters for `-l en` (alpha, beta, gamma, delta; weights of the
# exact, stem, synonym and paraphrase stages): the jar's defaults for English.
METEOR_ALPHA, METEOR_BETA, METEOR_GAMMA, METEOR_DELTA = 0.85, 0.20, 0.60, 0.75
METEOR_WEIGHTS = (1.0, 0.6, 0.8, 0.6)
# The rate metrics: (numerator count, denominator count).
_RATES = {"grounding": ("num_grounded", "num_matched_phrases"),
          "grounding_noun": ("num_grounded_noun", "num_matched_phrases"),
          "attribute_accuracy": ("num_attribute_correct", "num_attribute_images"),
          "relation_accuracy": ("num_relation_correct", "num_relation_images"),
          "size_accuracy": ("num_size_correct", "num_sized_phrases")}
# Bounds the weights matrix of one block of resamples (float64 entries).
_BLOCK_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class ImageStats:
    """One model's per-image statistics on a test split (rows in `ids` order).

    Attributes:
      ids: the image ids.
      bleu: float64 ``(N, 10)``, columns `BLEU_COLUMNS`.
      rouge: float64 ``(N,)``, per-image ROUGE-L.
      cider: float64 ``(N,)``, per-image CIDEr-D.
      meteor: float64 ``(N, 7 + 4 x stages)``, the jar's statistics, or None
        when METEOR was not computed (no Java).
      grounding: int64 ``(N, len(COUNT_KEYS))``, or None without object boxes.
      boxed: bool ``(N,)``: which images have boxes (their counts are the
        grounding metrics'; the others' rows are 0). None = every image.
      metrics: the toolkit's full-set result (`coco_metrics` without its
        per-image parts): what the Evaluation records.
    """
    ids: tuple
    bleu: np.ndarray
    rouge: np.ndarray
    cider: np.ndarray
    meteor: np.ndarray | None = None
    grounding: np.ndarray | None = None
    boxed: np.ndarray | None = None
    metrics: Mapping | None = None


def bleu_stats(caption: str, references: Sequence[str], n: int = 4) -> np.ndarray:
    """One image's BLEU statistics, as pycocoevalcap's ``cook_test`` counts them.

    Args:
      caption: the tokenized caption (tokens separated by spaces).
      references: the tokenized references.
      n: the longest n-gram.
    Returns:
      float64 ``(2n + 2,)``: clipped matches for 1..n, n-gram counts for
      1..n, caption length, closest reference length (ties: the shorter).
    """
    words = caption.split()
    counts = _ngrams(words, n)
    most: dict[tuple, int] = {}
    lengths = []
    for ref in references:
        ref_words = ref.split()
        lengths.append(len(ref_words))
        for gram, count in _ngrams(ref_words, n).items():
            most[gram] = max(most.get(gram, 0), count)
    correct = [0] * n
    for gram, count in counts.items():
        correct[len(gram) - 1] += min(most.get(gram, 0), count)
    guess = [max(0, len(words) - k + 1) for k in range(1, n + 1)]
    closest = min((abs(length - len(words)), length) for length in lengths)[1]
    return np.array(correct + guess + [len(words), closest], np.float64)


def _ngrams(words: Sequence[str], n: int) -> dict[tuple, int]:
    counts: dict[tuple, int] = {}
    for k in range(1, n + 1):
        for i in range(len(words) - k + 1):
            gram = tuple(words[i:i + k])
            counts[gram] = counts.get(gram, 0) + 1
    return counts


def corpus_bleu(stats: np.ndarray) -> np.ndarray:
    """Corpus BLEU-1..n from summed `bleu_stats`, exactly as the toolkit computes it.

    Args:
      stats: ``(..., 2n + 2)`` sums of `bleu_stats` rows.
    Returns:
      ``(..., n)``: BLEU-1..BLEU-n.
    """
    stats = np.asarray(stats, np.float64)
    n = (stats.shape[-1] - 2) // 2
    tiny, small = 1e-15, 1e-9  # the toolkit's smoothing constants
    bleu, out = 1.0, []
    for k in range(n):
        bleu = bleu * ((stats[..., k] + tiny) / (stats[..., n + k] + small))
        out.append(bleu ** (1.0 / (k + 1)))
    ratio = (stats[..., 2 * n] + tiny) / (stats[..., 2 * n + 1] + small)
    penalty = np.where(ratio < 1, np.exp(1 - 1 / ratio), 1.0)
    return np.stack(out, axis=-1) * penalty[..., None]


def parse_meteor_stats(line: str) -> np.ndarray:
    """One METEOR statistics line (`coco_metrics(details=True)`) as a row to sum.

    A caption matching its reference whole (every word matched, in one
    chunk) gets 0 chunks: the jar adds segments up that way, so such a
    caption adds no fragmentation to the corpus score.

    Args:
      line: the jar's statistics for one image.
    Returns:
      float64 ``(7 + 4 x stages,)`` (see `corpus_meteor`).
    """
    values = np.array([float(v) for v in line.split()], np.float64)
    if len(values) < 11 or (len(values) - 7) % 4:
        raise ValueError(f"not a METEOR statistics line: {line!r}")
    stages = values[4:-3].reshape(-1, 4)
    test_total, ref_total = stages[:, [0, 2]].sum(), stages[:, [1, 3]].sum()
    if test_total == values[0] and ref_total == values[1] and values[-3] == 1:
        values[-3] = 0.0
    return values


def corpus_meteor(stats: np.ndarray) -> np.ndarray:
    """METEOR from summed statistics lines, as the jar scores a set of segments.

    Args:
      stats: ``(..., 7 + 4 x stages)`` sums of `parse_meteor_stats` rows:
        test length, reference length, test and reference function words,
        per stage (test content, reference content, test function, reference
        function) matches, chunks, test and reference word matches.
    Returns:
      ``(...)`` scores (0 where the jar's would be NaN or negative).
    """
    s = np.asarray(stats, np.float64)
    stages = (s.shape[-1] - 7) // 4
    delta, alpha = METEOR_DELTA, METEOR_ALPHA
    test_matched = ref_matched = 0.0
    test_total = ref_total = 0.0
    for i in range(stages):
        tc, rc, tf, rf = (s[..., 4 + 4 * i + j] for j in range(4))
        test_matched = test_matched + (tc * delta + tf * (1 - delta)) * METEOR_WEIGHTS[i]
        ref_matched = ref_matched + (rc * delta + rf * (1 - delta)) * METEOR_WEIGHTS[i]
        test_total, ref_total = test_total + tc + tf, ref_total + rc + rf
    test_len, ref_len, test_fw, ref_fw = (s[..., j] for j in range(4))
    chunks, test_words, ref_words = s[..., -3], s[..., -2], s[..., -1]
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = test_matched / (delta * (test_len - test_fw) + (1 - delta) * test_fw)
        recall = ref_matched / (delta * (ref_len - ref_fw) + (1 - delta) * ref_fw)
        fmean = precision * recall / (alpha * precision + (1 - alpha) * recall)
        # A caption identical to its reference is one chunk: no fragmentation penalty.
        whole = (test_total == test_len) & (ref_total == ref_len) & (chunks == 1)
        frag = np.where(whole, 0.0, chunks / ((test_words + ref_words) / 2))
        score = fmean * (1 - METEOR_GAMMA * frag ** METEOR_BETA)
    return np.where(np.isnan(score) | (score < 0), 0.0, score)


def image_stats(predictions: Mapping[Hashable, str],
                references: Mapping[Hashable, Sequence[str]], *,
                grounding: Mapping[Hashable, Sequence[int]] | None = None,
                use_java: bool | None = None,
                progress: Callable[[str], None] | None = None,
                meteor=None) -> ImageStats:
    """Scores one model's captions once and keeps the per-image statistics.

    Args:
      predictions: image id -> generated caption.
      references: image id -> reference captions (covering every prediction).
      grounding: image id -> that image's `grounding_counts` row, or a
        mapping with the `COUNT_KEYS` (such as one image's
        `grounding_metrics`), for the images with object boxes; the others
        count for no grounding metric, as with `merge_grounding` of the
        boxed images alone. None when the data has no boxes.
      use_java, progress, meteor: as for `coco_metrics`.
    Returns:
      `ImageStats` in `predictions` order; its ``metrics`` are the
      toolkit's full-set scores.
    Raises:
      ValueError: as `coco_metrics`, or grounding counts for an unknown image.
    """
    from components.evaluator.metrics.coco import coco_metrics
    coco = coco_metrics(predictions, references, use_java=use_java, per_image=True,
                        details=True, progress=progress, meteor=meteor)
    ids = tuple(predictions)
    tokenized, per_image = coco["tokenized"], coco["per_image"]
    bleu = np.stack([bleu_stats(tokenized[i]["caption"], tokenized[i]["references"])
                     for i in ids])
    meteor = None
    if coco["meteor_stats"]:
        meteor = np.stack([parse_meteor_stats(coco["meteor_stats"][i]) for i in ids])
    counts = boxed = None
    if grounding is not None:
        unknown = [i for i in grounding if i not in predictions]
        if unknown:
            raise ValueError(f"grounding counts for {len(unknown)} images without a caption, "
                             f"e.g. {unknown[:3]}")
        zeros = np.zeros(len(COUNT_KEYS), np.int64)
        counts = np.stack([_count_row(grounding[i]) if i in grounding else zeros for i in ids])
        boxed = np.array([i in grounding for i in ids])
    metrics = {k: v for k, v in coco.items() if k not in ("per_image", "tokenized", "meteor_stats")}
    return ImageStats(ids=ids, bleu=bleu,
                      rouge=np.array([per_image[i]["ROUGE_L"] for i in ids], np.float64),
                      cider=np.array([per_image[i]["CIDEr"] for i in ids], np.float64),
                      meteor=meteor, grounding=counts, boxed=boxed, metrics=metrics)


def _count_row(counts) -> np.ndarray:
    if isinstance(counts, Mapping):
        counts = [counts[k] for k in COUNT_KEYS]
    row = np.asarray(counts, np.int64)
    if row.shape != (len(COUNT_KEYS),):
        raise ValueError(f"a grounding row has {len(COUNT_KEYS)} counts ({', '.join(COUNT_KEYS)})"
                         f", got shape {row.shape}")
    return row


def metric_values(stats: ImageStats) -> dict[str, float | None]:
    """Every metric of `METRICS` on the full set, from the per-image statistics.

    Args:
      stats: one model's `ImageStats`.
    Returns:
      metric -> value, None where it is not available (METEOR without Java,
      grounding without boxes, a rate whose denominator is 0).
    """
    layout, features = _features([stats], _available(stats, stats))
    values = _evaluate(features[0].sum(axis=0, keepdims=True), layout, len(stats.ids))
    return {m: (None if m not in values or np.isnan(values[m][0]) else float(values[m][0]))
            for m in METRICS}


def paired_bootstrap(candidate: ImageStats, baseline: ImageStats, *, resamples: int = 1000,
                     seed: int = 0, confidence: float = 0.95) -> dict[str, dict]:
    """Candidate minus baseline for every metric, with a percentile bootstrap interval.

    Each resample draws len(ids) images with replacement, the same images
    for both models, and recomputes both models' metrics on them.

    Args:
      candidate: the candidate's `ImageStats`.
      baseline: the baseline's, on the same image ids (any order).
      resamples: bootstrap resamples.
      seed: seeds the draws (the same seed gives the same intervals).
      confidence: the interval's coverage (0.95: the 2.5th to 97.5th percentiles).
    Returns:
      metric (every one of `METRICS`) -> ``{"candidate", "baseline",
      "difference" (candidate - baseline), "relative" (difference /
      baseline), "interval" ([low, high] of the difference), "relative_interval"
      ([low, high] of the relative difference), "confidence", "resamples"}``;
      the values are floats. Where a metric is not available for both
      models: each model's own value (or None), the rest None. A resample
      whose baseline is 0 has no relative difference (0 when the candidate
      is 0 too), and a resample where a rate's denominator is 0 is left out
      of that rate's interval.
    Raises:
      ValueError: the two models were scored on different images, or bad
        `resamples` / `confidence`.
    """
    if resamples < 1 or not 0 < confidence < 1:
        raise ValueError(f"need resamples >= 1 and 0 < confidence < 1, got {resamples}, "
                         f"{confidence}")
    baseline = _aligned(baseline, candidate.ids)
    n = len(candidate.ids)
    if not n:
        raise ValueError("no images to resample")
    available = _available(candidate, baseline)
    layout, (fc, fb) = _features([candidate, baseline], available)
    full_c = _evaluate(fc.sum(axis=0, keepdims=True), layout, n)
    full_b = _evaluate(fb.sum(axis=0, keepdims=True), layout, n)
    rng = np.random.default_rng(seed)
    block = max(1, min(resamples, _BLOCK_ELEMENTS // max(n, 1)))
    parts_c, parts_b = [], []
    for start in range(0, resamples, block):
        r = min(block, resamples - start)
        draws = rng.integers(0, n, size=(r, n)) + (np.arange(r) * n)[:, None]
        weights = np.bincount(draws.ravel(), minlength=r * n).reshape(r, n).astype(np.float64)
        parts_c.append(_evaluate(weights @ fc, layout, n))
        parts_b.append(_evaluate(weights @ fb, layout, n))
    tails = [50 * (1 - confidence), 50 * (1 + confidence)]
    out = {}
    for m in METRICS:
        entry = {"candidate": None, "baseline": None, "difference": None, "relative": None,
                 "interval": None, "relative_interval": None, "confidence": confidence,
                 "resamples": resamples}
        out[m] = entry
        if m not in full_c:  # one model lacks it (METEOR without Java): each its own value
            entry.update(candidate=metric_values(candidate)[m],
                         baseline=metric_values(baseline)[m])
            continue
        c, b = _scalar(full_c[m][0]), _scalar(full_b[m][0])
        entry.update(candidate=c, baseline=b)
        if c is None or b is None:
            continue
        entry.update(difference=c - b, relative=_scalar(_relative(np.array(c), np.array(b))))
        vc = np.concatenate([p[m] for p in parts_c])
        vb = np.concatenate([p[m] for p in parts_b])
        entry["interval"] = _percentiles(vc - vb, tails)
        entry["relative_interval"] = _percentiles(_relative(vc, vb), tails)
    return out


def _aligned(stats: ImageStats, ids: tuple) -> ImageStats:
    """`stats` with its rows in the order of `ids` (which must be the same set)."""
    if stats.ids == ids:
        return stats
    index = {i: k for k, i in enumerate(stats.ids)}
    if len(index) != len(ids) or any(i not in index for i in ids):
        extra = [i for i in ids if i not in index][:3]
        raise ValueError(f"candidate and baseline were scored on different images "
                         f"({len(ids)} and {len(stats.ids)} images; e.g. {extra} only in "
                         "the candidate's): score both on the same test split")
    order = np.array([index[i] for i in ids], np.int64)
    take = lambda a: None if a is None else a[order]  # noqa: E731
    return ImageStats(ids=ids, bleu=stats.bleu[order], rouge=stats.rouge[order],
                      cider=stats.cider[order], meteor=take(stats.meteor),
                      grounding=take(stats.grounding), boxed=take(stats.boxed),
                      metrics=stats.metrics)


def _available(a: ImageStats, b: ImageStats) -> tuple[str, ...]:
    """The optional blocks both models have."""
    blocks = []
    if a.meteor is not None and b.meteor is not None and a.meteor.shape == b.meteor.shape:
        blocks.append("meteor")
    if a.grounding is not None and b.grounding is not None:
        blocks.append("grounding")
    return tuple(blocks)


def _features(models: Sequence[ImageStats], optional: tuple[str, ...]):
    """Each model's per-image columns side by side, and where each block sits."""
    layout, features = {}, []
    for stats in models:
        blocks = [("bleu", stats.bleu), ("rouge", stats.rouge[:, None]),
                  ("cider", stats.cider[:, None])]
        if "meteor" in optional:
            blocks.append(("meteor", stats.meteor))
        if "grounding" in optional:
            blocks.append(("grounding", stats.grounding))
        start = 0
        for name, array in blocks:
            layout[name] = slice(start, start + array.shape[1])
            start += array.shape[1]
        features.append(np.concatenate([np.asarray(a, np.float64) for _, a in blocks], axis=1))
    return layout, features


def _evaluate(sums: np.ndarray, layout: Mapping[str, slice], n: int) -> dict[str, np.ndarray]:
    """Metric -> ``(R,)`` values from ``(R, columns)`` summed statistics (NaN: undefined)."""
    out = {}
    bleu = corpus_bleu(sums[:, layout["bleu"]])
    for k in range(bleu.shape[1]):
        out[f"Bleu_{k + 1}"] = bleu[:, k]
    out["ROUGE_L"] = sums[:, layout["rouge"]][:, 0] / n
    out["CIDEr"] = sums[:, layout["cider"]][:, 0] / n
    if "meteor" in layout:
        out["METEOR"] = corpus_meteor(sums[:, layout["meteor"]])
    if "grounding" in layout:
        counts = sums[:, layout["grounding"]]
        column = {k: counts[:, j] for j, k in enumerate(COUNT_KEYS)}
        for metric, (top, bottom) in _RATES.items():
            denominator = column[bottom]
            with np.errstate(divide="ignore", invalid="ignore"):
                out[metric] = np.where(denominator > 0, column[top] / denominator, np.nan)
    return out


def _relative(candidate: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    """(candidate - baseline) / baseline; where baseline is 0: 0 if equal, else NaN."""
    diff = candidate - baseline
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(baseline != 0, diff / baseline, np.nan)
    return np.where((baseline == 0) & (diff == 0), 0.0, rel)


def _scalar(value) -> float | None:
    value = float(value)
    return None if np.isnan(value) else value


def _percentiles(values: np.ndarray, tails: list[float]) -> list[float] | None:
    values = values[~np.isnan(values)]
    if not len(values):
        return None
    return [float(v) for v in np.percentile(values, tails)]
