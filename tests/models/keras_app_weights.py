"""Local weights files for `keras.applications` models, as offline users supply them.

Keras downloads ImageNet weights at run time; offline users copy the
`..._notop.h5` file instead. These helpers write such a file from a
`weights=None` model, and return what the application itself computes with
those weights, so tests can check that an encoder really loaded them.
"""
from __future__ import annotations

import importlib
from typing import Callable

import h5py
import keras
import numpy as np
from keras.src.legacy.saving import legacy_h5_format


def write_notop_weights(application: str, layer: str, path: str, weights_format: str = "legacy",
                        seed: int = 1) -> Callable[[np.ndarray], np.ndarray]:
    """Writes random weights of `application` (without its top) to `path`.

    Args:
      application: the class name in `keras.applications`, e.g. `VGG19`.
      layer: the layer whose output the returned function gives.
      path: the file to write.
      weights_format: `legacy` (the HDF5 layout of the files Keras downloads)
        or `keras` (`save_weights` to a `.weights.h5` path).
      seed: the initializers' seed.
    Returns:
      A function from `(batch, S, S, 3)` float32 RGB images in [0, 255] to the
      application's `layer` output, with the family's own `preprocess_input`.
    """
    keras.utils.set_random_seed(seed)
    app = getattr(keras.applications, application)(include_top=False, weights=None,
                                                   input_shape=(None, None, 3))
    if weights_format == "keras":
        app.save_weights(path)
    elif weights_format == "legacy":
        with h5py.File(path, "w") as f:
            legacy_h5_format.save_weights_to_hdf5_group(f, app)
    else:
        raise ValueError(f"unknown weights format {weights_format!r}")
    cut = keras.Model(app.input, app.get_layer(layer).output)
    family = importlib.import_module(getattr(keras.applications, application).__module__)
    return lambda images: np.asarray(cut(family.preprocess_input(np.array(images, "float32"))))
