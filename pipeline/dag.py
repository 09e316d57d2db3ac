"""The stage DAG: which stage reads which artifacts. Wiring only, no I/O."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LatestArtifact:
    """A resolver input: the newest artifact in the metadata store that matches, not this run's.

    Like TFX's `LatestBlessedModelResolver`: the Evaluator compares its model
    with the last one pushed, which an earlier run produced. The runner looks
    it up before the stage runs; the found artifact keys the cache like any
    input, and when none matches the input is simply absent.

    Attributes:
      stage: the stage whose output is searched.
      output: that stage's output name.
      where: properties the output must have (e.g. `{"pushed": True}`).
      follow: when set, return the artifact the matching execution read as
        this input instead (the Evaluation that blessed a pushed model).
      unless_same: an input of the stage being resolved; a match whose
        execution read that same artifact under this name is skipped (a model
        is not compared with its own earlier push).
    """
    stage: str
    output: str
    where: dict = field(default_factory=dict)
    follow: str = ""
    unless_same: str = ""


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage.

    Attributes:
      name: stage name as used on the command line.
      module: the component module exposing `run(ctx) -> dict`; the source of
        its import closure inside the project keys the cache.
      inputs: input name -> (upstream stage, artifact name).
      outputs: artifact name -> artifact type.
      config_sections: what the stage reads of the config: sections (`"model"`) or
        single keys (`"encoder.image_size"`). The stage can read nothing
        else (`components.contract.config.DeclaredConfig`), and exactly this keys
        the cache.
      resolved: input name -> `LatestArtifact`, inputs looked up in the
        metadata store rather than produced in this run.
      summary: run-summary key -> (output name, artifact property): what the
        run summary shows of this stage's outputs.
    """
    name: str
    module: str
    inputs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    config_sections: tuple = ()
    resolved: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)


# The last model pushed (blessed, since only blessed models are pushed), as
# the ServingModel the Pusher published: the Evaluator scores it again, on the
# same test images in the same run, as the blessing's baseline.
LATEST_PUSHED_SERVING_MODEL = LatestArtifact("Pusher", "pushed_model", where={"pushed": True},
                                             follow="serving_model",
                                             unless_same="serving_model")

# The decoding baked into the export: what the Evaluator scores and the Pusher publishes.
EXPORT_DECODING = ("eval.beam_size", "eval.max_length", "eval.length_normalization")

STAGES: tuple[StageSpec, ...] = (
    StageSpec("ExampleGen", "components.example_gen",
              outputs={"examples": "Examples"},
              config_sections=("data",)),
    StageSpec("EncoderTrainer", "components.encoder_trainer",
              inputs={"examples": ("ExampleGen", "examples")},
              outputs={"encoder": "Encoder"},
              config_sections=("encoder",)),
    StageSpec("Preprocess", "components.preprocess",
              inputs={"examples": ("ExampleGen", "examples"),
                      "encoder": ("EncoderTrainer", "encoder")},
              outputs={"annotations": "Annotations", "vocabulary": "Vocabulary"},
              config_sections=("preprocess", "encoder.image_size")),
    StageSpec("Trainer", "components.trainer",
              inputs={"annotations": ("Preprocess", "annotations"),
                      "vocabulary": ("Preprocess", "vocabulary")},
              outputs={"model": "Model"},
              config_sections=("model", "train")),
    StageSpec("Exporter", "components.exporter",
              inputs={"model": ("Trainer", "model"),
                      "encoder": ("EncoderTrainer", "encoder"),
                      "vocabulary": ("Preprocess", "vocabulary")},
              outputs={"serving_model": "ServingModel"},
              config_sections=EXPORT_DECODING + ("push.model_name", "push.num_warmup_requests"),
              summary={"export_digest": ("serving_model", "digest")}),
    StageSpec("Evaluator", "components.evaluator",
              inputs={"serving_model": ("Exporter", "serving_model"),
                      "examples": ("ExampleGen", "examples")},
              outputs={"evaluation": "Evaluation", "blessing": "Blessing"},
              config_sections=("eval",),
              resolved={"baseline": LATEST_PUSHED_SERVING_MODEL},
              summary={"metrics": ("evaluation", "metrics"), "blessed": ("blessing", "blessed"),
                       "comparison": ("blessing", "comparison")}),
    StageSpec("Pusher", "components.pusher",
              inputs={"serving_model": ("Exporter", "serving_model"),
                      "blessing": ("Evaluator", "blessing"),
                      "evaluation": ("Evaluator", "evaluation")},
              outputs={"pushed_model": "PushedModel"},
              config_sections=("push.serving_dir", "push.model_name", "push.keep_versions",
                               "push.max_batch_size", "push.batch_timeout_micros"),
              summary={"pushed_version": ("pushed_model", "version")}),
)

STAGE_NAMES = tuple(s.name for s in STAGES)


def stage(name: str) -> StageSpec:
    """The spec of a stage by name."""
    for s in STAGES:
        if s.name == name:
            return s
    raise KeyError(f"unknown stage {name!r}; stages: {', '.join(STAGE_NAMES)}")


def downstream(name: str) -> set[str]:
    """Every stage that (transitively) reads an output of `name`."""
    result: set[str] = set()
    frontier = {name}
    while frontier:
        nxt = {s.name for s in STAGES
               if any(up in frontier for up, _ in s.inputs.values())} - result
        result |= nxt
        frontier = nxt
    return result
