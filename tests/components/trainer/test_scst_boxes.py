"""train.scst_box_attention: object boxes in the SCST batches, the box term (and its keep form) in training, the refusal without boxes."""
from __future__ import annotations

import dataclasses
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from components import trainer
from components.contract import config as config_lib
from components.contract import schema
from components.contract.artifacts import Artifact
from components.contract.object_words import object_words
from components.trainer import scst, train_data
from models import scst as scst_terms
from models.text import RESERVED
from tests.components import test_trainer, trainer_worker
from tests.components.test_trainer import _config, _ctx, _events
from tests.models.tiny import annotations, make_model

source = test_trainer.source  # tiny Annotations without boxes

SCST = dict(epochs=2, objective="scst", scst_epochs=2, scst_samples=3, scst_learning_rate=5e-3,
            scst_require_converged=False, log_every=1)
VOCAB = list(RESERVED) + list(trainer_worker.WORDS)
WORD_IDS = {w: i for i, w in enumerate(VOCAB)}


@pytest.fixture(scope="module")
def boxed(tmp_path_factory):
    """The tiny artifacts with one object (box, colour, kind, size) per image."""
    root = str(tmp_path_factory.mktemp("boxed_source"))
    annotations_uri, vocabulary = trainer_worker.write_tiny_artifacts(root, objects=True)
    return {"root": root, "annotations": Artifact.load(annotations_uri, "Annotations"),
            "vocabulary": Artifact.load(vocabulary, "Vocabulary")}


def test_object_words_name_kinds_colours_sizes_and_categories():
    red_box = object_words({"color": "red", "shape": "square", "size": "large"})
    assert {"red", "square", "squares", "box", "boxes", "large", "big"} <= set(red_box)
    assert "small" not in red_box and "circle" not in red_box
    assert object_words({"shape": "circle"}) == ("circle", "circles", "disc", "discs", "dot",
                                                 "dots")
    assert {"person", "people", "man", "men"} <= set(object_words({"category": "person"}))
    assert object_words({"category": "dining table"}) == ("table", "tables")
    assert "dog" not in object_words({"category": "hot dog"})       # that word names dogs
    assert object_words({"category": "Widget"}) == ("widget", "widgets")  # a dataset's own


def test_object_word_ids_keep_the_vocabulary_words_and_pad():
    ids = train_data.object_word_ids(
        [{"color": "red", "shape": "square", "size": "small"}, {"color": "blue"}], WORD_IDS)
    assert ids.dtype == np.int32 and ids.shape == (2, 3)
    assert sorted(ids[0].tolist()) == sorted(WORD_IDS[w] for w in ("red", "square", "small"))
    assert ids[1].tolist() == [WORD_IDS["blue"], train_data.NO_WORD, train_data.NO_WORD]
    assert train_data.object_word_ids([], WORD_IDS).shape == (0, 1)


def _data(src, **kwargs):
    files = schema.split_files(src["annotations"].uri, "train")
    return train_data.TrainData(files, trainer_worker.GRID, global_batch_size=8, seed=0,
                                shuffle_buffer=64, references=True, **kwargs)


def test_batches_carry_the_boxes_and_naming_words(boxed):
    batches = list(_data(boxed, word_ids=WORD_IDS).dataset(0).take(2).as_numpy_iterator())
    seen = 0
    for batch in batches:
        assert batch["object_boxes"].shape == (8, 1, 4)
        for tokens, box, words in zip(batch["tokens"], batch["object_boxes"],
                                      batch["object_words"], strict=True):
            # The tiny captions name the object's colour and kind: those words are its.
            named = {int(t) for t in tokens} & set(words.ravel().tolist())
            assert len(named) >= 2
            assert (box[0, 2] - box[0, 0]) == pytest.approx(1 / 3 - 0.1, abs=1e-6)
            seen += 1
    assert seen == 16
    plain = next(_data(boxed).dataset(0).as_numpy_iterator())
    assert "object_boxes" not in plain and "object_words" not in plain


def test_records_without_boxes_give_empty_objects(source):
    batch = next(_data(source, word_ids=WORD_IDS).dataset(0).as_numpy_iterator())
    assert batch["object_boxes"].shape == (8, 0, 4) and batch["object_words"].shape[:2] == (8, 0)


def _corner_case():
    """`(scorer, batch, its spec, box_nll(model))`: two images, each with one object in a
    corner cell of the 3x3 grid, named by words 5..10; `box_nll` is a model's box term per
    counted word on the first references, as if sampled."""
    from tests.components.trainer.test_scst import _references
    refs, scorer = _references()
    a = annotations(seed=3, batch=2)
    boxes = np.array([[[0.0, 0.0, 0.3, 0.3]], [[0.7, 0.7, 1.0, 1.0]]], np.float32)
    words = np.array([[[5, 6, 7]], [[8, 9, 10]]], np.int32)
    batch = {"annotations": tf.constant(a), "tokens": tf.constant(refs[:, 0]),
             "references": tf.constant(refs), "object_boxes": tf.constant(boxes),
             "object_words": tf.constant(words)}
    spec = {k: tf.TensorSpec(v.shape, v.dtype) for k, v in batch.items()}
    probe = tf.constant(refs[:, :1, 1:])
    cells = scst_terms.box_cells(boxes, 3, 3)

    def box_nll(model):
        terms = scst_terms.policy_loss_terms(model, a, probe, np.ones((2, 1), np.float32),
                                             None, (words, cells))
        return float(terms["box_nll_sum"]) / float(terms["box_words"])

    return scorer, batch, spec, box_nll


def test_the_box_term_moves_attention_into_the_boxes():
    from components.trainer.scst_step import ScstStepOptions, make_scst_step
    scorer, batch, spec, box_nll = _corner_case()

    def trained(weight):
        model = make_model("soft", seed=0, dropout=0.0)
        optimizer = keras.optimizers.Adam(0.05)
        optimizer.build(model.trainable_variables)
        options = ScstStepOptions(clip_norm=5.0, global_batch_size=2, num_samples=4,
                                  max_length=5, box_attention=weight, grid=(3, 3))
        step = make_scst_step(tf.distribute.get_strategy(), model, optimizer, scorer, options,
                              spec)
        outs = [step(batch, tf.constant([0, i], tf.int64)) for i in range(30)]
        return box_nll(model), outs

    free, free_outs = trained(0.0)
    boxed_nll, outs = trained(1.0)
    assert float(free_outs[-1]["box_words"]) == 0.0     # not computed without the weight
    assert float(outs[0]["box_words"]) > 0
    # -log of the mass in the boxes: a uniform map has 1 of 9 cells, -log(1/9) = 2.2.
    assert boxed_nll < 0.5 * free, (boxed_nll, free)


def test_the_keep_form_holds_the_start_models_grounding():
    from components.trainer.scst_step import ScstStepOptions, make_scst_step
    scorer, batch, spec, box_nll = _corner_case()

    def trained(weight, keep, steps, start=None, anchor=None):
        model = make_model("soft", seed=0, dropout=0.0)
        if start is not None:
            model.set_weights(start.get_weights())
        optimizer = keras.optimizers.Adam(0.05)
        optimizer.build(model.trainable_variables)
        options = ScstStepOptions(clip_norm=5.0, global_batch_size=2, num_samples=4,
                                  max_length=5, box_attention=weight, box_keep=keep, grid=(3, 3))
        step = make_scst_step(tf.distribute.get_strategy(), model, optimizer, scorer, options,
                              spec, anchor=anchor)
        outs = [step(batch, tf.constant([0, i], tf.int64)) for i in range(steps)]
        return model, outs

    fresh = box_nll(make_model("soft", seed=0, dropout=0.0))
    start, _ = trained(1.0, False, 2)        # two steps of the box term: a grounded start
    level = box_nll(start)
    assert level < fresh - 0.5, (level, fresh)
    # CIDEr alone drifts away from the boxes in this toy; the keep form holds the start's level.
    drifted, _ = trained(0.0, False, 30, start=start)
    kept, outs = trained(1.0, True, 30, start=start, anchor=start)
    assert box_nll(drifted) > level + 0.3, (box_nll(drifted), level)
    assert box_nll(kept) <= level, (box_nll(kept), level)
    assert float(outs[0]["box_nll_sum"]) == 0.0 and float(outs[0]["box_words"]) > 0
    assert max(float(o["box_nll_sum"]) for o in outs) > 0   # it acted where words fell below
    # At the start model the term is zero and adds no gradient: the step is CIDEr's alone.
    one_kept, _ = trained(1.0, True, 1, start=start, anchor=start)
    one_free, _ = trained(0.0, False, 1, start=start)
    for x, y in zip(one_kept.get_weights(), one_free.get_weights(), strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-7)
    # Below the start model's grounding it pulls the model up towards it.
    pulled, outs = trained(1.0, True, 30, anchor=start)
    assert float(outs[0]["box_nll_sum"]) > 0
    assert box_nll(pulled) < fresh - 0.5 * (fresh - level), (box_nll(pulled), level, fresh)


def test_the_keep_form_needs_the_start_model():
    from components.trainer.scst_step import ScstStepOptions, make_scst_step
    from tests.components.trainer.test_scst import _references
    _, scorer = _references()
    spec = {"annotations": tf.TensorSpec([2, 9, 16]), "tokens": tf.TensorSpec([2, 5], tf.int32),
            "references": tf.TensorSpec([2, 2, 5], tf.int32),
            "object_boxes": tf.TensorSpec([2, 1, 4]), "object_words": tf.TensorSpec([2, 1, 3], tf.int32)}
    options = ScstStepOptions(clip_norm=5.0, global_batch_size=2, num_samples=2, max_length=5,
                              box_attention=1.0, box_keep=True, grid=(3, 3))
    assert options.reads_start_model
    assert not dataclasses.replace(options, box_attention=0.0).reads_start_model  # term off
    with pytest.raises(ValueError, match="box_keep need the start model"):
        make_scst_step(tf.distribute.get_strategy(), make_model("soft"), None, scorer, options,
                       spec)


def test_the_box_weight_needs_boxes_in_the_batches():
    from components.trainer.scst_step import ScstStepOptions, make_scst_step
    from tests.components.trainer.test_scst import _references
    refs, scorer = _references()
    spec = {"annotations": tf.TensorSpec([2, 9, 16]), "tokens": tf.TensorSpec([2, 5], tf.int32),
            "references": tf.TensorSpec([2, 2, 5], tf.int32)}
    options = ScstStepOptions(clip_norm=5.0, global_batch_size=2, num_samples=2, max_length=5,
                              box_attention=1.0, grid=(3, 3))
    with pytest.raises(ValueError, match="object_boxes"):
        make_scst_step(tf.distribute.get_strategy(), make_model("soft"), None, scorer, options,
                       spec)


def scst_run(src, work_dir: str, capfd, **setting):
    """`(the Model's scst property, the run's stderr, its TensorBoard events)` of a tiny SCST run."""
    ctx = _ctx(src, work_dir, _config(**SCST, **setting))
    props = trainer.run(ctx)["model"]["properties"]
    return (props["scst"], capfd.readouterr().err,
            _events(os.path.join(ctx.outputs["model"], "logs")))


def test_scst_with_the_box_term_trains_and_logs_it(boxed, tmp_path, capfd):
    props, err, events = scst_run(boxed, str(tmp_path), capfd, scst_box_attention=1.0)
    assert props["box_attention"] == 1.0
    assert "box term weight 1" in err
    fraction = [v for _, v in events["scst/box_word_fraction"]]
    nll = [v for _, v in events["scst/box_attention_nll"]]
    assert len(fraction) == 8 and all(0 < f <= 1 for f in fraction)
    assert all(np.isfinite(v) and v > 0 for v in nll)


def test_scst_with_the_keep_form_reads_the_start_model_and_logs_the_excess(boxed, tmp_path,
                                                                          capfd):
    props, err, events = scst_run(boxed, str(tmp_path), capfd, scst_box_attention=1.0,
                                  scst_box_mode="keep")
    assert (props["box_attention"], props["box_mode"]) == (1.0, "keep")
    assert "box term weight 1 (keep: above the start model only)" in err
    excess = [v for _, v in events["scst/box_attention_excess"]]
    assert "scst/box_attention_nll" not in events
    assert len(excess) == 8 and all(np.isfinite(v) and v >= 0 for v in excess)
    assert excess[0] == 0.0   # the first step's model is the start model


def test_the_box_term_is_refused_on_data_without_boxes(source, tmp_path):
    ctx = _ctx(source, str(tmp_path), _config(**SCST, scst_box_attention=1.0))
    with pytest.raises(scst.NoObjectsError, match="train.scst_box_attention=0"):
        trainer.run(ctx)
    assert issubclass(scst.NoObjectsError, config_lib.ConfigError)  # one line from `captioner`
