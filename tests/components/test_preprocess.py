"""Preprocess (Beam): annotation records, encoder grids, dead letters, vocabulary, runners."""
from __future__ import annotations

import dataclasses
import io
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from components.beam import beam_utils
from components.contract import io_utils, schema
from components.contract.artifacts import Artifact, write_artifact_json
from components.contract.raw_example import RawExample
from components.example_gen import stage as example_gen
from components.preprocess import stage as preprocess
from components.preprocess import transforms
from models import text
from models.encoder import build_encoder
from models.image_ops import decode_and_resize
from pipeline.config import DataConfig, PipelineConfig, PreprocessConfig
from pipeline.runner import StageContext

IMAGE_SIZE = 16
GRID = 4
WIDTH = 4
COLORS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}
SHAPES = ("square", "circle")
# A corrupt image that still looks like a PNG (valid signature, garbage after it).
CORRUPT_PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + b"garbage" * 20
BAD_ID = "broken-0"
NO_IMAGE_ID = "no-image-0"


def _image(color: str, shape: str, fmt: str, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 40, size=(20 + seed % 5, 24, 3), dtype=np.uint8)
    img = Image.fromarray(arr)
    from PIL import ImageDraw
    draw = ImageDraw.Draw(img)
    box = (4, 4, 16, 14)
    (draw.rectangle if shape == "square" else draw.ellipse)(box, fill=COLORS[color])
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def _raw_examples() -> list[RawExample]:
    """12 images: 8 train, 2 val, 2 test; `zebra` only in val/test captions."""
    raws = []
    for i in range(12):
        split = "train" if i < 8 else ("val" if i < 10 else "test")
        color = list(COLORS)[i % 3]
        shape = SHAPES[i % 2]
        captions = [f"A {color} {shape}.", f"There is one {shape}, it is {color}!"]
        if i == 0:
            # Longer than max_caption_length (8 words): truncated.
            captions.append("a very very very very long caption about the red square here")
        if split != "train":
            captions.append(f"a zebra next to the {shape}")
        objects = ({"bbox": (0.2, 0.15, 0.7, 0.65), "color": color, "shape": shape,
                    "size": "large"},)
        raws.append(RawExample(image_id=f"img-{i:02d}",
                               image_bytes=_image(color, shape, "PNG" if i % 2 else "JPEG", i),
                               captions=tuple(captions), objects=objects, split=split))
    return raws


def _bad_record(image_id: str = BAD_ID, with_image: bool = True) -> bytes:
    """An Example whose image bytes do not decode (ExampleGen would have rejected it)."""
    feature = {
        "image/id": schema.bytes_feature([image_id.encode()]),
        "image/format": schema.bytes_feature([b"png"]),
        "image/height": schema.int_feature([16]),
        "image/width": schema.int_feature([16]),
        "captions": schema.bytes_feature([b"a broken image"]),
    }
    if with_image:
        feature["image/encoded"] = schema.bytes_feature([CORRUPT_PNG])
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """A published Examples (12 good images + 1 corrupt, in train) and Encoder artifact."""
    root = tmp_path_factory.mktemp("preprocess")
    examples_uri = str(root / "ExampleGen" / "1" / "examples")
    counts = example_gen.write_examples(iter(_raw_examples()), examples_uri,
                                        DataConfig(num_shards=2))
    with tf.io.TFRecordWriter(os.path.join(examples_uri, "train",
                                           "examples-bad-00000.tfrecord")) as w:
        w.write(_bad_record())
    # And a val record without image bytes at all (an unparseable record).
    with tf.io.TFRecordWriter(os.path.join(examples_uri, "val",
                                           "examples-bad-00000.tfrecord")) as w:
        w.write(_bad_record(NO_IMAGE_ID, with_image=False))
    write_artifact_json(Artifact(type="Examples", uri=examples_uri, producer="ExampleGen",
                                 execution_id=1, fingerprint="ex", inputs={}, counts=counts,
                                 properties={"has_boxes": True, "source": "synthetic"}),
                        config={})
    encoder_uri = str(root / "EncoderTrainer" / "2" / "encoder")
    os.makedirs(encoder_uri)
    encoder = build_encoder("small_cnn", image_size=IMAGE_SIZE, width=WIDTH, grid_size=GRID)
    encoder.save(os.path.join(encoder_uri, "encoder.keras"))
    grid_shape = [int(v) for v in encoder.output_shape[1:]]
    write_artifact_json(Artifact(type="Encoder", uri=encoder_uri, producer="EncoderTrainer",
                                 execution_id=2, fingerprint="enc", inputs={}, counts={},
                                 properties={"image_size": IMAGE_SIZE, "grid_shape": grid_shape}),
                        config={})
    return {"root": root, "examples": Artifact.load(examples_uri, "Examples"),
            "encoder": Artifact.load(encoder_uri, "Encoder"), "model": encoder,
            "grid_shape": grid_shape}


PREPROCESS = PreprocessConfig(max_batch_size=4, min_batch_size=2, max_caption_length=8,
                              num_shards=2, vocab_min_count=1)


def _run(artifacts, name: str, preprocess_config=PREPROCESS, beam_args=()) -> tuple:
    out = artifacts["root"] / "Preprocess" / name
    outputs = {"annotations": str(out / "annotations"), "vocabulary": str(out / "vocabulary")}
    for path in outputs.values():
        os.makedirs(path, exist_ok=True)
    ctx = StageContext(stage="Preprocess",
                       config=PipelineConfig(preprocess=preprocess_config),
                       inputs={"examples": artifacts["examples"],
                               "encoder": artifacts["encoder"]},
                       outputs=outputs, work_dir=str(out / "work"), root=str(artifacts["root"]),
                       execution_id=3, beam_args=tuple(beam_args))
    return preprocess.run(ctx), outputs


def _records(annotations_uri: str) -> dict[str, dict]:
    """image id -> parsed annotation record (with its split)."""
    records = {}
    for split in schema.SPLITS:
        for raw in io_utils.read_records(schema.split_files(annotations_uri, split)):
            f = tf.train.Example.FromString(raw).features.feature
            image_id = f["image/id"].bytes_list.value[0].decode()
            assert image_id not in records
            records[image_id] = {
                "split": split,
                "annotations": f["annotations"].bytes_list.value[0],
                "grid_shape": list(f["grid_shape"].int64_list.value),
                "tokens": list(f["captions/tokens"].int64_list.value),
                "lengths": list(f["captions/lengths"].int64_list.value),
                "texts": [t.decode() for t in f["captions/text"].bytes_list.value],
                "objects": schema.parse_objects(f),
            }
    return records


@pytest.fixture(scope="module")
def in_process(artifacts):
    return _run(artifacts, "in_process")


def test_records_parse_with_grid_shape_one_per_accepted_image(artifacts, in_process):
    results, outputs = in_process
    records = _records(outputs["annotations"])
    assert sorted(records) == [f"img-{i:02d}" for i in range(12)]
    h, w, d = artifacts["grid_shape"]
    assert (h, w) == (GRID, GRID)
    props = results["annotations"]["properties"]
    assert props["grid_shape"] == [h, w, d]
    assert props["image_size"] == IMAGE_SIZE
    assert props["splits"] == ["train", "val", "test"]
    assert props["num_records"] == {"train": 8, "val": 2, "test": 2}
    for r in records.values():
        assert r["grid_shape"] == [h, w, d]
        assert len(r["annotations"]) == h * w * d * 2  # float16
        assert sum(r["lengths"]) == len(r["tokens"])
        assert len(r["lengths"]) == len(r["texts"])
        assert r["objects"] and r["objects"][0]["shape"] in SHAPES
    for split in schema.SPLITS:
        names = sorted(os.listdir(os.path.join(outputs["annotations"], split)))
        assert names == [f"annotations-0000{i}-of-00002.tfrecord" for i in range(2)]
    assert records["img-08"]["split"] == "val" and records["img-11"]["split"] == "test"


def test_grid_equals_encoder_output(artifacts, in_process):
    _, outputs = in_process
    records = _records(outputs["annotations"])
    model = artifacts["model"]
    raws = {r.image_id: r for r in _raw_examples()}
    ids = sorted(records)
    images = np.stack([decode_and_resize(tf.constant(raws[i].image_bytes), IMAGE_SIZE).numpy()
                       for i in ids])
    expected = model(images, training=False).numpy()  # (N, H, W, D)
    for k, image_id in enumerate(ids):
        grid = schema.decode_float16_grid(records[image_id]["annotations"],
                                            artifacts["grid_shape"])
        ref = expected[k].reshape(-1, expected.shape[-1])  # (L, D), cell i = y*W + x
        np.testing.assert_allclose(grid, ref, rtol=2e-3, atol=2e-3)


def test_captions_tokenized_with_the_vocabulary_and_truncated(in_process):
    results, outputs = in_process
    records = _records(outputs["annotations"])
    vocab = open(os.path.join(outputs["vocabulary"], "vocab.txt")).read().split("\n")[:-1]
    word_to_id = {w: i for i, w in enumerate(vocab)}
    r = records["img-00"]
    assert r["texts"][0] == "A red square."
    # 3 and 7 words, and the 12-word caption truncated to 8: each + <start>, <end>.
    assert r["lengths"] == [5, 9, 10]
    offset = 0
    for caption, length in zip(r["texts"], r["lengths"], strict=True):
        ids = r["tokens"][offset:offset + length]
        assert ids == text.encode(text.normalize(caption), word_to_id, 8)
        offset += length
    assert text.decode(r["tokens"][:5], vocab) == "a red square"
    # `zebra` (val/test only) is unknown.
    val = records["img-08"]
    assert text.UNK_ID in val["tokens"]


def test_dead_letters_and_count_conservation(in_process):
    results, outputs = in_process
    counts = results["annotations"]["counts"]
    assert counts == {"seen": 14, "accepted": 12, "rejected": 2, "train": 8, "val": 2,
                      "test": 2}
    assert counts["accepted"] + counts["rejected"] == counts["seen"]
    split_counts = results["annotations"]["properties"]["split_counts"]
    assert split_counts["train"] == {"seen": 9, "accepted": 8, "dead_lettered": 1}
    assert split_counts["val"] == {"seen": 3, "accepted": 2, "dead_lettered": 1}
    assert split_counts["test"] == {"seen": 2, "accepted": 2, "dead_lettered": 0}
    with open(os.path.join(outputs["annotations"], schema.DEAD_LETTERS_FILE)) as f:
        lines = sorted((json.loads(line) for line in f if line.strip()),
                       key=lambda d: d["id"])
    assert [(d["id"], d["split"]) for d in lines] == [(BAD_ID, "train"), (NO_IMAGE_ID, "val")]
    # One dead-letter shape for every stage (components.contract.schema.dead_letter).
    assert all(list(d) == ["id", "reason", "split", "path"] for d in lines)
    assert lines[1]["path"].endswith(".tfrecord")   # the shard the bad record came from
    assert lines[0]["reason"].startswith("undecodable image")
    assert lines[1]["reason"].startswith("unparseable record")
    assert "image/encoded" in lines[1]["reason"]
    records = _records(outputs["annotations"])
    assert BAD_ID not in records and NO_IMAGE_ID not in records


def test_vocabulary_from_train_split_only(in_process):
    results, outputs = in_process
    vocab = open(os.path.join(outputs["vocabulary"], "vocab.txt")).read().split("\n")[:-1]
    assert vocab[:4] == list(text.RESERVED)
    assert "zebra" not in vocab  # only in val/test captions
    assert {"red", "green", "blue", "square", "circle", "broken"} <= set(vocab)
    assert all(w == w.lower() and w.isalnum() for w in vocab[4:])  # no punctuation
    counts = json.load(open(os.path.join(outputs["vocabulary"], "counts.json")))
    assert "zebra" not in counts
    # 8 train images with 2 captions each + 1 long caption + 1 broken-image caption.
    assert counts["a"] == 8 + 1 + 1
    # Descending count, ties by word.
    ranked = [(-counts[w], w) for w in vocab[4:]]
    assert ranked == sorted(ranked)
    assert results["vocabulary"]["properties"]["size"] == len(vocab)
    assert results["vocabulary"]["properties"]["path"] == "vocab.txt"


def test_build_vocabulary_min_count_max_size_and_ties():
    counts = {"b": 2, "a": 2, "c": 5, "d": 1}
    assert transforms.build_vocabulary(counts) == [*text.RESERVED, "c", "a", "b", "d"]
    assert transforms.build_vocabulary(counts, min_count=2) == [*text.RESERVED, "c", "a", "b"]
    assert transforms.build_vocabulary(counts, max_size=6) == [*text.RESERVED, "c", "a"]


def test_word_counts_combine_fn_merges():
    fn = transforms.WordCounts()
    a = fn.add_input(fn.create_accumulator(), ["x", "y", "x"])
    b = fn.add_input(fn.create_accumulator(), ["y"])
    assert fn.extract_output(fn.merge_accumulators([a, b])) == {"x": 2, "y": 2}


def test_decode_and_resize_same_eagerly_and_in_tf_data():
    data = [_image("red", "circle", "JPEG", 1), _image("blue", "square", "PNG", 2)]
    eager = np.stack([decode_and_resize(tf.constant(b), IMAGE_SIZE).numpy() for b in data])
    ds = tf.data.Dataset.from_tensor_slices(data).map(lambda b: decode_and_resize(b, IMAGE_SIZE))
    in_graph = np.stack(list(ds.as_numpy_iterator()))
    assert eager.shape == (2, IMAGE_SIZE, IMAGE_SIZE, 3)
    np.testing.assert_allclose(eager, in_graph, atol=1e-4)


def test_pipeline_options_name_the_runner():
    with beam_utils.pipeline_options("direct", direct_num_workers=2,
                                     direct_running_mode="multi_processing") as opts:
        all_opts = opts.get_all_options()
        assert all_opts["runner"] == "DirectRunner"
        assert all_opts["direct_running_mode"] == "multi_processing"
        assert all_opts["direct_num_workers"] == 2
    with beam_utils.pipeline_options("direct", ["--runner=FlinkRunner",
                                                "--flink_master=host:8081"]) as opts:
        assert opts.get_all_options()["runner"] == "FlinkRunner"
    with beam_utils.pipeline_options("portable") as opts:
        all_opts = opts.get_all_options()
        assert all_opts["runner"] == "PortableRunner"
        assert all_opts["environment_type"] == "LOOPBACK"
        assert all_opts["job_endpoint"].startswith("localhost:")
    with pytest.raises(ValueError):
        with beam_utils.pipeline_options("direct", direct_running_mode="bogus"):
            pass


def _assert_same_records(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for image_id, ra in a.items():
        rb = b[image_id]
        for key in ("split", "grid_shape", "tokens", "lengths", "texts", "objects"):
            assert ra[key] == rb[key], (image_id, key)
        ga = np.frombuffer(ra["annotations"], np.float16).astype(np.float32)
        gb = np.frombuffer(rb["annotations"], np.float16).astype(np.float32)
        np.testing.assert_allclose(ga, gb, rtol=2e-3, atol=2e-3)


def test_streamed_shards_give_the_same_records_as_fixed_shards(artifacts, in_process):
    """`num_shards=0` (no GroupByKey) writes the record set and vocabulary of `num_shards=2`."""
    config = dataclasses.replace(PREPROCESS, num_shards=0, max_shard_mb=1)
    results, outputs = _run(artifacts, "streamed", config)
    assert results["annotations"]["counts"] == in_process[0]["annotations"]["counts"]
    _assert_same_records(_records(outputs["annotations"]), _records(in_process[1]["annotations"]))
    for name in ("vocab.txt", "counts.json"):
        assert (open(os.path.join(outputs["vocabulary"], name)).read()
                == open(os.path.join(in_process[1]["vocabulary"], name)).read())
    shards = results["annotations"]["properties"]["num_shards"]
    for split in schema.SPLITS:
        names = sorted(os.listdir(os.path.join(outputs["annotations"], split)))
        assert len(names) == shards[split] >= 1
        assert all(n.startswith("annotations-") and n.endswith(
            f"-of-{shards[split]:05d}.tfrecord") for n in names)


@pytest.mark.slow
def test_portable_runner_loopback_gives_same_records(artifacts, in_process):
    config = dataclasses.replace(PREPROCESS, runner="portable")
    results, outputs = _run(artifacts, "portable", config)
    assert results["annotations"]["properties"]["runner"] == "PortableRunner"
    assert results["annotations"]["counts"] == in_process[0]["annotations"]["counts"]
    _assert_same_records(_records(outputs["annotations"]), _records(in_process[1]["annotations"]))
    assert (open(os.path.join(outputs["vocabulary"], "vocab.txt")).read()
            == open(os.path.join(in_process[1]["vocabulary"], "vocab.txt")).read())


@pytest.mark.slow
def test_multi_processing_direct_runner_gives_same_records(artifacts, in_process):
    config = dataclasses.replace(PREPROCESS, direct_running_mode="multi_processing",
                                 direct_num_workers=2)
    results, outputs = _run(artifacts, "multi_processing", config)
    assert results["annotations"]["counts"] == in_process[0]["annotations"]["counts"]
    _assert_same_records(_records(outputs["annotations"]), _records(in_process[1]["annotations"]))
    assert (open(os.path.join(outputs["vocabulary"], "vocab.txt")).read()
            == open(os.path.join(in_process[1]["vocabulary"], "vocab.txt")).read())


@pytest.mark.slow
@pytest.mark.parametrize("runner_config", [
    {"direct_running_mode": "multi_processing", "direct_num_workers": 2},
    {"runner": "portable"}], ids=["multi_processing", "portable"])
def test_streamed_shards_on_other_runners_give_the_same_records(artifacts, in_process,
                                                                runner_config):
    config = dataclasses.replace(PREPROCESS, num_shards=0, **runner_config)
    results, outputs = _run(artifacts, "streamed-" + "-".join(map(str, runner_config.values())),
                            config)
    assert results["annotations"]["counts"] == in_process[0]["annotations"]["counts"]
    _assert_same_records(_records(outputs["annotations"]), _records(in_process[1]["annotations"]))
    assert (open(os.path.join(outputs["vocabulary"], "vocab.txt")).read()
            == open(os.path.join(in_process[1]["vocabulary"], "vocab.txt")).read())


def test_runs_under_the_pipeline_runner_and_publishes(artifacts, tmp_path, monkeypatch):
    """Preprocess as a stage of the local Runner: artifacts published with counts/properties."""
    import shutil
    import sys
    import types

    from pipeline import dag
    from pipeline.runner import Runner

    def copy_stage(source: Artifact, name: str):
        def run(ctx):
            shutil.copytree(source.uri, ctx.outputs[name], dirs_exist_ok=True)
            os.remove(os.path.join(ctx.outputs[name], "artifact.json"))
            return {name: {"counts": dict(source.counts),
                           "properties": dict(source.properties)}}
        return types.SimpleNamespace(run=run)

    monkeypatch.setitem(sys.modules, "_fake_example_gen", copy_stage(artifacts["examples"],
                                                                     "examples"))
    monkeypatch.setitem(sys.modules, "_fake_encoder_trainer", copy_stage(artifacts["encoder"],
                                                                         "encoder"))
    stages = (dag.StageSpec("ExampleGen", "_fake_example_gen", outputs={"examples": "Examples"}),
              dag.StageSpec("EncoderTrainer", "_fake_encoder_trainer",
                            inputs={"examples": ("ExampleGen", "examples")},
                            outputs={"encoder": "Encoder"}),
              dag.stage("Preprocess"))
    config = PipelineConfig(preprocess=PREPROCESS)
    summary = Runner(config, str(tmp_path), stages=stages, log=lambda line: None).run()
    outputs = summary["stages"]["Preprocess"]["outputs"]
    annotations = Artifact.load(outputs["annotations"], "Annotations")
    vocabulary = Artifact.load(outputs["vocabulary"], "Vocabulary")
    assert ".tmp-" not in annotations.uri
    assert annotations.counts["accepted"] == 12 and annotations.counts["rejected"] == 2
    assert annotations.properties["grid_shape"] == artifacts["grid_shape"]
    assert annotations.properties["has_boxes"] is True
    assert vocabulary.properties["size"] == len(open(vocabulary.path("vocab.txt")).readlines())
    assert os.path.exists(annotations.path(schema.DEAD_LETTERS_FILE))
    assert len(_records(annotations.uri)) == 12


def test_a_record_lost_between_the_counters_and_the_files_fails_the_stage(artifacts,
                                                                          monkeypatch):
    """A runner that counts an output and then drops it: the stage fails, naming the split."""
    from components.beam.record_guard import RecordLossError
    from components.preprocess import transforms as preprocess_transforms
    original = preprocess_transforms.ToExample.process
    dropped = []

    def drop_one(self, item):
        for out in original(self, item):
            if not dropped and out[0] == "train":
                dropped.append(item[0]["id"])  # counted as accepted, never written
                continue
            yield out

    monkeypatch.setattr(preprocess_transforms.ToExample, "process", drop_one)
    with pytest.raises(RecordLossError) as info:
        _run(artifacts, "lossy")
    message = str(info.value)
    assert "nothing is published" in message and "train" in message
    assert "-1 unaccounted" in message or "+1 unaccounted" in message
