"""The stage DAG: which stage reads which artifacts. Wiring only, no I/O."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage.

    Attributes:
      name: stage name as used on the command line.
      module: the component module exposing `run(ctx) -> dict`.
      inputs: input name -> (upstream stage, artifact name).
      outputs: artifact name -> artifact type.
      config_sections: the config sections whose values key the cache.
      code: package-relative files/folders whose source keys the cache.
    """
    name: str
    module: str
    inputs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    config_sections: tuple = ()
    code: tuple = ()


STAGES: tuple[StageSpec, ...] = (
    StageSpec("ExampleGen", "components.example_gen",
              inputs={},
              outputs={"examples": "Examples"},
              config_sections=("data",),
              code=("components/example_gen.py", "components/sources", "components/io_utils.py",
                    "components/schema.py")),
    StageSpec("EncoderTrainer", "components.encoder_trainer",
              inputs={"examples": ("ExampleGen", "examples")},
              outputs={"encoder": "Encoder"},
              config_sections=("encoder",),
              code=("components/encoder_trainer.py", "components/schema.py", "models")),
    StageSpec("Preprocess", "components.preprocess",
              inputs={"examples": ("ExampleGen", "examples"),
                      "encoder": ("EncoderTrainer", "encoder")},
              outputs={"annotations": "Annotations", "vocabulary": "Vocabulary"},
              config_sections=("preprocess",),
              code=("components/preprocess.py", "components/beam_utils.py", "components/schema.py",
                    "models")),
    StageSpec("Trainer", "components.trainer",
              inputs={"annotations": ("Preprocess", "annotations"),
                      "vocabulary": ("Preprocess", "vocabulary")},
              outputs={"model": "Model"},
              config_sections=("model", "train"),
              code=("components/trainer", "components/train_data.py", "components/distribute.py",
                    "components/schema.py", "models")),
    StageSpec("Evaluator", "components.evaluator",
              inputs={"model": ("Trainer", "model"),
                      "annotations": ("Preprocess", "annotations"),
                      "vocabulary": ("Preprocess", "vocabulary"),
                      "examples": ("ExampleGen", "examples")},
              outputs={"evaluation": "Evaluation", "blessing": "Blessing"},
              config_sections=("eval",),
              code=("components/evaluator.py", "components/metrics", "components/figures.py",
                    "components/io_utils.py", "components/schema.py", "models")),
    StageSpec("Pusher", "components.pusher",
              inputs={"model": ("Trainer", "model"),
                      "encoder": ("EncoderTrainer", "encoder"),
                      "vocabulary": ("Preprocess", "vocabulary"),
                      "blessing": ("Evaluator", "blessing"),
                      "evaluation": ("Evaluator", "evaluation")},
              outputs={"pushed_model": "PushedModel"},
              config_sections=("push",),
              code=("components/pusher.py", "components/schema.py", "serving/export.py", "models")),
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
