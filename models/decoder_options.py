"""The decoder's settings: one frozen dataclass, checked once (no TensorFlow import).

`ShowAttendTell` takes a `DecoderOptions`. Its fields, with their defaults,
allowed values (`CHOICES`) and one-line help, are the declaration the
pipeline's `model` config section is generated from
(`components.contract.config.ModelConfig`), except that the config has
`expected_alpha_warmup_epochs` where this has `expected_alpha_warmup`
minibatches, and the grid's height and width and `annotation_gradients` are
not config keys. The
config check calls `check_options` too, so a bad value is reported before
any stage runs, with the same message.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

ATTENTIONS = ("soft", "hard", "glimpse", "spatial_transformer")
# Attentions that weigh the grid cells with a softmax of scores (`models.attention_scorer`).
SCORED = ("soft", "hard")
# Attentions that place a window at a location (`models.grid_sampling`).
LOCATED = ("glimpse", "spatial_transformer")
SCORES = ("additive", "general", "dot", "concat")
INFERENCE_MODES = ("expected", "argmax")
REINFORCE_CREDITS = ("sequence", "token")
REINFORCE_BASELINES = ("moving_average", "expected")
TRANSFORMS = ("attention", "affine")
# Smallest glimpse std: the REINFORCE gradient of the mean is `(l - mu) / std^2`.
MIN_GLIMPSE_STD = 1e-3


def _option(default: Any, help: str):
    """A `DecoderOptions` field: its default and its one-line help (the config reference's)."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class DecoderOptions:
    """Everything that shapes a `ShowAttendTell` but the vocabulary and the seed.

    Attributes:
      embedding_dim: `m`, word embedding and deep-output width.
      hidden_dim: `n`, LSTM width.
      attention_dim: width of the attention MLP (soft and hard, additive and
        concat scores) and of the location-wise attentions' networks.
      attention: `"soft"`, `"hard"` (Xu et al. 2015), `"glimpse"` (location-wise
        hard, Mnih et al. 2014) or `"spatial_transformer"` (location-wise soft,
        Jaderberg et al. 2015); docs/attention.md.
      attention_score: soft and hard only: `"additive"` (the paper's MLP),
        `"general"`, `"dot"` or `"concat"` (Luong et al. 2015).
      dropout: rate on the deep-output vector.
      use_gate: soft and spatial_transformer: multiply the context by `beta_t`.
      doubly_stochastic_lambda: soft only (section 4.2.1): weight of
        `sum_i (1 - sum_t alpha_ti)^2`. The sampling attentions' objective
        (equation 12) has no such term, and it would fight what REINFORCE
        learns: it is smallest when the words' attention covers every region,
        while a policy that pays off looks at the named objects. A spatial
        transformer's map is its window, and the term widens every window
        towards the whole grid, away from the objects (docs/attention.md).
      entropy_lambda: hard only: `lambda_e`, weight of the entropy bonus.
      reinforce_lambda: hard and glimpse: `lambda_r`, weight of the REINFORCE term.
      expected_alpha_prob: hard only: probability per minibatch of training
        with the expected context instead of a sample.
      expected_alpha_warmup: hard only: the first this many training
        minibatches use the expected context. Sampling from the near-uniform
        alpha of a fresh model feeds the LSTM random background regions, it
        learns to ignore the context, and the attention never sharpens.
      baseline_decay: hard and glimpse: decay of the moving-average reward baseline.
      reinforce_credit: hard and glimpse: the reward each sampled location is
        credited with. `"sequence"` (the paper's equation 12): the caption's
        `log p(y | s, a)` for every step's sample. `"token"`: step t's sample
        gets `log p(y_t | ...)` of the word it helped emit; lower variance,
        biased (it ignores the sample's effect on later words).
      reinforce_baseline: hard and glimpse: `"moving_average"` (the paper:
        `b <- decay * b + (1 - decay) * mean reward`) or `"expected"` (needs
        token credit: step t's `log p(y_t)` had it used the expected context,
        for glimpse the glimpse at the policy's mean, from the same `h_{t-1}`,
        with the same dropout mask). The glimpse adds a learned correction
        `f(h_{t-1})` (RAM's learned baseline), regressed onto what `b` misses.
      hard_inference: hard only: `"expected"` or `"argmax"` context at inference.
      annotation_gradients: back-propagate into the annotations (to fine-tune
        an encoder end to end). Off by default: the annotations are fixed CNN
        features, as in the paper.
      glimpse_std: glimpse: standard deviation of the location policy, in grid
        coordinates (the grid spans [-1, 1]); at least `MIN_GLIMPSE_STD`.
      glimpse_patches: glimpse: `k`, patches per glimpse.
      glimpse_size: glimpse: `g`, samples per side of each patch.
      glimpse_scale: glimpse: `s`, how much wider each patch is than the last.
      transform: spatial_transformer: `"attention"` (`[[s, 0, t_x], [0, s, t_y]]`)
        or `"affine"` (the full 2x3 transform).
      transform_scale: spatial_transformer: the initial window's half-width
        in grid coordinates (1 = the whole grid).
      transform_scale_min, transform_scale_max: spatial_transformer: the
        guard's range of the window's scale.
      location_channels: glimpse and spatial_transformer: numbers per grid
        cell in the coarse map of the image the location network reads
        beside `h_{t-1}` (0: `h_{t-1}` alone, as RAM).
      grid_height, grid_width: the annotation grid (0: square, from `L`).
    """
    embedding_dim: int = _option(128, 'word embedding size m')
    hidden_dim: int = _option(256, 'LSTM size n')
    attention_dim: int = _option(128, 'hidden size of the attention MLP f_att')
    attention: str = _option("soft", 'soft | hard | glimpse (location-wise hard, RAM) | spatial_transformer (location-wise soft)')
    attention_score: str = _option("additive", 'soft/hard: additive (paper) | general | dot | concat (Luong et al. 2015)')
    dropout: float = _option(0.3, 'dropout on the deep output layer')
    use_gate: bool = _option(True, 'beta_t gating scalar (section 4.2.1)')
    doubly_stochastic_lambda: float = _option(1.0, 'soft only: lambda of sum_i (1 - sum_t alpha_ti)^2 (section 4.2.1)')
    entropy_lambda: float = _option(0.01, 'hard attention entropy bonus lambda_e')
    reinforce_lambda: float = _option(1.0, 'hard attention lambda_r')
    expected_alpha_prob: float = _option(0.5, 'hard: P(use expected alpha) per minibatch')
    expected_alpha_warmup: int = _option(0, 'hard: the first this many training minibatches use the expected context (the config gives it in epochs)')
    baseline_decay: float = _option(0.9, 'hard: REINFORCE moving-average baseline decay')
    reinforce_credit: str = _option("sequence", 'hard: sequence (paper: log p(y|s,a) per sample) | token (log p(y_t))')
    reinforce_baseline: str = _option("moving_average", 'hard: moving_average (paper) | expected (per word: log p(y_t) with the expected context; token credit)')
    hard_inference: str = _option("expected", 'expected | argmax')
    annotation_gradients: bool = _option(False, 'back-propagate into the annotations (fine-tune an encoder end to end)')
    glimpse_std: float = _option(0.1, 'glimpse: std of the location policy in grid coordinates ([-1, 1]); >= 0.001')
    glimpse_patches: int = _option(2, 'glimpse: k patches per glimpse')
    glimpse_size: int = _option(3, 'glimpse: g x g samples per patch')
    glimpse_scale: float = _option(2.0, 'glimpse: each patch s times wider than the last')
    transform: str = _option("attention", 'spatial_transformer: attention ([[s,0,tx],[0,s,ty]]) | affine (full 2x3)')
    transform_scale: float = _option(0.5, 'spatial_transformer: initial window half-width in grid coordinates (1 = whole grid)')
    transform_scale_min: float = _option(0.1, "spatial_transformer: the guard's smallest window scale")
    transform_scale_max: float = _option(1.0, "spatial_transformer: the guard's largest window scale")
    location_channels: int = _option(4, 'glimpse/spatial_transformer: per-cell numbers of the image map the location network reads (0 = the LSTM state only)')
    grid_height: int = _option(0, "the annotation grid's height (0: square, from L)")
    grid_width: int = _option(0, "the annotation grid's width (0: square, from L)")

    def __post_init__(self):
        check_options(dataclasses.asdict(self))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "DecoderOptions":
        """The options of `values` (unknown keys are an error)."""
        unknown = set(values) - FIELDS
        if unknown:
            raise ValueError(f"unknown decoder options: {sorted(unknown)}")
        return cls(**values)

    @property
    def hard(self) -> bool:
        return self.attention == "hard"

    @property
    def located(self) -> bool:
        """Glimpse or spatial transformer: a window at a location."""
        return self.attention in LOCATED

    @property
    def samples(self) -> bool:
        """Hard or glimpse: trained with REINFORCE on sampled locations."""
        return self.attention in ("hard", "glimpse")

    @property
    def doubly_stochastic(self) -> bool:
        """Soft attention: the objective adds the doubly stochastic penalty."""
        return self.attention == "soft"

    @property
    def gated(self) -> bool:
        return self.use_gate and self.attention in ("soft", "spatial_transformer")


FIELDS = frozenset(f.name for f in dataclasses.fields(DecoderOptions))

# Fields whose values come from a fixed list (the pipeline config's `model.*` CHOICES).
CHOICES = {"attention": ATTENTIONS, "attention_score": SCORES,
           "hard_inference": INFERENCE_MODES, "reinforce_credit": REINFORCE_CREDITS,
           "reinforce_baseline": REINFORCE_BASELINES, "transform": TRANSFORMS}


def check_options(values: Mapping[str, Any]) -> None:
    """Checks option values (any subset of the fields, e.g. a config section's).

    Args:
      values: field -> value.
    Raises:
      ValueError: the first problem, naming the field (`name=value ...`).
    """
    def get(name):
        return values.get(name, DEFAULTS[name])

    for name, choices in CHOICES.items():
        if get(name) not in choices:
            raise ValueError(f"{name}={get(name)!r} is not one of: {', '.join(choices)}")
    attention = get("attention")
    if get("attention_score") != "additive" and attention not in SCORED:
        raise ValueError(f"attention_score={get('attention_score')!r} scores the grid cells of "
                         f"soft and hard attention; attention={attention!r} places a window "
                         "(leave attention_score=additive)")
    if get("reinforce_baseline") == "expected" and get("reinforce_credit") != "token":
        raise ValueError("reinforce_baseline='expected' is a per-word baseline: it needs "
                         "reinforce_credit='token'")
    if not get("glimpse_std") >= MIN_GLIMPSE_STD:
        raise ValueError(f"glimpse_std={get('glimpse_std')} must be at least {MIN_GLIMPSE_STD}: "
                         "the REINFORCE gradient (l - mu) / std^2 overflows (the references "
                         "use 0.05-0.11 on a [-1, 1] grid)")
    for name in ("glimpse_patches", "glimpse_size"):
        if get(name) < 1:
            raise ValueError(f"{name}={get(name)} must be at least 1")
    if get("glimpse_scale") < 1.0:
        raise ValueError(f"glimpse_scale={get('glimpse_scale')} must be at least 1 "
                         "(each patch as wide as the last, or wider)")
    low, start, high = (get(f"transform_scale{s}") for s in ("_min", "", "_max"))
    if not 0.0 < low <= start <= high:
        raise ValueError(f"need 0 < transform_scale_min <= transform_scale <= "
                         f"transform_scale_max, got {low}, {start}, {high}")
    if get("location_channels") < 0:
        raise ValueError(f"location_channels={get('location_channels')} must be >= 0")


DEFAULTS = {f.name: f.default for f in dataclasses.fields(DecoderOptions)}
