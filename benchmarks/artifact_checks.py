"""Benchmark: what the artifact checks cost.

    python benchmarks/artifact_checks.py                 # a few seconds
    python benchmarks/artifact_checks.py --shards 1024 --checksum-mb 64

A pipeline root laid out like a COCO-sized run (`coco_paper`: Examples and
Annotations with `--shards` TFRecord shards per split, the other artifacts
with their usual handful of files) is written with its metadata store, as
the runner publishes it. Then, for all six stages, as one fully cached
`captioner run` does:

* `load`: reading each output's `artifact.json` (what a cache hit did before
  file sizes were checked);
* `size_check`: the same plus the size of every listed file (a cache hit now);

each the median over `--repeats` passes (warm file-system cache). The shard
files are small: a `stat` costs the same whatever the size. Apart from that,
the CRC-32C throughput (publish, `--verify`) is measured on one file of
`--checksum-mb` MB.

Prints one JSON line at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.results import write_result  # noqa: E402
from components.contract.artifacts import Artifact, write_artifact_json  # noqa: E402
from pipeline import integrity  # noqa: E402
from pipeline.metadata import MetadataStore  # noqa: E402

SPLITS = ("train", "val", "test")


def _layout(shards: int) -> dict[str, dict[str, list[str]]]:
    """Stage -> output -> files, as a COCO-sized run publishes them."""
    def sharded(prefix):
        return [f"{s}/{prefix}-{i:05d}-of-{shards:05d}.tfrecord" for s in SPLITS
                for i in range(shards)] + ["dead_letters.jsonl"]
    return {
        "ExampleGen": {"examples": sharded("examples")},
        "EncoderTrainer": {"encoder": ["encoder.keras", "history.json", "words.json"]},
        "Preprocess": {"annotations": sharded("annotations"),
                       "vocabulary": ["vocab.txt", "counts.json"]},
        "Trainer": {"model": ["model.keras", "best.keras", "history.json"]
                    + [f"logs/{r}/events.out.tfevents.{i}" for r in ("train", "val")
                       for i in range(3)]},
        "Evaluator": {"evaluation": ["metrics.json", "captions.jsonl", "figures/index.html"]
                      + [f"figures/{i}.png" for i in range(6)],
                      "blessing": ["BLESSED", "blessing.json"]},
        "Pusher": {"pushed_model": []},
    }


def build_root(root: str, shards: int) -> MetadataStore:
    """Writes the artifacts (1 KB files) and records them as the runner does."""
    store = MetadataStore(os.path.join(root, "metadata.sqlite"))
    for stage, outputs in _layout(shards).items():
        execution_id = store.begin_execution(stage, "0" * 64, {})
        for name, files in outputs.items():
            uri = os.path.join(root, stage, str(execution_id), name)
            for rel in files:
                path = os.path.join(uri, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(os.urandom(1024))
            write_artifact_json(Artifact(type=name, uri=uri, producer=stage,
                                         execution_id=execution_id,
                                         fingerprint=f"{execution_id}", inputs={},
                                         counts={}, properties={},
                                         files=integrity.file_list(uri)),
                                config={}, root=root)
            store.add_artifact(execution_id, name, name, uri, f"{execution_id}")
        store.finish_execution(execution_id, "complete")
    return store


def _time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=256, help="shards per split")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--checksum-mb", type=int, default=256)
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="artifact-checks-")
    try:
        store = build_root(root, args.shards)
        outputs = [store.outputs(x["id"]) for x in store.executions()]
        files = sum(len(integrity.check_artifact(row["uri"])[0].files)
                    for out in outputs for row in out.values())

        def load_only():
            for out in outputs:
                for row in out.values():
                    integrity.Artifact.load(row["uri"])

        def size_check():
            for out in outputs:
                assert integrity.outputs_problem(out) is None

        load = _time(load_only, args.repeats)
        checked = _time(size_check, args.repeats)
        big = os.path.join(root, "big.bin")
        with open(big, "wb") as f:
            for _ in range(args.checksum_mb):
                f.write(os.urandom(1 << 20))
        crc = _time(lambda: integrity.file_checksum(big), 3)
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {"shards_per_split": args.shards, "files": files,
              "load_s": round(load, 4), "size_check_s": round(checked, 4),
              "size_check_extra_s": round(checked - load, 4),
              "checksum": integrity.CHECKSUM,
              "checksum_mb_per_s": round(args.checksum_mb / crc)}
    print(json.dumps(result))
    write_result("artifact_checks", result, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
