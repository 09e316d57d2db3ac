"""Preprocess and bulk captioning on the DirectRunner and on Dask, side by side in one run.

    python benchmarks/dask_scale.py                       # 2,000 images, paper-shaped grids
    python benchmarks/dask_scale.py --images 400 --repeats 1   # a quick check

One pipeline root gets N synthetic images and an untrained small CNN whose
grid has the paper's shape (14x14x512 float16, ~200 KB per image; the flags
of benchmarks/scale.py). Then, for each mode, a fresh copy of that root runs
Preprocess as its own process: the DirectRunner (in-process), Dask with one
local worker, Dask with two (`preprocess.runner=dask`,
`preprocess.dask_workers=K`: worker processes of one thread each, started
and stopped by the stage). The modes alternate within each repeat, so that
load from other jobs falls on all of them alike.

With `--bulk` (the default) the same is done for bulk captioning: a decoder
is trained for one epoch on that root, exported, and `captioner caption
--model` runs over every image (PNG files written from the Examples).

Per mode: wall seconds (median over repeats), images/s, the peak RSS of the
driver process and the largest peak of any one worker process (every
process of the tree is sampled every `--interval` s), and for Preprocess the
records written (they must equal the images). The last stdout line is one
JSON object; it is also written under benchmarks/results/. Results:
docs/SCALING.md ("Preprocess on a Dask cluster").
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.results import write_result  # noqa: E402
from benchmarks.scale import PAPER_GRID  # noqa: E402
from benchmarks.train_step import cpu_model  # noqa: E402

MODES = {"direct": ["preprocess.runner=direct"],
         "dask-1": ["preprocess.runner=dask", "preprocess.dask_workers=1"],
         "dask-2": ["preprocess.runner=dask", "preprocess.dask_workers=2"]}


def process_rss(pid: int) -> dict:
    """pid -> resident bytes, for a process and all its descendants."""
    import psutil
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return {}
    out = {}
    for proc in procs:
        try:
            out[proc.pid] = proc.memory_info().rss
        except psutil.Error:
            pass
    return out


def run_measured(cmd: list[str], env: dict, log_path: str, interval: float) -> dict:
    """Runs `cmd`: wall seconds, the driver's peak RSS, the largest other process's peak."""
    peaks: dict = {}
    with open(log_path, "w") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        stop = threading.Event()

        def poll():
            while not stop.is_set():
                for pid, rss in process_rss(proc.pid).items():
                    peaks[pid] = max(peaks.get(pid, 0), rss)
                stop.wait(interval)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        rc = proc.wait()
        wall = time.perf_counter() - start
        stop.set()
        thread.join()
    if rc != 0:
        with open(log_path) as f:
            raise RuntimeError(f"{' '.join(cmd)} exited with {rc}:\n{f.read()[-3000:]}")
    driver = peaks.pop(proc.pid, 0)
    return {"wall_s": wall, "driver_peak_mb": driver / 2 ** 20,
            "worker_peak_mb": max(peaks.values(), default=0) / 2 ** 20,
            "processes": 1 + len(peaks)}


def captioner(*args: str) -> list[str]:
    """The `captioner` command line in this interpreter."""
    return [sys.executable, "-m", "pipeline.cli", *args]


def count_records(folder: str) -> int:
    """Records in every TFRecord under `folder`."""
    from components.beam.record_guard import count_tfrecords
    return count_tfrecords(glob.glob(os.path.join(folder, "**", "*.tfrecord"), recursive=True))


def write_images(examples: str, out: str) -> int:
    """Writes every Examples image as a file of its own; returns how many."""
    import tensorflow as tf

    from components.contract import schema
    os.makedirs(out, exist_ok=True)
    n = 0
    for path in sorted(glob.glob(os.path.join(examples, "**", "*.tfrecord"), recursive=True)):
        for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
            feature = tf.train.Example.FromString(raw).features.feature
            image_id, data = schema.example_image(feature)
            with open(os.path.join(out, f"{image_id}.png"), "wb") as f:
                f.write(data)
            n += 1
    return n


def summarize(rows: dict, images: int) -> dict:
    """Median wall time per mode, images/s, peaks (the largest over repeats)."""
    out = {}
    for mode, runs in rows.items():
        wall = statistics.median(r["wall_s"] for r in runs)
        out[mode] = {"wall_s": round(wall, 2), "images_per_s": round(images / wall, 2),
                     "wall_s_runs": [round(r["wall_s"], 2) for r in runs],
                     "driver_peak_mb": round(max(r["driver_peak_mb"] for r in runs), 1),
                     "worker_peak_mb": round(max(r["worker_peak_mb"] for r in runs), 1),
                     **({"records": runs[-1]["records"]} if "records" in runs[-1] else {})}
    return out


def measure_preprocess(args, modes: list, workdir: str, base: str, setflags: list,
                       env: dict) -> dict:
    """Preprocess in every mode, alternating, `--repeats` times; keeps the last root."""
    subprocess.run(captioner("run", "--config", "tiny", "--root", base, "--stages",
                             "ExampleGen,EncoderTrainer", *setflags), cwd=ROOT, env=env,
                   check=True, stdout=subprocess.DEVNULL)
    pre: dict = {m: [] for m in modes}
    for repeat in range(args.repeats):
        for mode in modes:
            root = os.path.join(workdir, f"{mode}-{repeat}")
            shutil.rmtree(root, ignore_errors=True)
            shutil.copytree(base, root)
            cmd = captioner("run", "--root", root, "--stages", "Preprocess",
                            *[x for s in MODES[mode] for x in ("--set", s)])
            run = run_measured(cmd, env, os.path.join(workdir, f"{mode}-{repeat}.log"),
                               args.interval)
            run["records"] = count_records(os.path.join(root, "Preprocess"))
            pre[mode].append(run)
            print(f"Preprocess {mode:7s} #{repeat}: {run['wall_s']:7.1f} s, "
                  f"{args.images / run['wall_s']:6.1f} img/s, driver {run['driver_peak_mb']:7.0f} "
                  f"MiB, largest worker {run['worker_peak_mb']:7.0f} MiB, "
                  f"records {run['records']}", flush=True)
            if repeat < args.repeats - 1 or mode != modes[-1]:
                shutil.rmtree(root, ignore_errors=True)
    return {"images": args.images, "grid": [14, 14, 512], "cpu": cpu_model(),
            "preprocess": summarize(pre, args.images)}



def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--no-bulk", dest="bulk", action="store_false",
                        help="leave out bulk captioning")
    parser.add_argument("--workdir", default="")
    parser.add_argument("--resume", action="store_true",
                        help="reuse the Preprocess figures and roots of an earlier run in "
                             "--workdir (its preprocess.json) and measure bulk captioning only")
    parser.add_argument("--interval", type=float, default=0.2)
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    workdir = args.workdir or tempfile.mkdtemp(prefix="captioner-dask-", dir="/tmp")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    print(f"CPU: {cpu_model()} x {os.cpu_count()}; python {platform.python_version()}; "
          f"{args.images} images; modes {modes}; workdir {workdir}", flush=True)

    base = os.path.join(workdir, "base")
    sets = [f"data.num_images={args.images}", "data.num_shards=8", *PAPER_GRID,
            "encoder.train=false", "train.epochs=1", "train.checkpoint_every=500"]
    setflags = [x for s in sets for x in ("--set", s)]
    saved = os.path.join(workdir, "preprocess.json")
    if args.resume and os.path.exists(saved):
        with open(saved) as f:
            summary = json.load(f)
    else:
        summary = measure_preprocess(args, modes, workdir, base, setflags, env)
        with open(saved, "w") as f:
            json.dump(summary, f)

    if args.bulk:
        model_root = os.path.join(workdir, f"{modes[-1]}-{args.repeats - 1}")
        subprocess.run(captioner("run", "--root", model_root, "--stages", "Trainer,Exporter",
                                 *setflags), cwd=ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        model = os.path.dirname(sorted(glob.glob(os.path.join(
            model_root, "Exporter", "*", "**", "saved_model.pb"), recursive=True))[-1])
        images = os.path.join(workdir, "images")
        n = write_images(os.path.join(base, "ExampleGen"), images)
        bulk: dict = {m: [] for m in modes}
        runners = {"direct": ["--runner", "direct"], "dask-1": ["--runner", "dask", "--workers", "1"],
                   "dask-2": ["--runner", "dask", "--workers", "2"]}
        for repeat in range(args.repeats):
            for mode in modes:
                out = os.path.join(workdir, f"captions-{mode}.jsonl")
                cmd = captioner("caption", "--model", model, images, "--output", out,
                                *runners[mode])
                run = run_measured(cmd, env, os.path.join(workdir, f"bulk-{mode}-{repeat}.log"),
                                   args.interval)
                with open(out) as f:
                    run["records"] = sum(1 for line in f if line.strip())
                bulk[mode].append(run)
                print(f"caption --model {mode:7s} #{repeat}: {run['wall_s']:7.1f} s, "
                      f"{n / run['wall_s']:6.1f} img/s, driver {run['driver_peak_mb']:7.0f} MiB, "
                      f"largest worker {run['worker_peak_mb']:7.0f} MiB, lines {run['records']}",
                      flush=True)
        summary["bulk_captioning"] = summarize(bulk, n)
    print(json.dumps(summary))
    write_result("dask_scale", summary, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
