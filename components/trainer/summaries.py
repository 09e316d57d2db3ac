"""The Trainer's TensorBoard summaries: each phase's step scalars, attention images and captions.

Scalars, the flushing writer and the plugin metadata come from
`components.contract.summary_writer` (shared with the EncoderTrainer); each entry
carries TensorBoard's plugin metadata (scalars, images, text), so the event
files read as if written by `tf.summary.scalar` and friends.
"""
from __future__ import annotations

from components.contract.summary_writer import (  # noqa: F401  (the Trainer's modules use them from here)
    FLUSH_SECONDS,
    file_writer,
    scalar_value,
    summary_metadata,
    summary_scalar,
    write_scalars,
)


def summary_image(tag: str, image, step: int) -> None:
    """A TensorBoard image from a (1, H, W, 1|3) float image in [0, 1] (PNG-encoded)."""
    import tensorflow as tf
    pixels = tf.cast(tf.round(tf.clip_by_value(image[0], 0.0, 1.0) * 255.0), tf.uint8)
    height, width = int(pixels.shape[0]), int(pixels.shape[1])
    tensor = tf.stack([tf.constant(str(width)), tf.constant(str(height)),
                       tf.image.encode_png(pixels)])
    tf.summary.write(tag, tensor, step=step, metadata=summary_metadata("images"))


def summary_text(tag: str, text: str, step: int) -> None:
    """A TensorBoard text entry."""
    import tensorflow as tf
    tf.summary.write(tag, tf.constant(text), step=step, metadata=summary_metadata("text"))


def write_step_summaries(writer, step: int, out: dict, optimizer, *, hard: bool,
                         throughput: float, wait_fraction: float, located: bool = False) -> None:
    """The `train/*` scalars of one step.

    Args:
      writer: a `tf.summary` writer.
      step: the global step.
      out: the step's results (`step.SUM_KEYS` and `step.MEAN_KEYS`, floats).
      optimizer: for the current learning rate.
      hard: hard attention or glimpse: also the REINFORCE terms.
      throughput: examples per second so far.
      wait_fraction: the share of step time spent waiting for input.
      located: a location-wise attention: also the share of steps its guard clamped.
    """
    tokens = max(out["num_tokens"], 1.0)
    values = {
        "train/loss": out["loss"],
        "train/nll": out["nll_sum"] / tokens,
        "train/attention_penalty": out["penalty_sum"] / max(out["examples"], 1.0),
        "train/attention_entropy": out["entropy_sum"] / tokens,
        "train/grad_norm": out["grad_norm"],
        "train/learning_rate": scalar_value(optimizer.learning_rate),
        "train/examples_per_second": throughput,
        "train/input_wait_fraction": wait_fraction,
    }
    if hard:
        for key in ("baseline", "reward", "reinforce_term", "used_expected_alpha"):
            values[f"train/{key}"] = out[key]
    if located:
        values["train/guard_rate"] = out["guard_rate"]
    if out["loss_scale"] != 1.0:
        values["train/loss_scale"] = out["loss_scale"]
    write_scalars(writer, values, step)


def write_scst_summaries(writer, step: int, out: dict, optimizer, *, throughput: float,
                         tcfg) -> None:
    """The `scst/*` scalars of one self-critical step.

    Args:
      writer: a `tf.summary` writer.
      step: the global step.
      out: the step's results (`scst_step.SUM_KEYS` and `scst_step.MEAN_KEYS`, floats).
      optimizer: for the current learning rate.
      throughput: examples per second so far.
      tcfg: the `train` section: with `scst_baseline=greedy` also the greedy
        captions' reward; `scst_xe_weight` above 0, the mixed-in
        cross-entropy's NLL; `scst_attention_kl` above 0, the anchor's mean KL
        per word; `scst_box_attention` above 0, the box term per word it
        counts (`scst/box_attention_nll`, or with `scst_box_mode=keep`
        `scst/box_attention_excess`, the excess over the start model's) and
        the fraction of sampled words it counts; `scst_size_reward`
        above 0, the fraction of the samples' size words that are true and
        how many each sample says (`scst/reward` includes the size reward).
    """
    samples = max(out["samples"], 1.0)
    words = max(out["sample_tokens"], 1.0)
    values = {
        "scst/loss": out["loss"],
        "scst/reward": out["reward_sum"] / samples,
        "scst/baseline": out["baseline_sum"] / samples,
        "scst/positive_advantage_fraction": out["positive_advantage"] / samples,
        "scst/sample_entropy": out["entropy_sum"] / words,
        "scst/sample_nll": out["sample_nll_sum"] / words,
        "scst/sample_length": words / samples,
        "scst/grad_norm": out["grad_norm"],
        "scst/learning_rate": scalar_value(optimizer.learning_rate),
        "scst/examples_per_second": throughput,
    }
    if tcfg.scst_baseline == "greedy":
        values["scst/greedy_reward"] = out["greedy_reward_sum"] / max(out["examples"], 1.0)
    if tcfg.scst_xe_weight > 0:
        values["scst/xe_nll"] = out["nll_sum"] / max(out["num_tokens"], 1.0)
    if tcfg.scst_attention_kl > 0:
        values["scst/attention_kl"] = out["attention_kl_sum"] / words
    if tcfg.scst_box_attention > 0:
        key = "excess" if tcfg.scst_box_mode == "keep" else "nll"
        values[f"scst/box_attention_{key}"] = out["box_nll_sum"] / max(out["box_words"], 1.0)
        values["scst/box_word_fraction"] = out["box_words"] / words
    if tcfg.scst_size_reward > 0:
        values["scst/size_word_accuracy"] = out["size_correct"] / max(out["size_words"], 1.0)
        values["scst/size_words_per_caption"] = out["size_words"] / samples
    write_scalars(writer, values, step)
