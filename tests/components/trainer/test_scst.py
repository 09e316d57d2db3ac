"""train.objective=scst: cross-entropy, then self-critical training; from a Model; the guard rails."""
from __future__ import annotations

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from components import trainer
from components.contract import config as config_lib
from components.trainer import checkpointing, scst
from components.trainer.scst_step import MEAN_KEYS, SUM_KEYS, ScstStepOptions, make_scst_step
from models.cider_d import CiderD
from models.decoding import greedy_decode
from tests.components import test_trainer
from tests.components.test_trainer import _config, _ctx, _events
from tests.models.tiny import annotations, make_model

source = test_trainer.source  # the tiny Annotations and Vocabulary (a module-scoped fixture)

# Two tiny epochs of cross-entropy (4 steps each), then SCST.
SCST = dict(epochs=2, objective="scst", scst_epochs=2, scst_samples=3, scst_learning_rate=5e-3,
            scst_require_converged=False)


def test_cross_entropy_then_scst_exports_the_best_cider_model(source, tmp_path, capfd):
    ctx = _ctx(source, str(tmp_path), _config(**SCST))
    props = trainer.run(ctx)["model"]["properties"]
    log = capfd.readouterr().err
    assert "self-critical training (SCST): 3 samples per image, greedy baseline" in log
    assert "CIDEr-D reward" in log and "32 training images" in log
    assert props["objective"] == "scst" and props["best_metric_name"] == "cider"
    assert props["steps"] == 8                      # the SCST phase's own steps
    info = props["scst"]
    assert info["epochs"] == 2 and info["samples"] == 3 and info["baseline"] == "greedy"
    assert info["start"].endswith(os.path.join("work", "best.keras"))
    assert info["best_cider"] == props["best_metric"] and info["best_cider"] >= 0
    phases = [row.get("phase", "xe") for row in props["history"]]
    assert phases == ["xe", "xe", "scst", "scst"]
    assert all("cider" in row for row in props["history"][2:])
    out = ctx.outputs["model"]
    with open(os.path.join(out, "history.jsonl")) as f:
        assert [json.loads(line).get("phase", "xe") for line in f] == phases
    events = _events(os.path.join(out, "logs"))
    for tag in ("scst/reward", "scst/baseline", "scst/greedy_reward", "scst/sample_entropy",
                "scst/positive_advantage_fraction", "val/cider", "train/loss"):
        assert tag in events, sorted(events)
    assert all(v >= 0 for _, v in events["scst/reward"])
    # The exported best model is the best SCST epoch, or the start model when none beat it.
    best = keras.saving.load_model(os.path.join(out, "best.keras"))
    xe_best = keras.saving.load_model(os.path.join(ctx.work_dir, "best.keras"))
    same = checkpointing.weights_digest(best) == checkpointing.weights_digest(xe_best)
    assert same == (info["best_epoch"] == -1)
    with open(os.path.join(ctx.work_dir, "scst", "start.json")) as f:
        start = json.load(f)
    assert start["xe_epochs"] == 2 and start["start_cider"] == info["start_cider"] >= 0
    assert f"SCST start: val CIDEr {info['start_cider']:.4f}" in log


def test_scst_from_a_model_artifact_refuses_an_unconverged_start(source, tmp_path, capfd):
    xe = _ctx(source, str(tmp_path / "xe"), _config(epochs=2, learning_rate=1e-2))
    trainer.run(xe)
    model_dir = xe.outputs["model"]
    strict = dict(SCST, init_model=model_dir, scst_require_converged=True)
    with pytest.raises(scst.NotConvergedError, match="train.scst_require_converged=false"):
        trainer.run(_ctx(source, str(tmp_path / "strict"), _config(**strict)))
    # `captioner` prints config errors as one line, exit code 2.
    assert issubclass(scst.NotConvergedError, config_lib.ConfigError)
    capfd.readouterr()
    loose = _ctx(source, str(tmp_path / "loose"),
                 _config(**dict(strict, scst_require_converged=False, scst_epochs=1,
                                scst_baseline="mean")))
    props = trainer.run(loose)["model"]["properties"]
    log = capfd.readouterr().err
    assert "warning: SCST needs a converged cross-entropy model" in log
    assert "[Trainer] stopped at step" not in log          # no cross-entropy phase
    assert "self-critical phase stopped at step 4" in log
    assert props["scst"]["start"] == os.path.join(model_dir, "best.keras")
    assert props["steps"] == 4 and props["scst"]["baseline"] == "mean"
    assert [row.get("phase", "xe") for row in props["history"]] == ["xe", "xe", "scst"]


@pytest.mark.parametrize("helps", [False, True])
def test_the_start_model_is_exported_unless_an_scst_epoch_beats_it(source, tmp_path,
                                                                  monkeypatch, helps):
    from components.trainer import validation
    calls = []

    def cider(self):  # the start model's score first, then each epoch's
        n = len(calls)
        calls.append(n)
        return 0.1 * (n + 1) if helps else 1.0 - 0.1 * n

    monkeypatch.setattr(validation.Validator, "cider", cider)
    ctx = _ctx(source, str(tmp_path), _config(**SCST))
    props = trainer.run(ctx)["model"]["properties"]
    assert len(calls) == 3 and props["scst"]["start_cider"] == pytest.approx(0.1 if helps else 1.0)
    best = keras.saving.load_model(os.path.join(ctx.outputs["model"], "best.keras"))
    xe_best = keras.saving.load_model(os.path.join(ctx.work_dir, "best.keras"))
    same = checkpointing.weights_digest(best) == checkpointing.weights_digest(xe_best)
    if helps:
        assert props["scst"]["best_epoch"] == 1 and props["best_metric"] == pytest.approx(0.3)
        assert not same
    else:
        assert props["scst"]["best_epoch"] == -1 and props["best_metric"] == pytest.approx(1.0)
        assert same


def test_the_weight_average_is_validated_and_exported(source, tmp_path, monkeypatch, capfd):
    from components.trainer import validation
    validated = []

    def cider(self):  # rising: the last epoch is the best; notes the weights it scores
        validated.append(checkpointing.weights_digest(self.model))
        return 0.1 * len(validated)

    monkeypatch.setattr(validation.Validator, "cider", cider)
    # 4 steps per epoch: a time constant of 1 epoch is a momentum of 1 - 1/4.
    ctx = _ctx(source, str(tmp_path), _config(**SCST, scst_average_epochs=1))
    props = trainer.run(ctx)["model"]["properties"]
    assert "a weight average over 1 epochs validated (EMA momentum 0.75000)" in capfd.readouterr().err
    assert props["scst"]["average_epochs"] == 1 and props["scst"]["best_epoch"] == 1
    out = ctx.outputs["model"]
    final = keras.saving.load_model(os.path.join(out, "model.keras"))
    best = keras.saving.load_model(os.path.join(out, "best.keras"))
    assert checkpointing.weights_digest(final) == checkpointing.weights_digest(best) == validated[-1]
    # The checkpoint keeps the trained weights, which the average is not.
    trained = keras.saving.load_model(os.path.join(out, "model.keras"))
    tf.train.Checkpoint(model=trained).restore(
        tf.train.latest_checkpoint(os.path.join(out, "checkpoints"))).expect_partial()
    assert checkpointing.weights_digest(trained) != validated[-1]


@pytest.mark.parametrize("scores, scst_epochs, patience, best_epoch", [
    # Three epochs under the start (more than the patience of 2), then a gain,
    # then 2 epochs without one: patience counted from the gain only.
    ([0.5, 0.6, 0.7, 1.2, 1.1, 1.1], 8, 2, 3),
    # No epoch beats the start: the phase trains to train.scst_epochs, the start kept.
    ([0.5, 0.6, 0.7, 0.8], 4, 2, -1),
    # No early stopping (the default): an early best does not end the phase.
    ([1.2, 1.1, 1.1, 1.1, 1.3, 1.2], 6, 0, 4),
])
def test_patience_counts_from_the_first_epoch_that_beats_the_start(
        source, tmp_path, monkeypatch, capfd, scores, scst_epochs, patience, best_epoch):
    from components.trainer import validation
    calls = []

    def cider(self):  # the start model's 1.0, then each epoch's score
        calls.append(len(calls))
        return ([1.0] + scores)[len(calls) - 1]

    monkeypatch.setattr(validation.Validator, "cider", cider)
    # train.patience is the cross-entropy phase's; the SCST phase has its own.
    config = _config(**dict(SCST, scst_epochs=scst_epochs, scst_patience=patience, patience=1))
    props = trainer.run(_ctx(source, str(tmp_path), config))["model"]["properties"]
    log = capfd.readouterr().err
    assert len(calls) == 1 + len(scores) and props["scst"]["epochs"] == len(scores)
    assert props["scst"]["best_epoch"] == best_epoch
    under_start = sum(score <= 1.0 for score in scores[:best_epoch if best_epoch >= 0 else None])
    assert log.count("not yet beaten; patience counts from the first epoch that beats it") == (
        under_start if patience else 0)
    assert ("early stopping: cider did not improve" in log) == (best_epoch >= 0 and patience > 0)
    announced = (f"stopping after {patience} epochs without a gain" if patience
                 else "the best val CIDEr epoch kept (no early stopping)")
    assert announced in log


def test_the_scst_learning_rate_is_constant_or_cosine_decayed_over_the_phase():
    constant = scst.scst_learning_rate(config_lib.TrainConfig(scst_learning_rate=5e-4), 100)
    assert constant == 5e-4
    cosine = scst.scst_learning_rate(
        config_lib.TrainConfig(scst_learning_rate=5e-4, scst_lr_schedule="cosine"), 100)
    assert float(cosine(0)) == pytest.approx(5e-4)
    assert float(cosine(50)) == pytest.approx(2.5e-4, rel=1e-5)
    assert float(cosine(100)) == pytest.approx(0.0, abs=1e-12)


def test_a_cosine_scst_phase_decays_its_learning_rate_to_the_epoch_limit(source, tmp_path,
                                                                         capfd):
    ctx = _ctx(source, str(tmp_path), _config(**SCST, scst_lr_schedule="cosine", log_every=1))
    props = trainer.run(ctx)["model"]["properties"]
    assert "learning rate 0.005 (cosine)" in capfd.readouterr().err
    assert props["scst"]["lr_schedule"] == "cosine"
    rates = dict(_events(os.path.join(ctx.outputs["model"], "logs"))["scst/learning_rate"])
    # 2 epochs of 4 steps: the rate read after step s is 5e-3 * (1 + cos(pi * s / 8)) / 2.
    for step, rate in rates.items():
        assert rate == pytest.approx(2.5e-3 * (1 + np.cos(np.pi * step / 8)), rel=1e-4), rates
    assert rates[max(rates)] < 1e-3 < 4e-3 < rates[min(rates)]


def test_convergence_rule():
    rows = [{"epoch": 0, "val_loss": 2.0}, {"epoch": 1, "val_loss": 1.5}]
    assert not scst.convergence(rows)[0]
    assert scst.convergence(rows + [{"epoch": 2, "val_loss": 1.499}])[0]
    assert scst.convergence(rows + [{"epoch": 2, "val_loss": 1.6}])[0]
    assert scst.convergence(rows, "early stopping: val_loss did not improve for 3 epochs")[0]
    assert scst.convergence(rows[:1])[0]      # nothing to compare: not checked


class _Interrupted(Exception):
    pass


def test_interrupted_scst_resumes_from_its_checkpoint(source, tmp_path, capfd, monkeypatch):
    # With the attention anchor: the resumed phase anchors on the start model,
    # not on the checkpoint it resumes from.
    from components.trainer.loop import TrainingLoop
    anchored = _config(**SCST, scst_attention_kl=0.5, log_every=1)
    end_epoch = TrainingLoop._end_epoch

    def end_then_die(self, epoch, epoch_start):
        reason = end_epoch(self, epoch, epoch_start)   # validates and checkpoints the epoch
        if self.phase.name == scst.PHASE_DIR:          # the SCST phase's first epoch
            raise _Interrupted
        return reason

    monkeypatch.setattr(TrainingLoop, "_end_epoch", end_then_die)
    with pytest.raises(_Interrupted):
        trainer.run(_ctx(source, str(tmp_path), anchored))
    monkeypatch.undo()
    capfd.readouterr()
    ctx = _ctx(source, str(tmp_path), anchored)
    props = trainer.run(ctx)["model"]["properties"]
    log = capfd.readouterr().err
    assert "training finished in an earlier attempt" in log        # the cross-entropy phase
    assert "resuming from step 4" in log                           # the SCST phase
    assert "converged" not in log                                  # checked only at the start
    assert props["steps"] == 8 and props["resumed_from_step"] == 4
    assert [row.get("phase", "xe") for row in props["history"]] == ["xe", "xe", "scst", "scst"]
    assert props["scst"]["attention_kl"] == 0.5 and "attention anchor weight 0.5" in log
    kl = dict(_events(os.path.join(ctx.outputs["model"], "logs"))["scst/attention_kl"])
    assert kl[1] == pytest.approx(0.0, abs=1e-5)   # the first step: the model is the start model
    assert kl[5] > 1e-4                            # resumed: 4 steps away from the start


def _references():
    refs = np.array([[[1, 5, 6, 7, 2], [1, 5, 6, 2, 0]],
                     [[1, 8, 9, 2, 0], [1, 8, 9, 10, 2]]], np.int32)
    words = [[list(r[1:][(r[1:] != 2) & (r[1:] != 0)]) for r in image] for image in refs]
    return refs, CiderD.from_references(words, 20)


def _scst_step(model, batch, scorer, baseline="greedy", xe_weight=0.0, learning_rate=0.05,
               attention_kl=0.0, anchor=None):
    optimizer = keras.optimizers.Adam(learning_rate)
    optimizer.build(model.trainable_variables)
    spec = {k: tf.TensorSpec(v.shape, v.dtype) for k, v in batch.items()}
    options = ScstStepOptions(clip_norm=5.0, global_batch_size=2, num_samples=4, max_length=5,
                              baseline=baseline, xe_weight=xe_weight, attention_kl=attention_kl)
    return make_scst_step(tf.distribute.get_strategy(), model, optimizer, scorer, options, spec,
                          anchor=anchor)


@pytest.mark.parametrize("attention,baseline", [("soft", "greedy"), ("hard", "mean")])
def test_scst_steps_raise_the_greedy_captions_cider(attention, baseline):
    model = make_model(attention, seed=0, dropout=0.0)
    refs, scorer = _references()
    a = annotations(seed=3, batch=2)
    batch = {"annotations": tf.constant(a), "tokens": tf.constant(refs[:, 0]),
             "references": tf.constant(refs)}

    def greedy_cider():
        tokens = greedy_decode(model, a, 5)["tokens"].numpy()[:, None]
        return float(np.mean(scorer(tokens, refs).numpy()))

    before = greedy_cider()
    step = _scst_step(model, batch, scorer, baseline=baseline)
    results = [{k: float(v) for k, v in step(batch, tf.constant([0, i], tf.int64)).items()}
               for i in range(60)]
    assert set(results[0]) == set(SUM_KEYS) | set(MEAN_KEYS)
    assert results[0]["samples"] == 8.0 and results[0]["examples"] == 2.0
    rewards = [r["reward_sum"] / r["samples"] for r in results]
    assert np.mean(rewards[-10:]) > np.mean(rewards[:10]) + 0.5
    assert greedy_cider() > before + 0.5


def test_the_mixed_in_cross_entropy_changes_the_update():
    refs, scorer = _references()
    a = annotations(seed=3, batch=2)
    batch = {"annotations": tf.constant(a), "tokens": tf.constant(refs[:, 0]),
             "references": tf.constant(refs)}
    digests = []
    for weight in (0.0, 1.0):
        model = make_model("soft", seed=0, dropout=0.0)
        out = _scst_step(model, batch, scorer, xe_weight=weight)(batch, tf.constant([0, 0], tf.int64))
        assert (float(out["num_tokens"]) > 0) and ((float(out["nll_sum"]) > 0) == (weight > 0))
        digests.append(checkpointing.weights_digest(model))
    assert digests[0] != digests[1]


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_the_attention_anchor_keeps_the_maps_near_the_start_models(attention):
    from models import scst as scst_terms
    refs, scorer = _references()
    a = annotations(seed=3, batch=2)
    batch = {"annotations": tf.constant(a), "tokens": tf.constant(refs[:, 0]),
             "references": tf.constant(refs)}
    probe = tf.constant(refs[:, :1, 1:])  # the first references, as if sampled

    def drift(weight):
        model = make_model(attention, seed=0, dropout=0.0)
        start = make_model(attention, seed=0, dropout=0.0)
        start.set_weights(model.get_weights())
        start.trainable = False
        step = _scst_step(model, batch, scorer, attention_kl=weight,
                          anchor=start if weight > 0 else None)
        outs = [step(batch, tf.constant([0, i], tf.int64)) for i in range(30)]
        kl = scst_terms.policy_loss_terms(
            model, a, probe, np.ones((2, 1), np.float32),
            scst_terms.teacher_forced_attention(start, a, probe))["attention_kl_sum"]
        return float(kl), outs

    free, free_outs = drift(0.0)
    anchored, outs = drift(1.0)
    assert float(outs[0]["attention_kl_sum"]) == pytest.approx(0.0, abs=1e-5)  # starts equal
    assert float(free_outs[-1]["attention_kl_sum"]) == 0.0  # not computed without the anchor
    assert float(outs[-1]["attention_kl_sum"]) > 0.0
    assert anchored < 0.5 * free, (anchored, free)


def test_the_anchor_weight_needs_the_start_model():
    refs, scorer = _references()
    batch = {"annotations": tf.constant(annotations(seed=3, batch=2)),
             "tokens": tf.constant(refs[:, 0]), "references": tf.constant(refs)}
    with pytest.raises(ValueError, match="anchor"):
        _scst_step(make_model("soft", seed=0), batch, scorer, attention_kl=1.0)


@pytest.mark.slow
def test_scst_under_mirrored_on_two_logical_cpus(source, tmp_path):
    tf.constant(0.0) + 1.0  # TF runs here: run() trains `mirrored` in a child process
    # With the weight average: swapped in and out of mirrored variables.
    config = _config(**dict(SCST, epochs=1, scst_epochs=1, strategy="mirrored",
                            cpu_logical_devices=2, scst_average_epochs=1))
    props = trainer.run(_ctx(source, str(tmp_path), config))["model"]["properties"]
    assert props["replicas"] == 2 and props["objective"] == "scst"
    assert props["scst"]["average_epochs"] == 1
    assert props["steps"] == 4 and props["scst"]["epochs"] == 1
    assert [row.get("phase", "xe") for row in props["history"]] == ["xe", "scst"]
    assert np.isfinite(props["final_loss"]) and props["scst"]["final_reward"] >= 0


def test_init_model_loads_matching_weights_and_names_a_mismatch(tmp_path):
    from components.trainer import model_setup
    from pipeline.config import ModelConfig
    small = ModelConfig(embedding_dim=8, hidden_dim=16, attention_dim=8)
    saved = model_setup.build_model(small, 18, [3, 3, 8], seed=1)
    path = str(tmp_path / "m.keras")
    saved.save(path)
    same = model_setup.build_model(small, 18, [3, 3, 8], seed=2)
    assert model_setup.load_weights(same, path) == path
    assert checkpointing.weights_digest(same) == checkpointing.weights_digest(saved)
    wider = model_setup.build_model(ModelConfig(embedding_dim=8, hidden_dim=32, attention_dim=8),
                                    18, [3, 3, 8])
    with pytest.raises(ValueError, match="same vocabulary and grid with the same model config"):
        model_setup.load_weights(wider, path)
    other_vocab = model_setup.build_model(small, 25, [3, 3, 8])
    with pytest.raises(ValueError, match="train.init_model="):
        model_setup.load_weights(other_vocab, path)


def test_a_relative_init_model_is_made_absolute_before_training(source, tmp_path, monkeypatch):
    from components.trainer import phases
    seen = {}
    monkeypatch.setattr(phases, "train", lambda *args, **kwargs: seen.setdefault("config", args[2]))
    monkeypatch.chdir(tmp_path)
    ctx = _ctx(source, str(tmp_path), _config(init_model="runs/model"))
    trainer.run(ctx)
    assert seen["config"].train.init_model == str(tmp_path / "runs" / "model")
    with open(os.path.join(ctx.work_dir, "config.json")) as f:
        assert json.load(f)["train"]["init_model"] == str(tmp_path / "runs" / "model")
