"""The training objective of `ShowAttendTell` (Xu et al. 2015, sections 4.1 and 4.2).

Soft attention: the caption's negative log-likelihood plus the doubly
stochastic penalty. Hard attention: the variational lower bound of equation
12, whose gradient is the NLL's through the sampled context plus the
REINFORCE term `-lambda_r (r - b) d log p(s | a)` with a reward baseline
`b`, minus an entropy bonus; with probability `expected_alpha_prob` per
minibatch the expected context replaces the sample. The baseline is a
moving average of the reward (`update_baseline`), or, per word, the reward
the expected context would have earned (`reinforce_baseline="expected"`).

Glimpses (Mnih et al. 2014): the NLL plus the same REINFORCE term on the
sampled locations, whose log-probability reaches the policy through its
mean only, against a baseline per step `b_t = b + f(h_{t-1})`: hard
attention's baseline `b` (the moving average of the reward, or with
`reinforce_baseline="expected"` each word's `log p(y_t)` had its glimpse
been at the policy's mean) plus a learned correction `f`, regressed onto
`r_t - b` (RAM's learned baseline and its squared-error loss; learned from
zero alone, it would take thousands of steps to reach rewards of -20 nats,
and its early errors would dominate the gradient norm that the Trainer
clips). The spatial transformer: the soft
objective. Both location-wise attentions add their guard's penalty (the
squared amount by which a location was clamped; `guard_rate` is the share
of steps where that happened).
"""
from __future__ import annotations

import keras
from keras import ops

from models import losses
from models.decoder_options import REINFORCE_BASELINES, REINFORCE_CREDITS  # noqa: F401


def update_baseline(model, mean_reward, skip=None) -> None:
    """Moves the REINFORCE baseline: `b <- decay * b + (1 - decay) * mean_reward`.

    The first update sets `b` to `mean_reward`, so that early gradients are
    not scaled by the whole log-likelihood. Safe in a `tf.distribute` replica
    context: the variables are mean-aggregated, so all replicas end with the
    mean of their updates.

    Args:
      model: a hard-attention `ShowAttendTell` (its `reward_baseline` and
        `baseline_updates` variables change).
      mean_reward: scalar mean reward over the minibatch: of `log p(y | s, a)`
        per caption, or of `log p(y_t)` per word with `reinforce_credit="token"`.
      skip: optional scalar bool; when true nothing changes (minibatches
        trained with the expected alpha do not estimate the sampled reward).
    """
    mean_reward = ops.cast(mean_reward, "float32")
    b, count = model.reward_baseline, model.baseline_updates
    decay = model.options.baseline_decay
    new_b = ops.where(count > 0, decay * b + (1.0 - decay) * mean_reward, mean_reward)
    new_count = count + 1.0
    if skip is not None:
        new_b = ops.where(skip, b, new_b)
        new_count = ops.where(skip, count, new_count)
    b.assign(new_b)
    count.assign(new_count)


def _expected_alpha_coin(model):
    """Hard attention in training: whether this minibatch uses the expected context."""
    used_expected = keras.random.uniform(
        (), seed=model.expected_alpha_seed) < model.options.expected_alpha_prob
    if model.options.expected_alpha_warmup > 0:
        used_expected = ops.logical_or(
            used_expected, model.hard_training_steps < float(model.options.expected_alpha_warmup))
    model.hard_training_steps.assign(model.hard_training_steps + 1.0)
    return used_expected


def compute_loss_terms(model, annotations, tokens, mask=None, training=True,
                       global_batch_size=None, update_baseline_now=True) -> dict:
    """Every loss term of one minibatch; `loss` is the scalar to minimize.

    `loss = nll + attention_penalty` (soft) and, for hard attention,
    `+ reinforce_term - entropy_lambda * attention_entropy`. Token terms
    (`nll`, `attention_entropy`, `reinforce_term`) are sums over real target
    tokens divided by the number of real tokens in this batch;
    `attention_penalty` is the batch mean. With `global_batch_size`, `loss`
    is multiplied by `local_batch / global_batch_size` (replicas' gradients
    then sum to the global batch mean's, exactly for the batch-mean terms).
    The Trainer's step re-weights by the global token count itself, from the
    per-example sums.

    Args:
      model: a built `ShowAttendTell`.
      annotations: (batch, L, D).
      tokens: (batch, T + 1) int whole captions `<start> w.. <end> <pad>..`;
        inputs are `tokens[:, :-1]`, targets `tokens[:, 1:]`, PAD masked.
      mask: optional (batch, L) bool over regions.
      training: dropout, sampling, coin flip and baseline update.
      global_batch_size: see above; None = per-replica mean.
      update_baseline_now: hard attention: update the moving-average baseline
        (after its old value has been used).
    Returns:
      dict of float32 tensors: scalars `loss`, `nll`, `attention_penalty`,
      (location-wise attentions) `guard_penalty` and `guard_rate`, (glimpse)
      `baseline_loss`,
      `attention_entropy` (mean per real step, nats), `num_tokens`; for
      hard attention also `reward` (mean `log p(y|s,a)` per caption, or
      per word with `reinforce_credit="token"`), `sample_log_prob` (batch, T)
      `log alpha_{t, s_t}` of each step's sampled region,
      `baseline` (the value used; with `reinforce_baseline="expected"`
      its mean per real word, and `token_baseline` (batch, T) the
      per-word values), `reinforce_term`, `used_expected_alpha`
      (1.0 or 0.0); glimpse the same but `baseline` (the mean learned
      baseline) and `used_expected_alpha` (0.0); per example (batch,):
      `example_nll` (sum over tokens), `example_tokens`, `example_penalty`;
      and the forward outputs `logits`, `alpha` (and `locations`).
    """
    options = model.options
    hard = options.hard
    tokens = ops.cast(tokens, "int32")
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    used_expected = _expected_alpha_coin(model) if hard and training else None
    out = model.teacher_forced(annotations, inputs, mask, training=training,
                               use_expected=used_expected)
    steps = losses.step_mask(targets)                               # (batch, T)
    example_tokens = ops.sum(steps, axis=1)
    num_tokens = ops.sum(example_tokens)
    denominator = ops.maximum(num_tokens, 1.0)
    token_nll = losses.masked_nll(out["logits"], targets)          # (batch, T)
    example_nll = ops.sum(token_nll, axis=1)
    example_penalty = losses.doubly_stochastic_penalty(
        out["alpha"], steps,
        model.options.doubly_stochastic_lambda if options.doubly_stochastic else 0.0)
    example_entropy = ops.sum(losses.attention_entropy(out["alpha"]) * steps, axis=1)
    terms = {"nll": ops.sum(example_nll) / denominator,
             "attention_penalty": ops.mean(example_penalty),
             "attention_entropy": ops.sum(example_entropy) / denominator,
             "num_tokens": num_tokens, "example_nll": example_nll,
             "example_tokens": example_tokens, "example_penalty": example_penalty,
             "logits": out["logits"], "alpha": out["alpha"]}
    loss = terms["nll"] + terms["attention_penalty"]
    if hard:
        terms.update(_reinforce_terms(model, out, targets, token_nll, steps,
                                      training=training, used_expected=used_expected))
        loss = (loss + terms["reinforce_term"]
                - model.options.entropy_lambda * terms["attention_entropy"])
        if training and update_baseline_now and "token_baseline" not in terms:
            update_baseline(model, terms["reward"], skip=used_expected)
    if options.located:
        terms.update(_location_terms(model, out, targets, token_nll, steps, training=training,
                                     update_baseline_now=update_baseline_now))
        loss = loss + terms.pop("location_loss")
    if global_batch_size is not None:
        local = ops.cast(ops.shape(tokens)[0], "float32")
        loss = loss * local / ops.cast(global_batch_size, "float32")
    terms["loss"] = loss
    return terms


def _reinforce_terms(model, out, targets, token_nll, steps, *, training,
                     used_expected) -> dict:
    """Hard attention's reward, baseline and REINFORCE surrogate (equation 12)."""
    denominator = ops.maximum(ops.sum(steps), 1.0)
    if model.options.reinforce_credit == "token":
        reward = -token_nll                                     # log p(y_t|...), (batch, T)
        mean_reward = ops.sum(reward) / denominator
    else:
        reward = -ops.sum(token_nll, axis=1)                    # log p(y|s,a), (batch,)
        mean_reward = ops.mean(reward)
    baseline = ops.where(model.baseline_updates > 0,
                         ops.convert_to_tensor(model.reward_baseline), mean_reward)
    expected_baseline = "expected_logits" in out
    if expected_baseline:
        # log p(y_t) had step t used the expected context (per word).
        baseline = -losses.masked_nll(out["expected_logits"], targets)
    if training:
        used = ops.cast(used_expected, "float32")
        if model.options.reinforce_credit == "token":
            surrogate = losses.reinforce_surrogate(
                reward, baseline, out["sample_log_prob"], model.options.reinforce_lambda) * steps
        else:
            sample_log_prob = ops.sum(out["sample_log_prob"] * steps, axis=1)
            surrogate = losses.reinforce_surrogate(
                reward, baseline, sample_log_prob, model.options.reinforce_lambda)
        reinforce_term = (1.0 - used) * ops.sum(surrogate) / denominator
    else:
        used = ops.convert_to_tensor(
            1.0 if model.options.hard_inference == "expected" else 0.0, "float32")
        reinforce_term = ops.zeros((), "float32")
    terms = {"reward": mean_reward,
             "baseline": (ops.sum(baseline) / denominator if expected_baseline else baseline),
             "reinforce_term": reinforce_term, "used_expected_alpha": used,
             "sample_log_prob": out["sample_log_prob"]}
    if expected_baseline:
        terms["token_baseline"] = baseline                      # (batch, T)
    return terms


def _location_terms(model, out, targets, token_nll, steps, *, training,
                    update_baseline_now) -> dict:
    """The location-wise attentions' terms: the guard's, and the glimpse's REINFORCE.

    Returns:
      the terms, `locations`, and `location_loss`, what they add to the loss.
    """
    terms = _guard_terms(model, out, steps, training=training)
    terms["locations"] = out["locations"]
    terms["location_loss"] = terms["guard_penalty"]
    if model.options.attention == "glimpse":
        terms.update(_glimpse_terms(model, out, targets, token_nll, steps, training=training))
        terms["location_loss"] += terms["reinforce_term"] + terms["baseline_loss"]
        if training and update_baseline_now and "expected_logits" not in out:
            update_baseline(model, terms["reward"])
    return terms


def _step_rewards(model, token_nll, steps):
    """`(reward (batch, T) credited to each step's sample, its mean per credit unit)`."""
    if model.options.reinforce_credit == "token":
        reward = -token_nll                                     # log p(y_t|...)
        return reward, ops.sum(reward) / ops.maximum(ops.sum(steps), 1.0)
    sequence = -ops.sum(token_nll, axis=1)                      # log p(y|l,a), (batch,)
    return ops.expand_dims(sequence, 1) * steps, ops.mean(sequence)


def _glimpse_terms(model, out, targets, token_nll, steps, *, training) -> dict:
    """The glimpse's REINFORCE term against `b + f(h_{t-1})`, and the loss of `f`."""
    denominator = ops.maximum(ops.sum(steps), 1.0)
    reward, mean_reward = _step_rewards(model, token_nll, steps)
    if "expected_logits" in out:
        # log p(y_t) had step t glimpsed at the policy's mean (per word)
        average = -losses.masked_nll(out["expected_logits"], targets)
    else:
        average = ops.where(model.baseline_updates > 0,
                            ops.convert_to_tensor(model.reward_baseline), mean_reward)
    correction = out["baseline"]                                # (batch, T) f(h_{t-1})
    target = ops.stop_gradient(reward - average)
    baseline_loss = ops.sum(ops.square(correction - target) * steps) / denominator
    baseline = ops.stop_gradient(average + correction)
    if training:
        surrogate = losses.reinforce_surrogate(
            reward, baseline, out["sample_log_prob"], model.options.reinforce_lambda)
        reinforce_term = ops.sum(surrogate * steps) / denominator
    else:
        reinforce_term = ops.zeros((), "float32")
    return {"reward": mean_reward, "baseline": ops.sum(baseline * steps) / denominator,
            "reinforce_term": reinforce_term, "baseline_loss": baseline_loss,
            "used_expected_alpha": ops.zeros((), "float32"),
            "sample_log_prob": out["sample_log_prob"]}


def _guard_terms(model, out, steps, *, training) -> dict:
    """The location guard's penalty and rate over real steps; training counts them on the model."""
    denominator = ops.maximum(ops.sum(steps), 1.0)
    fired = ops.sum(out["guard"] * steps)
    if training:
        model.guard_fired.assign(model.guard_fired + fired)
        model.guard_checked.assign(model.guard_checked + ops.sum(steps))
    return {"guard_penalty": ops.sum(out["guard_penalty"] * steps) / denominator,
            "guard_rate": fired / denominator}
