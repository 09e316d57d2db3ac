"""End to end on the `tiny` config: every stage, serve, caption through the gRPC client."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _captioner(*args, cwd=REPO):
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tiny root with spaces é"))
    _captioner("run", "--config", "tiny", "--root", root)
    with open(os.path.join(root, "run_summary.json")) as f:
        return root, json.load(f)


def test_every_stage_ran_and_the_model_was_pushed(tiny_run):
    root, summary = tiny_run
    assert set(summary["stages"]) == {"ExampleGen", "EncoderTrainer", "Preprocess", "Trainer",
                                      "Exporter", "Evaluator", "Pusher"}
    assert all(st["status"] == "ran" for st in summary["stages"].values())
    for key in ("Bleu_1", "Bleu_4", "ROUGE_L", "CIDEr", "grounding", "attribute_accuracy"):
        assert key in summary["metrics"]
    assert summary["blessed"] is True
    props = _properties(summary["stages"]["Pusher"]["outputs"]["pushed_model"])
    assert os.path.exists(os.path.join(props["path"], "saved_model.pb"))
    assert os.path.exists(os.path.join(props["path"], "assets.extra",
                                       "tf_serving_warmup_requests"))
    counts = summary["stages"]["ExampleGen"]["counts"]
    assert counts["accepted"] + counts["rejected"] == counts["seen"]


def test_serve_and_caption_through_the_client(tiny_run):
    root, summary = tiny_run
    from components.evaluator.split_readers import read_images
    from serving.client.caption_client import CaptionClient
    from serving.server.model_server import ModelServer
    from serving.server.options import ServerOptions
    props = _properties(summary["stages"]["Pusher"]["outputs"]["pushed_model"])
    vocab_dir = summary["stages"]["Preprocess"]["outputs"]["vocabulary"]
    with open(os.path.join(vocab_dir, "vocab.txt")) as f:
        vocab = set(f.read().split())
    examples = summary["stages"]["ExampleGen"]["outputs"]["examples"]
    images = list(read_images(examples, "test", _test_ids(examples)).values())[:3]
    assert images
    server = ModelServer(model_base_path=os.path.dirname(props["path"]), model_name="captioner", options=ServerOptions(port=0, rest_port=0)).start()
    try:
        client = CaptionClient(server.grpc_address, model_name="captioner")
        results = client.caption(images)
        assert len(results) == len(images)
        for r in results:
            assert isinstance(r["caption"], str)
            assert all(w in vocab for w in r["caption"].split())
            assert r["attention"].ndim == 3 and r["attention"].shape[1:] == (4, 4)
            assert r["attention"].shape[0] == r["length"] == len(r["tokens"])
            assert np.isfinite(r["score"])
    finally:
        server.stop()


def _test_ids(examples_uri):
    import tensorflow as tf

    from components.contract import io_utils, schema
    ids = set()
    for record in io_utils.read_records(schema.split_files(examples_uri, "test")):
        ex = tf.train.Example.FromString(record)
        ids.add(ex.features.feature["image/id"].bytes_list.value[0].decode())
    return ids


def test_second_run_is_fully_cached(tiny_run):
    root, _ = tiny_run
    proc = _captioner("run", "--config", "tiny", "--root", root)
    with open(os.path.join(root, "run_summary.json")) as f:
        summary = json.load(f)
    assert {st["status"] for st in summary["stages"].values()} == {"cached"}, proc.stdout
    assert "metrics" in summary
    out = _captioner("inspect", "--root", root, "--json").stdout
    states = [x["state"] for x in json.loads(out)["executions"]]
    assert states.count("cached") == 7 and states.count("complete") == 7


def test_attention_signal_analysis_runs_on_a_pipeline_root(tiny_run):
    root, _ = tiny_run
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "attention_signal.py"),
                           "--root", root, "--max-images", "20"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["steps"] > 0 and result["attention"] == "soft"
    for key in ("logp_inside", "logp_outside", "logp_expected"):
        assert result[key] <= 0.0
    assert 0.0 <= result["alpha_mass_inside"] <= 1.0
    assert 0.0 <= result["best_region_inside"] <= 1.0


def _properties(uri):
    """An artifact's properties, paths resolved against the root it lies in."""
    from components.contract.artifacts import Artifact
    return dict(Artifact.load(uri).properties)


def _captions(evaluation_uri):
    with open(os.path.join(evaluation_uri, "captions.jsonl")) as f:
        return [json.loads(line) for line in f]


def _test_images(examples_uri):
    from components.evaluator.split_readers import iter_example_batches
    return {i: image for batch in iter_example_batches(examples_uri, "test", 64)
            for i, image in zip(batch["ids"], batch["images"], strict=True)}


def test_every_test_image_served_gets_the_evaluated_caption(tiny_run, tmp_path):
    """A real server of the pushed version: one request per test image, gRPC and REST."""
    import base64
    import urllib.request

    from serving.client.caption_client import CaptionClient
    from tests.reliability.server_process import ServerProcess
    root, summary = tiny_run
    stages = summary["stages"]
    evaluation = stages["Evaluator"]["outputs"]["evaluation"]
    pushed = _properties(stages["Pusher"]["outputs"]["pushed_model"])
    assert pushed["digest"] == _properties(evaluation)["export_digest"]
    measured = {row["image_id"]: row for row in _captions(evaluation)}
    images = _test_images(stages["ExampleGen"]["outputs"]["examples"])
    assert sorted(images) == sorted(measured) and len(images) >= 10
    server = ServerProcess(["--model-base-path", os.path.dirname(pushed["path"]),
                            "--port", "0", "--rest-port", "0"], str(tmp_path / "server.log"))
    try:
        with CaptionClient(server.grpc_address, model_name="captioner") as client:
            for image_id, image in sorted(images.items()):
                result = client.caption([image])[0]
                assert result["caption"] == measured[image_id]["caption"], image_id
                assert float(result["score"]) == measured[image_id]["score"], image_id
        for image_id, image in sorted(images.items()):
            body = json.dumps({"instances": [{"b64": base64.b64encode(image).decode()}]})
            request = urllib.request.Request(
                f"{server.rest_url}/v1/models/captioner:predict", data=body.encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as response:
                prediction = json.loads(response.read())["predictions"][0]
            assert prediction["caption"] == measured[image_id]["caption"], image_id
            # JSON may print the float32 in its shortest form: compare as float32.
            assert np.float32(prediction["score"]) == np.float32(measured[image_id]["score"])
    finally:
        server.stop()


def test_the_pushed_graph_decodes_as_the_evaluator_measured(tiny_run, tmp_path):
    root, first = tiny_run
    settings = {"beam_size": 3, "max_length": 9, "length_normalization": 0.7}
    serving_dir = str(tmp_path / "serving")
    _captioner("run", "--config", "tiny", "--root", root,
               "--stages", "Exporter,Evaluator,Pusher",
               *[f"--set=eval.{k}={v}" for k, v in settings.items()],
               "--set", f"push.serving_dir={serving_dir}")
    with open(os.path.join(root, "run_summary.json")) as f:
        summary = json.load(f)
    evaluation = _properties(summary["stages"]["Evaluator"]["outputs"]["evaluation"])
    pushed = _properties(summary["stages"]["Pusher"]["outputs"]["pushed_model"])
    assert evaluation["decoding"] == settings == pushed["decoding"]
    assert pushed["digest"] == evaluation["export_digest"]
    # The baseline (the first run's push, beam 2) was captioned again with beam 3.
    assert evaluation["baseline"]["serving_model_uri"] == \
        first["stages"]["Exporter"]["outputs"]["serving_model"]
    assert any("exported again with this run's decoding" in n for n in evaluation["notes"])
    assert {row["metric"] for row in evaluation["comparison"]} >= {"Bleu_4", "CIDEr"}
