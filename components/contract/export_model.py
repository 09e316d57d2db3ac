"""Exporting a Model artifact as a TF Serving SavedModel, and what the export records.

Used by the Exporter stage (`components.exporter`) and by the Evaluator,
which re-exports the baseline model when its export decoded with other
settings (the comparison needs the same decoding on both sides).
"""
from __future__ import annotations

import dataclasses
import json
import os

from components.contract import schema


def decoding_settings(eval_config) -> dict:
    """The decoding the export runs, from the `eval` section (beam 1 = greedy)."""
    return {"beam_size": int(eval_config.beam_size), "max_length": int(eval_config.max_length),
            "length_normalization": float(eval_config.length_normalization)}


@dataclasses.dataclass(frozen=True)
class ExportSources:
    """What a SavedModel is exported from, and how it decodes.

    Attributes:
      model_uri, encoder_uri, vocabulary_uri: the Model, Encoder and
        Vocabulary artifact folders.
      decoding: `decoding_settings`.
      model_name: written into the warmup requests.
      num_warmup_requests: warmup records (0 = none).
      record: more facts for `schema.EXPORT_RECORD` (the input fingerprints).
    """
    model_uri: str
    encoder_uri: str
    vocabulary_uri: str
    decoding: dict
    model_name: str = "captioner"
    num_warmup_requests: int = 0
    record: dict | None = None


def export(path: str, sources: ExportSources, progress=None, validate_infra: bool = True) -> dict:
    """Writes a SavedModel to `path`, validates it for TF Serving and records both.

    Args:
      path: the (not yet existing) SavedModel folder.
      sources: the artifacts and the decoding.
      progress: called with the name of each step as it begins.
      validate_infra: run the InfraValidator (a child process, seconds).
    Returns:
      The infra validation report (`ok`, `reason`, `ops`, versions), or
      None without `validate_infra`.
    """
    import keras

    import models.encoder  # registers the custom layers
    import models.show_attend_tell  # noqa: F401
    from serving.server.infra_validator import validate
    from serving.signature.export import Decoding, export_saved_model
    step = progress or (lambda name: None)
    step("load")
    decoder = keras.saving.load_model(schema.model_file(sources.model_uri))
    encoder = keras.saving.load_model(os.path.join(sources.encoder_uri, schema.ENCODER_FILE))
    vocabulary = schema.read_vocabulary(sources.vocabulary_uri)
    step("export SavedModel")
    export_saved_model(path, encoder, decoder, vocabulary, Decoding(**sources.decoding),
                       model_name=sources.model_name,
                       num_warmup_requests=sources.num_warmup_requests)
    report = None
    if validate_infra:
        step("infra validation")
        report = validate(path)
    # The server sizes TensorFlow's thread pools by it (serving/server/thread_choice.py).
    encoder_gflops = float(f"{models.encoder.encoder_flops(encoder) / 1e9:.4g}")
    full = dict(sources.record or {}, decoding=sources.decoding, model_name=sources.model_name,
                num_warmup_requests=sources.num_warmup_requests, infra_validation=report,
                encoder_gflops=encoder_gflops)
    out = os.path.join(path, schema.EXPORT_RECORD)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(full, f, indent=2, sort_keys=True)
    return report


def read_export_record(saved_model_dir: str) -> dict | None:
    """The `schema.EXPORT_RECORD` of a SavedModel folder, or None."""
    try:
        with open(os.path.join(saved_model_dir, schema.EXPORT_RECORD), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
