"""Config: named configs, overrides, round trips."""
import pytest

from pipeline import config as config_lib
from pipeline.cli import config_reference_markdown


@pytest.mark.parametrize("name", ["tiny", "demo", "coco_paper", "flickr8k"])
def test_named_configs_load(name):
    config = config_lib.load_config(name)
    assert config.name == name
    assert config_lib.from_dict(config_lib.to_dict(config)) == config


@pytest.mark.parametrize("name", ["tiny", "demo", "scenes", "coco_paper", "flickr8k"])
def test_named_configs_say_what_data_they_were_tuned_on(name):
    import importlib
    doc = importlib.import_module(f"pipeline.configs.{name}").__doc__
    assert "Tuned on:" in doc and "Your own data" in doc


def test_named_configs_bound_the_encoder_instead_of_tuning_its_epochs():
    # Every config that trains the encoder for quality stops it on val mAP;
    # max_epochs is a safety bound (tiny's 2 is a test time budget).
    for name in ("demo", "scenes"):
        enc = config_lib.load_config(name).encoder
        assert enc.kind == "small_cnn" and enc.train
        assert enc.max_epochs >= 30 and enc.patience >= 2, (name, enc)


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


def test_enumerated_values_are_checked_with_the_choices():
    with pytest.raises(config_lib.ConfigError,
                       match=r"model.attention='sfot' is not one of: soft, hard, glimpse, "
                             r"spatial_transformer \(did you mean 'soft'\?\)"):
        config_lib.load_config("tiny", ["model.attention=sfot"])
    with pytest.raises(config_lib.ConfigError, match="did you mean 'cosine'"):
        config_lib.load_config("tiny", ["train.lr_schedule=cosin"])
    with pytest.raises(config_lib.ConfigError, match="data.source='cocoa'.*did you mean 'coco'"):
        config_lib.load_config("tiny", ["data.source=cocoa"])
    with pytest.raises(config_lib.ConfigError, match="train.objective='sctt'.*did you mean 'scst'"):
        config_lib.load_config("tiny", ["train.objective=sctt"])


def test_scst_settings_are_checked_together():
    with pytest.raises(config_lib.ConfigError, match="scst_baseline=mean .*scst_samples >= 2"):
        config_lib.load_config("tiny", ["train.objective=scst", "train.scst_baseline=mean",
                                        "train.scst_samples=1"])
    with pytest.raises(config_lib.ConfigError, match="scst_epochs >= 1"):
        config_lib.load_config("tiny", ["train.objective=scst", "train.scst_epochs=0"])
    config = config_lib.load_config("tiny", ["train.objective=scst"])
    assert (config.train.scst_baseline, config.train.scst_samples) == ("greedy", 5)
    for key in ("train.scst_attention_kl", "train.scst_xe_weight", "train.scst_box_attention",
                "train.scst_size_reward"):
        with pytest.raises(config_lib.ConfigError,
                           match=f"{key}=-0.5: the self-critical weights are 0"):
            config_lib.load_config("tiny", [f"{key}=-0.5"])
        with pytest.raises(config_lib.ConfigError, match="self-critical weights"):
            config_lib.load_config("tiny", [f"{key}=nan"])
    assert config_lib.load_config("tiny", ["train.scst_attention_kl=1"]).train.scst_attention_kl == 1
    with pytest.raises(config_lib.ConfigError, match="scst_box_mode=keep .*scst_box_attention above 0"):
        config_lib.load_config("tiny", ["train.scst_box_mode=keep"])
    with pytest.raises(config_lib.ConfigError, match="'kept' is not one of: raise, keep"):
        config_lib.load_config("tiny", ["train.scst_box_mode=kept"])
    assert config_lib.load_config("tiny", ["train.scst_box_mode=keep",
                                           "train.scst_box_attention=0.3"]).train.scst_box_mode == "keep"
    for key in ("train.patience", "train.scst_patience"):
        with pytest.raises(config_lib.ConfigError, match="or 0 for no early stopping"):
            config_lib.load_config("tiny", [f"{key}=-1"])
    assert config_lib.load_config("tiny", []).train.scst_patience == 0
    for bad in ("-1.0", "nan", "inf"):
        with pytest.raises(config_lib.ConfigError,
                           match=f"train.scst_average_epochs={bad}: the time constant"):
            config_lib.load_config("tiny", [f"train.scst_average_epochs={bad}"])
    assert config_lib.load_config(
        "tiny", ["train.scst_average_epochs=2.5"]).train.scst_average_epochs == 2.5


def test_min_delta_must_not_be_negative():
    with pytest.raises(config_lib.ConfigError, match="train.min_delta=-0.1"):
        config_lib.load_config("tiny", ["train.min_delta=-0.1"])
    assert config_lib.load_config("tiny", []).train.min_delta == 1e-4


def test_threshold_metrics_are_the_evaluators():
    with pytest.raises(config_lib.ConfigError,
                       match=r"no metric 'BLEU4'.*Bleu_1, .*CIDEr.*did you mean 'Bleu_4'"):
        config_lib.load_config("tiny", ['eval.thresholds={"BLEU4": 0.5}'])
    with pytest.raises(config_lib.ConfigError, match="only for data.source=synthetic"):
        config_lib.load_config("tiny", ["data.source=tfds", 'eval.thresholds={"grounding": 0.1}'])
    config = config_lib.load_config("tiny", ['eval.thresholds={"CIDEr": 0.1, "grounding": 0.2}'])
    assert set(config.eval.thresholds) == {"CIDEr", "grounding"}
    with pytest.raises(config_lib.ConfigError,
                       match=r"dangling_ending_rate is reported, never a threshold.*Bleu_1, "):
        config_lib.load_config("tiny", ['eval.thresholds={"dangling_ending_rate": 0.1}'])


def test_misspelled_sections_and_keys_get_a_suggestion():
    with pytest.raises(config_lib.ConfigError, match="'trian.epochs' .*did you mean 'train.epochs'"):
        config_lib.load_config("tiny", ["trian.epochs=3"])
    with pytest.raises(config_lib.ConfigError, match="did you mean 'epochs'"):
        config_lib.load_config("tiny", ["train.epoch=3"])
    with pytest.raises(config_lib.ConfigError, match="did you mean 'tiny'"):
        config_lib.load_config("tinny")


@pytest.mark.parametrize("overrides, message", [
    (["model.reinforce_baseline=expected"], "needs model.reinforce_credit=token"),
    (["data.min_objects=3", "data.max_objects=2"], "min_objects <= max_objects"),
    (["data.max_objects=5"], "max_objects <= 3 for data.source=synthetic"),
    (["data.source=scenes", "data.max_objects=9"], "max_objects <= 8 for data.source=scenes"),
    (["data.val_fraction=0.5", "data.test_fraction=0.5"], "leave images for train"),
    (["encoder.grid_size=5"], "times a power of two"),
    (["train.batch_size=0"], "train.batch_size=0 must be at least 1"),
    (["encoder.max_epochs=0"], "encoder.max_epochs=0 must be at least 1"),
    (["encoder.patience=0"], "encoder.patience=0 must be at least 1"),
    (["preprocess.min_batch_size=100"], "above preprocess.max_batch_size"),
])
def test_cross_key_rules(overrides, message):
    with pytest.raises(config_lib.ConfigError, match=message):
        config_lib.load_config("tiny", overrides)


def test_choices_match_what_the_stages_accept():
    from components.example_gen.sources import SOURCES
    from components.trainer import distribute, train_data
    from models import hard_attention, objective, show_attend_tell
    choices = config_lib.CHOICES
    assert choices["data.source"] == tuple(SOURCES)
    from components.synthetic import scenes
    assert config_lib.MAX_OBJECTS == {"synthetic": 3, "scenes": scenes.MAX_OBJECTS}
    assert choices["model.attention"] == show_attend_tell.ATTENTIONS
    assert choices["model.hard_inference"] == hard_attention.INFERENCE_MODES
    assert choices["model.reinforce_credit"] == objective.REINFORCE_CREDITS
    assert choices["model.reinforce_baseline"] == objective.REINFORCE_BASELINES
    assert choices["train.strategy"] == distribute.STRATEGIES
    assert choices["train.cache"] == train_data.CACHE_SETTINGS
    from models import scst
    assert choices["train.scst_baseline"] == scst.BASELINES
    for name in config_lib.named_configs():  # every shipped config passes
        config_lib.load_config(name)


def test_check_paths(tmp_path):
    coco = config_lib.load_config("tiny", ["data.source=coco"])
    with pytest.raises(config_lib.ConfigError, match="needs data.captions_json"):
        config_lib.check_paths(coco)
    config_lib.check_paths(coco, stages=["Trainer"])  # ExampleGen does not run
    captions = tmp_path / "captions.json"
    captions.write_text("{}")
    missing_dir = config_lib.load_config("tiny", ["data.source=coco",
                                                  f"data.captions_json={captions}",
                                                  f"data.images_dir={tmp_path / 'nope'}"])
    with pytest.raises(config_lib.ConfigError,
                       match=r"data.images_dir=.*nope': expected a folder \(it does not exist\)"):
        config_lib.check_paths(missing_dir)
    with pytest.raises(config_lib.ConfigError, match=r"data.captions_json=.*\(it is a folder\)"):
        config_lib.check_paths(config_lib.load_config(
            "tiny", ["data.source=karpathy", f"data.captions_json={tmp_path}"]))
    with pytest.raises(config_lib.ConfigError,
                       match=r"train.init_model=.*: expected a Model folder or .keras file"):
        config_lib.check_paths(config_lib.load_config(
            "tiny", ["train.objective=scst", f"train.init_model={tmp_path / 'nope'}"]))
    config_lib.check_paths(config_lib.load_config("tiny", [f"train.init_model={tmp_path}"]))
    with pytest.raises(config_lib.ConfigError, match="data.tfds_data_dir"):
        config_lib.check_paths(config_lib.load_config(
            "tiny", ["data.source=tfds", f"data.tfds_data_dir={tmp_path / 'x'}"]))
    with pytest.raises(config_lib.ConfigError, match="encoder.weights"):
        config_lib.check_paths(config_lib.load_config(
            "tiny", ["encoder.kind=keras_app", f"encoder.weights={tmp_path / 'w.h5'}"]))
    config_lib.check_paths(config_lib.load_config(
        "tiny", ["encoder.kind=keras_app", "encoder.weights=imagenet"]))
    config_lib.check_paths(config_lib.load_config(
        "tiny", ["data.source=coco", f"data.captions_json={captions}",
                 f"data.images_dir={tmp_path}"]))


def test_config_differences():
    a = config_lib.load_config("tiny")
    b = config_lib.load_config("tiny", ["train.epochs=5", 'eval.thresholds={"CIDEr": 0.1}'])
    assert config_lib.config_differences(a, b) == [
        "train.epochs: 2 -> 5", 'eval.thresholds: {"Bleu_4": 0.0} -> {"CIDEr": 0.1}']
    assert config_lib.config_differences(a, a) == []
