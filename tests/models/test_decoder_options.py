"""DecoderOptions and the `model.*` config keys of the attention types: in step, checked early."""
import dataclasses

import pytest

from models import decoder_options
from models.decoder_options import DecoderOptions
from pipeline import config as config_lib
from pipeline.config import ModelConfig


def test_the_model_config_section_is_the_decoder_options():
    config_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    # The config counts the warmup in epochs; the grid comes from the data.
    assert config_fields - {"expected_alpha_warmup_epochs"} == decoder_options.FIELDS - {
        "expected_alpha_warmup", "annotation_gradients", "grid_height", "grid_width"}
    declared = {f.name: f for f in dataclasses.fields(DecoderOptions)}
    for field in dataclasses.fields(ModelConfig):
        if field.name in declared:  # default and help come from the one declaration
            assert declared[field.name].default == field.default, field.name
            assert field.metadata["help"] == declared[field.name].metadata["help"], field.name
        assert field.metadata["help"], field.name
    choices = config_lib.CHOICES
    assert choices["model.attention"] == decoder_options.ATTENTIONS
    assert choices["model.attention_score"] == decoder_options.SCORES
    assert choices["model.transform"] == decoder_options.TRANSFORMS


@pytest.mark.parametrize("attention,score", [
    ("soft", "additive"), ("soft", "general"), ("soft", "dot"), ("soft", "concat"),
    ("hard", "general"), ("glimpse", "additive"), ("spatial_transformer", "additive")])
def test_every_attention_type_is_reachable_from_the_command_line(attention, score):
    config = config_lib.load_config("scenes", [f"model.attention={attention}",
                                               f"model.attention_score={score}"])
    assert (config.model.attention, config.model.attention_score) == (attention, score)


@pytest.mark.parametrize("overrides,message", [
    (["model.attention=glimpses"], "model.attention='glimpses' is not one of.*glimpse"),
    (["model.attention_score=bilinear"], "model.attention_score='bilinear' is not one of"),
    (["model.attention=glimpse", "model.attention_score=general"],
     "model.attention_score='general' scores the grid cells of soft and hard"),
    (["model.attention=glimpse", "model.glimpse_std=0.0001"],
     r"model.glimpse_std=0.0001 must be at least 0.001"),
    (["model.glimpse_patches=0"], "model.glimpse_patches=0 must be at least 1"),
    (["model.glimpse_scale=0.5"], "model.glimpse_scale=0.5 must be at least 1"),
    (["model.transform=projective"], "model.transform='projective' is not one of"),
    (["model.transform_scale=1.5"], "transform_scale_min <= transform_scale <= "
                                    "transform_scale_max"),
    (["model.transform_scale_min=0"], "0 < transform_scale_min"),
    (["model.location_channels=-1"], "model.location_channels=-1 must be >= 0"),
])
def test_bad_values_are_refused_before_any_stage_runs(overrides, message):
    with pytest.raises(config_lib.ConfigError, match=message):
        config_lib.load_config("tiny", overrides)


def test_the_model_checks_the_same_rules():
    with pytest.raises(ValueError, match="glimpse_std"):
        DecoderOptions(attention="glimpse", glimpse_std=1e-4)
    with pytest.raises(ValueError, match="unknown decoder options"):
        DecoderOptions.from_mapping({"attention": "soft", "glimpse_stdev": 0.1})
    options = DecoderOptions(attention="glimpse")
    assert options.samples and options.located and not options.gated and not options.hard
    assert DecoderOptions(attention="spatial_transformer").gated
