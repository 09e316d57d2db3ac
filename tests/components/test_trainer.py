"""Trainer: input pipeline, one custom loop under every strategy, resume after a kill.

The multi-process tests start fresh Python processes: logical CPU devices
and multi-worker collectives must be set up before TensorFlow's first op.
"""
from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from components import trainer
from components.contract import schema
from components.contract.artifacts import Artifact
from components.trainer import checkpointing, distribute, model_setup, train_data
from models.text import PAD_ID
from pipeline import config as config_lib
from pipeline import dag
from pipeline.config import ModelConfig, PipelineConfig, TrainConfig
from pipeline.runner import Runner, StageContext
from tests.components import trainer_worker

ROOT = trainer_worker.ROOT
WORKER_SCRIPT = os.path.join(ROOT, "tests", "components", "trainer_worker.py")
TINY_MODEL = ModelConfig(embedding_dim=8, hidden_dim=16, attention_dim=8, dropout=0.0)
# float32: the strategy tests compare weights to 1e-4, tighter than bfloat16
# rounding; `auto` has its own test.
TINY_TRAIN = TrainConfig(batch_size=8, epochs=2, learning_rate=1e-2, checkpoint_every=2,
                         val_examples=4, log_every=1, shuffle_buffer=64, patience=10,
                         mixed_precision="float32")
PROCESS_TIMEOUT = 300


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Published tiny Annotations (32 train, 8 val images, 3x3x8 grids) and Vocabulary."""
    root = str(tmp_path_factory.mktemp("trainer_source"))
    annotations, vocabulary = trainer_worker.write_tiny_artifacts(root)
    return {"root": root, "annotations": Artifact.load(annotations, "Annotations"),
            "vocabulary": Artifact.load(vocabulary, "Vocabulary")}


def _config(model=TINY_MODEL, **train) -> PipelineConfig:
    return PipelineConfig(model=model, train=TrainConfig(**{**vars(TINY_TRAIN), **train}))


def _ctx(source, folder, config) -> StageContext:
    out = os.path.join(folder, "out", "model")
    os.makedirs(out, exist_ok=True)
    return StageContext(stage="Trainer", config=config,
                        inputs={"annotations": source["annotations"],
                                "vocabulary": source["vocabulary"]},
                        outputs={"model": out}, work_dir=os.path.join(folder, "work"),
                        root=str(folder), execution_id=1)


def _env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def _write_config(folder, config) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "config.json")
    with open(path, "w") as f:
        json.dump(config_lib.to_dict(config), f)
    return path


def _pipeline(folder, config, source, **env) -> subprocess.Popen:
    """The Runner (stand-in Preprocess + real Trainer) in a fresh process."""
    cmd = [sys.executable, WORKER_SCRIPT, "--root", os.path.join(folder, "root"),
           "--config-json", _write_config(folder, config), "--source", source["root"]]
    return subprocess.Popen(cmd, env=_env(**env), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"process timed out:\n{err[-4000:]}")
    assert proc.returncode == 0, err[-4000:]
    return out, err


def _summary(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _events(logs_dir: str) -> dict[str, list[tuple[int, object]]]:
    """tag -> [(step, value)] of the summaries under `logs_dir` (scalars as floats)."""
    from tensorflow.python.summary.summary_iterator import summary_iterator
    values: dict = {}
    for path in sorted(glob.glob(os.path.join(logs_dir, "**", "events.out.tfevents.*"),
                                 recursive=True)):
        for event in summary_iterator(path):
            for v in event.summary.value:
                array = tf.make_ndarray(v.tensor)
                value = float(array) if array.dtype.kind == "f" and array.ndim == 0 else array
                values.setdefault(v.tag, []).append((event.step, value))
    return values


# ----------------------------------------------------------------------------- input pipeline


def _data(source, **kwargs) -> train_data.TrainData:
    files = schema.split_files(source["annotations"].uri, "train")
    args = dict(global_batch_size=8, seed=0, shuffle_buffer=64, cache=True)
    args.update(kwargs)
    return train_data.TrainData(files, trainer_worker.GRID, **args)


def _batches(ds) -> list[dict]:
    return [{k: v.numpy() for k, v in b.items()} for b in ds]


def _captions(batches) -> list[tuple]:
    return [tuple(int(t) for t in row if t != PAD_ID)
            for b in batches for row in b["tokens"]]


def test_each_epoch_draws_fresh_captions_deterministically(source):
    data = _data(source)
    assert data.num_records == 32 and data.steps_per_epoch() == 4
    epoch0, again, epoch1 = (_batches(data.dataset(e)) for e in (0, 0, 1))
    assert len(epoch0) == 4
    for b in epoch0:
        assert b["annotations"].shape == (8, 9, 8) and b["annotations"].dtype == np.float32
        assert b["tokens"][:, 0].tolist() == [1] * 8                  # <start>
        longest = max(int(np.sum(row != PAD_ID)) for row in b["tokens"])
        assert b["tokens"].shape[1] == longest                          # padded to the batch max
    assert _captions(epoch0) == _captions(again)                        # seeded by the epoch
    assert _captions(epoch0) != _captions(epoch1)
    both = _batches(data.dataset(0, epochs=2))                          # one stream, two epochs
    assert _captions(both) == _captions(epoch0) + _captions(epoch1)
    assert _captions(_batches(data.dataset(0, skip_steps=3, epochs=2))) == _captions(both[3:])
    # Same images in another order, and other captions for some of them.
    grids = lambda bs: sorted(g.tobytes() for b in bs for g in b["annotations"])  # noqa: E731
    assert grids(epoch0) == grids(epoch1)


def test_input_pipelines_split_an_epoch_evenly(source):
    data = _data(source)

    def context(i):
        return tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i,
                                          num_replicas_in_sync=2)

    shares = [_batches(data.dataset(0, context(i))) for i in range(2)]
    assert [len(s) for s in shares] == [data.steps_per_epoch(2)] * 2 == [4, 4]
    assert all(b["tokens"].shape[0] == 4 for s in shares for b in s)   # per-replica batch
    grids = [{g.tobytes() for b in s for g in b["annotations"]} for s in shares]
    assert not grids[0] & grids[1]


def test_bucketing_pads_less_with_the_same_batches_and_skip_resumes(source):
    plain, bucketed = _data(source), _data(source, bucket_by_length=True)
    a, b = _batches(plain.dataset(0)), _batches(bucketed.dataset(0))
    assert len(a) == len(b)
    assert sorted(_captions(a)) == sorted(_captions(b))                 # the same draws
    pads = lambda bs: sum(int(np.sum(x["tokens"] == PAD_ID)) for x in bs)  # noqa: E731
    assert pads(b) < pads(a)
    resumed = _batches(bucketed.dataset(0, skip_steps=3))
    assert len(resumed) == 1 and np.array_equal(resumed[0]["tokens"], b[3]["tokens"])
    fixed = _batches(_data(source, pad_multiple=8).dataset(0))
    assert all(x["tokens"].shape[1] == 8 for x in fixed)


def test_mean_caption_tokens_counts_the_predicted_tokens_of_every_caption(source):
    data = _data(source)
    lengths = [length for _, record in data.source().as_numpy_iterator()
               for length in record["lengths"]]
    want = float(np.mean(lengths)) - 1.0                                 # <start> is not predicted
    assert data.mean_caption_tokens() == pytest.approx(want)
    assert data.mean_caption_tokens(sample=4) > 0


def test_cache_auto_caches_a_split_that_fits_the_budget_and_streams_one_that_does_not():
    grid = [14, 14, 512]                      # the paper's grid: 200,704 bytes in float16
    cached, why = train_data.cache_plan("auto", 1000, grid, budget_mb=4096)
    assert cached and "fits train.cache_budget_mb=4096" in why and "1000 images" in why
    cached, why = train_data.cache_plan("auto", 113_000, grid, budget_mb=4096)
    assert not cached and "streamed from disk" in why and "exceeds" in why
    assert "~ 21,850 MB" in why               # COCO's train split would not fit
    assert train_data.cache_plan("TRUE", 113_000, grid, budget_mb=1)[0] is True
    assert train_data.cache_plan(False, 10, grid, 4096)[0] is False
    with pytest.raises(ValueError, match="auto, true, false"):
        train_data.cache_plan("sometimes", 10, grid, 4096)


def test_streamed_and_cached_batches_are_the_same(source):
    streamed = _data(source, cache="auto", cache_budget_mb=0)
    cached = _data(source, cache="auto")
    assert (streamed.cached, cached.cached) == (False, True)
    for epoch in (0, 1):
        a, b = _batches(streamed.dataset(epoch)), _batches(cached.dataset(epoch))
        assert len(a) == len(b) == 4
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x["annotations"], y["annotations"])
            np.testing.assert_array_equal(x["tokens"], y["tokens"])


def test_eval_set_holds_every_reference(source):
    files = schema.split_files(source["annotations"].uri, "val")
    vocab = schema.read_vocabulary(source["vocabulary"].uri)
    ev = train_data.load_eval_set(files, trainer_worker.GRID, 3, vocab)
    assert len(ev) == 3 and ev.annotations.shape == (3, 9, 8)
    assert all(len(r) == 3 for r in ev.references)
    index, tokens = ev.pairs()
    assert tokens.shape[0] == 9 and index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]


# ----------------------------------------------------------------------------- configuration


def test_cluster_role_and_strategy_errors(monkeypatch):
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    role = distribute.cluster_role(json.dumps({"cluster": cluster,
                                               "task": {"type": "worker", "index": 1}}))
    assert (role.num_workers, role.is_chief, role.task_id) == (2, False, 1)
    chief = distribute.cluster_role(json.dumps(
        {"cluster": {"chief": ["h:1"], **cluster}, "task": {"type": "chief", "index": 0}}))
    assert chief.is_chief and chief.num_workers == 3
    assert distribute.cluster_role("") == distribute.ClusterRole()
    with pytest.raises(distribute.StrategyError, match="TF_CONFIG"):
        distribute.cluster_role("{not json")
    with pytest.raises(distribute.StrategyError, match="must be one of"):
        distribute.make_strategy(TrainConfig(strategy="tpu"))
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(distribute.StrategyError, match="TF_CONFIG"):
        distribute.make_strategy(TrainConfig(strategy="multi_worker"))


def test_non_chief_worker_does_not_run_the_stage(source, tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": 1}}))
    ctx = _ctx(source, str(tmp_path), _config(strategy="multi_worker"))
    with pytest.raises(distribute.StrategyError, match="python -m components.trainer"):
        trainer.run(ctx)
    assert os.listdir(ctx.outputs["model"]) == []


def test_one_trainer_per_work_folder(tmp_path):
    held = checkpointing.lock_work_dir(str(tmp_path))
    try:
        with pytest.raises(RuntimeError, match=f"pid {os.getpid()}"):
            checkpointing.lock_work_dir(str(tmp_path))
    finally:
        held.close()
    checkpointing.lock_work_dir(str(tmp_path)).close()   # free again


def test_learning_rate_schedules():
    import keras
    assert model_setup.learning_rate_schedule(TrainConfig(learning_rate=0.1), 100) == 0.1
    cosine = model_setup.learning_rate_schedule(
        TrainConfig(learning_rate=0.1, lr_schedule="cosine", warmup_steps=10), 110)
    warm = model_setup.learning_rate_schedule(
        TrainConfig(learning_rate=0.1, lr_schedule="constant", warmup_steps=10), 110)
    lr = lambda s, k: float(s(k))  # noqa: E731
    assert lr(cosine, 5) == pytest.approx(0.05) and lr(cosine, 10) == pytest.approx(0.1)
    assert lr(cosine, 60) == pytest.approx(0.05, abs=1e-6) and lr(cosine, 110) < 1e-6
    assert lr(warm, 5) == pytest.approx(0.05) and lr(warm, 100) == pytest.approx(0.1)
    opt = model_setup.make_optimizer(TrainConfig(optimizer="rmsprop",
                                             mixed_precision="mixed_float16"), 10)
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
    assert isinstance(opt.inner_optimizer, keras.optimizers.RMSprop)
    with pytest.raises(ValueError, match="optimizer"):
        model_setup.make_optimizer(TrainConfig(optimizer="sgd"), 10)


# ----------------------------------------------------------------------------- training


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_soft_and_hard_attention_drive_the_loss_down(source, tmp_path, attention):
    import keras
    epochs = 4 if attention == "soft" else 5
    metric = "bleu4" if attention == "hard" else "val_loss"
    # Hard: 2 epochs (8 steps) of expected-alpha warmup, which are not best-model candidates.
    warmup_epochs = 2 if attention == "hard" else 0
    warmup = warmup_epochs * 4  # steps: 32 train records, batch 8
    config = _config(model=ModelConfig(**{**vars(TINY_MODEL), "attention": attention,
                                          "expected_alpha_warmup_epochs": warmup_epochs}),
                     epochs=epochs, early_stopping_metric=metric, lr_schedule="cosine",
                     warmup_steps=2, bucket_by_length=attention == "hard")
    ctx = _ctx(source, str(tmp_path), config)
    result = trainer.run(ctx)["model"]
    props, counts = result["properties"], result["counts"]
    out = ctx.outputs["model"]
    assert sorted(os.listdir(out)) == ["best.keras", "checkpoints", "history.jsonl", "logs",
                                       "model.keras", "model_config.json"]
    assert counts == {"train_examples": 32, "steps": 4 * epochs, "val_examples": 4}
    assert props["steps"] == 4 * epochs and props["examples_seen"] == 32 * epochs
    assert props["attention"] == attention and props["vocab_size"] == 18
    assert props["grid_shape"] == [3, 3, 8] and props["wall_seconds"] > 0
    assert props["best_metric_name"] == metric and warmup // 4 <= props["best_epoch"] < epochs
    history = props["history"]
    assert [row["epoch"] for row in history] == list(range(epochs))
    assert history[-1]["val_loss"] < history[0]["val_loss"]
    with open(os.path.join(out, "model_config.json")) as f:
        model_config = json.load(f)
    assert model_config["vocab_size"] == 18 and model_config["model"]["attention"] == attention
    model = keras.saving.load_model(os.path.join(out, "model.keras"))
    assert checkpointing.weights_digest(model) == props["weights_digest"]
    assert model.options.expected_alpha_warmup == warmup  # epochs x steps per epoch
    assert tf.train.latest_checkpoint(os.path.join(out, "checkpoints")).endswith(
        f"ckpt-{4 * epochs}")
    events = _events(os.path.join(out, "logs"))
    for tag in ("train/loss", "train/nll", "train/learning_rate", "train/attention_entropy",
                "val/val_loss"):
        assert tag in events, sorted(events)
    nll = [v for _, v in events["train/nll"]]
    assert np.mean(nll[-4:]) < np.mean(nll[:4])
    # Attention maps: a PNG strip (one 64 x 64 tile per word) of the first validation image.
    (_, image), = events["attention/val_0"][-1:]
    width, height = int(image[0]), int(image[1])
    assert height == 64 and width % 64 == 0 and image[2][:4] == b"\x89PNG"
    assert "attention/val_0_caption" in events
    if attention == "hard":
        baseline = [v for _, v in events["train/baseline"]]
        assert any(v != 0.0 for v in baseline)
        assert props["baseline"] == pytest.approx(model.reward_baseline.numpy())
        assert all(v == 1.0 for step, v in events["train/used_expected_alpha"] if step <= warmup)
        assert model.hard_training_steps.numpy() == 4 * epochs
        assert "val/bleu4" in events
    else:
        assert "train/baseline" not in events


def test_streamed_and_cached_training_give_the_same_model(source, tmp_path, capfd):
    digests = {}
    for cache in ("true", "false"):
        ctx = _ctx(source, str(tmp_path / cache), _config(epochs=2, cache=cache))
        digests[cache] = trainer.run(ctx)["model"]["properties"]["weights_digest"]
        log = capfd.readouterr().err
        assert f"train split train.cache={cache} (32 images x [3, 3, 8] float16" in log
    assert digests["true"] == digests["false"]


def test_auto_precision_is_resolved_logged_and_recorded(source, tmp_path, monkeypatch, capfd):
    import keras

    from components.contract import precision
    chosen = precision.Precision("mixed_bfloat16", "auto", "no GPU; CPU flag avx512_bf16")
    monkeypatch.setattr(precision, "choose_auto", lambda: chosen)
    # The stage's view of the config, as the runner passes it: only the declared sections.
    declared = config_lib.DeclaredConfig(_config(epochs=1, mixed_precision="auto"),
                                         dag.stage("Trainer").config_sections, "Trainer")
    ctx = _ctx(source, str(tmp_path), declared)
    props = trainer.run(ctx)["model"]["properties"]
    assert props["mixed_precision"] == "mixed_bfloat16"
    assert props["mixed_precision_requested"] == "auto"
    assert props["mixed_precision_reason"] == chosen.reason
    assert "precision mixed_bfloat16 (auto: no GPU; CPU flag avx512_bf16)" in capfd.readouterr().err
    with open(os.path.join(ctx.outputs["model"], "model_config.json")) as f:
        assert json.load(f)["mixed_precision"] == "mixed_bfloat16"
    # Trained in bfloat16, saved to compute in float32, with the very weights trained.
    from components.trainer import checkpointing
    for name in ("model.keras", "best.keras"):
        model = keras.saving.load_model(os.path.join(ctx.outputs["model"], name))
        assert {w.dtype for w in model.trainable_weights} == {"float32"}
        assert model.dtype_policy.name == "float32"
        assert {layer.dtype_policy.name for layer in model._flatten_layers()} == {"float32"}
    model = keras.saving.load_model(os.path.join(ctx.outputs["model"], "model.keras"))
    assert checkpointing.weights_digest(model) == props["weights_digest"]
    assert keras.mixed_precision.global_policy().name == "float32"   # restored
    with pytest.raises(ValueError, match="auto, float32"):
        trainer.run(_ctx(source, str(tmp_path / "bad"), _config(mixed_precision="bf16")))


@pytest.mark.slow
def test_mirrored_on_two_logical_cpus_matches_default(source, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    import keras
    tf.constant(0.0) + 1.0  # TF runs here: run() must train `mirrored` in a child process
    devices = len(tf.config.list_logical_devices("CPU"))
    mirrored_ctx = _ctx(source, str(tmp_path / "mirrored"), _config(
        epochs=1, strategy="mirrored", cpu_logical_devices=2))
    default_ctx = _ctx(source, str(tmp_path / "default"), _config(epochs=1))
    with ThreadPoolExecutor(1) as pool:
        child = pool.submit(trainer.run, mirrored_ctx)
        default = trainer.run(default_ctx)["model"]["properties"]
        mirrored = child.result(timeout=PROCESS_TIMEOUT)["model"]["properties"]
    assert len(tf.config.list_logical_devices("CPU")) == devices  # this process kept its own
    assert (mirrored["replicas"], default["replicas"]) == (2, 1)
    assert mirrored["steps"] == default["steps"] == 4
    a = keras.saving.load_model(os.path.join(mirrored_ctx.outputs["model"], "model.keras"))
    b = keras.saving.load_model(os.path.join(default_ctx.outputs["model"], "model.keras"))
    assert len(a.weights) == len(b.weights)
    for wa, wb in zip(a.weights, b.weights, strict=True):
        np.testing.assert_allclose(np.asarray(wa.numpy(), np.float64),
                                   np.asarray(wb.numpy(), np.float64),
                                   rtol=1e-4, atol=1e-5, err_msg=wa.path)
    assert mirrored["history"][0]["val_loss"] == pytest.approx(default["history"][0]["val_loss"],
                                                               rel=1e-4)


@pytest.mark.slow
def test_multi_worker_two_processes_end_in_sync_and_only_the_chief_publishes(source, tmp_path):
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}

    def tf_config(index):
        return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})

    # Hard attention: the baseline and the sampler's seed states must stay in sync too.
    config = _config(model=ModelConfig(**{**vars(TINY_MODEL), "attention": "hard"}),
                     epochs=2, strategy="multi_worker", bucket_by_length=True)
    chief = _pipeline(str(tmp_path / "chief"), config, source, TF_CONFIG=tf_config(0))
    worker_dir = tmp_path / "worker"
    worker_dir.mkdir()
    result_path = str(worker_dir / "result.json")
    worker = subprocess.Popen(
        [sys.executable, "-m", "components.trainer",
         "--annotations", source["annotations"].uri, "--vocabulary", source["vocabulary"].uri,
         "--config-json", _write_config(str(worker_dir), config),
         "--work-dir", str(worker_dir / "work"), "--result", result_path],
        env=_env(TF_CONFIG=tf_config(1)), cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    out, chief_err = _finish(chief)
    _, worker_err = _finish(worker)
    summary = _summary(out)
    model_uri = summary["stages"]["Trainer"]["outputs"]["model"]
    chief_props = Artifact.load(model_uri, "Model").properties
    with open(result_path) as f:
        worker_props = json.load(f)["model"]["properties"]
    assert chief_props["is_chief"] and not worker_props["is_chief"]
    assert chief_props["workers"] == worker_props["workers"] == 2
    assert chief_props["replicas"] == 2
    # 32 images, global batch 8: 4 steps per epoch, each worker reads 16 images.
    assert chief_props["steps"] == worker_props["steps"] == 8
    assert chief_props["weights_digest"] == worker_props["weights_digest"]
    assert "resuming" not in chief_err
    # Only the chief's artifact exists; the worker's saves are gone.
    trainer_dir = os.path.join(str(tmp_path / "chief"), "root", "Trainer")
    assert sorted(e for e in os.listdir(trainer_dir) if not e.startswith(".work")) == \
        [os.path.basename(os.path.dirname(model_uri))]
    assert not os.path.exists(worker_dir / "work" / "model")
    assert glob.glob(str(tmp_path / "**" / ".worker-*"), recursive=True) == []
    assert os.listdir(worker_dir / "work") == []


@pytest.mark.slow
def test_killed_training_resumes_from_its_checkpoint(source, tmp_path, capfd, monkeypatch):
    config = _config(model=ModelConfig(**{**vars(TINY_MODEL), "attention": "hard"}),
                     epochs=4, checkpoint_every=2, keep_checkpoints=3)
    folder = str(tmp_path)
    proc = _pipeline(folder, config, source)
    deadline = time.time() + PROCESS_TIMEOUT
    pattern = os.path.join(folder, "root", "Trainer", ".work", "*", "checkpoints", "checkpoint")
    while not glob.glob(pattern):
        assert proc.poll() is None, proc.communicate()[1][-4000:]
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    work_dir = os.path.dirname(os.path.dirname(glob.glob(pattern)[0]))
    killed_at = tf.train.load_checkpoint(
        tf.train.latest_checkpoint(os.path.join(work_dir, "checkpoints")))
    step = int(killed_at.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE"))
    assert 2 <= step < 16
    assert not glob.glob(os.path.join(folder, "root", "Trainer", "[0-9]*"))  # nothing published

    # The re-run, here in this process (TensorFlow already runs: `default` needs nothing new).
    monkeypatch.setenv(trainer_worker.SOURCE_ENV, source["root"])
    summary = Runner(config, os.path.join(folder, "root"),
                     stages=[trainer_worker.FAKE_PREPROCESS, dag.stage("Trainer")]).run()
    err = capfd.readouterr().err
    assert "resuming from step" in err
    resumed = int(err.split("resuming from step ")[1].split()[0])
    assert resumed >= step
    props = Artifact.load(summary["stages"]["Trainer"]["outputs"]["model"], "Model").properties
    assert props["resumed_from_step"] == resumed and props["steps"] == 16
    assert [row["epoch"] for row in props["history"]] == [0, 1, 2, 3]
    # Every checkpoint left in the work folder restores, and steps only grew.
    state = tf.train.get_checkpoint_state(os.path.join(work_dir, "checkpoints"))
    steps = []
    for path in state.all_model_checkpoint_paths:
        reader = tf.train.load_checkpoint(path)
        steps.append(int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")))
        assert any("reward_baseline" in k for k in reader.get_variable_to_shape_map())
    assert steps == sorted(steps) and steps[-1] == 16
    events = _events(os.path.join(work_dir, "logs"))
    logged = sorted({s for s, _ in events["train/baseline"]})
    assert logged[-1] == 16 and min(logged) == 1
