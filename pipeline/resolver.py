"""The DAG's resolver inputs and summary entries, read from the metadata store and the outputs.

`resolve_latest` finds what a `dag.LatestArtifact` describes (the Evaluator's
baseline: the last pushed model); `summarize` picks the run-summary entries a
stage's `dag.StageSpec.summary` names. The runner holds no stage-specific code:
both read only the DAG.
"""
from __future__ import annotations

from typing import Mapping

from components.contract.artifacts import Artifact, ArtifactError
from pipeline import dag
from pipeline.metadata import MetadataStore


def resolve_latest(store: MetadataStore, resolver: dag.LatestArtifact,
                   inputs: Mapping[str, Artifact]) -> Artifact | None:
    """The newest published artifact that `resolver` describes, or None.

    Args:
      store: the metadata store (lineage of earlier runs).
      resolver: what to look for.
      inputs: the stage's inputs so far (for `resolver.unless_same`).
    Returns:
      The artifact (the `follow`ed input of the matching execution when
      `follow` is set), or None when nothing intact matches.
    """
    same = inputs.get(resolver.unless_same) if resolver.unless_same else None
    for row in store.latest_outputs(resolver.stage, resolver.output):
        try:
            art = Artifact.load(row["uri"])
        except ArtifactError:
            continue
        if any(art.properties.get(k) != v for k, v in resolver.where.items()):
            continue
        read = {e["name"]: e["uri"] for e in store.events(row["execution_id"])
                if e["kind"] == "input"}
        if same is not None and read.get(resolver.unless_same) == same.uri:
            continue
        if not resolver.follow:
            return art
        try:
            return Artifact.load(read[resolver.follow])
        except (KeyError, ArtifactError):
            continue
    return None


def summarize(spec: dag.StageSpec, outputs: Mapping[str, Artifact]) -> dict:
    """The run-summary entries `spec.summary` names, read from the outputs' properties."""
    entries = {}
    for key, (output, prop) in spec.summary.items():
        art = outputs.get(output)
        if art is not None and prop in art.properties:
            value = art.properties[prop]
            entries[key] = dict(value) if isinstance(value, Mapping) else value
    return entries
