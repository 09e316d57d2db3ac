"""Benchmark: every attention type and score on one pipeline root, same data, budget and seed.

    python benchmarks/attention_types.py --config scenes --root runs/scenes
    python benchmarks/attention_types.py --config demo --root R --seeds 0,1 \\
        --set encoder.mixed_precision=float32 --set train.mixed_precision=float32

For each model (`--models`, default soft/additive, soft/general, soft/dot,
hard/additive, glimpse and spatial_transformer) and seed it runs the
Trainer, Exporter and Evaluator on the root's data (`captioner run --config
C --root R --stages ExampleGen,EncoderTrainer,Preprocess,Trainer,Exporter,Evaluator
--set model.attention=... --set model.attention_score=... --set
train.seed=S`; the data stages run once and are cached after). Models named
in `--second-seed` run once per seed in `--seeds`, the others with the
first seed only.

Records each run's test metrics (every coco-caption metric, attribute and
relation accuracy, grounding and noun grounding), the Trainer's seconds and
seconds per step, the Evaluator's decode milliseconds per test image (beam
`eval.beam_size`, one image per call, through `serving_default`) and the
guard rate of the location-wise types. Then it times the exports side by
side (`--latency-images` test images per round, one per call, the models
taking turns, `--latency-rounds` rounds): each one's median milliseconds per
image and its ratio to the first model's, robust to load that drifts
between runs. With `--figure` it stacks each
model's attention figure of the same test images (the Evaluator draws the
smallest image ids) into one PNG, a row per model.

Prints the CPU, a Markdown table and one JSON line at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.results import artifact_properties  # noqa: E402

MODELS = ("soft:additive", "soft:general", "soft:dot", "hard:additive", "glimpse",
          "spatial_transformer")
STAGES = "ExampleGen,EncoderTrainer,Preprocess,Trainer,Exporter,Evaluator"
METRICS = ("Bleu_1", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "attribute_accuracy",
           "relation_accuracy", "grounding", "grounding_noun")
TABLE = (("Bleu_4", "Bleu_4"), ("METEOR", "METEOR"), ("ROUGE_L", "ROUGE_L"),
         ("CIDEr", "CIDEr"), ("attribute", "attribute_accuracy"),
         ("relation", "relation_accuracy"), ("grounding", "grounding"),
         ("noun grounding", "grounding_noun"))


def model_overrides(model: str) -> list[str]:
    """`soft:general` -> the `--set` items of that attention and score."""
    attention, _, score = model.partition(":")
    items = [f"model.attention={attention}"]
    if score:
        items.append(f"model.attention_score={score}")
    return items


def run_model(root: str, config: str, overrides: list[str]) -> dict:
    """Runs the stages on `root` with `overrides`; returns the figures of that run."""
    command = [sys.executable, "-m", "pipeline.cli", "run", "--config", config, "--root", root,
               "--stages", STAGES]
    for item in overrides:
        command += ["--set", item]
    start = time.time()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    with open(os.path.join(root, "run_summary.json")) as f:
        summary = json.load(f)
    stages, metrics = summary["stages"], summary["metrics"]
    model_uri = stages["Trainer"]["outputs"]["model"]
    properties = artifact_properties(model_uri)
    trainer_s = stages["Trainer"].get("seconds")
    steps = properties.get("steps") or 0
    return {
        "metrics": {k: metrics.get(k) for k in METRICS},
        "model_uri": model_uri,
        "trainer_status": stages["Trainer"]["status"],
        "trainer_s": trainer_s,
        "train_seconds_total": properties.get("train_seconds_total"),
        "ms_per_step": (round(1000 * properties["train_seconds_total"] / steps, 2)
                        if steps and properties.get("train_seconds_total") else None),
        "steps": steps,
        "mixed_precision": properties.get("mixed_precision"),
        "guard_rate": properties.get("guard_rate"),
        "decode_ms_per_image": round(1000 * metrics["decode_seconds"] / metrics["num_images"], 2),
        "figures": os.path.join(stages["Evaluator"]["outputs"]["evaluation"], "figures"),
        "serving_model": stages["Exporter"]["outputs"]["serving_model"],
        "examples": stages["ExampleGen"]["outputs"]["examples"],
        "wall_s": round(time.time() - start, 1),
    }


def side_by_side_latency(runs: list[dict], images: int, rounds: int) -> dict:
    """Median ms per test image of each run's `serving_default`, the models taking turns.

    Each round captions the same `images` test images, one per call, with
    every model in turn, so that load from other processes hits all alike.
    Returns model-and-seed label -> `{"ms": median, "ratio": to the first run}`.
    """
    import numpy as np

    from components.contract import schema
    from components.contract.artifacts import Artifact
    from components.evaluator.split_readers import iter_example_batches
    from components.evaluator.stage import ServedFunction
    batch = next(iter_example_batches(runs[0]["examples"], "test", images))["images"]
    served = {f"{r['model']} seed {r['seed']}": ServedFunction(
        Artifact.load(r["serving_model"]).path(schema.SAVED_MODEL_DIR)) for r in runs}
    times: dict = {label: [] for label in served}
    for function in served.values():     # warm-up: trace and first calls
        function([batch[0]])
    for _ in range(rounds):
        for label, function in served.items():
            for image in batch:
                start = time.perf_counter()
                function([image])
                times[label].append(time.perf_counter() - start)
    first = float(np.median(next(iter(times.values()))))
    return {label: {"ms": round(1000 * float(np.median(t)), 2),
                    "ratio": round(float(np.median(t)) / first, 3)} for label, t in times.items()}


def recorded_runs(path: str) -> list[dict]:
    """The runs of an earlier results file (`--runs-from`), with their export and Examples paths.

    Records without `serving_model` take it, and `examples`, from the run's
    Evaluation artifact (its `inputs`).
    """
    with open(path) as f:
        record = json.load(f)
    runs = record.get("figures", record)["runs"]
    for run in runs:
        if "serving_model" not in run:
            evaluation = os.path.dirname(run["figures"].rstrip("/"))
            root = evaluation.split("/Evaluator/")[0]
            with open(os.path.join(evaluation, "artifact.json")) as f:
                inputs = json.load(f)["inputs"]
            run["serving_model"] = inputs["serving_model"].replace("${root}", root)
            run["examples"] = inputs["examples"].replace("${root}", root)
    return runs


def table(runs: list[dict]) -> str:
    """The Markdown table of `runs`, one row per model and seed."""
    head = ["model", "seed"] + [name for name, _ in TABLE] + [
        "Trainer ms/step", "decode ms/image", "guard rate"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        cells = [run["model"], str(run["seed"])]
        for name, key in TABLE:
            value = run["metrics"].get(key)
            cells.append("" if value is None else f"{value:.2f}" if name == "CIDEr"
                         else f"{value:.3f}")
        cells += [f"{run['ms_per_step']}", f"{run['decode_ms_per_image']}",
                  "" if run["guard_rate"] is None else f"{run['guard_rate']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def stack_figures(runs: list[dict], out_path: str, images: int) -> list[str]:
    """One PNG: each run's figure of the same first `images` test images, a labelled row each.

    Returns the image ids shown.
    """
    from PIL import Image, ImageDraw, ImageFont
    font = ImageFont.load_default(size=22)
    names = [sorted(f for f in os.listdir(r["figures"]) if f.endswith(".png")) for r in runs]
    common = sorted(set(names[0]).intersection(*names[1:]))[:images]
    rows, label_w = [], 230
    for run in runs:
        tiles = [Image.open(os.path.join(run["figures"], name)).convert("RGB") for name in common]
        width = sum(t.width for t in tiles) + label_w
        row = Image.new("RGB", (width, max(t.height for t in tiles)), "white")
        ImageDraw.Draw(row).text((8, 20), run["model"].replace(":", "\n") + f"\nseed {run['seed']}",
                                 fill="black", font=font)
        x = label_w
        for tile in tiles:
            row.paste(tile, (x, 0))
            x += tile.width
        rows.append(row)
    sheet = Image.new("RGB", (max(r.width for r in rows), sum(r.height for r in rows)), "white")
    y = 0
    for row in rows:
        sheet.paste(row, (0, y))
        y += row.height
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    sheet.convert("P", palette=Image.Palette.ADAPTIVE, colors=256).save(out_path, optimize=True)
    return [os.path.splitext(name)[0] for name in common]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="the pipeline root (created if missing)")
    parser.add_argument("--config", default="scenes")
    parser.add_argument("--models", default=",".join(MODELS),
                        help="attention[:score] items, comma-separated")
    parser.add_argument("--seeds", default="0,1", help="train.seed values, comma-separated")
    parser.add_argument("--second-seed", default="glimpse,spatial_transformer",
                        help="the models that run with every seed (the others: the first)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="more config overrides for every model")
    parser.add_argument("--figure", default="", help="write the stacked figures to this PNG")
    parser.add_argument("--figure-images", type=int, default=1,
                        help="how many test images per row of the figure")
    parser.add_argument("--latency-images", type=int, default=32,
                        help="test images per round of the side-by-side latency (0: skip)")
    parser.add_argument("--latency-rounds", type=int, default=3)
    parser.add_argument("--runs-from", default="",
                        help="train nothing: time and draw the runs of this earlier results file")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    from benchmarks.results import cpuinfo, write_result
    cpu, flags = cpuinfo()
    print(f"CPU: {cpu} (avx2 {'avx2' in flags}, avx512_bf16 {'avx512_bf16' in flags})",
          flush=True)
    root = os.path.abspath(args.root)
    seeds = [int(s) for s in args.seeds.split(",")]
    every_seed = set(filter(None, args.second_seed.split(",")))
    runs = recorded_runs(args.runs_from) if args.runs_from else []
    for model in [] if args.runs_from else filter(None, args.models.split(",")):
        for seed in (seeds if model in every_seed else seeds[:1]):
            overrides = [*args.overrides, *model_overrides(model), f"train.seed={seed}"]
            run = {"model": model, "seed": seed, **run_model(root, args.config, overrides)}
            runs.append(run)
            print(f"{model} seed {seed}: " + ", ".join(
                f"{k} {v:.3f}" for k, v in run["metrics"].items() if isinstance(v, float))
                + f"; {run['ms_per_step']} ms/step, {run['decode_ms_per_image']} ms/image",
                flush=True)
    print("\n" + table(runs) + "\n")
    result = {"cpu": cpu, "config": args.config, "overrides": args.overrides, "runs": runs}
    if args.latency_images:
        first = [r for r in runs if r["seed"] == runs[0]["seed"]]
        result["latency"] = side_by_side_latency(first, args.latency_images, args.latency_rounds)
        for label, row in result["latency"].items():
            print(f"latency (the export's beam): {label}: {row['ms']} ms per image, "
                  f"{row['ratio']}x the first", flush=True)
    if args.figure:
        first = [r for r in runs if r["seed"] == runs[0]["seed"]]
        result["figure"] = {"path": args.figure,
                            "image_ids": stack_figures(first, args.figure, args.figure_images)}
    print(json.dumps(result))
    variant = args.config + ("-float32" if any("float32" in o for o in args.overrides) else "")
    variant += "-recorded" if args.runs_from else ""
    write_result("attention_types", result, argv=argv, variant=variant)
    return result


if __name__ == "__main__":
    main()
