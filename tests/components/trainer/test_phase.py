"""Training phases are values run by one loop: no subclass of the loop, folders and history per phase."""
from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil

import pytest

import components.trainer as trainer_package
from components.trainer.phase import Phase


def _phase(**fields) -> Phase:
    values = dict(name="p", folder="", inputs=None, make_optimizer=lambda: None,
                  init_weights=lambda model, chief, say: None,
                  make_step=lambda *args: None, announce=(), write_summaries=lambda *a, **k: None,
                  progress="Trainer", stopped="stopped", epochs=1, total_steps=1,
                  metric="val_loss", patience=1, first_candidate=lambda model: 0)
    values.update(fields)
    return Phase(**values)


def test_the_loop_has_no_subclasses_in_the_trainer():
    for module in pkgutil.iter_modules(trainer_package.__path__):
        if module.name != "__main__":
            importlib.import_module(f"components.trainer.{module.name}")
    from components.trainer.loop import TrainingLoop
    assert TrainingLoop.__subclasses__() == []


def test_a_phase_is_a_frozen_value():
    phase = _phase()
    with pytest.raises(dataclasses.FrozenInstanceError):
        phase.epochs = 2
    assert dataclasses.replace(phase, epochs=2).epochs == 2 and phase.epochs == 1


def test_each_phase_has_its_folders_and_tags_its_history():
    work = os.path.join("w", "work")
    first = _phase(name="xe")
    assert first.phase_dir(work) == work
    assert first.logs_dir(work) == os.path.join(work, "logs")
    rows = [{"epoch": 0, "val_loss": 2.0}, {"epoch": 1, "val_loss": 1.5}]
    assert first.history(rows) == rows                       # the first phase: unmarked
    second = _phase(name="scst", folder="scst", history_tag="scst",
                    earlier_history=tuple(rows))
    assert second.phase_dir(work) == os.path.join(work, "scst")
    assert second.logs_dir(work) == os.path.join(work, "logs", "scst")
    own = [{"epoch": 0, "cider": 0.5}]
    assert second.history(own) == rows + [{"epoch": 0, "cider": 0.5, "phase": "scst"}]
    assert own == [{"epoch": 0, "cider": 0.5}]               # its rows are not changed
