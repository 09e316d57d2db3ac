"""Config: named configs, overrides, round trips."""
import pytest

from pipeline import config as config_lib
from pipeline.cli import config_reference_markdown


@pytest.mark.parametrize("name", ["tiny", "demo", "coco_paper", "flickr8k"])
def test_named_configs_load(name):
    config = config_lib.load_config(name)
    assert config.name == name
    assert config_lib.from_dict(config_lib.to_dict(config)) == config


def test_coco_paper_uses_the_papers_encoder():
    enc = config_lib.load_config("coco_paper").encoder
    assert (enc.application, enc.layer, enc.weights, enc.image_size) == \
        ("VGG19", "block5_conv4", "imagenet", 224)
    config = config_lib.load_config("coco_paper")
    assert config.preprocess.vocab_max_size == 10000 and config.train.batch_size == 64
    assert config.train.optimizer == "adam"


def test_overrides_are_type_checked():
    config = config_lib.load_config("tiny", ["train.batch_size=8", "model.attention=hard",
                                             "train.jit_compile=true", "train.learning_rate=0.5",
                                             'eval.thresholds={"CIDEr": 1}'])
    assert config.train.batch_size == 8 and config.model.attention == "hard"
    assert config.train.jit_compile is True and config.train.learning_rate == 0.5
    assert config.eval.thresholds == {"CIDEr": 1.0}
    with pytest.raises(config_lib.ConfigError, match="expected an integer"):
        config_lib.load_config("tiny", ["train.batch_size=eight"])
    with pytest.raises(config_lib.ConfigError, match="expected a boolean"):
        config_lib.load_config("tiny", ["train.jit_compile=maybe"])


def test_unknown_keys_list_valid_ones():
    with pytest.raises(config_lib.ConfigError, match="batch_size"):
        config_lib.load_config("tiny", ["train.batchsize=8"])
    with pytest.raises(config_lib.ConfigError, match="train.batch_size"):
        config_lib.load_config("tiny", ["nosuch.key=1"])
    with pytest.raises(config_lib.ConfigError, match="named configs"):
        config_lib.load_config("nosuch")


def test_config_file_path(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("from pipeline.configs.tiny import get_config as base\n"
                    "import dataclasses\n"
                    "def get_config():\n    return dataclasses.replace(base(), name='mine')\n")
    assert config_lib.load_config(str(path)).name == "mine"


def test_reference_lists_every_key():
    text = config_reference_markdown()
    for key in config_lib.valid_keys():
        assert f"`{key}`" in text
