"""`captioner demo` (`make demo`): the whole main job on the built-in synthetic data.

Runs every stage on the `demo` config (offline), serves the pushed model with
`captioner serve`, captions a handful of test images through the gRPC client,
prints each caption beside its references, writes attention figures and the
metrics, stops the server, and says where everything is.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time


def _banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def start_server(model_base_path: str, model_name: str, timeout: float = 120.0):
    """Starts `captioner serve` on free loopback ports; returns (process, grpc, rest)."""
    cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--model-base-path", model_base_path,
           "--model-name", model_name, "--host", "127.0.0.1", "--port", "0", "--rest-port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    deadline = time.time() + timeout
    lines = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        lines.append(line)
        m = re.search(r"grpc=([\d.]+:\d+)\s+rest=([\d.]+:\d+)", line)
        if m:
            return proc, m.group(1), m.group(2)
    proc.kill()
    raise RuntimeError("captioner serve did not start:\n" + "".join(lines[-20:]))


def stop_server(proc) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _caption_over_grpc(summary: dict, model_base: str, model_name: str, count: int,
                       output: str) -> None:
    """Serves the pushed model and captions `count` test images through the gRPC client."""
    from components.evaluator.split_readers import read_images
    from serving.client.attention_figure import save_attention_figure
    from serving.client.caption_client import CaptionClient
    examples_uri = summary["stages"]["ExampleGen"]["outputs"]["examples"]
    evaluation_uri = summary["stages"]["Evaluator"]["outputs"]["evaluation"]
    references, evaluated = {}, {}
    with open(os.path.join(evaluation_uri, "captions.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            references[row["image_id"]] = row["references"]
            evaluated[row["image_id"]] = row["caption"]
    wanted = sorted(references)[:count]
    images = read_images(examples_uri, "test", set(wanted))
    proc, grpc_target, rest_target = start_server(model_base, model_name)
    attention_dir = os.path.join(output, "client_attention")
    try:
        print(f"  server: gRPC {grpc_target}, REST {rest_target}")
        client = CaptionClient(grpc_target, model_name=model_name)
        # One request per image, as the Evaluator called the same SavedModel.
        results = [client.caption([images[i]])[0] for i in wanted]
        os.makedirs(attention_dir, exist_ok=True)
        served = []
        for image_id, result in zip(wanted, results, strict=True):
            save_attention_figure(images[image_id], result["caption"].split(),
                                  result["attention"], os.path.join(attention_dir, f"{image_id}.png"))
            served.append({"image_id": image_id, **{k: result[k] for k in ("caption", "score")},
                           "references": references[image_id]})
            print(f"\n  {image_id}  (score {result['score']:.3f})\n"
                  f"    generated: {result['caption']}")
            for ref in references[image_id][:3]:
                print(f"    reference: {ref}")
        with open(os.path.join(output, "served_captions.json"), "w") as f:
            json.dump(served, f, indent=2)
        same = sum(r["caption"] == evaluated[r["image_id"]] for r in served)
        print(f"\n  {same} of {len(served)} served captions are the ones the Evaluator scored")
    finally:
        stop_server(proc)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="captioner demo", description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="demo_output", help="everything goes here")
    parser.add_argument("--config", default="demo")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    parser.add_argument("--num-captions", type=int, default=6,
                        help="test images captioned through the server")
    parser.add_argument("--no-cache", action="store_true")
    args = parser.parse_args(argv)

    from pipeline import config as config_lib
    from pipeline.runner import Runner
    started = time.time()
    output = os.path.abspath(args.output)
    root = os.path.join(output, "pipeline")
    serving_dir = os.path.join(output, "serving")
    config = config_lib.load_config(args.config, [f"push.serving_dir={serving_dir}",
                                                  *args.overrides])
    _banner(f"1/3 pipeline ({config.name} config) -> {root}")
    summary = Runner(config, root, use_cache=not args.no_cache).run()
    for name, st in summary["stages"].items():
        print(f"  {name:15s} {st['status']:7s} {json.dumps(st.get('counts', {}), default=str)}")
    metrics = summary.get("metrics", {})
    if not summary.get("blessed"):
        print("The model was NOT blessed, so nothing was pushed; see "
              f"{summary['stages']['Evaluator']['outputs']['blessing']}")
        return 1

    _banner("2/3 serving the pushed model and captioning test images over gRPC")
    model_base = os.path.join(serving_dir, config.push.model_name)
    evaluation_uri = summary["stages"]["Evaluator"]["outputs"]["evaluation"]
    attention_dir = os.path.join(output, "client_attention")
    _caption_over_grpc(summary, model_base, config.push.model_name, args.num_captions, output)

    _banner("3/3 results")
    keys = ("Bleu_1", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "attribute_accuracy",
            "relation_accuracy", "grounding", "grounding_noun", "dangling_ending_rate")
    for key in keys:
        if isinstance(metrics.get(key), (int, float)):
            print(f"  {key:20s} {metrics[key]:.4f}")
    with open(os.path.join(output, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    print(f"\n  everything is under      {output}/")
    print(f"  run summary (metrics):   {os.path.join(root, 'run_summary.json')}")
    print(f"  attention figures:       {os.path.join(evaluation_uri, 'figures', 'index.html')}")
    print(f"  served captions:         {os.path.join(output, 'served_captions.json')}")
    print(f"  client attention maps:   {attention_dir}/")
    print(f"  SavedModel versions:     {model_base}/")
    print(f"  TF Serving config:       {os.path.join(serving_dir, 'models.config')}")
    print(f"  lineage:                 captioner inspect --root {root}")
    print(f"  total time:              {time.time() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
