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


def policy_loss_terms(model, annotations, tokens, advantage, anchor_alpha=None) -> dict:
    """The differentiable part: the advantage-weighted log-likelihood of the samples.

    Args:
      model: a built `ShowAttendTell`.
      annotations: (batch, L, D).
      tokens: (batch, K, T) sampled captions (from `sample_and_reward`).
      advantage: (batch, K) float32, treated as a constant.
      anchor_alpha: (batch * K, T, L) the start model's attention on the
        same captions (`teacher_forced_attention`), or None (no anchor).
    Returns:
      dict of float32 scalars (sums, so that replicas can share one
      denominator): `policy_sum` = `sum -advantage * log p(w)` over the
      sampled words (`<end>` included), `sample_tokens` (their count),
      `nll_sum` (`-log p(w)` summed), `entropy_sum` (the entropy of each
      step's word distribution, summed over those steps), `attention_kl_sum`
      (`attention_kl` summed over the sampled words; 0 without an anchor).
    """
    targets, out = _teacher_forced(model, annotations, tokens)
    nll = losses.masked_nll(out["logits"], targets)                          # (bK, T)
    step_mask = losses.step_mask(targets)
    weight = tf.reshape(tf.stop_gradient(tf.cast(advantage, tf.float32)), [-1, 1])  # (bK, 1)
    log_probs = tf.nn.log_softmax(tf.cast(out["logits"], tf.float32), axis=-1)
    entropy = -tf.reduce_sum(tf.exp(log_probs) * log_probs, axis=-1)         # (bK, T)
    kl_sum = (tf.reduce_sum(attention_kl(anchor_alpha, out["alpha"], targets))
              if anchor_alpha is not None else tf.zeros(()))
    return {"policy_sum": tf.reduce_sum(weight * nll),
            "sample_tokens": tf.reduce_sum(step_mask),
            "nll_sum": tf.reduce_sum(nll),
            "entropy_sum": tf.stop_gradient(tf.reduce_sum(entropy * step_mask)),
            "attention_kl_sum": kl_sum}
