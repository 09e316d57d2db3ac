"""Benchmark: the Preprocess Beam stage against a bare batched encoder call.

    python benchmarks/preprocess.py                      # 4-6 min on 2 CPU cores
    python benchmarks/preprocess.py --images 128 --paper-images 48 --repeats 2   # quicker

For each encoder, generated JPEG images go through the whole stage
(`components.preprocess.stage.run`: read Examples, decode, encode with
RunInference, serialize, write TFRecords, build the vocabulary) on the
in-process DirectRunner, and, side by side in the same process, through a
bare batched call of the same encoder on the already decoded images at the
same batch size. Runs alternate (stage, bare, stage, bare, ...) so that a
change in machine load hits both; figures are medians over `--repeats`.

* paper: VGG19 up to `block5_conv4` (`weights=None`), 224x224 inputs,
  640x480 source JPEGs (COCO-sized). Target: stage >= 0.8 x bare.
* demo: the demo's small CNN (64x64 inputs, width 32, 8x8 grid) on 64x64
  JPEGs (the demo's synthetic images); its per-image time is split into
  decode / encode / serialize / write / the rest (Beam).

Prints one JSON line at the end; `ratio` is the paper encoder's stage/bare.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.results import write_result  # noqa: E402

ENCODERS = {
    "paper": dict(kind="keras_app", application="VGG19", layer="block5_conv4", weights="none",
                  image_size=224, coord_channels=False),
    "demo": dict(kind="small_cnn", image_size=64, width=32, grid_size=8),
}
SOURCE_SIZE = {"paper": (640, 480), "demo": (64, 64)}
WORDS = ("red green blue yellow square circle triangle small large left right of the a "
         "above below next to").split()


def make_jpegs(n: int, size: tuple[int, int], seed: int = 0) -> list[bytes]:
    """`n` JPEGs of smooth backgrounds with a few filled shapes (realistic sizes)."""
    from PIL import Image, ImageDraw
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    out = []
    for _ in range(n):
        c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        t = (xx / w * rng.uniform(0.2, 1) + yy / h * rng.uniform(0.2, 1))[..., None] / 2
        arr = (c0 * (1 - t) + c1 * t + rng.normal(0, 6, (h, w, 3))).clip(0, 255).astype(np.uint8)
        img = Image.fromarray(arr)
        draw = ImageDraw.Draw(img)
        for _ in range(rng.integers(1, 4)):
            x0, y0 = rng.uniform(0, 0.7) * w, rng.uniform(0, 0.7) * h
            x1, y1 = x0 + rng.uniform(0.1, 0.3) * w, y0 + rng.uniform(0.1, 0.3) * h
            fill = tuple(int(v) for v in rng.integers(0, 256, 3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=fill)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def make_artifacts(root: str, name: str, n: int, seed: int = 0):
    """An Examples artifact of `n` generated JPEGs and an Encoder artifact; returns both."""
    from components.contract.artifacts import Artifact, write_artifact_json
    from components.contract.raw_example import RawExample
    from components.example_gen import stage as example_gen
    from models.encoder import build_encoder
    from pipeline.config import DataConfig

    rng = np.random.default_rng(seed)
    images = make_jpegs(n, SOURCE_SIZE[name], seed)
    raws = [RawExample(image_id=f"{name}-{i:05d}", image_bytes=b,
                       captions=tuple(" ".join(rng.choice(WORDS, 8)) for _ in range(5)),
                       split="train" if i % 10 < 8 else ("val" if i % 10 == 8 else "test"))
            for i, b in enumerate(images)]
    examples_uri = os.path.join(root, name, "examples")
    counts = example_gen.write_examples(iter(raws), examples_uri, DataConfig(num_shards=2))
    write_artifact_json(Artifact(type="Examples", uri=examples_uri, producer="ExampleGen",
                                 execution_id=1, fingerprint=f"{name}-ex", inputs={},
                                 counts=counts,
                                 properties={"has_boxes": False, "source": "benchmark"}),
                        config={})
    spec = dict(ENCODERS[name])
    kind = spec.pop("kind")
    model = build_encoder(kind, **spec)
    encoder_uri = os.path.join(root, name, "encoder")
    os.makedirs(encoder_uri, exist_ok=True)
    model.save(os.path.join(encoder_uri, "encoder.keras"))
    write_artifact_json(Artifact(type="Encoder", uri=encoder_uri, producer="EncoderTrainer",
                                 execution_id=2, fingerprint=f"{name}-enc", inputs={},
                                 counts={},
                                 properties={"image_size": spec["image_size"],
                                             "grid_shape": [int(v) for v in
                                                            model.output_shape[1:]]}),
                        config={})
    return (Artifact.load(examples_uri, "Examples"), Artifact.load(encoder_uri, "Encoder"),
            model, images)


def run_stage(root: str, examples, encoder, batch_size: int, tag: str) -> tuple[float, float, dict]:
    """One run of the whole Preprocess stage; (wall seconds, CPU seconds, results)."""
    from components.preprocess import stage as preprocess
    from pipeline.config import PipelineConfig, PreprocessConfig
    from pipeline.runner import StageContext

    out = os.path.join(root, "runs", tag)
    shutil.rmtree(out, ignore_errors=True)
    outputs = {"annotations": os.path.join(out, "annotations"),
               "vocabulary": os.path.join(out, "vocabulary")}
    for path in outputs.values():
        os.makedirs(path)
    config = PipelineConfig(preprocess=PreprocessConfig(
        max_batch_size=batch_size, min_batch_size=batch_size, num_shards=2))
    ctx = StageContext(stage="Preprocess", config=config,
                       inputs={"examples": examples, "encoder": encoder}, outputs=outputs,
                       work_dir=os.path.join(out, "work"), root=root, execution_id=1)
    start, cpu = time.perf_counter(), time.process_time()
    results = preprocess.run(ctx)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    results["outputs"] = outputs
    return seconds, cpu, results


def bare_encoder(model, image_size: int):
    """The same compiled call RunInference's handler makes (`tf.function`, fixed signature)."""
    import tensorflow as tf
    fn = tf.function(lambda x: model(x, training=False),
                     input_signature=[tf.TensorSpec((None, image_size, image_size, 3),
                                                    tf.float32)])
    return lambda x: fn(x).numpy().astype(np.float16)


def run_bare(call, decoded: np.ndarray, batch_size: int) -> tuple[float, float]:
    """The encoder alone over already decoded images; (wall seconds, CPU seconds)."""
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(0, len(decoded), batch_size):
        call(decoded[i:i + batch_size])
    return time.perf_counter() - start, time.process_time() - cpu


def write_seconds(annotations_uri: str) -> tuple[float, int]:
    """Time to write the stage's own serialized records with a plain TFRecordWriter."""
    import tensorflow as tf

    from components.contract import io_utils, schema
    records = [r for s in schema.SPLITS
               for r in io_utils.read_records(schema.split_files(annotations_uri, s))]
    path = os.path.join(tempfile.mkdtemp(prefix="write-"), "x.tfrecord")
    start = time.perf_counter()
    with tf.io.TFRecordWriter(path) as w:
        for r in records:
            w.write(r)
    seconds = time.perf_counter() - start
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    return seconds, len(records)


def _prepare(name: str, n: int, batch_size: int, root: str) -> dict:
    """The artifacts of `n` and of one batch of images, the decoded images, the traced bare call."""
    import tensorflow as tf

    from models.image_ops import decode_and_resize

    examples, encoder, model, images = make_artifacts(root, name, n)
    size = ENCODERS[name]["image_size"]
    start = time.perf_counter()
    decoded = np.stack([decode_and_resize(tf.constant(b), size).numpy() for b in images])
    eager_decode_s = time.perf_counter() - start
    call = bare_encoder(model, size)
    call(decoded[:batch_size])  # trace once, like the stage's worker does
    # The stage's fixed cost (graph construction, runner start, model load,
    # tracing) comes from runs on one batch of images.
    small = min(batch_size, n // 2)
    small_examples, small_encoder, _, _ = make_artifacts(os.path.join(root, "small"), name,
                                                         small)
    return {"examples": examples, "encoder": encoder, "decoded": decoded, "call": call,
            "eager_decode_s": eager_decode_s, "small": small,
            "small_examples": small_examples, "small_encoder": small_encoder}


def _timed_runs(name: str, n: int, batch_size: int, repeats: int, root: str, p: dict,
                log) -> list[dict]:
    """Alternating stage / bare runs after one warm-up run; per repeat, wall and CPU seconds."""
    run_stage(root, p["small_examples"], p["small_encoder"], batch_size, f"{name}-warmup")
    runs = []
    for r in range(repeats):
        small_wall, small_cpu, _ = run_stage(root, p["small_examples"], p["small_encoder"],
                                             batch_size, f"{name}-small")
        wall, cpu, results = run_stage(root, p["examples"], p["encoder"], batch_size,
                                       f"{name}-{r}")
        assert results["annotations"]["counts"]["accepted"] == n, results["annotations"]
        bare_wall, bare_cpu = run_bare(p["call"], p["decoded"], batch_size)
        runs.append({"wall": wall, "cpu": cpu, "bare_wall": bare_wall, "bare_cpu": bare_cpu,
                     "small_wall": small_wall, "small_cpu": small_cpu, "results": results})
        log(f"   repeat {r}: stage {n / wall:.2f} img/s, bare {n / bare_wall:.2f} img/s "
            f"(CPU s: stage {cpu:.1f}, bare {bare_cpu:.1f}); {p['small']} images: "
            f"{small_wall:.1f}s")
    return runs


def _profile(run: dict, n: int) -> dict:
    """ms per image inside the stage, from one run's timings.

    `rest` is Beam itself: start-up (graph construction and translation,
    model load, tracing), reading, batching, the vocabulary pass, the sharded
    write's grouping and file finalization.
    """
    timings = run["results"]["annotations"]["properties"]["timings"]

    def ms(key):
        t = timings.get(key)
        return round(t["sum"] / 1e3 / n, 3) if t else None

    write_s, _ = write_seconds(run["results"]["outputs"]["annotations"])
    profile = {"decode": ms("decode_micros"),
               "encode": ms("inference_batch_latency_micro_secs"),
               "serialize": ms("serialize_micros"),
               "write": round(1e3 * write_s / n, 3)}
    profile["rest"] = round(1e3 * run["wall"] / n - sum(v for v in profile.values() if v), 3)
    return profile


def bench(name: str, n: int, batch_size: int, repeats: int, root: str, log) -> dict:
    """One encoder's figures: stage and bare throughput, their ratios, the stage's profile."""
    log(f"== {name}: {n} images {SOURCE_SIZE[name][0]}x{SOURCE_SIZE[name][1]} JPEG, "
        f"batch {batch_size}, {repeats} repeats")
    p = _prepare(name, n, batch_size, root)
    runs = _timed_runs(name, n, batch_size, repeats, root, p, log)
    small = p["small"]

    def med(key):
        return statistics.median(r[key] for r in runs)

    stage_ips, bare_ips = n / med("wall"), n / med("bare_wall")
    # The profile comes from the run with the median wall time.
    median_run = sorted(runs, key=lambda r: r["wall"])[len(runs) // 2]
    properties = median_run["results"]["annotations"]["properties"]
    load_model = properties["timings"].get("load_model_latency_milli_secs", {}).get("sum", 0)
    # Marginal throughput once the fixed cost is paid (what a large dataset sees):
    # from wall time, and from CPU time (robust to other load on the machine).
    steady_ips = (n - small) / max(med("wall") - med("small_wall"), 1e-9)
    steady_cpu_ratio = ((n - small) / max(med("cpu") - med("small_cpu"), 1e-9)) / (
        n / med("bare_cpu"))
    result = {
        "images": n, "batch_size": batch_size, "repeats": repeats,
        "source_image": "x".join(map(str, SOURCE_SIZE[name])),
        "grid_shape": properties["grid_shape"],
        "stage_images_per_s": round(stage_ips, 2), "bare_images_per_s": round(bare_ips, 2),
        "ratio": round(stage_ips / bare_ips, 3),
        "best_ratio": round(min(r["bare_wall"] for r in runs) / min(r["wall"] for r in runs), 3),
        "cpu_ratio": round(med("bare_cpu") / med("cpu"), 3),
        "small_images": small, "small_stage_seconds": round(med("small_wall"), 2),
        "steady_state_images_per_s": round(steady_ips, 2),
        "steady_state_ratio": round(steady_ips / bare_ips, 3),
        "steady_state_cpu_ratio": round(steady_cpu_ratio, 3),
        "small_stage_cpu_seconds": round(med("small_cpu"), 2),
        "load_model_seconds": round(load_model / 1e3, 2),
        "stage_ms_per_image": round(1e3 * median_run["wall"] / n, 3),
        "bare_ms_per_image": round(1e3 * med("bare_wall") / n, 3),
        "eager_decode_ms_per_image": round(1e3 * p["eager_decode_s"] / n, 3),
        "profile_ms_per_image": _profile(median_run, n),
        **{f"{k}_seconds": [round(r[key], 2) for r in runs] for k, key in (
            ("stage", "wall"), ("bare", "bare_wall"), ("stage_cpu", "cpu"),
            ("bare_cpu", "bare_cpu"))},
    }
    log(f"   {name}: stage {stage_ips:.2f} img/s, bare {bare_ips:.2f} img/s, ratio "
        f"{result['ratio']:.3f} (best {result['best_ratio']:.3f}, CPU time "
        f"{result['cpu_ratio']:.3f}, steady state {result['steady_state_ratio']:.3f}, "
        f"steady state CPU time {steady_cpu_ratio:.3f}); "
        f"profile ms/img {result['profile_ms_per_image']}")
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=256,
                        help="images for the demo encoder (default 256)")
    parser.add_argument("--paper-images", type=int, default=64,
                        help="images for the paper's VGG19 encoder (default 64; 2-4 img/s "
                             "on 2 CPU cores)")
    parser.add_argument("--batch-size", type=int, default=64, help="demo encoder batch")
    parser.add_argument("--paper-batch-size", type=int, default=8, help="VGG19 batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--encoders", default="paper,demo")
    parser.add_argument("--workdir", default="", help="default: a temporary folder")
    args = parser.parse_args(argv)

    def log(line):
        print(line, file=sys.stderr, flush=True)

    root = args.workdir or tempfile.mkdtemp(prefix="bench-preprocess-")
    os.makedirs(root, exist_ok=True)
    start = time.time()
    out = {"benchmark": "preprocess", "machine": f"{os.cpu_count()} CPU cores",
           "runner": "DirectRunner in_memory",
           "load_average_before": round(os.getloadavg()[0], 2)}
    try:
        for name in [e.strip() for e in args.encoders.split(",") if e.strip()]:
            n = args.paper_images if name == "paper" else args.images
            batch = args.paper_batch_size if name == "paper" else args.batch_size
            out[name] = bench(name, n, batch, args.repeats, root, log)
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    out["load_average_after"] = round(os.getloadavg()[0], 2)
    out["ratio"] = out.get("paper", out.get("demo", {})).get("ratio")
    out["seconds"] = round(time.time() - start, 1)
    print(json.dumps(out, sort_keys=True), flush=True)
    write_result("preprocess", out, argv=argv)
    return out


if __name__ == "__main__":
    main()
