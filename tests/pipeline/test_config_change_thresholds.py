"""Config: `eval.change_thresholds`, the Blessing's bounds on the change from the pushed model."""
import pytest

from components.contract import config as components_config
from pipeline import config as config_lib
from pipeline.cli import config_reference_markdown


def test_defaults_bound_every_blessing_metric():
    bounds = components_config.EvalConfig().change_thresholds
    assert set(bounds) == set(components_config.EVAL_METRICS)
    assert all(b == {"relative": -0.05} for m, b in bounds.items()
               if m in components_config.CAPTION_METRICS)
    assert all(b == {"absolute": -0.03} for m, b in bounds.items()
               if m in components_config.GROUNDING_METRICS)
    # a fresh dict each time: a frozen config never shares a mutable default
    assert components_config.EvalConfig().change_thresholds is not bounds


def test_set_parses_nested_json():
    config = config_lib.load_config("tiny", [
        'eval.change_thresholds={"CIDEr": {"relative": -0.1, "absolute": -1},'
        ' "relation_accuracy": {"absolute": -0.03}}'])
    assert config.eval.change_thresholds == {"CIDEr": {"relative": -0.1, "absolute": -1.0},
                                             "relation_accuracy": {"absolute": -0.03}}
    assert config_lib.from_dict(config_lib.to_dict(config)) == config


@pytest.mark.parametrize("value, message", [
    ('{"CIDer": {"relative": -0.1}}', "no metric 'CIDer'.*did you mean 'CIDEr'"),
    ('{"CIDEr": {"relativ": -0.1}}', "unknown bound 'relativ'.*did you mean 'relative'"),
    ('{"CIDEr": {"relative": "x"}}', "CIDEr.relative must be a finite number"),
    ('{"CIDEr": {"relative": true}}', "CIDEr.relative must be a finite number"),
    ('{"CIDEr": -0.1}', 'CIDEr needs {"absolute": number}'),
    ('{"CIDEr": {}}', 'CIDEr needs {"absolute": number}'),
    ('{"dangling_ending_rate": {"absolute": 0}}', "reported, never compared"),
    ('[1]', "expected a JSON object"),
    ('{"CIDEr": ', "expected a JSON object"),
])
def test_set_errors_say_what_is_wrong(value, message):
    with pytest.raises(config_lib.ConfigError, match=message):
        config_lib.load_config("tiny", [f"eval.change_thresholds={value}"])


def test_grounding_bounds_only_for_boxed_sources():
    with pytest.raises(config_lib.ConfigError, match="grounding is computed only for"):
        config_lib.load_config("tiny", ["data.source=tfds",
                                        'eval.change_thresholds={"grounding": {"absolute": -0.1}}'])
    # the defaults name the grounding metrics too, and do not stop a source without boxes
    assert "grounding" in config_lib.load_config("coco_paper").eval.change_thresholds
    assert config_lib.load_config("tiny", ["data.source=tfds"]).eval.change_thresholds


def test_a_config_file_is_checked_the_same_way(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("from pipeline.configs.tiny import get_config as base\n"
                    "import dataclasses\n"
                    "def get_config():\n"
                    "    c = base()\n"
                    "    ev = dataclasses.replace(c.eval,\n"
                    "                             change_thresholds={'Bleu_4': {'rel': 1}})\n"
                    "    return dataclasses.replace(c, eval=ev)\n")
    with pytest.raises(config_lib.ConfigError, match="unknown bound 'rel'"):
        config_lib.load_config(str(path))


def test_the_reference_documents_the_key():
    line = next(row for row in config_reference_markdown().splitlines()
                if row.startswith("| `eval.change_thresholds` |"))
    assert '"CIDEr": {"relative": -0.05}' in line and "95% confidence" in line
    assert "eval.max_regression" not in config_lib.valid_keys()
