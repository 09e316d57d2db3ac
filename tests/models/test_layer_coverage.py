"""Every custom Keras layer in `models/` is checked by the shared layer contract."""
import importlib
import inspect
import os
import pkgutil
import re

import keras

import models

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def _custom_layers() -> set:
    """Names of the `keras.layers.Layer` subclasses (not Models) defined in `models/`."""
    names = set()
    for info in pkgutil.iter_modules(models.__path__):
        module = importlib.import_module(f"models.{info.name}")
        for name, obj in inspect.getmembers(module, inspect.isclass):
            if (obj.__module__ == module.__name__ and issubclass(obj, keras.layers.Layer)
                    and not issubclass(obj, keras.Model)):
                names.add(name)
    return names


def _contract_tested() -> set:
    """Class names passed to `run_layer_test` by the models tests."""
    names = set()
    for file in os.listdir(TESTS_DIR):
        if file.startswith("test_") and file.endswith(".py"):
            with open(os.path.join(TESTS_DIR, file), encoding="utf-8") as f:
                names.update(re.findall(r"run_layer_test\(\s*(\w+)", f.read()))
    return names


def test_every_custom_layer_runs_the_layer_contract():
    layers = _custom_layers()
    assert {"AttentionScorer", "SoftAttention", "HardAttention", "ImageNormalization",
            "CoordinateChannels"} <= layers
    missing = layers - _contract_tested()
    assert not missing, f"layers without a run_layer_test: {sorted(missing)}"
