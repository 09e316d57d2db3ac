"""ExampleGen: every source parses and round-trips; faults go to dead letters; splits by image."""
import io
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from components.contract import io_utils, schema
from components.contract.raw_example import RawExample
from components.example_gen import stage as example_gen
from pipeline.config import DataConfig


def _image_bytes(fmt="PNG", size=(12, 10), color=(200, 10, 10)):
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


def _read_split(uri, split):
    out = []
    for record in io_utils.read_records(schema.split_files(uri, split)):
        ex = tf.train.Example.FromString(record)
        f = ex.features.feature
        out.append({"id": f["image/id"].bytes_list.value[0].decode(),
                    "image": f["image/encoded"].bytes_list.value[0],
                    "format": f["image/format"].bytes_list.value[0].decode(),
                    "height": f["image/height"].int64_list.value[0],
                    "width": f["image/width"].int64_list.value[0],
                    "captions": [c.decode() for c in f["captions"].bytes_list.value],
                    "objects": schema.parse_objects(f)})
    return out


def _read_all(uri):
    return {split: _read_split(uri, split) for split in schema.SPLITS}


def _dead_letters(uri):
    with open(os.path.join(uri, "dead_letters.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_synthetic_records_match_the_generator(tmp_path):
    from components.synthetic.shapes import generate
    cfg = DataConfig(num_images=30, image_size=32, seed=3, val_fraction=0.2, test_fraction=0.2)
    counts = example_gen.write_examples(
        generate(30, image_size=32, seed=3), str(tmp_path), cfg, total=30)
    assert counts["seen"] == counts["accepted"] == 30 and counts["rejected"] == 0
    records = {r["id"]: r for split in _read_all(str(tmp_path)).values() for r in split}
    for raw in generate(30, image_size=32, seed=3):
        rec = records[raw.image_id]
        assert rec["image"] == raw.image_bytes
        assert rec["captions"] == list(raw.captions)
        assert [o["color"] for o in rec["objects"]] == [o["color"] for o in raw.objects]
        np.testing.assert_allclose([o["bbox"] for o in rec["objects"]],
                                   [o["bbox"] for o in raw.objects], atol=1e-6)
        assert (rec["height"], rec["width"]) == (32, 32)


def test_faults_are_dead_lettered_and_counts_conserved(tmp_path):
    good = _image_bytes()
    raws = [RawExample("ok1", image_bytes=good, captions=("a red box",)),
            RawExample("nocap", image_bytes=good, captions=()),
            RawExample("emptycap", image_bytes=good, captions=("a red box", "  ")),
            RawExample("corrupt", image_bytes=good[:40], captions=("x",)),
            RawExample("garbage", image_bytes=b"not an image at all", captions=("x",)),
            RawExample("empty", image_bytes=b"", captions=("x",)),
            RawExample("missing", image_path=str(tmp_path / "nope.jpg"), captions=("x",)),
            RawExample("ok1", image_bytes=good, captions=("dup",)),
            RawExample("ok2", image_bytes=_image_bytes("JPEG"), captions=("a red box",))]
    counts = example_gen.write_examples(iter(raws), str(tmp_path), DataConfig())
    assert counts["seen"] == 9
    assert counts["accepted"] == 2 and counts["rejected"] == 7
    assert counts["accepted"] + counts["rejected"] == counts["seen"]
    assert counts["train"] + counts["val"] + counts["test"] == counts["accepted"]
    reasons = {d["id"]: d["reason"] for d in _dead_letters(str(tmp_path)) if d["id"] != "ok1"}
    assert reasons["nocap"] == "image without captions"
    assert reasons["emptycap"] == "empty caption"
    assert reasons["corrupt"].startswith("undecodable image")
    assert "unsupported image format" in reasons["garbage"] or \
        reasons["garbage"].startswith("undecodable")
    assert reasons["empty"] == "empty image file"
    assert reasons["missing"].startswith("missing file")
    assert any(d["reason"] == "duplicate image id" for d in _dead_letters(str(tmp_path)))


def test_splits_are_by_image_and_deterministic(tmp_path):
    raws = [RawExample(f"img{i}", image_bytes=_image_bytes(), captions=(f"c{i} a", f"c{i} b"))
            for i in range(60)]
    cfg = DataConfig(val_fraction=0.2, test_fraction=0.2, seed=5)
    example_gen.write_examples(iter(raws), str(tmp_path / "a"), cfg)
    example_gen.write_examples(iter(raws), str(tmp_path / "b"), cfg)
    a, b = _read_all(str(tmp_path / "a")), _read_all(str(tmp_path / "b"))
    ids = {s: {r["id"] for r in a[s]} for s in a}
    assert ids == {s: {r["id"] for r in b[s]} for s in b}
    assert not (ids["train"] & ids["val"]) and not (ids["train"] & ids["test"]) \
        and not (ids["val"] & ids["test"])
    assert sum(len(v) for v in ids.values()) == 60
    assert all(len(v) > 0 for v in ids.values())
    for split in a.values():  # every caption of an image stays with it
        for r in split:
            n = r["id"][3:]
            assert r["captions"] == [f"c{n} a", f"c{n} b"]


def _write_images(folder, names, fmt="JPEG"):
    os.makedirs(folder, exist_ok=True)
    for name in names:
        with open(os.path.join(folder, name), "wb") as f:
            f.write(_image_bytes(fmt))


def test_coco_source(tmp_path):
    from components.example_gen.sources.coco import read_coco
    _write_images(tmp_path / "imgs", ["a.jpg", "b.jpg"])
    (tmp_path / "imgs" / "bad.jpg").write_bytes(b"\xff\xd8\xff broken")
    captions = {"images": [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"},
                           {"id": 3, "file_name": "bad.jpg"}, {"id": 4, "file_name": "gone.jpg"},
                           {"id": 5, "file_name": "a.jpg"}],
                "annotations": [{"image_id": 1, "caption": "A dog."},
                                {"image_id": 1, "caption": "A brown dog"},
                                {"image_id": 2, "caption": "A cat"},
                                {"image_id": 3, "caption": "x"}, {"image_id": 4, "caption": "y"}]}
    path = tmp_path / "captions.json"
    path.write_text(json.dumps(captions))
    records, total = read_coco(str(path), str(tmp_path / "imgs"))
    assert total == 5
    counts = example_gen.write_examples(records, str(tmp_path / "out"), DataConfig())
    assert (counts["seen"], counts["accepted"], counts["rejected"]) == (5, 2, 3)
    recs = {r["id"]: r for s in _read_all(str(tmp_path / "out")).values() for r in s}
    assert recs["1"]["captions"] == ["A dog.", "A brown dog"] and recs["1"]["format"] == "jpeg"
    reasons = {d["id"]: d["reason"] for d in _dead_letters(str(tmp_path / "out"))}
    assert reasons["3"].startswith("undecodable") and reasons["4"].startswith("missing file")
    assert reasons["5"] == "image without captions"


def test_karpathy_source_keeps_its_splits(tmp_path):
    from components.example_gen.sources.karpathy import read_karpathy
    _write_images(tmp_path / "imgs" / "val2014", ["v.jpg"])
    _write_images(tmp_path / "imgs" / "train2014", ["t.jpg", "r.jpg", "s.jpg"])
    data = {"images": [
        {"filepath": "val2014", "filename": "v.jpg", "cocoid": 10, "split": "test",
         "sentences": [{"raw": "A test image."}]},
        {"filepath": "train2014", "filename": "t.jpg", "cocoid": 11, "split": "train",
         "sentences": [{"raw": "Train one"}, {"raw": "Train two"}]},
        {"filepath": "train2014", "filename": "r.jpg", "cocoid": 12, "split": "restval",
         "sentences": [{"raw": "restval"}]},
        {"filepath": "train2014", "filename": "s.jpg", "cocoid": 13, "split": "val",
         "sentences": [{"tokens": ["from", "tokens"]}]}]}
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(data))
    records, total = read_karpathy(str(path), str(tmp_path / "imgs"))
    counts = example_gen.write_examples(records, str(tmp_path / "out"), DataConfig())
    assert (counts["train"], counts["val"], counts["test"]) == (2, 1, 1)
    out = _read_all(str(tmp_path / "out"))
    assert {r["id"] for r in out["train"]} == {"11", "12"}
    assert out["test"][0]["captions"] == ["A test image."]
    assert out["val"][0]["captions"] == ["from tokens"]


def test_tfds_source_with_mock_data(tmp_path):
    import tensorflow_datasets as tfds

    from components.example_gen.sources.tfds_source import read_tfds
    rng = np.random.default_rng(0)
    images = {"train": 3, "val": 2, "test": 1}

    def as_dataset(self, split, *args, **kwargs):
        n = images[split]
        return tf.data.Dataset.from_generator(
            lambda: ({"image": tf.io.encode_jpeg(rng.integers(0, 255, (8, 8, 3), np.uint8)
                                                 ).numpy(),
                      "image/id": 100 * len(split) + i,
                      "captions": {"text": [f"caption {split} {i}", "another one"],
                                   "id": [1, 2]}} for i in range(n)),
            output_signature={"image": tf.TensorSpec([], tf.string),
                              "image/id": tf.TensorSpec([], tf.int64),
                              "captions": {"text": tf.TensorSpec([None], tf.string),
                                           "id": tf.TensorSpec([None], tf.int64)}})

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        records, _ = read_tfds("coco_captions", "", "train,val,test")
        counts = example_gen.write_examples(records, str(tmp_path), DataConfig())
    assert (counts["train"], counts["val"], counts["test"]) == (3, 2, 1)
    out = _read_all(str(tmp_path))
    assert sorted(r["captions"][0] for r in out["train"]) == \
        [f"caption train {i}" for i in range(3)]
    assert all(r["format"] == "jpeg" for r in out["train"])


def test_stage_run_writes_artifact_counts(tmp_path):
    from pipeline import config as config_lib
    from pipeline.runner import Runner
    config = config_lib.load_config("tiny", ["data.num_images=20"])
    summary = Runner(config, str(tmp_path), log=lambda _: None).run(["ExampleGen"])
    st = summary["stages"]["ExampleGen"]
    assert st["status"] == "ran" and st["counts"]["accepted"] == 20
    assert os.path.exists(os.path.join(st["outputs"]["examples"], "dead_letters.jsonl"))


def test_max_images_limits_accepted_images(tmp_path):
    raws = [RawExample(f"img{i}", image_bytes=_image_bytes(), captions=("c",)) for i in range(10)]
    counts = example_gen.write_examples(iter(raws), str(tmp_path), DataConfig(max_images=4))
    assert counts["accepted"] == counts["seen"] == 4


def test_undecodable_image_reason_is_the_same_in_every_run():
    from components.contract.io_utils import inspect_image
    reasons = set()
    for _ in range(2):
        with pytest.raises(ValueError) as info:
            inspect_image(b"not an image at all")
        reasons.add(str(info.value))
    reason, = reasons
    assert reason.startswith("undecodable image: UnidentifiedImageError") and "0x" not in reason
