"""A stand-in Pusher for the relocation tests: writes a version folder into a serving dir.

The serving dir is `push.serving_dir`, else `<root>/serving`; the artifact
records it, the version folder (as `external_paths`) and its inputs' folders,
like `components.pusher`.
"""
import os

from pipeline.dag import StageSpec
from tests.pipeline import fake_stages


def run(ctx):
    fake_stages.CALLS.append("P")
    serving = ctx.config.push.serving_dir or os.path.join(ctx.root, "serving")
    version = os.path.join(serving, ctx.config.push.model_name, str(ctx.execution_id))
    os.makedirs(version)
    with open(os.path.join(version, "model.txt"), "w") as f:
        f.write(fake_stages._read(ctx.inputs["y"]))
    return {"pushed": {"properties": {
        "pushed": True, "version": ctx.execution_id, "path": version, "serving_dir": serving,
        "model_uri": ctx.inputs["y"].uri, "evaluation_uri": ctx.inputs["evaluation"].uri,
        "external_paths": [version]}}}


# A -> B -> C -> P, C comparing with the Evaluation behind the last push (a resolver input).
STAGES = fake_stages.PUSH_STAGES[:3] + (
    StageSpec("P", "tests.pipeline.fake_stages_serving",
              inputs={"y": ("B", "out"), "evaluation": ("C", "out")},
              outputs={"pushed": "PushedModel"}, config_sections=("push",),
              summary={"pushed_version": ("pushed", "version")}),
)
