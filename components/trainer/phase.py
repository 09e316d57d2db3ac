"""The values a training loop runs on: `LoopSetup` in, a `Phase` to run, a `PhaseOutcome` out.

A training phase (cross-entropy: components/trainer/cross_entropy.py;
self-critical: components/trainer/scst.py) is not a subclass of the loop but
a `Phase` value: what to compute (optimizer, start weights, step), what to
log (announcement, step summaries, the stop line), and when to stop and
which epoch is best (epochs, steps, metric, patience, the first candidate
step, whether the start model competes). `loop.TrainingLoop` runs any
`Phase`; `phases._run_phases` composes them, each started from the
`Handoff` of the one before.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

from components.contract import precision as precision_lib
from components.contract import schema


@dataclasses.dataclass
class LoopSetup:
    """What every phase of a training run shares.

    Attributes:
      strategy: the `tf.distribute.Strategy`.
      role: this process' `distribute.ClusterRole`.
      config: the `PipelineConfig`.
      inputs: `train_data.TrainInputs` (`read_inputs`).
      work_dir: checkpoints, logs, history and `best.keras`.
      log: one line of progress text (only the chief's lines are shown).
      started: when the run began (default: now).
      precision: the resolved `components.contract.precision.Precision` (default: the config's
        policy, as set).
    """
    strategy: Any
    role: Any
    config: Any
    inputs: Any
    work_dir: str
    log: Callable[[str], None]
    started: float | None = None
    precision: precision_lib.Precision | None = None

    def __post_init__(self):
        if self.precision is None:
            self.precision = precision_lib.resolve(self.config.train.mixed_precision)

    def say(self, line: str) -> None:
        """`log` on the chief; nothing elsewhere."""
        if self.role.is_chief:
            self.log(line)


def _never_scored(score: float | None) -> None:
    """The default `Phase.on_start_scored`: the start model is not scored."""


def _no_properties(state, final: dict) -> dict:
    """The default `Phase.properties`: no properties of its own."""
    return {}


@dataclasses.dataclass(frozen=True)
class Phase:
    """One training phase as a value: what to compute, what to log, when to stop.

    Attributes:
      name: `"xe"`, `"scst"`; a phase without a best model hands on
        `<folder>/<name>_final.keras`.
      folder: its checkpoints, history and `best.keras` under the work folder
        (`""`: the work folder itself), and its TensorBoard folder under `logs/`.
      inputs: the `train_data.TrainInputs` its steps read.

      make_optimizer: `() -> optimizer`, called under the strategy's scope.
      init_weights: `(model, chief, say) -> None`: the weights a fresh phase
        starts from (a checkpoint, when there is one, replaces them).
      make_step: `(strategy, model, optimizer, element_spec) -> run_step`,
        `run_step(batch, step) -> {name: float}` one distributed step
        (`step`: the global steps done before it).

      announce: the lines this process logs as the phase starts.
      write_summaries: `(writer, step, out, *, model, optimizer, timing) -> None`:
        one step's TensorBoard scalars (`out`: `run_step`'s result).
      progress: the progress bar's label.
      stopped: the start of the line that says where and why the phase stopped.

      epochs: the most epochs it trains.
      epochs_key: the config key `epochs` comes from, named when that bound
        ends a run whose last epoch was still its best.
      total_steps: the most steps it trains.
      metric: the validation metric that picks the best epoch and stops early.
      patience: epochs without a better `metric` before it stops early (0: it
        does not stop early; it trains `epochs` and keeps the best).
      first_candidate: `(model) -> step`: epochs that end at or before this
        step are not best-model candidates.
      start_competes: a fresh phase first makes its start model the best so
        far (epoch -1), scored by `metric`: an epoch replaces it only by beating it,
        and `patience` counts from the first epoch that does (until then the
        phase trains on, to `epochs`).
      on_start_scored: `(score or None) -> None`, after the start model was
        scored (`start_competes`; None without a validation split).

      history_tag: marks its epoch rows `"phase": tag` (`""`: unmarked).
      earlier_history: the epoch rows of the phases before it.
      properties: `(state, final) -> dict`: its own Model properties
        (`state`: the `checkpointing.TrainState`, `final`: the last step's results).
    """
    name: str
    folder: str
    inputs: Any
    # What to compute.
    make_optimizer: Callable[[], Any]
    init_weights: Callable[[Any, bool, Callable[[str], None]], None]
    make_step: Callable[..., Callable[[Any, int], dict]]
    # What to log.
    announce: tuple[str, ...]
    write_summaries: Callable[..., None]
    progress: str
    stopped: str
    # When to stop, and which epoch is best.
    epochs: int
    total_steps: int
    metric: str
    patience: int
    first_candidate: Callable[[Any], int]
    epochs_key: str = "train.epochs"
    start_competes: bool = False
    on_start_scored: Callable[[float | None], None] = _never_scored
    # What it hands the export.
    history_tag: str = ""
    earlier_history: tuple = ()
    properties: Callable[[Any, dict], dict] = _no_properties

    def phase_dir(self, work_dir: str) -> str:
        """Its checkpoints, history and `best.keras`."""
        return os.path.join(work_dir, self.folder) if self.folder else work_dir

    def logs_dir(self, work_dir: str) -> str:
        """Its TensorBoard folder."""
        logs = os.path.join(work_dir, schema.LOGS_DIR)
        return os.path.join(logs, self.folder) if self.folder else logs

    def history(self, rows: list[dict]) -> list[dict]:
        """The run's epoch rows so far: the earlier phases', then `rows` (its own), tagged."""
        own = [dict(row, phase=self.history_tag) for row in rows] if self.history_tag \
            else list(rows)
        return list(self.earlier_history) + own


@dataclasses.dataclass(frozen=True)
class Handoff:
    """What a finished phase hands the next one.

    Attributes:
      start: the `.keras` file to start from (its best model, else its final weights).
      history: the epoch rows so far.
      stop_reason: why it stopped (`""`: it ran elsewhere, e.g. `train.init_model`).
    """
    start: str
    history: tuple
    stop_reason: str = ""


@dataclasses.dataclass(frozen=True)
class PhaseOutcome:
    """What a finished phase leaves for the export.

    Attributes:
      model: the trained `ShowAttendTell`.
      optimizer: its optimizer (with the weight average, if the phase keeps one).
      state: its `checkpointing.TrainState`.
      checkpoint: the `tf.train.Checkpoint` of model, optimizer and state.
      writer: the TensorBoard writer (closed by the export on the chief).
      timing: this attempt's `timing.Timing`.
      resumed_from: the step this attempt started from.
      final: the last step's results.
      best_path: its best model.
      metric: the validation metric that chose it.
      history: the run's epoch rows (every phase's).
      properties: its own Model properties (`Phase.properties`).
    """
    model: Any
    optimizer: Any
    state: Any
    checkpoint: Any
    writer: Any
    timing: Any
    resumed_from: int
    final: dict
    best_path: str
    metric: str
    history: list
    properties: dict
