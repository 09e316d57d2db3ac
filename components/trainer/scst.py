"""The self-critical phase as a `Phase` value (Rennie et al. 2017; `train.objective=scst`; docs/scst.md), and its start checks.

It starts from a converged cross-entropy model: the best model of this run's
cross-entropy phase, or `train.init_model`. The start is refused when that
model's validation loss still fell by `CONVERGED_DELTA` or more in its last
epoch (`train.scst_require_converged`): SCST from an unconverged model is
where users see CIDEr fall. It then trains `train.scst_epochs` epochs with a
fresh Adam at `train.scst_learning_rate`, validates greedy captions' CIDEr-D
each epoch, keeps the best (`scst/best.keras`) and stops early on it. Its
checkpoints, history and best model live in `<work_dir>/scst/`; its
TensorBoard scalars in `<work_dir>/logs/scst`. The start model competes as
epoch -1 (its val CIDEr is recorded in `scst/start.json`): an SCST epoch
replaces it only by beating it. The phase is a value run by the one
`loop.TrainingLoop`, not a subclass of it.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os

from components.contract import config as config_lib
from components.contract import schema
from components.contract.object_words import phrase_role
from components.trainer import averaging, checkpointing, summaries
from components.trainer.phase import Handoff, LoopSetup, Phase
from components.trainer.scst_step import ScstStepOptions

PHASE_DIR = "scst"
# The smallest relative val_loss drop of a last epoch that counts as "still improving".
CONVERGED_DELTA = 0.01


class NotConvergedError(config_lib.ConfigError):
    """The cross-entropy model SCST would start from is still improving.

    A config error: the fix is `train.epochs`, `train.patience` or
    `train.scst_require_converged`, and `captioner` prints it as one line.
    """


def convergence(history: list[dict], stop_reason: str = "") -> tuple[bool, str]:
    """Whether cross-entropy training had converged, and why (for the log).

    Args:
      history: epoch rows with `val_loss` (`checkpointing.read_history`).
      stop_reason: how the cross-entropy phase ended ("early stopping: ..."
        counts as converged).
    Returns:
      `(converged, reason)`; without two validated epochs the answer is
      `True` with a reason saying it could not be checked.
    """
    if stop_reason.startswith("early stopping"):
        return True, stop_reason
    losses = [row["val_loss"] for row in history if row.get("val_loss") is not None]
    if len(losses) < 2:
        return True, "not checked (fewer than two validated epochs)"
    before, last = min(losses[:-1]), losses[-1]
    drop = (before - last) / max(abs(before), 1e-12)
    reason = (f"val_loss {before:.4f} -> {last:.4f} in the last epoch "
              f"({100 * drop:+.2f}% drop; converged below {100 * CONVERGED_DELTA:.0f}%)")
    return drop < CONVERGED_DELTA, reason


def start_history(init_model: str, work_dir: str) -> list[dict]:
    """The cross-entropy history of the start model: `init_model`'s own, else this run's."""
    if init_model:
        folder = init_model if os.path.isdir(init_model) else os.path.dirname(init_model)
        return checkpointing.read_history(folder)
    return checkpointing.read_history(work_dir)


def start_from_model(init_model: str, work_dir: str) -> Handoff:
    """The `Handoff` of a cross-entropy model trained elsewhere (`train.init_model`)."""
    from components.trainer.model_setup import start_file
    return Handoff(start=start_file(init_model), history=tuple(start_history(init_model, work_dir)))


def scst_phase(setup: LoopSetup, handoff: Handoff, *, annotations_uri: str) -> Phase:
    """The self-critical `Phase`, started from the model of `handoff`.

    Checks the start (`train.scst_require_converged`) before the costly setup,
    unless the phase already has a checkpoint, and builds the CIDEr-D reward
    of the training references.

    Args:
      setup: the run's `LoopSetup` (with the cross-entropy inputs).
      handoff: the start model, its cross-entropy epoch rows, why that phase
        stopped (`""` when it ran elsewhere).
      annotations_uri: the Annotations folder (the training references).
    Returns:
      The `Phase`.
    Raises:
      NotConvergedError: see `check_start`.
    """
    config, role, say = setup.config, setup.role, setup.say
    tcfg = config.train
    start, history = handoff.start, list(handoff.history)
    phase_dir = os.path.join(setup.work_dir, PHASE_DIR)
    if role.is_chief and not os.path.exists(
            os.path.join(phase_dir, schema.CHECKPOINTS_DIR, "checkpoint")):
        check_start(config, history, handoff.stop_reason, say)  # before the costly setup
    scorer, longest = build_scorer(annotations_uri, setup.inputs.vocab_size, say)
    if tcfg.scst_box_attention > 0:
        check_objects(annotations_uri, "bbox", "train.scst_box_attention")
    if tcfg.scst_size_reward > 0:
        check_objects(annotations_uri, "size", "train.scst_size_reward")
    max_length = tcfg.scst_max_length or longest + 1
    inputs = scst_inputs(setup.inputs, config)
    roles = word_roles(setup.inputs.id_to_word) if tcfg.scst_size_reward > 0 else ()
    options = ScstStepOptions.from_config(tcfg, max_length, inputs.grid_shape, roles)
    announce = (f"self-critical training (SCST): {tcfg.scst_samples} samples per image, "
                f"{tcfg.scst_baseline} baseline, CIDEr-D reward (document frequencies of "
                f"{scorer.num_documents} training images, {scorer.num_keys} n-grams), "
                f"captions up to {max_length} words, learning rate "
                f"{tcfg.scst_learning_rate:g} ({tcfg.scst_lr_schedule}), cross-entropy weight {tcfg.scst_xe_weight:g}, "
                f"attention anchor weight {tcfg.scst_attention_kl:g}, "
                f"box term weight {tcfg.scst_box_attention:g}"
                f"{' (keep: above the start model only)' if options.box_keep else ''}, "
                f"size reward {tcfg.scst_size_reward:g}, "
                f"{_averaging(tcfg, inputs.steps_per_epoch)}, "
                f"{inputs.steps_per_epoch} steps/epoch x {tcfg.scst_epochs} epochs, "
                f"{_stopping(tcfg)}")
    return Phase(
        name=PHASE_DIR, folder=PHASE_DIR, inputs=inputs,
        make_optimizer=functools.partial(_make_optimizer, tcfg, inputs.steps_per_epoch),
        init_weights=functools.partial(_init_weights, start=start),
        make_step=functools.partial(_make_step, tcfg=tcfg, scorer=scorer,
                                    options=options,
                                    make_anchor=functools.partial(
                                        _make_anchor, config=config, inputs=setup.inputs,
                                        start=start)),
        announce=(announce,) if role.is_chief else (),
        write_summaries=functools.partial(_write_summaries, tcfg=tcfg),
        progress=f"Trainer ({PHASE_DIR})", stopped="self-critical phase stopped",
        epochs=tcfg.scst_epochs, total_steps=inputs.steps_per_epoch * tcfg.scst_epochs,
        metric="cider", patience=tcfg.scst_patience, first_candidate=_no_warmup,
        epochs_key="train.scst_epochs", start_competes=True,
        on_start_scored=functools.partial(_start_scored, say=say, chief=role.is_chief,
                                          phase_dir=phase_dir, start=start, history=history),
        history_tag=PHASE_DIR, earlier_history=tuple(history),
        properties=functools.partial(_properties, tcfg=tcfg, start=start, phase_dir=phase_dir,
                                     max_length=max_length, scorer=scorer))


def scst_learning_rate(tcfg, total_steps: int):
    """`train.scst_learning_rate`, constant or cosine-decayed to 0 over `total_steps`.

    Args:
      tcfg: the `TrainConfig`.
      total_steps: the phase's step limit (`train.scst_epochs` epochs).
    Returns:
      A float, or a Keras `CosineDecay` schedule (driven by the optimizer's
      step count, which checkpoints keep, so a resumed phase continues it).
    """
    import dataclasses

    from components.trainer.model_setup import learning_rate_schedule
    return learning_rate_schedule(dataclasses.replace(
        tcfg, learning_rate=tcfg.scst_learning_rate, lr_schedule=tcfg.scst_lr_schedule,
        warmup_steps=0), total_steps)


def _make_optimizer(tcfg, steps_per_epoch: int):
    """A fresh Adam (`FusedAdam`) on `scst_learning_rate`, keeping the weight average of
    `train.scst_average_epochs`; loss scaling for mixed_float16."""
    import keras

    from components.trainer.fused_adam import FusedAdam
    ema = averaging.momentum(tcfg.scst_average_epochs, steps_per_epoch)
    optimizer = FusedAdam(scst_learning_rate(tcfg, steps_per_epoch * tcfg.scst_epochs),
                          use_ema=tcfg.scst_average_epochs > 0, ema_momentum=ema)
    if tcfg.mixed_precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def _stopping(tcfg) -> str:
    """The announcement's words for `train.scst_patience`."""
    if tcfg.scst_patience <= 0:
        return "the best val CIDEr epoch kept (no early stopping)"
    return (f"the best val CIDEr epoch kept, stopping after {tcfg.scst_patience} epochs "
            f"without a gain")


def _averaging(tcfg, steps_per_epoch: int) -> str:
    """The announcement's words for `train.scst_average_epochs`."""
    if tcfg.scst_average_epochs <= 0:
        return "the last step's weights validated"
    return (f"a weight average over {tcfg.scst_average_epochs:g} epochs validated (EMA momentum "
            f"{averaging.momentum(tcfg.scst_average_epochs, steps_per_epoch):.5f})")


def _init_weights(model, chief: bool, say, *, start: str) -> None:
    """The weights of the start model (a worker other than the chief may get the chief's)."""
    from components.trainer.model_setup import load_weights
    if not os.path.exists(start) and not chief:
        return  # a worker other than the chief gets the chief's weights
    load_weights(model, start)
    say(f"SCST starts from {start}")


def _make_anchor(strategy, *, config, inputs, start: str):
    """The frozen start model whose attention anchors SCST's (`train.scst_attention_kl`,
    `train.scst_box_mode=keep`).

    Built in the strategy's scope and loaded from `start` on every worker (a
    resumed phase's model holds its checkpoint's weights, not the start's).
    """
    from components.trainer.model_setup import build_model, load_weights
    if not os.path.exists(start):
        raise FileNotFoundError(
            f"train.scst_attention_kl > 0 and train.scst_box_mode=keep read the start model "
            f"{start} on every worker, "
            "and this worker cannot: put the pipeline root on storage all workers share")
    with strategy.scope():
        anchor = build_model(config.model, inputs.vocab_size, inputs.grid_shape,
                             seed=config.train.seed, steps_per_epoch=inputs.steps_per_epoch)
    load_weights(anchor, start)
    anchor.trainable = False
    return anchor


def _make_step(strategy, model, optimizer, element_spec, *, tcfg, scorer,
               options: ScstStepOptions, make_anchor):
    """`run_step(batch, step)`: the self-critical step, sampling seeded by `(train.seed, step)`."""
    import tensorflow as tf

    from components.trainer.scst_step import make_scst_step
    anchor = make_anchor(strategy) if options.reads_start_model else None
    step_fn = make_scst_step(strategy, model, optimizer, scorer,
                             options, element_spec,
                             anchor=anchor)

    def run_step(batch, step: int) -> dict:
        seed = tf.constant([tcfg.seed, step], tf.int64)
        return {k: float(v) for k, v in step_fn(batch, seed).items()}

    return run_step


def _write_summaries(writer, step: int, out: dict, *, model, optimizer, timing, tcfg) -> None:
    """The `scst/*` scalars of one step."""
    summaries.write_scst_summaries(writer, step, out, optimizer,
                                   throughput=timing.throughput(), tcfg=tcfg)


def _no_warmup(model) -> int:
    """Every SCST epoch is a best-model candidate."""
    return 0


def _start_scored(cider: float | None, *, say, chief: bool, phase_dir: str, start: str,
                  history: list[dict]) -> None:
    """Logs the start model's val CIDEr and writes `start.json` (chief)."""
    if cider is not None:
        say(f"SCST start: val CIDEr {cider:.4f} (greedy captions); an SCST epoch "
            "replaces the start model only by beating it")
    if chief:
        write_start_record(phase_dir, start, history, cider)


def _properties(state, final: dict, *, tcfg, start: str, phase_dir: str, max_length: int,
                scorer) -> dict:
    """The Model's `scst` property: the phase's start, settings, best epoch and last reward."""
    return {"scst": {
        "start": start, "epochs": int(state.epoch.numpy()),
        "steps": int(state.step.numpy()), "best_cider": best_metric(state),
        "best_epoch": int(state.best_epoch.numpy()), "samples": tcfg.scst_samples,
        "start_cider": read_start_record(phase_dir).get("start_cider"),
        "baseline": tcfg.scst_baseline, "xe_weight": tcfg.scst_xe_weight,
        "attention_kl": tcfg.scst_attention_kl, "box_attention": tcfg.scst_box_attention,
        "box_mode": tcfg.scst_box_mode,
        "size_reward": tcfg.scst_size_reward, "average_epochs": tcfg.scst_average_epochs,
        "learning_rate": tcfg.scst_learning_rate, "lr_schedule": tcfg.scst_lr_schedule,
        "max_length": max_length,
        "reward": "CIDEr-D", "document_frequency_images": scorer.num_documents,
        "final_reward": (final["reward_sum"] / max(final["samples"], 1.0)
                         if final else None)}}


def scst_inputs(inputs, config):
    """The cross-entropy `TrainInputs` with a dataset that also yields every reference.

    With `train.scst_box_attention` or `train.scst_size_reward` above 0 the
    batches also carry the objects' boxes and naming words
    (`train_data.with_objects`).
    """
    tcfg = config.train
    word_ids = ({w: i for i, w in enumerate(inputs.id_to_word)}
                if tcfg.scst_box_attention > 0 or tcfg.scst_size_reward > 0 else None)
    data = dataclasses.replace(inputs.data, references=True, bucket_by_length=False,
                               word_ids=word_ids)
    return dataclasses.replace(inputs, data=data,
                               total_steps=inputs.steps_per_epoch * config.train.scst_epochs)


def build_scorer(annotations_uri: str, vocab_size: int, log):
    """`(CiderD of the training references, longest reference in words)`."""
    from components.trainer import train_data
    from models.cider_d import CiderD
    references = train_data.read_references(schema.split_files(annotations_uri, "train"))
    scorer = CiderD.from_references(references, vocab_size)
    longest = max((len(r) for refs in references for r in refs), default=1)
    log(f"SCST reward: CIDEr-D with the document frequencies of {len(references)} training "
        f"images ({scorer.num_keys} distinct n-grams); longest reference {longest} words")
    return scorer, longest


def word_roles(id_to_word) -> tuple[int, ...]:
    """Per word id, its index in `models.scst.PHRASE_ROLES` (`object_words.phrase_role`)."""
    from models.scst import PHRASE_ROLES
    return tuple(PHRASE_ROLES.index(phrase_role(w)) for w in id_to_word)


# Train records read for objects before the box term or the size reward starts.
OBJECT_CHECK_RECORDS = 256
# What each check looks for, and the data that has it.
_OBJECT_NEEDS = {
    "bbox": ("object boxes", "the synthetic sources, or COCO with data.instances_json"),
    "size": ("object sizes", "the synthetic sources, shapes or scenes"),
}


class NoObjectsError(config_lib.ConfigError):
    """`train.scst_box_attention` or `train.scst_size_reward` > 0 on data without what it reads."""


def check_objects(annotations_uri: str, attribute: str, setting: str) -> None:
    """Refuses `setting` when the first `OBJECT_CHECK_RECORDS` train records lack `attribute`.

    Args:
      annotations_uri: the Annotations folder.
      attribute: "bbox" (the box term) or "size" (the size reward).
      setting: the setting that needs it, for the message.
    Raises:
      NoObjectsError: none of those records has an object with it.
    """
    import tensorflow as tf
    files = schema.split_files(annotations_uri, "train")
    for serialized in tf.data.TFRecordDataset(files).take(OBJECT_CHECK_RECORDS):
        if tf.size(schema.parse_object_features(serialized)[attribute]) > 0:
            return
    what, where = _OBJECT_NEEDS[attribute]
    raise NoObjectsError(
        f"{setting} > 0 needs {what}, and the first {OBJECT_CHECK_RECORDS} train records "
        f"of {annotations_uri} have none: use data with {what} ({where}) or set {setting}=0")


def check_start(config, history: list[dict], stop_reason: str, log) -> None:
    """Applies `train.scst_require_converged` to the start model's history.

    Raises:
      NotConvergedError: the model's val_loss still fell `CONVERGED_DELTA` or
        more in its last epoch, and the check is on.
    """
    converged, reason = convergence(history, stop_reason)
    if converged:
        log(f"cross-entropy start point converged: {reason}")
        return
    message = (f"SCST needs a converged cross-entropy model, but its {reason}; raise "
               "train.epochs (or train.patience), or set train.scst_require_converged=false")
    if config.train.scst_require_converged:
        raise NotConvergedError(message)
    log(f"warning: {message} (continuing: train.scst_require_converged=false)")


def write_start_record(phase_dir: str, start: str, history: list[dict],
                       start_cider: float | None = None) -> None:
    """`<phase_dir>/start.json`: the start model, its last val_loss and its val CIDEr."""
    last = next((row for row in reversed(history) if row.get("val_loss") is not None), {})
    with open(os.path.join(phase_dir, "start.json"), "w") as f:
        json.dump({"start": start, "xe_epochs": len(history),
                   "xe_val_loss": last.get("val_loss") if last else None,
                   "start_cider": start_cider}, f, indent=2)


def read_start_record(phase_dir: str) -> dict:
    path = os.path.join(phase_dir, "start.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def best_metric(state) -> float | None:
    value = float(state.best_metric.numpy())
    return None if math.isnan(value) else value
