"""Scale benchmark: every stage's peak memory and time per image at several data sizes.

    python benchmarks/scale.py                               # 1,000 / 4,000 / 16,000 images
    python benchmarks/scale.py --sizes 200,800               # a quick check (~10 min, 2 CPU cores)
    python benchmarks/scale.py --sizes 1000,4000 --stages ExampleGen,EncoderTrainer \
        --encoder-train                                      # the EncoderTrainer training the CNN

For each size N, a fresh pipeline root gets N synthetic shapes images and the
six stages run one after another, each as its own process
(`python -m pipeline.cli run --stages <Stage>`, the earlier stages resolved
from the cache), so that every stage's memory is its own. The encoder is the
small CNN at paper-shaped grids: 56 px inputs, width 128, a 14x14 grid
without coordinate channels, i.e. 14x14x512 float16 annotations (~200 KB
per image, VGG19 `block5_conv4`'s shape), untrained (`encoder.train=false`)
unless `--encoder-train`. The decoder is the tiny config's; the Trainer runs
one epoch over the whole train split with the default `train.cache=auto`:
the split is cached in memory while it fits `train.cache_budget_mb` (1 GB)
and streamed from disk beyond that, so its memory is bounded by the budget.

Per stage and size: wall seconds, seconds per image (wall / N, every image
of the dataset: the Evaluator decodes only the test split), the peak RSS of
the stage's whole process tree (children such as the Evaluator's METEOR
Java included; sampled every `--interval` seconds by summing
`/proc`-reported RSS over the tree) and the bytes of its artifacts per image.

The last stdout line is one JSON object: `sizes`, `stages.<Stage>` with
`peak_rss_mb`, `s_per_image`, `wall_s` and `artifact_bytes_per_image` (lists,
one per size), `memory_growth` (over stages, the largest ratio of peak RSS
at the largest size to the smallest size) and `time_growth` (the same for
seconds per image). Targets: both <= 1.25 from 1,000 to
16,000 images, and no stage over 4 GB. Results: docs/SCALING.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.results import write_result  # noqa: E402
from benchmarks.train_step import cpu_model  # noqa: E402

STAGES = ("ExampleGen", "EncoderTrainer", "Preprocess", "Trainer", "Exporter", "Evaluator",
          "Pusher")
# Paper-shaped grids from the small CNN: 14x14x512 float16 (VGG19 block5_conv4's shape).
PAPER_GRID = ("encoder.image_size=56", "encoder.grid_size=14", "encoder.width=128",
              "encoder.coord_channels=false", "data.image_size=56")
# Short per-image work for the decoder stages: one pass over the data.
RUN_SETTINGS = ("train.epochs=1", "train.checkpoint_every=200",
                "train.log_every=50", "eval.num_figures=2")


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (0 once it is gone)."""
    import psutil
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass  # exited between listing and reading
    return total


def run_measured(cmd: list[str], env: dict, log_path: str, interval: float) -> dict:
    """Runs `cmd`, sampling its process tree's RSS; returns wall seconds, peak and timeline.

    Raises:
      RuntimeError: the command failed (the tail of its log is in the message).
    """
    samples: list[tuple[float, int]] = []
    with open(log_path, "w") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        stop = threading.Event()

        def poll():
            while not stop.is_set():
                samples.append((time.perf_counter() - start, tree_rss(proc.pid)))
                stop.wait(interval)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        rc = proc.wait()
        wall = time.perf_counter() - start
        stop.set()
        thread.join()
    if rc != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{' '.join(cmd)} exited with {rc}:\n{tail}")
    peak = max((rss for _, rss in samples), default=0)
    return {"wall_s": wall, "peak_rss": peak,
            "timeline": [(round(t, 2), round(rss / 2 ** 20, 1)) for t, rss in samples]}


def folder_bytes(path: str) -> int:
    """Bytes of every file under `path`."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, name))
            except OSError:
                pass
    return total


def growth(values: list[float]) -> float:
    """Largest size's value over the smallest size's (1.0 when undefined)."""
    if len(values) < 2 or not values[0]:
        return 1.0
    return values[-1] / values[0]


def stage_overrides(size: int, config_sets: list[str], encoder_train: bool) -> list[str]:
    """The `--set` values of one size: paper grids, short decoder runs, then the user's."""
    sets = [f"data.num_images={size}", *PAPER_GRID, *RUN_SETTINGS,
            f"encoder.train={'true' if encoder_train else 'false'}"]
    if encoder_train:
        sets.append("encoder.max_epochs=1")
    return sets + list(config_sets)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,4000,16000",
                        help="comma-separated numbers of images")
    parser.add_argument("--stages", default=",".join(STAGES),
                        help="stages to measure (earlier ones still run, unmeasured if left out)")
    parser.add_argument("--config", default="tiny", help="named config the sizes start from")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="K=V",
                        help="extra config override for every run (repeatable)")
    parser.add_argument("--encoder-train", action="store_true",
                        help="train the small CNN in the EncoderTrainer (1 epoch)")
    parser.add_argument("--workdir", default="",
                        help="where the pipeline roots go (default: a new folder in /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep each size's pipeline root")
    parser.add_argument("--interval", type=float, default=0.2, help="RSS sampling period (s)")
    parser.add_argument("--timeline", default="",
                        help="write each stage's RSS timeline (t, MiB) as JSON into this folder")
    args = parser.parse_args(argv)

    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    measured = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = set(measured) - set(STAGES)
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}; stages: {', '.join(STAGES)}")
    last = max(STAGES.index(s) for s in measured)
    to_run = STAGES[:last + 1]
    workdir = args.workdir or tempfile.mkdtemp(prefix="captioner-scale-", dir="/tmp")
    os.makedirs(workdir, exist_ok=True)
    if args.timeline:
        os.makedirs(args.timeline, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    print(f"CPU: {cpu_model()} x {os.cpu_count()}; python {platform.python_version()}; "
          f"sizes {sizes}; stages {measured}", flush=True)
    print(f"flags: --config {args.config} "
          + " ".join(f"--set {s}" for s in stage_overrides(0, args.sets, args.encoder_train)[1:]),
          flush=True)
    results = {s: {"peak_rss_mb": [], "s_per_image": [], "wall_s": [],
                   "artifact_bytes_per_image": []} for s in measured}
    for size in sizes:
        root = os.path.join(workdir, f"n{size}")
        shutil.rmtree(root, ignore_errors=True)
        sets = stage_overrides(size, args.sets, args.encoder_train)
        for stage in to_run:
            cmd = [sys.executable, "-m", "pipeline.cli", "run", "--config", args.config,
                   "--root", root, "--stages", stage]
            for s in sets:
                cmd += ["--set", s]
            log_path = os.path.join(workdir, f"n{size}-{stage}.log")
            run = run_measured(cmd, env, log_path, args.interval)
            if stage not in measured:
                continue
            r = results[stage]
            r["peak_rss_mb"].append(round(run["peak_rss"] / 2 ** 20, 1))
            r["wall_s"].append(round(run["wall_s"], 2))
            r["s_per_image"].append(round(run["wall_s"] / size, 5))
            r["artifact_bytes_per_image"].append(
                round(folder_bytes(os.path.join(root, stage)) / size))
            print(f"n={size:6d} {stage:15s} wall {run['wall_s']:8.1f}s  "
                  f"{run['wall_s'] / size * 1e3:8.2f} ms/image  peak RSS "
                  f"{r['peak_rss_mb'][-1]:8.1f} MiB  artifacts "
                  f"{r['artifact_bytes_per_image'][-1]:9d} B/image", flush=True)
            if args.timeline:
                with open(os.path.join(args.timeline, f"n{size}-{stage}.json"), "w") as f:
                    json.dump(run["timeline"], f)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        if size != sizes[-1]:
            # The sizes so far, in case a long run is cut short.
            print("partial: " + json.dumps(summarize(sizes[:sizes.index(size) + 1], results)),
                  flush=True)
    print(f"stage logs: {workdir}/n<size>-<Stage>.log", flush=True)
    summary = summarize(sizes, results)
    print(json.dumps(summary))
    write_result("scale", summary, argv=argv)
    return 0


def summarize(sizes: list[int], results: dict) -> dict:
    """The benchmark's JSON summary: per-stage lists and the growth ratios."""
    return {
        "sizes": sizes,
        "cpu": cpu_model(),
        "stages": results,
        "memory_growth": round(max(growth(r["peak_rss_mb"]) for r in results.values()), 3),
        "time_growth": round(max(growth(r["s_per_image"]) for r in results.values()), 3),
    }


if __name__ == "__main__":
    sys.exit(main())
