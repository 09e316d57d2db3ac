"""The self-critical phase of `train.objective=scst` (Rennie et al. 2017; docs/scst.md).

It starts from a converged cross-entropy model: the best model of this run's
cross-entropy phase, or `train.init_model`. The start is refused when that
model's validation loss still fell by `CONVERGED_DELTA` or more in its last
epoch (`train.scst_require_converged`): SCST from an unconverged model is
where users see CIDEr fall. It then trains `train.scst_epochs` epochs with a
fresh Adam at `train.scst_learning_rate`, validates greedy captions' CIDEr-D
each epoch, keeps the best (`scst/best.keras`) and stops early on it. Its
checkpoints, history and best model live in `<work_dir>/scst/`; its
TensorBoard scalars in `<work_dir>/logs/scst`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os

from components.contract import config as config_lib
from components.contract import schema
from components.trainer import checkpointing, summaries
from components.trainer.loop import LoopSetup, TrainingLoop

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


class ScstLoop(TrainingLoop):
    """`TrainingLoop` with the self-critical step, CIDEr validation and its own folder.

    Args:
      setup: the run's `LoopSetup` (its inputs yield the references too:
        `scst_inputs`).
      start: the `.keras` file the phase starts from (when no SCST
        checkpoint exists yet).
      scorer: the `models.cider_d.CiderD` of the training references.
      max_length: most words per sampled caption.
    """

    def __init__(self, setup: LoopSetup, *, start: str, scorer, max_length: int):
        self.start, self.scorer, self.max_length = start, scorer, int(max_length)
        super().__init__(setup)

    def _phase_settings(self) -> None:
        tcfg = self.tcfg
        self.phase = PHASE_DIR
        self.epochs = tcfg.scst_epochs
        self.total_steps = self.inputs.steps_per_epoch * tcfg.scst_epochs
        self.metric = "cider"
        self.phase_dir = os.path.join(self.work_dir, PHASE_DIR)
        self.logs_dir = os.path.join(self.work_dir, schema.LOGS_DIR, PHASE_DIR)
        os.makedirs(self.phase_dir, exist_ok=True)

    def _announce(self) -> None:
        tcfg = self.tcfg
        self.say(f"self-critical training (SCST): {tcfg.scst_samples} samples per image, "
                 f"{tcfg.scst_baseline} baseline, CIDEr-D reward (document frequencies of "
                 f"{self.scorer.num_documents} training images, {self.scorer.num_keys} n-grams), "
                 f"captions up to {self.max_length} words, learning rate "
                 f"{tcfg.scst_learning_rate:g}, cross-entropy weight {tcfg.scst_xe_weight:g}, "
                 f"{self.inputs.steps_per_epoch} steps/epoch x {self.epochs} epochs, "
                 f"early stopping on val CIDEr")

    def _make_optimizer(self):
        import keras
        from components.trainer.fused_adam import FusedAdam
        optimizer = FusedAdam(self.tcfg.scst_learning_rate)
        if self.tcfg.mixed_precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        return optimizer

    def _initialize_weights(self) -> None:
        from components.trainer.model_setup import load_weights
        if not os.path.exists(self.start) and not self.chief:
            return  # a worker other than the chief gets the chief's weights
        load_weights(self.model, self.start)
        self.say(f"SCST starts from {self.start}")

    def _open_outputs(self) -> None:
        super()._open_outputs()
        self.selection_start = 0

    def start_as_best(self) -> float | None:
        """Makes the start model the best so far (epoch -1), scored by val CIDEr.

        An SCST epoch then replaces it only by beating its CIDEr: a phase that
        does not help exports the model it started from.

        Returns:
          The start model's val CIDEr (None without a validation split).
        """
        from components.trainer import distribute
        from components.trainer.sync import chief_values
        if self.validator is None:
            return None
        cider = self.validator.cider() if self.chief else 0.0
        if self.multi_worker:
            cider = chief_values(self.strategy, {"cider": cider})["cider"]
        self.state.best_metric.assign(cider)
        self.state.best_epoch.assign(-1)
        target = distribute.write_dir(self.best_path, self.role)
        checkpointing.atomic_save(self.model, target)
        distribute.cleanup(target, self.role)
        self.say(f"SCST start: val CIDEr {cider:.4f} (greedy captions); an SCST epoch "
                 "replaces the start model only by beating it")
        return cider

    def _make_step(self, element_spec):
        from components.trainer.scst_step import ScstStepOptions, make_scst_step
        return make_scst_step(self.strategy, self.model, self.optimizer, self.scorer,
                              ScstStepOptions.from_config(self.tcfg, self.max_length),
                              element_spec)

    def _call_step(self, batch) -> dict:
        import tensorflow as tf
        seed = tf.constant([self.tcfg.seed, int(self.state.step.numpy())], tf.int64)
        return {k: float(v) for k, v in self._step_fn(batch, seed).items()}

    def _write_summaries(self, step: int, out: dict) -> None:
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
            "scst/learning_rate": summaries.scalar_value(self.optimizer.learning_rate),
            "scst/examples_per_second": self.timing.throughput(),
        }
        if self.tcfg.scst_baseline == "greedy":
            values["scst/greedy_reward"] = out["greedy_reward_sum"] / max(out["examples"], 1.0)
        if self.tcfg.scst_xe_weight > 0:
            values["scst/xe_nll"] = out["nll_sum"] / max(out["num_tokens"], 1.0)
        with self.writer.as_default():
            for tag, value in values.items():
                summaries.summary_scalar(tag, value, step)

    def history(self) -> list[dict]:
        """This phase's epoch rows, each marked `"phase": "scst"`."""
        return [dict(row, phase=PHASE_DIR) for row in checkpointing.read_history(self.phase_dir)]

    def trained_run(self, output_uri: str, xe_history=()):
        """`TrainingLoop.trained_run` with both phases' history and the SCST properties."""
        run = super().trained_run(output_uri)
        tcfg = self.tcfg
        run.history = list(xe_history) + self.history()
        run.extra = {"scst": {
            "start": self.start, "epochs": int(self.state.epoch.numpy()),
            "steps": int(self.state.step.numpy()), "best_cider": best_metric(self.state),
            "best_epoch": int(self.state.best_epoch.numpy()), "samples": tcfg.scst_samples,
            "start_cider": read_start_record(self.phase_dir).get("start_cider"),
            "baseline": tcfg.scst_baseline, "xe_weight": tcfg.scst_xe_weight,
            "learning_rate": tcfg.scst_learning_rate, "max_length": self.max_length,
            "reward": "CIDEr-D", "document_frequency_images": self.scorer.num_documents,
            "final_reward": (self.final["reward_sum"] / max(self.final["samples"], 1.0)
                             if self.final else None)}}
        return run


def run_scst(setup: LoopSetup, *, annotations_uri: str, output_uri: str, start: str,
             history: list[dict], xe_stop_reason: str = ""):
    """The self-critical phase from the model `start`: a `TrainedRun`.

    Args:
      setup: the run's `LoopSetup` (with the cross-entropy inputs).
      annotations_uri: the Annotations folder (the training references).
      output_uri: the Model folder.
      start: the `.keras` file of the converged cross-entropy model.
      history: that model's cross-entropy epoch rows.
      xe_stop_reason: why the cross-entropy phase stopped ("" when it ran elsewhere).
    Returns:
      The `TrainedRun` to export.
    """
    config, role = setup.config, setup.role
    tcfg = config.train
    say = setup.log if role.is_chief else (lambda line: None)
    phase_dir = os.path.join(setup.work_dir, PHASE_DIR)
    if role.is_chief and not os.path.exists(
            os.path.join(phase_dir, schema.CHECKPOINTS_DIR, "checkpoint")):
        check_start(config, history, xe_stop_reason, say)  # before the costly setup
    scorer, longest = build_scorer(annotations_uri, setup.inputs.vocab_size, say)
    max_length = tcfg.scst_max_length or longest + 1
    loop = ScstLoop(dataclasses.replace(setup, inputs=scst_inputs(setup.inputs, config)),
                    start=start, scorer=scorer, max_length=max_length)
    # The chief's restored state, which every worker now holds, decides.
    if loop.resumed_from == 0:
        start_cider = loop.start_as_best()
        if role.is_chief:
            write_start_record(loop.phase_dir, start, history, start_cider)
    stop_reason = loop.run()
    say(f"self-critical phase stopped at step {int(loop.state.step.numpy())}: "
        f"{stop_reason}")
    return loop.trained_run(output_uri, xe_history=history)


def scst_inputs(inputs, config):
    """The cross-entropy `TrainInputs` with a dataset that also yields every reference."""
    data = dataclasses.replace(inputs.data, references=True, bucket_by_length=False)
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
