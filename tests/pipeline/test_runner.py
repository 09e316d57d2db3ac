"""Runner: caching, downstream invalidation, atomic publishing, summary and inspect."""
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from components.contract.artifacts import Artifact, ArtifactError
from pipeline import config as config_lib
from pipeline.runner import Runner, StageError, inspect
from tests.pipeline import fake_stages

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(root, overrides=(), use_cache=True, stages=None, dag_stages=fake_stages.STAGES):
    config = config_lib.apply_overrides(config_lib.PipelineConfig(), overrides)
    return Runner(config, str(root), use_cache=use_cache, stages=dag_stages,
                  log=lambda _: None).run(stages)


def _statuses(summary):
    return {name: st["status"] for name, st in summary["stages"].items()}


def test_rerun_with_nothing_changed_is_all_cached(tmp_path):
    first = _run(tmp_path)
    assert _statuses(first) == {"A": "ran", "B": "ran", "C": "ran"}
    second = _run(tmp_path)
    assert _statuses(second) == {"A": "cached", "B": "cached", "C": "cached"}
    assert second["stages"]["C"]["outputs"] == first["stages"]["C"]["outputs"]
    with open(tmp_path / "run_summary.json") as f:
        on_disk = json.load(f)
    assert on_disk["stages"]["A"]["counts"] == {"seen": 3, "accepted": 3}
    assert on_disk["metrics"] == {"Bleu_4": 0.5}


def test_changed_config_reruns_stage_and_downstream_only(tmp_path):
    _run(tmp_path)
    summary = _run(tmp_path, ["train.batch_size=7"])
    assert _statuses(summary) == {"A": "cached", "B": "ran", "C": "ran"}
    out = Artifact.load(summary["stages"]["C"]["outputs"]["out"])
    assert open(out.path("value.txt")).read() == "a0-b7-c3"
    summary = _run(tmp_path, ["train.batch_size=7", "eval.beam_size=5"])
    assert _statuses(summary) == {"A": "cached", "B": "cached", "C": "ran"}
    # Going back to the first config finds the first outputs again.
    assert _statuses(_run(tmp_path)) == {"A": "cached", "B": "cached", "C": "cached"}


def test_no_cache_runs_everything(tmp_path):
    _run(tmp_path)
    assert _statuses(_run(tmp_path, use_cache=False)) == {"A": "ran", "B": "ran", "C": "ran"}


def test_selected_stages_resolve_upstream_from_cache(tmp_path):
    with pytest.raises(StageError, match="no outputs for the current config"):
        _run(tmp_path, stages=["B"])
    _run(tmp_path, stages=["A"])
    summary = _run(tmp_path, ["train.batch_size=9"], stages=["B"])
    assert _statuses(summary) == {"B": "ran"}


def test_a_stage_between_one_that_ran_and_a_selected_one_runs_too(tmp_path):
    """`--stages Trainer,Evaluator` runs the Exporter between them (here A, C and B)."""
    logged = []
    _run(tmp_path)
    config = config_lib.apply_overrides(config_lib.PipelineConfig(), ["data.seed=4"])
    summary = Runner(config, str(tmp_path), stages=fake_stages.STAGES,
                     log=logged.append).run(["A", "C"])
    assert _statuses(summary) == {"A": "ran", "B": "ran", "C": "ran"}
    out = Artifact.load(summary["stages"]["C"]["outputs"]["out"])
    assert open(out.path("value.txt")).read() == "a4-b64-c3"
    assert any(line.startswith("[B] runs too: it reads the new output of A") for line in logged)
    # Nothing upstream ran: an unselected stage without outputs is still refused.
    with pytest.raises(StageError, match="B has no outputs for the current config"):
        _run(tmp_path, ["data.seed=4", "train.batch_size=3"], stages=["A", "C"])


def test_deleted_output_is_not_reused(tmp_path):
    first = _run(tmp_path)
    os.remove(os.path.join(first["stages"]["B"]["outputs"]["out"], "artifact.json"))
    assert _statuses(_run(tmp_path)) == {"A": "cached", "B": "ran", "C": "ran"}


def test_killed_stage_leaves_no_readable_artifact(tmp_path):
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from tests.pipeline.test_runner import _run\n_run(%r)\n") % (ROOT_DIR, str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ,
                          "FAKE_STAGE_CRASH": "A"}, capture_output=True)
    assert proc.returncode == 9
    leftovers = os.listdir(tmp_path / "A")
    assert any(e.startswith(".tmp-") for e in leftovers)
    assert not any(e.isdigit() for e in leftovers)  # nothing published
    with pytest.raises(ArtifactError, match="unpublished"):
        tmp = [e for e in leftovers if e.startswith(".tmp-")][0]
        Artifact.load(str(tmp_path / "A" / tmp / "out"))
    summary = _run(tmp_path)
    assert _statuses(summary) == {"A": "ran", "B": "ran", "C": "ran"}
    assert not any(e.startswith(".tmp-") for e in os.listdir(tmp_path / "A"))
    states = {x["id"]: x["state"] for x in inspect(str(tmp_path))["executions"]}
    assert "abandoned" in states.values()


def test_failed_stage_is_recorded_and_not_published(tmp_path, monkeypatch):
    def boom(ctx):
        raise RuntimeError("bad data")
    monkeypatch.setattr(fake_stages, "run_b", boom)
    import tests.pipeline.fake_stages_b as mod_b
    monkeypatch.setattr(mod_b, "run", boom)
    with pytest.raises(RuntimeError, match="bad data"):
        _run(tmp_path)
    info = inspect(str(tmp_path))
    failed = [x for x in info["executions"] if x["state"] == "failed"]
    assert failed and "bad data" in failed[0]["error"]
    assert not os.path.exists(tmp_path / "B" / "2")


def test_inspect_lists_lineage_newest_first(tmp_path):
    _run(tmp_path)
    _run(tmp_path)
    info = inspect(str(tmp_path))
    ids = [x["id"] for x in info["executions"]]
    assert ids == sorted(ids, reverse=True)
    ran_c = [x for x in info["executions"] if x["stage"] == "C" and x["state"] == "complete"][0]
    assert ran_c["inputs"][0]["name"] == "y"
    assert ran_c["outputs"][0]["type"] == "Evaluation"
    assert [x["state"] for x in info["executions"][:3]] == ["cached"] * 3


def test_code_change_invalidates_cache(tmp_path, monkeypatch):
    _run(tmp_path)
    from pipeline import runner
    monkeypatch.setattr(runner, "code_fingerprint", lambda module, root: "changed")
    assert _statuses(_run(tmp_path)) == {"A": "ran", "B": "ran", "C": "ran"}


def test_unwritable_root_fails_clearly(tmp_path):
    root = tmp_path / "ro"
    root.mkdir()
    os.chmod(root, 0o500)
    try:
        if os.access(root, os.W_OK):  # running as root: simulate with a file in the way
            blocker = tmp_path / "file"
            blocker.write_text("x")
            root = blocker / "sub"
        with pytest.raises(StageError, match="not writable"):
            _run(root)
    finally:
        os.chmod(tmp_path / "ro", 0o700)


def _code_package(root):
    """Stages A -> B -> C in a package of their own; B imports `helper`."""
    pkg = root / "runner_codepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("SUFFIX = ''\n")
    (pkg / "a.py").write_text("from tests.pipeline.fake_stages import run_a as run\n")
    (pkg / "b.py").write_text("from runner_codepkg import helper  # noqa: F401\n"
                              "from tests.pipeline.fake_stages import run_b as run\n")
    (pkg / "c.py").write_text("from tests.pipeline.fake_stages import run_c as run\n")
    return tuple(dataclasses.replace(spec, module=f"runner_codepkg.{spec.name.lower()}")
                 for spec in fake_stages.STAGES)


def test_editing_a_file_a_stage_imports_reruns_it_and_its_dependants(tmp_path, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    stages = _code_package(code)
    monkeypatch.syspath_prepend(str(code))
    config = config_lib.PipelineConfig()

    def run():
        summary = Runner(config, str(tmp_path / "root"), stages=stages, log=lambda _: None,
                         code_root=str(code)).run()
        return _statuses(summary)

    assert run() == {"A": "ran", "B": "ran", "C": "ran"}
    assert run() == {"A": "cached", "B": "cached", "C": "cached"}
    (code / "runner_codepkg" / "helper.py").write_text("SUFFIX = '!'\n")
    assert run() == {"A": "cached", "B": "ran", "C": "ran"}


def test_a_stage_reading_undeclared_config_fails(tmp_path, monkeypatch):
    import tests.pipeline.fake_stages_b as mod_b

    def sneaky(ctx):
        return {"out": {"properties": {"beam": ctx.config.eval.beam_size}}}
    monkeypatch.setattr(mod_b, "run", sneaky)
    with pytest.raises(config_lib.UndeclaredConfigError, match=r"B read config section \[eval\]"):
        _run(tmp_path)
    failed = [x for x in inspect(str(tmp_path))["executions"] if x["state"] == "failed"]
    assert [x["stage"] for x in failed] == ["B"]


def test_key_level_declarations_cover_only_their_keys(tmp_path, monkeypatch):
    import tests.pipeline.fake_stages_b as mod_b
    seen = {}

    def reads_one_key(ctx):
        seen["batch"] = ctx.config.train.batch_size
        with pytest.raises(config_lib.UndeclaredConfigError, match=r"train\.epochs"):
            ctx.config.train.epochs  # noqa: B018
        return fake_stages.run_b(ctx)
    monkeypatch.setattr(mod_b, "run", reads_one_key)
    stages = (fake_stages.STAGES[0],
              dataclasses.replace(fake_stages.STAGES[1], config_sections=("train.batch_size",)),
              fake_stages.STAGES[2])

    def run(overrides=()):
        config = config_lib.apply_overrides(config_lib.PipelineConfig(), overrides)
        return _statuses(Runner(config, str(tmp_path), stages=stages, log=lambda _: None).run())

    assert run() == {"A": "ran", "B": "ran", "C": "ran"} and seen["batch"] == 64
    assert run(["train.epochs=99"]) == {"A": "cached", "B": "cached", "C": "cached"}
    assert run(["train.batch_size=5"]) == {"A": "cached", "B": "ran", "C": "ran"}


def test_every_declared_config_of_the_product_dag_exists():
    from pipeline import dag
    for spec in dag.STAGES:
        assert config_lib.DeclaredConfig(config_lib.PipelineConfig(), spec.config_sections,
                                         spec.name).to_dict()
    with pytest.raises(config_lib.ConfigError, match="no key"):
        config_lib.DeclaredConfig(config_lib.PipelineConfig(), ("train.nope",))


def test_latest_pushed_evaluation_is_resolved_from_earlier_runs(tmp_path):
    summaries = [_run(tmp_path, overrides, stages=None, dag_stages=fake_stages.PUSH_STAGES)
                 for overrides in ((), (), ("train.batch_size=7",))]
    first, again, changed = (s["stages"] for s in summaries)
    # No push before the first run; the second run's model is the pushed one
    # (not compared with itself): nothing to resolve, so C is cached.
    assert first["C"]["status"] == "ran" and again["C"]["status"] == "cached"
    baseline = Artifact.load(changed["C"]["outputs"]["out"]).properties["baseline"]
    assert changed["C"]["status"] == "ran" and baseline == first["C"]["outputs"]["out"]
    assert Artifact.load(first["C"]["outputs"]["out"]).properties["baseline"] is None
    assert summaries[2]["pushed_version"] == changed["P"]["execution_id"]
    lineage = [x for x in inspect(str(tmp_path))["executions"]
               if x["stage"] == "C" and x["state"] == "complete"][0]
    assert {e["name"] for e in lineage["inputs"]} == {"y", "baseline"}


def test_a_declared_view_can_be_replaced_and_stays_declared():
    config = config_lib.PipelineConfig()
    view = config_lib.DeclaredConfig(config, ("train", "model.attention"), stage="Trainer")
    changed = config_lib.replace_section(view, "train", mixed_precision="float32", epochs=3)
    assert isinstance(changed, config_lib.DeclaredConfig)
    assert (changed.train.mixed_precision, changed.train.epochs) == ("float32", 3)
    assert changed.model.attention == config.model.attention
    assert view.train.epochs == config.train.epochs            # the original is unchanged
    with pytest.raises(config_lib.UndeclaredConfigError):
        _ = changed.eval.beam_size
    plain = config_lib.replace_section(config, "train", epochs=3)
    assert isinstance(plain, config_lib.PipelineConfig) and plain.train.epochs == 3
