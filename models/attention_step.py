"""The decoder's attention at one step: which layer, what it reads and returns, the context.

`ShowAttendTell` treats its four attention types alike through these
functions: a layer for `options.attention` (`make_layer`), one step of it
from `h_{t-1}` (`attend`), the context `z_t` it gives (`context`) and the
per-step values the time loop records (`records`).
"""
from __future__ import annotations

from keras import ops

from models.decoder_options import DecoderOptions
from models.glimpse_attention import GlimpseAttention
from models.hard_attention import HardAttention
from models.soft_attention import SoftAttention
from models.spatial_transformer_attention import SpatialTransformerAttention


def make_layer(options: DecoderOptions, policy, seed: int | None):
    """The attention layer of `options.attention`, named `attention`, in `policy`."""
    o, units = options, options.attention_dim
    grid = (o.grid_height, o.grid_width)
    if o.attention == "hard":
        return HardAttention(units, score=o.attention_score, inference=o.hard_inference,
                             seed=seed, dtype=policy, name="attention")
    if o.attention == "glimpse":
        return GlimpseAttention(units, grid, std=o.glimpse_std,
                                retina=(o.glimpse_patches, o.glimpse_size, o.glimpse_scale),
                                channels=o.location_channels, seed=seed, dtype=policy,
                                name="attention")
    if o.attention == "spatial_transformer":
        return SpatialTransformerAttention(
            units, grid, form=o.transform, scale=o.transform_scale,
            scale_min=o.transform_scale_min, scale_max=o.transform_scale_max,
            channels=o.location_channels, dtype=policy, name="attention")
    return SoftAttention(units, score=o.attention_score, dtype=policy, name="attention")


def records(options: DecoderOptions, compute_dtype) -> dict:
    """What a step of the time loop records, name -> dtype (besides `h` and `z`)."""
    o = options
    recorded = {"alpha": "float32"}
    if o.gated:
        recorded["beta"] = compute_dtype
    if o.samples:
        recorded["sample_log_prob"] = "float32"
    if o.located:
        recorded.update(location="float32", guard="float32", guard_penalty="float32")
    if o.attention == "glimpse":
        recorded["baseline"] = "float32"
    return recorded


def attend(model, h, seq, per_step=None) -> dict:
    """Attention of one step of `model` from `h_{t-1}`.

    Args:
      model: the `ShowAttendTell`.
      h: (batch, n) `h_{t-1}`.
      seq: the pass's `recurrence.SequenceInputs`.
      per_step: this step's slice of the loop's inputs (`noise`, `score_offset`).
    Returns:
      dict: `alpha` (batch, L) the map; `weights`, what the context is the
      weighted sum of (None where the layer gives the `context` itself);
      `beta` (batch, 1) (None without a gate); and the layer's other
      values (`records`).
    """
    layer, options = model.attention_layer, model.options
    per_step = per_step or {}
    noise = per_step.get("noise")
    if options.attention == "glimpse":
        attended = layer.attend(seq.projected, h, seq.mask, training=seq.training,
                                noise=noise, expected=seq.counterfactual)
        attended["weights"] = None
    elif options.attention == "spatial_transformer":
        attended = layer.attend(seq.projected, h, seq.mask)
        attended["weights"] = attended["alpha"]
    else:
        offset = per_step.get("score_offset")
        alpha, log_alpha = layer.attention_weights(seq.projected, h, seq.mask, offset)
        attended = {"alpha": alpha, "weights": alpha}
        if offset is not None:
            attended["query"] = layer.query(h, seq.projected.dtype)
        if options.hard:
            attended["weights"], _, attended["sample_log_prob"] = layer.select(
                alpha, log_alpha, training=seq.training, use_expected=seq.use_expected,
                noise=noise)
    attended["beta"] = model.gate(h) if options.gated else None
    return attended


def context(model, attended, annotations):
    """`z_t` (batch, D) of `attend`'s result, gated by `beta_t` where there is a gate.

    With weights, the gate scales them: `z_t = sum_i (beta_t w_i) a_i` is
    `beta_t sum_i w_i a_i` with an L-wide product each step, and in its
    gradient, instead of a D-wide one (D = 2048 against L = 64 at the
    paper's sizes).
    """
    beta, weights = attended["beta"], attended["weights"]
    if weights is None:
        z = attended["context"]
        return z if beta is None else beta * z
    if beta is not None:
        weights = ops.cast(beta, weights.dtype) * weights
    return model.attention_layer.weighted_context(weights, annotations)
