"""Exporter: the serving SavedModel, written once, then evaluated, validated and pushed as is.

TFX's order: the Trainer's model is exported for serving *before* it is
evaluated, so that the function the Evaluator scores is the function TF
Serving runs. The SavedModel (`serving.signature.export.export_saved_model`: the
`serving_default` signature on image bytes, `caption_annotations` on grids,
warmup requests) decodes with `eval.beam_size`, `eval.max_length` and
`eval.length_normalization`. The InfraValidator (`serving.server.infra_validator`)
then checks, in a child process, that TF Serving's session loader could load
and run it; its report is recorded, and a model that fails it is not
evaluated and never blessed (the Evaluator says why).

The ServingModel artifact records the `digest` of the SavedModel folder
(`components.contract.io_utils.tree_digest`). The Evaluator records the digest it
scored, and the Pusher publishes a byte-for-byte copy only when both agree.
"""
from __future__ import annotations

import os
import sys

from components.contract import io_utils, schema
from components.contract.export_model import ExportSources, decoding_settings, export


def run(ctx) -> dict:
    """Exports the Model with its Encoder and Vocabulary; writes `ServingModel`."""
    from tqdm import tqdm
    model, encoder, vocabulary = (ctx.inputs[k] for k in ("model", "encoder", "vocabulary"))
    decoding = decoding_settings(ctx.config.eval)
    path = os.path.join(ctx.outputs["serving_model"], schema.SAVED_MODEL_DIR)
    record = {"model": model.fingerprint, "encoder": encoder.fingerprint,
              "vocabulary": vocabulary.fingerprint}
    # Three steps of seconds to minutes each: a bar that names the one running.
    with tqdm(total=3, desc="Exporter", unit="step", file=sys.stderr, leave=False) as bar:
        def progress(name):
            if bar.postfix:
                bar.update(1)
            bar.set_postfix_str(name)
        report = export(path, ExportSources(
            model.uri, encoder.uri, vocabulary.uri, decoding,
            model_name=ctx.config.push.model_name,
            num_warmup_requests=ctx.config.push.num_warmup_requests, record=record),
            progress=progress)
        bar.update(1)
    digest = io_utils.tree_digest(path)
    grid = encoder.properties.get(schema.GRID_SHAPE)
    ctx.log(f"SavedModel {digest[:12]} (beam {decoding['beam_size']}, max length "
            f"{decoding['max_length']}); infra validation "
            + ("passed" if report["ok"] else f"FAILED: {report['reason']}"))
    return {"serving_model": {
        "counts": {"infra_validated": int(bool(report["ok"]))},
        "properties": {"digest": digest, "decoding": decoding, "infra_validation": report,
                       "saved_model": schema.SAVED_MODEL_DIR,
                       "model_uri": model.uri, "encoder_uri": encoder.uri,
                       "vocabulary_uri": vocabulary.uri,
                       "image_size": encoder.properties.get("image_size"),
                       schema.GRID_SHAPE: grid}}}
