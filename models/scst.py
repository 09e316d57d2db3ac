"""Self-critical sequence training (Rennie et al. 2017) of `ShowAttendTell`.

REINFORCE on whole captions: K captions are sampled per image from the
model itself (`models.decoding.sample_decode`), each is rewarded with its
CIDEr-D against the image's references (`models.cider_d.CiderD`), and the
loss is

    sum_{k, t} -(r_k - b_k) log p(w_kt | w_k<t, a) / (sampled words)

with a baseline `b_k` that does not depend on the sample: the reward of the
model's greedy caption of the same image (the paper's "self-critical"
baseline) or the mean reward of the image's other K - 1 samples. The
captions are sampled and scored outside the gradient (`sample_and_reward`);
only the teacher-forced pass over them (`policy_loss_terms`) is
differentiated. Both run in inference mode (no dropout, hard attention per
`hard_inference`), so the gradient is that of the policy that sampled.

The attention anchor (`attention_kl`) adds, per sampled word, the KL
divergence from the start model's attention map to the model's, both read
teacher-forced on the same sampled caption: a penalty for looking elsewhere
than the cross-entropy model did while saying the same words.

The box term (`box_attention_nll`) uses the data's object boxes instead of
a start model: at each sampled word that names an object of the image (its
kind, colour or size; a COCO category), `-log` of the attention mass on the
grid cells of the boxes of the objects that word names. Attention is a
function of the words said, so a reward would only change which words are
said; this term is differentiated and moves where the model looks. Its keep form
(`box_attention_excess`) counts only the part of each word's `-log` mass
above the start model's at the same word of the same caption: it holds the
start model's grounding and does not push past it.

The size reward (`with_size_reward`) is a reward, because which size word
a caption says is a choice of words: `size_truth` reads each caption's
object phrases (a kind word with the size and colour words before it) and
counts the size words true, and false, of the objects the phrase's colour
and kind name.
"""
from __future__ import annotations

import tensorflow as tf

from models import losses
from models.decoding import greedy_decode, sample_decode
from models.text import START_ID

BASELINES = ("greedy", "mean")


def sample_and_reward(model, annotations, references, scorer, *, num_samples: int,
                      max_length: int, seed, baseline: str = "greedy") -> dict:
    """Samples captions and scores them: no gradient flows from here.

    Args:
      model: a built `ShowAttendTell`.
      annotations: (batch, L, D).
      references: (batch, R, T') int reference captions (`<start> w.. <end>`, `<pad>`).
      scorer: a `models.cider_d.CiderD` (or any callable of the same signature).
      num_samples: K captions per image (at least 2 for `baseline="mean"`).
      max_length: most words per sampled caption (`<end>` included).
      seed: (2,) int tensor; the same seed samples the same captions.
      baseline: `"greedy"` or `"mean"` (see the module docstring).
    Returns:
      dict: `tokens` (batch, K, max_length) int32 sampled captions; float32
      `reward` and `baseline` (batch, K); `advantage` = reward - baseline;
      `greedy_reward` (batch,) (zeros with `baseline="mean"`, which decodes
      no greedy caption).
    """
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if baseline == "mean" and num_samples < 2:
        raise ValueError("the mean-of-the-other-samples baseline needs num_samples >= 2")
    samples = sample_decode(model, annotations, num_samples, max_length, seed)
    tokens = tf.stop_gradient(samples["tokens"])
    reward = tf.stop_gradient(scorer(tokens, references))                    # (batch, K)
    if baseline == "greedy":
        greedy = greedy_decode(model, annotations, max_length, context_products=False)
        greedy_reward = tf.stop_gradient(scorer(greedy["tokens"][:, None, :], references))
        values = tf.broadcast_to(greedy_reward, tf.shape(reward))
        greedy_reward = greedy_reward[:, 0]
    else:
        k = float(num_samples)
        values = (tf.reduce_sum(reward, 1, keepdims=True) - reward) / (k - 1.0)
        greedy_reward = tf.zeros_like(reward[:, 0])
    return {"tokens": tokens, "reward": reward, "baseline": values,
            "advantage": reward - values, "greedy_reward": greedy_reward}


# Attention weights below this are raised to it inside the KL's logarithms.
KL_FLOOR = 1e-8


def _teacher_forced(model, annotations, tokens):
    """`(targets (batch * K, T), outputs)` of `model` teacher-forced on the sampled captions."""
    shape = tf.shape(tokens)
    batch, k, steps = shape[0], shape[1], shape[2]
    targets = tf.reshape(tf.cast(tokens, tf.int32), [batch * k, steps])
    inputs = tf.concat([tf.fill([batch * k, 1], START_ID), targets[:, :-1]], axis=1)
    return targets, model.teacher_forced(tf.repeat(annotations, k, axis=0), inputs,
                                         training=False)


def teacher_forced_attention(model, annotations, tokens):
    """(batch * K, T, L) float32: `model`'s attention along each sampled caption, teacher-forced.

    Args:
      model: a built `ShowAttendTell` (the start model of the attention anchor).
      annotations: (batch, L, D).
      tokens: (batch, K, T) sampled captions.
    """
    _, out = _teacher_forced(model, annotations, tokens)
    return tf.stop_gradient(tf.cast(out["alpha"], tf.float32))


def attention_kl(anchor_alpha, alpha, targets):
    """Per-word KL(anchor || alpha) over the regions, 0 at padding.

    Args:
      anchor_alpha: (N, T, L) the start model's attention (a constant).
      alpha: (N, T, L) the model's attention.
      targets: (N, T) int the words the maps belong to (`<pad>` masked).
    Returns:
      (N, T) float32 `sum_l a_l (log a_l - log alpha_l)`.
    """
    p = tf.cast(anchor_alpha, tf.float32)
    q = tf.cast(alpha, tf.float32)
    kl = tf.reduce_sum(p * (tf.math.log(tf.maximum(p, KL_FLOOR))
                            - tf.math.log(tf.maximum(q, KL_FLOOR))), axis=-1)
    return kl * losses.step_mask(targets)


def box_cells(boxes, grid_h: int, grid_w: int):
    """(N, M, H * W) float32: 1 at the grid cells each box overlaps (positive area), else 0.

    Args:
      boxes: (N, M, 4) `ymin, xmin, ymax, xmax` normalized to [0, 1]; a box
        with no area (padding) covers no cell.
      grid_h, grid_w: the annotation grid (cell `i = y * W + x`, row-major).
    """
    boxes = tf.cast(boxes, tf.float32)
    ymin, xmin, ymax, xmax = tf.unstack(boxes, axis=-1)                      # (N, M)

    def overlap(lo, hi, n):
        edges = tf.range(n + 1, dtype=tf.float32) / float(n)
        return ((lo[..., None] < edges[1:]) & (hi[..., None] > edges[:-1])
                & (hi > lo)[..., None])                                         # (N, M, n)

    rows, cols = overlap(ymin, ymax, grid_h), overlap(xmin, xmax, grid_w)
    cells = rows[..., :, None] & cols[..., None, :]                          # (N, M, H, W)
    shape = tf.shape(cells)
    return tf.cast(tf.reshape(cells, [shape[0], shape[1], grid_h * grid_w]), tf.float32)


def word_regions(targets, object_words, object_cells):
    """(N, T, L) float32: the cells of the objects each word names (1), else 0.

    Args:
      targets: (N, T) int word ids.
      object_words: (N, M, W) int, the ids of the words naming each object
        (-1: padding).
      object_cells: (N, M, L) from `box_cells`.
    """
    targets = tf.cast(targets, tf.int32)
    names = tf.equal(targets[:, :, None, None], tf.cast(object_words, tf.int32)[:, None])
    named = tf.cast(tf.reduce_any(names, axis=-1), tf.float32)               # (N, T, M)
    return tf.minimum(tf.einsum("ntm,nml->ntl", named, tf.cast(object_cells, tf.float32)), 1.0)


def box_attention_nll(alpha, targets, regions):
    """Per word, `-log` of the attention mass on the cells of the objects it names.

    Args:
      alpha: (N, T, L) the model's attention, map t the one used for word t.
      targets: (N, T) int the words (`<pad>` masked).
      regions: (N, T, L) from `word_regions`.
    Returns:
      `(nll (N, T), counted (N, T))` float32: the term at the words that name
      an object with at least one cell, 0 elsewhere; `counted` marks those
      words. Masses below `KL_FLOOR` are raised to it.
    """
    regions = tf.cast(regions, tf.float32)
    mass = tf.reduce_sum(tf.cast(alpha, tf.float32) * regions, axis=-1)
    counted = tf.cast(tf.reduce_sum(regions, axis=-1) > 0, tf.float32) * losses.step_mask(targets)
    return -tf.math.log(tf.maximum(mass, KL_FLOOR)) * counted, counted


def box_attention_excess(nll, start_nll):
    """Per word, how far the box term lies above the start model's: `max(nll - start_nll, 0)`.

    Args:
      nll: (N, T) the model's `box_attention_nll` (0 at words not counted).
      start_nll: (N, T) the start model's on the same words (a constant).
    Returns:
      (N, T) float32, 0 where the model puts at least the start model's mass
      on the named objects' boxes (and at the words not counted).
    """
    start_nll = tf.stop_gradient(tf.cast(start_nll, tf.float32))
    return tf.nn.relu(tf.cast(nll, tf.float32) - start_nll)


# What a word does in an object phrase (`size_truth`'s `word_roles` table):
# "stop" words (articles, numbers) end the phrase's run of modifiers.
PHRASE_ROLES = ("other", "stop", "size", "color", "kind")
_STOP, _SIZE, _COLOR, _KIND = (PHRASE_ROLES.index(r) for r in ("stop", "size", "color", "kind"))


def _shift_right(x, d: int, fill):
    """`x[:, t - d]` at every t (`fill` where t < d)."""
    return tf.pad(x[:, :-d], [[0, 0], [d, 0]], constant_values=fill)


def _phrase_modifiers(tokens, roles):
    """`(color, size)` (N, T) int32: the word ids modifying the noun at each step, else -1.

    Walking back from a kind word over the run of stop, size and colour
    words right before it (the run ends after a stop word), the nearest
    colour and the nearest size word, as the scenes caption parser reads a
    phrase; -1 where the step is no kind word or the run has none.
    """
    steps = tokens.shape[1] if tokens.shape[1] is not None else 32
    alive = tf.equal(roles, _KIND)
    color = size = tf.fill(tf.shape(tokens), -1)
    for d in range(1, steps):
        role_d, token_d = _shift_right(roles, d, 0), _shift_right(tokens, d, -1)
        alive &= (role_d == _STOP) | (role_d == _SIZE) | (role_d == _COLOR)
        color = tf.where(alive & (role_d == _COLOR) & (color < 0), token_d, color)
        size = tf.where(alive & (role_d == _SIZE) & (size < 0), token_d, size)
        alive &= role_d != _STOP                        # the run ends after a stop word
    return color, size


def size_truth(tokens, word_roles, object_words):
    """`(correct, sized)` (batch, K) float32: size words true, and said, of matched phrases.

    A phrase is a kind word with its modifiers (`_phrase_modifiers`); it
    matches the image's objects named by both its colour and its kind word
    (`object_words`), as the Evaluator's `size_accuracy` matches phrases. A
    matched phrase with a size word is *sized*, and *correct* when one of
    those objects is also named by that size word.

    Args:
      tokens: (batch, K, T) int captions.
      word_roles: (V,) int32, each word id's index in `PHRASE_ROLES`.
      object_words: (batch, M, W) int, the ids of the words naming each
        object (-1: padding).
    """
    shape = tf.shape(tokens)
    flat = tf.reshape(tf.cast(tokens, tf.int32), [shape[0] * shape[1], shape[2]])
    flat.set_shape([None, tokens.shape[-1]])
    roles = tf.gather(tf.cast(word_roles, tf.int32), flat)
    color, size = _phrase_modifiers(flat, roles)
    names = tf.repeat(tf.cast(object_words, tf.int32), shape[1], axis=0)[:, None]  # (N,1,M,W)

    def named(words):                                                         # (N, T, M)
        return tf.reduce_any(tf.equal(words[:, :, None, None], names), axis=-1)

    phrase = named(flat) & named(color) & (color >= 0)[..., None]
    matched = tf.reduce_any(phrase, axis=-1) & tf.equal(roles, _KIND)
    sized = matched & (size >= 0)
    correct = sized & tf.reduce_any(phrase & named(size), axis=-1)

    def per_caption(mask):
        return tf.reshape(tf.reduce_sum(tf.cast(mask, tf.float32), -1), shape[:2])

    return per_caption(correct), per_caption(sized)


def with_size_reward(scorer, word_roles, object_words, weight: float):
    """`scorer` plus `weight` per true size word and minus `weight` per false one (`size_truth`).

    The result scores like `scorer` (`(tokens (batch, K, T), references) ->
    (batch, K)`), so `sample_and_reward` rewards the samples and the greedy
    baseline caption alike.
    """
    def score(tokens, references):
        correct, sized = size_truth(tokens, word_roles, object_words)
        return scorer(tokens, references) + weight * (2.0 * correct - sized)
    return score


def policy_loss_terms(model, annotations, tokens, advantage, anchor_alpha=None,
                      objects=None, box_start_alpha=None) -> dict:
    """The differentiable part: the advantage-weighted log-likelihood of the samples.

    Args:
      model: a built `ShowAttendTell`.
      annotations: (batch, L, D).
      tokens: (batch, K, T) sampled captions (from `sample_and_reward`).
      advantage: (batch, K) float32, treated as a constant.
      anchor_alpha: (batch * K, T, L) the start model's attention on the
        same captions (`teacher_forced_attention`), or None (no anchor).
      objects: `(object_words (batch, M, W), object_cells (batch, M, L))`
        for the box term (see `word_regions`), or None (no box term).
      box_start_alpha: (batch * K, T, L) the start model's attention on the
        same captions, or None: with it the box term is its keep form
        (`box_attention_excess`).
    Returns:
      dict of float32 scalars (sums, so that replicas can share one
      denominator): `policy_sum` = `sum -advantage * log p(w)` over the
      sampled words (`<end>` included), `sample_tokens` (their count),
      `nll_sum` (`-log p(w)` summed), `entropy_sum` (the entropy of each
      step's word distribution, summed over those steps), `attention_kl_sum`
      (`attention_kl` summed over the sampled words; 0 without an anchor),
      `box_nll_sum` and `box_words` (`box_attention_nll`, or with
      `box_start_alpha` `box_attention_excess`, summed, and the words it
      counted; 0 without `objects`).
    """
    targets, out = _teacher_forced(model, annotations, tokens)
    nll = losses.masked_nll(out["logits"], targets)                          # (bK, T)
    step_mask = losses.step_mask(targets)
    weight = tf.reshape(tf.stop_gradient(tf.cast(advantage, tf.float32)), [-1, 1])  # (bK, 1)
    log_probs = tf.nn.log_softmax(tf.cast(out["logits"], tf.float32), axis=-1)
    entropy = -tf.reduce_sum(tf.exp(log_probs) * log_probs, axis=-1)         # (bK, T)
    kl_sum = (tf.reduce_sum(attention_kl(anchor_alpha, out["alpha"], targets))
              if anchor_alpha is not None else tf.zeros(()))
    box_nll_sum, box_words = tf.zeros(()), tf.zeros(())
    if objects is not None:
        k = tf.shape(tokens)[1]
        object_words, object_cells = (tf.repeat(x, k, axis=0) for x in objects)
        regions = word_regions(targets, object_words, object_cells)
        nll_box, counted = box_attention_nll(out["alpha"], targets, regions)
        if box_start_alpha is not None:
            nll_box = box_attention_excess(
                nll_box, box_attention_nll(box_start_alpha, targets, regions)[0])
        box_nll_sum, box_words = tf.reduce_sum(nll_box), tf.reduce_sum(counted)
    return {"policy_sum": tf.reduce_sum(weight * nll),
            "sample_tokens": tf.reduce_sum(step_mask),
            "nll_sum": tf.reduce_sum(nll),
            "entropy_sum": tf.stop_gradient(tf.reduce_sum(entropy * step_mask)),
            "attention_kl_sum": kl_sum, "box_nll_sum": box_nll_sum, "box_words": box_words}
