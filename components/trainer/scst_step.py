"""The distributed self-critical training step (`train.objective=scst`).

On each replica: K captions per image are sampled and rewarded with CIDEr-D,
the baseline is the greedy caption's reward or the mean of the other samples
(`models.scst.sample_and_reward`, no gradient); the loss is the
advantage-weighted negative log-likelihood of the sampled words, divided by
the sampled words of all replicas, plus `train.scst_xe_weight` times the
cross-entropy loss of one reference caption per image (weighted as in
components/trainer/step.py), plus `train.scst_attention_kl` times the
attention anchor: the KL divergence from the start model's attention map to
the model's at each sampled word, divided by the same word count (the start
model is a frozen copy read teacher-forced on the samples, outside the
gradient tape), plus `train.scst_box_attention` times the box term: at each
sampled word that names an object of the image, `-log` of the attention
mass on that object's boxes (`models.scst.box_attention_nll`; the batches
then carry `object_boxes` and `object_words`), divided by the same word
count; with `train.scst_box_mode=keep` only each word's excess over the
start model's box term at that word counts (`models.scst.box_attention_excess`,
the start model read as for the anchor). With `train.scst_size_reward` the reward of every caption (the
greedy baseline's too) adds that weight for each size word true of the
objects its phrase names and subtracts it for each false one
(`models.scst.with_size_reward`). Gradients are all-reduced, clipped and applied by
`step.make_apply`. The sampling seed is `(train.seed, step)` folded with the
replica id: a resumed run samples what the interrupted one would have.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

SUM_KEYS = ("loss", "policy_sum", "sample_tokens", "sample_nll_sum", "entropy_sum",
            "reward_sum", "baseline_sum", "greedy_reward_sum", "positive_advantage",
            "samples", "examples", "nll_sum", "num_tokens", "attention_kl_sum",
            "box_nll_sum", "box_words", "size_correct", "size_words")
MEAN_KEYS = ("grad_norm", "loss_scale")


@dataclasses.dataclass(frozen=True)
class ScstStepOptions:
    """The settings of the self-critical step.

    Attributes:
      clip_norm: global-norm clipping (<= 0: off).
      global_batch_size: images per step over all replicas.
      num_samples: captions sampled per image.
      max_length: most words per sampled caption.
      baseline: `"greedy"` or `"mean"`.
      xe_weight: weight of the mixed-in cross-entropy loss (0 = none).
      attention_kl: weight of the attention anchor (0 = none).
      box_attention: weight of the box term (0 = none).
      box_keep: the box term's keep form (with `box_attention` > 0; needs
        the start model as `anchor`).
      grid: `(H, W)` of the annotation grid (the box term's cells).
      size_reward: weight of the size reward (0 = none).
      word_roles: per word id, its index in `models.scst.PHRASE_ROLES`
        (the size reward's phrases).
    """
    clip_norm: float
    global_batch_size: int
    num_samples: int
    max_length: int
    baseline: str = "greedy"
    xe_weight: float = 0.0
    attention_kl: float = 0.0
    box_attention: float = 0.0
    box_keep: bool = False
    grid: tuple = (0, 0)
    size_reward: float = 0.0
    word_roles: tuple = ()

    @property
    def reads_start_model(self) -> bool:
        """Whether the step reads the start model: the anchor, or the box term's keep form."""
        return self.attention_kl > 0 or (self.box_keep and self.box_attention > 0)

    @classmethod
    def from_config(cls, tcfg, max_length: int, grid_shape=(0, 0),
                    word_roles=()) -> "ScstStepOptions":
        """The options of the `train` section, with the phase's caption length, grid and word roles."""
        return cls(clip_norm=tcfg.clip_norm, global_batch_size=tcfg.batch_size,
                   num_samples=tcfg.scst_samples, max_length=max_length,
                   baseline=tcfg.scst_baseline, xe_weight=tcfg.scst_xe_weight,
                   attention_kl=tcfg.scst_attention_kl,
                   box_attention=tcfg.scst_box_attention,
                   box_keep=tcfg.scst_box_mode == "keep",
                   grid=(int(grid_shape[0]), int(grid_shape[1])),
                   size_reward=tcfg.scst_size_reward, word_roles=tuple(word_roles))


def _mixed_xe_loss(model, annotations, tokens, global_tokens, global_batch_size: int):
    """`(loss term, nll sum)` of the cross-entropy on one reference per image.

    Weighted as in components/trainer/step.py: token terms by this replica's
    share of the global tokens, the attention penalty by its share of the images.
    """
    import tensorflow as tf
    xe = model.compute_loss_terms(annotations, tokens, training=True, update_baseline=False)
    local_batch = tf.cast(tf.shape(tokens)[0], tf.float32)
    token_part = xe["loss"] - xe["attention_penalty"]
    loss = (token_part * (tf.maximum(xe["num_tokens"], 1.0) / tf.maximum(global_tokens, 1.0))
            + xe["attention_penalty"] * (local_batch / global_batch_size))
    return loss, tf.reduce_sum(xe["example_nll"])


def _step_outputs(loss, terms: dict, sampled: dict, num_samples: int, batch, **rest) -> dict:
    """One replica's `SUM_KEYS` and `MEAN_KEYS` (`rest`: nll_sum, num_tokens, grad_norm, loss_scale, size_correct, size_words)."""
    import tensorflow as tf
    images = tf.cast(batch, tf.float32)
    return {"loss": loss, "policy_sum": terms["policy_sum"],
            "sample_tokens": terms["sample_tokens"], "sample_nll_sum": terms["nll_sum"],
            "entropy_sum": terms["entropy_sum"], "attention_kl_sum": terms["attention_kl_sum"],
            "box_nll_sum": terms["box_nll_sum"], "box_words": terms["box_words"],
            "reward_sum": tf.reduce_sum(sampled["reward"]),
            "baseline_sum": tf.reduce_sum(sampled["baseline"]),
            "greedy_reward_sum": tf.reduce_sum(sampled["greedy_reward"]),
            "positive_advantage": tf.reduce_sum(tf.cast(sampled["advantage"] > 0, tf.float32)),
            "samples": images * float(num_samples), "examples": images, **rest}


def _check_inputs(options: ScstStepOptions, element_spec, anchor) -> None:
    """What the anchor and the box term need: the start model; boxes and the grid."""
    if options.reads_start_model and anchor is None:
        raise ValueError("attention_kl > 0 and box_keep need the start model as `anchor`")
    if options.box_attention > 0 and not ("object_boxes" in element_spec
                                          and options.grid[0] * options.grid[1] > 0):
        raise ValueError("box_attention > 0 needs batches with object_boxes and "
                         "object_words, and the grid")
    if options.size_reward > 0 and not ("object_words" in element_spec and options.word_roles):
        raise ValueError("size_reward > 0 needs batches with object_words, and word_roles")


def _word_counts(ctx, sampled_tokens, tokens, replicas: int):
    """`(local reference tokens, global sampled words, global reference tokens)`, float32."""
    import tensorflow as tf

    from models.text import PAD_ID
    local_words = tf.reduce_sum(tf.cast(tf.not_equal(sampled_tokens, PAD_ID), tf.float32))
    local_tokens = tf.reduce_sum(tf.cast(tf.not_equal(tokens[:, 1:], PAD_ID), tf.float32))
    counts = tf.stack([local_words, local_tokens])
    global_words, global_tokens = tf.unstack(
        ctx.all_reduce(tf.distribute.ReduceOp.SUM, counts) if replicas > 1 else counts)
    return local_tokens, global_words, global_tokens


def _box_inputs(batch, options: ScstStepOptions):
    """`(object_words, object_cells)` of the batch for the box term, or None when it is off."""
    if options.box_attention <= 0:
        return None
    from models import scst
    return batch["object_words"], scst.box_cells(batch["object_boxes"], *options.grid)


def _start_attention(anchor, annotations, sampled_tokens, options: ScstStepOptions):
    """`(for the anchor, for the box term's keep form)`: the start model's attention on the
    samples (`models.scst.teacher_forced_attention`, read once), or None where not used."""
    if not options.reads_start_model:
        return None, None
    from models import scst
    alpha = scst.teacher_forced_attention(anchor, annotations, sampled_tokens)
    return ((alpha if options.attention_kl > 0 else None),
            (alpha if options.box_keep and options.box_attention > 0 else None))


def _size_reward(scorer, batch, options: ScstStepOptions):
    """`(the reward, truth(tokens) -> (correct, sized) or None)`: with the size reward when it is on."""
    if options.size_reward <= 0:
        return scorer, None
    import tensorflow as tf

    from models import scst
    roles = tf.constant(options.word_roles, tf.int32)
    return (scst.with_size_reward(scorer, roles, batch["object_words"], options.size_reward),
            lambda tokens: scst.size_truth(tokens, roles, batch["object_words"]))


def _per_word_loss(terms: dict, options: ScstStepOptions, global_words):
    """The policy loss plus the weighted anchor and box terms, per sampled word of all replicas."""
    import tensorflow as tf
    words = tf.maximum(global_words, 1.0)
    loss = terms["policy_sum"] / words
    if options.attention_kl > 0:
        loss += options.attention_kl * terms["attention_kl_sum"] / words
    if options.box_attention > 0:
        loss += options.box_attention * terms["box_nll_sum"] / words
    return loss


def make_scst_step(strategy, model, optimizer, scorer, options: ScstStepOptions,
                   element_spec, anchor=None) -> Callable:
    """`step(per_replica_batch, seed) -> dict of float scalars` for self-critical training.

    Args:
      strategy: the `tf.distribute.Strategy`.
      model: a built `ShowAttendTell`.
      optimizer: a Keras optimizer built on `model.trainable_variables`.
      scorer: a `models.cider_d.CiderD` built from the training references.
      options: the `ScstStepOptions`.
      element_spec: the distributed dataset's `element_spec`; batches hold
        `annotations`, `tokens` (one reference) and `references` (all), and
        for the box term `object_boxes` and `object_words` (the size reward:
        `object_words`).
      anchor: the frozen start model whose attention anchors the model's
        (needed when `options.reads_start_model`).
    Returns:
      A `tf.function` of `(batch, seed)`, `seed` an int64 (2,) tensor; its
      result holds `SUM_KEYS` summed and `MEAN_KEYS` averaged over replicas.
    """
    import tensorflow as tf

    from components.trainer.step import is_loss_scaled, make_apply
    from models import scst
    num_samples, xe_weight = options.num_samples, options.xe_weight
    _check_inputs(options, element_spec, anchor)
    replicas = strategy.num_replicas_in_sync
    variables = model.trainable_variables
    apply = make_apply(strategy, model, optimizer, options.clip_norm)
    SUM = tf.distribute.ReduceOp.SUM
    loss_scaled = is_loss_scaled(optimizer)

    def replica_step(batch, seed):
        ctx = tf.distribute.get_replica_context()
        seed = tf.random.experimental.stateless_fold_in(
            seed, tf.cast(ctx.replica_id_in_sync_group, tf.int64))
        annotations, tokens = batch["annotations"], tf.cast(batch["tokens"], tf.int32)
        reward, size_truth = _size_reward(scorer, batch, options)
        sampled = scst.sample_and_reward(
            model, annotations, tf.cast(batch["references"], tf.int32), reward,
            num_samples=num_samples, max_length=options.max_length, seed=seed,
            baseline=options.baseline)
        size_correct, size_words = (tf.zeros(()), tf.zeros(())) if size_truth is None else (
            tf.reduce_sum(x) for x in size_truth(sampled["tokens"]))
        local_tokens, global_words, global_tokens = _word_counts(
            ctx, sampled["tokens"], tokens, replicas)
        kl_alpha, box_alpha = _start_attention(anchor, annotations, sampled["tokens"], options)
        with tf.GradientTape() as tape:
            terms = scst.policy_loss_terms(model, annotations, sampled["tokens"],
                                           sampled["advantage"], kl_alpha,
                                           _box_inputs(batch, options), box_alpha)
            loss = _per_word_loss(terms, options, global_words)
            nll_sum, num_tokens = tf.zeros(()), local_tokens
            if xe_weight > 0:
                xe_loss, nll_sum = _mixed_xe_loss(model, annotations, tokens, global_tokens,
                                                  options.global_batch_size)
                loss += xe_weight * xe_loss
            scaled = optimizer.scale_loss(loss) if loss_scaled else loss
        grads = tape.gradient(scaled, variables)
        grads = [tf.convert_to_tensor(g) if g is not None else tf.zeros_like(v)
                 for g, v in zip(grads, variables, strict=True)]
        norm, scale = apply(grads)
        out = _step_outputs(loss, terms, sampled, num_samples, tf.shape(annotations)[0],
                            nll_sum=nll_sum, num_tokens=num_tokens, grad_norm=norm,
                            loss_scale=scale, size_correct=size_correct, size_words=size_words)
        return (tf.stack([tf.cast(out[k], tf.float32) for k in SUM_KEYS]),
                tf.stack([tf.cast(out[k], tf.float32) for k in MEAN_KEYS]))

    @tf.function(input_signature=[element_spec, tf.TensorSpec([2], tf.int64)], autograph=False)
    def step(batch, seed):
        sums, means = strategy.run(replica_step, args=(batch, seed))
        sums = strategy.reduce(SUM, sums, axis=None)
        means = strategy.reduce(tf.distribute.ReduceOp.MEAN, means, axis=None)
        out = {k: sums[i] for i, k in enumerate(SUM_KEYS)}
        out.update({k: means[i] for i, k in enumerate(MEAN_KEYS)})
        return out

    return step
