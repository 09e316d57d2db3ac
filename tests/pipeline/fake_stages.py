"""Tiny stand-in stages for runner tests: they copy text between artifacts."""
import os

from pipeline.dag import LatestArtifact, StageSpec

CALLS = []


def _write(ctx, name, text):
    with open(os.path.join(ctx.outputs[name], "value.txt"), "w") as f:
        f.write(text)


def _read(art):
    with open(art.path("value.txt")) as f:
        return f.read()


def run_a(ctx):
    CALLS.append("A")
    if os.environ.get("FAKE_STAGE_CRASH") == "A":
        _write(ctx, "out", "partial")
        os._exit(9)  # like SIGKILL: no cleanup, no publish
    _write(ctx, "out", f"a{ctx.config.data.seed}")
    return {"out": {"counts": {"seen": 3, "accepted": 3}}}


def run_b(ctx):
    CALLS.append("B")
    _write(ctx, "out", _read(ctx.inputs["x"]) + f"-b{ctx.config.train.batch_size}")
    return {"out": {"counts": {"records": 1}}}


def run_c(ctx):
    CALLS.append("C")
    _write(ctx, "out", _read(ctx.inputs["y"]) + f"-c{ctx.config.eval.beam_size}")
    return {"out": {"properties": {"metrics": {"Bleu_4": 0.5}}}}


def run_evaluate(ctx):
    CALLS.append("C")
    _write(ctx, "out", _read(ctx.inputs["y"]) + "-evaluated")
    baseline = ctx.inputs.get("baseline")
    return {"out": {"properties": {"metrics": {"Bleu_4": 0.5},
                                   "baseline": baseline.uri if baseline else None}}}


def run_push(ctx):
    CALLS.append("P")
    return {"pushed": {"properties": {"pushed": True, "version": ctx.execution_id}}}


class _Mod:
    def __init__(self, fn):
        self.run = fn


STAGES = (
    StageSpec("A", "tests.pipeline.fake_stages_a", outputs={"out": "Examples"},
              config_sections=("data",)),
    StageSpec("B", "tests.pipeline.fake_stages_b", inputs={"x": ("A", "out")},
              outputs={"out": "Model"}, config_sections=("train",)),
    StageSpec("C", "tests.pipeline.fake_stages_c", inputs={"y": ("B", "out")},
              outputs={"out": "Evaluation"}, config_sections=("eval",),
              summary={"metrics": ("out", "metrics")}),
)

# A -> B -> C -> P, where C compares with the Evaluation behind the last push.
PUSH_STAGES = (
    STAGES[0], STAGES[1],
    StageSpec("C", "tests.pipeline.fake_stages_evaluate", inputs={"y": ("B", "out")},
              outputs={"out": "Evaluation"}, config_sections=("eval",),
              resolved={"baseline": LatestArtifact("P", "pushed", where={"pushed": True},
                                                   follow="evaluation", unless_same="y")}),
    StageSpec("P", "tests.pipeline.fake_stages_push",
              inputs={"y": ("B", "out"), "evaluation": ("C", "out")},
              outputs={"pushed": "PushedModel"}, config_sections=("push",),
              summary={"pushed_version": ("pushed", "version")}),
)
